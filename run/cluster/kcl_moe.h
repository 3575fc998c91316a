/* A MoE layer's routed experts over several ranks: each is computed by a
 * rank that can read it from its own disks.
 *
 * Who can read what.  Every rank opens the members of the set that are on
 * its machine (kpk_open_here); an expert can be read by a rank that has
 * every member its extent lies in.  A set copied whole to every machine
 * lets every rank read every expert; a set laid out for N machines (kpack
 * convert --machines N) gives each machine its own experts; anything in
 * between works.
 *
 * Who computes what (kcl_moe_assign).  The rank running the layer (the
 * requester) gives each expert of its block to one of the ranks that can
 * read it: the experts with the fewest such ranks first, each to the rank
 * whose disk holding it has the fewest bytes to read so far; an expert
 * predicted (--predict) goes where its read-ahead went; ties go to the
 * requester itself (no network), then to the rank that computed it last
 * (its cache may hold it), then round the ranks.  So a set copied to every
 * machine spreads a layer's experts evenly over all the disks of the
 * cluster, and a partitioned one reads each where it is.
 *
 * The exchange, per layer and rank asked (tags of kcl.h):
 *   requester -> rank   EXQ    [L, n, experts...]          right after routing: its reads start
 *   requester -> rank   EXROWS the latent rows of the positions that chose them (after the latent
 *                              projection), with each expert's row list; or a cancel
 *   rank -> requester   EXO    per expert: a header, then its output rows; at the end a header
 *                              saying done, or what failed (an extent that failed its checksum:
 *                              named, and the requester's step fails with it)
 * The rank computes each expert with moe_expert_apply on the same rows in
 * the same order as the requester would: an output row depends on its input
 * row alone (docs/NUMERICS.md §5), and the requester writes it into the
 * block's per-(position, choice) row, where the top-k sum reads it as in
 * one process. */
#ifndef KRUN_KCL_MOE_H
#define KRUN_KCL_MOE_H

#include "kcl.h"
#include "run/engine/remote.h"

typedef struct kcl_moe kcl_moe;

/* have[r]: the member files rank r has (a bit per member, 256 members).
 * run: this rank's run state (its store reads the experts it computes, its
 * scratch computes them); NULL for a plan's cost model only.  The holders of
 * every expert are worked out once. */
typedef struct kcl_members { uint64_t bits[4]; } kcl_members;
static inline int kcl_has(const kcl_members *h, int m) { return (int)(h->bits[m >> 6] >> (m & 63) & 1); }

int kcl_moe_new(const k3_model *m, k3_run *run, const kcl_members *have, int nranks, kcl_moe **out, krun_err *err);
void kcl_moe_free(kcl_moe *x);
/* Buffer bytes kcl_moe_new allocates for blocks of T positions (counted in the plan). */
uint64_t kcl_moe_bytes(const k3_config *c, size_t T);

/* Ranks that can read expert (L, e), a bit each; 0: none (the set cannot run). */
uint64_t kcl_moe_holders(const kcl_moe *x, int L, int e);
/* The first (layer, expert) no rank can read, with the member it needs: -1 when all can be. */
int kcl_moe_unreadable(const kcl_moe *x, int *L, int *e, int *member);

/* The remote.h seams of the MoE (the requester's side) and of --predict. */
int kcl_moe_begin(kcl_moe *x, k3_run *r, int L, int *distinct, size_t *nd, size_t T, krun_err *err);
int kcl_moe_rows(kcl_moe *x, k3_run *r, int L, size_t T, krun_err *err);
int kcl_moe_end(kcl_moe *x, k3_run *r, int L, size_t T, int failed, krun_err *err);
size_t kcl_moe_predict(kcl_moe *x, k3_run *r, int L, const int *experts, size_t n);

/* The expected cost of layer L's experts for a block of `positions`
 * positions run by rank `requester`, each choosing top-k of the pool
 * uniformly (the release's routing is balanced), given to ranks as
 * kcl_moe_begin gives them (cache hits not counted): the slowest disk's
 * seconds at drive_bps bytes/s per drive (a stripe reads at the sum of its
 * drives), the bytes each rank reads, and what crosses the network: the
 * experts computed elsewhere, the ranks asked, the (rank, position) rows
 * sent.  The mean over `samples` draws, the same draws on every run. */
typedef struct kcl_moe_cost {
    double seconds;
    double bytes[KCL_MAX_RANKS];
    double remote_experts, remote_ranks, remote_rows, rows_per_expert;
} kcl_moe_cost;
void kcl_moe_expect(kcl_moe *x, int requester, int L, size_t positions, double drive_bps, int samples, kcl_moe_cost *out);

/* Serving (kcl_serve_fn): an expert request or a prediction from another rank. */
int kcl_moe_serve(void *x, int from, int tag, krun_err *err);

/* Experts this rank computed for others, and was asked to read ahead. */
void kcl_moe_counts(const kcl_moe *x, uint64_t *served, uint64_t *predicted);

#endif
