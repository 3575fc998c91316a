/* Binding weights once, and the seam every matrix product goes through. */
#include "weights.h"

#include "run/store/store.h"

#include <stdio.h>
#include <string.h>

/* the globals' vectors, widened from the held part */
static const k3_role GLOBAL_VECS[] = {K3T_FINAL_NORM, K3T_OUT_RES_NORM, K3T_OUT_RES_PROJ};

/* ---- the arena ------------------------------------------------------------------------- */

/* Elements of tensor (role, layer) in this config; 0 when the layer has none. */
static size_t elems(const k3_config *c, k3_role role, int L)
{
    k3_tensor_spec s;
    size_t n = 1;
    if (k3_schema_spec(c, role, L, -1, &s)) return 0;
    for (int d = 0; d < s.ndim; d++) n *= (size_t)s.shape[d];
    return n;
}

static float *take(karena *a, const k3_config *c, k3_role role, int L)
{
    size_t n = elems(c, role, L);
    float *p;
    if (!n) return NULL;
    KTAKE(a, p, n);
    return p;
}

void k3_weights_carve(k3_weights *w, const k3_config *c, karena *a)
{
    const size_t NL = (size_t)c->n_layers;
    memset(w, 0, sizeof *w);
    KTAKE(a, w->vec, NL + 1);
    KTAKE(a, w->bound, NL + 1);
    KTAKE(a, w->raw, NL + 1);
    KTAKE(a, w->first, NL + 1);
    KTAKE(a, w->fold_tmp, (size_t)c->hidden);
    KTAKE(a, w->order, (NL + 1) * K3T_COUNT);
    KTAKE(a, w->norder, NL + 1);
    KTAKE(a, w->cursor, NL + 1);
    KTAKE(a, w->held, (NL + 1) * K3T_COUNT);
    KTAKE(a, w->fail, 1);
    for (int L = 0; L < (int)NL; L++) {
        k3_vecs v;
        memset(&v, 0, sizeof v);
        v.in_ln = take(a, c, K3T_INPUT_LN, L);
        v.post_ln = take(a, c, K3T_POST_ATTN_LN, L);
        v.f_attn = take(a, c, K3T_ATTN_RES_NORM, L);
        v.f_mlp = take(a, c, K3T_MLP_RES_NORM, L);
        v.qconv = take(a, c, K3T_KDA_QCONV, L);
        v.kconv = take(a, c, K3T_KDA_KCONV, L);
        v.vconv = take(a, c, K3T_KDA_VCONV, L);
        v.a_log = take(a, c, K3T_KDA_ALOG, L);
        v.dt_bias = take(a, c, K3T_KDA_DTBIAS, L);
        v.o_norm = take(a, c, K3T_KDA_ONORM, L);
        v.qa_ln = take(a, c, K3T_MLA_QA_NORM, L);
        v.kva_ln = take(a, c, K3T_MLA_KVA_NORM, L);
        v.router_bias = take(a, c, K3T_MOE_BIAS, L);
        v.moe_norm = take(a, c, K3T_MOE_NORM, L);
        if (a->base) w->vec[L] = v;
    }
    {
        k3_vecs g;
        memset(&g, 0, sizeof g);
        g.final_norm = take(a, c, K3T_FINAL_NORM, -1);
        g.f_out = take(a, c, K3T_OUT_RES_NORM, -1);
        if (a->base) {
            w->vec[NL] = g;
            memset(w->bound, 0, NL + 1);
            memset(w->raw, 0, (NL + 1) * sizeof *w->raw);
            memset(w->first, 0, (NL + 1) * sizeof *w->first);
            memset(w->cursor, 0, (NL + 1) * sizeof *w->cursor);
            memset(w->held, 0, (NL + 1) * K3T_COUNT * sizeof *w->held);
            memset(w->fail, 0, sizeof *w->fail);
        }
    }
}

static size_t slot(const k3_weights *w, int L) { return L == K3_GLOBALS ? (size_t)w->m->cfg.n_layers : (size_t)L; }

