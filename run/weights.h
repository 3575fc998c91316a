/* The one seam between the forward pass and the weight bytes.
 *
 * Every matrix product of the forward pass names its weight by (layer, role)
 * and goes through wmatmul / wmatmul_rows / wmatvec_t below; only this file
 * knows where the bytes are (an extent the store holds: mapped, resident, or
 * in a ring slot).  Streaming an extent in pieces changes what is under this
 * seam (and the store), not the forward pass.
 *
 * The small vectors of a layer (norm weights, the AttnRes folds, conv taps,
 * A_log, biases) are widened to float, and AttnRes folded, ONCE: the first
 * time the layer's extent is handed out verified.  They live in an arena laid
 * out at open (k3_weights_carve), 56.8 MB at full scale (mostly the KDA conv
 * taps), counted in the plan. */
#ifndef KRUN_WEIGHTS_H
#define KRUN_WEIGHTS_H

#include "arena.h"
#include "kernels.h"
#include "model.h"
#include "threadpool.h"

#define K3_GLOBALS (-1)        /* the "layer" of the globals extent */

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

typedef struct k3_weights {
    const k3_model *m;
    k3_vecs *vec;              /* [n_layers + 1]; the globals at [n_layers] */
    uint8_t *bound;            /* [n_layers + 1]: vectors widened */
    const uint8_t **raw;       /* [n_layers + 1]: the extent's bytes while it is attached */
    uint64_t *first;           /* [n_layers + 1]: which extent offset raw[0] is */
    float *fold_tmp;           /* [hidden] */
} k3_weights;

/* Lay the vectors of every layer out in a (arena.h).  Sizes come from the
 * config's tensor schema, so the planner needs no file. */
void k3_weights_carve(k3_weights *w, const k3_config *c, karena *a);

/* The extent of layer L (or K3_GLOBALS) is held at raw; raw[0] is its byte
 * `first` (the globals are held without the embedding).  Widens the layer's
 * vectors the first time. */
void k3_weights_attach(k3_weights *w, int L, const uint8_t *raw, uint64_t first);
void k3_weights_detach(k3_weights *w, int L);
const k3_vecs *k3_weights_vecs(const k3_weights *w, int L);

/* Weight (L, role) as a matrix; rows [r0, r1) of it as a matrix of r1 - r0 rows. */
kmat wmat(const k3_weights *w, int L, k3_role role);
kmat wmat_rows(const k3_weights *w, int L, k3_role role, size_t r0, size_t r1);

/* Y[t][r] = W(L, role) row r . X[t], t < T (kmatmul, split over the pool). */
void wmatmul(kpool *pool, const k3_weights *w, int L, k3_role role, const float *X, size_t ldx, size_t T, float *Y,
             size_t ldy);
/* The same for rows [r0, r1) only: Y[t][r - r0], on the calling thread. */
void wmatmul_rows(const k3_weights *w, int L, k3_role role, size_t r0, size_t r1, const float *X, size_t ldx, size_t T,
                  float *Y, size_t ldy);
/* y[c] = sum over r in [r0, r1) of W(L, role)[r][c] * x[r - r0] (kmatvec_t). */
void wmatvec_t(const k3_weights *w, int L, k3_role role, size_t r0, size_t r1, const float *x, float *y);

#endif
