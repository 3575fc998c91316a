/* The SIMD bodies of kernels_seq.c, written once for both vector widths.
 * Not a header of declarations: kernels_seq.c includes it once per
 * instruction set, after defining
 *   V, VW (floats per vector), VLOAD, VSTORE, VADD, VMUL, VSET1, VZERO,
 *   SFX (the function name suffix, avx2 / avx512),
 *   KSEQ_WSUM_NB (vectors of columns per weighted-sum tile: 4 x that many
 *   accumulators must fit the register file),
 * inside that instruction set's target region.  Every element is computed
 * exactly as in the scalar functions: VMUL then VADD (never fused: the file
 * is compiled with -ffp-contract=off and these targets are entered with the
 * contract pinned off), and elements left over after the last whole vector
 * take the scalar statements.  It undefines those parameters at its end.
 * VMADD(acc, a, b), acc + a * b, is VADD(acc, VMUL(a, b)) unless the
 * instantiation defines it (only the test-only fused NEON build does). */
#ifndef VMADD
#define VMADD(acc, a, b) VADD(acc, VMUL(a, b))
#endif

#define KSEQ_NB 8 /* vectors of independent columns kept in registers */
/* Columns [c, cols) in blocks of 8, then 4, 2, 1 vectors: each call has a
 * constant block (NB), so its accumulators stay in registers, and a row of
 * a few vectors is still one pass, not one per vector. */
#define KSEQ_BLOCKS(cols, call)                                                   \
    do {                                                                          \
        for (; c + 8 * VW <= (cols); c += 8 * VW) { enum { NB = 8 }; call; }      \
        if (c + 4 * VW <= (cols)) { enum { NB = 4 }; call; c += 4 * VW; }          \
        if (c + 2 * VW <= (cols)) { enum { NB = 2 }; call; c += 2 * VW; }          \
        if (c + VW <= (cols)) { enum { NB = 1 }; call; c += VW; }                  \
    } while (0)
#define KSEQ_CAT2(a, b) a##_##b
#define KSEQ_CAT(a, b) KSEQ_CAT2(a, b)

static inline __attribute__((always_inline)) void KSEQ_CAT(decay_read_cols, SFX)(float *S, const float *Sin, size_t D,
                                                                                const float *alpha, const float *k,
                                                                                float *u, size_t c, int nb)
{
    V acc[KSEQ_NB];
    #pragma GCC unroll 8
    for (int b = 0; b < nb; b++) acc[b] = VZERO();
    for (size_t i = 0; i < D; i++) {
        const V a = VSET1(alpha[i]), kk = VSET1(k[i]);
        const float *src = Sin + i * D + c;
        float *dst = S + i * D + c;
        #pragma GCC unroll 8
        for (int b = 0; b < nb; b++) {
            V s = VMUL(VLOAD(src + b * VW), a);
            VSTORE(dst + b * VW, s);
            acc[b] = VMADD(acc[b], s, kk);
        }
    }
    #pragma GCC unroll 8
    for (int b = 0; b < nb; b++) VSTORE(u + c + b * VW, acc[b]);
}

void KSEQ_CAT(kseq_decay_read, SFX)(float *S, const float *Sin, size_t D, const float *alpha, const float *k, float *u)
{
    size_t c = 0;
    KSEQ_BLOCKS(D, KSEQ_CAT(decay_read_cols, SFX)(S, Sin, D, alpha, k, u, c, NB));
    for (; c < D; c++) {
        float acc = 0.0f;
        for (size_t i = 0; i < D; i++) {
            S[i * D + c] = Sin[i * D + c] * alpha[i];
            acc = acc + S[i * D + c] * k[i];
        }
        u[c] = acc;
    }
}

static inline __attribute__((always_inline)) void KSEQ_CAT(write_out_cols, SFX)(float *S, size_t D, const float *k,
                                                                               const float *d, const float *q, float *o,
                                                                               size_t c, int nb, int out)
{
    V acc[KSEQ_NB];
    #pragma GCC unroll 8
    for (int b = 0; b < nb; b++) acc[b] = VZERO();
    for (size_t i = 0; i < D; i++) {
        const V kk = VSET1(k[i]);
        float *row = S + i * D + c;
        if (out) {
            const V qq = VSET1(q[i]);
            #pragma GCC unroll 8
            for (int b = 0; b < nb; b++) {
                V s = VMADD(VLOAD(row + b * VW), kk, VLOAD(d + c + b * VW));
                VSTORE(row + b * VW, s);
                acc[b] = VMADD(acc[b], s, qq);
            }
        } else {
            #pragma GCC unroll 8
            for (int b = 0; b < nb; b++) VSTORE(row + b * VW, VMADD(VLOAD(row + b * VW), kk, VLOAD(d + c + b * VW)));
        }
    }
    if (out)
        #pragma GCC unroll 8
        for (int b = 0; b < nb; b++) VSTORE(o + c + b * VW, acc[b]);
}

