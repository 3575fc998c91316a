/* The K3 forward pass, top to bottom (spec §4).
 *
 * A block of T new positions goes through one layer at a time: the layer's
 * trunk extent is fetched once and applied to all T positions as matrix x
 * matrix, its chosen experts are fetched once each, and the sequential state
 * (KDA, ShortConv, MLA cache) is advanced position by position inside. */
#include "forward.h"

#include "ablate.h"
#include "layers.h"
#include "ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- fetching experts through the store ------------------------------------ */

struct expert_ctx {
    k3_run *r;
    uint32_t *ids;
};

static int fetch_experts(void *p, int L, const int *experts, size_t n, k3_expert_w *out, char *err, size_t errlen)
{
    struct expert_ctx *x = p;
    const k3_model *m = x->r->model;
    const uint8_t *raw[256];
    kpk_err e = {0};
    if (n > 256) { snprintf(err, errlen, "expert batch too large"); return -1; }
    for (size_t i = 0; i < n; i++) {
        int64_t id = k3_expert_extent(m, L, experts[i]);
        if (id < 0) { snprintf(err, errlen, "layer %d expert %d: no such extent", L, experts[i]); return -1; }
        x->ids[i] = (uint32_t)id;
    }
    if (kstore_get_many(x->r->store, x->ids, n, raw, &e)) { snprintf(err, errlen, "%s", e.msg); return -1; }
    for (size_t i = 0; i < n; i++)
        if (k3_bind_expert(m, L, experts[i], raw[i], &out[i], err, errlen)) return -1;
    x->r->expert_uses += n;
    return 0;
}

static void release_experts(void *p, int L, const int *experts, size_t n)
{
    struct expert_ctx *x = p;
    for (size_t i = 0; i < n; i++) kstore_put(x->r->store, (uint32_t)k3_expert_extent(x->r->model, L, experts[i]));
}

/* ---- setup -------------------------------------------------------------------- */

int k3_run_init(k3_run *r, k3_model *m, kstore *store, kpool *pool, size_t ctx, char *err, size_t errlen)
{
    kpk_err e = {0};
    memset(r, 0, sizeof *r);
    r->model = m;
    r->store = store;
    r->pool = pool;
    r->expert_batch = kstore_expert_capacity(store) < 256 ? kstore_expert_capacity(store) : 256;
    if (k3_state_init(&r->state, &m->cfg, ctx)) { snprintf(err, errlen, "out of memory for the decoding state"); return -1; }
    r->globals_raw = kstore_get(store, m->globals_extent, &e);
    if (!r->globals_raw) { snprintf(err, errlen, "%s", e.msg); k3_state_free(&r->state); return -1; }
    if (k3_bind_globals(m, r->globals_raw, &r->globals, err, errlen)) {
        kstore_put(store, m->globals_extent);
        k3_state_free(&r->state);
        return -1;
    }
    return 0;
}

void k3_run_free(k3_run *r)
{
    if (r->globals_raw) {
        k3_unbind_globals(&r->globals);
        kstore_put(r->store, r->model->globals_extent);
    }
    k3_state_free(&r->state);
    memset(r, 0, sizeof *r);
}

/* One embedding row, read from the file on demand: the table (2.35 GB at
 * full scale) is never held. */
static int embed_row(k3_run *r, int32_t id, float *out, char *err, size_t errlen)
{
    const k3_model *m = r->model;
    const size_t E = (size_t)m->cfg.hidden;
    const int dtype = r->globals.embed_dtype;
    const size_t rowb = E * kpk_dtype_size(dtype);
    uint8_t buf[16384], *row = rowb <= sizeof buf ? buf : malloc(rowb);
    kpk_err e = {0};
    if (!row) { snprintf(err, errlen, "out of memory"); return -1; }
    if (kstore_read(r->store, m->globals_extent, m->globals[K3T_EMBED].offset + (uint64_t)id * rowb, rowb, row, &e)) {
        snprintf(err, errlen, "%s", e.msg);
        if (row != buf) free(row);
        return -1;
    }
    k3_widen(row, dtype, E, out);
    if (row != buf) free(row);
    return 0;
}

/* ---- the forward pass ------------------------------------------------------- */

