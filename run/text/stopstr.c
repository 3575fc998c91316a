/* Stop strings over streamed text (stopstr.h). */
#include "stopstr.h"

#include <string.h>

void kstop_init(kstop *k, char *const *s, size_t n)
{
    memset(k, 0, sizeof *k);
    k->s = s;
    k->n = n;
}

/* Does a[0..n) start some stop string (as a proper prefix)? */
static int starts_a_stop(const kstop *k, const char *a, size_t n)
{
    for (size_t i = 0; i < k->n; i++) {
        size_t L = strlen(k->s[i]);
        if (n < L && !memcmp(k->s[i], a, n)) return 1;
    }
    return 0;
}

int kstop_feed(kstop *k, const char *text, size_t len, kbuf *out)
{
    size_t cut = (size_t)-1, end = (size_t)-1, keep = 0;
    if (k->matched) return 1;
    if (!k->n) { kbuf_add(out, text, len); return 0; }
    kbuf_add(&k->hold, text, len);
    if (k->hold.oom) { out->oom = 1; return 0; }
    /* the stop string completed first: the earliest end, then the earliest
     * start (so the result does not depend on how the text was cut into pieces) */
    for (size_t i = 0; i < k->n; i++) {
        size_t L = strlen(k->s[i]);
        const char *at = memmem(k->hold.p, k->hold.n, k->s[i], L);
        size_t p = at ? (size_t)(at - k->hold.p) : 0;
        if (at && (p + L < end || (p + L == end && p < cut))) { cut = p; end = p + L; }
    }
    if (cut != (size_t)-1) {
        kbuf_add(out, k->hold.p, cut);
        k->hold.n = 0;
        k->matched = 1;
        return 1;
    }
    /* hold back the longest tail that a stop string could continue */
    for (size_t t = k->hold.n; t > 0; t--)
        if (starts_a_stop(k, k->hold.p + k->hold.n - t, t)) { keep = t; break; }
    kbuf_add(out, k->hold.p, k->hold.n - keep);
    memmove(k->hold.p, k->hold.p + k->hold.n - keep, keep);
    k->hold.n = keep;
    return 0;
}

void kstop_flush(kstop *k, kbuf *out)
{
    if (!k->matched && k->hold.n) kbuf_add(out, k->hold.p, k->hold.n);
    k->hold.n = 0;
}

void kstop_free(kstop *k) { kbuf_free(&k->hold); }
