/* The K3 EAGLE-3.1 drafter's config, roster and file check (k3_eagle.h). */
#include "k3_eagle.h"

#include "errbuf.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const int K3E_RELEASE_TAPS[3] = {1, 45, 89};

/* ---- config.json ------------------------------------------------------------ */

/* Keys sit at the root, or (a nested export) under text_config. */
static json_t *get(json_t *root, const char *key)
{
    json_t *v = json_object_get(root, key), *tc;
    if (!v && (tc = json_object_get(root, "text_config")) && json_is_object(tc)) v = json_object_get(tc, key);
    return v;
}

static int get_bool(json_t *v, int *out)
{
    if (json_is_boolean(v)) { *out = json_is_true(v); return 0; }
    if (json_is_integer(v) && (json_integer_value(v) == 0 || json_integer_value(v) == 1)) { *out = (int)json_integer_value(v); return 0; }
    return -1;
}

struct ifield { const char *key; size_t off; long lo, hi; const char *k3; };
#define I(k, m, lo, hi, k3) { k, offsetof(k3_eagle_config, m), lo, hi, k3 }
static const struct ifield ints[] = {
    I("hidden_size", hidden, 1, 65536, "7168"),
    I("intermediate_size", inter, 1, 1 << 20, "18432"),
    I("vocab_size", vocab, 1, 1 << 24, "163840"),
    I("num_attention_heads", heads, 1, 1024, "64"),
    I("q_lora_rank", q_lora, 1, 65536, "1536"),
    I("kv_lora_rank", kv_lora, 1, 65536, "512"),
    I("qk_nope_head_dim", qk_nope, 1, 1024, "128"),
    I("qk_rope_head_dim", qk_rope, 2, 1024, "64"),
    I("v_head_dim", v_head, 1, 1024, "128"),
};
#undef I

/* rope_scaling: YaRN with every parameter given (K3_EAGLE §3.7: HF's defaults
 * for a missing mscale_all_dim would change the scale, so none is assumed). */
static int parse_yarn(json_t *rs, k3_eagle_config *c, char *err, size_t errlen)
{
    static const struct { const char *key; size_t off; double lo, hi; } reals[] = {
        {"factor", offsetof(k3_eagle_config, yarn_factor), 1, 1e6},
        {"beta_fast", offsetof(k3_eagle_config, yarn_beta_fast), 1e-3, 1e6},
        {"beta_slow", offsetof(k3_eagle_config, yarn_beta_slow), 1e-3, 1e6},
        {"mscale", offsetof(k3_eagle_config, yarn_mscale), 0, 1e3},
        {"mscale_all_dim", offsetof(k3_eagle_config, yarn_mscale_all_dim), 0, 1e3},
    };
    json_t *t = json_object_get(rs, "type"), *o;
    if (!t) t = json_object_get(rs, "rope_type");
    if (!json_is_string(t) || (strcmp(json_string_value(t), "yarn") && strcmp(json_string_value(t), "deepseek_yarn"))) {
        errbuf_set(err, errlen, "config: rope_scaling is not YaRN (type %s); the K3 drafter's rope is YaRN (K3_EAGLE.md §3.7)",
                   json_is_string(t) ? json_string_value(t) : "missing");
        return -1;
    }
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) {
        json_t *v = json_object_get(rs, reals[i].key);
        double x;
        if (!json_is_number(v)) {
            errbuf_set(err, errlen, "config: rope_scaling.%s is %s (a YaRN parameter is never assumed)", reals[i].key,
                       v ? "not a number" : "missing");
            return -1;
        }
        x = json_number_value(v);
        if (!(x >= reals[i].lo && x <= reals[i].hi)) {
            errbuf_set(err, errlen, "config: rope_scaling.%s = %g is outside %g..%g", reals[i].key, x, reals[i].lo, reals[i].hi);
            return -1;
        }
        *(double *)((char *)c + reals[i].off) = x;
    }
    o = json_object_get(rs, "original_max_position_embeddings");
    if (!json_is_integer(o) || json_integer_value(o) < 1 || json_integer_value(o) > (1 << 30)) {
        errbuf_set(err, errlen, "config: rope_scaling.original_max_position_embeddings must be an integer 1..2^30");
        return -1;
    }
    c->yarn_orig_max = (int)json_integer_value(o);
    if (c->yarn_beta_fast <= c->yarn_beta_slow) {
        errbuf_set(err, errlen, "config: rope_scaling.beta_fast (%g) must be above beta_slow (%g)", c->yarn_beta_fast, c->yarn_beta_slow);
        return -1;
    }
    c->yarn = 1;
    return 0;
}

