/* config.json -> k3_config (spec §1.5).
 *
 * Two shapes exist.  The released one nests the language-model keys under
 * "text_config" and the KDA block plus the layer map under
 * "text_config.linear_attn_config"; the flat one (test fixtures) has every key
 * at the root, with short names for the KDA dims and the SiTU betas.  We accept
 * both spellings in both shapes, but take the KDA head count and head dim only
 * from linear_attn_config in the nested shape: text_config may carry an
 * unrelated "num_heads"/"head_dim". */
#include "errbuf.h"
#include "k3_config.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum where { LM, KDA_STRICT, KDA_LOOSE };
enum kind { INT, REAL, BOOL_DEFAULT_TRUE };

/* Every numeric field with the range kpack and krun accept: wide around
 * every Kimi model published (the K3 value is the last column), narrow
 * enough that a value no model has (routed_scaling_factor = 1e308, a
 * 2^40-wide layer) is refused by name before anything runs on it.  README
 * "config.json: accepted values" lists this table. */
struct field {
    const char *key;    /* released spelling */
    const char *alias;  /* flat spelling, or NULL */
    enum where where;
    enum kind kind;
    size_t off;         /* offset in k3_config */
    double lo, hi;      /* accepted range, inclusive (INT and REAL) */
    const char *k3;     /* the released K3 value, quoted in messages */
};

#define F(k, a, w, t, m, lo, hi, k3) { k, a, w, t, offsetof(k3_config, m), lo, hi, k3 }
static const struct field fields[] = {
    F("hidden_size", NULL, LM, INT, hidden, 1, 65536, "7168"),
    F("num_hidden_layers", NULL, LM, INT, n_layers, 1, K3_MAX_LAYERS, "93"),
    F("vocab_size", NULL, LM, INT, vocab, 1, 1 << 24, "163840"),
    F("rms_norm_eps", NULL, LM, REAL, rms_eps, 1e-10, 1e-2, "1e-5"),
    F("num_heads", "kda_num_heads", KDA_STRICT, INT, kda_heads, 1, 1024, "96"),
    F("head_dim", "kda_head_dim", KDA_STRICT, INT, kda_head_dim, 1, 1024, "128"),
    F("short_conv_kernel_size", NULL, KDA_LOOSE, INT, conv_width, 1, 64, "4"),
    F("gate_lower_bound", NULL, KDA_LOOSE, REAL, gate_lb, -100, -1e-6, "-5.0"),
    F("num_attention_heads", NULL, LM, INT, mla_heads, 1, 1024, "96"),
    F("q_lora_rank", NULL, LM, INT, q_lora, 1, 65536, "1536"),
    F("kv_lora_rank", NULL, LM, INT, kv_lora, 1, 65536, "512"),
    F("qk_nope_head_dim", NULL, LM, INT, qk_nope, 1, 1024, "128"),
    F("qk_rope_head_dim", NULL, LM, INT, qk_rope, 1, 1024, "64"),
    F("v_head_dim", NULL, LM, INT, v_head, 1, 1024, "128"),
    F("mla_use_output_gate", NULL, LM, BOOL_DEFAULT_TRUE, mla_output_gate, 0, 1, "true"),
    F("num_experts", NULL, LM, INT, n_experts, 1, 65536, "896"),
    F("num_experts_per_token", NULL, LM, INT, topk, 1, 64, "16"),
    F("num_shared_experts", NULL, LM, INT, n_shared, 1, 64, "2"),
    F("routed_expert_hidden_size", NULL, LM, INT, latent, 32, 65536, "3584"),
    F("moe_intermediate_size", NULL, LM, INT, moe_inter, 32, 262144, "3072"),
    F("routed_scaling_factor", NULL, LM, REAL, routed_scale, 1e-3, 100, "1.0"),
    F("moe_renormalize", NULL, LM, BOOL_DEFAULT_TRUE, moe_renormalize, 0, 1, "true"),
    F("latent_moe_use_norm", NULL, LM, BOOL_DEFAULT_TRUE, latent_norm, 0, 1, "true"),
    F("first_k_dense_replace", NULL, LM, INT, first_dense, 0, K3_MAX_LAYERS, "1"),
    F("intermediate_size", NULL, LM, INT, dense_inter, 1, 1 << 20, "33792"),
    F("attn_res_block_size", NULL, LM, INT, attn_res_block, 1, K3_MAX_LAYERS, "12"),
    F("activation_situ_beta", "situ_beta", LM, REAL, situ_beta1, 1e-2, 1e3, "4.0"),
    F("activation_situ_linear_beta", "situ_linear_beta", LM, REAL, situ_beta2, 1e-2, 1e3, "25.0"),
};
#undef F

