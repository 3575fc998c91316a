/* JSON Schema -> grammar (kschema.h). */
#include "kschema.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NEST      64        /* schemas inside schemas, compiled at once */
#define MAX_NODES     400000    /* a grammar larger than this is refused (a schema that big is an attack) */
#define MAX_REF_HOPS  32        /* $ref to $ref to ... */
#define INT_DIGITS    16        /* digits of a number's integer part, at most */
#define FRAC_DIGITS   16
#define EXP_DIGITS    2         /* so that every number is a finite double (jansson, JSON.parse) */
#define WS_INDENT     40        /* spaces or tabs after a newline */

enum { T_STRING = 1, T_NUMBER = 2, T_INTEGER = 4, T_BOOLEAN = 8, T_NULL = 16, T_OBJECT = 32, T_ARRAY = 64, T_ALL = 127 };
static const struct { const char *name; int bit; } TYPES[] = {
    {"object", T_OBJECT}, {"array", T_ARRAY}, {"string", T_STRING}, {"number", T_NUMBER},
    {"integer", T_INTEGER}, {"boolean", T_BOOLEAN}, {"null", T_NULL},
};
#define N_TYPES (sizeof TYPES / sizeof *TYPES)

static const char *const ANNOTATIONS[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                          "deprecated", "readOnly", "writeOnly", "$defs", "definitions", NULL};
/* keyword -> the types it constrains (0: not type-specific) */
static const struct { const char *name; int types; } KEYWORDS[] = {
    {"type", 0}, {"enum", 0}, {"const", 0}, {"anyOf", 0}, {"$ref", 0},
    {"minLength", T_STRING}, {"maxLength", T_STRING},
    {"properties", T_OBJECT}, {"required", T_OBJECT}, {"additionalProperties", T_OBJECT},
    {"items", T_ARRAY}, {"minItems", T_ARRAY}, {"maxItems", T_ARRAY},
    {"minimum", T_NUMBER | T_INTEGER}, {"maximum", T_NUMBER | T_INTEGER},
};
#define N_KEYWORDS (sizeof KEYWORDS / sizeof *KEYWORDS)

struct kschema_ctx {
    kgram *g;
    json_t *root;
    struct { json_t *s; uint32_t rule; } *memo;
    size_t n_memo, cap_memo;
    uint32_t ws, number, integer, any;   /* shared rules, made when first needed (+1: 0 = not yet) */
    int nest;
    kschema_err *e;
};

kschema_ctx *kschema_new(kgram *g, json_t *root)
{
    kschema_ctx *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->g = g;
    c->root = root;
    return c;
}

void kschema_free(kschema_ctx *c)
{
    if (!c) return;
    free(c->memo);
    free(c);
}

/* ---- errors and paths ---------------------------------------------------------------------- */

