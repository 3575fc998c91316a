/* A JSON Schema validator for the keywords constrained decoding supports (run/grammar/kschema.h),
 * written from the JSON Schema specification (draft 2020-12, its validation vocabulary)
 * independently of the compiler: the fuzz harness and the unit tests check every document the
 * grammar produces against it.  Test code only (the node tests check with ajv, the reference). */
#ifndef KPK_TEST_SCHEMA_VALID_H
#define KPK_TEST_SCHEMA_VALID_H

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static json_t *sv_pointer(json_t *root, const char *ref)
{
    json_t *at = root;
    if (ref[0] != '#') return NULL;
    ref++;
    while (*ref == '/') {
        char tok[256];
        size_t n = 0;
        ref++;
        while (*ref && *ref != '/' && n < sizeof tok - 1) {
            if (ref[0] == '~' && ref[1] == '1') { tok[n++] = '/'; ref += 2; }
            else if (ref[0] == '~' && ref[1] == '0') { tok[n++] = '~'; ref += 2; }
            else tok[n++] = *ref++;
        }
        tok[n] = 0;
        if (json_is_object(at)) at = json_object_get(at, tok);
        else if (json_is_array(at)) { char *e; unsigned long i = strtoul(tok, &e, 10); at = *tok && !*e ? json_array_get(at, i) : NULL; }
        else at = NULL;
        if (!at) return NULL;
    }
    return at;
}

/* Code points of a UTF-8 string (the bytes jansson decoded). */
static size_t sv_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xc0) != 0x80;
    return c;
}

static int sv_type_is(const json_t *v, const char *t)
{
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "integer")) return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == (double)(long long)json_real_value(v));
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    return 0;
}

/* 1 if v is valid against schema s (root: where $ref points); 0 if not or too deep. */
static int sv_valid(json_t *root, json_t *s, json_t *v, int depth)
{
    json_t *k;
    if (depth > 200) return 0;
    if (json_is_true(s)) return 1;
    if (!json_is_object(s)) return 0;
    if ((k = json_object_get(s, "$ref")) && !sv_valid(root, sv_pointer(root, json_string_value(k) ? json_string_value(k) : ""), v, depth + 1))
        return 0;
    if ((k = json_object_get(s, "type"))) {
        int ok = 0;
        if (json_is_string(k)) ok = sv_type_is(v, json_string_value(k));
        for (size_t i = 0; json_is_array(k) && i < json_array_size(k); i++)
            ok |= json_is_string(json_array_get(k, i)) && sv_type_is(v, json_string_value(json_array_get(k, i)));
        if (!ok) return 0;
    }
    if ((k = json_object_get(s, "const")) && !json_equal(k, v)) return 0;
    if ((k = json_object_get(s, "enum"))) {
        int ok = 0;
        for (size_t i = 0; i < json_array_size(k); i++) ok |= json_equal(json_array_get(k, i), v);
        if (!ok) return 0;
    }
    if ((k = json_object_get(s, "anyOf"))) {
        int ok = 0;
        for (size_t i = 0; i < json_array_size(k) && !ok; i++) ok = sv_valid(root, json_array_get(k, i), v, depth + 1);
        if (!ok) return 0;
    }
    if (json_is_string(v)) {
        size_t n = sv_chars(json_string_value(v), json_string_length(v));
        if ((k = json_object_get(s, "minLength")) && (json_int_t)n < json_integer_value(k)) return 0;
        if ((k = json_object_get(s, "maxLength")) && (json_int_t)n > json_integer_value(k)) return 0;
    }
    if (json_is_number(v)) {
        if ((k = json_object_get(s, "minimum")) && json_is_number(k) && json_number_value(v) < json_number_value(k)) return 0;
        if ((k = json_object_get(s, "maximum")) && json_is_number(k) && json_number_value(v) > json_number_value(k)) return 0;
    }
    if (json_is_array(v)) {
        json_t *items = json_object_get(s, "items");
        if ((k = json_object_get(s, "minItems")) && (json_int_t)json_array_size(v) < json_integer_value(k)) return 0;
        if ((k = json_object_get(s, "maxItems")) && (json_int_t)json_array_size(v) > json_integer_value(k)) return 0;
        for (size_t i = 0; items && i < json_array_size(v); i++)
            if (!sv_valid(root, items, json_array_get(v, i), depth + 1)) return 0;
    }
    if (json_is_object(v)) {
        json_t *props = json_object_get(s, "properties"), *ap = json_object_get(s, "additionalProperties"), *x;
        const char *key;
        k = json_object_get(s, "required");
        for (size_t i = 0; i < json_array_size(k); i++)
            if (!json_object_get(v, json_string_value(json_array_get(k, i)) ? json_string_value(json_array_get(k, i)) : "")) return 0;
        json_object_foreach(v, key, x) {
            json_t *ps = json_object_get(props, key);
            if (ps) { if (!sv_valid(root, ps, x, depth + 1)) return 0; }
            else if (ap && !sv_valid(root, ap, x, depth + 1)) return 0;
        }
    }
    return 1;
}

#endif
