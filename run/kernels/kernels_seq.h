/* Kernels of the sequential parts of the forward pass: the KDA recurrence's
 * two passes over a head's state, and the MLA weighted sums of latents.
 *
 * Unlike the dot products of kernels.h, nothing here is a reduction across
 * SIMD lanes: every output element is its own chain of float operations, in
 * the order docs/NUMERICS.md §4 fixes (a sum over the key index or over
 * positions runs sequentially), and the SIMD paths only compute several
 * independent elements at once (across the value / latent dimension).  Each
 * operation is a rounded product followed by a rounded sum, never an FMA, so
 * the scalar, AVX2, AVX-512 and NEON paths give the same bits
 * (tests/unit/test_kernels_seq.c checks it against an independent reference).
 * The path follows kern_simd_get() (--simd, KRUN_SIMD). */
#ifndef KRUN_KERNELS_SEQ_H
#define KRUN_KERNELS_SEQ_H

#include <stddef.h>

/* One KDA head: S is its D x D state, row i for key index i, column c for
 * value index c.
 *
 * Pass 1, decay then read:  S[i][c] = Sin[i][c] * alpha[i], and
 *   u[c] = sum over i = 0..D-1 of S[i][c] * k[i]   (from +0, in i order).
 * S may be Sin (in place); otherwise Sin is left unchanged (the state is
 * decayed into a copy). */
void kseq_decay_read(float *S, const float *Sin, size_t D, const float *alpha, const float *k, float *u);

/* Pass 2, write then output:  S[i][c] = S[i][c] + k[i] * d[c], and
 *   o[c] = sum over i = 0..D-1 of S[i][c] * q[i]   (from +0, in i order).
 * With o == NULL (q unused) only the state is written. */
void kseq_write_out(float *S, size_t D, const float *k, const float *d, const float *q, float *o);

/* MLA value latents of H heads at once, reading each latent row once:
 *   for p = 0..n-1, for h = 0..H-1:  y[h*ldy + c] = y[h*ldy + c] + w[h*ldw + p] * x[p*ldx + c],  c < m,
 * so every y element accumulates in position order. */
void kseq_wsum(float *y, size_t ldy, const float *w, size_t ldw, size_t H, const float *x, size_t ldx, size_t n, size_t m);

/* The per-level implementations (kernels_seq.c; NEON: kernels_seq_neon.c),
 * called through the above. */
void kseq_decay_read_scalar(float *S, const float *Sin, size_t D, const float *alpha, const float *k, float *u);
void kseq_write_out_scalar(float *S, size_t D, const float *k, const float *d, const float *q, float *o);
void kseq_wsum_scalar(float *y, size_t ldy, const float *w, size_t ldw, size_t H, const float *x, size_t ldx, size_t n, size_t m);
void kseq_decay_read_avx2(float *S, const float *Sin, size_t D, const float *alpha, const float *k, float *u);
void kseq_write_out_avx2(float *S, size_t D, const float *k, const float *d, const float *q, float *o);
void kseq_wsum_avx2(float *y, size_t ldy, const float *w, size_t ldw, size_t H, const float *x, size_t ldx, size_t n, size_t m);
void kseq_decay_read_avx512(float *S, const float *Sin, size_t D, const float *alpha, const float *k, float *u);
void kseq_write_out_avx512(float *S, size_t D, const float *k, const float *d, const float *q, float *o);
void kseq_wsum_avx512(float *y, size_t ldy, const float *w, size_t ldw, size_t H, const float *x, size_t ldx, size_t n, size_t m);
void kseq_decay_read_neon(float *S, const float *Sin, size_t D, const float *alpha, const float *k, float *u);
void kseq_write_out_neon(float *S, size_t D, const float *k, const float *d, const float *q, float *o);
void kseq_wsum_neon(float *y, size_t ldy, const float *w, size_t ldw, size_t H, const float *x, size_t ldx, size_t n, size_t m);

#endif
