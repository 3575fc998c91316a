/* The drafter's rotary embedding (K3_EAGLE.md §3.7), with a sin and cos of
 * krun's own: the C library's differ between machines in the last bit (as
 * its tanhf does, docs/NUMERICS.md §1.2), and a drafter row should be the
 * same bits on x86-64 and aarch64 like everything else krun computes.
 *
 * x is reduced by multiples of pi/2 in three parts (Cody and Waite: the
 * first part has 33 significant bits, so k * PIO2_1 is exact for |k| < 2^20,
 * positions up to a million radians), then sin and cos of the remainder
 * (|r| <= pi/4) are their Taylor polynomials to degree 17 and 18, evaluated
 * by Horner in a fixed order.  No operation is fused (-ffp-contract=off):
 * every step is one IEEE double operation.  Error below 1e-15 relative,
 * far under the float the result is rounded to. */
#include "draft.h"

#include "run/util/ablate.h"

#include <math.h>

#define PIO2_1 1.57079632673412561417e+00   /* first 33 bits of pi/2 */
#define PIO2_2 6.07710050650619224932e-11   /* the next 33 */
#define PIO2_3 2.02226624879595063154e-21   /* the rest */
#define INV_PIO2 6.36619772367581382433e-01

static double poly_sin(double r)
{
    const double r2 = r * r;
    double p = 1.0 / 355687428096000.0;                  /* 1/17! */
    p = p * r2 - 1.0 / 1307674368000.0;                  /* 1/15! */
    p = p * r2 + 1.0 / 6227020800.0;                     /* 1/13! */
    p = p * r2 - 1.0 / 39916800.0;                       /* 1/11! */
    p = p * r2 + 1.0 / 362880.0;                         /* 1/9! */
    p = p * r2 - 1.0 / 5040.0;                           /* 1/7! */
    p = p * r2 + 1.0 / 120.0;                            /* 1/5! */
    p = p * r2 - 1.0 / 6.0;                              /* 1/3! */
    return r + r * (r2 * p);
}

static double poly_cos(double r)
{
    const double r2 = r * r;
    double p = 1.0 / 6402373705728000.0;                 /* 1/18! */
    p = p * r2 - 1.0 / 20922789888000.0;                 /* 1/16! */
    p = p * r2 + 1.0 / 87178291200.0;                    /* 1/14! */
    p = p * r2 - 1.0 / 479001600.0;                      /* 1/12! */
    p = p * r2 + 1.0 / 3628800.0;                        /* 1/10! */
    p = p * r2 - 1.0 / 40320.0;                          /* 1/8! */
    p = p * r2 + 1.0 / 720.0;                            /* 1/6! */
    p = p * r2 - 1.0 / 24.0;                             /* 1/4! */
    p = p * r2 + 0.5;
    return 1.0 - r2 * p;
}

void kdraft_sincos(double x, double *s, double *c)
{
    const double k = nearbyint(x * INV_PIO2);            /* round to nearest even: exact IEEE */
    const double r = ((x - k * PIO2_1) - k * PIO2_2) - k * PIO2_3;
    const double sr = poly_sin(r), cr = poly_cos(r);
    switch ((long long)k & 3) {
    case 0: *s = sr; *c = cr; break;
    case 1: *s = cr; *c = -sr; break;
    case 2: *s = -sr; *c = -cr; break;
    default: *s = -cr; *c = sr; break;
    }
}

void kdraft_rope(float *v, size_t dr, const double *omega, double mult, size_t pos)
{
    for (size_t i = 0; i < dr / 2 && !ABLATED(DRAFT_NO_ROPE); i++) {
        const size_t i0 = ABLATED(DRAFT_ROPE_HALF_SPLIT) ? i : 2 * i, i1 = ABLATED(DRAFT_ROPE_HALF_SPLIT) ? i + dr / 2 : 2 * i + 1;
        double s, c;
        float fs, fc, a = v[i0], b = v[i1];
        kdraft_sincos((double)pos * omega[i], &s, &c);
        fs = (float)(s * mult);
        fc = (float)(c * mult);
        v[i0] = a * fc - b * fs;
        v[i1] = b * fc + a * fs;
    }
}
