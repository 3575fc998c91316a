/* Kimi K3's EAGLE-3.1 drafter (../shared/spec/K3_EAGLE.md): one MLA layer of
 * its own that reads the target's hidden state at three layers ("taps") and
 * proposes the next tokens, which the target then verifies in one forward
 * block (docs/RUNTIME.md §7).  Only a proposer: whatever it proposes, the
 * output is the target's (the verification keeps what the sampler picks).
 *
 *   taps       the target calls the hook after every layer of every block
 *              (forward.h: k3_run.tap); at the tapped layers it keeps, per
 *              position, RMSNorm_{fc_norm.k}(P) in the block's scratch
 *   commit     after a block, each position the target kept becomes a
 *              drafter KV row: fusion g = fc . taps, then only the latent
 *              kv_a . [norm(embed(next token)) | norm(g)] (K3_EAGLE §3.9:
 *              a committed row needs nothing else); the newest position's g
 *              waits ("pending") for its successor token
 *   propose    a chain: row (p0, the sampled token, pending g) -> o1, d1;
 *              row (p0 + 1, d1, o1) -> o2, d2; ... each the whole layer
 *              (MLA with YaRN RoPE, SwiGLU MLP, norm, lm_head, argmax);
 *              the chain's KV rows are scratch past the committed ones
 *
 * Its file is a drafter KPK file (docs/FORMAT.md §15); its weights are held
 * in memory (read and checked once at load), its token embedding is the
 * target's (byte-identical: load compares sampled rows and refuses a
 * drafter whose table differs), so a committed row reuses the block's own
 * embedding rows and a draft step reads one row through the target's store.
 *
 * Numbers: every product is a kdot of docs/NUMERICS.md §3 and every norm,
 * softmax and weighted sum follows §4, so a drafter row gives the same bits
 * whether computed in a prompt block, after a verification or in a chain,
 * for any thread count and SIMD path; cos and sin are computed by our own
 * code (draft_rope.c). */
#ifndef KRUN_DRAFT_H
#define KRUN_DRAFT_H

#include "format/k3_eagle.h"
#include "run/engine/forward.h"
#include "run/model/model.h"
#include "run/store/store.h"
#include "run/util/arena.h"
#include "run/util/krun_err.h"
#include "run/util/threadpool.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kdraft kdraft;

/* A session's drafter state: the KV rows of the positions committed, and the
 * fused taps of the newest target position waiting for its successor. */
typedef struct kdraft_state {
    float *cache;          /* [cap][Rkv + dr]: rows [start, n) committed (c-hat, rotated k^R); a chain writes past n */
    float *pending;        /* [E]: g of row n, when has_pending */
    size_t cap;            /* rows: the context + the drafts of a chain */
    size_t start, n;       /* committed rows [start, n); start > 0 when the state began without the rows before it */
    int has_pending;
} kdraft_state;

/* Open a drafter file for a target: the container, its roster and config
 * (k3e_check_kpk), and that it was made for this target (hidden size,
 * vocabulary, taps: k3e_target_taps).  Nothing is read beyond the
 * directory.  Errors: KRUN_EDATA (1) for a damaged file, KRUN_EINPUT (2) for
 * a drafter of another model or not a drafter. */
int kdraft_open(const char *path, const k3_model *target, kdraft **out, krun_err *err);
void kdraft_close(kdraft *d);
const char *kdraft_path(const kdraft *d);
const k3_eagle_config *kdraft_config(const kdraft *d);
/* The target layers it taps, zero-based (n_taps of them). */
const int *kdraft_tap_layers(const kdraft *d);
/* The pinned release (K3_EAGLE §1.2) as the file's manifest records it, or NULL. */
const char *kdraft_pinned(const kdraft *d);

/* What the target's run scratch keeps per position for it (k3_run_init's taps). */
size_t kdraft_tap_floats(const kdraft *d);
/* Bytes it holds once loaded for chains of up to `rows` sessions at once
 * with caches of `cap` rows: the weights (its file's weights extent), the
 * widened norms, the commit and chain scratch.  What kdraft_load allocates. */
uint64_t kdraft_bytes(const kdraft *d, size_t rows, size_t cap);
/* What it holds now (0 before kdraft_load). */
uint64_t kdraft_held(const kdraft *d);
/* The part of it that is weights. */
uint64_t kdraft_weight_bytes(const kdraft *d);
/* Read and check the weights (verify: their XXH3), compare sampled rows of
 * its embedding with the target's (read through the target's store), lay
 * the scratch out.  The store and pool are the target's. */
