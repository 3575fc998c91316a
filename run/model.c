/* Opening the model from a KPK file and binding extents to typed weights. */
#include "model.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int kd_of(int dtype)
{
    switch (dtype) {
    case KPK_DT_F32: return KD_F32;
    case KPK_DT_BF16: return KD_BF16;
    case KPK_DT_F16: return KD_F16;
    default: return -1;
    }
}

/* eos_token_id may sit at the root or under text_config; ints or a list. */
static int read_eos(const char *cfg_text, size_t len)
{
    json_t *root = json_loadb(cfg_text, len, 0, NULL), *v;
    int eos = -1;
    if (!root) return -1;
    v = json_object_get(root, "eos_token_id");
    if (!v) v = json_object_get(json_object_get(root, "text_config"), "eos_token_id");
    if (json_is_array(v)) v = json_array_get(v, 0);
    if (json_is_integer(v)) eos = (int)json_integer_value(v);
    json_decref(root);
    return eos;
}

void k3_model_close(k3_model *m)
{
    free(m->trunk_extent);
    free(m->trunk);
    free(m->tokenizer_rank_file);
    free(m->tokenizer_config);
    memset(m, 0, sizeof *m);
}

int k3_model_open(kpk_file *f, k3_model *m, char *err, size_t errlen)
{
    char *cfg_text = NULL, cerr[800];
    size_t cfg_len;
    kpk_err e = {0};
    k3_schema sch;
    int64_t g;

    memset(m, 0, sizeof *m);
    m->file = f;
    m->eos_id = -1;
    if (kpk_meta_file(f, "config.json", &cfg_text, &cfg_len, &e)) {
        snprintf(err, errlen, "%s", e.msg);
        return -1;
    }
    if (k3_config_parse(cfg_text, cfg_len, &m->cfg, cerr, sizeof cerr)) {
        snprintf(err, errlen, "%s: embedded config.json: %s", kpk_path(f), cerr);
        free(cfg_text);
        return -1;
    }
    m->eos_id = read_eos(cfg_text, cfg_len);
    free(cfg_text);
    /* The tokenizer is optional: without it krun takes token ids only. */
    if (kpk_meta_file(f, "tiktoken.model", &m->tokenizer_rank_file, &m->tokenizer_rank_len, &e) != 0) {
        m->tokenizer_rank_file = NULL;
    } else if (kpk_meta_file(f, "tokenizer_config.json", &m->tokenizer_config, &m->tokenizer_config_len, &e) != 0) {
        m->tokenizer_config = NULL;
    }

    g = kpk_find_globals(f);
    if (g < 0) { snprintf(err, errlen, "%s: no globals extent", kpk_path(f)); goto bad; }
    m->globals_extent = (uint32_t)g;
    m->trunk_extent = calloc((size_t)m->cfg.n_layers, sizeof *m->trunk_extent);
    m->trunk = calloc((size_t)m->cfg.n_layers * K3T_COUNT, sizeof *m->trunk);
    if (!m->trunk_extent || !m->trunk) { snprintf(err, errlen, "out of memory"); goto bad; }
    for (int L = 0; L < m->cfg.n_layers; L++) {
        int64_t x = kpk_find_trunk(f, (uint32_t)L);
        if (x < 0) { snprintf(err, errlen, "%s: layer %d has no trunk extent", kpk_path(f), L); goto bad; }
        m->trunk_extent[L] = (uint32_t)x;
    }

    /* Every tensor the config implies: present, accepted dtype, right shape, right extent. */
    k3_schema_init(&sch, &m->cfg);
    for (uint64_t i = 0; i < sch.count; i++) {
        k3_tensor_spec s;
        kpk_tensor t;
        const kpk_extent *x;
        int ok_extent;
        k3_schema_at(&sch, i, &s);
        if (kpk_find_tensor(f, s.name, &t) < 0) {
            snprintf(err, errlen, "%s: tensor %s is missing", kpk_path(f), s.name);
            goto bad;
        }
        if (!(s.dtypes & K3_DTM(t.dtype)) || t.ndim != s.ndim || memcmp(t.shape, s.shape, sizeof s.shape) != 0) {
            snprintf(err, errlen, "%s: tensor %s has dtype %s and a shape other than the config implies", kpk_path(f),
                     s.name, kpk_dtype_name(t.dtype));
            goto bad;
        }
        x = kpk_extent_at(f, t.extent);
        ok_extent = s.kind == x->kind && (s.layer < 0 || (uint32_t)s.layer == x->layer) &&
                    (s.expert < 0 || (uint32_t)s.expert == x->expert);
        if (!ok_extent) {
            snprintf(err, errlen, "%s: tensor %s is stored in the wrong extent", kpk_path(f), s.name);
            goto bad;
        }
        if (k3_role_is_expert(s.role)) continue;
        {
            kt_loc *loc = k3_role_is_global(s.role) ? &m->globals[s.role] : &m->trunk[(size_t)s.layer * K3T_COUNT + s.role];
            loc->offset = t.offset;
            loc->nbytes = t.nbytes;
            loc->dtype = t.dtype;
            loc->ndim = t.ndim;
            memcpy(loc->shape, t.shape, sizeof loc->shape);
        }
    }
    return 0;
bad:
    k3_model_close(m);
    return -1;
}

