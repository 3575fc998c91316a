/* kmath_expf and kmath_tanhf (run/kernels/kmath.h): accurate against double
 * precision, the special values, the same bits on every architecture (a hash
 * of their outputs on a fixed sample of a million inputs, pinned), and on
 * x86-64 with glibc 2.36 the very bits of the C library's expf and tanhf,
 * which krun used before (so moving to them changed no output there).
 * kmath_expf's two x86-64 builds (with the FMA instruction; with the C
 * library's fma(), as on CPUs without FMA) give the same bits: compared on
 * the sample and on every 64th float where exp's argument lives, and the
 * sample's hash again in a child whose glibc is told the CPU has no FMA
 * (GLIBC_TUNABLES), so that its fma() is the software one. */
#include "check.h"
#include "run/kernels/kmath.h"
#include "testrand.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <gnu/libc-version.h>
#endif

/* every 4099th bit pattern: all signs and exponents, 1,047,809 inputs */
#define STRIDE 4099u
/* FNV-1a over the output bits of that sample; a change means other bits
 * somewhere, on this machine or on another (x86-64 and aarch64 agree). */
#define SAMPLE_HASH 0x54e2070753ef2804ull
#define SAMPLE_HASH_EXP 0x03b0cd2036f2dfe5ull

static double ulps(float got, double want)
{
    float w = (float)want;
    double ulp = w == 0.0f ? 0x1p-149 : ldexp(1.0, ilogbf(w) - 23);
    if (ulp < 0x1p-149) ulp = 0x1p-149;
    return fabs((double)got - want) / ulp;
}

/* FNV-1a of f's output bits over the sample */
static uint64_t sample_hash(float (*f)(float))
{
    uint64_t h = 1469598103934665603ull;
    for (uint64_t u = 0; u < 0x100000000ull; u += STRIDE) h = (h ^ fbits(f(bitsf((uint32_t)u)))) * 1099511628211ull;
    return h;
}

/* kmath_expf == kmath_expf_nofma: on the sample, and on every 64th float of
 * +-[2^-12, 128) (what the forward pass gives exp: softmax and sigmoid
 * arguments, the KDA decay). */
static void test_expf_builds(void)
{
    uint64_t n = 0, bad = 0;
    float first = 0;
    for (uint64_t u = 0; u < 0x100000000ull; u += STRIDE, n++) {
        const float x = bitsf((uint32_t)u);
        if (fbits(kmath_expf(x)) != fbits(kmath_expf_nofma(x)) && !bad++) first = x;
    }
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t u = fbits(0x1p-12f); u < fbits(128.0f); u += 64, n++) {
            const float x = bitsf(u | sign << 31);
            if (fbits(kmath_expf(x)) != fbits(kmath_expf_nofma(x)) && !bad++) first = x;
        }
    CHECK(bad == 0, "expf: the FMA-instruction build and the fma()-call build give the same bits on %llu inputs (%llu differ, first at %a)",
          (unsigned long long)n, (unsigned long long)bad, first);
#if defined(__x86_64__) && defined(__GLIBC__)
    /* and with glibc's software fma (its ifunc picks the FMA instruction on
     * this CPU otherwise): the same test binary, its glibc told there is none */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("GLIBC_TUNABLES", "glibc.cpu.hwcaps=-FMA,-FMA4,-AVX2", 1);
        execl("/proc/self/exe", "test_kmath", "--software-fma", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "expf with glibc's software fma(): the child's check passed (status 0x%x)", status);
#else
    SKIP("expf with glibc's software fma(): not x86-64 glibc (kmath_expf_nofma is kmath_expf here)");
#endif
}