int kdraft_load(kdraft *d, kstore *store, uint32_t globals_extent, kpool *pool, size_t rows, size_t cap, int verify, krun_err *err);

/* The hook the target's run calls after every layer (forward.h); ctx is the kdraft. */
void kdraft_tap(void *ctx, int L, const float *P, size_t T, float *taps);

/* ---- a session's state ---------------------------------------------------- */

/* Lay a state for caches of cap rows out in a (arena.h); reset before use. */
void kdraft_state_carve(kdraft_state *s, const k3_eagle_config *c, size_t cap, karena *a);
size_t kdraft_state_bytes(const k3_eagle_config *c, size_t cap);
void kdraft_state_reset(kdraft_state *s);
/* dst becomes src (rows and pending), bit for bit; dst's cap must hold src's rows. */
void kdraft_state_copy(kdraft_state *dst, const kdraft_state *src, const k3_eagle_config *c);

/* ---- after a block: commit --------------------------------------------------- */

/* A segment of the last block whose first n rows were kept: rows [row0,
 * row0 + n) of the run's scratch, target positions [pos, pos + n). */
typedef struct kdraft_seg { kdraft_state *st; size_t row0, n, pos; } kdraft_seg;
/* Each state's pending row (pos - 1) commits with the segment's first token,
 * rows pos .. pos + n - 2 with the token after each, and row pos + n - 1
 * becomes pending.  A state that is not at pos - 1 (a state that began
 * without a drafter) starts its rows at pos.  Reads nothing from disk. */
void kdraft_commit(kdraft *d, const k3_run *r, const kdraft_seg *segs, size_t nseg);
/* g of row `row` of the last block (the fusion of its taps) into out [E]. */
void kdraft_fuse_row(kdraft *d, const k3_run *r, size_t row, float *out);
/* A row of E floats of its own, free between calls (for kdraft_fuse_row's output). */
float *kdraft_spare_row(kdraft *d);
/* Its file's identity: the drafter KPK file's set_id and the XXH3-64 of its config.json (a saved state names the drafter its rows belong to). */
uint64_t kdraft_set_id(const kdraft *d);
uint64_t kdraft_config_xxh3(const kdraft *d);

/* ---- drafting ---------------------------------------------------------------- */

/* Chains for n sessions in lockstep: session i (st[i] has a pending row, at
 * the position before the one token first[i] is sampled for) drafts k[i]
 * tokens into out[i][0 .. k[i]), each the argmax of the drafter's logits (the
 * lowest id on ties).  Its chain rows are scratch: the committed rows and the
 * pending one are unchanged.  n <= the rows it was loaded for; k[i] keeps the
 * chain within st[i]'s cap.  Fails only when an embedding row cannot be read. */
int kdraft_propose(kdraft *d, kdraft_state *const *st, const int32_t *first, const size_t *k, size_t n, int32_t *const *out,
                   krun_err *err);
/* Whether st can draft for the token at target position pos (its pending row is pos - 1). */
static inline int kdraft_ready(const kdraft_state *st, size_t pos) { return st->has_pending && st->n + 1 == pos; }
/* Tests: every kdraft_propose from now on copies chain 0's logits of step j
 * to logits + j * V (room for its k[0] steps); NULL: none. */
void kdraft_set_dump(kdraft *d, float *logits);

/* ---- width by cost (draft_width.c) ---------------------------------------------
 *
 * A verification pass of k drafts runs k + 1 rows: it reads the unpinned
 * trunk (and a streamed lm_head) once, c0 bytes, and the experts the rows
 * choose: in each MoE layer about N (1 - (1 - t/N)^(k+1)) distinct ones of
 * N, top-t each (the union model of docs/RUNTIME.md §4).  With per-depth
 * acceptance a_j (draft j accepted given the ones before it), it yields
 * 1 + sum_{j<=k} prod_{i<=j} a_i tokens (K3_EAGLE §4.6).  The width of a
 * pass is the k that minimises bytes per generated token; 0 when no k pays
 * (the trunk resident and the experts what a row costs, or low acceptance).
 * In a sweep of several sequences (krun serve, krun batch) the trunk is
 * shared and the experts' union is the sweep's: a sequence's pass costs
 * c0 / share plus the experts its rows add to the others' rows_else. */