static int parse_taps(json_t *root, k3_eagle_config *c, char *err, size_t errlen)
{
    json_t *ec = get(root, "eagle_config"), *ids, *v;
    size_t i;
    if (!json_is_object(ec)) {
        errbuf_set(err, errlen, "config: eagle_config (the target layers the drafter reads) is %s", ec ? "not an object" : "missing");
        return -1;
    }
    ids = json_object_get(ec, "eagle_aux_hidden_state_layer_ids");
    if (!json_is_array(ids) || json_array_size(ids) < 1 || json_array_size(ids) > K3E_MAX_TAPS) {
        errbuf_set(err, errlen, "config: eagle_config.eagle_aux_hidden_state_layer_ids must list 1..%d layer ids", K3E_MAX_TAPS);
        return -1;
    }
    json_array_foreach(ids, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > K3_MAX_LAYERS) {
            errbuf_set(err, errlen, "config: eagle_aux_hidden_state_layer_ids[%zu] is not a layer id 0..%d", i, K3_MAX_LAYERS);
            return -1;
        }
        c->tap_ids[i] = (int)json_integer_value(v);
        if (i && c->tap_ids[i] <= c->tap_ids[i - 1]) {
            errbuf_set(err, errlen, "config: eagle_aux_hidden_state_layer_ids must ascend (fc reads the taps in layer order)");
            return -1;
        }
    }
    c->n_taps = (int)json_array_size(ids);
    return 0;
}

/* Flags that name another drafter design: refused, never ignored. */
static int check_design(json_t *root, const k3_eagle_config *c, char *err, size_t errlen)
{
    json_t *v;
    int b;
#define REFUSE(...) do { errbuf_set(err, errlen, __VA_ARGS__); return -1; } while (0)
    v = get(root, "num_hidden_layers");
    if (!json_is_integer(v) || json_integer_value(v) != 1)
        REFUSE("config: num_hidden_layers is %s; the K3 EAGLE drafter has exactly one layer", v ? "not 1" : "missing");
    v = get(root, "fc_norm");
    if (!v || get_bool(v, &b) || !b)
        REFUSE("config: fc_norm is %s; an EAGLE-3.1 drafter normalises each tap before fc (K3_EAGLE.md §1.1)", v ? "not true" : "missing");
    v = get(root, "norm_output");
    if (!v || get_bool(v, &b) || !b)
        REFUSE("config: norm_output is %s; an EAGLE-3.1 drafter feeds its normalised output back (an EAGLE-3 one feeds another "
               "state: not supported)", v ? "not true" : "missing");
    if ((v = get(root, "hidden_act")) && (!json_is_string(v) || strcmp(json_string_value(v), "silu")))
        REFUSE("config: hidden_act is not \"silu\"; the drafter's MLP is SwiGLU (K3_EAGLE.md §3.1)");
    if ((v = get(root, "tie_word_embeddings")) && (get_bool(v, &b) || b))
        REFUSE("config: tie_word_embeddings is true; the drafter has its own lm_head");
    if ((v = get(root, "draft_vocab_size")) && (!json_is_integer(v) || json_integer_value(v) != c->vocab))
        REFUSE("config: draft_vocab_size differs from vocab_size (%d): a pruned draft vocabulary (d2t/t2d) is not supported", c->vocab);
    if ((v = get(root, "num_key_value_heads")) && (!json_is_integer(v) || json_integer_value(v) != c->heads))
        REFUSE("config: num_key_value_heads differs from num_attention_heads (%d): MLA shares one latent per position", c->heads);
    if (c->qk_rope % 2) REFUSE("config: qk_rope_head_dim = %d is odd; RoPE rotates pairs", c->qk_rope);
#undef REFUSE
    return 0;
}

