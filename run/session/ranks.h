/* The session API on several machines (docs/RUNTIME.md §10): the handshake
 * that opens the model on every rank, the plan of which rank computes which
 * trunk layers (pipeline stages, placed by each rank's own memory plan) and
 * which experts each can read, and the follower's side of it.
 *
 * rank 0                                   every other rank
 *   krun_ranks_hello: HELLO (the file, the    waits for it; opens the file (the members on its
 *   options every rank must share) ->         own disks), answers with its budget and members
 *   reports <- ; the layers placed;
 *   PLAN (who computes what) ->               prepares its part (its plan, store, threads,
 *   rank 0 prepares its own part              its layers' states) and says READY
 *   krun_ranks_ready: READY <-; the seams     serves (kcl_node_follow) until rank 0 stops it
 *   of its forward pass installed
 *
 * Every failure on a rank reaches rank 0 as a message naming the rank (and
 * the file, member or what did not fit), and rank 0 fails with it; the
 * others wait for rank 0's stop, so mpirun never ends rank 0 before it has
 * said what happened. */
#ifndef KRUN_RANKS_H
#define KRUN_RANKS_H

#include "memplan.h"
#include "session.h"
#include "statefile.h"
#include "run/cluster/kcl_node.h"

typedef struct krun_ranks krun_ranks;

/* Rank 0, in krun_model_prepare before its plan: o is adjusted (one prompt
 * block size for every rank; the cluster's buffers counted), m->away set to
 * the layers other ranks compute. */
int krun_ranks_hello(krun_ranks **out, const krun_model *model, kpk_file *f, k3_model *m, krun_model_opts *o, krun_err *err);
/* Who computes what, without preparing anything (krun --plan): under
 * mpirun the other ranks' reports (then they are stopped at exit), or
 * `hypothetical` ranks like this one (its budget and members each).  o is
 * adjusted as for preparing. */
typedef struct krun_layout {
    int nranks;
    uint64_t budget[KCL_MAX_RANKS];
    kcl_members have[KCL_MAX_RANKS];
    uint8_t owner[K3_MAX_LAYERS];
} krun_layout;
int krun_ranks_layout(const krun_model *model, kpk_file *f, k3_model *m, krun_model_opts *o, int hypothetical, krun_layout *out,
                      krun_err *err);
/* The plan's cost (ranks_plan.c): each rank's own memory plan for its
 * layers, and what a sweep reads and sends (session.h, krun_cluster_plan). */
int krun_ranks_cost(const krun_model *model, k3_model *m, const krun_model_opts *o, const krun_layout *lay, int hypothetical,
                    double disk_mbps, double net_mbps, krun_cluster_plan *out, krun_err *err);
/* Rank 0, at the end of krun_model_prepare: the seams installed on run, the
 * other ranks' READY collected. */
int krun_ranks_ready(krun_ranks *x, k3_model *m, k3_run *run, k3_state **states, size_t n, size_t ctx, krun_err *err);
void krun_ranks_free(krun_ranks *x);
kcl_node *krun_ranks_node(const krun_ranks *x);
/* 1 when other ranks compute trunk layers (they keep those layers' states). */
int krun_ranks_staged(const krun_ranks *x);

/* Rank 0's forward blocks and its sequences' state, with other ranks
 * holding some layers: each is what one process does (x NULL: exactly
 * that), and the other ranks' copies follow.  Every exchange with the other
 * ranks is serialized (a save from the prefix cache's writer thread waits
 * for a block to end). */
int krun_ranks_forward(krun_ranks *x, k3_run *run, const k3_seg *segs, size_t n, krun_err *err);
void krun_ranks_commit(krun_ranks *x, k3_run *run, k3_state *st, size_t keep);
void krun_ranks_reset(krun_ranks *x, k3_state *st);
void krun_ranks_copy(krun_ranks *x, k3_state *dst, const k3_state *src);
int krun_ranks_state_new(krun_ranks *x, k3_state *st, size_t cap, krun_err *err);
void krun_ranks_state_free(krun_ranks *x, k3_state *st);
/* A state file written or read with layers on other ranks: far (NULL when
 * none are) is set up for contexts of ctx positions, the exchange held
 * until far_end. */
int krun_ranks_far_begin(krun_ranks *x, const k3_config *c, size_t ctx, krun_state_far *far, const krun_state_far **use,
                         krun_err *err);
void krun_ranks_far_end(krun_ranks *x, krun_state_far *far);

/* A rank other than 0: the handshake's first half.  Waits for HELLO (0: *o
 * and *path filled from it and the rank's own options; 1: rank 0 stopped
 * before any model, nothing to do) and answers it after loading the file
 * with load(ctx, path) -- which also sets its layers away once the plan
 * arrives (krun_ranks_plan). */
typedef struct krun_follower {
    char path[4096];
    krun_model_opts o;
    uint8_t *owner;               /* [n_layers] */
    kcl_members have[KCL_MAX_RANKS];
    int code;                     /* a failure on this rank, told to rank 0 */
    char msg[1024];
} krun_follower;
int krun_ranks_await(krun_follower *fw, const krun_model_opts *own, krun_err *err);
/* Tell rank 0 how loading went (its budget and the members it has), then
 * wait for the plan (0), or for a stop (1). */
int krun_ranks_report(krun_follower *fw, const kpk_file *f, const k3_config *c, krun_err *err);
/* After preparing (or failing to: fw->code): READY to rank 0. */
int krun_ranks_say_ready(krun_follower *fw, const kmemplan *plan, krun_err *err);
/* Wait for rank 0's stop (after a failure here). */
void krun_ranks_await_stop(void);
void krun_follower_free(krun_follower *fw);

#endif
