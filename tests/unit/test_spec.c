/* The speculative-decoding drafter (run/session/spec.c): prompt lookup over a
 * history, against a brute-force reference on thousands of random
 * histories over small alphabets (where matches of every length occur), and
 * the rules one by one: no draft without a match of `need` tokens, the
 * longest match wins and then the most recent, a match that overlaps the
 * suffix runs on into the draft, stop ids end a draft, the limits, and the
 * adaptation of the match length and the draft length.  Drafting from
 * another sequence (kspec_draft_from) the same way: random pairs against a
 * brute-force search, and its own rules (no run-on past the other's end). */
#include "check.h"
#include "testrand.h"
#include "run/session/spec.h"

#include <stdint.h>
#include <string.h>

/* The reference: the longest m (need <= m <= KSPEC_MAX_MATCH) for which the
 * last m tokens occurred earlier (ending before the last token), the most
 * recent such occurrence, then its continuation over history ++ draft. */
static size_t ref_draft(const int32_t *h, size_t n, size_t need, size_t k, const int32_t *stop, size_t n_stop, int32_t *out)
{
    size_t at = 0, found = 0;
    for (size_t m = KSPEC_MAX_MATCH; m >= need && !found; m--) {
        for (size_t e = n - 1; e >= m && e < n; e--) {     /* the occurrence is h[e-m, e), e < n */
            int same = 1;
            for (size_t i = 0; i < m && same; i++) same = h[e - m + i] == h[n - m + i];
            if (same) { at = e; found = 1; break; }
        }
        if (m == 0) break;
    }
    if (!found) return 0;
    {
        /* copy the continuation one token at a time onto the end of the sequence itself */
        int32_t seq[200];
        size_t len = n;
        memcpy(seq, h, n * sizeof *seq);
        while (len < n + k) {
            int stopped = 0;
            for (size_t s = 0; s < n_stop; s++) stopped |= seq[at + len - n] == stop[s];
            if (stopped) break;
            seq[len] = seq[at + len - n];
            len++;
        }
        memcpy(out, seq + n, (len - n) * sizeof *out);
        return len - n;
    }
}

static void check_random(void)
{
    const int32_t stop[1] = {3};
    size_t agree = 0, drafts = 0, runs = 0, trials = 20000;
    for (size_t t = 0; t < trials; t++) {
        int32_t h[80], a[64], b[64];
        size_t n = 1 + rnd() % 60, alpha = 2 + rnd() % 3, limit = rnd() % 12;
        kspec d;
        kspec_init(&d, 64);
        d.len = 1 + rnd() % 16;
        d.need = KSPEC_MIN_MATCH + rnd() % (KSPEC_MAX_MATCH - KSPEC_MIN_MATCH + 1);
        for (size_t i = 0; i < n; i++) h[i] = (int32_t)(rnd() % alpha);
        {
            const int use_stop = t % 3 == 0;
            size_t k = limit < d.len ? limit : d.len;
            size_t x = kspec_draft(&d, h, n, limit, stop, use_stop, a);
            size_t y = n >= d.need + 1 && k ? ref_draft(h, n, d.need, k, stop, use_stop, b) : 0;
            agree += x == y && memcmp(a, b, x * sizeof *a) == 0;
            drafts += x > 0;
            runs += x > (size_t)n;   /* drafts longer than the history: the overlap ran on */
        }
    }
    CHECK(agree == trials, "%zu random histories (alphabets of 2-4 tokens, every need and length): the same drafts as a "
          "brute-force search (%zu agree; %zu drafted, %zu longer than their history)", trials, agree, drafts, runs);
}

/* The reference for another sequence o: the longest m (need..MAX) for which h's last m tokens
 * occur in o ending before o's last token, the most recent such, then what follows it in o. */
