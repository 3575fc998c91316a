/* The seams where the forward pass hands work to other processes: several
 * machines running one model over MPI (run/cluster, docs/RUNTIME.md §10).
 *
 * In one process k3_run.remote is NULL and every hook below is nothing: the
 * forward pass is the one of forward.c, moe.c and predict.c, unchanged.
 * With several ranks, run/cluster fills the table, and the forward pass
 * calls it at four seams and nowhere else:
 *
 *   block     a forward block begins: rank 0 tells the ranks that compute
 *             some of its layers (they run the same k3_forward on their own
 *             copies of the sequences' states, for their layers only)
 *   stage     at each layer, and at the output: 1 when it runs in this
 *             process.  Where the layer before ran elsewhere, the block's
 *             hidden state (the prefix P and the AttnRes snapshots) arrives
 *             first; where the next runs elsewhere, it is sent on
 *   experts   the MoE's routed experts: those other ranks read (from their
 *             own disks) are sent there with the rows of the positions that
 *             chose them, computed there by the same kernels, and their
 *             outputs come back into the block's per-(position, choice)
 *             rows, so the top-k sum that follows is the one of one process
 *   predict   --predict's early guess, read ahead by the ranks that will
 *             compute each expert
 *   commit    a speculative verification keeps `keep` positions: the ranks
 *             holding other layers' states commit theirs
 *
 * None of them changes what a kernel computes or the order of a sum: the
 * bits are those of one process (docs/NUMERICS.md §6). */
#ifndef KRUN_REMOTE_H
#define KRUN_REMOTE_H

#include "layers.h"

typedef struct k3_remote {
    void *ctx;
    int (*block)(void *ctx, k3_run *r, const k3_seg *segs, size_t nseg, krun_err *err);
    int (*stage)(void *ctx, k3_run *r, int L, const k3_block *b, size_t *nsnap, int *prefix_empty, krun_err *err);
    int (*experts_begin)(void *ctx, k3_run *r, int L, int *distinct, size_t *nd, size_t T, krun_err *err);
    int (*experts_rows)(void *ctx, k3_run *r, int L, size_t T, krun_err *err);
    int (*experts_end)(void *ctx, k3_run *r, int L, size_t T, int failed, krun_err *err);
    size_t (*predict)(void *ctx, k3_run *r, int L, const int *experts, size_t n);
    void (*commit)(void *ctx, k3_run *r, const k3_state *st, size_t keep);
} k3_remote;

static inline int k3_remote_block(k3_run *r, const k3_seg *segs, size_t nseg, krun_err *err)
{
    return r->remote ? r->remote->block(r->remote->ctx, r, segs, nseg, err) : 0;
}
/* Layer L (n_layers: the output) runs here: 1; another rank's: 0; -1 with err. */
static inline int k3_remote_stage(k3_run *r, int L, const k3_block *b, size_t *nsnap, int *prefix_empty, krun_err *err)
{
    return r->remote ? r->remote->stage(r->remote->ctx, r, L, b, nsnap, prefix_empty, err) : 1;
}
/* After routing: distinct[0..*nd) are the block's experts in id order; on
 * return the first *nd are the ones computed here (still in id order). */
static inline int k3_remote_experts_begin(k3_run *r, int L, int *distinct, size_t *nd, size_t T, krun_err *err)
{
    return r->remote ? r->remote->experts_begin(r->remote->ctx, r, L, distinct, nd, T, err) : 0;
}
/* After the latent projection (r->s.moe.zeta): the rows go out. */
static inline int k3_remote_experts_rows(k3_run *r, int L, size_t T, krun_err *err)
{
    return r->remote ? r->remote->experts_rows(r->remote->ctx, r, L, T, err) : 0;
}
/* The other ranks' outputs, into r->s.moe.slots.  Also after a failure here
 * (failed: err holds it and is kept), to take back what was asked of them. */
static inline int k3_remote_experts_end(k3_run *r, int L, size_t T, int failed, krun_err *err)
{
    return r->remote ? r->remote->experts_end(r->remote->ctx, r, L, T, failed, err) : failed ? -1 : 0;
}

#endif
