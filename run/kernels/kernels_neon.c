/* NEON kernels (aarch64), bit-identical to the scalar reference in kernels.c.
 *
 * The 16 contract lanes are four float32x4_t accumulators: lanes 0-3, 4-7,
 * 8-11 and 12-15.  Every update is vmulq_f32 then vaddq_f32 (madd below):
 * never vfmaq_f32, and never vmlaq_f32, which clang's arm_neon.h defines as
 * the C expression a + b * c, so clang 14 fuses it into fmla at its default
 * -ffp-contract=on (gcc 12 keeps it apart; docs/NUMERICS.md §1.1 has what
 * each compiler does).  This file is compiled with -ffp-contract=off and pins
 * it off again below, whatever the command line says; `make test-arm64`
 * checks the disassembly of every aarch64 object for fused instructions.
 * hsum16 is exactly the contract's reduction tree (not vaddvq_f32, whose
 * pairwise order is another tree).
 *
 * NEON (Advanced SIMD) is part of the aarch64 base architecture; the
 * dispatcher still checks HWCAP_ASIMD.  Widening: BF16 by a 16-bit shift
 * (exact); F16 with vcvt_f32_f16 (FCVTL), which is exact for every code,
 * subnormals included, and quiets a signalling NaN by setting the same bit
 * kern_f16 sets (tests/unit/test_platform.c checks all 65536 codes).
 *
 * Matrix products are register-blocked as in kernels_avx2.c: a tile of R rows
 * x P positions keeps 4*R*P accumulators (kernels_tile.h's protocol); the
 * entry points and the blocking driver are kernels_entry.h and
 * kernels_blocking.h.
 *
 * MXFP4 decode: per 32-element group the 16 values E2M1[c] * 2^(s-127)
 * (exact; the same products the scalar path forms) are one 64-byte table in
 * four registers; the 16 packed bytes are split into nibbles and zipped into
 * element order, and for 4 elements each code c becomes the byte indices
 * 4c..4c+3 of its float, looked up with one vqtbl4q_u8. */
#if defined(__aarch64__)
#include <arm_neon.h>

#include "kernels.h"
#include "kernels_tile.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off")
#endif

#define AI static inline __attribute__((always_inline))

/* acc + w * x, a rounded product then a rounded sum.  KERN_NEON_FMA_TRAP is a
 * test-only build (`make test-arm64`) that fuses it, to show that the
 * scalar-vs-NEON tests catch a fused kernel; no other build defines it. */
AI float32x4_t madd(float32x4_t acc, float32x4_t w, float32x4_t x)
{
#ifdef KERN_NEON_FMA_TRAP
    return vfmaq_f32(acc, w, x);
#else
    return vaddq_f32(acc, vmulq_f32(w, x));
#endif
}

/* The contract's tree over lanes 0-3, 4-7, 8-11, 12-15. */
AI float hsum16(float32x4_t a0, float32x4_t a1, float32x4_t a2, float32x4_t a3)
{
    float32x4_t b0 = vaddq_f32(a0, a2), b1 = vaddq_f32(a1, a3);   /* j += j+8 */
    float32x4_t c = vaddq_f32(b0, b1);                             /* j += j+4 */
    float32x2_t d = vadd_f32(vget_low_f32(c), vget_high_f32(c));   /* j += j+2 */
    return vget_lane_f32(d, 0) + vget_lane_f32(d, 1);              /* 0 + 1 */
}

