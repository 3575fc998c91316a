/* The journal of a speculative verification block (docs/RUNTIME.md §7).
 *
 * A verification block runs a sampled token and the drafts after it through
 * the model in one forward block, but whether the drafts are kept is known
 * only from the block's logits.  The MLA caches need nothing for that (the
 * rows past the sequence's position are rewritten before they are ever
 * read), but the KDA recurrence and the ShortConv history cannot be un-run.
 * So a journaled block leaves them as they were: each head's recurrence runs
 * on a copy of its state (S below, one layer at a time), the convolution
 * reads its history without moving it, and the journal records, per KDA
 * layer and position, what advancing them needs:
 *
 *   pre-conv q, k, v   (3P floats)  the ShortConv inputs
 *   alpha              (P floats)   the decay, as the block computed it
 *   beta               (Hk floats)  the write strength
 *
 * k3_commit then advances the state by the accepted positions only: the
 * convolution runs again over their recorded inputs from the old history
 * (moving it, and giving the recurrence's k and v), and the recurrence's
 * update is replayed on the real state: exactly the float operations a
 * plain run of those positions performs (docs/NUMERICS.md §5).  (Recording
 * k and v after the convolution instead would take 2P more floats per
 * position to save a convolution of Kc taps per channel.)  At full K3 scale
 * that is 197 KB per KDA layer per position, 13.6 MB per position over the 69
 * KDA layers, plus one layer's state copies (6.3 MB) and the block's logits
 * (655 KB per position).
 *
 * Several sequences may verify in one block (krun serve's sweeps): their
 * positions share the journal's cap rows, each segment's rows following the
 * previous one's in block order, and each journaled segment has its own
 * state copies (at most cap / 2 segments: a verification is a token and at
 * least one draft).
 *
 * A state paged to disk (statepage.h) is not in RAM between blocks, so its
 * commit is deferred: k3_commit moves its position and keeps the entry, and
 * the next block replays it on each KDA layer as the pager brings the layer
 * in, before the layer computes (a layer's rows of the journal are rewritten
 * only while that layer runs).  A state the next block does not hold is
 * brought in alone for it first; one whose position changed since (reset)
 * drops it.  The same float operations, in the same order: the same bits.
 *
 * Laid out once with the run state (arena.h), by this carve function, which
 * the planner calls too. */
#ifndef KRUN_JOURNAL_H
#define KRUN_JOURNAL_H

#include "format/k3_config.h"
#include "run/util/arena.h"

#include <stddef.h>

#define K3_JOURNAL_MAX_SEGS 64  /* journaled segments in one block, at most (cap / 2 of the largest cap) */

typedef struct k3_journal {
    size_t cap;            /* positions a block's verifications hold together: drafts + 1; 0: no journal */
    size_t max_segs;       /* journaled segments one block holds: max(1, cap / 2) */
    size_t rec_floats;     /* floats recorded per KDA layer and position: 4P + Hk */
    float **rec;           /* [layer] -> [cap][rec_floats]; NULL for MLA layers */
    float *S;              /* [max_segs][Hk][D][D]: the state copies of the layer being verified */
    float *logits;         /* [cap][V]: the logits of every journaled position of the block */
    /* the last block's journaled segments, until committed: their state, first row, positions */
    size_t n_segs;
    const void *seg_st[K3_JOURNAL_MAX_SEGS];
    size_t seg_row[K3_JOURNAL_MAX_SEGS], seg_n[K3_JOURNAL_MAX_SEGS];
    /* commits of paged states (statepage.h), replayed as the next block brings each KDA layer
     * in: the state, its first row, the positions kept and its position after the commit */
    size_t n_def;
    void *def_st[K3_JOURNAL_MAX_SEGS];
    size_t def_row[K3_JOURNAL_MAX_SEGS], def_keep[K3_JOURNAL_MAX_SEGS], def_pos[K3_JOURNAL_MAX_SEGS];
} k3_journal;

/* Offsets inside one position's record: pre-conv q | k | v, then alpha, then beta. */
static inline size_t k3_journal_alpha(const k3_config *c) { return 3 * (size_t)c->kda_heads * c->kda_head_dim; }
static inline size_t k3_journal_beta(const k3_config *c) { return 4 * (size_t)c->kda_heads * c->kda_head_dim; }

/* Lay out a journal for verification blocks of up to drafts + 1 positions
 * (nothing when drafts is 0). */
void k3_journal_carve(k3_journal *j, const k3_config *c, size_t drafts, karena *a);
/* Its bytes, as carved (the planner's figure). */
size_t k3_journal_bytes(const k3_config *c, size_t drafts);

#endif
