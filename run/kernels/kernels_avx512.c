/* AVX-512F kernels, bit-identical to the scalar reference in kernels.c.
 *
 * The 16 contract lanes are exactly one __m512 accumulator.  Every update is
 * _mm512_mul_ps then _mm512_add_ps, never fused (see the optimize pragma below;
 * tests/unit/test_kernels.c checks the bits against the scalar path).
 * The reduction adds the two 256-bit halves (lanes j+8 into j) and continues with
 * the same tree as the AVX2 path.
 *
 * MXFP4 decode: per group a 16-entry table E2M1[0..15] * 2^(s-127) (exact) is one
 * register; the 16 packed bytes are split into nibbles with one 16-bit shift
 * (garbage above bit 3 is ignored), interleaved low/high with unpack so byte k is
 * element k, zero-extended to 32 bits and looked up with _mm512_permutexvar_ps,
 * which uses only bits 0..3 of each index. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#include "kernels.h"
#include "kernels_tile.h"
/* Everything below is compiled for AVX-512F (selected at run time).
 * AVX-512F includes FMA instructions, and GCC fuses _mm512_mul_ps + _mm512_add_ps
 * into vfmadd under -ffp-contract=fast (its default outside strict ISO mode), so
 * pin the contract off here whatever the command line says. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#pragma clang attribute push(__attribute__((target("avx512f,avx2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,f16c")
#pragma GCC optimize("fp-contract=off")
#endif

#define AI static inline __attribute__((always_inline))

AI float hsum16(__m512 v16)
{
    __m256 lo = _mm512_castps512_ps256(v16);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v16), 1));
    __m256 v = _mm256_add_ps(lo, hi);                                              /* j += j+8 */
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* j += j+4 */
    __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));                                 /* j += j+2 */
    return _mm_cvtss_f32(_mm_add_ss(b, _mm_shuffle_ps(b, b, 1)));                  /* 0 + 1 */
}

AI __m512 ld_w16(int wt, const void *base, size_t i)
{
    if (wt == WT_F32) return _mm512_loadu_ps((const float *)base + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i));
    if (wt == WT_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

AI float ld_w1(int wt, const void *base, size_t i)
{
    if (wt == WT_F32) return ((const float *)base)[i];
    if (wt == WT_BF16) return kern_bf16(((const uint16_t *)base)[i]);
    return kern_f16(((const uint16_t *)base)[i]);
}

AI size_t wt_size(int wt) { return wt == WT_F32 ? 4 : 2; }

#define MX_PREFETCH 8192 /* see kernels_blocking.h */

AI void tile_wide(int wt, int R, int P, const tile_args *a)
{
    const char *w0 = a->w;
    const size_t ws = a->ws, ldx = a->ldx;
    const float *x0 = a->x;
    __m512 acc[MAXR][MAXP];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int p = 0; p < P; p++)
            acc[r][p] = a->first ? _mm512_setzero_ps() : _mm512_loadu_ps(a->acc + r * a->accr + p * 16);
    const size_t pfo = a->pf;
    for (size_t i = a->i0; i < a->i1; i += 16) {
        if (pfo && ((i * wt_size(wt)) & 63) == 0)
            for (int r = 0; r < R; r++) _mm_prefetch(w0 + r * ws + i * wt_size(wt) + pfo, _MM_HINT_T0);
        if (R <= P) {
            __m512 w[MAXR];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) w[r] = ld_w16(wt, w0 + r * ws, i);
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) {
                __m512 x = _mm512_loadu_ps(x0 + p * ldx + i);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) acc[r][p] = _mm512_add_ps(acc[r][p], _mm512_mul_ps(w[r], x));
            }
        } else {
            __m512 x[MAXP];
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) x[p] = _mm512_loadu_ps(x0 + p * ldx + i);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m512 w = ld_w16(wt, w0 + r * ws, i);
#pragma GCC unroll 4
                for (int p = 0; p < P; p++) acc[r][p] = _mm512_add_ps(acc[r][p], _mm512_mul_ps(w, x[p]));
            }
        }
    }
    if (!a->last) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) _mm512_storeu_ps(a->acc + r * a->accr + p * 16, acc[r][p]);
        return;
    }
    float *y0 = a->y;
    const size_t ldy = a->ldy, n = a->n, nb = n - n % 16;
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) y0[p * ldy + r] = hsum16(acc[r][p]);
    /* The tail, after every accumulator is reduced (keeps them out of memory). */
    if (nb < n)
        for (int r = 0; r < R; r++)
            for (int p = 0; p < P; p++) {
                float s = y0[p * ldy + r];
                for (size_t i = nb; i < n; i++) s = s + ld_w1(wt, w0 + r * ws, i) * x0[p * ldx + i];
                y0[p * ldy + r] = s;
            }
}

/* ---------------------------------------------------------------- MXFP4 */

AI __m512 mx_table(uint8_t s)
{
    const __m512 e2m1 = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f,
                                       -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
    return _mm512_mul_ps(e2m1, _mm512_set1_ps(kern_e8m0(s)));
}

