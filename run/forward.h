/* The whole K3 forward pass over one block of new positions, which may come
 * from several sequences (segments): everything position-wise runs over the
 * whole block, everything sequential runs per segment on its own state. */
#ifndef KRUN_FORWARD_H
#define KRUN_FORWARD_H

#include "krun_err.h"
#include "model.h"
#include "scratch.h"
#include "state.h"
#include "store.h"
#include "threadpool.h"
#include "weights.h"

#define K3_MAX_SEQS 256            /* sequences in one forward block, at most */

/* The run: what one model needs to compute, laid out once at open. */
typedef struct k3_run {
    const k3_model *model;
    kstore *store;
    kpool *pool;
    k3_weights w;               /* the small vectors, bound once; the seam */
    k3_scratch s;               /* activations of one block */
    size_t expert_batch;        /* experts of one layer held at once */
    uint64_t expert_uses;       /* routed (position, expert) pairs so far */
    void *arena;                /* w and s live here */
    size_t arena_bytes;
} k3_run;

/* One segment of a block: n new positions of the sequence whose state is st.
 * logits receives the logits of its last position [V], or with all_positions
 * of each of its n positions [n][V]. */
typedef struct k3_seg {
    k3_state *st;
    const int32_t *ids;
    size_t n;
    float *logits;
    int all_positions;
} k3_seg;

/* Bytes of the run's arena for blocks of up to T positions from up to S
 * segments with ctx positions per sequence: what k3_run_init allocates. */
size_t k3_run_bytes(const k3_config *c, size_t T, size_t S, size_t ctx);
/* The part of it that holds the bound vectors (the rest is activations). */
size_t k3_run_vectors_bytes(const k3_config *c);
int k3_run_init(k3_run *r, const k3_model *m, kstore *store, kpool *pool, size_t T, size_t S, size_t ctx, krun_err *err);
void k3_run_free(k3_run *r);

/* Process one block: segment k's positions follow the st->pos already in its
 * state, and the segments' states must be distinct.  The bits of each
 * segment's logits do not depend on the other segments in the block.  Every
 * logit computed is checked to be finite.  On error the states of the block
 * are unusable (reset them). */
int k3_forward(k3_run *r, const k3_seg *segs, size_t nseg, krun_err *err);

#endif
