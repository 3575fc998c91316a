/* The whole K3 forward pass over one block of new positions, which may come
 * from several sequences (segments): everything position-wise runs over the
 * whole block, everything sequential runs per segment on its own state. */
#ifndef KRUN_FORWARD_H
#define KRUN_FORWARD_H

#include "journal.h"
#include "scratch.h"
#include "state.h"
#include "statepage.h"
#include "weights.h"
#include "run/model/model.h"
#include "run/store/store.h"
#include "run/util/krun_err.h"
#include "run/util/threadpool.h"

#define K3_MAX_SEQS 256            /* sequences in one forward block, at most */
#define K3_RUN_TAPS 1              /* k3_run_init takes the taps' width (a drafter's; bench_attn.c builds against older trees) */

/* The run: what one model needs to compute, laid out once at open. */
typedef struct k3_run {
    const k3_model *model;
    kstore *store;
    kpool *pool;
    k3_weights w;               /* the small vectors, bound once; the seam */
    k3_scratch s;               /* activations of one block */
    k3_journal j;               /* a speculative verification block's record (cap 0: none) */
    uint64_t *routed;           /* [n_layers][n_experts]: times each expert was chosen (the routing's histogram) */
    void *arena;                /* w, s (for blocks of T_own positions) and j live here */
    size_t arena_bytes;
    size_t T_own, S, ctx;       /* the arena's scratch: capacity in positions, segments, context */
    size_t scratch_off;         /* where in the arena the scratch starts */
    /* called after each layer of a block (layers done, of n_layers): progress within a long block */
    void (*on_layer)(void *ctx, int done, int total);
    void *on_layer_ctx;
    /* called after step 8 of every layer L of a block with the block-local prefix P [T][E] the
     * layer leaves (K3_MODEL §4.4) and the scratch's tap rows [T][tap_floats] to keep what it
     * wants of it in (a drafter's taps, K3_EAGLE.md §2): valid until the next block.  NULL: none.
     * The run must have been laid out with tap_floats > 0 (k3_run_init's taps). */
    void (*tap)(void *ctx, int L, const float *P, size_t T, float *taps);
    void *tap_ctx;
    /* the sequences' states paged to disk (statepage.h): NULL, resident.  With a pager every
     * state of a block is one of its slots, and no segment snapshots (a journaled one's commit
     * is deferred to the next block: journal.h) */
    k3_pager *pager;
    /* several ranks (remote.h, run/cluster): where work goes to other processes; NULL: one process */
    struct k3_remote *remote;
    /* the prediction (predict.h); NULL when it is off */
    uint8_t *predict_mem;
    uint64_t predict_router_bytes, predict_buf_bytes, predict_stage_bytes;
} k3_run;

/* A copy of a segment's state taken inside its block, without a pass of its
 * own (the prefix cache's snapshot at the end of a chat preamble, which
 * rarely ends a block): the state after the segment's first `at` positions.
 * As each KDA layer runs, the recurrence copies every head's state after
 * position at - 1 to S[L] and the ShortConv history there to conv[L] (the
 * pre-conv inputs of the Kc - 1 positions up to it); once layer L is done,
 * layer_done(ctx, L) is called for every layer, KDA or MLA (an MLA layer's
 * rows up to the position are in the segment's own cache by then, and the
 * positions after it do not touch them).  The bits are those of the state
 * a block ending at that position leaves: the same operations on the same
 * floats (docs/NUMERICS.md §4). */
typedef struct k3_snap {
    size_t at;                          /* 1..n of the segment */
    float *const *S;                    /* [layer]: where KDA layer L's head states go ([Hk][D][D]) */
    float *const *conv;                 /* [layer]: where its ShortConv history goes ([3][Kc-1][P], oldest first) */
    void (*layer_done)(void *ctx, int L);   /* NULL: none */
    void *ctx;
} k3_snap;

/* One segment of a block: n new positions of the sequence whose state is st.
 * logits receives the logits of its last position [V], or with all_positions
 * of each of its n positions [n][V].  A journaled segment (speculative
 * verification) runs its positions but its state does not advance; they are
 * recorded in the run's journal, its logits go to the journal's rows
 * (k3_journal_logits; logits is unused), and k3_commit keeps the first of
 * them.  Journaled and plain segments share a block; the journaled ones
 * together hold at most the journal's cap positions in at most max_segs
 * segments (journal.h). */