/* Elements i..i+3 of a wide row, widened exactly. */
AI float32x4_t ld_w4(int wt, const void *base, size_t i)
{
    if (wt == WT_F32) return vld1q_f32((const float *)base + i);
    uint16x4_t h = vld1_u16((const uint16_t *)base + i);
    if (wt == WT_BF16) return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

AI float ld_w1(int wt, const void *base, size_t i)
{
    if (wt == WT_F32) return ((const float *)base)[i];
    if (wt == WT_BF16) return kern_bf16(((const uint16_t *)base)[i]);
    return kern_f16(((const uint16_t *)base)[i]);
}

AI size_t wt_size(int wt) { return wt == WT_F32 ? 4 : 2; }

#define MX_PREFETCH 8192 /* as kernels_avx2.c; unmeasured on ARM */

AI void acc_load(float32x4_t *acc, const tile_args *a, int r, int p)
{
    for (int q = 0; q < 4; q++)
        acc[q] = a->first ? vdupq_n_f32(0.0f) : vld1q_f32(a->acc + r * a->accr + p * 16 + 4 * q);
}

AI void acc_park(const float32x4_t *acc, const tile_args *a, int r, int p)
{
    for (int q = 0; q < 4; q++) vst1q_f32(a->acc + r * a->accr + p * 16 + 4 * q, acc[q]);
}

AI void tile_wide(int wt, int R, int P, const tile_args *a)
{
    const char *w0 = a->w;
    const size_t ws = a->ws, ldx = a->ldx;
    const float *x0 = a->x;
    float32x4_t acc[MAXR][MAXP][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) acc_load(acc[r][p], a, r, p);
    const size_t pfo = a->pf;
    for (size_t i = a->i0; i < a->i1; i += 16) {
        if (pfo && ((i * wt_size(wt)) & 63) == 0)
            for (int r = 0; r < R; r++) __builtin_prefetch(w0 + r * ws + i * wt_size(wt) + pfo, 0, 3);
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            float32x4_t w[MAXR], x[MAXP];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) w[r] = ld_w4(wt, w0 + r * ws, i + 4 * (size_t)q);
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) x[p] = vld1q_f32(x0 + p * ldx + i + 4 * (size_t)q);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
#pragma GCC unroll 4
                for (int p = 0; p < P; p++) acc[r][p][q] = madd(acc[r][p][q], w[r], x[p]);
        }
    }
    if (!a->last) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) acc_park(acc[r][p], a, r, p);
        return;
    }
    float *y0 = a->y;
    const size_t ldy = a->ldy, n = a->n, nb = n - n % 16;
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int p = 0; p < P; p++)
            y0[p * ldy + r] = hsum16(acc[r][p][0], acc[r][p][1], acc[r][p][2], acc[r][p][3]);
    /* the tail, in order, after the tree */
    if (nb < n)
        for (int r = 0; r < R; r++)
            for (int p = 0; p < P; p++) {
                float s = y0[p * ldy + r];
                for (size_t i = nb; i < n; i++) s = s + ld_w1(wt, w0 + r * ws, i) * x0[p * ldx + i];
                y0[p * ldy + r] = s;
            }
}

/* ---------------------------------------------------------------- MXFP4 */

/* The 16 values of a group with scale byte s, as bytes: float c is bytes 4c..4c+3. */
AI uint8x16x4_t mx_table(uint8_t s)
{
    const float32x4_t sc = vdupq_n_f32(kern_e8m0(s));
    uint8x16x4_t t;
    t.val[0] = vreinterpretq_u8_f32(vmulq_f32(vld1q_f32(KE2M1 + 0), sc));
    t.val[1] = vreinterpretq_u8_f32(vmulq_f32(vld1q_f32(KE2M1 + 4), sc));
    t.val[2] = vreinterpretq_u8_f32(vmulq_f32(vld1q_f32(KE2M1 + 8), sc));
    t.val[3] = vreinterpretq_u8_f32(vmulq_f32(vld1q_f32(KE2M1 + 12), sc));
    return t;
}

/* The 32 codes of a group in element order: code[0] holds elements 0..15,
 * code[1] elements 16..31 (byte j: element 2j low nibble, 2j+1 high). */
AI void mx_codes(const uint8_t *q, uint8x16_t code[2])
{
    uint8x16_t b = vld1q_u8(q);
    uint8x16_t lo = vandq_u8(b, vdupq_n_u8(15)), hi = vshrq_n_u8(b, 4);
    code[0] = vzip1q_u8(lo, hi);
    code[1] = vzip2q_u8(lo, hi);
}

