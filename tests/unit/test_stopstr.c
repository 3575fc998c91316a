/* Stop strings over streamed text (run/text/stopstr.h) against a direct reference: the whole text
 * cut before the stop string complete first (the earliest end, then the earliest start).  Random texts over a small alphabet (so
 * stop strings occur, overlap and share prefixes), cut into random pieces: the output must equal
 * the reference, grow only by text the reference keeps, and hold back no more than the longest
 * stop string minus one byte. */
#include "check.h"
#include "run/text/stopstr.h"

#include <stdint.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* The reference: the length of text kept, or len when no stop string occurs.  The stop string
 * complete first wins: the earliest end; of those ending there, the earliest start. */
static size_t reference(const char *text, size_t len, char **stops, size_t n, int *matched)
{
    *matched = 0;
    for (size_t end = 1; end <= len; end++)
        for (size_t start = 0; start < end; start++)
            for (size_t i = 0; i < n; i++)
                if (strlen(stops[i]) == end - start && !memcmp(text + start, stops[i], end - start)) {
                    *matched = 1;
                    return start;
                }
    return len;
}

static void test_examples(void)
{
    char *stops[] = {"END", "\n\n"};
    kstop k;
    kbuf out = {0};
    kstop_init(&k, stops, 2);
    int r1 = kstop_feed(&k, "Hello E", 7, &out);
    CHECK(r1 == 0 && out.n == 6 && !memcmp(out.p, "Hello ", 6), "a tail that may start a stop string is held back (\"E\")");
    int r2 = kstop_feed(&k, "N", 1, &out);
    CHECK(r2 == 0 && out.n == 6, "still held while it may complete (\"EN\")");
    int r3 = kstop_feed(&k, "Dless", 5, &out);
    CHECK(r3 == 1 && out.n == 6, "the stop string completes: nothing of it or after it is passed on");
    CHECK(kstop_feed(&k, "more", 4, &out) == 1 && out.n == 6, "after a match nothing more passes");
    kstop_free(&k);
    kbuf_free(&out);

    kstop_init(&k, stops, 2);
    memset(&out, 0, sizeof out);
    kstop_feed(&k, "ENDING", 0, &out);
    kstop_feed(&k, "EN", 2, &out);
    kstop_feed(&k, "d", 1, &out);
    CHECK(out.n == 3 && !memcmp(out.p, "ENd", 3), "a held tail that turns out not to be a stop string is passed on whole");
    kstop_feed(&k, "\n", 1, &out);
    kstop_flush(&k, &out);
    CHECK(out.n == 4 && !memcmp(out.p, "ENd\n", 4), "flush passes on what was held at the end");
    kstop_free(&k);
    kbuf_free(&out);

    kstop_init(&k, NULL, 0);
    memset(&out, 0, sizeof out);
    CHECK(kstop_feed(&k, "abc", 3, &out) == 0 && out.n == 3, "without stop strings everything passes at once");
    kstop_free(&k);
    kbuf_free(&out);
}

static void test_random(void)
{
    static const char alphabet[] = {'a', 'b', 'a', 'b', 'c', '\n'};
    int bad_final = 0, bad_prefix = 0, bad_hold = 0, matches = 0;
    const int cases = 20000;
    for (int c = 0; c < cases; c++) {
        char text[64], stopbuf[4][8], *stops[4];
        size_t len = next() % sizeof text, n = 1 + next() % 4, maxlen = 0;
        for (size_t i = 0; i < len; i++) text[i] = alphabet[next() % sizeof alphabet];
        for (size_t i = 0; i < n; i++) {
            size_t L = 1 + next() % 5;
            for (size_t j = 0; j < L; j++) stopbuf[i][j] = alphabet[next() % 4];
            stopbuf[i][L] = 0;
            stops[i] = stopbuf[i];
            if (L > maxlen) maxlen = L;
        }
        int want_match;
        size_t want = reference(text, len, stops, n, &want_match);
        kstop k;
        kbuf out = {0};
        int got_match = 0;
        kstop_init(&k, stops, n);
        for (size_t at = 0; at < len && !got_match;) {
            size_t piece = 1 + next() % 6;
            if (piece > len - at) piece = len - at;
            got_match = kstop_feed(&k, text + at, piece, &out);
            at += piece;
            if (out.n > want || (out.n && memcmp(out.p, text, out.n))) bad_prefix++;
            if (!got_match && out.n + (maxlen - 1) < (at < want ? at : want)) bad_hold++;
        }
        if (!got_match) kstop_flush(&k, &out);
        if (got_match != want_match || out.n != want || (want && memcmp(out.p, text, want))) bad_final++;
        matches += want_match;
        kstop_free(&k);
        kbuf_free(&out);
    }
    CHECK(bad_final == 0, "%d random texts in random pieces: output == the text cut before the stop string complete first "
          "(%d of them contain one; %d differ)", cases, matches, bad_final);
    CHECK(bad_prefix == 0, "the output only ever grows by text the reference keeps (%d violations)", bad_prefix);
    CHECK(bad_hold == 0, "no more than the longest stop string minus one byte is held back (%d violations)", bad_hold);
}

int main(void)
{
    test_examples();
    test_random();
    return check_exit();
}
