/* The one seam between the forward pass and the weight bytes.
 *
 * Every matrix product of the forward pass names its weight by (layer, role)
 * and goes through wmatmul / wmatmul_many / wmatmul_rows / wmatvec_t below;
 * only this file knows where the bytes are: an extent held whole (mapped,
 * resident, pinned), or pieces of it streaming through the store's ring
 * (store_pieces.h).  A streamed matrix used once per block is multiplied
 * piece by piece as the pieces arrive, rows r0..r1 of Y from rows r0..r1 of
 * W (the same bits: every output is its own dot product, docs/NUMERICS.md),
 * and each piece is given back as soon as its rows are done.
 *
 * The small vectors of a layer (norm weights, the AttnRes folds, conv taps,
 * A_log, biases) are widened to float, and AttnRes folded, ONCE: the first
 * time their bytes are read.  They live in an arena laid out at open
 * (k3_weights_carve), 56.8 MB at full scale (mostly the KDA conv taps),
 * counted in the plan.
 *
 * The order in which the forward pass uses a layer's tensors is the model's
 * (use_order.h): the planner proves from it that the ring's slots suffice,
 * and, on the first pass over a streamed layer, the vectors (and kv_b, read
 * by attention many times) a forward step is about to use are read as soon
 * as the product before them is done.  A streamed product out of that order
 * is refused (the step fails with the roles named), so the declaration
 * cannot silently drift from kda.c / mla.c / moe.c. */
#ifndef KRUN_WEIGHTS_H
#define KRUN_WEIGHTS_H

#include "run/kernels/kernels.h"
#include "run/model/model.h"
#include "run/model/use_order.h"
#include "run/util/arena.h"
#include "run/util/krun_err.h"
#include "run/util/threadpool.h"

struct kstore;

/* One layer's vectors, widened to float.  NULL where the layer has none. */
typedef struct k3_vecs {
    float *in_ln, *post_ln;
    float *f_attn, *f_mlp;                 /* res_norm ⊙ res_proj, folded (spec §4.4) */
    float *qconv, *kconv, *vconv;          /* KDA: [P][Kc] */
    float *a_log, *dt_bias, *o_norm;
    float *qa_ln, *kva_ln;                 /* MLA */
    float *router_bias, *moe_norm;         /* MoE */
    float *final_norm, *f_out;             /* globals: final norm, output aggregator fold */
} k3_vecs;

/* A streamed read that failed inside a product: the product's output is
 * zeros, and k3_weights_end reports it (the step fails, no token is used).
 * The record lives in the run state the planner counts, so it keeps the
 * first failure's code and message (its first 767 characters) only. */
typedef struct k3_wfail { int failed; int code; char msg[768]; } k3_wfail;

typedef struct k3_weights {
    const k3_model *m;
    struct kstore *store;      /* NULL until k3_weights_setup */
    k3_vecs *vec;              /* [n_layers + 1]; the globals at [n_layers] */
    uint8_t *bound;            /* [n_layers + 1]: vectors widened */
    const uint8_t **raw;       /* [n_layers + 1]: the extent's bytes while it is attached whole */
    uint64_t *first;           /* [n_layers + 1]: which extent offset raw[0] is */
    float *fold_tmp;           /* [hidden] */
    k3_use_step *order;        /* [(n_layers + 1) * K3T_COUNT]: k3_use_order of each layer */
    uint8_t *norder;           /* [n_layers + 1] */
    uint16_t *cursor;          /* [n_layers + 1]: the next step of a streamed layer's order */
    const uint8_t **held;      /* [(n_layers + 1) * K3T_COUNT]: a streamed tensor in one piece, while held */
    k3_wfail *fail;
} k3_weights;

/* Lay the vectors of every layer out in a (arena.h).  Sizes come from the
 * config's tensor schema, so the planner needs no file. */
void k3_weights_carve(k3_weights *w, const k3_config *c, karena *a);
/* After carving over the allocation: the model, the store (its plan decides
 * what streams), the use orders. */
void k3_weights_setup(k3_weights *w, const k3_model *m, struct kstore *store);

