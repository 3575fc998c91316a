/* AVX2 kernels, bit-identical to the scalar reference in kernels.c.
 *
 * The 16 contract lanes are two __m256 accumulators: lanes 0-7 and 8-15.  Every
 * update is _mm256_mul_ps then _mm256_add_ps (the target below does not enable
 * FMA, so the compiler cannot fuse them either), and hsum16 is exactly the
 * contract's reduction tree.  Compiled for avx2+f16c only inside this file; the
 * dispatcher calls it only when the CPU has both.
 *
 * Matrix products are register-blocked: a tile of R rows x P positions keeps 2*R*P
 * accumulators, and each widened / decoded weight vector is reused across the P
 * positions (and each activation vector across the R rows).  Each output still
 * sees exactly the contract's sequence of operations.
 *
 * MXFP4 decode: per 32-element group an 8-entry table of scaled magnitudes
 * E2M1[0..7] * 2^(s-127) (exact) is built; for 8 elements the 4 packed bytes are
 * broadcast and shifted right by 0,4,...,28 so that lane k holds nibble k in bits
 * 0..3; _mm256_permutevar8x32 looks up bits 0..2 and the sign (bit 3) is moved to
 * bit 31 with a shift by 28 and XORed in.  The shift also moves bits 0..2 to bits
 * 28..30, so the table is stored pre-XORed with m<<28 to cancel them. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#include "kernels.h"
#include "kernels_tile.h"
/* Everything below is compiled for AVX2 + F16C (selected at run time). */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#endif

#define AI static inline __attribute__((always_inline))

/* The contract's tree over lanes lo = 0..7, hi = 8..15. */
AI float hsum16(__m256 lo, __m256 hi)
{
    __m256 v = _mm256_add_ps(lo, hi);                                              /* j += j+8 */
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* j += j+4 */
    __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));                                 /* j += j+2 */
    return _mm_cvtss_f32(_mm_add_ss(b, _mm_shuffle_ps(b, b, 1)));                  /* 0 + 1 */
}

AI __m256 ld_w8(int wt, const void *base, size_t i)
{
    if (wt == WT_F32) return _mm256_loadu_ps((const float *)base + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + i));
    if (wt == WT_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
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
    __m256 acc[MAXR][MAXP][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            if (a->first) {
                acc[r][p][0] = acc[r][p][1] = _mm256_setzero_ps();
            } else {
                acc[r][p][0] = _mm256_loadu_ps(a->acc + r * a->accr + p * 16);
                acc[r][p][1] = _mm256_loadu_ps(a->acc + r * a->accr + p * 16 + 8);
            }
        }
    const size_t pfo = a->pf;
    for (size_t i = a->i0; i < a->i1; i += 16) {
        if (pfo && ((i * wt_size(wt)) & 63) == 0)
            for (int r = 0; r < R; r++) _mm_prefetch(w0 + r * ws + i * wt_size(wt) + pfo, _MM_HINT_T0);
        if (R <= P) { /* hold the weights, stream the positions */
            __m256 wl[MAXR], wh[MAXR];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                wl[r] = ld_w8(wt, w0 + r * ws, i);
                wh[r] = ld_w8(wt, w0 + r * ws, i + 8);
            }
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) {
                __m256 xl = _mm256_loadu_ps(x0 + p * ldx + i), xh = _mm256_loadu_ps(x0 + p * ldx + i + 8);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    acc[r][p][0] = _mm256_add_ps(acc[r][p][0], _mm256_mul_ps(wl[r], xl));
                    acc[r][p][1] = _mm256_add_ps(acc[r][p][1], _mm256_mul_ps(wh[r], xh));
                }
            }
        } else { /* hold the positions, stream the weights */
            __m256 xl[MAXP], xh[MAXP];
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) {
                xl[p] = _mm256_loadu_ps(x0 + p * ldx + i);
                xh[p] = _mm256_loadu_ps(x0 + p * ldx + i + 8);
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256 wl = ld_w8(wt, w0 + r * ws, i), wh = ld_w8(wt, w0 + r * ws, i + 8);
#pragma GCC unroll 4
                for (int p = 0; p < P; p++) {
                    acc[r][p][0] = _mm256_add_ps(acc[r][p][0], _mm256_mul_ps(wl, xl[p]));
                    acc[r][p][1] = _mm256_add_ps(acc[r][p][1], _mm256_mul_ps(wh, xh[p]));
                }
            }
        }
    }
    if (!a->last) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) {
                _mm256_storeu_ps(a->acc + r * a->accr + p * 16, acc[r][p][0]);
                _mm256_storeu_ps(a->acc + r * a->accr + p * 16 + 8, acc[r][p][1]);
            }
        return;
    }
    float *y0 = a->y;
    const size_t ldy = a->ldy, n = a->n, nb = n - n % 16;
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) y0[p * ldy + r] = hsum16(acc[r][p][0], acc[r][p][1]);
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

AI __m256i mx_table(uint8_t s)
{
    const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256i pre = _mm256_setr_epi32(0, 1 << 28, 2 << 28, 3 << 28, 4 << 28, 5 << 28, 6 << 28, 7 << 28);
    __m256 t = _mm256_mul_ps(mag, _mm256_set1_ps(kern_e8m0(s)));
    return _mm256_xor_si256(_mm256_castps_si256(t), pre);
}