int k3e_config_parse(const char *json, size_t len, k3_eagle_config *c, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr), *v;
    char missing[512] = "";
    int nmissing = 0, rc = -1;
    memset(c, 0, sizeof *c);
    if (!root) { errbuf_set(err, errlen, "config.json: invalid JSON at line %d: %s", jerr.line, jerr.text); return -1; }
    if (!json_is_object(root)) { errbuf_set(err, errlen, "config.json: top level is not an object"); goto out; }
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        v = get(root, ints[i].key);
        if (!v) {
            size_t u = strlen(missing);
            snprintf(missing + u, sizeof missing - u, "%s%s", nmissing++ ? ", " : "", ints[i].key);
            continue;
        }
        if (!json_is_integer(v) || json_integer_value(v) < ints[i].lo || json_integer_value(v) > ints[i].hi) {
            errbuf_set(err, errlen, "config: %s must be an integer %ld..%ld (the K3 drafter: %s)", ints[i].key, ints[i].lo, ints[i].hi,
                       ints[i].k3);
            goto out;
        }
        *(int *)((char *)c + ints[i].off) = (int)json_integer_value(v);
    }
    if (!get(root, "rms_norm_eps")) {
        size_t u = strlen(missing);
        snprintf(missing + u, sizeof missing - u, "%srms_norm_eps", nmissing++ ? ", " : "");
    }
    if (!get(root, "rope_theta")) {
        size_t u = strlen(missing);
        snprintf(missing + u, sizeof missing - u, "%srope_theta", nmissing++ ? ", " : "");
    }
    if (nmissing) {
        errbuf_set(err, errlen, "config: %d required field%s missing: %s", nmissing, nmissing > 1 ? "s" : "", missing);
        goto out;
    }
    v = get(root, "rms_norm_eps");
    if (!json_is_number(v) || !(json_number_value(v) >= 1e-10 && json_number_value(v) <= 1e-2)) {
        errbuf_set(err, errlen, "config: rms_norm_eps must be a number 1e-10..0.01 (the K3 drafter: 1e-5)");
        goto out;
    }
    c->rms_eps = json_number_value(v);
    v = get(root, "rope_theta");
    if (!json_is_number(v) || !(json_number_value(v) > 1 && json_number_value(v) <= 1e9)) {
        errbuf_set(err, errlen, "config: rope_theta must be a number above 1 (the K3 drafter: 50000)");
        goto out;
    }
    c->rope_theta = json_number_value(v);
    if ((v = get(root, "rope_scaling")) && !json_is_null(v)) {
        if (!json_is_object(v)) { errbuf_set(err, errlen, "config: rope_scaling is not an object"); goto out; }
        if (parse_yarn(v, c, err, errlen)) goto out;
    }
    if ((v = get(root, "max_position_embeddings"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 1) {
            errbuf_set(err, errlen, "config: max_position_embeddings must be a positive integer");
            goto out;
        }
        c->max_positions = (long)json_integer_value(v);
    }
    if ((v = get(root, "architectures")) && json_is_array(v) && json_is_string(json_array_get(v, 0)))
        snprintf(c->architecture, sizeof c->architecture, "%s", json_string_value(json_array_get(v, 0)));
    if (check_design(root, c, err, errlen) || parse_taps(root, c, err, errlen)) goto out;
    rc = 0;
out:
    json_decref(root);
    return rc;
}

static int is_release_target(const k3_config *t) { return t->n_layers == K3E_RELEASE_TARGET_LAYERS && t->hidden == 7168 && t->vocab == 163840; }