void KSEQ_CAT(kseq_write_out, SFX)(float *S, size_t D, const float *k, const float *d, const float *q, float *o)
{
    const int out = o != NULL;
    size_t c = 0;
    if (out) KSEQ_BLOCKS(D, KSEQ_CAT(write_out_cols, SFX)(S, D, k, d, q, o, c, NB, 1));
    else KSEQ_BLOCKS(D, KSEQ_CAT(write_out_cols, SFX)(S, D, k, d, q, o, c, NB, 0));
    for (; c < D; c++) {
        float acc = 0.0f;
        for (size_t i = 0; i < D; i++) {
            S[i * D + c] = S[i * D + c] + k[i] * d[c];
            if (out) acc = acc + S[i * D + c] * q[i];
        }
        if (out) o[c] = acc;
    }
}

/* A tile of the weighted sums: hb heads x nb vectors of columns kept in
 * registers while the positions [p0, p1) go past, so each y element is
 * loaded and stored once per tile, and each latent row slice is loaded once
 * for hb heads. */
static inline __attribute__((always_inline)) void KSEQ_CAT(wsum_tile, SFX)(float *y, size_t ldy, const float *w, size_t ldw,
                                                                          const float *x, size_t ldx, size_t p0, size_t p1,
                                                                          size_t c, size_t h0, int hb, int nb)
{
    V acc[4][4];
    #pragma GCC unroll 4
    for (int hh = 0; hh < hb; hh++)
        #pragma GCC unroll 8
        for (int b = 0; b < nb; b++) acc[hh][b] = VLOAD(y + (h0 + (size_t)hh) * ldy + c + b * VW);
    for (size_t p = p0; p < p1; p++) {
        V xv[4];
        #pragma GCC unroll 8
        for (int b = 0; b < nb; b++) xv[b] = VLOAD(x + p * ldx + c + b * VW);
        #pragma GCC unroll 4
        for (int hh = 0; hh < hb; hh++) {
            const V wv = VSET1(w[(h0 + (size_t)hh) * ldw + p]);
            #pragma GCC unroll 8
            for (int b = 0; b < nb; b++) acc[hh][b] = VMADD(acc[hh][b], wv, xv[b]);
        }
    }
    #pragma GCC unroll 4
    for (int hh = 0; hh < hb; hh++)
        #pragma GCC unroll 8
        for (int b = 0; b < nb; b++) VSTORE(y + (h0 + (size_t)hh) * ldy + c + b * VW, acc[hh][b]);
}

#define KSEQ_WSUM_POS 64 /* positions per tile: their column slice stays in L1 while the heads go past */

static inline __attribute__((always_inline)) void KSEQ_CAT(wsum_cols, SFX)(float *y, size_t ldy, const float *w, size_t ldw,
                                                                          size_t H, const float *x, size_t ldx, size_t n,
                                                                          size_t c, int nb)
{
    for (size_t p0 = 0; p0 < n; p0 += KSEQ_WSUM_POS) {
        const size_t p1 = n - p0 < KSEQ_WSUM_POS ? n : p0 + KSEQ_WSUM_POS;
        size_t h = 0;
        for (; h + 4 <= H; h += 4) KSEQ_CAT(wsum_tile, SFX)(y, ldy, w, ldw, x, ldx, p0, p1, c, h, 4, nb);
        for (; h < H; h++) KSEQ_CAT(wsum_tile, SFX)(y, ldy, w, ldw, x, ldx, p0, p1, c, h, 1, nb);
    }
}

void KSEQ_CAT(kseq_wsum, SFX)(float *y, size_t ldy, const float *w, size_t ldw, size_t H, const float *x, size_t ldx, size_t n,
                              size_t m)
{
    size_t c = 0;
#if KSEQ_WSUM_NB >= 4
    for (; c + 4 * VW <= m; c += 4 * VW) KSEQ_CAT(wsum_cols, SFX)(y, ldy, w, ldw, H, x, ldx, n, c, 4);
#endif
    for (; c + 2 * VW <= m; c += 2 * VW) KSEQ_CAT(wsum_cols, SFX)(y, ldy, w, ldw, H, x, ldx, n, c, 2);
    for (; c + VW <= m; c += VW) KSEQ_CAT(wsum_cols, SFX)(y, ldy, w, ldw, H, x, ldx, n, c, 1);
    if (c < m)
        for (size_t p = 0; p < n; p++)
            for (size_t h = 0; h < H; h++)
                for (size_t j = c; j < m; j++) y[h * ldy + j] = y[h * ldy + j] + w[h * ldw + p] * x[p * ldx + j];
}

#undef KSEQ_WSUM_POS
#undef KSEQ_NB
#undef KSEQ_BLOCKS
#undef KSEQ_CAT
#undef KSEQ_CAT2
#undef V
#undef VW
#undef VLOAD
#undef VSTORE
#undef VADD
#undef VMUL
#undef VMADD
#undef VSET1
#undef VZERO
#undef SFX
#undef KSEQ_WSUM_NB
