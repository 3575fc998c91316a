/* A JSON Schema validator for the keywords constrained decoding supports (run/grammar/kschema.h),
 * written from the JSON Schema specification (draft 2020-12, its validation vocabulary)
 * independently of the compiler: the fuzz harness and the unit tests check every document the
 * grammar produces against it.  Patterns are matched by PCRE2 (read as ECMAScript reads them:
 * UTF, $ only at the end, \u escapes); formats are ajv-formats' (full mode) ported: its regular
 * expressions run by PCRE2 and its date and time checks.  Test code only (the node tests check
 * with ajv itself, the reference). */
#ifndef KPK_TEST_SCHEMA_VALID_H
#define KPK_TEST_SCHEMA_VALID_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Does re (ECMAScript, flags "i" or "") match anywhere in s?  -1 when PCRE2 refuses re. */
static int sv_search(const char *re, size_t relen, int icase, const char *s, size_t n)
{
    int err, rc;
    PCRE2_SIZE off;
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    pcre2_code *c;
    pcre2_match_data *md;
    if (!cc) return -1;
    pcre2_set_newline(cc, PCRE2_NEWLINE_ANYCRLF);
    pcre2_set_compile_extra_options(cc, PCRE2_EXTRA_ALT_BSUX);
    c = pcre2_compile((PCRE2_SPTR)re, relen, PCRE2_UTF | PCRE2_DOLLAR_ENDONLY | PCRE2_ALT_BSUX | (icase ? PCRE2_CASELESS : 0), &err, &off, cc);
    pcre2_compile_context_free(cc);
    if (!c) return -1;
    md = pcre2_match_data_create_from_pattern(c, NULL);
    rc = md ? pcre2_match(c, (PCRE2_SPTR)s, n, 0, 0, md, NULL) : -1;
    pcre2_match_data_free(md);
    pcre2_code_free(c);
    return rc >= 0;
}

