/* Scalar reference kernels and run-time SIMD dispatch.  The scalar functions here
 * ARE the floating-point contract (docs/NUMERICS.md section 3); the AVX2,
 * AVX-512 and NEON files must reproduce them bit for bit. */
#include "kernels.h"
#include "run/util/threadpool.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#define KERN_X86 1
#include <cpuid.h>
#else
#define KERN_X86 0
#endif
#if defined(__aarch64__)
#define KERN_NEON 1
#include <sys/auxv.h>
#include <asm/hwcap.h>
#else
#define KERN_NEON 0
#endif

const float KE2M1[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

float ke8m0_scale(uint8_t s) { return kern_e8m0(s); }

float kbf16_to_f32(uint16_t h) { return kern_bf16(h); }

float kf16_to_f32(uint16_t h) { return kern_f16(h); }

size_t kmat_bytes(const kmat *W)
{
    size_t n = W->rows * W->cols;
    switch (W->type) {
    case KD_F32: return n * 4;
    case KD_BF16:
    case KD_F16: return n * 2;
    case KD_MXFP4: return n / 2 + W->rows * (W->cols / 32);
    }
    return 0;
}

/* ---------------------------------------------------------------- scalar path */

/* The fixed reduction tree: lanes j+8 into j, then j+4, then j+2, then 0+1. */
static float tree16(float *acc)
{
    for (int j = 0; j < 8; j++) acc[j] = acc[j] + acc[j + 8];
    for (int j = 0; j < 4; j++) acc[j] = acc[j] + acc[j + 4];
    for (int j = 0; j < 2; j++) acc[j] = acc[j] + acc[j + 2];
    return acc[0] + acc[1];
}

float kdot_f32_scalar(const float *w, const float *x, size_t n)
{
    float acc[16] = {0};
    size_t nb = n - n % 16;
    for (size_t i = 0; i < nb; i += 16)
        for (int j = 0; j < 16; j++) acc[j] = acc[j] + w[i + j] * x[i + j];
    float s = tree16(acc);
    for (size_t i = nb; i < n; i++) s = s + w[i] * x[i];
    return s;
}

float kdot_bf16_scalar(const uint16_t *w, const float *x, size_t n)
{
    float acc[16] = {0};
    size_t nb = n - n % 16;
    for (size_t i = 0; i < nb; i += 16)
        for (int j = 0; j < 16; j++) acc[j] = acc[j] + kern_bf16(w[i + j]) * x[i + j];
    float s = tree16(acc);
    for (size_t i = nb; i < n; i++) s = s + kern_bf16(w[i]) * x[i];
    return s;
}

float kdot_f16_scalar(const uint16_t *w, const float *x, size_t n)
{
    float acc[16] = {0};
    size_t nb = n - n % 16;
    for (size_t i = 0; i < nb; i += 16)
        for (int j = 0; j < 16; j++) acc[j] = acc[j] + kern_f16(w[i + j]) * x[i + j];
    float s = tree16(acc);
    for (size_t i = nb; i < n; i++) s = s + kern_f16(w[i]) * x[i];
    return s;
}

/* Element i of an MXFP4 row, formed exactly. */
static inline float mx_elem(const uint8_t *packed, const uint8_t *scales, size_t i)
{
    unsigned nib = (packed[i / 2] >> ((i & 1) * 4)) & 15u;
    return KE2M1[nib] * kern_e8m0(scales[i / 32]);
}

/* n % 32 == 0 is the intended use; other n follow the same contract (the last
 * partial group still uses scale byte i/32). */
float kdot_mxfp4_scalar(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n)
{
    float acc[16] = {0};
    size_t nb = n - n % 16;
    for (size_t i = 0; i < nb; i += 16) {
        float sc = kern_e8m0(scales[i / 32]);
        for (int j = 0; j < 16; j += 2) {
            unsigned b = packed[(i + j) / 2];
            acc[j] = acc[j] + (KE2M1[b & 15u] * sc) * x[i + j];
            acc[j + 1] = acc[j + 1] + (KE2M1[b >> 4] * sc) * x[i + j + 1];
        }
    }
    float s = tree16(acc);
    for (size_t i = nb; i < n; i++) s = s + mx_elem(packed, scales, i) * x[i];
    return s;
}

static float row_dot_scalar(const kmat *W, size_t r, const float *x)
{
    size_t n = W->cols;
    switch (W->type) {
    case KD_F32: return kdot_f32_scalar((const float *)W->data + r * n, x, n);
    case KD_BF16: return kdot_bf16_scalar((const uint16_t *)W->data + r * n, x, n);
    case KD_F16: return kdot_f16_scalar((const uint16_t *)W->data + r * n, x, n);
    case KD_MXFP4:
        return kdot_mxfp4_scalar((const uint8_t *)W->data + r * (n / 2), W->scales + r * (n / 32), x, n);
    }
    return 0.0f;
}

void kmatmul_rows_scalar(const kmat *W, size_t r0, size_t r1, const float *X, size_t ldx,
                         size_t T, float *Y, size_t ldy)
{
    for (size_t t = 0; t < T; t++)
        for (size_t r = r0; r < r1; r++) Y[t * ldy + r] = row_dot_scalar(W, r, X + t * ldx);
}

static inline float mat_elem(const kmat *W, size_t r, size_t c)
{
    size_t n = W->cols;
    switch (W->type) {
    case KD_F32: return ((const float *)W->data)[r * n + c];
    case KD_BF16: return kern_bf16(((const uint16_t *)W->data)[r * n + c]);
    case KD_F16: return kern_f16(((const uint16_t *)W->data)[r * n + c]);
    case KD_MXFP4: return mx_elem((const uint8_t *)W->data + r * (n / 2), W->scales + r * (n / 32), c);
    }
    return 0.0f;
}

void kmatvec_t_scalar(const kmat *W, size_t r0, size_t r1, const float *x, float *y)
{
    size_t n = W->cols;
    for (size_t c = 0; c < n; c++) y[c] = 0.0f;
    for (size_t r = r0; r < r1; r++) {
        float xv = x[r - r0];
        for (size_t c = 0; c < n; c++) y[c] = y[c] + mat_elem(W, r, c) * xv;
    }
}

/* ---------------------------------------------------------------- dispatch */

static _Atomic int g_level = -1;

ksimd kern_simd_detect(void)
{
#if KERN_X86
    unsigned a, b, c, d;
    __builtin_cpu_init();
    /* F16C through cpuid: clang's __builtin_cpu_supports does not know "f16c" */
    if (!__builtin_cpu_supports("avx2") || !__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_F16C)) return KSIMD_SCALAR;
    if (__builtin_cpu_supports("avx512f")) return KSIMD_AVX512;
    return KSIMD_AVX2;
#elif KERN_NEON
    return (getauxval(AT_HWCAP) & HWCAP_ASIMD) ? KSIMD_NEON : KSIMD_SCALAR;
#else
    return KSIMD_SCALAR;
#endif
}

