/* Prompt-lookup drafting (spec.h). */
#include "spec.h"

void kspec_init(kspec *d, size_t max)
{
    d->max = max > KSPEC_MAX_DRAFT ? KSPEC_MAX_DRAFT : max;
    d->len = d->max < KSPEC_FIRST_DRAFT ? d->max : KSPEC_FIRST_DRAFT;
    d->need = KSPEC_MIN_MATCH;
}

/* The longest suffix of h[0..n) (at least `need` tokens, at most
 * KSPEC_MAX_MATCH) that ends in o just before position e, for e < e_end,
 * the most recent such (largest e); returns its length (0: none), *at = e. */
static size_t longest_match(size_t need, const int32_t *h, size_t n, const int32_t *o, size_t e_end, size_t *at)
{
    size_t best = 0;
    for (size_t e = e_end; e-- > need && best < KSPEC_MAX_MATCH;) {
        size_t m = 0;
        while (m < KSPEC_MAX_MATCH && m < e && m < n && o[e - 1 - m] == h[n - 1 - m]) m++;
        if (m >= need && m > best) { best = m; *at = e; }
    }
    return best;
}

size_t kspec_draft(const kspec *d, const int32_t *h, size_t n, size_t limit, const int32_t *stop, size_t n_stop, int32_t *out)
{
    size_t at = 0, k = limit < d->len ? limit : d->len;
    if (k == 0 || n < d->need + 1) return 0;
    /* the most recent earlier occurrence of the longest suffix: it ends just
     * before position e (e < n), and h[e] is the first token it predicts */
    if (!longest_match(d->need, h, n, h, n, &at)) return 0;
    for (size_t i = 0; i < k; i++) {
        /* past the end of the history the occurrence runs on into the draft */
        int32_t t = at + i < n ? h[at + i] : out[at + i - n];
        for (size_t s = 0; s < n_stop; s++)
            if (t == stop[s]) return i;
        out[i] = t;
    }
    return k;
}

size_t kspec_draft_from(const kspec *d, const int32_t *h, size_t n, const int32_t *o, size_t m, size_t limit,
                        const int32_t *stop, size_t n_stop, int32_t *out)
{
    size_t at = 0, k = limit < d->len ? limit : d->len;
    if (k == 0 || n < d->need || m < d->need + 1) return 0;
    if (!longest_match(d->need, h, n, o, m, &at)) return 0;
    size_t i = 0;
    for (; i < k && at + i < m; i++) {
        for (size_t s = 0; s < n_stop; s++)
            if (o[at + i] == stop[s]) return i;
        out[i] = o[at + i];
    }
    return i;
}

void kspec_result(kspec *d, size_t drafted, size_t accepted)
{
    if (drafted == 0) return;
    if (accepted == 0) {
        if (d->need < KSPEC_MAX_MATCH) d->need++;
    } else {
        d->need = KSPEC_MIN_MATCH;
    }
    if (accepted == drafted) d->len = 2 * d->len < d->max ? 2 * d->len : d->max;
    else d->len = accepted + 1;
}