void k3_weights_setup(k3_weights *w, const k3_model *m, struct kstore *store)
{
    w->m = m;
    w->store = store;
    for (int L = -1; L < m->cfg.n_layers; L++) {
        size_t s = slot(w, L);
        w->norder[s] = (uint8_t)k3_use_order(m, L, w->order + s * K3T_COUNT);
    }
}

static const kt_loc *loc_of(const k3_weights *w, int L, k3_role role)
{
    return L == K3_GLOBALS ? &w->m->globals[role] : &w->m->trunk[(size_t)L * K3T_COUNT + role];
}

/* Where tensor (L, role) is right now: held whole from a streamed piece, or in the attached extent. */
static const uint8_t *bytes_of(const k3_weights *w, int L, k3_role role)
{
    size_t k = slot(w, L);
    const kt_loc *l = loc_of(w, L, role);
    if (w->held[k * K3T_COUNT + role]) return w->held[k * K3T_COUNT + role];
    return w->raw[k] ? w->raw[k] + (l->offset - w->first[k]) : NULL; /* NULL: a streamed read failed */
}

static size_t loc_elems(const kt_loc *l) { return (size_t)(l->nbytes / kpk_dtype_size(l->dtype)); }

/* ---- vectors: widened once ---------------------------------------------------------------- */

/* Widen vector (L, role) held at p into its place; a res_proj is folded into
 * the res_norm widened before it (spec §4.4: f = norm ⊙ proj). */
static void bind_role(const k3_weights *w, int L, k3_role role, const uint8_t *p)
{
    k3_vecs *v = &w->vec[slot(w, L)];
    const kt_loc *l = loc_of(w, L, role);
    float *dst = NULL, *fold = NULL;
    switch (role) {
    case K3T_INPUT_LN: dst = v->in_ln; break;
    case K3T_POST_ATTN_LN: dst = v->post_ln; break;
    case K3T_ATTN_RES_NORM: dst = v->f_attn; break;
    case K3T_ATTN_RES_PROJ: fold = v->f_attn; break;
    case K3T_MLP_RES_NORM: dst = v->f_mlp; break;
    case K3T_MLP_RES_PROJ: fold = v->f_mlp; break;
    case K3T_KDA_QCONV: dst = v->qconv; break;
    case K3T_KDA_KCONV: dst = v->kconv; break;
    case K3T_KDA_VCONV: dst = v->vconv; break;
    case K3T_KDA_ALOG: dst = v->a_log; break;
    case K3T_KDA_DTBIAS: dst = v->dt_bias; break;
    case K3T_KDA_ONORM: dst = v->o_norm; break;
    case K3T_MLA_QA_NORM: dst = v->qa_ln; break;
    case K3T_MLA_KVA_NORM: dst = v->kva_ln; break;
    case K3T_MOE_BIAS: dst = v->router_bias; break;
    case K3T_MOE_NORM: dst = v->moe_norm; break;
    case K3T_FINAL_NORM: dst = v->final_norm; break;
    case K3T_OUT_RES_NORM: dst = v->f_out; break;
    case K3T_OUT_RES_PROJ: fold = v->f_out; break;
    default: return;
    }
    if (!l->nbytes) return;
    if (dst) k3_widen(p, l->dtype, loc_elems(l), dst);
    if (fold) {
        const size_t E = (size_t)w->m->cfg.hidden;
        k3_widen(p, l->dtype, E, w->fold_tmp);
        for (size_t i = 0; i < E; i++) fold[i] = fold[i] * w->fold_tmp[i];
    }
}

void k3_weights_attach(k3_weights *w, int L, const uint8_t *raw, uint64_t first)
{
    size_t k = slot(w, L);
    w->raw[k] = raw;
    w->first[k] = first;
    if (w->bound[k]) return;
    if (L == K3_GLOBALS) {
        for (size_t i = 0; i < sizeof GLOBAL_VECS / sizeof GLOBAL_VECS[0]; i++)
            bind_role(w, L, GLOBAL_VECS[i], bytes_of(w, L, GLOBAL_VECS[i]));
    } else {
        const k3_use_step *o = w->order + k * K3T_COUNT;
        for (int i = 0; i < w->norder[k]; i++)
            if (o[i].use == K3U_VEC) bind_role(w, L, (k3_role)o[i].role, bytes_of(w, L, (k3_role)o[i].role));
    }
    w->bound[k] = 1;
}

