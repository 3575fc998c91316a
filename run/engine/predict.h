/* Predicting a layer's experts before its router runs (krun --predict).
 *
 * With the experts on slow disks and the trunk on a fast one, a decoding
 * step spends most of a layer's attention with the expert disks idle: which
 * experts the layer needs is known only when its router has run.  The
 * prediction runs that router early, at the start of the layer (or of the
 * dense layer before it), on what the router will see with the attention
 * output left out: the MoE input of
 * spec §4.4 step 6, AttnRes over the snapshots and the prefix as it is
 * before this layer's attention, then the post-attention norm.  The experts
 * it picks are read at the read-ahead priority (kstore_experts_predict)
 * while attention computes; when the router has run, the ones it chose are
 * already in or on their way, and the rest are read at once, ahead of any
 * prediction still queued.
 *
 * A prediction decides which bytes are read early, never what is computed:
 * the router of step 7 runs as always, every expert it chooses goes through
 * the cache and its checksum, and a wrong guess is only a read that was not
 * needed (counted: bytes_predicted, experts_predicted, experts_predicted_used).
 * The router copy is read outside the checked stream and never verified: a
 * damaged copy can only make a worse guess.
 *
 * It runs for blocks of one position (a decoding step of one sequence) on
 * MoE layers whose vectors are bound; when the layer streams, its router is
 * read from the trunk disk into the prediction's own buffer (counted in the
 * plan: k3_predict_bytes). */
#ifndef KRUN_PREDICT_H
#define KRUN_PREDICT_H

#include "forward.h"
#include "layers.h"

/* The prediction's buffers for this model: buf (the largest router and the
 * vectors of one prediction), stage (that router's stored bytes when the
 * trunk is compressed; else 0).  The planner counts them; k3_predict_init
 * allocates them. */
void k3_predict_bytes(const k3_model *m, uint64_t *buf, uint64_t *stage);
int k3_predict_init(k3_run *r, uint64_t buf, uint64_t stage, krun_err *err);
void k3_predict_free(k3_run *r);

/* At the start of layer L of block b: predict the experts of L when it is
 * a MoE layer, else of the layer after it (a dense layer's compute would
 * leave the expert disks idle too), from the prefix P and the nsnap
 * snapshots, and start reading them.  Nothing when the prediction is off,
 * the block has more than one position, or the router cannot be had (a
 * failed read is only a missed guess). */
void k3_predict_experts(k3_run *r, int L, const k3_block *b, size_t nsnap);

#endif