/* The 32 elements of a group from its 16 packed bytes at q. */
AI void mx_decode(__m512 tab, const uint8_t *q, __m512 *w0, __m512 *w1)
{
    __m128i b = _mm_loadu_si128((const __m128i *)q);
    __m128i h = _mm_srli_epi16(b, 4);
    *w0 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, h)), tab);
    *w1 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(b, h)), tab);
}

/* Column range [i0, i1) in multiples of 32; n % 32 == 0 (no tail). */
AI void tile_mx(int R, int P, const tile_args *a)
{
    const uint8_t *q0 = (const uint8_t *)a->w, *s0 = a->s;
    const size_t qs = a->ws, ss = a->ss, ldx = a->ldx;
    const float *x0 = a->x;
    __m512 acc[MAXR][MAXP];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int p = 0; p < P; p++)
            acc[r][p] = a->first ? _mm512_setzero_ps() : _mm512_loadu_ps(a->acc + r * a->accr + p * 16);
    const size_t pfo = a->pf;
    for (size_t g = a->i0 / 32; g < a->i1 / 32; g++) {
        const size_t i = 32 * g;
        if (pfo && (g & 3) == 0)
            for (int r = 0; r < R; r++) _mm_prefetch((const char *)(q0 + r * qs + 16 * g + pfo), _MM_HINT_T0);
        if (R <= P) {
            __m512 wa[MAXR], wb[MAXR];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) mx_decode(mx_table(s0[r * ss + g]), q0 + r * qs + 16 * g, &wa[r], &wb[r]);
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) {
                __m512 xa = _mm512_loadu_ps(x0 + p * ldx + i), xb = _mm512_loadu_ps(x0 + p * ldx + i + 16);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    acc[r][p] = _mm512_add_ps(acc[r][p], _mm512_mul_ps(wa[r], xa));
                    acc[r][p] = _mm512_add_ps(acc[r][p], _mm512_mul_ps(wb[r], xb));
                }
            }
        } else {
            __m512 xa[MAXP], xb[MAXP];
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) {
                xa[p] = _mm512_loadu_ps(x0 + p * ldx + i);
                xb[p] = _mm512_loadu_ps(x0 + p * ldx + i + 16);
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m512 wa, wb;
                mx_decode(mx_table(s0[r * ss + g]), q0 + r * qs + 16 * g, &wa, &wb);
#pragma GCC unroll 4
                for (int p = 0; p < P; p++) {
                    acc[r][p] = _mm512_add_ps(acc[r][p], _mm512_mul_ps(wa, xa[p]));
                    acc[r][p] = _mm512_add_ps(acc[r][p], _mm512_mul_ps(wb, xb[p]));
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            if (a->last) a->y[p * a->ldy + r] = hsum16(acc[r][p]);
            else _mm512_storeu_ps(a->acc + r * a->accr + p * 16, acc[r][p]);
        }
}

/* y[c] = sum_r W[r][c] * x[r-r0], sequential in r for each c; vectorised across c. */
AI void matvec_t_wide(int wt, const char *w0, size_t ws, size_t nr, size_t n, const float *x, float *y)
{
    size_t c = 0;
    for (; c + 128 <= n; c += 128) {
        __m512 acc[8];
#pragma GCC unroll 8
        for (int b = 0; b < 8; b++) acc[b] = _mm512_setzero_ps();
        for (size_t r = 0; r < nr; r++) {
            __m512 xv = _mm512_set1_ps(x[r]);
#pragma GCC unroll 8
            for (int b = 0; b < 8; b++)
                acc[b] = _mm512_add_ps(acc[b], _mm512_mul_ps(ld_w16(wt, w0 + r * ws, c + 16 * (size_t)b), xv));
        }
#pragma GCC unroll 8
        for (int b = 0; b < 8; b++) _mm512_storeu_ps(y + c + 16 * b, acc[b]);
    }
    for (; c + 16 <= n; c += 16) {
        __m512 acc = _mm512_setzero_ps();
        for (size_t r = 0; r < nr; r++)
            acc = _mm512_add_ps(acc, _mm512_mul_ps(ld_w16(wt, w0 + r * ws, c), _mm512_set1_ps(x[r])));
        _mm512_storeu_ps(y + c, acc);
    }
    for (; c < n; c++) {
        float acc = 0.0f;
        for (size_t r = 0; r < nr; r++) acc = acc + ld_w1(wt, w0 + r * ws, c) * x[r];
        y[c] = acc;
    }
}

/* Tile shapes used by the driver: (RB, 1..PB), (1, 1..PB) and (RB1_MX, 1). */
#define TILE_CASES(X) X(1, 1) X(1, 2) X(1, 3) X(1, 4) X(2, 1) X(2, 2) X(2, 3) X(2, 4) \
                      X(4, 1) X(4, 2) X(4, 3) X(4, 4)
/* Blocking: see kernels_blocking.h; 32 registers allow
 * 4-row x 4-position tiles for several positions (2 x 4 for MXFP4,
 * whose decoded pairs take more registers). */
#define RB_WIDE 4
#define RB_MX 2
#define SFX avx512
#include "kernels_entry.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#else
typedef int kernels_avx512_unused;
#endif