int k3_forward(k3_run *r, const int32_t *ids, size_t T, int all_positions, float *logits, char *err, size_t errlen)
{
    const k3_model *m = r->model;
    const k3_config *c = &m->cfg;
    const size_t E = (size_t)c->hidden, V = (size_t)c->vocab;
    const size_t max_src = (size_t)(c->n_layers / c->attn_res_block) + 2;
    const size_t pos0 = r->state.pos;
    float *snap = NULL, *P = NULL, *a = NULL, *xn = NULL, *y = NULL;
    const float **src = NULL;
    size_t nsnap = 0;
    int prefix_empty = 0, rc = -1;
    uint32_t expert_ids[256];
    struct expert_ctx ectx = {r, expert_ids};
    k3_expert_source esrc = {&ectx, r->expert_batch < 256 ? r->expert_batch : 256, fetch_experts, release_experts};
    kpk_err e = {0};

    if (T == 0) { snprintf(err, errlen, "no tokens to process"); return -1; }
    if (pos0 + T > r->state.ctx) {
        snprintf(err, errlen, "context full: %zu positions reserved, %zu needed", r->state.ctx, pos0 + T);
        return -1;
    }
    for (size_t t = 0; t < T; t++)
        if (ids[t] < 0 || (size_t)ids[t] >= V) { snprintf(err, errlen, "token id %d is outside the vocabulary (0..%zu)", ids[t], V - 1); return -1; }

    snap = malloc(T * max_src * E * sizeof *snap);   /* B: the block snapshots of each position */
    P = malloc(T * E * sizeof *P);                   /* the running block prefix */
    a = malloc(T * E * sizeof *a);
    xn = malloc(T * E * sizeof *xn);
    y = malloc(T * E * sizeof *y);
    src = malloc((max_src + 1) * sizeof *src);
    if (!snap || !P || !a || !xn || !y || !src) { snprintf(err, errlen, "out of memory"); goto out; }

    /* §4.3: the embedding is the first hidden state; no scaling, no positions */
    for (size_t t = 0; t < T; t++)
        if (embed_row(r, ids[t], P + t * E, err, errlen)) goto out;

    for (int L = 0; L < c->n_layers; L++) {
        k3_layer_w w;
        const uint8_t *raw = kstore_get(r->store, m->trunk_extent[L], &e);
        const float *f_attn, *f_mlp;
        if (!raw) { snprintf(err, errlen, "%s", e.msg); goto out; }
        if (k3_bind_layer(m, L, raw, &w, err, errlen)) { kstore_put(r->store, m->trunk_extent[L]); goto out; }
        f_attn = ABLATED(ATTNRES_FOLDS_SWAPPED) ? w.f_mlp : w.f_attn;
        f_mlp = ABLATED(ATTNRES_FOLDS_SWAPPED) ? w.f_attn : w.f_mlp;

        /* §4.4 steps 1-2: a = AR(B, P) over the snapshots and the prefix (h = P here);
         * with no snapshot yet (layer 0) a = h. */
        for (size_t t = 0; t < T; t++) {
            float *Pt = P + t * E;
            if (nsnap == 0) { memcpy(a + t * E, Pt, E * sizeof *a); continue; }
            for (size_t j = 0; j < nsnap; j++) src[j] = snap + (t * max_src + j) * E;
            src[nsnap] = Pt;
            op_attnres(a + t * E, src, nsnap + 1, f_attn, E, c->rms_eps);
        }
        /* step 3: at a block boundary the prefix becomes a snapshot and is cleared */
        if (L % c->attn_res_block == 0 && !(ABLATED(ATTNRES_NO_EMBED_SOURCE) && L == 0)) {
            for (size_t t = 0; t < T; t++) memcpy(snap + (t * max_src + nsnap) * E, P + t * E, E * sizeof *P);
            nsnap++;
            prefix_empty = !ABLATED(ATTNRES_NO_CLEAR);
        }
        /* step 4: attention on the normalised aggregate */
        for (size_t t = 0; t < T; t++) op_rmsnorm(xn + t * E, a + t * E, w.in_ln, E, c->rms_eps);
        if (w.mla) rc = mla_forward(c, &w, r->pool, xn, T, y, r->state.mla_cache[L], pos0);
        else rc = kda_forward(c, &w, r->pool, xn, T, y, r->state.kda_S[L], r->state.kda_conv[L]);
        if (rc) { snprintf(err, errlen, "layer %d: out of memory in attention", L); goto layer_fail; }
        rc = -1;
        /* step 5 */
        if (prefix_empty) memcpy(P, y, T * E * sizeof *P);
        else for (size_t i = 0; i < T * E; i++) P[i] = P[i] + y[i];
        prefix_empty = 0;
        /* step 6: m = AR(B, P), unconditionally */
        for (size_t t = 0; t < T; t++) {
            for (size_t j = 0; j < nsnap; j++) src[j] = snap + (t * max_src + j) * E;
            src[nsnap] = P + t * E;
            op_attnres(a + t * E, src, nsnap + 1, f_mlp, E, c->rms_eps);
            op_rmsnorm(xn + t * E, a + t * E, w.post_ln, E, c->rms_eps);
        }
        /* step 7: the FFN */
        if (w.moe) {
            if (moe_forward(c, &w, r->pool, &esrc, xn, T, y, NULL, err, errlen)) {
                char tmp[600];
                snprintf(tmp, sizeof tmp, "layer %d: %s", L, err);
                snprintf(err, errlen, "%s", tmp);
                goto layer_fail;
            }
        } else if (dense_ffn_forward(c, &w, r->pool, xn, T, y)) {
            snprintf(err, errlen, "layer %d: out of memory in the FFN", L);
            goto layer_fail;
        }
        /* step 8: the next layer's h is P */
        for (size_t i = 0; i < T * E; i++) P[i] = P[i] + y[i];
        k3_unbind_layer(&w);
        kstore_put(r->store, m->trunk_extent[L]);
        continue;
layer_fail:
        k3_unbind_layer(&w);
        kstore_put(r->store, m->trunk_extent[L]);
        goto out;
    }

    /* §4.9: the model-level aggregator, the final norm and lm_head */
    {
        size_t t0 = all_positions ? 0 : T - 1;
        kmat head = r->globals.lm_head;
        if (ABLATED(LM_HEAD_TIED)) head.data = r->globals.embed;
        for (size_t t = t0; t < T; t++) {
            for (size_t j = 0; j < nsnap; j++) src[j] = snap + (t * max_src + j) * E;
            src[nsnap] = P + t * E;
            if (ABLATED(NO_OUTPUT_AGGREGATOR)) memcpy(a + t * E, P + t * E, E * sizeof *a);
            else op_attnres(a + t * E, src, nsnap + 1, r->globals.f_out, E, c->rms_eps);
            op_rmsnorm(xn + t * E, a + t * E, r->globals.final_norm, E, c->rms_eps);
        }
        kmatmul(r->pool, &head, xn + t0 * E, E, T - t0, logits, V);
    }
    r->state.pos += T;
    rc = 0;
out:
    free(snap); free(P); free(a); free(xn); free(y); free(src);
    return rc;
}