int64_t k3_expert_extent(const k3_model *m, int L, int e) { return kpk_find_expert(m->file, (uint32_t)L, (uint32_t)e); }

/* ---- binding --------------------------------------------------------------- */

void k3_widen(const uint8_t *p, int dtype, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        switch (dtype) {
        case KPK_DT_F32: memcpy(&out[i], p + 4 * i, 4); break;
        case KPK_DT_BF16: memcpy(&h, p + 2 * i, 2); out[i] = kbf16_to_f32(h); break;
        default: memcpy(&h, p + 2 * i, 2); out[i] = kf16_to_f32(h); break;
        }
    }
}

static size_t loc_elems(const kt_loc *l) { return (size_t)(l->nbytes / kpk_dtype_size(l->dtype)); }

static kmat mat_of(const kt_loc *l, const uint8_t *raw)
{
    kmat k;
    memset(&k, 0, sizeof k);
    k.type = (kd_type)kd_of(l->dtype);
    k.rows = (size_t)l->shape[0];
    k.cols = (size_t)l->shape[1];
    k.data = raw + l->offset;
    return k;
}

struct arena { float *base; size_t used, cap; };

static float *take_vec(struct arena *a, const kt_loc *l, const uint8_t *raw)
{
    size_t n = loc_elems(l);
    float *p = a->base + a->used;
    a->used += n;
    k3_widen(raw + l->offset, l->dtype, n, p);
    return p;
}

/* res_norm ⊙ res_proj, folded once (spec §4.4). */
static float *take_fold(struct arena *a, const kt_loc *norm, const kt_loc *proj, const uint8_t *raw, size_t E)
{
    float *f = take_vec(a, norm, raw), *p = take_vec(a, proj, raw);
    for (size_t i = 0; i < E; i++) f[i] = f[i] * p[i];
    a->used -= E; /* the proj copy is scratch */
    return f;
}

int k3_bind_globals(const k3_model *m, const uint8_t *raw, k3_globals_w *w, char *err, size_t errlen)
{
    const size_t E = (size_t)m->cfg.hidden;
    struct arena a = {0};
    memset(w, 0, sizeof *w);
    a.cap = 4 * E;
    a.base = malloc(a.cap * sizeof(float));
    if (!a.base) { snprintf(err, errlen, "out of memory"); return -1; }
    w->arena = a.base;
    w->embed = raw + m->globals[K3T_EMBED].offset;
    w->embed_dtype = m->globals[K3T_EMBED].dtype;
    w->lm_head = mat_of(&m->globals[K3T_LM_HEAD], raw);
    w->final_norm = take_vec(&a, &m->globals[K3T_FINAL_NORM], raw);
    w->f_out = take_fold(&a, &m->globals[K3T_OUT_RES_NORM], &m->globals[K3T_OUT_RES_PROJ], raw, E);
    return 0;
}

void k3_unbind_globals(k3_globals_w *w) { free(w->arena); memset(w, 0, sizeof *w); }

