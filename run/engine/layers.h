/* The blocks of one decoder layer, each over a block of T positions:
 * x is the normalised layer input [T][E], y receives the block's output
 * [T][E].  Weights go through the seam (weights.h) as matrix x matrix over
 * every position of the block; the sequential parts (KDA recurrence and
 * ShortConv, the MLA cache and attention) run per segment on that segment's
 * own state.  Nothing here allocates: buffers come from the run's scratch. */
#ifndef KRUN_LAYERS_H
#define KRUN_LAYERS_H

#include "forward.h"

/* A block as the layers see it: segment k is rows [row0[k], row0[k] + seg[k].n). */
typedef struct k3_block {
    size_t T, nseg;
    const k3_seg *seg;
    size_t row0[K3_MAX_SEQS];
    /* a journaled segment: its first row in the journal, and which of the block's journaled segments it is */
    size_t jrow[K3_MAX_SEQS], jidx[K3_MAX_SEQS];
} k3_block;

/* Kimi Delta Attention (spec §4.5).  A journaled segment's state is left as
 * it was and its inputs recorded (journal.h); kda_commit advances it by the
 * first keep positions of that record (from journal row `row` on). */
void kda_forward(k3_run *r, int L, const k3_block *b, const float *x, float *y);
void kda_commit(k3_run *r, int L, k3_state *st, size_t row, size_t keep);
/* Gated MLA with NoPE (spec §4.6), attending from each segment's latent cache. */
void mla_forward(k3_run *r, int L, const k3_block *b, const float *x, float *y);
/* Dense SiTU-GLU FFN (spec §4.8). */
void dense_ffn_forward(k3_run *r, int L, size_t T, const float *x, float *y);
/* Stable LatentMoE (spec §4.7): each chosen expert is fetched once for the
 * whole block.  Fails only when the store cannot deliver an expert. */
int moe_forward(k3_run *r, int L, size_t T, const float *x, float *y, krun_err *err);
/* One routed expert (W) on the n rows xe [n][latent] of the positions that
 * chose it, its output into xe: what moe_forward does for each expert, and
 * what a rank computing another's experts does (run/cluster). */
void moe_expert_apply(k3_run *r, const k3_expert_w *W, float *xe, size_t n);

/* The router for one position: fills idx[topk] (descending selection score)
 * and weight[topk]; scratch holds 2 * n_experts floats. */
void moe_route(const k3_config *c, const float *logits, const float *bias, float *scratch, int *idx, float *weight);

#endif