int k3e_target_taps(const k3_eagle_config *c, const k3_config *t, int *layers, char *err, size_t errlen)
{
    if (c->hidden != t->hidden || c->vocab != t->vocab) {
        errbuf_set(err, errlen, "a drafter for another model: its hidden size %d and vocabulary %d, the model's %d and %d", c->hidden,
                   c->vocab, t->hidden, t->vocab);
        return -1;
    }
    if (is_release_target(t)) {
        /* K3_EAGLE §6.1: the tensors to capture are fixed; the config only confirms them */
        static const int exported[3] = {2, 46, 90};
        if (c->n_taps != 3 || (memcmp(c->tap_ids, exported, sizeof exported) && memcmp(c->tap_ids, K3E_RELEASE_TAPS, sizeof exported))) {
            char got[64] = "";
            for (int i = 0; i < c->n_taps; i++) snprintf(got + strlen(got), sizeof got - strlen(got), "%s%d", i ? "," : "", c->tap_ids[i]);
            errbuf_set(err, errlen, "a drafter for another model: its config taps layers [%s]; the K3 drafter taps the model after "
                       "zero-based layers 1, 45, 89 (its config says [2,46,90], or [1,45,89])", got);
            return -1;
        }
        memcpy(layers, K3E_RELEASE_TAPS, sizeof K3E_RELEASE_TAPS);
        return 0;
    }
    for (int i = 0; i < c->n_taps; i++) {
        if (c->tap_ids[i] < 1 || c->tap_ids[i] > t->n_layers) {
            errbuf_set(err, errlen, "a drafter for another model: its config taps completed layer %d (one-based); the model has %d layers",
                       c->tap_ids[i], t->n_layers);
            return -1;
        }
        layers[i] = c->tap_ids[i] - 1;
    }
    return 0;
}

/* ---- the roster ------------------------------------------------------------- */

static const char *const role_names[K3E_ROLE_COUNT] = {
    [K3E_EMBED] = "embed_tokens.weight",
    [K3E_FC_NORM] = "fc_norm.%d.weight",
    [K3E_FC] = "fc.weight",
    [K3E_INPUT_LN] = "layers.0.input_layernorm.weight",
    [K3E_HIDDEN_NORM] = "layers.0.hidden_norm.weight",
    [K3E_QA] = "layers.0.self_attn.q_a_proj.weight",
    [K3E_QA_NORM] = "layers.0.self_attn.q_a_layernorm.weight",
    [K3E_QB] = "layers.0.self_attn.q_b_proj.weight",
    [K3E_KVA] = "layers.0.self_attn.kv_a_proj_with_mqa.weight",
    [K3E_KVA_NORM] = "layers.0.self_attn.kv_a_layernorm.weight",
    [K3E_KVB] = "layers.0.self_attn.kv_b_proj.weight",
    [K3E_O] = "layers.0.self_attn.o_proj.weight",
    [K3E_POST_LN] = "layers.0.post_attention_layernorm.weight",
    [K3E_GATE] = "layers.0.mlp.gate_proj.weight",
    [K3E_UP] = "layers.0.mlp.up_proj.weight",
    [K3E_DOWN] = "layers.0.mlp.down_proj.weight",
    [K3E_NORM] = "norm.weight",
    [K3E_LM_HEAD] = "lm_head.weight",
};

int k3e_count(const k3_eagle_config *c) { return K3E_ROLE_COUNT - 1 + c->n_taps; }

int k3e_index(const k3_eagle_config *c, k3e_role role, int tap)
{
    if (role == K3E_EMBED) return 0;
    if (role == K3E_FC_NORM) return 1 + tap;
    return (int)role - 1 + c->n_taps;
}