struct scopes {
    json_t *root, *text, *lin; /* text/lin are NULL in the flat shape */
};

static json_t *get2(json_t *obj, const char *a, const char *b)
{
    json_t *v = NULL;
    if (!obj) return NULL;
    if (a) v = json_object_get(obj, a);
    if (!v && b) v = json_object_get(obj, b);
    return v;
}

/* Where a key is looked up, in order. */
static json_t *lookup(const struct scopes *s, const char *key, const char *alias, enum where w)
{
    json_t *v;
    if (!s->text) return get2(s->root, key, alias); /* flat */
    switch (w) {
    case KDA_STRICT:
        return get2(s->lin, key, alias);
    case KDA_LOOSE:
        if ((v = get2(s->lin, key, alias))) return v;
        if ((v = get2(s->text, key, alias))) return v;
        return get2(s->root, key, alias);
    case LM:
    default:
        if ((v = get2(s->text, key, alias))) return v;
        return get2(s->root, key, alias);
    }
}

/* Booleans may be JSON true/false or the integers 0/1. */
static int json_bool(json_t *v, int *out)
{
    if (json_is_boolean(v)) { *out = json_is_true(v); return 0; }
    if (json_is_integer(v) && (json_integer_value(v) == 0 || json_integer_value(v) == 1)) {
        *out = (int)json_integer_value(v);
        return 0;
    }
    return -1;
}

int k3_config_mla_layer_count(const k3_config *c)
{
    int n = 0;
    for (int L = 0; L < c->n_layers; L++) n += c->layer_is_mla[L];
    return n;
}

static int check_refused(const struct scopes *s, char *err, size_t errlen)
{
    json_t *v;
    int b;
    if ((v = lookup(s, "tie_word_embeddings", NULL, LM)) && (json_bool(v, &b) || b)) {
        errbuf_set(err, errlen, "config: tie_word_embeddings is true; K3 has a separate lm_head and tied embeddings are not supported");
        return -1;
    }
    if ((v = lookup(s, "num_nextn_predict_layers", NULL, LM)) &&
        (!json_is_integer(v) || json_integer_value(v) != 0)) {
        errbuf_set(err, errlen, "config: num_nextn_predict_layers must be 0 (MTP/draft layers are not supported)");
        return -1;
    }
    if ((v = lookup(s, "num_expert_group", NULL, LM)) &&
        (!json_is_integer(v) || json_integer_value(v) > 1)) {
        errbuf_set(err, errlen, "config: num_expert_group > 1 (grouped routing) is not supported");
        return -1;
    }
    if ((v = lookup(s, "mla_use_nope", NULL, LM)) && (json_bool(v, &b) || !b)) {
        errbuf_set(err, errlen, "config: mla_use_nope is false; only NoPE MLA (no rotary embedding) is supported");
        return -1;
    }
    return 0;
}

static int parse_layer_map(const struct scopes *s, k3_config *c, char *err, size_t errlen)
{
    json_t *arr = lookup(s, "full_attn_layers", NULL, KDA_STRICT);
    size_t i;
    json_t *v;
    memset(c->layer_is_mla, 0, sizeof c->layer_is_mla);
    if (!json_is_array(arr) || json_array_size(arr) == 0) {
        errbuf_set(err, errlen, "config: full_attn_layers must be a non-empty array of 1-based layer numbers");
        return -1;
    }
    json_array_foreach(arr, i, v) {
        json_int_t x;
        if (!json_is_integer(v)) {
            errbuf_set(err, errlen, "config: full_attn_layers[%zu] is not an integer", i);
            return -1;
        }
        x = json_integer_value(v);
        /* 1-based (spec trap 1): 1..NL */
        if (x < 1 || x > c->n_layers) {
            errbuf_set(err, errlen, "config: full_attn_layers[%zu] = %lld is outside 1..%d (the list is 1-based)",
                 i, (long long)x, c->n_layers);
            return -1;
        }
        if (c->layer_is_mla[x - 1]) {
            errbuf_set(err, errlen, "config: full_attn_layers lists layer %lld twice", (long long)x);
            return -1;
        }
        c->layer_is_mla[x - 1] = 1;
    }
    if (k3_config_mla_layer_count(c) >= c->n_layers) {
        errbuf_set(err, errlen, "config: every layer is full attention; K3 needs at least one KDA layer");
        return -1;
    }
    return 0;
}

/* One field's value against its range; the message names the field, the
 * value, the range and the K3 value.  (JSON has no NaN or infinity; a
 * number too large for a double does not parse.) */