int kern_simd_supported(ksimd l)
{
    ksimd best = kern_simd_detect();
    switch (l) {
    case KSIMD_SCALAR: return 1;
    case KSIMD_AVX2: return best == KSIMD_AVX2 || best == KSIMD_AVX512;
    case KSIMD_AVX512: return best == KSIMD_AVX512;
    case KSIMD_NEON: return best == KSIMD_NEON;
    }
    return 0;
}

const char *kern_simd_name(ksimd l)
{
    switch (l) {
    case KSIMD_SCALAR: return "scalar";
    case KSIMD_AVX2: return "avx2";
    case KSIMD_AVX512: return "avx512";
    case KSIMD_NEON: return "neon";
    }
    return "?";
}

int kern_simd_parse(const char *s, ksimd *out)
{
    if (!s) return -1;
    if (!strcmp(s, "scalar")) { *out = KSIMD_SCALAR; return 0; }
    if (!strcmp(s, "avx2")) { *out = KSIMD_AVX2; return 0; }
    if (!strcmp(s, "avx512")) { *out = KSIMD_AVX512; return 0; }
    if (!strcmp(s, "neon")) { *out = KSIMD_NEON; return 0; }
    return -1;
}

static ksimd clamp_level(ksimd l)
{
    if ((int)l < 0) return KSIMD_SCALAR;
    return kern_simd_supported(l) ? l : kern_simd_detect();
}

void kern_simd_set(ksimd level)
{
    atomic_store_explicit(&g_level, (int)clamp_level(level), memory_order_relaxed);
}

