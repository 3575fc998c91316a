/* What the request parsers share (reqjson.h): the kreq_arena a parsed request points into, the body, and
 * fields checked with errors that name them. */
#include "reqjson.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *kreq_keep(kreq_arena *a, void *p)
{
    if (!p) return NULL;
    if (a->n == a->cap) {
        size_t c = a->cap ? 2 * a->cap : 16;
        void **q = realloc(a->blocks, c * sizeof *q);
        if (!q) { free(p); return NULL; }
        a->blocks = q;
        a->cap = c;
    }
    return a->blocks[a->n++] = p;
}

void kreq_arena_free(kreq_arena *a)
{
    if (!a) return;
    for (size_t i = 0; i < a->n; i++) free(a->blocks[i]);
    free(a->blocks);
    json_decref(a->root);
    free(a);
}

/* A malloc'd copy of the n bytes at s plus a NUL (the bytes may hold NULs:
 * strndup would stop at the first). */
char *kreq_text_copy(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

int kreq_oom(oai_error *e)
{
    oai_error_set(e, 500, NULL, NULL, "out of memory");
    return -1;
}

/* The end of a parse (or a free): on success the request keeps the kreq_arena its pointers point into;
 * otherwise the kreq_arena is freed and the request zeroed.  Returns 0 or -1. */
int kreq_end(kreq_arena *a, void **own, void *req, size_t size, int ok)
{
    if (ok) { *own = a; return 0; }
    kreq_arena_free(a);
    memset(req, 0, size);
    return -1;
}

/* The body: a JSON object. */
json_t *kreq_body(const char *body, size_t len, oai_error *e)
{
    if (!body && len) { oai_error_set(e, 400, NULL, NULL, "empty request body"); return NULL; }
    json_error_t je;
    json_t *root = json_loadb(body ? body : "", len, JSON_ALLOW_NUL, &je);
    if (!root) {
        oai_error_set(e, 400, NULL, "invalid_json", "the request body is not valid JSON: %s (line %d, column %d)", je.text,
                      je.line, je.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        oai_error_set(e, 400, NULL, "invalid_json", "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* A field that is absent or JSON null counts as absent. */
json_t *kreq_field(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

const char *kreq_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

int kreq_wrong_type(oai_error *e, const char *param, const char *want, const json_t *got)
{
    oai_error_set(e, 400, param, "invalid_type", "%s must be %s, not %s", param, want, kreq_kind(got));
    return -1;
}

/* A JSON string that will be used as a C string: a NUL inside ("\u0000")
 * would silently cut it, so it is refused. */
int kreq_c_string(json_t *v, const char *param, oai_error *e)
{
    if (!memchr(json_string_value(v), 0, json_string_length(v))) return 0;
    oai_error_set(e, 400, param, "invalid_value", "%s must not contain a NUL character (\\u0000)", param);
    return -1;
}

/* v is the JSON string lit, compared whole: "text\u0000x" is not "text". */
int kreq_str_is(const json_t *v, const char *lit)
{
    return json_is_string(v) && json_string_length(v) == strlen(lit) && !memcmp(json_string_value(v), lit, strlen(lit));
}

/* Optional number in [lo, hi]. */
int kreq_number(json_t *o, const char *key, double lo, double hi, double *out, int *has, oai_error *e)
{
    json_t *v = kreq_field(o, key);
    if (!v) return 0;
    if (!json_is_number(v)) return kreq_wrong_type(e, key, "a number", v);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        oai_error_set(e, 400, key, "invalid_value", "%s must be between %g and %g, got %g", key, lo, hi, x);
        return -1;
    }
    *out = x;
    if (has) *has = 1;
    return 0;
}

int kreq_bool(json_t *o, const char *key, int *out, oai_error *e)
{
    json_t *v = kreq_field(o, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return kreq_wrong_type(e, key, "a boolean", v);
    *out = json_is_true(v);
    return 0;
}