/* The extent of layer L (or K3_GLOBALS) is held at raw; raw[0] is its byte
 * `first` (the globals are held without the embedding, and without lm_head
 * when it streams).  Widens the layer's vectors the first time. */
void k3_weights_attach(k3_weights *w, int L, const uint8_t *raw, uint64_t first);
void k3_weights_detach(k3_weights *w, int L);
const k3_vecs *k3_weights_vecs(const k3_weights *w, int L);

/* A forward block starts (the ring is at the first piece of a step). */
int k3_weights_step_begin(k3_weights *w, krun_err *err);
/* A forward block is over: were the bytes it read the file's as it was opened?  -1 with err
 * (KRUN_EDATA) when the model file changed (written, truncated: store.h, kstore_file_changed),
 * whatever err held; 0 otherwise, err untouched. */
int k3_weights_step_check(const k3_weights *w, krun_err *err);
/* Layer L's weights are about to be used: a held extent is fetched and
 * attached, a streamed one starts its pass (its first vectors read when not
 * yet bound).  K3_GLOBALS: lm_head's pass, when it streams. */
int k3_weights_begin(k3_weights *w, int L, krun_err *err);
/* Layer L is done: a held extent is given back; a streamed one has the rest
 * of its pieces read and its checksum checked.  Fails when anything read for
 * the layer was bad (including inside a product): its results must not be used. */
int k3_weights_end(k3_weights *w, int L, krun_err *err);

/* Routed experts of layer L through the store, at most the store's expert
 * capacity at a time: request starts reading experts[0..n) (their extents are
 * written to extent[0..n)); every one is given back with
 * k3_weights_experts_release, even after a failure.  ready binds one of them
 * (its extent) once its own bytes are in and checked, so that it is computed
 * while the disks still read the rest. */
int k3_weights_experts_request(k3_weights *w, int L, const int *experts, size_t n, uint32_t *extent, krun_err *err);
int k3_weights_expert_ready(k3_weights *w, int L, uint32_t extent, k3_expert_w *out, krun_err *err);
void k3_weights_experts_release(k3_weights *w, int L, const int *experts, size_t n);

/* Weight (L, role) as a matrix; rows [r0, r1) of it as a matrix of r1 - r0
 * rows.  For tensors held whole (never a streamed K3U_ONCE matrix). */
/* For a reader outside the declared order (the prediction, run/engine/predict.c):
 * tensor (L, role) when layer L is held whole right now, else NULL (it
 * streams); whether layer L's vectors have been bound (its first pass is
 * done); a matrix over bytes the caller read itself. */
const uint8_t *k3_weights_whole(const k3_weights *w, int L, k3_role role);
int k3_weights_bound(const k3_weights *w, int L);
kmat k3_mat_of(const kt_loc *l, const uint8_t *data);
kmat wmat(const k3_weights *w, int L, k3_role role);
kmat wmat_rows(const k3_weights *w, int L, k3_role role, size_t r0, size_t r1);

/* Y[t][r] = W(L, role) row r . X[t], t < T (kmatmul, split over the pool). */
void wmatmul(kpool *pool, const k3_weights *w, int L, k3_role role, const float *X, size_t ldx, size_t T, float *Y,
             size_t ldy);
/* The same product for several inputs at once, each into its own output:
 * a streamed matrix is read once for all of them (lm_head for the segments
 * of a block). */
typedef struct wcall { const float *X; size_t ldx, T; float *Y; size_t ldy; } wcall;
void wmatmul_many(kpool *pool, const k3_weights *w, int L, k3_role role, const wcall *calls, size_t n);
/* The same for rows [r0, r1) only: Y[t][r - r0], on the calling thread. */
void wmatmul_rows(const k3_weights *w, int L, k3_role role, size_t r0, size_t r1, const float *X, size_t ldx, size_t T,
                  float *Y, size_t ldy);
/* y[c] = sum over r in [r0, r1) of W(L, role)[r][c] * x[r - r0] (kmatvec_t). */
void wmatvec_t(const k3_weights *w, int L, k3_role role, size_t r0, size_t r1, const float *x, float *y);

#endif
