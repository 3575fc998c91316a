/* Opening the model from a KPK file and binding extents to typed weights. */
#include "model.h"

#include "format/k3_check.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    free(m->config_text);
    free(m->expert_off);
    free(m->away);
    memset(m, 0, sizeof *m);
}

int k3_model_set_away(k3_model *m, const uint8_t *away, int globals_away, krun_err *err)
{
    free(m->away);
    m->away = NULL;
    m->globals_away = globals_away != 0;
    if (!away) return 0;
    if (!(m->away = malloc((size_t)m->cfg.n_layers))) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    memcpy(m->away, away, (size_t)m->cfg.n_layers);
    return 0;
}

int k3_model_open(kpk_file *f, k3_model *m, krun_err *err)
{
    char *cfg_text = NULL, cerr[800];
    size_t cfg_len;
    kpk_err e = {0};
    k3_schema sch;
    int64_t g;

    memset(m, 0, sizeof *m);
    m->file = f;
    m->eos_id = -1;
    if (kpk_meta_file(f, "config.json", &cfg_text, &cfg_len, &e)) return krun_err_kpk(err, &e);
    m->config_text = cfg_text;   /* freed by k3_model_close on failure */
    if (k3_config_parse(cfg_text, cfg_len, &m->cfg, cerr, sizeof cerr)) {
        krun_err_set(err, KRUN_EDATA, "%s: embedded config.json: %s", kpk_path(f), cerr);
        goto bad;
    }
    m->eos_id = read_eos(cfg_text, cfg_len);
    m->config_len = cfg_len;
    /* The tokenizer is optional: without it krun takes token ids only. */
    if (kpk_meta_file(f, "tiktoken.model", &m->tokenizer_rank_file, &m->tokenizer_rank_len, &e) != 0) {
        m->tokenizer_rank_file = NULL;
    } else if (kpk_meta_file(f, "tokenizer_config.json", &m->tokenizer_config, &m->tokenizer_config_len, &e) != 0) {
        m->tokenizer_config = NULL;
    }

    g = kpk_find_globals(f);
    if (g < 0) { krun_err_set(err, KRUN_EDATA, "%s: no globals extent", kpk_path(f)); goto bad; }
    m->globals_extent = (uint32_t)g;
    m->trunk_extent = calloc((size_t)m->cfg.n_layers, sizeof *m->trunk_extent);
    m->trunk = calloc((size_t)m->cfg.n_layers * K3T_COUNT, sizeof *m->trunk);
    m->expert_off = calloc((size_t)m->cfg.n_layers * 6, sizeof *m->expert_off);
    if (!m->trunk_extent || !m->trunk || !m->expert_off) { krun_err_set(err, KRUN_ENOMEM, "out of memory"); goto bad; }
    for (int L = 0; L < m->cfg.n_layers; L++) {
        int64_t x = kpk_find_trunk(f, (uint32_t)L);
        if (x < 0) { krun_err_set(err, KRUN_EDATA, "%s: layer %d has no trunk extent", kpk_path(f), L); goto bad; }
        m->trunk_extent[L] = (uint32_t)x;
    }

    /* Every tensor the config implies: present, accepted dtype, right shape,
     * right extent, nothing else (the check kpack verify makes too). */
    if (k3_check_file(f, &m->cfg, cerr, sizeof cerr)) {
        krun_err_set(err, KRUN_EDATA, "%s", cerr);
        goto bad;
    }
    /* Where each one is. */
    k3_schema_init(&sch, &m->cfg);
    for (uint64_t i = 0; i < sch.count; i++) {
        k3_tensor_spec s;
        kpk_tensor t;
        k3_schema_at(&sch, i, &s);
        if (kpk_find_tensor(f, s.name, &t) < 0) { /* k3_check_file found it: cannot happen */
            krun_err_set(err, KRUN_EDATA, "%s: tensor %s is missing", kpk_path(f), s.name);
            goto bad;
        }
        if (k3_role_is_expert(s.role)) {
            /* one layout for every expert of a layer: the forward pass binds by offset */
            uint64_t *off = &m->expert_off[(size_t)s.layer * 6 + (size_t)(s.role - K3T_EXP_W1_PACKED)];
            if (s.expert == 0) *off = t.offset;
            else if (*off != t.offset) {
                krun_err_set(err, KRUN_EDATA, "%s: tensor %s is at offset %llu of its extent, expert 0 of the layer has it at %llu: "
                             "every expert of a layer must be laid out alike (docs/FORMAT.md)", kpk_path(f), s.name,
                             (unsigned long long)t.offset, (unsigned long long)*off);
                goto bad;
            }
            continue;
        }
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

int64_t k3_globals_first(const k3_model *m)
{
    const kt_loc *emb = &m->globals[K3T_EMBED];
    uint64_t first = (emb->offset + emb->nbytes) / 4096 * 4096;
    for (int r = 0; r <= K3T_OUT_RES_PROJ; r++)
        if (r != K3T_EMBED && m->globals[r].offset < first) return -1;
    return (int64_t)first;
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

void k3_bind_expert(const k3_model *m, int L, const uint8_t *raw, k3_expert_w *w)
{
    const uint64_t *off = m->expert_off + (size_t)L * 6;
    const k3_config *c = &m->cfg;
    kmat *out[3] = {&w->w1, &w->w2, &w->w3};
    /* w1, w3: [moe_inter][latent]; w2: [latent][moe_inter] (spec §2) */
    const size_t rows[3] = {(size_t)c->moe_inter, (size_t)c->latent, (size_t)c->moe_inter};
    const size_t cols[3] = {(size_t)c->latent, (size_t)c->moe_inter, (size_t)c->latent};
    for (int k = 0; k < 3; k++) {
        out[k]->type = KD_MXFP4;
        out[k]->rows = rows[k];
        out[k]->cols = cols[k];
        out[k]->data = raw + off[2 * k];
        out[k]->scales = raw + off[2 * k + 1];
    }
}