void k3_weights_detach(k3_weights *w, int L) { w->raw[slot(w, L)] = NULL; }

const k3_vecs *k3_weights_vecs(const k3_weights *w, int L) { return &w->vec[slot(w, L)]; }

/* ---- streamed layers ---------------------------------------------------------------------- */

static const kring *ring_of(const k3_weights *w) { return w->store ? kstore_ring(w->store) : NULL; }

/* Layer L (K3_GLOBALS: lm_head) streams in the store's phase right now: the
 * layers a prefill block borrows back stream only then (store.h, kstore_phase). */
static int streamed(const k3_weights *w, int L) { return w->store && kstore_streams(w->store, (int)slot(w, L)); }

/* The parts of (L, role) in the ring; NULL (and *n = 0) when it is not streamed. */
static const kpart *parts_of(const k3_weights *w, int L, k3_role role, uint32_t *n)
{
    const kring *r = ring_of(w);
    size_t t;
    *n = 0;
    if (!r || !streamed(w, L)) return NULL;
    t = slot(w, L) * K3T_COUNT + role;
    *n = r->tnparts[t];
    return *n ? r->part + r->tpart0[t] : NULL;
}

/* Tensor (L, role) in one held piece: where its first byte is. */
static const uint8_t *piece_tensor(const k3_weights *w, int L, k3_role role, const kpart *q, const uint8_t *data)
{
    const kring *r = ring_of(w);
    return data + (loc_of(w, L, role)->offset - r->piece[q->piece].r0);
}

static void fail_with(const k3_weights *w, const krun_err *e)
{
    if (w->fail->failed) return;
    w->fail->failed = 1;
    w->fail->code = e->code;
    snprintf(w->fail->msg, sizeof w->fail->msg, "%s", e->msg);
}

/* Read, on the layer's first pass, the vectors and held matrices the forward
 * pass uses before its next product: the order says which. */
static void advance(const k3_weights *w, int L)
{
    const size_t k = slot(w, L);
    const k3_use_step *o = w->order + k * K3T_COUNT;
    while (w->cursor[k] < w->norder[k] && o[w->cursor[k]].use != K3U_ONCE && !w->fail->failed) {
        const k3_use_step *st = &o[w->cursor[k]];
        uint32_t n;
        const kpart *q = parts_of(w, L, (k3_role)st->role, &n);
        if (n && (st->use == K3U_MULTI || !w->bound[k])) {
            krun_err e = {0};
            const uint8_t *d = kstore_piece(w->store, q->piece, &e);
            if (!d) { fail_with(w, &e); return; }
            if (st->use == K3U_VEC) {
                bind_role(w, L, (k3_role)st->role, piece_tensor(w, L, (k3_role)st->role, q, d));
                kstore_piece_done(w->store, q->piece);
            } else {
                w->held[k * K3T_COUNT + st->role] = piece_tensor(w, L, (k3_role)st->role, q, d);
            }
        }
        w->cursor[k]++;
    }
}

int k3_weights_step_begin(k3_weights *w, krun_err *err)
{
    w->fail->failed = 0;
    return ring_of(w) ? kstore_ring_step(w->store, err) : 0;
}

int k3_weights_step_check(const k3_weights *w, krun_err *err)
{
    return w->store ? kstore_file_changed(w->store, err) : 0;
}

int k3_weights_begin(k3_weights *w, int L, krun_err *err)
{
    const size_t k = slot(w, L);
    if (streamed(w, L)) {
        w->cursor[k] = 0;
        if (kstore_ring_begin(w->store, (int)k, !w->bound[k], err)) return -1;
        advance(w, L);
        if (w->fail->failed) return krun_err_set(err, w->fail->code, "%s", w->fail->msg);
        return 0;
    }
    if (L != K3_GLOBALS) {
        uint64_t first = 0;
        const uint8_t *raw = kstore_get(w->store, w->m->trunk_extent[L], &first, err);
        if (!raw) return -1;
        k3_weights_attach(w, L, raw, first);
    }
    return 0;
}