static size_t ref_from(const int32_t *h, size_t n, const int32_t *o, size_t mo, size_t need, size_t k, const int32_t *stop,
                       size_t n_stop, int32_t *out)
{
    for (size_t m = KSPEC_MAX_MATCH; m >= need; m--) {
        if (m > n) continue;
        for (size_t e = mo - 1; e >= m && e < mo; e--) {      /* o[e-m, e) == h[n-m, n), e < mo */
            int same = 1;
            size_t len = 0;
            for (size_t i = 0; i < m && same; i++) same = o[e - m + i] == h[n - m + i];
            if (!same) continue;
            while (len < k && e + len < mo) {
                int stopped = 0;
                for (size_t s = 0; s < n_stop; s++) stopped |= o[e + len] == stop[s];
                if (stopped) break;
                out[len] = o[e + len];
                len++;
            }
            return len;
        }
    }
    return 0;
}

static void check_random_from(void)
{
    const int32_t stop[1] = {3};
    size_t agree = 0, drafts = 0, trials = 20000;
    for (size_t t = 0; t < trials; t++) {
        int32_t h[40], o[60], a[64], b[64];
        size_t n = 1 + rnd() % 30, mo = 1 + rnd() % 50, alpha = 2 + rnd() % 3, limit = rnd() % 12;
        kspec d;
        kspec_init(&d, 64);
        d.len = 1 + rnd() % 16;
        d.need = KSPEC_MIN_MATCH + rnd() % (KSPEC_MAX_MATCH - KSPEC_MIN_MATCH + 1);
        for (size_t i = 0; i < n; i++) h[i] = (int32_t)(rnd() % alpha);
        for (size_t i = 0; i < mo; i++) o[i] = (int32_t)(rnd() % alpha);
        {
            const int use_stop = t % 3 == 0;
            size_t k = limit < d.len ? limit : d.len;
            size_t x = kspec_draft_from(&d, h, n, o, mo, limit, stop, use_stop, a);
            size_t y = k && mo >= d.need + 1 ? ref_from(h, n, o, mo, d.need, k, stop, use_stop, b) : 0;
            agree += x == y && memcmp(a, b, x * sizeof *a) == 0;
            drafts += x > 0;
        }
    }
    CHECK(agree == trials, "%zu random pairs of sequences: drafts from the other one as a brute-force search (%zu agree, %zu drafted)",
          trials, agree, drafts);
}

