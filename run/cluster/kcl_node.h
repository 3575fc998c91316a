/* This process's part of a cluster run: the remote.h seams of its forward
 * pass (experts, pipeline stages, commits), and on the other ranks the loop
 * that does what rank 0 orders.
 *
 * Pipeline stages.  owner[L] is the rank that computes trunk layer L with its
 * weights pinned (or streamed) in its own budget and its sequences' state of
 * that layer in its own memory; rank 0 also does the embedding and the
 * output.  Every rank that owns a layer runs the same forward blocks: rank 0
 * sends each block's segments (which sequences, how many positions, whether
 * journaled, where a snapshot is due) when it begins, every rank runs
 * k3_forward on its own copies of those sequences' states, and at a change
 * of owner the block's hidden state -- the prefix P and the AttnRes block
 * snapshots of every position, and how many there are -- goes from one rank
 * to the next (tag HID).  A rank that computes no layer only serves experts.
 *
 * The other ranks' copies of a sequence's state are kept in step with rank
 * 0's by its orders: a session reset, a copy between sessions or into and
 * out of a snapshot, a verification's commit, a snapshot inside a block, a
 * state saved (its layers sent to rank 0) or loaded (sent from it). */
#ifndef KRUN_KCL_NODE_H
#define KRUN_KCL_NODE_H

#include "kcl_moe.h"

typedef struct kcl_node kcl_node;

/* owner[L] for every trunk layer (rank 0 has the globals).  states: the
 * sequences' states by id (rank 0's session slots and snapshots and, on the
 * other ranks, their copies with only their own layers); n_fixed of them
 * exist from the start (the session slots), the rest are made and freed on
 * rank 0's orders (snapshots). */
int kcl_node_new(const k3_model *m, k3_run *run, const kcl_members *have, const uint8_t *owner, k3_state **states,
                 size_t n_fixed, size_t ctx, kcl_node **out, krun_err *err);
void kcl_node_free(kcl_node *n);
/* Installs the seams into run->remote, and serves expert requests while waiting. */
void kcl_node_attach(kcl_node *n);
kcl_moe *kcl_node_moe(kcl_node *n);
/* 1 when some layer runs on a rank other than 0 (pipeline stages). */
int kcl_node_staged(const kcl_node *n);
int kcl_node_owner(const kcl_node *n, int L);
/* 1 when nothing more can run on the cluster: a rank or the network to it
 * was lost, or a block failed half way on the ranks (why: the first error). */
int kcl_node_lost(const kcl_node *n, krun_err *why);
/* Bytes of the buffers kcl_node_new allocates (the plan counts them). */
uint64_t kcl_node_bytes(const k3_config *c, size_t T);

/* ---- rank 0: orders about a sequence's state to the ranks holding its other layers ---- */
int kcl_node_reset(kcl_node *n, const k3_state *st, krun_err *err);
int kcl_node_copy(kcl_node *n, const k3_state *dst, const k3_state *src, krun_err *err);
/* A state outside the fixed ones (a snapshot of cap positions): made on every rank. */
int kcl_node_state_new(kcl_node *n, k3_state *st, size_t cap, krun_err *err);
void kcl_node_state_free(kcl_node *n, k3_state *st);
/* Layer L of st's state, from the rank that holds it, into S/conv (KDA) or
 * mla (MLA, rows [0, pos)); or sent there. */
int kcl_node_layer_get(kcl_node *n, const k3_state *st, int L, float *S, float *conv, float *mla, krun_err *err);
int kcl_node_layer_put(kcl_node *n, const k3_state *st, int L, const float *S, const float *conv, const float *mla, size_t pos,
                       krun_err *err);
/* What each rank did: its store's reads, the experts it computed for
 * others, the bytes it sent and received, the layers it computes. */
typedef struct kcl_rank_stats {
    krun_stats st;
    uint64_t experts_served, experts_predicted, bytes_sent, bytes_received;
    int32_t layers, pad;
} kcl_rank_stats;
/* Every rank's (rank 0's own from its store), all[kcl_size()]. */
int kcl_node_stats(kcl_node *n, kcl_rank_stats *all, krun_err *err);
/* At exit, any rank (status: the exit status): rank 0 tells every other to
 * stop (its loop returns 0), and the process leaves the cluster (kcl_finish). */
void kcl_node_leave(int status);

/* ---- the other ranks ---- */
/* Do what rank 0 orders until it says stop (0), or the cluster fails (-1, err). */
int kcl_node_follow(kcl_node *n, krun_err *err);

#endif