static void test_expf(void)
{
    uint64_t h = 1469598103934665603ull;
    double worst = 0;
    float worst_x = 0;
    int same_libm = 1;
    char why[160] = "";
    for (uint64_t u = 0; u < 0x100000000ull; u += STRIDE) {
        const float x = bitsf((uint32_t)u), y = kmath_expf(x);
        h = (h ^ fbits(y)) * 1099511628211ull;
        if (isnan(x)) continue;
        const double want = exp((double)x);
        if (want < 0x1p-126 || want > 0x1.fffffep127) continue; /* subnormal and overflowing results: below */
        const double e = ulps(y, want);
        if (e > worst) worst = e, worst_x = x;
        if (fbits(y) != fbits(expf(x)) && same_libm) {
            same_libm = 0;
            snprintf(why, sizeof why, "x = %a: kmath 0x%08x, libm 0x%08x", x, fbits(y), fbits(expf(x)));
        }
    }
    CHECK(worst <= 0.51, "expf within 0.51 ulp of exp in double on every sampled input with a normal result (worst %.4f ulp at %a)",
          worst, worst_x);
    CHECK(h == SAMPLE_HASH_EXP, "expf: the sample's output bits hash to the pinned value on this machine (0x%016llx)",
          (unsigned long long)h);
    CHECK(kmath_expf(0.0f) == 1.0f && kmath_expf(-0.0f) == 1.0f && kmath_expf(1.0f) == (float)exp(1.0) &&
              kmath_expf(-1.0f) == (float)exp(-1.0) && kmath_expf(10.0f) == (float)exp(10.0),
          "expf(+-0) = 1; e, 1/e, e^10 correctly rounded");
    CHECK(kmath_expf(-INFINITY) == 0.0f && !signbit(kmath_expf(-INFINITY)) && kmath_expf(INFINITY) == INFINITY &&
              isnan(kmath_expf(NAN)) && kmath_expf(89.0f) == INFINITY && kmath_expf(-104.0f) == 0.0f,
          "expf: -inf gives +0, +inf and overflow +inf, NaN NaN, underflow 0");
    const float sub = kmath_expf(-100.0f), sub2 = kmath_expf(-103.0f);
    CHECK(sub == (float)exp(-100.0) && sub > 0 && sub < 0x1p-126f && sub2 == (float)exp(-103.0),
          "expf(-100) = %a and expf(-103) = %a: subnormal results, correctly rounded", sub, sub2);
#if defined(__x86_64__) && defined(__GLIBC__)
    if (strcmp(gnu_get_libc_version(), "2.36") == 0)
        CHECK(same_libm, "expf == glibc 2.36's x86-64 expf on every sampled input (krun's bits before kmath) %s", why);
    else
        SKIP("expf == glibc 2.36's x86-64 expf: this C library is glibc %s", gnu_get_libc_version());
#else
    (void)same_libm;
    SKIP("expf == glibc 2.36's x86-64 expf: not x86-64 glibc (this C library's expf %s)",
         same_libm ? "agrees on the sample" : "differs on the sample");
#endif
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--software-fma")) { /* the child of test_expf_builds */
        const uint64_t h = sample_hash(kmath_expf_nofma);
        CHECK(h == SAMPLE_HASH_EXP, "expf, fma() from glibc told there is no FMA (%s): the sample's output bits hash to the pinned value (0x%016llx)",
              getenv("GLIBC_TUNABLES"), (unsigned long long)h);
        return check_exit();
    }
    test_expf();
    test_expf_builds();
    uint64_t h = 1469598103934665603ull;
    double worst = 0;
    float worst_x = 0;
    int odd = 1, same_libm = 1;
    char why[160] = "";
    for (uint64_t u = 0; u < 0x100000000ull; u += STRIDE) {
        const float x = bitsf((uint32_t)u), y = kmath_tanhf(x);
        h = (h ^ fbits(y)) * 1099511628211ull;
        if (isnan(x)) continue;
        const double e = ulps(y, tanh((double)x));
        if (e > worst) worst = e, worst_x = x;
        const float m = kmath_tanhf(-x);
        odd &= fbits(m) == (fbits(y) ^ 0x80000000u);
        if (fbits(y) != fbits(tanhf(x)) && same_libm) {
            same_libm = 0;
            snprintf(why, sizeof why, "x = %a: kmath 0x%08x, libm 0x%08x", x, fbits(y), fbits(tanhf(x)));
        }
    }
    CHECK(worst <= 2.5, "within 2.5 ulp of tanh in double on every sampled input (fdlibm's tanhf is a 2-ulp function) (worst %.3f ulp at %a)", worst, worst_x);
    CHECK(odd, "odd: tanh(-x) = -tanh(x), bit for bit");
    CHECK(h == SAMPLE_HASH, "the sample's output bits hash to the pinned value on this machine (0x%016llx)",
          (unsigned long long)h);

    const float inf = INFINITY;
    CHECK(fbits(kmath_tanhf(0.0f)) == 0 && fbits(kmath_tanhf(-0.0f)) == 0x80000000u, "+-0 keep their sign");
    CHECK(kmath_tanhf(inf) == 1.0f && kmath_tanhf(-inf) == -1.0f && kmath_tanhf(22.0f) == 1.0f &&
              kmath_tanhf(-30.0f) == -1.0f && kmath_tanhf(FLT_MAX) == 1.0f,
          "+-inf and |x| >= 22 give +-1");
    CHECK(isnan(kmath_tanhf(NAN)) && isnan(kmath_tanhf(-NAN)), "NaN gives NaN");
    CHECK(kmath_tanhf(0x1p-149f) == 0x1p-149f && kmath_tanhf(-0x1p-100f) == -0x1p-100f && kmath_tanhf(0x1p-30f) == 0x1p-30f,
          "tiny and subnormal x give x");
    CHECK(kmath_tanhf(0.5f) == (float)tanh(0.5) && kmath_tanhf(-1.0f) == (float)tanh(-1.0) &&
              kmath_tanhf(3.0f) == (float)tanh(3.0),
          "tanh(0.5), tanh(-1), tanh(3) correctly rounded");

#if defined(__x86_64__) && defined(__GLIBC__)
    if (strcmp(gnu_get_libc_version(), "2.36") == 0)
        CHECK(same_libm, "== glibc 2.36's x86-64 tanhf on every sampled input (krun's bits before kmath) %s", why);
    else
        SKIP("== glibc 2.36's x86-64 tanhf: this C library is glibc %s", gnu_get_libc_version());
#else
    (void)same_libm;
    SKIP("== glibc 2.36's x86-64 tanhf: not x86-64 glibc (this C library's tanhf %s)",
         same_libm ? "agrees on the sample" : "differs on the sample");
#endif
    return check_exit();
}