int k3_weights_end(k3_weights *w, int L, krun_err *err)
{
    const size_t k = slot(w, L);
    if (!streamed(w, L)) {
        if (L != K3_GLOBALS) {
            k3_weights_detach(w, L);
            kstore_put(w->store, w->m->trunk_extent[L]);
        }
        return 0;
    }
    for (int r = 0; r < K3T_COUNT; r++) w->held[k * K3T_COUNT + r] = NULL;
    if (!w->fail->failed) {
        krun_err e = {0};
        if (w->cursor[k] != w->norder[k]) {
            const k3_use_step *o = w->order + k * K3T_COUNT;
            krun_err_set(&e, KRUN_EDATA, "internal: layer %d: the forward pass did not use role %d, which use_order.c's use "
                         "order lists next (k3_use_order must follow the forward pass)", L, o[w->cursor[k]].role);
            fail_with(w, &e);
        } else if (kstore_ring_end(w->store, (int)k, &e)) {
            fail_with(w, &e);
        }
    }
    if (w->fail->failed) return krun_err_set(err, w->fail->code, "%s", w->fail->msg);
    w->bound[k] = 1;
    return 0;
}

/* ---- routed experts --------------------------------------------------------------- */

int k3_weights_experts_request(k3_weights *w, int L, const int *experts, size_t n, uint32_t *extent, krun_err *err)
{
    const k3_model *m = w->m;
    for (size_t i = 0; i < n; i++) {
        int64_t id = k3_expert_extent(m, L, experts[i]);
        if (id < 0) { krun_err_set(err, KRUN_EDATA, "%s: layer %d expert %d: no such extent", kpk_path(m->file), L, experts[i]); return -1; }
        extent[i] = (uint32_t)id;
    }
    return kstore_experts_request(w->store, extent, n, err);
}

int k3_weights_expert_ready(k3_weights *w, int L, uint32_t extent, k3_expert_w *out, krun_err *err)
{
    const uint8_t *p = kstore_expert_wait(w->store, extent, err);
    if (!p) return -1;
    k3_bind_expert(w->m, L, p, out);
    return 0;
}

void k3_weights_experts_release(k3_weights *w, int L, const int *experts, size_t n)
{
    for (size_t i = 0; i < n; i++) kstore_put(w->store, (uint32_t)k3_expert_extent(w->m, L, experts[i]));
}

/* ---- the seam ------------------------------------------------------------------ */

static kd_type kd_of(int dtype)
{
    switch (dtype) {
    case KPK_DT_BF16: return KD_BF16;
    case KPK_DT_F16: return KD_F16;
    default: return KD_F32;
    }
}

static kmat mat_at(const kt_loc *l, const uint8_t *data)
{
    kmat k;
    memset(&k, 0, sizeof k);
    k.type = kd_of(l->dtype);
    k.rows = (size_t)l->shape[0];
    k.cols = (size_t)l->shape[1];
    k.data = data;
    return k;
}

kmat wmat(const k3_weights *w, int L, k3_role role) { return mat_at(loc_of(w, L, role), bytes_of(w, L, role)); }

kmat k3_mat_of(const kt_loc *l, const uint8_t *data) { return mat_at(l, data); }

const uint8_t *k3_weights_whole(const k3_weights *w, int L, k3_role role)
{
    return streamed(w, L) ? NULL : bytes_of(w, L, role);
}

int k3_weights_bound(const k3_weights *w, int L) { return w->bound[slot(w, L)]; }

kmat wmat_rows(const k3_weights *w, int L, k3_role role, size_t r0, size_t r1)
{
    kmat k = wmat(w, L, role);
    if (!k.data) return k;
    k.data = (const uint8_t *)k.data + r0 * k.cols * (size_t)kpk_dtype_size(loc_of(w, L, role)->dtype);
    k.rows = r1 - r0;
    return k;
}

