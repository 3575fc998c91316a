/* Patterns and exact number bounds (run/grammar/kregex.c, kdfa.c, knum.c) on arbitrary input:
 *   FLAGS LO HI PATTERN [0xff CHOICES]
 * FLAGS: bit 0 the encoding (JSON string / raw text), bits 1-2 the lengths (none, a maxLength HI, both
 * LO..HI).  The pattern is compiled; a refusal must say why.  An automaton is walked, the CHOICES
 * picking each byte among those allowed, and must hold:
 *  - the first-byte set is exact: a byte is in it exactly when a step takes it;
 *  - no dead end: a state always allows a byte, or (raw text) may end;
 *  - a text that ends is one the pattern matches (PCRE2, where it reads the pattern as ECMAScript
 *    does: no \s, \S or \v -- ECMAScript's white space is Unicode's, PCRE2's here ASCII's, and
 *    [^\S] is \s -- no [] or [^]) with LO..HI characters.
 * The same bytes also bound a number (knum: the first bytes as two doubles and the kinds of bound),
 * walked the same way: the first-byte set exact, no dead end, and a number that ends is within its
 * bounds as strtod reads it. */
#include "fuzz.h"

#include "run/grammar/kdfa.h"
#include "run/grammar/knum.h"
#include "run/grammar/kregex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <string.h>

#define MAX_WALK 300

typedef struct { const uint8_t *c; size_t n, i; } choices;
FUZZ_HARNESS_LOOP static unsigned pick(choices *ch, unsigned n) { unsigned v = ch->i < ch->n ? ch->c[ch->i] : 0; ch->i++; return n ? v % n : 0; }
FUZZ_HARNESS_LOOP static int has(const uint8_t set[32], unsigned b) { return set[b >> 3] >> (b & 7) & 1; }

/* The string a JSON text (krun's escapes) stands for; its characters counted. */
FUZZ_HARNESS_LOOP static size_t unjson(const char *p, size_t n, char *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\\') { out[k++] = p[i]; continue; }
        i++;
        switch (p[i]) {
        case 'b': out[k++] = 8; break;
        case 't': out[k++] = 9; break;
        case 'n': out[k++] = 10; break;
        case 'f': out[k++] = 12; break;
        case 'r': out[k++] = 13; break;
        case 'u': { unsigned v = 0; for (int j = 1; j <= 4; j++) v = v * 16 + (unsigned)(p[i + j] <= '9' ? p[i + j] - '0' : p[i + j] - 'a' + 10);
                    out[k++] = (char)v; i += 4; break; }
        default: out[k++] = p[i];
        }
    }
    return k;
}

FUZZ_HARNESS_LOOP static int pcre_comparable(const char *re, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++) {
        if (re[i] == '\\' && (re[i + 1] == 's' || re[i + 1] == 'S' || re[i + 1] == 'v')) return 0;
        if (re[i] == '\\') i++;
        else if (re[i] == '[' && (re[i + 1] == ']' || (re[i + 1] == '^' && i + 2 < n && re[i + 2] == ']'))) return 0;
    }
    return 1;
}

FUZZ_HARNESS_LOOP static void walk_dfa(const kdfa *d, const char *re, size_t rlen, choices *ch)
{
    char text[MAX_WALK * 4 + 8], str[MAX_WALK * 4 + 8];
    size_t n = 0;
    uint32_t st = 0;
    int32_t chars = 0;
    int ended = 0;
    for (int step = 0; step < MAX_WALK && !ended; step++) {
        uint8_t first[32] = {0}, opts[256];
        unsigned no = 0;
        kdfa_first(d, st, chars, first);
        for (unsigned b = 0; b < 256; b++) {
            uint32_t s2 = st;
            int32_t c2 = chars;
            int r = kdfa_byte(d, &s2, &c2, (uint8_t)b);
            FUZZ_CHECK(!!r == has(first, b));
            if (r) opts[no++] = (uint8_t)b;
        }
        if (d->enc == KDFA_RAW && kdfa_may_end(d, st, chars) && (!no || pick(ch, 4) == 0)) { ended = 1; break; }
        FUZZ_CHECK(no > 0);                       /* a dead end is a bug */
        {
            uint8_t b = opts[pick(ch, no)];
            if (ch->i > ch->n && d->enc == KDFA_JSON && has(first, '"')) b = '"';          /* out of choices: the end when it may */
            if (kdfa_byte(d, &st, &chars, b) == 2) { ended = 1; break; }
            text[n++] = (char)b;
        }
    }
    if (!ended) return;
    FUZZ_CHECK(chars >= d->lo && chars <= d->hi);
    if (pcre_comparable(re, rlen)) {
        int err;
        PCRE2_SIZE off;
        pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
        pcre2_code *c;
        size_t sl = d->enc == KDFA_JSON ? unjson(text, n, str) : (memcpy(str, text, n), n);
        pcre2_set_newline(cc, PCRE2_NEWLINE_ANYCRLF);
        pcre2_set_compile_extra_options(cc, PCRE2_EXTRA_ALT_BSUX);
        c = pcre2_compile((PCRE2_SPTR)re, rlen, PCRE2_UTF | PCRE2_DOLLAR_ENDONLY | PCRE2_ALT_BSUX, &err, &off, cc);
        pcre2_compile_context_free(cc);
        if (c) {
            pcre2_match_data *md = pcre2_match_data_create_from_pattern(c, NULL);
            FUZZ_CHECK(md && pcre2_match(c, (PCRE2_SPTR)str, sl, 0, 0, md, NULL) >= 0);
            pcre2_match_data_free(md);
            pcre2_code_free(c);
        }
    }
    fuzz_accepted++;
}