/* ajv-formats' full formats (node_modules/ajv-formats/dist/formats.js), ported. */
static int sv_leap(int y) { return y % 4 == 0 && (y % 100 != 0 || y % 400 == 0); }
static int sv_date(const char *s, size_t n)
{
    static const int days[] = {0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int y, m, d;
    if (n != 10 || sv_search("^\\d\\d\\d\\d-\\d\\d-\\d\\d$", strlen("^\\d\\d\\d\\d-\\d\\d-\\d\\d$"), 0, s, n) != 1) return 0;
    y = atoi(s); m = atoi(s + 5); d = atoi(s + 8);
    return m >= 1 && m <= 12 && d >= 1 && d <= (m == 2 && sv_leap(y) ? 29 : days[m]);
}
static int sv_time(const char *s, size_t n)
{
    /* ^(\d\d):(\d\d):(\d\d(?:\.\d+)?)(z|([+-])(\d\d)(?::?(\d\d))?)?$ /i, the zone required */
    char buf[128];
    int hr, min, tzh = 0, tzm = 0, sign = 1;
    double sec;
    const char *z;
    static const char TIME[] = "^\\d\\d:\\d\\d:\\d\\d(?:\\.\\d+)?(?:z|[+-]\\d\\d(?::?\\d\\d)?)$";
    if (n >= sizeof buf || sv_search(TIME, strlen(TIME), 1, s, n) != 1) return 0;
    memcpy(buf, s, n); buf[n] = 0;
    hr = atoi(buf); min = atoi(buf + 3); sec = strtod(buf + 6, NULL);
    z = buf + 8;
    while (*z == '.' || (*z >= '0' && *z <= '9')) z++;
    if (*z == '+' || *z == '-') {
        sign = *z == '-' ? -1 : 1;
        tzh = atoi(z + 1);
        tzm = z[3] == ':' ? atoi(z + 4) : z[3] ? atoi(z + 3) : 0;
    }
    if (tzh > 23 || tzm > 59) return 0;
    if (hr <= 23 && min <= 59 && sec < 60) return 1;
    {
        int um = min - tzm * sign, uh = hr - tzh * sign - (um < 0 ? 1 : 0);
        return (uh == 23 || uh == -1) && (um == 59 || um == -1) && sec < 61;
    }
}
static int sv_format(const char *f, const char *s, size_t n)
{
    static const struct { const char *name, *re; int icase; } R[] = {
        {"duration", "^P(?!$)((\\d+Y)?(\\d+M)?(\\d+D)?(T(?=\\d)(\\d+H)?(\\d+M)?(\\d+S)?)?|(\\d+W)?)$", 0},
        {"email", "^[a-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\\.)+[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$", 1},
        {"hostname", "^(?=.{1,253}\\.?$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\\.[a-z0-9](?:[-0-9a-z]{0,61}[0-9a-z])?)*\\.?$", 1},
        {"ipv4", "^(?:(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)$", 0},
        {"ipv6", "^((([0-9a-f]{1,4}:){7}([0-9a-f]{1,4}|:))|(([0-9a-f]{1,4}:){6}(:[0-9a-f]{1,4}|((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)(\\.(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)){3})|:))|(([0-9a-f]{1,4}:){5}(((:[0-9a-f]{1,4}){1,2})|:((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)(\\.(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)){3})|:))|(([0-9a-f]{1,4}:){4}(((:[0-9a-f]{1,4}){1,3})|((:[0-9a-f]{1,4})?:((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)(\\.(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)){3}))|:))|(([0-9a-f]{1,4}:){3}(((:[0-9a-f]{1,4}){1,4})|((:[0-9a-f]{1,4}){0,2}:((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)(\\.(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)){3}))|:))|(([0-9a-f]{1,4}:){2}(((:[0-9a-f]{1,4}){1,5})|((:[0-9a-f]{1,4}){0,3}:((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)(\\.(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)){3}))|:))|(([0-9a-f]{1,4}:){1}(((:[0-9a-f]{1,4}){1,6})|((:[0-9a-f]{1,4}){0,4}:((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)(\\.(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)){3}))|:))|(:(((:[0-9a-f]{1,4}){1,7})|((:[0-9a-f]{1,4}){0,5}:((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)(\\.(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)){3}))|:)))$", 1},
        {"uuid", "^(?:urn:uuid:)?[0-9a-f]{8}-(?:[0-9a-f]{4}-){3}[0-9a-f]{12}$", 1},
        {"uri", "^(?:[a-z][a-z0-9+\\-.]*:)(?:\\/?\\/(?:(?:[a-z0-9\\-._~!$&'()*+,;=:]|%[0-9a-f]{2})*@)?(?:\\[(?:(?:(?:(?:[0-9a-f]{1,4}:){6}|::(?:[0-9a-f]{1,4}:){5}|(?:[0-9a-f]{1,4})?::(?:[0-9a-f]{1,4}:){4}|(?:(?:[0-9a-f]{1,4}:){0,1}[0-9a-f]{1,4})?::(?:[0-9a-f]{1,4}:){3}|(?:(?:[0-9a-f]{1,4}:){0,2}[0-9a-f]{1,4})?::(?:[0-9a-f]{1,4}:){2}|(?:(?:[0-9a-f]{1,4}:){0,3}[0-9a-f]{1,4})?::[0-9a-f]{1,4}:|(?:(?:[0-9a-f]{1,4}:){0,4}[0-9a-f]{1,4})?::)(?:[0-9a-f]{1,4}:[0-9a-f]{1,4}|(?:(?:25[0-5]|2[0-4]\\d|[01]?\\d\\d?)\\.){3}(?:25[0-5]|2[0-4]\\d|[01]?\\d\\d?))|(?:(?:[0-9a-f]{1,4}:){0,5}[0-9a-f]{1,4})?::[0-9a-f]{1,4}|(?:(?:[0-9a-f]{1,4}:){0,6}[0-9a-f]{1,4})?::)|[Vv][0-9a-f]+\\.[a-z0-9\\-._~!$&'()*+,;=:]+)\\]|(?:(?:25[0-5]|2[0-4]\\d|[01]?\\d\\d?)\\.){3}(?:25[0-5]|2[0-4]\\d|[01]?\\d\\d?)|(?:[a-z0-9\\-._~!$&'()*+,;=]|%[0-9a-f]{2})*)(?::\\d*)?(?:\\/(?:[a-z0-9\\-._~!$&'()*+,;=:@]|%[0-9a-f]{2})*)*|\\/(?:(?:[a-z0-9\\-._~!$&'()*+,;=:@]|%[0-9a-f]{2})+(?:\\/(?:[a-z0-9\\-._~!$&'()*+,;=:@]|%[0-9a-f]{2})*)*)?|(?:[a-z0-9\\-._~!$&'()*+,;=:@]|%[0-9a-f]{2})+(?:\\/(?:[a-z0-9\\-._~!$&'()*+,;=:@]|%[0-9a-f]{2})*)*)(?:\\?(?:[a-z0-9\\-._~!$&'()*+,;=:@/?]|%[0-9a-f]{2})*)?(?:#(?:[a-z0-9\\-._~!$&'()*+,;=:@/?]|%[0-9a-f]{2})*)?$", 1},
    };
    if (!strcmp(f, "date")) return sv_date(s, n);
    if (!strcmp(f, "time")) return sv_time(s, n);
    if (!strcmp(f, "date-time")) {
        /* str.split(/t|\s/i): exactly two parts */
        size_t k = 0, at = 0;
        for (size_t i = 0; i < n; i++) if (s[i] == 't' || s[i] == 'T' || s[i] == ' ' || (s[i] >= 9 && s[i] <= 13)) { k++; at = i; }
        return k == 1 && sv_date(s, at) && sv_time(s + at + 1, n - at - 1);
    }
    if (!strcmp(f, "uri") && !memchr(s, '/', n) && !memchr(s, ':', n)) return 0;
    for (size_t i = 0; i < sizeof R / sizeof *R; i++)
        if (!strcmp(f, R[i].name)) return sv_search(R[i].re, strlen(R[i].re), R[i].icase, s, n) == 1;
    return 1;                 /* any other format: an annotation */
}

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
    if (!strcmp(t, "integer")) return json_is_integer(v) || (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v));      /* any size: 1e300 too */
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
    if ((k = json_object_get(s, "oneOf"))) {
        int ok = 0;
        for (size_t i = 0; i < json_array_size(k); i++) ok += sv_valid(root, json_array_get(k, i), v, depth + 1);
        if (ok != 1) return 0;
    }
    if ((k = json_object_get(s, "allOf")))
        for (size_t i = 0; i < json_array_size(k); i++)
            if (!sv_valid(root, json_array_get(k, i), v, depth + 1)) return 0;
    if (json_is_string(v)) {
        size_t n = sv_chars(json_string_value(v), json_string_length(v));
        if ((k = json_object_get(s, "minLength")) && (json_int_t)n < json_integer_value(k)) return 0;
        if ((k = json_object_get(s, "maxLength")) && (json_int_t)n > json_integer_value(k)) return 0;
        /* (a pattern PCRE2 will not compile, -1, cannot be judged here) */
        if ((k = json_object_get(s, "pattern")) && json_is_string(k) &&
            sv_search(json_string_value(k), json_string_length(k), 0, json_string_value(v), json_string_length(v)) == 0) return 0;
        if ((k = json_object_get(s, "format")) && json_is_string(k) && !sv_format(json_string_value(k), json_string_value(v), json_string_length(v)))
            return 0;
    }
    if (json_is_number(v)) {
        double x = json_number_value(v);
        json_t *ex;
        if ((k = json_object_get(s, "minimum")) && json_is_number(k)) {
            ex = json_object_get(s, "exclusiveMinimum");
            if (json_is_true(ex) ? x <= json_number_value(k) : x < json_number_value(k)) return 0;
        }
        if ((k = json_object_get(s, "maximum")) && json_is_number(k)) {
            ex = json_object_get(s, "exclusiveMaximum");
            if (json_is_true(ex) ? x >= json_number_value(k) : x > json_number_value(k)) return 0;
        }
        if ((k = json_object_get(s, "exclusiveMinimum")) && json_is_number(k) && x <= json_number_value(k)) return 0;
        if ((k = json_object_get(s, "exclusiveMaximum")) && json_is_number(k) && x >= json_number_value(k)) return 0;
        if ((k = json_object_get(s, "multipleOf")) && json_is_number(k) && fmod(x, json_number_value(k)) != 0) return 0;
    }
    if (json_is_array(v)) {
        json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
        size_t np = json_array_size(prefix);
        if ((k = json_object_get(s, "minItems")) && (json_int_t)json_array_size(v) < json_integer_value(k)) return 0;
        if ((k = json_object_get(s, "maxItems")) && (json_int_t)json_array_size(v) > json_integer_value(k)) return 0;
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *is = i < np ? json_array_get(prefix, i) : items;
            if (is && !sv_valid(root, is, json_array_get(v, i), depth + 1)) return 0;
        }
    }
    if (json_is_object(v)) {
        json_t *props = json_object_get(s, "properties"), *ap = json_object_get(s, "additionalProperties"), *x;
        const char *key;
        k = json_object_get(s, "required");
        for (size_t i = 0; i < json_array_size(k); i++)
            if (!json_object_get(v, json_string_value(json_array_get(k, i)) ? json_string_value(json_array_get(k, i)) : "")) return 0;
        json_object_foreach(v, key, x) {
            json_t *ps = json_object_get(props, key), *pn = json_object_get(s, "propertyNames"), *name;
            if (pn) {
                int ok;
                name = json_string(key);
                ok = name && sv_valid(root, pn, name, depth + 1);
                json_decref(name);
                if (!ok) return 0;
            }
            if (ps) { if (!sv_valid(root, ps, x, depth + 1)) return 0; }
            else if (ap && !sv_valid(root, ap, x, depth + 1)) return 0;
        }
    }
    return 1;
}

#endif
