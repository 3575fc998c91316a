/* Kernels of the sequential parts (kernels_seq.h): the scalar reference,
 * AVX2 and AVX-512 instantiations of kernels_seq_simd.h, and the dispatch
 * (the NEON instantiation is kernels_seq_neon.c). */
#include "kernels_seq.h"

#include "kernels.h"

/* ---------------------------------------------------------------- scalar path */

void kseq_decay_read_scalar(float *S, const float *Sin, size_t D, const float *alpha, const float *k, float *u)
{
    for (size_t c = 0; c < D; c++) u[c] = 0.0f;
    for (size_t i = 0; i < D; i++)
        for (size_t c = 0; c < D; c++) {
            S[i * D + c] = Sin[i * D + c] * alpha[i];
            u[c] = u[c] + S[i * D + c] * k[i];
        }
}

void kseq_write_out_scalar(float *S, size_t D, const float *k, const float *d, const float *q, float *o)
{
    if (o) for (size_t c = 0; c < D; c++) o[c] = 0.0f;
    for (size_t i = 0; i < D; i++)
        for (size_t c = 0; c < D; c++) {
            S[i * D + c] = S[i * D + c] + k[i] * d[c];
            if (o) o[c] = o[c] + S[i * D + c] * q[i];
        }
}

void kseq_wsum_scalar(float *y, size_t ldy, const float *w, size_t ldw, size_t H, const float *x, size_t ldx, size_t n, size_t m)
{
    for (size_t p = 0; p < n; p++)
        for (size_t h = 0; h < H; h++)
            for (size_t c = 0; c < m; c++) y[h * ldy + c] = y[h * ldy + c] + w[h * ldw + p] * x[p * ldx + c];
}

/* ---------------------------------------------------------------- SIMD paths */

#if defined(__x86_64__) || defined(__i386__)
#define KSEQ_X86 1
#include <immintrin.h>

/* AVX2: two separate instructions per update; the target has no FMA, so
 * nothing can be fused. */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
#define V __m256
#define VW 8
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VADD _mm256_add_ps
#define VMUL _mm256_mul_ps
#define VSET1 _mm256_set1_ps
#define VZERO _mm256_setzero_ps
#define SFX avx2
#define KSEQ_WSUM_NB 2
#include "kernels_seq_simd.h"
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* AVX-512F includes FMA: pin the contract off here whatever the command line
 * says (as kernels_avx512.c does). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#pragma clang attribute push(__attribute__((target("avx512f,avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2")
#pragma GCC optimize("fp-contract=off")
#endif
#define V __m512
#define VW 16
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VADD _mm512_add_ps
#define VMUL _mm512_mul_ps
#define VSET1 _mm512_set1_ps
#define VZERO _mm512_setzero_ps
#define SFX avx512
#define KSEQ_WSUM_NB 4
#include "kernels_seq_simd.h"
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else
#define KSEQ_X86 0
#endif

/* ---------------------------------------------------------------- dispatch */

#if KSEQ_X86
#define KSEQ_DISPATCH(name, args)                  \
    switch (kern_simd_get()) {                     \
    case KSIMD_AVX512: name##_avx512 args; return; \
    case KSIMD_AVX2: name##_avx2 args; return;     \
    default: name##_scalar args; return;           \
    }
#elif defined(__aarch64__)
#define KSEQ_DISPATCH(name, args)              \
    switch (kern_simd_get()) {                 \
    case KSIMD_NEON: name##_neon args; return; \
    default: name##_scalar args; return;       \
    }
#else
#define KSEQ_DISPATCH(name, args) name##_scalar args;
#endif

void kseq_decay_read(float *S, const float *Sin, size_t D, const float *alpha, const float *k, float *u)
{
    KSEQ_DISPATCH(kseq_decay_read, (S, Sin, D, alpha, k, u))
}

void kseq_write_out(float *S, size_t D, const float *k, const float *d, const float *q, float *o)
{
    KSEQ_DISPATCH(kseq_write_out, (S, D, k, d, q, o))
}

void kseq_wsum(float *y, size_t ldy, const float *w, size_t ldw, size_t H, const float *x, size_t ldx, size_t n, size_t m)
{
    KSEQ_DISPATCH(kseq_wsum, (y, ldy, w, ldw, H, x, ldx, n, m))
}