FUZZ_HARNESS_LOOP static void walk_num(const knum *nm, int integer, int hl, double lo, int le, int hh, double hi, int he, uint64_t m, choices *ch)
{
    char text[64];
    size_t n = 0;
    uint64_t st = 0;
    for (int step = 0; step < 40; step++) {
        uint8_t first[32] = {0}, opts[16];
        unsigned no = 0;
        knum_first(nm, st, first);
        for (unsigned b = 0; b < 256; b++) {
            uint64_t s2 = st;
            int r = knum_byte(nm, &s2, (uint8_t)b);
            FUZZ_CHECK(r == has(first, b));
            if (r) opts[no++] = (uint8_t)b;
        }
        if (knum_complete(nm, st) && (!no || pick(ch, 3) == 0)) break;
        FUZZ_CHECK(no > 0);
        text[n++] = (char)opts[pick(ch, no)];
        FUZZ_CHECK(knum_byte(nm, &st, (uint8_t)text[n - 1]));
    }
    text[n] = 0;
    if (!knum_complete(nm, st)) return;
    {
        double v = strtod(text, NULL);
        FUZZ_CHECK(!hl || (le ? v > lo : v >= lo));
        FUZZ_CHECK(!hh || (he ? v < hi : v <= hi));
        FUZZ_CHECK(!(integer || m) || v == floor(v));
        FUZZ_CHECK(!m || fmod(v, (double)m) == 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *sep;
    size_t rlen;
    choices ch;
    int32_t lo, hi;
    if (size < 3) return 0;
    lo = data[1] % 16;
    hi = lo + data[2] % 64;
    sep = memchr(data + 3, 0xff, size - 3);
    rlen = sep ? (size_t)(sep - data - 3) : size - 3;
    ch = (choices){sep ? sep + 1 : data + size, sep ? size - (size_t)(sep + 1 - data) : 0, 0};
    {
        int enc = data[0] & 1, b = (data[0] >> 1) & 3, empty, oom;
        char msg[400];
        kdfa *d = kregex_compile((const char *)data + 3, rlen, 0, enc, b == 2 ? lo : 0, b ? hi : 0x7ffffffe, &empty, &oom, msg, sizeof msg);
        if (!d) FUZZ_CHECK(msg[0]);
        else walk_dfa(d, (const char *)data + 3, rlen, &ch);
        kdfa_free(d);
    }
    if (size >= 20) {
        /* a number's bounds from the bytes: kinds in data[3], the values from data[4..20) */
        double a, c;
        uint64_t m = data[3] & 64 ? (uint64_t)(data[1] % 9 + 1) : 0;
        int integer = data[3] & 1, hl = data[3] & 2, le = data[3] & 4, hh = data[3] & 8, he = data[3] & 16;
        knum nm;
        memcpy(&a, data + 4, 8);
        memcpy(&c, data + 12, 8);
        if (!isfinite(a) || fabs(a) > 1e300) a = (double)(int8_t)data[4];
        if (!isfinite(c) || fabs(c) > 1e300) c = (double)(int8_t)data[12];
        if (data[3] & 32) { a = (double)(int16_t)(data[4] | data[5] << 8) / 8.0; c = (double)(int16_t)(data[12] | data[13] << 8) / 8.0; }
        knum_init(&nm, integer, m);
        if (hl) knum_bound(&nm, 1, a, le);
        if (hh) knum_bound(&nm, 0, c, he);
        ch.i = 0;
        if (knum_possible(&nm)) walk_num(&nm, integer, hl, a, le, hh, c, he, m, &ch);
    }
    return 0;
}