static void zero_out(const kt_loc *l, const wcall *calls, size_t n)
{
    for (size_t c = 0; c < n; c++)
        for (size_t t = 0; t < calls[c].T; t++) memset(calls[c].Y + t * calls[c].ldy, 0, (size_t)l->shape[0] * sizeof(float));
}

/* A streamed matrix used once: each piece's rows as it arrives, for every call. */
static void matmul_streamed(kpool *pool, const k3_weights *w, int L, k3_role role, const wcall *calls, size_t n)
{
    const size_t k = slot(w, L);
    const kt_loc *l = loc_of(w, L, role);
    const k3_use_step *o = w->order + k * K3T_COUNT;
    const size_t rowb = (size_t)(l->nbytes / l->shape[0]);
    uint32_t np;
    const kpart *q = parts_of(w, L, role, &np);
    if (w->fail->failed) { zero_out(l, calls, n); return; }
    if (w->cursor[k] >= w->norder[k] || o[w->cursor[k]].role != role) {
        krun_err e;
        krun_err_set(&e, KRUN_EDATA, "internal: layer %d: the forward pass multiplied role %d where use_order.c's use order "
                     "lists role %d (k3_use_order must follow the forward pass)", L, role,
                     w->cursor[k] < w->norder[k] ? o[w->cursor[k]].role : -1);
        fail_with(w, &e);
        zero_out(l, calls, n);
        return;
    }
    for (uint32_t j = 0; j < np; j++) {
        krun_err e = {0};
        const uint8_t *d = kstore_piece(w->store, q[j].piece, &e);
        kmat m;
        if (!d) { fail_with(w, &e); zero_out(l, calls, n); return; }
        m = mat_at(l, piece_tensor(w, L, role, &q[j], d) + q[j].row0 * rowb);
        m.rows = (size_t)(q[j].row1 - q[j].row0);
        for (size_t c = 0; c < n; c++) kmatmul(pool, &m, calls[c].X, calls[c].ldx, calls[c].T, calls[c].Y + q[j].row0, calls[c].ldy);
        kstore_piece_done(w->store, q[j].piece);
    }
    w->cursor[k]++;
    advance(w, L);
}

void wmatmul_many(kpool *pool, const k3_weights *w, int L, k3_role role, const wcall *calls, size_t n)
{
    uint32_t np;
    kmat k;
    if (parts_of(w, L, role, &np) && !w->held[slot(w, L) * K3T_COUNT + role]) {
        matmul_streamed(pool, w, L, role, calls, n);
        return;
    }
    k = wmat(w, L, role);
    if (!k.data) { zero_out(loc_of(w, L, role), calls, n); return; }
    for (size_t c = 0; c < n; c++) kmatmul(pool, &k, calls[c].X, calls[c].ldx, calls[c].T, calls[c].Y, calls[c].ldy);
}

void wmatmul(kpool *pool, const k3_weights *w, int L, k3_role role, const float *X, size_t ldx, size_t T, float *Y,
             size_t ldy)
{
    const wcall c = {X, ldx, T, Y, ldy};
    wmatmul_many(pool, w, L, role, &c, 1);
}

/* These two run on the pool's threads (MLA heads): they only read a tensor
 * held whole.  If its read failed, zeros (k3_weights_end fails the step). */
void wmatmul_rows(const k3_weights *w, int L, k3_role role, size_t r0, size_t r1, const float *X, size_t ldx, size_t T,
                  float *Y, size_t ldy)
{
    kmat k = wmat_rows(w, L, role, r0, r1);
    if (!bytes_of(w, L, role)) {
        for (size_t t = 0; t < T; t++) memset(Y + t * ldy, 0, (r1 - r0) * sizeof *Y);
        return;
    }
    kmatmul_rows(&k, 0, k.rows, X, ldx, T, Y, ldy);
}

void wmatvec_t(const k3_weights *w, int L, k3_role role, size_t r0, size_t r1, const float *x, float *y)
{
    kmat k = wmat(w, L, role);
    if (!k.data) { memset(y, 0, k.cols * sizeof *y); return; }
    kmatvec_t(&k, r0, r1, x, y);
}