static int fail(kschema_ctx *c, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(kschema_ctx *c, const char *path, const char *fmt, ...)
{
    va_list ap;
    snprintf(c->e->path, sizeof c->e->path, "%s", path);
    va_start(ap, fmt);
    vsnprintf(c->e->msg, sizeof c->e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

static void sub(char *out, size_t n, const char *path, const char *seg)
{
    snprintf(out, n, "%s%s%s", path, *path ? "." : "", seg);
}

static void subi(char *out, size_t n, const char *path, const char *seg, size_t i)
{
    char s[96];
    snprintf(s, sizeof s, "%s.%zu", seg, i);
    sub(out, n, path, s);
}

static void prop_path(char *out, size_t n, const char *path, const char *name)
{
    snprintf(out, n, "%s%sproperties.%s", path, *path ? "." : "", name);
}

static int oom(kschema_ctx *c) { return fail(c, "", "out of memory (or the schema's grammar is too large)"); }

static int too_big(kschema_ctx *c)
{
    return kgram_oom(c->g) || kgram_n_nodes(c->g) > MAX_NODES;
}

/* ---- the keywords of a schema ------------------------------------------------------------- */

static int is_annotation(const char *k)
{
    for (int i = 0; ANNOTATIONS[i]; i++)
        if (!strcmp(ANNOTATIONS[i], k)) return 1;
    return 0;
}

static int keyword_types(const char *k)
{
    for (size_t i = 0; i < N_KEYWORDS; i++)
        if (!strcmp(KEYWORDS[i].name, k)) return KEYWORDS[i].types;
    return -1;
}

/* Every keyword is supported or an annotation.  *present: the types the type-specific keywords
 * constrain; *others: how many keywords besides type and the annotations. */
static int check_keywords(kschema_ctx *c, json_t *s, const char *path, int *present, int *others)
{
    const char *k;
    json_t *v;
    *present = 0;
    *others = 0;
    json_object_foreach(s, k, v) {
        int t;
        char p[256];
        (void)v;
        if (is_annotation(k)) continue;
        if ((t = keyword_types(k)) < 0) {
            sub(p, sizeof p, path, k);
            return fail(c, p, "unsupported JSON Schema keyword \"%.60s\": constrained decoding supports type, properties, "
                        "required, additionalProperties, items, minItems, maxItems, minLength, maxLength, minimum, "
                        "maximum, enum, const, anyOf, $ref (docs/SERVE.md)", k);
        }
        *present |= t;
        if (strcmp(k, "type")) ++*others;
    }
    return 0;
}

/* A count keyword: absent (dflt), or an integer >= 0 (capped below KG_INF). */
static int count_kw(kschema_ctx *c, json_t *s, const char *key, const char *path, int32_t dflt, int32_t *out)
{
    json_t *v = json_object_get(s, key);
    char p[256];
    *out = dflt;
    if (!v) return 0;
    sub(p, sizeof p, path, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0) return fail(c, p, "%s must be a non-negative integer", key);
    *out = json_integer_value(v) >= KG_INF ? KG_INF - 1 : (int32_t)json_integer_value(v);
    return 0;
}

/* The types a schema admits: its "type" (a name or an array of names), else those its keywords
 * constrain, else all. */
static int types_of(kschema_ctx *c, json_t *s, const char *path, int present, int *mask)
{
    json_t *t = json_object_get(s, "type");
    char p[256];
    sub(p, sizeof p, path, "type");
    *mask = 0;
    if (!t) { *mask = present ? present : T_ALL; return 0; }
    for (size_t i = 0; i < (json_is_array(t) ? json_array_size(t) : 1); i++) {
        json_t *x = json_is_array(t) ? json_array_get(t, i) : t;
        size_t k;
        if (!json_is_string(x)) return fail(c, p, "type must be a type name or an array of type names");
        for (k = 0; k < N_TYPES; k++)
            if (!strcmp(TYPES[k].name, json_string_value(x))) break;
        if (k == N_TYPES)
            return fail(c, p, "unknown type \"%.40s\" (string, number, integer, boolean, null, object, array)", json_string_value(x));
        *mask |= TYPES[k].bit;
    }
    if (json_is_array(t) && !json_array_size(t)) return fail(c, p, "type must not be an empty array");
    if (*mask & T_NUMBER) *mask &= ~T_INTEGER;      /* every integer is a number */
    return 0;
}

/* $ref: a JSON pointer into the root document ("#", "#/$defs/x", "#/properties/a/items"). */
static int resolve(kschema_ctx *c, json_t *s, const char *path, json_t **out)
{
    json_t *r = json_object_get(s, "$ref"), *at = c->root;
    const char *p;
    char pp[256];
    sub(pp, sizeof pp, path, "$ref");
    if (!json_is_string(r)) return fail(c, pp, "$ref must be a string");
    p = json_string_value(r);
    if (p[0] != '#' || (p[1] && p[1] != '/'))
        return fail(c, pp, "$ref \"%.80s\": only references inside the schema (\"#\", \"#/$defs/NAME\", ...) are supported", p);
    p += 1;
    while (*p == '/') {
        char tok[256];
        size_t n = 0;
        p++;
        while (*p && *p != '/' && n < sizeof tok - 1) {
            if (p[0] == '~' && p[1] == '1') { tok[n++] = '/'; p += 2; }
            else if (p[0] == '~' && p[1] == '0') { tok[n++] = '~'; p += 2; }
            else tok[n++] = *p++;
        }
        tok[n] = 0;
        if (json_is_object(at)) at = json_object_get(at, tok);
        else if (json_is_array(at)) {
            char *end;
            unsigned long i = strtoul(tok, &end, 10);
            at = *tok && !*end ? json_array_get(at, i) : NULL;
        } else at = NULL;
        if (!at) return fail(c, pp, "$ref \"%.80s\" points to nothing in the schema", json_string_value(r));
    }
    *out = at;
    return 0;
}

/* ---- shared rules ---------------------------------------------------------------------------- */

/* n digits, min <= n <= max, then next */
static uint32_t digits(kgram *g, int min, int max, uint32_t next)
{
    uint32_t node = next;
    for (int i = max - 1; i >= 0; i--) {
        uint32_t d = kg_range(g, '0', '9', node);
        node = i >= min ? kg_split(g, next, d) : d;
    }
    return node;
}

static uint32_t number_body(kgram *g, int integer)
{
    uint32_t ret = kg_ret(g), after, ip;
    if (integer) {
        after = ret;
    } else {
        uint32_t exp = kg_byteset(g, (const uint8_t[32]){[4] = 0x00, [8] = 0x20, [12] = 0x20},   /* E e */
                                  kg_split(g, kg_byteset(g, (const uint8_t[32]){[5] = 0x28}, digits(g, 1, EXP_DIGITS, ret)),  /* + - */
                                           digits(g, 1, EXP_DIGITS, ret)));
        uint32_t frac = kg_byte(g, '.', digits(g, 1, FRAC_DIGITS, kg_split(g, ret, exp)));
        after = kg_split(g, ret, kg_split(g, frac, exp));
    }
    ip = kg_split(g, kg_byte(g, '0', after), kg_range(g, '1', '9', digits(g, 0, INT_DIGITS - 1, after)));
    return kg_split(g, kg_byte(g, '-', ip), ip);
}

static uint32_t shared(kschema_ctx *c, uint32_t *slot, int which)
{
    kgram *g = c->g;
    if (!*slot) {
        uint32_t r = kg_rule_new(g), body = 0;
        *slot = r + 1;
        if (which == 0) {
            /* whitespace: none, one space, or a newline and up to WS_INDENT spaces or tabs */
            uint32_t ret = kg_ret(g), ind = ret;
            for (int i = 0; i < WS_INDENT; i++)
                ind = kg_split(g, ret, kg_byteset(g, (const uint8_t[32]){[1] = 0x02, [4] = 0x01}, ind));   /* \t ' ' */
            body = kg_split(g, ret, kg_split(g, kg_byte(g, ' ', ret), kg_byte(g, '\n', ind)));
        } else if (which == 1 || which == 2) {
            body = number_body(g, which == 2);
        }
        kg_rule_body(g, r, body);
    }
    return *slot - 1;
}

uint32_t kschema_ws(kschema_ctx *c, uint32_t next) { return kg_call(c->g, shared(c, &c->ws, 0), next); }
static uint32_t ws(kschema_ctx *c, uint32_t next) { return kschema_ws(c, next); }
static uint32_t number(kschema_ctx *c, int integer, uint32_t next)
{
    return kg_call(c->g, integer ? shared(c, &c->integer, 2) : shared(c, &c->number, 1), next);
}

static uint32_t any_rule(kschema_ctx *c);

/* The most integer digits k (0 .. INT_DIGITS) such that every number of at most k digits is at most
 * b in magnitude: 10^k - 1 <= b; when k is 0, *top: the largest single digit within b (0 .. 9);
 * *frac: a fraction may follow (the integer part's largest value + 1 <= b, number only). */
static int digits_within(double b, int integer, int *top, int *frac)
{
    double p = 1;
    int k = 0;
    while (k < INT_DIGITS && p * 10 - 1 <= b) { p *= 10; k++; }
    *top = k ? 9 : b >= 9 ? 9 : b >= 0 ? (int)b : 0;
    *frac = !integer && (k ? p <= b : *top + 1 <= b);
    return k;
}

/* One side of zero: up to k digits without a leading zero (k 0: one digit 0 .. top), then a
 * fraction if frac (k 0 and a number: digits under top always may have one: they stay under it). */
static uint32_t magnitude(kgram *g, int k, int top, int frac, int integer, uint32_t next)
{
    uint32_t with = kg_split(g, next, kg_byte(g, '.', digits(g, 1, FRAC_DIGITS, next)));
    uint32_t after = frac ? with : next;
    if (!k && !integer && top >= 1)
        return kg_split(g, kg_range(g, '0', (uint8_t)('0' + top - 1), with), kg_byte(g, (uint8_t)('0' + top), after));
    if (!k) return kg_range(g, '0', (uint8_t)('0' + top), after);
    return kg_split(g, kg_byte(g, '0', after), kg_range(g, '1', '9', digits(g, 0, k - 1, after)));
}

/* A number or integer with minimum / maximum.  What is generated is a subset of the range that
 * digits can say: numbers with at most kp integer digits (or one digit up to the bound, when it is
 * under 9; and a fraction when the bound leaves room for one) up from 0, at most kn below it, no exponent; so the range must hold 0.  zod's
 * .int() (minimum -(2^53 - 1), maximum 2^53 - 1) gets 15 digits either side. */
static int bounded_number(kschema_ctx *c, json_t *s, const char *path, int integer, uint32_t next, uint32_t *start)
{
    json_t *mn = json_object_get(s, "minimum"), *mx = json_object_get(s, "maximum");
    double lo = -1e300, hi = 1e300;
    int kp, kn, tp, tn, fp, fn;
    char p[256];
    if (!mn && !mx) { *start = number(c, integer, next); return 0; }
    if (mn && !json_is_number(mn)) { sub(p, sizeof p, path, "minimum"); return fail(c, p, "minimum must be a number"); }
    if (mx && !json_is_number(mx)) { sub(p, sizeof p, path, "maximum"); return fail(c, p, "maximum must be a number"); }
    if (mn) lo = json_number_value(mn);
    if (mx) hi = json_number_value(mx);
    if (lo > 0 || hi < 0) {
        sub(p, sizeof p, path, lo > 0 ? "minimum" : "maximum");
        return fail(c, p, "\"%s\" %s 0 is not supported: constrained decoding bounds numbers by their digits either side of 0, "
                    "so the range must hold 0 (docs/SERVE.md)", lo > 0 ? "minimum" : "maximum", lo > 0 ? "above" : "below");
    }
    kp = digits_within(hi, integer, &tp, &fp);
    kn = digits_within(-lo, integer, &tn, &fn);
    *start = magnitude(c->g, kp, tp, fp, integer, next);
    if (kn || tn) *start = kg_split(c->g, *start, kg_byte(c->g, '-', magnitude(c->g, kn, tn, fn, integer, next)));
    return 0;
}

/* A free-form object: { "key": value, ... } with values of rule val. */
static uint32_t map_object(kschema_ctx *c, uint32_t val, uint32_t next)
{
    kgram *g = c->g;
    uint32_t close = kg_byte(g, '}', next);
    uint32_t loop = kg_node_new(g, KG_SPLIT, 0, 0, 0, 0);
    uint32_t lws = ws(c, loop);
    uint32_t member = kg_byte(g, '"', kg_body(g, KG_TEXT_JSON, 0, KG_INF, ws(c, kg_byte(g, ':', ws(c, kg_call(g, val, lws))))));
    kg_set_next(g, loop, close, kg_byte(g, ',', ws(c, member)));
    return kg_byte(g, '{', ws(c, kg_split(g, close, member)));
}

/* [ item, ... ] with min..max items of rule item.  The frame's counter counts them (the items are
 * calls: nothing else in this frame touches it). */
static uint32_t array_of(kschema_ctx *c, uint32_t item, int32_t min, int32_t max, uint32_t next)
{
    kgram *g = c->g;
    uint32_t end, loop, lws, more, first;
    if (min > max) return kg_fail(g);
    end = kg_node_new(g, KG_CGE, kg_byte(g, ']', next), kg_call(g, item, kg_ret(g)), min, 0);
    loop = kg_node_new(g, KG_SPLIT, 0, 0, 0, 0);
    lws = ws(c, loop);
    more = kg_node_new(g, KG_CLT, kg_byte(g, ',', ws(c, kg_node_new(g, KG_CINC, kg_call(g, item, lws), 0, 0, 0))), 0, 0, max);
    kg_set_next(g, loop, end, more);
    first = kg_node_new(g, KG_CLT, kg_node_new(g, KG_CINC, kg_call(g, item, lws), 0, 0, 0), 0, 0, max);
    return kg_node_new(g, KG_CZERO, kg_byte(g, '[', ws(c, kg_split(g, end, first))), 0, 0, 0);
}

/* Any JSON value. */
static uint32_t any_rule(kschema_ctx *c)
{
    kgram *g = c->g;
    if (!c->any) {
        uint32_t r = kg_rule_new(g), ret = kg_ret(g), body, arr;
        c->any = r + 1;
        /* the array in a rule of its own: its counter must have a frame to itself */
        arr = kg_rule_new(g);
        kg_rule_body(g, arr, array_of(c, r, 0, KG_INF - 1, ret));
        body = kg_split(g, kg_byte(g, '"', kg_body(g, KG_TEXT_JSON, 0, KG_INF, ret)),
               kg_split(g, number(c, 0, ret),
               kg_split(g, map_object(c, r, ret),
               kg_split(g, kg_call(g, arr, ret),
               kg_split(g, kg_lit(g, "true", 4, ret), kg_split(g, kg_lit(g, "false", 5, ret), kg_lit(g, "null", 4, ret)))))));
        kg_rule_body(g, r, body);
    }
    return c->any - 1;
}

/* ---- schemas ------------------------------------------------------------------------------- */

static int compile(kschema_ctx *c, json_t *s, const char *path, uint32_t next, uint32_t *start);

/* The rule of a schema (one per schema object: $ref recursion ends here). */
static int rule_of(kschema_ctx *c, json_t *s, const char *path, uint32_t *rule)
{
    uint32_t r, body;
    /* a schema that is only a $ref is its target's rule (a frame less per level of a recursive schema) */
    for (int hops = 0; json_is_object(s) && json_object_get(s, "$ref"); hops++) {
        int present, others;
        json_t *t;
        if (check_keywords(c, s, path, &present, &others) || resolve(c, s, path, &t)) return -1;
        if (others + (json_object_get(s, "type") != NULL) > 1) break;        /* compile() says why */
        if (hops == MAX_REF_HOPS) return fail(c, path, "$ref chains longer than %d (or a $ref to itself)", MAX_REF_HOPS);
        s = t;
    }
    for (size_t i = 0; i < c->n_memo; i++)
        if (c->memo[i].s == s) { *rule = c->memo[i].rule; return 0; }
    if (c->n_memo == c->cap_memo) {
        size_t cap = c->cap_memo ? 2 * c->cap_memo : 16;
        void *m = realloc(c->memo, cap * sizeof *c->memo);
        if (!m) return oom(c);
        c->memo = m;
        c->cap_memo = cap;
    }
    r = kg_rule_new(c->g);
    c->memo[c->n_memo].s = s;
    c->memo[c->n_memo++].rule = r;
    if (compile(c, s, path, kg_ret(c->g), &body)) return -1;
    kg_rule_body(c->g, r, body);
    *rule = r;
    return 0;
}

static int call_schema(kschema_ctx *c, json_t *s, const char *path, uint32_t next, uint32_t *start)
{
    uint32_t r;
    if (rule_of(c, s, path, &r)) return -1;
    *start = kg_call(c->g, r, next);
    return 0;
}

static const char *json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE: case JSON_FALSE: return "boolean";
    default: return "null";
    }
}

static int value_in(const json_t *v, int mask)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return mask & T_OBJECT;
    case JSON_ARRAY: return mask & T_ARRAY;
    case JSON_STRING: return mask & T_STRING;
    case JSON_INTEGER: return mask & (T_INTEGER | T_NUMBER);
    case JSON_REAL: return (mask & T_NUMBER) || ((mask & T_INTEGER) && json_real_value(v) == (double)(long long)json_real_value(v));
    case JSON_TRUE: case JSON_FALSE: return mask & T_BOOLEAN;
    default: return mask & T_NULL;
    }
}

