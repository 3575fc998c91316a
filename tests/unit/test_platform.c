/* What the floating-point contract (docs/NUMERICS.md §1) needs from the CPU,
 * checked on the machine (or emulator) that runs the suite:
 *   - the hardware half -> float conversion the SIMD kernels use (F16C
 *     vcvtph2ps on x86-64, FCVTL / vcvt_f32_f16 on aarch64) equals the scalar
 *     kf16_to_f32 on all 65536 codes, bit for bit, NaN payloads included;
 *   - the FP control register is the default on the main thread and on the
 *     pool's worker threads: round to nearest, no flush-to-zero, no
 *     denormals-are-zero (x86 MXCSR; aarch64 FPCR FZ, FZ16, DN, FIZ/AH), and
 *     subnormals survive scalar and vector arithmetic;
 *   - the host is little-endian (the build refuses other hosts: format/kpk.h). */
#include "check.h"
#include "run/kernels/kernels.h"
#include "testrand.h"
#include "run/util/threadpool.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
/* MXCSR: FTZ bit 15, DAZ bit 6, rounding bits 13-14 (00 = nearest). */
static uint64_t fp_control(void) { return _mm_getcsr(); }
static const uint64_t FP_BAD = (1u << 15) | (1u << 6) | (3u << 13);
static const char *FP_REG = "MXCSR";
static void set_flush(uint64_t c, int on) { _mm_setcsr((unsigned)(on ? c | (1u << 15) | (1u << 6) : c)); }
__attribute__((target("f16c"))) static void hw_f16(const uint16_t *h, float *f)
{
    _mm_storeu_ps(f, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)h)));
}
static int hw_f16_available(void) { return kern_simd_supported(KSIMD_AVX2); } /* AVX2 level = AVX2 + F16C */
static float vec_mul(float a, float b)
{
    float r[4];
    _mm_storeu_ps(r, _mm_mul_ps(_mm_set1_ps(a), _mm_set1_ps(b)));
    return r[0];
}
#elif defined(__aarch64__)
#include <arm_neon.h>
/* FPCR: FIZ bit 0, AH bit 1 (FEAT_AFP; read as 0 where absent), FZ16 bit 19,
 * RMode bits 22-23 (00 = nearest), FZ bit 24, DN bit 25. */
static uint64_t fp_control(void)
{
    uint64_t v;
    __asm__ volatile("mrs %0, fpcr" : "=r"(v));
    return v;
}
static const uint64_t FP_BAD = (1u << 0) | (1u << 1) | (1u << 19) | (3u << 22) | (1u << 24) | (1u << 25);
static const char *FP_REG = "FPCR";
static void set_flush(uint64_t c, int on)
{
    uint64_t v = on ? c | (1u << 24) : c;
    __asm__ volatile("msr fpcr, %0" : : "r"(v) : "memory");
}
static void hw_f16(const uint16_t *h, float *f) { vst1q_f32(f, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)))); }
static int hw_f16_available(void) { return kern_simd_supported(KSIMD_NEON); }
static float vec_mul(float a, float b) { return vgetq_lane_f32(vmulq_f32(vdupq_n_f32(a), vdupq_n_f32(b)), 0); }
#else
#define NO_HW 1
#endif

static void test_f16_conversion(void)
{
#ifndef NO_HW
    if (!hw_f16_available()) {
        SKIP("hardware half conversion: the CPU has no %s", kern_simd_name(kern_simd_detect()));
        return;
    }
    int ok = 1, nans = 0, subs = 0;
    char why[160] = "";
    for (uint32_t h0 = 0; h0 < 65536; h0 += 4) {
        uint16_t h[4] = {(uint16_t)h0, (uint16_t)(h0 + 1), (uint16_t)(h0 + 2), (uint16_t)(h0 + 3)};
        float f[4];
        hw_f16(h, f);
        for (int j = 0; j < 4; j++) {
            uint32_t want = fbits(kf16_to_f32(h[j])), got = fbits(f[j]);
            nans += (h[j] & 0x7c00) == 0x7c00 && (h[j] & 0x3ff);
            subs += (h[j] & 0x7c00) == 0 && (h[j] & 0x3ff);
            if (got != want && ok) {
                ok = 0;
                snprintf(why, sizeof why, "code 0x%04x: hardware 0x%08x, scalar 0x%08x", h[j], got, want);
            }
        }
    }
    CHECK(ok && nans == 2 * 1023 && subs == 2 * 1023,
          "hardware half -> float == kf16_to_f32 on all 65536 codes, bit for bit (%d subnormals, %d NaNs: "
          "quieted the same way, payload kept) %s", subs, nans, why);
#else
    SKIP("hardware half conversion: no SIMD path on this architecture");
#endif
}

#ifndef NO_HW
static void read_control(void *ctx, size_t b, size_t e)
{
    uint64_t *seen = ctx;
    for (size_t i = b; i < e; i++) seen[i] = fp_control();
}
#endif

static void test_fp_environment(void)
{
#ifndef NO_HW
    uint64_t c = fp_control();
    CHECK((c & FP_BAD) == 0, "%s = 0x%llx on the main thread: round to nearest, no flush-to-zero, no denormals-are-zero",
          FP_REG, (unsigned long long)c);
    kpool *p = kpool_create(3);
    uint64_t seen[64];
    memset(seen, 0xff, sizeof seen);
    if (p) kpool_for(p, 64, read_control, seen);
    int ok = p != NULL;
    for (int i = 0; i < 64; i++) ok &= (seen[i] & FP_BAD) == 0;
    CHECK(ok, "%s has the same default on the pool's worker threads", FP_REG);
    kpool_destroy(p);
    /* the arithmetic itself: subnormal results and inputs are kept */
    volatile float tiny = 0x1p-126f, half = 0.5f, sub = 0x1p-149f, one = 1.0f;
    CHECK(tiny * half == 0x1p-127f && sub * one == 0x1p-149f && vec_mul(tiny, half) == 0x1p-127f &&
              vec_mul(sub, one) == 0x1p-149f,
          "subnormal products survive, scalar and vector (2^-126 * 0.5 = 2^-127, 2^-149 * 1)");
    /* the checks above can fail: with flush-to-zero set they see it */
    set_flush(c, 1);
    uint64_t flushed = fp_control();
    volatile float v = vec_mul(tiny, half);
    set_flush(c, 0);
    uint64_t after = fp_control();
    CHECK((flushed & FP_BAD) != 0 && v == 0.0f && (after & FP_BAD) == 0,
          "with flush-to-zero set (%s = 0x%llx) 2^-126 * 0.5 gives %a and the check sees it (restored: 0x%llx)", FP_REG,
          (unsigned long long)flushed, v, (unsigned long long)after);
#else
    SKIP("FP control register: not x86-64 or aarch64");
#endif
}

static void test_endianness(void)
{
    uint32_t one = 1;
    unsigned char b[4];
    memcpy(b, &one, 4);
    CHECK(b[0] == 1, "little-endian host (KPK files are little-endian and used in place)");
}

int main(void)
{
    test_f16_conversion();
    test_fp_environment();
    test_endianness();
    return check_exit();
}
