/* The activations of one forward block, laid out once (arena.h).
 *
 * Every buffer the forward pass uses is named here with its size, in one
 * function: the planner counts exactly what the allocator hands out, and
 * nothing is allocated per token.  A block holds up to T positions from up to
 * S segments (sessions); the MLA score rows need the context length.
 * Attention, the dense FFN and the MoE run one after another inside a layer,
 * so their buffers share one region (its size is the largest of the four). */
#ifndef KRUN_SCRATCH_H
#define KRUN_SCRATCH_H

#include "format/k3_config.h"
#include "run/model/model.h"
#include "run/util/arena.h"

#include <stddef.h>
#include <stdint.h>

#define K3_EXPERT_BATCH 256        /* experts of one layer held at once, at most */

typedef struct k3_kda_scratch {
    float *q, *k, *v, *g, *z, *o;  /* [T][P]; z holds alpha after step 4 */
    float *beta;                   /* [T][Hk] */
    float *fa;                     /* [T][D] */
    float *tmp;                    /* [Kc - 1 + T]: one channel's conv inputs */
} k3_kda_scratch;

typedef struct k3_mla_scratch {
    float *cq;                     /* [T][Rq] */
    float *qfull;                  /* [T][H (dn + dr)] */
    float *kv;                     /* [T][Rkv + dr] */
    float *gate, *out;             /* [T][H dv] */
    /* attention of one position, every head at once (mla.c) */
    float *qt;                     /* [H][Rkv] absorbed queries q~ */
    float *qr;                     /* [H][dr] rope queries, gathered */
    float *sc;                     /* [H][ctx] scores, then probabilities */
    float *olat;                   /* [H][olat_ld] value latents */
    float *oh;                     /* [H][dv] head outputs */
    float *part;                   /* [K3_MLA_ITEMS][2][K3_MLA_PB][H] scores of a few positions, as a product gives them */
    size_t ctx;                    /* the row stride of sc */
    size_t olat_ld;                /* Rkv + 16: a row stride that is not a multiple of 4 KB, so the heads'
                                      rows of a column block do not all fall into the same cache sets */
} k3_mla_scratch;

#define K3_MLA_ITEMS 16            /* parallel work items of the score pass (more threads than this idle there) */
#define K3_MLA_PB 16               /* cache positions per score product */

typedef struct k3_moe_scratch {
    float *logits;                 /* [T][Ne] router logits */
    float *route;                  /* [2 Ne] one position's scores */
    int *idx;                      /* [T][k] chosen experts */
    float *wts;                    /* [T][k] their weights */
    float *zeta;                   /* [T][Lt] */
    float *slots;                  /* [T][k][Lt] expert outputs per (position, choice) */
    float *agg;                    /* [T][Lt] */
    float *xe;                     /* [T][Lt] rows of the positions that chose one expert */
    float *a1, *a3;                /* [T][I] */
    int *rows;                     /* [T k] */
    int *distinct;                 /* [Ne] experts chosen in the block, in id order */
    uint8_t *used;                 /* [Ne] */
    k3_expert_w *bound;            /* [K3_EXPERT_BATCH] */
    uint32_t *extent;              /* [K3_EXPERT_BATCH] */
    float *sg, *su;                /* [T][Is] shared expert */
    float *sh;                     /* [T][E] */
} k3_moe_scratch;

typedef struct k3_dense_scratch {
    float *g, *u;                  /* [T][Id] */
} k3_dense_scratch;

typedef struct k3_scratch {
    size_t T, S, ctx;              /* capacity: positions, segments, context */
    size_t max_src;                /* AttnRes sources: block snapshots + the prefix */
    int32_t *ids;                  /* [T] the block's tokens */
    float *snap;                   /* [T][max_src][E] AttnRes block snapshots */
    float *P, *a, *xn, *y;         /* [T][E] */
    const float **src;             /* [max_src + 1] */
    uint8_t *embed_row;            /* [E * 4] one embedding row as stored */
    float *xg;                     /* [S][E] rows whose logits are wanted, gathered */
    float *lg;                     /* [S][V] their logits */
    float *taps;                   /* [T][taps]: what the run's tap hook keeps of each position (forward.h), or NULL */
    size_t tap_floats;             /* per position */
    k3_kda_scratch kda;
    k3_mla_scratch mla;
    k3_moe_scratch moe;
    k3_dense_scratch dense;
} k3_scratch;

/* taps: floats per position the run's tap hook keeps (0: no hook). */
void k3_scratch_carve(k3_scratch *s, const k3_config *c, size_t T, size_t S, size_t ctx, size_t taps, karena *a);

#endif
