/* JSON text helpers: see jsontext.h. */
#include "jsontext.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kbuf_add(kbuf *b, const void *p, size_t n)
{
    if (b->oom) return;
    if (n > SIZE_MAX / 2 - b->n - 1) { b->oom = 1; return; }
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 64;
        while (c < b->n + n + 1) c *= 2;
        char *q = realloc(b->p, c);
        if (!q) { b->oom = 1; return; }
        b->p = q;
        b->cap = c;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}

void kbuf_puts(kbuf *b, const char *s) { kbuf_add(b, s, strlen(s)); }

void kbuf_printf(kbuf *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) { b->oom = 1; return; }
    if ((size_t)n < sizeof small) { kbuf_add(b, small, (size_t)n); return; }
    char *big = malloc((size_t)n + 1);
    if (!big) { b->oom = 1; return; }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    kbuf_add(b, big, (size_t)n);
    free(big);
}

void kbuf_free(kbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

void kbuf_drop(kbuf *b, size_t n)
{
    if (n > b->n) n = b->n;
    if (!n) return;                                 /* (p may be NULL: memmove must not see it) */
    memmove(b->p, b->p + n, b->n - n);
    b->n -= n;
    if (b->p) b->p[b->n] = 0;
}

int kbuf_sse_block(kbuf *b, size_t *len)
{
    size_t blank = 0;
    const char *end;
    /* blank lines between events are no event (SSE): a block begins at its first line */
    while (blank < b->n && b->p[blank] == '\n') blank++;
    kbuf_drop(b, blank);
    if (!(end = b->n ? memmem(b->p, b->n, "\n\n", 2) : NULL)) return 0;
    *len = (size_t)(end - b->p);
    return 1;
}

/* ------------------------------------------------------------------------------------------ */

void kjson_py_float(double x, kbuf *out)
{
    if (x == 0) { kbuf_puts(out, signbit(x) ? "-0.0" : "0.0"); return; }
    /* Python's repr is the shortest string that reads back as x (ties to the nearest): the first
     * precision at which the correctly rounded %e form round-trips. */
    char sci[48];
    for (int p = 1; p <= 17; p++) {
        snprintf(sci, sizeof sci, "%.*e", p - 1, x);
        if (strtod(sci, NULL) == x) break;
    }
    /* sci is [-]D[.DDD]e(+|-)XX */
    const char *s = sci;
    int neg = *s == '-';
    if (neg) s++;
    char dig[24];
    size_t nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9' && nd < sizeof dig - 1) dig[nd++] = *s;
    dig[nd] = 0;
    int ex = *s == 'e' ? atoi(s + 1) : 0;
    while (nd > 1 && dig[nd - 1] == '0') dig[--nd] = 0;   /* %e pads; repr does not */
    if (neg) kbuf_puts(out, "-");
    if (ex < -4 || ex >= 16) {
        kbuf_add(out, dig, 1);
        if (nd > 1) { kbuf_puts(out, "."); kbuf_add(out, dig + 1, nd - 1); }
        kbuf_printf(out, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    } else if (ex >= 0) {
        size_t ip = (size_t)ex + 1;                      /* digits before the point */
        if (nd <= ip) {
            kbuf_add(out, dig, nd);
            for (size_t i = nd; i < ip; i++) kbuf_puts(out, "0");
            kbuf_puts(out, ".0");
        } else {
            kbuf_add(out, dig, ip);
            kbuf_puts(out, ".");
            kbuf_add(out, dig + ip, nd - ip);
        }
    } else {
        kbuf_puts(out, "0.");
        for (int i = 0; i < -ex - 1; i++) kbuf_puts(out, "0");
        kbuf_add(out, dig, nd);
    }
}

static void py_string(const char *s, size_t n, kbuf *out)
{
    kbuf_puts(out, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) { snprintf(u, sizeof u, "\\u%04x", c); esc = u; }
        }
        if (!esc) continue;
        kbuf_add(out, s + run, i - run);
        kbuf_puts(out, esc);
        run = i + 1;
    }
    kbuf_add(out, s + run, n - run);
    kbuf_puts(out, "\"");
}

static int cmp_keys(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

void kjson_py_dump(const json_t *v, int sort_keys, int compact, kbuf *out)
{
    const char *item_sep = compact ? "," : ", ", *key_sep = compact ? ":" : ": ";
    switch (json_typeof(v)) {
    case JSON_NULL: kbuf_puts(out, "null"); break;
    case JSON_TRUE: kbuf_puts(out, "true"); break;
    case JSON_FALSE: kbuf_puts(out, "false"); break;
    case JSON_INTEGER: kbuf_printf(out, "%lld", (long long)json_integer_value(v)); break;
    case JSON_REAL: kjson_py_float(json_real_value(v), out); break;
    case JSON_STRING: py_string(json_string_value(v), json_string_length(v), out); break;
    case JSON_ARRAY:
        kbuf_puts(out, "[");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) kbuf_puts(out, item_sep);
            kjson_py_dump(json_array_get(v, i), sort_keys, compact, out);
        }
        kbuf_puts(out, "]");
        break;
    case JSON_OBJECT: {
        size_t n = json_object_size(v), k = 0;
        const char **keys = malloc((n ? n : 1) * sizeof *keys);
        if (!keys) { out->oom = 1; return; }
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)v, key, val) keys[k++] = key;
        if (sort_keys) qsort(keys, n, sizeof *keys, cmp_keys);
        kbuf_puts(out, "{");
        for (size_t i = 0; i < n; i++) {
            if (i) kbuf_puts(out, item_sep);
            py_string(keys[i], strlen(keys[i]), out);
            kbuf_puts(out, key_sep);
            kjson_py_dump(json_object_get(v, keys[i]), sort_keys, compact, out);
        }
        kbuf_puts(out, "}");
        free(keys);
        break;
    }
    }
}

/* ------------------------------------------------------------------------------------------ */

/* Length of the valid sequence at p (1..4), or 0; *part = bytes of the longest valid prefix of
 * a sequence when not valid (the "maximal subpart" that one U+FFFD replaces). */
static size_t utf8_at(const unsigned char *p, size_t n, size_t *part)
{
    unsigned char b = p[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    *part = 1;
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) need = 2;
    else if (b >= 0xE0 && b <= 0xEF) { need = 3; if (b == 0xE0) lo = 0xA0; if (b == 0xED) hi = 0x9F; }
    else if (b >= 0xF0 && b <= 0xF4) { need = 4; if (b == 0xF0) lo = 0x90; if (b == 0xF4) hi = 0x8F; }
    else return 0;
    size_t i = 1;
    for (; i < need && i < n; i++) {
        unsigned char c = p[i];
        if (c < (i == 1 ? lo : 0x80) || c > (i == 1 ? hi : 0xBF)) break;
    }
    if (i == need) return need;
    *part = i;
    return 0;
}

size_t kutf8_sanitize(const char *s, size_t n, kbuf *out)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, run = 0, bad = 0;
    while (i < n) {
        size_t part, l = utf8_at(p + i, n - i, &part);
        if (l) { i += l; continue; }
        kbuf_add(out, s + run, i - run);
        kbuf_puts(out, "\xEF\xBF\xBD");
        bad++;
        i += part;
        run = i;
    }
    kbuf_add(out, s + run, n - run);
    return bad;
}

json_t *kjson_text(const char *s, size_t n)
{
    kbuf b = {0};
    json_t *j;
    kutf8_sanitize(s ? s : "", s ? n : 0, &b);
    j = b.oom ? NULL : json_stringn(b.p ? b.p : "", b.n);
    kbuf_free(&b);
    return j;
}