/* enum / const: their values (those of the allowed types), each written exactly, then next.  raw:
 * a string as raw text (a K3 tool argument), not as JSON. */
static int literals(kschema_ctx *c, json_t *s, const char *path, int mask, int raw, const char *only_type, uint32_t next,
                    uint32_t *start)
{
    json_t *en = json_object_get(s, "enum"), *co = json_object_get(s, "const");
    size_t n = co ? 1 : json_array_size(en);
    char p[256];
    uint32_t alt = kg_fail(c->g);
    sub(p, sizeof p, path, co ? "const" : "enum");
    if (en && co) return fail(c, path, "enum and const together are not supported");
    if (en && !json_is_array(en)) return fail(c, p, "enum must be an array");
    for (size_t i = n; i-- > 0;) {
        json_t *v = co ? co : json_array_get(en, i);
        char *text;
        if (!value_in(v, mask)) continue;
        if (only_type) {
            const char *t = json_type_name(v);
            if (!strcmp(t, "integer")) t = "number";
            if (strcmp(t, only_type)) continue;
        }
        if (raw && json_is_string(v)) {
            alt = kg_split(c->g, kg_lit(c->g, json_string_value(v), json_string_length(v), next), alt);
            continue;
        }
        text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!text) return oom(c);
        alt = kg_split(c->g, kg_lit(c->g, text, strlen(text), next), alt);
        free(text);
    }
    *start = alt;
    return 0;
}

