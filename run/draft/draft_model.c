/* The drafter: its file, its weights held in memory, its taps, a session's
 * state (draft.h).  The layer itself is draft_layer.c. */
#include "draft_internal.h"

#include "run/engine/ops.h"
#include "run/util/ablate.h"

#include <jansson.h>
#include <math.h>
#include <xxhash.h>
#include <stdlib.h>
#include <string.h>

int kdraft_open(const char *path, const k3_model *target, kdraft **out, krun_err *err)
{
    kdraft *d = calloc(1, sizeof *d);
    kpk_err e = {0};
    char msg[900];
    *out = NULL;
    if (!d || !(d->path = strdup(path))) { free(d); return krun_err_set(err, KRUN_ENOMEM, "out of memory"); }
    if (kpk_open(path, &d->f, &e)) {
        krun_err_kpk(err, &e);
        kdraft_close(d);
        return krun_err_prefix(err, "drafter: ");
    }
    if (!k3e_is_drafter_file(d->f)) {
        krun_err_set(err, KRUN_EINPUT, "drafter %s: a KPK file without the DRAFTER feature: not a drafter (a model file? kpack "
                     "convert DRAFTER_DIR OUT.kpk makes one from a drafter checkpoint)", path);
        kdraft_close(d);
        return -1;
    }
    if (k3e_check_kpk(d->f, &d->cfg, msg, sizeof msg)) {
        /* the roster or config of a file that opened: damage, the file is not what its checksums sealed */
        krun_err_set(err, KRUN_EDATA, "drafter: %s", msg);
        kdraft_close(d);
        return -1;
    }
    if (k3e_target_taps(&d->cfg, &target->cfg, d->taps, msg, sizeof msg)) {
        krun_err_set(err, KRUN_EINPUT, "drafter %s: %s (%s)", path, msg, kpk_path(target->file));
        kdraft_close(d);
        return -1;
    }
    d->target = target;
    d->wext = (uint32_t)kpk_find_drafter(d->f, K3E_PART_WEIGHTS);
    d->eext = (uint32_t)kpk_find_drafter(d->f, K3E_PART_EMBED);
    {
        size_t len;
        const char *m = kpk_manifest(d->f, &len);
        json_t *j = json_loadb(m, len, 0, NULL), *p = json_object_get(json_object_get(j, "drafter"), "pinned");
        if (json_is_string(p)) snprintf(d->pinned, sizeof d->pinned, "%s", json_string_value(p));
        json_decref(j);
    }
    k3e_rope(&d->cfg, d->omega, &d->tau, &d->cos_mult);
    if (ABLATED(DRAFT_PLAIN_ROPE)) k3e_rope(&(k3_eagle_config){.qk_rope = d->cfg.qk_rope, .rope_theta = d->cfg.rope_theta}, d->omega, &(double){0}, &(double){0});
    if (ABLATED(DRAFT_SCALE_PLAIN)) d->tau = 1.0 / sqrt((double)(d->cfg.qk_nope + d->cfg.qk_rope));
    {
        char *text = NULL;
        size_t len;
        if (kpk_meta_file(d->f, "config.json", &text, &len, &e) == 0) d->config_xxh3 = XXH3_64bits(text, len);
        free(text);
    }
    *out = d;
    return 0;
}

void kdraft_close(kdraft *d)
{
    if (!d) return;
    free(d->mem);
    kpk_close(d->f);
    free(d->path);
    free(d);
}

const char *kdraft_path(const kdraft *d) { return d->path; }
float *kdraft_spare_row(kdraft *d) { return d->cm.g; }
uint64_t kdraft_held(const kdraft *d) { return d->mem ? d->mem_bytes : 0; }
uint64_t kdraft_set_id(const kdraft *d) { return kpk_super(d->f)->set_id; }
uint64_t kdraft_config_xxh3(const kdraft *d) { return d->config_xxh3; }
const k3_eagle_config *kdraft_config(const kdraft *d) { return &d->cfg; }
const int *kdraft_tap_layers(const kdraft *d) { return d->taps; }
const char *kdraft_pinned(const kdraft *d) { return d->pinned[0] ? d->pinned : NULL; }
size_t kdraft_tap_floats(const kdraft *d) { return (size_t)d->cfg.n_taps * (size_t)d->cfg.hidden; }
uint64_t kdraft_weight_bytes(const kdraft *d) { return kpk_extent_at(d->f, d->wext)->raw_len; }

/* Everything it holds, in one arena: the weights extent as stored, then the
 * widened norms, the commit scratch, the chain scratch for `rows` rows. */