int main(void)
{
    kspec d;
    int32_t out[64];
    const int32_t none[] = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21};
    const int32_t twice[] = {1, 2, 3, 4, 5, 6, 9, 1, 2, 3};
    const int32_t longest[] = {7, 1, 2, 3, 40, 41, 8, 1, 2, 3, 50, 51, 7, 1, 2, 3};
    const int32_t recent[] = {1, 2, 3, 40, 1, 2, 3, 50, 1, 2, 3};
    const int32_t run[] = {9, 5, 5, 5, 5};
    const int32_t cycle[] = {1, 2, 3, 1, 2, 3, 1, 2};
    const int32_t stop[] = {6};
    size_t k;

    kspec_init(&d, 8);
    CHECK(d.len == KSPEC_FIRST_DRAFT && d.need == KSPEC_MIN_MATCH, "a new drafter: first draft of %d, match of %d tokens",
          KSPEC_FIRST_DRAFT, KSPEC_MIN_MATCH);
    CHECK(kspec_draft(&d, none, 12, 8, NULL, 0, out) == 0, "no repeated 3-gram: no draft");
    d.len = 8;
    k = kspec_draft(&d, twice, 10, 8, NULL, 0, out);
    CHECK(k == 8 && out[0] == 4 && out[1] == 5 && out[2] == 6 && out[3] == 9 && out[4] == 1 && out[5] == 2 && out[6] == 3 &&
          out[7] == 4, "a repeated 3-gram drafts what followed it, running on into the draft (4 5 6 9 1 2 3 4)");
    CHECK(kspec_draft(&d, twice, 10, 3, NULL, 0, out) == 3, "the caller's limit holds");
    CHECK(kspec_draft(&d, twice, 10, 8, stop, 1, out) == 2 && out[0] == 4 && out[1] == 5, "a draft ends before a stop id");
    k = kspec_draft(&d, longest, 16, 2, NULL, 0, out);
    CHECK(k == 2 && out[0] == 40 && out[1] == 41, "the longest match wins over a more recent shorter one");
    k = kspec_draft(&d, recent, 11, 1, NULL, 0, out);
    CHECK(k == 1 && out[0] == 50, "among equally long matches the most recent wins");
    k = kspec_draft(&d, run, 5, 6, NULL, 0, out);
    CHECK(k == 6 && out[0] == 5 && out[5] == 5, "a run of one token drafts more of it (the match overlaps the suffix)");
    k = kspec_draft(&d, cycle, 8, 7, NULL, 0, out);
    CHECK(k == 7 && out[0] == 3 && out[1] == 1 && out[2] == 2 && out[3] == 3 && out[6] == 3, "a cycle is drafted as far as allowed");
    d.need = 4;
    CHECK(kspec_draft(&d, twice, 10, 8, NULL, 0, out) == 0, "a 3-gram is not enough once 4 tokens are needed");
    d.need = KSPEC_MIN_MATCH;
    d.len = 0;
    CHECK(kspec_draft(&d, twice, 10, 8, NULL, 0, out) == 0, "draft length 0: no draft");
    kspec_init(&d, 0);
    CHECK(kspec_draft(&d, twice, 10, 8, NULL, 0, out) == 0, "--spec 0: never a draft");

    /* adaptation */
    kspec_init(&d, 8);
    kspec_result(&d, 2, 2);
    CHECK(d.len == 4, "all accepted: the next draft may be twice as long (%zu)", d.len);
    kspec_result(&d, 4, 4);
    kspec_result(&d, 8, 8);
    CHECK(d.len == 8, "up to the maximum (%zu)", d.len);
    kspec_result(&d, 8, 3);
    CHECK(d.len == 4 && d.need == KSPEC_MIN_MATCH, "a rejection after 3 accepted: next draft 4 (%zu), match length unchanged", d.len);
    kspec_result(&d, 4, 0);
    kspec_result(&d, 1, 0);
    CHECK(d.len == 1 && d.need == KSPEC_MIN_MATCH + 2, "nothing accepted twice: drafts of 1, matches of %zu tokens needed", d.need);
    for (int i = 0; i < 20; i++) kspec_result(&d, 1, 0);
    CHECK(d.need == KSPEC_MAX_MATCH, "the match length needed stops at %d", KSPEC_MAX_MATCH);
    kspec_result(&d, 1, 1);
    CHECK(d.need == KSPEC_MIN_MATCH && d.len == 2, "an acceptance brings the match length back (%zu) and doubles the draft (%zu)",
          d.need, d.len);
    kspec_result(&d, 0, 0);
    CHECK(d.need == KSPEC_MIN_MATCH && d.len == 2, "no draft, no change");

    /* from another sequence */
    {
        const int32_t mine[] = {50, 51, 1, 2, 3};
        const int32_t other[] = {9, 1, 2, 3, 4, 5, 6, 1, 2, 3, 7};
        kspec_init(&d, 8);
        d.len = 8;
        k = kspec_draft_from(&d, mine, 5, other, 11, 8, NULL, 0, out);
        CHECK(k == 1 && out[0] == 7, "from another sequence: the most recent occurrence, no running on past its end (%zu)", k);
        k = kspec_draft_from(&d, mine, 5, other, 10, 8, NULL, 0, out);
        CHECK(k == 6 && out[0] == 4 && out[5] == 3, "an occurrence ending at the other's last token predicts nothing: the "
              "earlier one (%zu)", k);
        CHECK(kspec_draft_from(&d, mine, 5, other, 11, 8, stop, 1, out) == 1, "the other's stop ids end a draft too");
        CHECK(kspec_draft_from(&d, mine, 5, none, 12, 8, NULL, 0, out) == 0, "no shared 3-gram: no draft");
        CHECK(kspec_draft_from(&d, mine, 2, other, 11, 8, NULL, 0, out) == 0, "a history shorter than the match needed: no draft");
    }

    check_random();
    check_random_from();
    return check_exit();
}