/* Elements 4v..4v+3 of a group (v = 0..7). */
AI float32x4_t mx_decode(uint8x16x4_t tab, const uint8x16_t code[2], int v)
{
    static const uint8_t rep[4][16] = {
        {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3},
        {4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7},
        {8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11},
        {12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15},
    };
    static const uint8_t byte[16] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
    uint8x16_t c = vqtbl1q_u8(code[v >> 2], vld1q_u8(rep[v & 3]));
    uint8x16_t idx = vorrq_u8(vshlq_n_u8(c, 2), vld1q_u8(byte));
    return vreinterpretq_f32_u8(vqtbl4q_u8(tab, idx));
}

/* Column range [i0, i1) in multiples of 32; n % 32 == 0 (no tail). */
AI void tile_mx(int R, int P, const tile_args *a)
{
    const uint8_t *q0 = (const uint8_t *)a->w, *s0 = a->s;
    const size_t qs = a->ws, ss = a->ss, ldx = a->ldx;
    const float *x0 = a->x;
    float32x4_t acc[MAXR][MAXP][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) acc_load(acc[r][p], a, r, p);
    const size_t pfo = a->pf;
    for (size_t g = a->i0 / 32; g < a->i1 / 32; g++) {
        if (pfo && (g & 3) == 0)
            for (int r = 0; r < R; r++) __builtin_prefetch(q0 + r * qs + 16 * g + pfo, 0, 3);
        uint8x16x4_t tab[MAXR];
        uint8x16_t code[MAXR][2];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            tab[r] = mx_table(s0[r * ss + g]);
            mx_codes(q0 + r * qs + 16 * g, code[r]);
        }
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) {
            const size_t i = 32 * g + 4 * (size_t)v;
            float32x4_t w[MAXR], x[MAXP];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) w[r] = mx_decode(tab[r], code[r], v);
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) x[p] = vld1q_f32(x0 + p * ldx + i);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
#pragma GCC unroll 4
                for (int p = 0; p < P; p++) acc[r][p][v & 3] = madd(acc[r][p][v & 3], w[r], x[p]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            if (a->last) a->y[p * a->ldy + r] = hsum16(acc[r][p][0], acc[r][p][1], acc[r][p][2], acc[r][p][3]);
            else acc_park(acc[r][p], a, r, p);
        }
}

/* y[c] = sum_r W[r][c] * x[r-r0], sequential in r for each c; vectorised across c. */
AI void matvec_t_wide(int wt, const char *w0, size_t ws, size_t nr, size_t n, const float *x, float *y)
{
    size_t c = 0;
    for (; c + 32 <= n; c += 32) {
        float32x4_t acc[8];
#pragma GCC unroll 8
        for (int b = 0; b < 8; b++) acc[b] = vdupq_n_f32(0.0f);
        for (size_t r = 0; r < nr; r++) {
            float32x4_t xv = vdupq_n_f32(x[r]);
#pragma GCC unroll 8
            for (int b = 0; b < 8; b++) acc[b] = madd(acc[b], ld_w4(wt, w0 + r * ws, c + 4 * (size_t)b), xv);
        }
#pragma GCC unroll 8
        for (int b = 0; b < 8; b++) vst1q_f32(y + c + 4 * b, acc[b]);
    }
    for (; c + 4 <= n; c += 4) {
        float32x4_t acc = vdupq_n_f32(0.0f);
        for (size_t r = 0; r < nr; r++) acc = madd(acc, ld_w4(wt, w0 + r * ws, c), vdupq_n_f32(x[r]));
        vst1q_f32(y + c, acc);
    }
    for (; c < n; c++) {
        float acc = 0.0f;
        for (size_t r = 0; r < nr; r++) acc = acc + ld_w1(wt, w0 + r * ws, c) * x[r];
        y[c] = acc;
    }
}

/* Tile shapes (R rows x P positions): at most 16 accumulators of the 32
 * registers, beside the weights and activations. */
#define TILE_CASES(X) X(1, 1) X(1, 2) X(1, 3) X(1, 4) X(2, 1) X(2, 2) X(4, 1)
/* Blocking: see kernels_blocking.h (its figures were measured on x86). */
#define RB_WIDE 1
#define RB_MX 1
#define SFX neon
#include "kernels_entry.h"
#else
typedef int kernels_neon_unused;
#endif
