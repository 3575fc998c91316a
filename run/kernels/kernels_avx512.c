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

enum { WT_F32 = 0, WT_BF16 = 1, WT_F16 = 2 };

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

#define MAXR 4
#define MAXP 4
#define MX_PREFETCH 8192 /* see the blocking notes above kmatmul_rows_avx512 */

/* One pass of a tile of R rows x P positions over columns [i0, i1); see
 * kernels_avx2.c for the protocol (the saved accumulators use the same layout). */
typedef struct {
    const char *w;
    size_t ws;
    const uint8_t *s;
    size_t ss;
    const float *x;
    size_t ldx;
    size_t i0, i1, n;
    float *acc;
    size_t accr;
    int first, last;
    size_t pf;
    float *y;
    size_t ldy;
} tile_args;

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

/* ---------------------------------------------------------------- entry points */

static inline tile_args one_row(const void *w, const uint8_t *s, const float *x, size_t n, size_t nb, float *y)
{
    tile_args a = {(const char *)w, 0, s, 0, x, 0, 0, nb, n, NULL, 0, 1, 1, s ? MX_PREFETCH : 0, y, 0};
    return a;
}

float kdot_f32_avx512(const float *w, const float *x, size_t n)
{
    float y;
    tile_args a = one_row(w, NULL, x, n, n - n % 16, &y);
    tile_wide(WT_F32, 1, 1, &a);
    return y;
}

float kdot_bf16_avx512(const uint16_t *w, const float *x, size_t n)
{
    float y;
    tile_args a = one_row(w, NULL, x, n, n - n % 16, &y);
    tile_wide(WT_BF16, 1, 1, &a);
    return y;
}

float kdot_f16_avx512(const uint16_t *w, const float *x, size_t n)
{
    float y;
    tile_args a = one_row(w, NULL, x, n, n - n % 16, &y);
    tile_wide(WT_F16, 1, 1, &a);
    return y;
}

float kdot_mxfp4_avx512(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n)
{
    if (n % 32) return kdot_mxfp4_scalar(packed, scales, x, n);
    float y;
    tile_args a = one_row(packed, scales, x, n, n, &y);
    tile_mx(1, 1, &a);
    return y;
}

/* Tile shapes used by the driver below: (RB, 1..PB), (1, 1..PB) and (RB1_MX, 1). */
#define TILE_CASES(X) X(1, 1) X(1, 2) X(1, 3) X(1, 4) X(2, 1) X(2, 2) X(2, 3) X(2, 4) \
                      X(4, 1) X(4, 2) X(4, 3) X(4, 4)

typedef void (*tile_fn)(const tile_args *);

#define WIDE_FN(wt, R, P) \
    static void tile_##wt##_##R##_##P(const tile_args *a) { tile_wide(wt, R, P, a); }
#define WIDE_F32(R, P) WIDE_FN(WT_F32, R, P)
#define WIDE_BF16(R, P) WIDE_FN(WT_BF16, R, P)
#define WIDE_F16(R, P) WIDE_FN(WT_F16, R, P)
TILE_CASES(WIDE_F32)
TILE_CASES(WIDE_BF16)
TILE_CASES(WIDE_F16)
#define MX_FN(R, P) \
    static void tile_mx_##R##_##P(const tile_args *a) { tile_mx(R, P, a); }
TILE_CASES(MX_FN)

static tile_fn pick_tile(int wt, int R, int P)
{
#define PICK(wtv, R_, P_) \
    if (wt == wtv && R == R_ && P == P_) return tile_##wtv##_##R_##_##P_;
#define PICK_F32(R_, P_) PICK(WT_F32, R_, P_)
#define PICK_BF16(R_, P_) PICK(WT_BF16, R_, P_)
#define PICK_F16(R_, P_) PICK(WT_F16, R_, P_)
#define PICK_MX(R_, P_) \
    if (wt == 3 && R == R_ && P == P_) return tile_mx_##R_##_##P_;
    TILE_CASES(PICK_F32)
    TILE_CASES(PICK_BF16)
    TILE_CASES(PICK_F16)
    TILE_CASES(PICK_MX)
    return NULL;
}

/* Blocking: see kernels_blocking.h; 32 registers allow
 * 4-row x 4-position tiles for several positions (2 x 4 for MXFP4,
 * whose decoded pairs take more registers). */
#define RB_WIDE 4
#define RB_MX 2
#include "kernels_blocking.h"

void kmatmul_rows_avx512(const kmat *W, size_t r0, size_t r1, const float *X, size_t ldx, size_t T,
                         float *Y, size_t ldy)
{
    kmatmul_rows_blocked(W, r0, r1, X, ldx, T, Y, ldy);
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

static void matvec_t_f32(const char *w0, size_t ws, size_t nr, size_t n, const float *x, float *y)
{
    matvec_t_wide(WT_F32, w0, ws, nr, n, x, y);
}
static void matvec_t_bf16(const char *w0, size_t ws, size_t nr, size_t n, const float *x, float *y)
{
    matvec_t_wide(WT_BF16, w0, ws, nr, n, x, y);
}
static void matvec_t_f16(const char *w0, size_t ws, size_t nr, size_t n, const float *x, float *y)
{
    matvec_t_wide(WT_F16, w0, ws, nr, n, x, y);
}

void kmatvec_t_avx512(const kmat *W, size_t r0, size_t r1, const float *x, float *y)
{
    size_t n = W->cols, nr = r1 > r0 ? r1 - r0 : 0;
    switch (W->type) {
    case KD_F32: matvec_t_f32((const char *)W->data + r0 * n * 4, n * 4, nr, n, x, y); return;
    case KD_BF16: matvec_t_bf16((const char *)W->data + r0 * n * 2, n * 2, nr, n, x, y); return;
    case KD_F16: matvec_t_f16((const char *)W->data + r0 * n * 2, n * 2, nr, n, x, y); return;
    case KD_MXFP4: break;
    }
    kmatvec_t_scalar(W, r0, r1, x, y);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#else
typedef int kernels_avx512_unused;
#endif
