/* What the request parsers (oai_request.c, anth_request.c) share: the kreq_arena a parsed request points
 * into, the body as a JSON object, and fields read with errors that name them (oai_error: the
 * OpenAI layer builds its error object from it, the Anthropic layer its own). */
#ifndef KRUN_REQJSON_H
#define KRUN_REQJSON_H

#include "oai.h"

#include <jansson.h>
#include <stddef.h>

/* Everything a parsed request points into: the JSON tree and strings built from it. */
typedef struct {
    json_t *root;
    void **blocks;
    size_t n, cap;
} kreq_arena;

/* Keep p until the kreq_arena is freed; NULL (p freed) on allocation failure or when p is NULL. */
void *kreq_keep(kreq_arena *a, void *p);
void kreq_arena_free(kreq_arena *a);
/* A malloc'd copy of the n bytes at s plus a NUL (the bytes may hold NULs). */
char *kreq_text_copy(const char *s, size_t n);
/* 500 out of memory; returns -1. */
int kreq_oom(oai_error *e);
#define OOM(e) kreq_oom(e)
/* The end of a parse (or a free): on success the request keeps the kreq_arena its pointers point into;
 * otherwise the kreq_arena is freed and the request (size bytes) zeroed.  Returns 0 or -1. */
int kreq_end(kreq_arena *a, void **own, void *req, size_t size, int ok);
/* The body: a JSON object (400 invalid_json otherwise). */
json_t *kreq_body(const char *body, size_t len, oai_error *e);
/* A field that is absent or JSON null counts as absent. */
json_t *kreq_field(json_t *o, const char *key);
/* "an object", "a string", ... */
const char *kreq_kind(const json_t *v);
/* 400 invalid_type: "PARAM must be WANT, not KIND"; returns -1. */
int kreq_wrong_type(oai_error *e, const char *param, const char *want, const json_t *got);
/* A JSON string used as a C string must not hold a NUL: 400 otherwise (returns -1), else 0. */
int kreq_c_string(json_t *v, const char *param, oai_error *e);
/* v is the JSON string lit, compared whole. */
int kreq_str_is(const json_t *v, const char *lit);
/* Optional number in [lo, hi] (has: set to 1 when given), optional boolean. */
int kreq_number(json_t *o, const char *key, double lo, double hi, double *out, int *has, oai_error *e);
int kreq_bool(json_t *o, const char *key, int *out, oai_error *e);

#endif