/* The declared properties of an object schema: properties in order, then required names it does
 * not declare (their values: additionalProperties, or anything). */
typedef struct {
    const char **names;
    json_t **schemas;
    char *required;
    size_t n;
} props;

static void props_free(props *p) { free(p->names); free(p->schemas); free(p->required); }

static int get_props(kschema_ctx *c, json_t *s, const char *path, props *out, int *map, json_t **map_schema)
{
    json_t *pr = json_object_get(s, "properties"), *rq = json_object_get(s, "required"), *ap = json_object_get(s, "additionalProperties");
    size_t cap;
    const char *k;
    json_t *v;
    char p[256];
    memset(out, 0, sizeof *out);
    if (pr && !json_is_object(pr)) { sub(p, sizeof p, path, "properties"); return fail(c, p, "properties must be an object"); }
    if (rq && !json_is_array(rq)) { sub(p, sizeof p, path, "required"); return fail(c, p, "required must be an array of names"); }
    if (ap && !json_is_boolean(ap) && !json_is_object(ap)) {
        sub(p, sizeof p, path, "additionalProperties");
        return fail(c, p, "additionalProperties must be a boolean or a schema");
    }
    cap = json_object_size(pr) + json_array_size(rq) + 1;
    out->names = calloc(cap, sizeof *out->names);
    out->schemas = calloc(cap, sizeof *out->schemas);
    out->required = calloc(cap, 1);
    if (!out->names || !out->schemas || !out->required) { props_free(out); return oom(c); }
    json_object_foreach(pr, k, v) {
        out->names[out->n] = k;
        out->schemas[out->n++] = v;
    }
    for (size_t i = 0; i < json_array_size(rq); i++) {
        json_t *x = json_array_get(rq, i);
        size_t j;
        if (!json_is_string(x)) { subi(p, sizeof p, path, "required", i); props_free(out); return fail(c, p, "required names must be strings"); }
        for (j = 0; j < out->n; j++)
            if (!strcmp(out->names[j], json_string_value(x))) break;
        if (j < out->n && out->required[j]) {
            subi(p, sizeof p, path, "required", i);
            props_free(out);
            return fail(c, p, "\"%.60s\" is required twice", json_string_value(x));
        }
        if (j == out->n) {
            out->names[j] = json_string_value(x);
            /* additionalProperties false: no such property can be -> the object cannot be */
            out->schemas[j] = json_is_false(ap) ? json_false() : ap && json_is_object(ap) ? ap : json_true();
            out->n++;
        }
        out->required[j] = 1;
    }
    *map = out->n == 0 && !json_is_false(ap);
    *map_schema = ap && json_is_object(ap) ? ap : NULL;
    return 0;
}