ksimd kern_simd_get(void)
{
    int l = atomic_load_explicit(&g_level, memory_order_relaxed);
    if (l >= 0) return (ksimd)l;
    ksimd want = kern_simd_detect();
    const char *env = getenv("KRUN_SIMD");
    if (env && *env) {
        ksimd e;
        if (kern_simd_parse(env, &e) == 0) want = clamp_level(e);
        else fprintf(stderr, "krun: ignoring KRUN_SIMD=%s (want scalar, avx2, avx512 or neon)\n", env);
    }
    int expect = -1;
    if (!atomic_compare_exchange_strong(&g_level, &expect, (int)want)) return (ksimd)expect;
    return want;
}

/* `ret name_LEVEL args` for the level in force (ret: return, or (void) in a
 * void function); only the target's levels are compiled in (the Makefile
 * builds only its kernel files). */
#if KERN_X86
#define DISPATCH(ret, name, args)                        \
    switch (kern_simd_get()) {                           \
    case KSIMD_AVX512: ret name##_avx512 args; break;    \
    case KSIMD_AVX2: ret name##_avx2 args; break;        \
    default: ret name##_scalar args; break;              \
    }
#elif KERN_NEON
#define DISPATCH(ret, name, args)                        \
    switch (kern_simd_get()) {                           \
    case KSIMD_NEON: ret name##_neon args; break;        \
    default: ret name##_scalar args; break;              \
    }
#else
#define DISPATCH(ret, name, args) ret name##_scalar args;
#endif

float kdot_f32(const float *w, const float *x, size_t n) { DISPATCH(return, kdot_f32, (w, x, n)) }

float kdot_bf16(const uint16_t *w, const float *x, size_t n) { DISPATCH(return, kdot_bf16, (w, x, n)) }

float kdot_f16(const uint16_t *w, const float *x, size_t n) { DISPATCH(return, kdot_f16, (w, x, n)) }

float kdot_mxfp4(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n)
{
    DISPATCH(return, kdot_mxfp4, (packed, scales, x, n))
}

float kmat_row_dot(const kmat *W, size_t r, const float *x)
{
    size_t n = W->cols;
    switch (W->type) {
    case KD_F32: return kdot_f32((const float *)W->data + r * n, x, n);
    case KD_BF16: return kdot_bf16((const uint16_t *)W->data + r * n, x, n);
    case KD_F16: return kdot_f16((const uint16_t *)W->data + r * n, x, n);
    case KD_MXFP4:
        return kdot_mxfp4((const uint8_t *)W->data + r * (n / 2), W->scales + r * (n / 32), x, n);
    }
    return 0.0f;
}

void kmatmul_rows(const kmat *W, size_t r0, size_t r1, const float *X, size_t ldx, size_t T,
                  float *Y, size_t ldy)
{
    if (r1 <= r0 || T == 0) return;
    DISPATCH((void), kmatmul_rows, (W, r0, r1, X, ldx, T, Y, ldy))
}

void kmatvec_t(const kmat *W, size_t r0, size_t r1, const float *x, float *y)
{
    DISPATCH((void), kmatvec_t, (W, r0, r1, x, y))
}

/* Threads split the rows in units of KMM_UNIT (a multiple of every register
 * blocking factor, so tiles are never cut; the bits would not change anyway). */
#define KMM_UNIT 16
/* Below this many multiply-adds the product runs on the calling thread. */
#define KMM_MIN_PARALLEL ((size_t)1 << 16)

typedef struct {
    const kmat *W;
    const float *X;
    size_t ldx, T, ldy;
    float *Y;
} kmm_job;

static void kmm_chunk(void *ctx, size_t b, size_t e)
{
    const kmm_job *j = ctx;
    size_t r0 = b * KMM_UNIT, r1 = e * KMM_UNIT;
    if (r1 > j->W->rows) r1 = j->W->rows;
    kmatmul_rows(j->W, r0, r1, j->X, j->ldx, j->T, j->Y, j->ldy);
}

void kmatmul(struct kpool *pool, const kmat *W, const float *X, size_t ldx, size_t T, float *Y,
             size_t ldy)
{
    if (W->rows == 0 || T == 0) return;
    if (!pool || kpool_threads(pool) <= 1 || W->rows <= KMM_UNIT ||
        W->rows * W->cols * T < KMM_MIN_PARALLEL) {
        kmatmul_rows(W, 0, W->rows, X, ldx, T, Y, ldy);
        return;
    }
    kmm_job j = {W, X, ldx, T, ldy, Y};
    kpool_for(pool, (W->rows + KMM_UNIT - 1) / KMM_UNIT, kmm_chunk, &j);
}
