/* kmath_tanhf: tanh in float, computed with IEEE operations only (kmath.h).
 *
 * The C library's tanhf is not the same function on every machine: Debian
 * 12's glibc 2.36 computes it with fdlibm's algorithm (tanh from expm1), and
 * its aarch64 build lets the compiler fuse that algorithm's multiply-adds
 * while the x86-64 build (no FMA in the baseline) does not, so the two
 * disagree in the last bit on about 1 input in 7000 (tests/arm64: 1,369 of
 * 10,088,268 sampled inputs), enough to change the logits of every real
 * model.  This file is the same algorithm written out operation by
 * operation, compiled like the rest of krun without contraction, so it gives
 * x86-64 glibc 2.36's bits (checked on all 2^32 inputs, docs/NUMERICS.md §1)
 * on every architecture, compiler and C library.
 *
 * The algorithm and its constants are fdlibm's (s_tanhf.c, s_expm1f.c):
 *   Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved.
 *   Developed at SunPro, a Sun Microsystems, Inc. business.
 *   Permission to use, copy, modify, and distribute this software is freely
 *   granted, provided that this notice is preserved. */
#include "kmath.h"

#include <stdint.h>
#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off")
#endif

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* y * 2^k for the y the reconstruction below makes (a normal float whose
 * exponent stays in range): k added to the exponent field. */
static float scale2(float y, int32_t k) { return float_of(bits_of(y) + ((uint32_t)k << 23)); }

/* exp(x) - 1 for finite x with |x| < 88 (tanh's arguments are in (-44, 44)):
 * x = k ln2 + r with |r| <= ln2/2 (r kept as hi - lo, c its rounding error),
 * expm1(r) from a rational form whose correction is a degree-5 polynomial in
 * r^2/2, then 2^k (expm1(r) + 1) - 1 arranged per range of k so that no
 * cancellation loses bits. */
static float expm1_finite(float x)
{
    static const float ln2_hi = 6.9313812256e-01f; /* 0x3f317180: k * ln2_hi is exact */
    static const float ln2_lo = 9.0580006145e-06f; /* 0x3717f7d1 */
    static const float invln2 = 1.4426950216e+00f; /* 0x3fb8aa3b */
    static const float Q1 = -3.3333335072e-02f, Q2 = 1.5873016091e-03f, Q3 = -7.9365076090e-05f,
                       Q4 = 4.0082177293e-06f, Q5 = -2.0109921195e-07f;
    const uint32_t ax = bits_of(x) & 0x7fffffffu;
    const int neg = (bits_of(x) >> 31) != 0;
    float c = 0.0f;
    int32_t k = 0;

    if (neg && ax >= 0x4195b844u) return -1.0f; /* x <= -27 ln2: exp(x) - 1 rounds to -1 */
    if (ax > 0x3eb17218u) {                    /* |x| > ln2/2: reduce */
        float hi, lo;
        if (ax < 0x3f851592u) {                /* |x| < 1.5 ln2: k = +-1 */
            k = neg ? -1 : 1;
            hi = neg ? x + ln2_hi : x - ln2_hi;
            lo = neg ? -ln2_lo : ln2_lo;
        } else {
            k = (int32_t)(invln2 * x + (neg ? -0.5f : 0.5f));
            const float t = (float)k;
            hi = x - t * ln2_hi;
            lo = t * ln2_lo;
        }
        x = hi - lo;
        c = (hi - x) - lo;
    } else if (ax < 0x33000000u) {             /* |x| < 2^-25: expm1(x) rounds to x */
        return x;
    }

    const float hfx = 0.5f * x, hxs = x * hfx;
    const float r1 = 1.0f + hxs * (Q1 + hxs * (Q2 + hxs * (Q3 + hxs * (Q4 + hxs * Q5))));
    const float t3 = 3.0f - r1 * hfx;
    float e = hxs * ((r1 - t3) / (6.0f - x * t3));
    if (k == 0) return x - (x * e - hxs);
    e = x * (e - c) - c;
    e = e - hxs;
    if (k == -1) return 0.5f * (x - e) - 0.5f;
    if (k == 1) return x < -0.25f ? -2.0f * (e - (x + 0.5f)) : 1.0f + 2.0f * (x - e);
    if (k <= -2 || k > 56) return scale2(1.0f - (e - x), k) - 1.0f;
    if (k < 23) return scale2(float_of(0x3f800000u - (0x1000000u >> k)) - (e - x), k); /* 1 - 2^-k */
    float y = x - (e + float_of((uint32_t)(0x7f - k) << 23));                           /* 2^-k */
    y = y + 1.0f;
    return scale2(y, k);
}

float kmath_tanhf(float x)
{
    const uint32_t ax = bits_of(x) & 0x7fffffffu;
    const int neg = (bits_of(x) >> 31) != 0;
    float z;
    if (ax >= 0x7f800000u) return ax > 0x7f800000u ? x + x : neg ? -1.0f : 1.0f; /* NaN, +-inf */
    if (ax >= 0x41b00000u) {
        z = 1.0f;                              /* |x| >= 22: tanh rounds to +-1 */
    } else if (ax < 0x24000000u) {
        return x * (1.0f + x);                 /* |x| < 2^-55 (and +-0): tanh(x) rounds to x */
    } else if (ax >= 0x3f800000u) {            /* 1 <= |x| < 22 */
        const float t = expm1_finite(2.0f * float_of(ax));
        z = 1.0f - 2.0f / (t + 2.0f);
    } else {                                   /* |x| < 1 */
        const float t = expm1_finite(-2.0f * float_of(ax));
        z = -t / (t + 2.0f);
    }
    return neg ? -z : z;
}