/* The members in order, required ones never skipped: after[i] follows member i (after[n]: before
 * any).  member(j, to): the grammar of member j going on to `to`; sep: what comes between members;
 * end: what ends the list. */
typedef int (*member_fn)(kschema_ctx *c, void *ctx, size_t j, uint32_t to, uint32_t *start);

static int ordered_members(kschema_ctx *c, const props *pp, member_fn member, void *ctx, uint32_t (*sep)(kschema_ctx *, uint32_t),
                           uint32_t end, uint32_t *first)
{
    kgram *g = c->g;
    size_t n = pp->n;
    uint32_t *entry = calloc(n + 1, sizeof *entry);   /* entry[j]: member j, then what may follow it */
    if (!entry) return oom(c);
    for (size_t j = n; j-- > 0;) {
        /* after member j: the end (if no required member follows) or a separator and a later member */
        uint32_t after = kg_fail(g), alts = kg_fail(g);
        int req_after = 0;
        for (size_t k = j + 1; k < n; k++) {
            alts = kg_split(g, alts, entry[k]);
            if (pp->required[k]) { req_after = 1; break; }
        }
        if (!req_after) after = end;
        after = kg_split(g, after, alts ? (sep ? sep(c, alts) : alts) : kg_fail(g));
        if (member(c, ctx, j, after, &entry[j])) { free(entry); return -1; }
    }
    {
        uint32_t alts = kg_fail(g);
        int req = 0;
        for (size_t k = 0; k < n; k++) {
            alts = kg_split(g, alts, entry[k]);
            if (pp->required[k]) { req = 1; break; }
        }
        *first = kg_split(g, req ? kg_fail(g) : end, alts);
    }
    free(entry);
    return 0;
}