static void carve(kdraft *d, size_t rows, size_t cap, karena *a)
{
    const k3_eagle_config *c = &d->cfg;
    const size_t E = (size_t)c->hidden, V = (size_t)c->vocab, F = (size_t)c->inter, H = (size_t)c->heads;
    const size_t Rq = (size_t)c->q_lora, Rkv = (size_t)c->kv_lora, dn = (size_t)c->qk_nope, dr = (size_t)c->qk_rope,
                 dv = (size_t)c->v_head;
    KTAKE(a, d->weights, kdraft_weight_bytes(d));
    for (int k = 0; k < c->n_taps; k++) KTAKE(a, d->fc_norm[k], E);
    KTAKE(a, d->in_ln, E);
    KTAKE(a, d->hid_norm, E);
    KTAKE(a, d->qa_norm, Rq);
    KTAKE(a, d->kva_norm, Rkv);
    KTAKE(a, d->post_ln, E);
    KTAKE(a, d->norm, E);
    /* commit: KD_COMMIT_ROWS rows at a time */
    KTAKE(a, d->cm.g, KD_COMMIT_ROWS * E);
    KTAKE(a, d->cm.x, KD_COMMIT_ROWS * 2 * E);
    KTAKE(a, d->cm.kv, KD_COMMIT_ROWS * (Rkv + dr));
    /* a chain step of `rows` sessions */
    d->rows = rows;
    d->cap = cap;
    KTAKE(a, d->ch.g, rows * E);
    KTAKE(a, d->ch.x, rows * 2 * E);
    KTAKE(a, d->ch.cq, rows * Rq);
    KTAKE(a, d->ch.q, rows * H * (dn + dr));
    KTAKE(a, d->ch.kv, rows * (Rkv + dr));
    KTAKE(a, d->ch.att, rows * H * dv);
    KTAKE(a, d->ch.r, rows * E);
    KTAKE(a, d->ch.n, rows * E);
    KTAKE(a, d->ch.gate, rows * F);
    KTAKE(a, d->ch.up, rows * F);
    KTAKE(a, d->ch.f, rows * E);
    KTAKE(a, d->ch.logits, rows * V);
    KTAKE(a, d->ch.erow, E * 4);
    KTAKE(a, d->ch.qt, H * Rkv);
    KTAKE(a, d->ch.sc, H * cap);
    KTAKE(a, d->ch.olat, H * Rkv);
    KTAKE(a, d->ch.rows, rows);
}

uint64_t kdraft_bytes(const kdraft *d, size_t rows, size_t cap)
{
    kdraft tmp = *d;
    karena a = {NULL, 0};
    carve(&tmp, rows, cap, &a);
    return karena_round(a.used);
}

/* A role's matrix over the held weights. */
static kmat mat_of(const kdraft *d, k3e_role role)
{
    kpk_tensor t;
    k3e_spec s;
    k3e_at(&d->cfg, k3e_index(&d->cfg, role, 0), &s);
    kpk_find_tensor(d->f, s.name, &t);      /* k3e_check_kpk found every one, in the weights extent */
    return (kmat){KD_BF16, (size_t)t.shape[0], (size_t)t.shape[1], d->weights + t.offset, NULL};
}

static void vec_of(const kdraft *d, k3e_role role, int tap, float *out)
{
    kpk_tensor t;
    k3e_spec s;
    k3e_at(&d->cfg, k3e_index(&d->cfg, role, tap), &s);
    kpk_find_tensor(d->f, s.name, &t);
    k3_widen(d->weights + t.offset, t.dtype, (size_t)t.shape[0], out);
}

/* Rows of the embedding compared with the target's: spread over the table
 * (the first, the last, and 62 between), every byte of each. */
#define KD_EMBED_SAMPLES 64

static int embedding_matches(kdraft *d, krun_err *err)
{
    const k3_model *m = d->target;
    const kt_loc *emb = &m->globals[K3T_EMBED];
    const size_t V = (size_t)d->cfg.vocab, rowb = (size_t)d->cfg.hidden * 2;
    kpk_tensor t;
    kpk_err ke = {0};
    uint8_t *mine = malloc(rowb), *theirs = malloc(rowb);
    int rc = 0;
    if (!mine || !theirs) { free(mine); free(theirs); return krun_err_set(err, KRUN_ENOMEM, "out of memory"); }
    kpk_find_tensor(d->f, "embed_tokens.weight", &t);
    if (emb->dtype != KPK_DT_BF16)
        rc = krun_err_set(err, KRUN_EINPUT, "drafter %s: the model's embedding is %s, the drafter's BF16: a drafter for another model",
                          d->path, kpk_dtype_name(emb->dtype));
    for (size_t i = 0; !rc && i < KD_EMBED_SAMPLES; i++) {
        const size_t row = V > 1 ? i * (V - 1) / (KD_EMBED_SAMPLES - 1) : 0;
        if (kpk_extent_read_raw(d->f, d->eext, mine, rowb, t.offset + row * rowb, &ke)) {
            krun_err_kpk(err, &ke);
            rc = krun_err_prefix(err, "drafter: ");
        } else if (kstore_read(d->store, d->globals_extent, emb->offset + row * rowb, rowb, theirs, err)) {
            rc = -1;
        } else if (memcmp(mine, theirs, rowb)) {
            rc = krun_err_set(err, KRUN_EINPUT, "drafter %s: its token embedding differs from the model's (row %zu): a drafter for "
                              "another model, or a damaged file (kpack verify %s); the K3 drafter's table is the model's (K3_EAGLE.md "
                              "§1.3)", d->path, row, d->path);
        }
    }
    kpk_extent_drop_cache(d->f, d->eext, 0, kpk_extent_at(d->f, d->eext)->raw_len);
    free(mine);
    free(theirs);
    return rc;
}

