/* Binding weights once, and the seam every matrix product goes through. */
#include "weights.h"

#include <string.h>

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
        }
    }
}

static size_t slot(const k3_weights *w, int L) { return L == K3_GLOBALS ? (size_t)w->m->cfg.n_layers : (size_t)L; }

static const kt_loc *loc_of(const k3_weights *w, int L, k3_role role)
{
    return L == K3_GLOBALS ? &w->m->globals[role] : &w->m->trunk[(size_t)L * K3T_COUNT + role];
}

/* Where tensor (L, role) is right now. */
static const uint8_t *bytes_of(const k3_weights *w, int L, const kt_loc *l)
{
    size_t k = slot(w, L);
    return w->raw[k] + (l->offset - w->first[k]);
}

static size_t loc_elems(const kt_loc *l) { return (size_t)(l->nbytes / kpk_dtype_size(l->dtype)); }

static void widen(const k3_weights *w, int L, k3_role role, float *out)
{
    const kt_loc *l = loc_of(w, L, role);
    if (out && l->nbytes) k3_widen(bytes_of(w, L, l), l->dtype, loc_elems(l), out);
}

/* f = norm ⊙ proj (spec §4.4), f holding the widened norm. */
static void fold(const k3_weights *w, int L, k3_role proj, float *f)
{
    const size_t E = (size_t)w->m->cfg.hidden;
    widen(w, L, proj, w->fold_tmp);
    for (size_t i = 0; i < E; i++) f[i] = f[i] * w->fold_tmp[i];
}

static void bind_vectors(k3_weights *w, int L)
{
    k3_vecs *v = &w->vec[slot(w, L)];
    if (L == K3_GLOBALS) {
        widen(w, L, K3T_FINAL_NORM, v->final_norm);
        widen(w, L, K3T_OUT_RES_NORM, v->f_out);
        fold(w, L, K3T_OUT_RES_PROJ, v->f_out);
        return;
    }
    widen(w, L, K3T_INPUT_LN, v->in_ln);
    widen(w, L, K3T_POST_ATTN_LN, v->post_ln);
    widen(w, L, K3T_ATTN_RES_NORM, v->f_attn);
    fold(w, L, K3T_ATTN_RES_PROJ, v->f_attn);
    widen(w, L, K3T_MLP_RES_NORM, v->f_mlp);
    fold(w, L, K3T_MLP_RES_PROJ, v->f_mlp);
    widen(w, L, K3T_KDA_QCONV, v->qconv);
    widen(w, L, K3T_KDA_KCONV, v->kconv);
    widen(w, L, K3T_KDA_VCONV, v->vconv);
    widen(w, L, K3T_KDA_ALOG, v->a_log);
    widen(w, L, K3T_KDA_DTBIAS, v->dt_bias);
    widen(w, L, K3T_KDA_ONORM, v->o_norm);
    widen(w, L, K3T_MLA_QA_NORM, v->qa_ln);
    widen(w, L, K3T_MLA_KVA_NORM, v->kva_ln);
    widen(w, L, K3T_MOE_BIAS, v->router_bias);
    widen(w, L, K3T_MOE_NORM, v->moe_norm);
}

void k3_weights_attach(k3_weights *w, int L, const uint8_t *raw, uint64_t first)
{
    size_t k = slot(w, L);
    w->raw[k] = raw;
    w->first[k] = first;
    if (!w->bound[k]) {
        bind_vectors(w, L);
        w->bound[k] = 1;
    }
}

void k3_weights_detach(k3_weights *w, int L) { w->raw[slot(w, L)] = NULL; }

const k3_vecs *k3_weights_vecs(const k3_weights *w, int L) { return &w->vec[slot(w, L)]; }

/* ---- the seam ------------------------------------------------------------------ */

static kd_type kd_of(int dtype)
{
    switch (dtype) {
    case KPK_DT_BF16: return KD_BF16;
    case KPK_DT_F16: return KD_F16;
    default: return KD_F32;
    }
}

kmat wmat(const k3_weights *w, int L, k3_role role)
{
    const kt_loc *l = loc_of(w, L, role);
    kmat k;
    memset(&k, 0, sizeof k);
    k.type = kd_of(l->dtype);
    k.rows = (size_t)l->shape[0];
    k.cols = (size_t)l->shape[1];
    k.data = bytes_of(w, L, l);
    return k;
}

kmat wmat_rows(const k3_weights *w, int L, k3_role role, size_t r0, size_t r1)
{
    kmat k = wmat(w, L, role);
    k.data = (const uint8_t *)k.data + r0 * k.cols * (size_t)kpk_dtype_size(loc_of(w, L, role)->dtype);
    k.rows = r1 - r0;
    return k;
}

void wmatmul(kpool *pool, const k3_weights *w, int L, k3_role role, const float *X, size_t ldx, size_t T, float *Y,
             size_t ldy)
{
    kmat k = wmat(w, L, role);
    kmatmul(pool, &k, X, ldx, T, Y, ldy);
}

void wmatmul_rows(const k3_weights *w, int L, k3_role role, size_t r0, size_t r1, const float *X, size_t ldx, size_t T,
                  float *Y, size_t ldy)
{
    kmat k = wmat_rows(w, L, role, r0, r1);
    kmatmul_rows(&k, 0, k.rows, X, ldx, T, Y, ldy);
}

void wmatvec_t(const k3_weights *w, int L, k3_role role, size_t r0, size_t r1, const float *x, float *y)
{
    kmat k = wmat(w, L, role);
    kmatvec_t(&k, r0, r1, x, y);
}