#define KDRAFT_MAX_WIDTH 64
/* The acceptance a plan assumes for the K3 drafter (per draft, given the ones
 * before it) unless told: the published offline replay, 3.26 / 4.17 / 4.77
 * tokens per pass at 3 / 5 / 7 drafts (K3_EAGLE.md §5), is about 0.85 at each
 * depth. */
#define KDRAFT_PLAN_ACCEPT 0.85

typedef struct kdraft_cost {
    double c0;             /* bytes a pass reads whatever its rows: the unpinned trunk, a streamed lm_head */
    double expert_bytes;   /* one expert's extent */
    int moe_layers, n_experts, topk;
    double share;          /* sequences the sweep's c0 is shared by (0 or 1: alone) */
    double rows_else;      /* rows of the sweep's other sequences (0: alone) */
} kdraft_cost;
/* Bytes a pass of `rows` rows reads (alone), or adds to its sweep. */
double kdraft_pass_bytes(const kdraft_cost *c, size_t rows);
/* Expected tokens of a pass of k drafts at acceptance a[0 .. k). */
double kdraft_expected_tokens(const double *a, size_t k);
/* The cheapest width 0..kmax at acceptance a[0 .. kmax); *tokens and *bytes_per_token of it (may be NULL). */
size_t kdraft_cheapest(const kdraft_cost *c, const double *a, size_t kmax, double *tokens, double *bytes_per_token);

/* Acceptance, tracked online per request: at depth j, how many drafts were
 * verified with every draft before them accepted, and how many of those
 * were accepted -- kept apart for the passes that follow a pass which took
 * every draft it had and for the others, since text comes in easy and hard
 * stretches (after a miss the next drafts are likelier to miss).  A depth's
 * rate is shrunk towards its context's rate over every depth
 * (KDRAFT_DEPTH_WEIGHT passes' worth), that one towards every pass's
 * (KDRAFT_CTX_WEIGHT), that one towards a weak prior (KDRAFT_PRIOR_WEIGHT
 * observations at KDRAFT_PRIOR_ACCEPT): a drafter that is never right stops
 * drafting after a few rejections, one that is right widens as its record
 * grows, and a depth few passes have reached is expected to do as the
 * others do until it has a record of its own.
 * Where no width pays, a probe of one draft every `probe` passes (sized so
 * probes cost at most KDRAFT_PROBE_COST of the bytes) keeps the record
 * current: never worse than 1.03 x the bytes per token of no drafter. */
#define KDRAFT_PRIOR_ACCEPT 0.5
#define KDRAFT_PRIOR_WEIGHT 1.0
#define KDRAFT_CTX_WEIGHT 4.0
#define KDRAFT_DEPTH_WEIGHT 4.0
#define KDRAFT_PROBE_COST 0.01
#define KDRAFT_EXPLORE 16             /* every 16th pass with drafts has one more than pays (at most a row's experts in 16 passes) */
typedef struct kdraft_width {
    /* [context][depth]: context 1 after a pass that took all its drafts, else 0 */
    double seen[2][KDRAFT_MAX_WIDTH], took[2][KDRAFT_MAX_WIDTH];
    int ctx;               /* the next pass's context */
    uint64_t since_probe;  /* passes without a draft since the last one */
    uint64_t since_deeper; /* passes with drafts since the last one a draft deeper than paid */
} kdraft_width;
void kdraft_width_init(kdraft_width *w);
/* The width of the next pass, at most kmax (fixed > 0: that width). */
size_t kdraft_width_next(kdraft_width *w, const kdraft_cost *c, size_t kmax, size_t fixed);
/* What a pass of `drafted` drafts accepted. */
void kdraft_width_result(kdraft_width *w, size_t drafted, size_t accepted);
/* The current estimates a[0 .. n), for the next pass's context. */
void kdraft_width_accept(const kdraft_width *w, double *a, size_t n);

/* ---- RoPE (draft_rope.c) ------------------------------------------------------ */

/* sin and cos of x, the same bits on every machine (no libm). */
void kdraft_sincos(double x, double *s, double *c);
/* Rotate adjacent pairs (2i, 2i+1) of v[dr] by pos * omega[i] (K3_EAGLE §3.7), scaled by mult. */
void kdraft_rope(float *v, size_t dr, const double *omega, double mult, size_t pos);

#endif