int k3_bind_layer(const k3_model *m, int L, const uint8_t *raw, k3_layer_w *w, char *err, size_t errlen)
{
    const k3_config *c = &m->cfg;
    const kt_loc *t = &m->trunk[(size_t)L * K3T_COUNT];
    const size_t E = (size_t)c->hidden;
    struct arena a = {0};
    memset(w, 0, sizeof *w);
    w->layer = L;
    w->mla = c->layer_is_mla[L];
    w->moe = k3_layer_is_moe(c, L);
    for (int r = 0; r < K3T_COUNT; r++)
        if (t[r].nbytes && t[r].dtype != KPK_DT_U8 && (t[r].ndim == 1 || t[r].ndim == 3 || (t[r].ndim == 2 && t[r].shape[0] == 1)))
            a.cap += loc_elems(&t[r]);
    a.cap += E; /* fold scratch */
    a.base = malloc(a.cap * sizeof(float));
    if (!a.base) { snprintf(err, errlen, "out of memory binding layer %d", L); return -1; }
    w->arena = a.base;

    w->in_ln = take_vec(&a, &t[K3T_INPUT_LN], raw);
    w->post_ln = take_vec(&a, &t[K3T_POST_ATTN_LN], raw);
    w->f_attn = take_fold(&a, &t[K3T_ATTN_RES_NORM], &t[K3T_ATTN_RES_PROJ], raw, E);
    w->f_mlp = take_fold(&a, &t[K3T_MLP_RES_NORM], &t[K3T_MLP_RES_PROJ], raw, E);
    if (!w->mla) {
        w->q = mat_of(&t[K3T_KDA_Q], raw);
        w->k = mat_of(&t[K3T_KDA_K], raw);
        w->v = mat_of(&t[K3T_KDA_V], raw);
        w->g = mat_of(&t[K3T_KDA_G], raw);
        w->o = mat_of(&t[K3T_KDA_O], raw);
        w->fa = mat_of(&t[K3T_KDA_FA], raw);
        w->fb = mat_of(&t[K3T_KDA_FB], raw);
        w->b = mat_of(&t[K3T_KDA_B], raw);
        w->qconv = take_vec(&a, &t[K3T_KDA_QCONV], raw);
        w->kconv = take_vec(&a, &t[K3T_KDA_KCONV], raw);
        w->vconv = take_vec(&a, &t[K3T_KDA_VCONV], raw);
        w->a_log = take_vec(&a, &t[K3T_KDA_ALOG], raw);
        w->dt_bias = take_vec(&a, &t[K3T_KDA_DTBIAS], raw);
        w->o_norm = take_vec(&a, &t[K3T_KDA_ONORM], raw);
    } else {
        w->qa = mat_of(&t[K3T_MLA_QA], raw);
        w->qb = mat_of(&t[K3T_MLA_QB], raw);
        w->kva = mat_of(&t[K3T_MLA_KVA], raw);
        w->kvb = mat_of(&t[K3T_MLA_KVB], raw);
        w->mo = mat_of(&t[K3T_MLA_O], raw);
        if (c->mla_output_gate) w->mg = mat_of(&t[K3T_MLA_G], raw);
        w->qa_ln = take_vec(&a, &t[K3T_MLA_QA_NORM], raw);
        w->kva_ln = take_vec(&a, &t[K3T_MLA_KVA_NORM], raw);
    }
    if (!w->moe) {
        w->ffn_gate = mat_of(&t[K3T_FFN_GATE], raw);
        w->ffn_up = mat_of(&t[K3T_FFN_UP], raw);
        w->ffn_down = mat_of(&t[K3T_FFN_DOWN], raw);
    } else {
        w->router = mat_of(&t[K3T_MOE_ROUTER], raw);
        w->moe_down = mat_of(&t[K3T_MOE_DOWN], raw);
        w->moe_up = mat_of(&t[K3T_MOE_UP], raw);
        w->sh_gate = mat_of(&t[K3T_SH_GATE], raw);
        w->sh_up = mat_of(&t[K3T_SH_UP], raw);
        w->sh_down = mat_of(&t[K3T_SH_DOWN], raw);
        w->router_bias = take_vec(&a, &t[K3T_MOE_BIAS], raw);
        w->moe_norm = take_vec(&a, &t[K3T_MOE_NORM], raw);
    }
    return 0;
}

void k3_unbind_layer(k3_layer_w *w) { free(w->arena); memset(w, 0, sizeof *w); }

int k3_bind_expert(const k3_model *m, int L, int e, const uint8_t *raw, k3_expert_w *w, char *err, size_t errlen)
{
    static const k3_role roles[3][2] = {
        {K3T_EXP_W1_PACKED, K3T_EXP_W1_SCALE}, {K3T_EXP_W2_PACKED, K3T_EXP_W2_SCALE}, {K3T_EXP_W3_PACKED, K3T_EXP_W3_SCALE}};
    kmat *out[3] = {&w->w1, &w->w2, &w->w3};
    for (int k = 0; k < 3; k++) {
        k3_tensor_spec sp, ss;
        kpk_tensor tp, ts;
        if (k3_schema_spec(&m->cfg, roles[k][0], L, e, &sp) || k3_schema_spec(&m->cfg, roles[k][1], L, e, &ss) ||
            kpk_find_tensor(m->file, sp.name, &tp) < 0 || kpk_find_tensor(m->file, ss.name, &ts) < 0) {
            snprintf(err, errlen, "layer %d expert %d: tensors not found", L, e);
            return -1;
        }
        out[k]->type = KD_MXFP4;
        out[k]->rows = (size_t)sp.shape[0];
        out[k]->cols = (size_t)sp.shape[1] * 2;
        out[k]->data = raw + tp.offset;
        out[k]->scales = raw + ts.offset;
    }
    return 0;
}
