/* The broken variants of the forward pass that do not fit in one line
 * (ablate.h): each replaces one step at an ablation point of kda.c, mla.c,
 * moe.c or ops.c.  Only the test build (-DKRUN_ABLATIONS) contains them
 * (ablate_variants.c). */
#ifndef KRUN_ABLATE_VARIANTS_H
#define KRUN_ABLATE_VARIANTS_H

#include "run/kernels/kernels.h"

#include <stddef.h>

struct kpool;
struct k3_weights;

/* KDA_READ_BEFORE_DECAY, KDA_OUTPUT_PRE_WRITE: the recurrence step of kda.c with the read or the output
 * moved (in place: Sin == S) */
void abl_kda_step(float *S, const float *Sin, const float *q, const float *k, const float *v, const float *alpha,
                  float beta, float *o, size_t D, float *u, float *d);
/* KDA_GATE_BEFORE_NORM */
void abl_kda_gate_before_norm(float *oh, const float *gh, const float *o_norm, size_t D, double eps);
/* MLA_NORM_ROPE: the rope key normalised with the latent */
void abl_mla_norm_rope(float *dst, const float *src, const float *kva_ln, size_t Rkv, size_t row, double eps);
/* MLA_GATE_FROM_LATENT: the gate projection fed the latent query */
void abl_mla_gate_from_latent(struct kpool *pool, const struct k3_weights *w, int L, const float *cq, size_t Rq, size_t E,
                              size_t T, float *gate, size_t ldg);
/* MXFP4_NIBBLE_SWAP, MXFP4_SCALE_BIAS_126: an expert matrix decoded wrongly */
void abl_expert_matmul(const kmat *W, const float *X, size_t ldx, size_t n, float *Y, size_t ldy);
/* ATTNRES_NORMALISED_VALUES: the weighted sum of normalised sources */
void abl_attnres_values(float *out, const float *const *v, const float *s, size_t n, size_t E, double eps);

#endif