int kdraft_load(kdraft *d, kstore *store, uint32_t globals_extent, kpool *pool, size_t rows, size_t cap, int verify, krun_err *err)
{
    const k3_eagle_config *c = &d->cfg;
    const size_t bytes = kdraft_bytes(d, rows, cap);
    karena a;
    kpk_err ke = {0};
    d->store = store;
    d->globals_extent = globals_extent;
    d->pool = pool;
    d->mem = aligned_alloc(KARENA_ALIGN, bytes);
    if (!d->mem) return krun_err_set(err, KRUN_ENOMEM, "out of memory: %zu bytes for the drafter %s", bytes, d->path);
    d->mem_bytes = bytes;
    a = (karena){d->mem, 0};
    carve(d, rows, cap, &a);
    if (kpk_extent_read(d->f, d->wext, d->weights, verify, &ke)) {
        krun_err_kpk(err, &ke);
        return krun_err_prefix(err, "drafter: ");
    }
    kpk_extent_drop_cache(d->f, d->wext, 0, kdraft_weight_bytes(d));
    d->fc = mat_of(d, K3E_FC);
    d->qa = mat_of(d, K3E_QA);
    d->qb = mat_of(d, K3E_QB);
    d->kva = mat_of(d, K3E_KVA);
    d->kvb = mat_of(d, K3E_KVB);
    d->o = mat_of(d, K3E_O);
    d->gate = mat_of(d, K3E_GATE);
    d->up = mat_of(d, K3E_UP);
    d->down = mat_of(d, K3E_DOWN);
    d->lm = mat_of(d, K3E_LM_HEAD);
    for (int k = 0; k < c->n_taps; k++) vec_of(d, K3E_FC_NORM, k, d->fc_norm[k]);
    vec_of(d, K3E_INPUT_LN, 0, d->in_ln);
    vec_of(d, K3E_HIDDEN_NORM, 0, d->hid_norm);
    vec_of(d, K3E_QA_NORM, 0, d->qa_norm);
    vec_of(d, K3E_KVA_NORM, 0, d->kva_norm);
    vec_of(d, K3E_POST_LN, 0, d->post_ln);
    vec_of(d, K3E_NORM, 0, d->norm);
    return embedding_matches(d, err);
}

/* ---- taps -------------------------------------------------------------------- */

void kdraft_tap(void *ctx, int L, const float *P, size_t T, float *taps)
{
    kdraft *d = ctx;
    const size_t E = (size_t)d->cfg.hidden, w = kdraft_tap_floats(d);
    for (int k = 0; k < d->cfg.n_taps; k++) {
        if (d->taps[k] + ABLATED(DRAFT_TAP_OFF_BY_ONE) != L) continue;
        /* K3_EAGLE §3.3 step 0: each tap normalised on its own, in layer order */
        for (size_t t = 0; t < T; t++) {
            float *dst = taps + t * w + (size_t)(ABLATED(DRAFT_TAPS_OUT_OF_ORDER) ? d->cfg.n_taps - 1 - k : k) * E;
            if (ABLATED(DRAFT_TAPS_UNNORMED)) memcpy(dst, P + t * E, E * sizeof *dst);
            else op_rmsnorm(dst, P + t * E, d->fc_norm[k], E, d->cfg.rms_eps);
        }
    }
}

/* ---- a session's state ----------------------------------------------------------- */

void kdraft_state_carve(kdraft_state *s, const k3_eagle_config *c, size_t cap, karena *a)
{
    kdraft_state tmp, *x = s ? s : &tmp;
    KTAKE(a, x->cache, cap * (size_t)(c->kv_lora + c->qk_rope));
    KTAKE(a, x->pending, (size_t)c->hidden);
    x->cap = cap;
    x->start = x->n = 0;
    x->has_pending = 0;
}

size_t kdraft_state_bytes(const k3_eagle_config *c, size_t cap)
{
    karena a = {NULL, 0};
    kdraft_state_carve(NULL, c, cap, &a);
    return karena_round(a.used);
}

void kdraft_state_reset(kdraft_state *s)
{
    s->start = s->n = 0;
    s->has_pending = 0;
}

void kdraft_state_copy(kdraft_state *dst, const kdraft_state *src, const k3_eagle_config *c)
{
    const size_t row = (size_t)(c->kv_lora + c->qk_rope);
    if (src->n > src->start) memcpy(dst->cache + src->start * row, src->cache + src->start * row, (src->n - src->start) * row * sizeof(float));
    if (src->has_pending) memcpy(dst->pending, src->pending, (size_t)c->hidden * sizeof(float));
    dst->start = src->start;
    dst->n = src->n;
    dst->has_pending = src->has_pending;
}
