/* The blocks of one decoder layer, each over a block of T positions:
 * x is the normalised layer input [T][E], y receives the block's output
 * [T][E].  Weights are applied as matrix x matrix; sequential state (KDA,
 * ShortConv, the MLA cache) is advanced position by position inside. */
#ifndef KRUN_LAYERS_H
#define KRUN_LAYERS_H

#include "model.h"
#include "state.h"
#include "threadpool.h"

/* Kimi Delta Attention (spec §4.5).  S: [Hk][D][D]; conv: [3][Kc-1][P]. */
int kda_forward(const k3_config *c, const k3_layer_w *w, kpool *pool, const float *x, size_t T, float *y,
                float *S, float *conv);

/* Gated MLA with NoPE (spec §4.6), attending from the compressed latent
 * cache.  cache: [ctx][kv_lora + qk_rope]; positions pos0..pos0+T-1 are
 * written, 0..pos0+T-1 are attended. */
int mla_forward(const k3_config *c, const k3_layer_w *w, kpool *pool, const float *x, size_t T, float *y,
                float *cache, size_t pos0);

/* Dense SiTU-GLU FFN (spec §4.8). */
int dense_ffn_forward(const k3_config *c, const k3_layer_w *w, kpool *pool, const float *x, size_t T, float *y);

/* How the MoE obtains routed experts: fetch returns bound experts for n
 * expert ids (at most batch_max at a time), release gives them back. */
typedef struct k3_expert_source {
    void *ctx;
    size_t batch_max;
    int (*fetch)(void *ctx, int layer, const int *experts, size_t n, k3_expert_w *out, char *err, size_t errlen);
    void (*release)(void *ctx, int layer, const int *experts, size_t n);
} k3_expert_source;

/* Stable LatentMoE (spec §4.7).  routed: optional [T][topk] chosen experts out. */
int moe_forward(const k3_config *c, const k3_layer_w *w, kpool *pool, const k3_expert_source *src, const float *x,
                size_t T, float *y, int *routed, char *err, size_t errlen);

/* The router alone, for one position: fills idx[topk] (descending selection
 * score) and weight[topk].  Exposed for unit tests. */
void moe_route(const k3_config *c, const float *logits, const float *bias, int *idx, float *weight);

#endif