/* Elements 8k..8k+7 of a group from the 4 bytes at q. */
AI __m256 mx_decode(__m256i tab, const uint8_t *q)
{
    const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    int32_t word;
    memcpy(&word, q, 4);
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(word), sh);
    __m256i w = _mm256_xor_si256(_mm256_permutevar8x32_epi32(tab, v), _mm256_slli_epi32(v, 28));
    return _mm256_castsi256_ps(w);
}

/* Column range [i0, i1) in multiples of 32; n % 32 == 0 (no tail). */
AI void tile_mx(int R, int P, const tile_args *a)
{
    const uint8_t *q0 = (const uint8_t *)a->w, *s0 = a->s;
    const size_t qs = a->ws, ss = a->ss, ldx = a->ldx;
    const float *x0 = a->x;
    __m256 acc[MAXR][MAXP][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            if (a->first) {
                acc[r][p][0] = acc[r][p][1] = _mm256_setzero_ps();
            } else {
                acc[r][p][0] = _mm256_loadu_ps(a->acc + r * a->accr + p * 16);
                acc[r][p][1] = _mm256_loadu_ps(a->acc + r * a->accr + p * 16 + 8);
            }
        }
    const size_t pfo = a->pf;
    for (size_t g = a->i0 / 32; g < a->i1 / 32; g++) {
        if (pfo && (g & 3) == 0)
            for (int r = 0; r < R; r++) _mm_prefetch((const char *)(q0 + r * qs + 16 * g + pfo), _MM_HINT_T0);
        __m256i tab[MAXR];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) tab[r] = mx_table(s0[r * ss + g]);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            size_t i = 32 * g + 8 * (size_t)k;
            if (R <= P) {
                __m256 w[MAXR];
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) w[r] = mx_decode(tab[r], q0 + r * qs + 16 * g + 4 * k);
#pragma GCC unroll 4
                for (int p = 0; p < P; p++) {
                    __m256 x = _mm256_loadu_ps(x0 + p * ldx + i);
#pragma GCC unroll 4
                    for (int r = 0; r < R; r++)
                        acc[r][p][k & 1] = _mm256_add_ps(acc[r][p][k & 1], _mm256_mul_ps(w[r], x));
                }
            } else {
                __m256 x[MAXP];
#pragma GCC unroll 4
                for (int p = 0; p < P; p++) x[p] = _mm256_loadu_ps(x0 + p * ldx + i);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    __m256 w = mx_decode(tab[r], q0 + r * qs + 16 * g + 4 * k);
#pragma GCC unroll 4
                    for (int p = 0; p < P; p++)
                        acc[r][p][k & 1] = _mm256_add_ps(acc[r][p][k & 1], _mm256_mul_ps(w, x[p]));
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            if (a->last) {
                a->y[p * a->ldy + r] = hsum16(acc[r][p][0], acc[r][p][1]);
            } else {
                _mm256_storeu_ps(a->acc + r * a->accr + p * 16, acc[r][p][0]);
                _mm256_storeu_ps(a->acc + r * a->accr + p * 16 + 8, acc[r][p][1]);
            }
        }
}

/* y[c] = sum_r W[r][c] * x[r-r0], sequential in r for each c; vectorised across c. */
AI void matvec_t_wide(int wt, const char *w0, size_t ws, size_t nr, size_t n, const float *x, float *y)
{
    size_t c = 0;
    for (; c + 64 <= n; c += 64) {
        __m256 acc[8];
#pragma GCC unroll 8
        for (int b = 0; b < 8; b++) acc[b] = _mm256_setzero_ps();
        for (size_t r = 0; r < nr; r++) {
            __m256 xv = _mm256_set1_ps(x[r]);
#pragma GCC unroll 8
            for (int b = 0; b < 8; b++)
                acc[b] = _mm256_add_ps(acc[b], _mm256_mul_ps(ld_w8(wt, w0 + r * ws, c + 8 * (size_t)b), xv));
        }
#pragma GCC unroll 8
        for (int b = 0; b < 8; b++) _mm256_storeu_ps(y + c + 8 * b, acc[b]);
    }
    for (; c + 8 <= n; c += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (size_t r = 0; r < nr; r++)
            acc = _mm256_add_ps(acc, _mm256_mul_ps(ld_w8(wt, w0 + r * ws, c), _mm256_set1_ps(x[r])));
        _mm256_storeu_ps(y + c, acc);
    }
    for (; c < n; c++) {
        float acc = 0.0f;
        for (size_t r = 0; r < nr; r++) acc = acc + ld_w1(wt, w0 + r * ws, c) * x[r];
        y[c] = acc;
    }
}

/* Tile shapes (R rows x P positions); each keeps at most 16 ymm registers live. */
#define TILE_CASES(X) X(1, 1) X(1, 2) X(1, 3) X(1, 4) X(2, 1) X(2, 2) X(4, 1)
/* Blocking: see kernels_blocking.h. */
#define RB_WIDE 1 /* rows per tile for several positions: 2 x R x PB accumulators must fit 16 ymm registers beside the weights */
#define RB_MX 1
#define SFX avx2
#include "kernels_entry.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#else
typedef int kernels_avx2_unused;
#endif