typedef struct k3_seg {
    k3_state *st;
    const int32_t *ids;
    size_t n;
    float *logits;
    int all_positions;
    int journal;
    const k3_snap *snap;       /* a snapshot inside the block, or NULL (never in a journaled segment) */
} k3_seg;

/* Positions of a forward block: a prefill chunk, one step of max_seqs
 * sessions, or a verification block of spec drafts + 1, whichever is largest. */
static inline size_t k3_block_positions(size_t chunk, size_t max_seqs, size_t spec)
{
    size_t b = chunk > max_seqs ? chunk : max_seqs;
    return spec + 1 > b ? spec + 1 : b;
}

/* Bytes of the run's arena for blocks of up to T positions from up to S
 * segments with ctx positions per sequence, a journal for verification
 * blocks of spec drafts (0: none) and the routing histogram: what
 * k3_run_init allocates. */
size_t k3_run_bytes(const k3_config *c, size_t T, size_t S, size_t ctx, size_t spec, size_t taps);
/* The part of it that holds the bound vectors (the rest is activations and the journal). */
size_t k3_run_vectors_bytes(const k3_config *c);
/* The activations of a block of T positions alone (no vectors, no journal): what
 * k3_run_use_block carves over memory of its own (the planner's prefill layout). */
size_t k3_run_scratch_bytes(const k3_config *c, size_t T, size_t S, size_t ctx, size_t taps);
/* taps: floats per position the tap hook keeps in the scratch (0: none). */
int k3_run_init(k3_run *r, const k3_model *m, kstore *store, kpool *pool, size_t T, size_t S, size_t ctx, size_t spec,
                size_t taps, krun_err *err);
void k3_run_free(k3_run *r);
/* Blocks of up to T positions from now on, their activations carved over mem
 * (k3_run_scratch_bytes(T) of it, 64-byte aligned; the caller's, e.g. memory
 * the store lent back); mem NULL: back to the arena's own scratch (T_own).
 * Between blocks only: nothing in the scratch outlives a block. */
void k3_run_use_block(k3_run *r, uint8_t *mem, size_t T);
/* Experts of one layer the MoE holds at once: the store's expert capacity
 * right now (it changes with the store's phase), at most K3_EXPERT_BATCH. */
size_t k3_run_expert_batch(const k3_run *r);

/* Process one block: segment k's positions follow the st->pos already in its
 * state, and the segments' states must be distinct.  The bits of each
 * segment's logits do not depend on the other segments in the block.  Every
 * logit computed is checked to be finite, and the model file to be as it was
 * opened once the block's last byte is read (KRUN_EDATA otherwise, whatever
 * else went wrong: weights.h, k3_weights_step_check).  On error the states of
 * the block are unusable (reset them). */
int k3_forward(k3_run *r, const k3_seg *segs, size_t nseg, krun_err *err);

/* Logits that are not finite (rows x V of them, the first at position pos)
 * fail with KRUN_EDATA naming the position; k3_forward checks every row it
 * computes except a journaled segment's, whose caller checks the rows it
 * keeps. */
int k3_check_finite(const k3_run *r, const float *logits, size_t rows, size_t pos, krun_err *err);

/* The segments of a block occupy its rows in order: segment k's n positions
 * are rows [n of the segments before it, + n).  After a block: the token
 * embedding of its row `row` (AttnRes source 0, K3_MODEL §4.4) [E], valid until
 * the next block. */
const float *k3_block_embedding(const k3_run *r, size_t row);

/* After a block in which st's segment was journaled (n positions): the
 * logits of its n positions [n][V], valid until the next block; NULL if st
 * was not journaled in the last block. */
const float *k3_journal_logits(const k3_run *r, const k3_state *st);
/* Then advance st by its first keep positions (1 <= keep <= n), bit for bit
 * as if only they had run; once per journaled segment, before the next block. */
void k3_commit(k3_run *r, k3_state *st, size_t keep);

#endif