static int in_range(const struct field *f, double v, int is_int, long long iv, char *err, size_t errlen)
{
    if (isfinite(v) && v >= f->lo && v <= f->hi) return 0;
    if (is_int)
        errbuf_set(err, errlen, "config: %s = %lld is outside the accepted range %.0f..%.0f (Kimi K3: %s)", f->key, iv,
                   f->lo, f->hi, f->k3);
    else
        errbuf_set(err, errlen, "config: %s = %.17g is outside the accepted range %g..%g (Kimi K3: %s)", f->key, v, f->lo,
                   f->hi, f->k3);
    return -1;
}

/* What one field's range cannot say. */
static int validate(const k3_config *c, char *err, size_t errlen)
{
#define NEED(cond, ...) do { if (!(cond)) { errbuf_set(err, errlen, __VA_ARGS__); return -1; } } while (0)
    NEED(c->topk <= c->n_experts, "config: num_experts_per_token = %d must be <= num_experts (%d)", c->topk, c->n_experts);
    NEED(c->first_dense <= c->n_layers, "config: first_k_dense_replace = %d is outside 0..num_hidden_layers (%d)",
         c->first_dense, c->n_layers);
    /* MXFP4 groups 32 elements along the input axis of every expert matrix. */
    NEED(c->latent % 32 == 0, "config: routed_expert_hidden_size = %d is not a multiple of 32 (MXFP4 group)", c->latent);
    NEED(c->moe_inter % 32 == 0, "config: moe_intermediate_size = %d is not a multiple of 32 (MXFP4 group)", c->moe_inter);
    return 0;
#undef NEED
}

int k3_config_parse(const char *json, size_t len, k3_config *c, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr);
    struct scopes s = {0};
    char missing[1024] = "";
    size_t nmissing = 0;
    int rc = -1;

    memset(c, 0, sizeof *c);
    if (!root) {
        errbuf_set(err, errlen, "config.json: invalid JSON at line %d: %s", jerr.line, jerr.text);
        return -1;
    }
    if (!json_is_object(root)) {
        errbuf_set(err, errlen, "config.json: top level is not an object");
        goto out;
    }
    s.root = root;
    s.text = json_object_get(root, "text_config");
    if (s.text) {
        if (!json_is_object(s.text)) {
            errbuf_set(err, errlen, "config.json: text_config is not an object");
            goto out;
        }
        s.lin = json_object_get(s.text, "linear_attn_config");
        if (!json_is_object(s.lin)) {
            errbuf_set(err, errlen, "config.json: nested config without text_config.linear_attn_config");
            goto out;
        }
        c->nested = 1;
    }

    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const struct field *f = &fields[i];
        json_t *v = lookup(&s, f->key, f->alias, f->where);
        char *dst = (char *)c + f->off;
        if (!v) {
            if (f->kind == BOOL_DEFAULT_TRUE) { *(int *)dst = 1; continue; }
            size_t used = strlen(missing);
            snprintf(missing + used, sizeof missing - used, "%s%s", nmissing ? ", " : "",
                     c->nested || !f->alias ? f->key : f->alias);
            nmissing++;
            continue;
        }
        switch (f->kind) {
        case INT:
            if (!json_is_integer(v)) {
                errbuf_set(err, errlen, "config: %s must be an integer", f->key);
                goto out;
            }
            if (in_range(f, (double)json_integer_value(v), 1, (long long)json_integer_value(v), err, errlen)) goto out;
            *(int *)dst = (int)json_integer_value(v);
            break;
        case REAL:
            if (!json_is_number(v)) {
                errbuf_set(err, errlen, "config: %s must be a number", f->key);
                goto out;
            }
            if (in_range(f, json_number_value(v), 0, 0, err, errlen)) goto out;
            *(double *)dst = json_number_value(v);
            break;
        case BOOL_DEFAULT_TRUE:
            if (json_bool(v, (int *)dst)) {
                errbuf_set(err, errlen, "config: %s must be true/false or 0/1", f->key);
                goto out;
            }
            break;
        }
    }
    if (!lookup(&s, "full_attn_layers", NULL, KDA_STRICT)) {
        size_t used = strlen(missing);
        snprintf(missing + used, sizeof missing - used, "%sfull_attn_layers", nmissing ? ", " : "");
        nmissing++;
    }
    if (nmissing) {
        errbuf_set(err, errlen, "config: %zu required field%s missing: %s", nmissing, nmissing > 1 ? "s" : "", missing);
        goto out;
    }
    if (check_refused(&s, err, errlen)) goto out;
    if (validate(c, err, errlen)) goto out;
    if (parse_layer_map(&s, c, err, errlen)) goto out;
    rc = 0;
out:
    json_decref(root);
    return rc;
}