void k3e_at(const k3_eagle_config *c, int i, k3e_spec *o)
{
    const uint64_t E = (uint64_t)c->hidden, V = (uint64_t)c->vocab, F = (uint64_t)c->inter, H = (uint64_t)c->heads;
    const uint64_t Rq = (uint64_t)c->q_lora, Rkv = (uint64_t)c->kv_lora, dn = (uint64_t)c->qk_nope, dr = (uint64_t)c->qk_rope,
                   dv = (uint64_t)c->v_head;
    memset(o, 0, sizeof *o);
    o->tap = -1;
    if (i == 0) o->role = K3E_EMBED;
    else if (i <= c->n_taps) { o->role = K3E_FC_NORM; o->tap = i - 1; }
    else o->role = (k3e_role)(i + 1 - c->n_taps);
    o->part = o->role == K3E_EMBED ? K3E_PART_EMBED : K3E_PART_WEIGHTS;
    if (o->role == K3E_FC_NORM) snprintf(o->name, sizeof o->name, role_names[K3E_FC_NORM], o->tap);
    else snprintf(o->name, sizeof o->name, "%s", role_names[o->role]);
#define SHAPE2(a, b) do { o->ndim = 2; o->shape[0] = (a); o->shape[1] = (b); } while (0)
#define SHAPE1(a) do { o->ndim = 1; o->shape[0] = (a); } while (0)
    switch (o->role) {
    case K3E_EMBED: case K3E_LM_HEAD: SHAPE2(V, E); break;
    case K3E_FC: SHAPE2(E, (uint64_t)c->n_taps * E); break;
    case K3E_FC_NORM: case K3E_INPUT_LN: case K3E_HIDDEN_NORM: case K3E_POST_LN: case K3E_NORM: SHAPE1(E); break;
    case K3E_QA: SHAPE2(Rq, 2 * E); break;
    case K3E_QA_NORM: SHAPE1(Rq); break;
    case K3E_QB: SHAPE2(H * (dn + dr), Rq); break;
    case K3E_KVA: SHAPE2(Rkv + dr, 2 * E); break;
    case K3E_KVA_NORM: SHAPE1(Rkv); break;
    case K3E_KVB: SHAPE2(H * (dn + dv), Rkv); break;
    case K3E_O: SHAPE2(E, H * dv); break;
    case K3E_GATE: case K3E_UP: SHAPE2(F, E); break;
    case K3E_DOWN: SHAPE2(E, F); break;
    case K3E_ROLE_COUNT: break;
    }
#undef SHAPE1
#undef SHAPE2
}

int k3e_find(const k3_eagle_config *c, const char *name)
{
    for (int i = 0; i < k3e_count(c); i++) {
        k3e_spec s;
        k3e_at(c, i, &s);
        if (strcmp(s.name, name) == 0) return i;
    }
    return -1;
}

void k3e_shape_str(int ndim, const uint64_t *shape, char *buf, size_t n)
{
    size_t u = 0;
    buf[0] = 0;
    for (int d = 0; d < ndim && u + 1 < n; d++) {
        snprintf(buf + u, n - u, "%s%llu", d ? ", " : "[", (unsigned long long)shape[d]);
        u = strlen(buf);
    }
    if (u + 1 < n) snprintf(buf + u, n - u, "%s", ndim ? "]" : "[]");
}

uint64_t k3e_bytes(const k3_eagle_config *c, int with_embedding)
{
    uint64_t n = 0;
    for (int i = with_embedding ? 0 : 1; i < k3e_count(c); i++) {
        k3e_spec s;
        uint64_t e = 1;
        k3e_at(c, i, &s);
        for (int d = 0; d < s.ndim; d++) e *= s.shape[d];
        n += e * 2;
    }
    return n;
}

/* ---- a drafter KPK file ------------------------------------------------------- */

int k3e_is_drafter_file(const kpk_file *f) { return (kpk_super(f)->incompat & KPK_INCOMPAT_DRAFTER) != 0; }

