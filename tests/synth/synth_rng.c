/* Seeded PRNG: splitmix64 seeds xoshiro256** (Vigna's public-domain algorithms). */
#include "synth.h"

#include <math.h>
#include <pthread.h>
#include <time.h>

float synth_ztab[SYNTH_ZTAB_N];
static pthread_once_t ztab_once = PTHREAD_ONCE_INIT;

/* Acklam's rational approximation of the inverse normal CDF (rel. error 1.2e-9), p < 0.5. */
static double inv_norm_lower(double p)
{
    static const double c[6] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                                -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00};
    static const double d[4] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                                3.754408661907416e+00};
    static const double a[6] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                                1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00};
    static const double b[5] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                                6.680131188771972e+01, -1.328068155288572e+01};
    if (p < 0.02425) {
        double q = sqrt(-2.0 * log(p));
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
               ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0);
    } else {
        double q = p - 0.5, r = q * q;
        return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
               (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0);
    }
}

static void ztab_build(void)
{
    static double z[SYNTH_ZTAB_N];
    double var = 0.0, scale;
    const unsigned N = SYNTH_ZTAB_N;
    for (unsigned i = 0; i < N / 2; i++) {
        z[i] = inv_norm_lower(((double)i + 0.5) / (double)N);
        z[N - 1 - i] = -z[i];
    }
    for (unsigned i = 0; i < N; i++) var += z[i] * z[i];
    scale = 1.0 / sqrt(var / (double)N);
    for (unsigned i = 0; i < N; i++) synth_ztab[i] = (float)(z[i] * scale);
}

void synth_normal_init(void) { pthread_once(&ztab_once, ztab_build); }

uint64_t synth_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void synth_rng_seed(synth_rng *r, uint64_t seed)
{
    uint64_t st = seed;
    for (int i = 0; i < 4; i++) r->s[i] = synth_splitmix64(&st);
    /* xoshiro must not start from all zeros (splitmix64 never yields four). */
    if (!(r->s[0] | r->s[1] | r->s[2] | r->s[3])) r->s[0] = 1;
}

uint64_t synth_hash_str(const char *s)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (; *s; s++) {
        h ^= (uint8_t)*s;
        h *= 0x100000001B3ull;
    }
    return h;
}

double synth_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