typedef struct { const props *pp; const char *path; } json_members;

static uint32_t comma(kschema_ctx *c, uint32_t next) { return kg_byte(c->g, ',', ws(c, next)); }

static int json_member(kschema_ctx *c, void *ctx, size_t j, uint32_t to, uint32_t *start)
{
    json_members *m = ctx;
    json_t *key = json_string(m->pp->names[j]);
    char *lit = key ? json_dumps(key, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    char p[256];
    uint32_t val;
    json_decref(key);
    if (!lit) return oom(c);
    prop_path(p, sizeof p, m->path, m->pp->names[j]);
    if (call_schema(c, m->pp->schemas[j], p, ws(c, to), &val)) { free(lit); return -1; }
    *start = kg_lit(c->g, lit, strlen(lit), ws(c, kg_byte(c->g, ':', ws(c, val))));
    free(lit);
    return 0;
}

static int object(kschema_ctx *c, json_t *s, const char *path, uint32_t next, uint32_t *start)
{
    kgram *g = c->g;
    props pp;
    int map;
    json_t *ms;
    uint32_t first;
    if (get_props(c, s, path, &pp, &map, &ms)) return -1;
    if (map) {
        uint32_t val;
        char p[256];
        sub(p, sizeof p, path, "additionalProperties");
        if (ms) { if (rule_of(c, ms, p, &val)) { props_free(&pp); return -1; } }
        else val = any_rule(c);
        props_free(&pp);
        *start = map_object(c, val, next);
        return 0;
    }
    {
        json_members m = {&pp, path};
        if (ordered_members(c, &pp, json_member, &m, comma, kg_byte(g, '}', next), &first)) { props_free(&pp); return -1; }
    }
    props_free(&pp);
    *start = kg_byte(g, '{', ws(c, first));
    return 0;
}

static int array(kschema_ctx *c, json_t *s, const char *path, uint32_t next, uint32_t *start)
{
    json_t *items = json_object_get(s, "items");
    int32_t min, max;
    uint32_t item;
    char p[256];
    if (count_kw(c, s, "minItems", path, 0, &min) || count_kw(c, s, "maxItems", path, KG_INF - 1, &max)) return -1;
    sub(p, sizeof p, path, "items");
    if (items && json_is_array(items)) return fail(c, p, "items as an array (a tuple) is not supported: give one schema for every item");
    if (items && !json_is_object(items) && !json_is_boolean(items)) return fail(c, p, "items must be a schema");
    if (items) { if (rule_of(c, items, p, &item)) return -1; }
    else item = any_rule(c);
    *start = array_of(c, item, min, max, next);
    return 0;
}

/* One type of a schema, then next. */
static int typed(kschema_ctx *c, json_t *s, const char *path, int type, uint32_t next, uint32_t *start)
{
    kgram *g = c->g;
    int32_t lo, hi;
    switch (type) {
    case T_STRING:
        if (count_kw(c, s, "minLength", path, 0, &lo) || count_kw(c, s, "maxLength", path, KG_INF - 1, &hi)) return -1;
        *start = kg_byte(g, '"', kg_body(g, KG_TEXT_JSON, lo, hi, next));
        return 0;
    case T_NUMBER: return bounded_number(c, s, path, 0, next, start);
    case T_INTEGER: return bounded_number(c, s, path, 1, next, start);
    case T_BOOLEAN: *start = kg_split(g, kg_lit(g, "true", 4, next), kg_lit(g, "false", 5, next)); return 0;
    case T_NULL: *start = kg_lit(g, "null", 4, next); return 0;
    case T_OBJECT: return object(c, s, path, next, start);
    default: return array(c, s, path, next, start);
    }
}

/* What a schema allows besides type and annotations: $ref, enum/const or anyOf alone. */
static int combinator(kschema_ctx *c, const char *path, int others, const char *kw)
{
    if (others > 1) {
        char p[256];
        sub(p, sizeof p, path, kw);
        return fail(c, p, "%s together with other keywords (besides type and annotations) is not supported", kw);
    }
    return 0;
}

static int compile(kschema_ctx *c, json_t *s, const char *path, uint32_t next, uint32_t *start)
{
    int present, others, mask, rc = -1;
    uint32_t alt;
    if (json_is_true(s)) { *start = kg_call(c->g, any_rule(c), next); return too_big(c) ? oom(c) : 0; }
    if (json_is_false(s)) { *start = kg_fail(c->g); return 0; }
    if (!json_is_object(s)) return fail(c, path, "a schema must be an object or a boolean");
    if (c->nest >= MAX_NEST) return fail(c, path, "schemas nested more than %d deep", MAX_NEST);
    if (too_big(c)) return oom(c);
    c->nest++;
    if (check_keywords(c, s, path, &present, &others)) goto out;
    if (json_object_get(s, "$ref")) {
        json_t *t;
        if (combinator(c, path, others + (json_object_get(s, "type") != NULL), "$ref") || resolve(c, s, path, &t)) goto out;
        rc = call_schema(c, t, path, next, start);
        goto out;
    }
    if (types_of(c, s, path, present, &mask)) goto out;
    if (json_object_get(s, "enum") || json_object_get(s, "const")) {
        if (combinator(c, path, others, json_object_get(s, "enum") ? "enum" : "const")) goto out;
        rc = literals(c, s, path, mask, 0, NULL, next, start);
        goto out;
    }
    if (json_object_get(s, "anyOf")) {
        json_t *any = json_object_get(s, "anyOf");
        char p[256];
        sub(p, sizeof p, path, "anyOf");
        if (combinator(c, path, others + (json_object_get(s, "type") != NULL), "anyOf")) goto out;
        if (!json_is_array(any) || !json_array_size(any)) { fail(c, p, "anyOf must be a non-empty array of schemas"); goto out; }
        alt = kg_fail(c->g);
        for (size_t i = json_array_size(any); i-- > 0;) {
            uint32_t b;
            char q[256];
            subi(q, sizeof q, path, "anyOf", i);
            if (call_schema(c, json_array_get(any, i), q, next, &b)) goto out;
            alt = kg_split(c->g, b, alt);
        }
        *start = alt;
        rc = 0;
        goto out;
    }
    alt = kg_fail(c->g);
    for (size_t k = N_TYPES; k-- > 0;) {
        uint32_t b;
        if (!(mask & TYPES[k].bit)) continue;
        if (typed(c, s, path, TYPES[k].bit, next, &b)) goto out;
        alt = kg_split(c->g, b, alt);
    }
    *start = alt;
    rc = 0;
out:
    c->nest--;
    if (!rc && too_big(c)) rc = oom(c);
    return rc;
}

int kschema_json(kschema_ctx *c, json_t *schema, uint32_t next, uint32_t *start, kschema_err *e)
{
    c->e = e;
    memset(e, 0, sizeof *e);
    /* in a rule of its own: the schema's counters (arrays) get a frame that nothing else uses */
    return call_schema(c, schema, "", next, start);
}

/* ---- K3 tool arguments ---------------------------------------------------------------------- */

/* After `type="`: the alternatives `T"<|sep|>VALUE` of a schema, each going on to next. */
static int arg_alts(kschema_ctx *c, json_t *s, const char *path, uint32_t next, uint32_t *start)
{
    kgram *g = c->g;
    int present, others, mask, rc = -1;
    uint32_t alt = kg_fail(g);
    for (int hops = 0; json_is_object(s) && json_object_get(s, "$ref"); hops++) {
        json_t *t;
        if (hops == MAX_REF_HOPS) return fail(c, path, "$ref chains longer than %d", MAX_REF_HOPS);
        if (check_keywords(c, s, path, &present, &others) ||
            combinator(c, path, others + (json_object_get(s, "type") != NULL), "$ref") || resolve(c, s, path, &t))
            return -1;
        s = t;
    }
    if (json_is_false(s)) { *start = kg_fail(g); return 0; }
    if (c->nest >= MAX_NEST) return fail(c, path, "schemas nested more than %d deep", MAX_NEST);
    if (too_big(c)) return oom(c);
    c->nest++;
    if (json_is_true(s)) {
        present = others = 0;
        mask = T_ALL;
    } else if (!json_is_object(s)) {
        fail(c, path, "a schema must be an object or a boolean");
        goto out;
    } else if (check_keywords(c, s, path, &present, &others) || types_of(c, s, path, present, &mask)) {
        goto out;
    }
    if (json_is_object(s) && (json_object_get(s, "enum") || json_object_get(s, "const"))) {
        static const char *const k3[] = {"string", "number", "boolean", "null", "object", "array"};
        if (combinator(c, path, others, json_object_get(s, "enum") ? "enum" : "const")) goto out;
        for (size_t k = 6; k-- > 0;) {
            uint32_t v;
            char head[16];
            if (literals(c, s, path, mask, 1, k3[k], kg_sym(g, KG_SYM_CLOSE, next), &v)) goto out;
            if (!v) continue;
            snprintf(head, sizeof head, "%s\"", k3[k]);
            alt = kg_split(g, kg_lit(g, head, strlen(head), kg_sym(g, KG_SYM_SEP, v)), alt);
        }
        *start = alt;
        rc = 0;
        goto out;
    }
    if (json_is_object(s) && json_object_get(s, "anyOf")) {
        json_t *any = json_object_get(s, "anyOf");
        char p[256];
        sub(p, sizeof p, path, "anyOf");
        if (combinator(c, path, others + (json_object_get(s, "type") != NULL), "anyOf")) goto out;
        if (!json_is_array(any) || !json_array_size(any)) { fail(c, p, "anyOf must be a non-empty array of schemas"); goto out; }
        for (size_t i = json_array_size(any); i-- > 0;) {
            uint32_t b;
            char q[256];
            subi(q, sizeof q, path, "anyOf", i);
            if (arg_alts(c, json_array_get(any, i), q, next, &b)) goto out;
            alt = kg_split(g, b, alt);
        }
        *start = alt;
        rc = 0;
        goto out;
    }
    for (size_t k = N_TYPES; k-- > 0;) {
        int t = TYPES[k].bit;
        uint32_t v, close = kg_sym(g, KG_SYM_CLOSE, next);
        const char *name = t == T_INTEGER ? "number" : TYPES[k].name;
        char head[16];
        if (!(mask & t)) continue;
        if (t == T_STRING) {
            int32_t lo = 0, hi = KG_INF - 1;
            if (json_is_object(s) && (count_kw(c, s, "minLength", path, 0, &lo) || count_kw(c, s, "maxLength", path, KG_INF - 1, &hi))) goto out;
            v = kg_body(g, KG_TEXT_RAW, lo, hi, close);
        } else if (t == T_OBJECT || t == T_ARRAY) {
            /* JSON, in a rule of its own (an array counts its items in its frame) */
            uint32_t r = kg_rule_new(g), body;
            if (json_is_true(s)) body = t == T_OBJECT ? map_object(c, any_rule(c), kg_ret(g)) : array_of(c, any_rule(c), 0, KG_INF - 1, kg_ret(g));
            else if (typed(c, s, path, t, kg_ret(g), &body)) goto out;
            kg_rule_body(g, r, body);
            v = kg_call(g, r, close);
        } else if (typed(c, s, path, t, close, &v)) {
            goto out;
        }
        snprintf(head, sizeof head, "%s\"", name);
        alt = kg_split(g, kg_lit(g, head, strlen(head), kg_sym(g, KG_SYM_SEP, v)), alt);
    }
    *start = alt;
    rc = 0;
out:
    c->nest--;
    return rc;
}

char *kschema_attr_escape(const char *s)
{
    size_t n = 0;
    char *o, *p;
    for (const char *q = s; *q; q++) n += *q == '&' ? 5 : *q == '"' ? 6 : 1;
    o = p = malloc(n + 1);
    if (!o) return NULL;
    for (; *s; s++) {
        if (*s == '&') { memcpy(p, "&amp;", 5); p += 5; }
        else if (*s == '"') { memcpy(p, "&quot;", 6); p += 6; }
        else *p++ = *s;
    }
    *p = 0;
    return o;
}

typedef struct { const props *pp; const char *path; } arg_members;

/* <|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>, then to */
static int arg_member(kschema_ctx *c, void *ctx, size_t j, uint32_t to, uint32_t *start)
{
    arg_members *m = ctx;
    kgram *g = c->g;
    char *key = kschema_attr_escape(m->pp->names[j]);
    char p[256];
    uint32_t after = kg_lit(g, "argument", 8, kg_sym(g, KG_SYM_SEP, to)), alts;
    if (!key) return oom(c);
    prop_path(p, sizeof p, m->path, m->pp->names[j]);
    if (arg_alts(c, m->pp->schemas[j], p, after, &alts)) { free(key); return -1; }
    {
        size_t n = strlen(key) + 32;
        char *head = malloc(n);
        if (!head) { free(key); return oom(c); }
        snprintf(head, n, "argument key=\"%s\" type=\"", key);
        *start = kg_sym(g, KG_SYM_OPEN, kg_lit(g, head, strlen(head), alts));
        free(head);
    }
    free(key);
    return 0;
}

int kschema_k3_args(kschema_ctx *c, json_t *schema, uint32_t next, uint32_t *start, kschema_err *e)
{
    kgram *g = c->g;
    int present, others, mask, map;
    props pp;
    json_t *ms, *s = schema;
    c->e = e;
    memset(e, 0, sizeof *e);
    if (!s) { *start = next; return 0; }
    for (int hops = 0; json_is_object(s) && json_object_get(s, "$ref"); hops++) {
        json_t *t;
        if (hops == MAX_REF_HOPS) return fail(c, "", "$ref chains longer than %d", MAX_REF_HOPS);
        if (check_keywords(c, s, "", &present, &others) || combinator(c, "", others + (json_object_get(s, "type") != NULL), "$ref") ||
            resolve(c, s, "", &t))
            return -1;
        s = t;
    }
    if (!json_is_object(s)) return fail(c, "", "the parameters must be a JSON Schema object");
    if (check_keywords(c, s, "", &present, &others) || types_of(c, s, "", present, &mask)) return -1;
    if (!json_object_get(s, "type") && !(present & T_OBJECT)) mask = T_OBJECT;     /* {} : any arguments */
    if (mask != T_OBJECT || json_object_get(s, "anyOf") || json_object_get(s, "enum") || json_object_get(s, "const"))
        return fail(c, json_object_get(s, "type") ? "type" : "", "the parameters must be an object schema (type \"object\")");
    if (get_props(c, s, "", &pp, &map, &ms)) return -1;
    if (map) {
        /* any names: <|open|>argument key="NAME" type="T"<|sep|>VALUE<|close|>argument<|sep|>, repeated */
        uint32_t loop = kg_node_new(g, KG_SPLIT, 0, 0, 0, 0), alts, member;
        if (arg_alts(c, ms ? ms : json_true(), "additionalProperties", kg_lit(g, "argument", 8, kg_sym(g, KG_SYM_SEP, loop)), &alts)) {
            props_free(&pp);
            return -1;
        }
        member = kg_sym(g, KG_SYM_OPEN, kg_lit(g, "argument key=\"", 14, kg_body(g, KG_TEXT_ATTR, 1, KG_INF - 1, kg_lit(g, " type=\"", 7, alts))));
        kg_set_next(g, loop, next, member);
        props_free(&pp);
        *start = loop;
        return too_big(c) ? oom(c) : 0;
    }
    {
        arg_members m = {&pp, ""};
        int rc = ordered_members(c, &pp, arg_member, &m, NULL, next, start);
        props_free(&pp);
        if (!rc && too_big(c)) rc = oom(c);
        return rc;
    }
}