int k3e_check_kpk(const kpk_file *f, k3_eagle_config *c, char *err, size_t errlen)
{
    char *text = NULL, cerr[600];
    size_t len;
    kpk_err e = {0};
    int rc, n;
    int64_t part[2];
    if (!k3e_is_drafter_file(f)) {
        errbuf_set(err, errlen, "%s is not a drafter file (a KPK file with the DRAFTER feature, written by kpack convert from a drafter "
                   "checkpoint)", kpk_path(f));
        return -1;
    }
    if (kpk_meta_file(f, "config.json", &text, &len, &e)) { errbuf_set(err, errlen, "%s", e.msg); return -1; }
    rc = k3e_config_parse(text, len, c, cerr, sizeof cerr);
    free(text);
    if (rc) { errbuf_set(err, errlen, "%s: embedded config.json: %s", kpk_path(f), cerr); return -1; }
    part[0] = kpk_find_drafter(f, K3E_PART_WEIGHTS);
    part[1] = kpk_find_drafter(f, K3E_PART_EMBED);
    n = k3e_count(c);
    for (int i = 0; i < n; i++) {
        k3e_spec s;
        kpk_tensor t;
        int64_t idx;
        k3e_at(c, i, &s);
        idx = kpk_find_tensor(f, s.name, &t);
        if (idx < 0) { errbuf_set(err, errlen, "%s: tensor %s is missing", kpk_path(f), s.name); return -1; }
        if (t.dtype != K3E_DTYPE || t.ndim != s.ndim || memcmp(t.shape, s.shape, sizeof s.shape)) {
            char got[80], want[80];
            k3e_shape_str(t.ndim, t.shape, got, sizeof got);
            k3e_shape_str(s.ndim, s.shape, want, sizeof want);
            errbuf_set(err, errlen, "%s: tensor %s is %s %s where the config implies BF16 %s", kpk_path(f), s.name,
                       kpk_dtype_name(t.dtype), got, want);
            return -1;
        }
        if ((int64_t)t.extent != part[s.part]) {
            errbuf_set(err, errlen, "%s: tensor %s is not in the drafter's %s extent", kpk_path(f), s.name,
                       s.part == K3E_PART_EMBED ? "embedding" : "weights");
            return -1;
        }
    }
    /* canonical order and nothing else: each part holds exactly its roster, in order */
    for (int p = 0; p < 2; p++) {
        const kpk_extent *x = kpk_extent_at(f, (uint32_t)part[p]);
        const uint32_t want = p == K3E_PART_EMBED ? 1u : (uint32_t)n - 1;
        if (x->tensor_count != want) {
            errbuf_set(err, errlen, "%s: the drafter's %s extent holds %u tensors, the roster %u", kpk_path(f),
                       p == K3E_PART_EMBED ? "embedding" : "weights", x->tensor_count, want);
            return -1;
        }
        for (uint32_t k = 0; k < x->tensor_count; k++) {
            kpk_tensor t;
            k3e_spec s;
            kpk_tensor_at(f, x->first_tensor + k, &t);
            k3e_at(c, p == K3E_PART_EMBED ? 0 : (int)k + 1, &s);
            if (strcmp(t.name, s.name)) {
                errbuf_set(err, errlen, "%s: tensor %s is out of the drafter's canonical order (%s expected there)", kpk_path(f), t.name,
                           s.name);
                return -1;
            }
        }
    }
    return 0;
}

/* ---- YaRN -------------------------------------------------------------------- */

/* mscale(s, m) = 0.1 m ln s + 1 for s > 1, else 1 (K3_EAGLE §3.7). */
static double yarn_mscale(double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * log(s) + 1.0; }

void k3e_rope(const k3_eagle_config *c, double *omega, double *tau, double *cos_mult)
{
    const int dr = c->qk_rope, half = dr / 2;
    const double base = c->rope_theta;
    double low = 0, high = 0;
    if (c->yarn) {
        /* the dimension index whose wavelength turns `rot` times over L0 */
        const double L0 = (double)c->yarn_orig_max, lnb = log(base);
        const double cf = dr * log(L0 / (2 * M_PI * c->yarn_beta_fast)) / (2 * lnb);
        const double cs = dr * log(L0 / (2 * M_PI * c->yarn_beta_slow)) / (2 * lnb);
        low = floor(cf) > 0 ? floor(cf) : 0;
        high = ceil(cs) < dr - 1 ? ceil(cs) : dr - 1;
        if (low == high) high += 0.001;
    }
    for (int i = 0; i < half; i++) {
        const double e = pow(base, -2.0 * i / dr);
        if (!c->yarn) { omega[i] = e; continue; }
        double ramp = ((double)i - low) / (high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        omega[i] = e * (1 - ramp) + e / c->yarn_factor * ramp;
    }
    *tau = 1.0 / sqrt((double)(c->qk_nope + c->qk_rope));
    *cos_mult = 1.0;
    if (c->yarn) {
        const double all = yarn_mscale(c->yarn_factor, c->yarn_mscale_all_dim);
        *tau *= all * all;
        *cos_mult = yarn_mscale(c->yarn_factor, c->yarn_mscale) / all;
    }
}
