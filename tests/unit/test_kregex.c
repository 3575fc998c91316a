/* Patterns and formats as byte automata (run/grammar/kregex.c, kdfa.c, knum.c) against an
 * independent matcher: PCRE2 (the tokenizer's regex library) run on the same strings.
 *
 *  - every pattern of a list (zod's, ajv-formats' style, and syntax corner cases) on thousands of
 *    random strings drawn from the characters it cares about plus others: the automaton, walked
 *    over the string as krun writes it in JSON (escapes) and as raw text, accepts exactly when
 *    PCRE2 finds a match and the length is within the bounds given;
 *  - no dead ends: random walks choosing any byte the automaton allows always reach an accepted
 *    end, within maxLength;
 *  - intersections (format with pattern) accept what both accept;
 *  - numbers with exact bounds (knum): every decimal of a grid accepted exactly when its value,
 *    read as a double, is within the bounds (strtod: what a JSON parser does);
 *  - refusals name what they refuse.
 * The formats against ajv-formats itself: tests/node/grammar.mjs. */
#include "check.h"
#include "kdfa_ref.h"
#include "sanitized.h"
#include "testrand.h"

#include "run/grammar/kdfa.h"
#include "run/grammar/knum.h"
#include "run/grammar/kregex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <dirent.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <string.h>

#define NO_MAX 0x7ffffffe

/* The string (UTF-8) as krun writes it inside a JSON string: escapes for the controls, '"' and '\'. */
static size_t json_text(const char *s, size_t n, char *out)
{
    static const char hexd[] = "0123456789abcdef";
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { out[k++] = '\\'; out[k++] = (char)c; }
        else if (c == 8) { out[k++] = '\\'; out[k++] = 'b'; }
        else if (c == 9) { out[k++] = '\\'; out[k++] = 't'; }
        else if (c == 10) { out[k++] = '\\'; out[k++] = 'n'; }
        else if (c == 12) { out[k++] = '\\'; out[k++] = 'f'; }
        else if (c == 13) { out[k++] = '\\'; out[k++] = 'r'; }
        else if (c < 0x20) { memcpy(out + k, "\\u00", 4); k += 4; out[k++] = hexd[c >> 4]; out[k++] = hexd[c & 15]; }
        else out[k++] = (char)c;
    }
    return k;
}

/* Walk d over the bytes (JSON: then the closing quote).  1 accepted. */
static int dfa_accepts(const kdfa *d, const char *text, size_t n)
{
    uint32_t st = 0;
    int32_t chars = 0;
    for (size_t i = 0; i < n; i++)
        if (kdfa_byte(d, &st, &chars, (uint8_t)text[i]) != 1) return 0;
    if (d->enc == KDFA_JSON) return kdfa_byte(d, &st, &chars, '"') == 2;
    return kdfa_may_end(d, st, chars);
}

static size_t utf8_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xc0) != 0x80;
    return c;
}

static void put_cp(char *b, size_t *n, uint32_t c)
{
    if (c < 0x80) b[(*n)++] = (char)c;
    else if (c < 0x800) { b[(*n)++] = (char)(0xc0 | c >> 6); b[(*n)++] = (char)(0x80 | (c & 0x3f)); }
    else if (c < 0x10000) { b[(*n)++] = (char)(0xe0 | c >> 12); b[(*n)++] = (char)(0x80 | ((c >> 6) & 0x3f)); b[(*n)++] = (char)(0x80 | (c & 0x3f)); }
    else { b[(*n)++] = (char)(0xf0 | c >> 18); b[(*n)++] = (char)(0x80 | ((c >> 12) & 0x3f)); b[(*n)++] = (char)(0x80 | ((c >> 6) & 0x3f)); b[(*n)++] = (char)(0x80 | (c & 0x3f)); }
}

typedef struct {
    const char *re;
    const char *alphabet;        /* characters drawn most often (UTF-8) */
    const char *seeds[4];        /* strings mutated */
} pcase;

static const pcase CASES[] = {
    {"^[a-z]+\\d{2,3}$", "abz0129-", {"abc12", "x999", "a1234"}},
    {"mid", "mido", {"xxmidyy", "mi", "dmid"}},
    {"^ab.*", "abx\n", {"abc", "ab", "xab"}},
    {".*yz$", "xyz\n", {"ayz", "yz", "yza"}},
    {"^(?:[A-Za-z0-9_'+\\-]+\\.)*[A-Za-z0-9_'+\\-]*[A-Za-z0-9_+-]@(?:[A-Za-z0-9][A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$",
     "ab.@-_+'1c", {"a.b@c.de", "a..b@c.de", "x@y.z", "'a@b.cd"}},
    {"^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}|00000000-0000-0000-0000-000000000000|ffffffff-ffff-ffff-ffff-ffffffffffff)$",
     "0f8a-A", {"123e4567-e89b-12d3-a456-426614174000", "00000000-0000-0000-0000-000000000000", "123e4567-e89b-92d3-a456-426614174000"}},
    {"^(?:(?:\\d\\d[2468][048]|\\d\\d[13579][26]|\\d\\d0[48]|[02468][048]00|[13579][26]00)-02-29|\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|(?:02)-(?:0[1-9]|1\\d|2[0-8])))$",
     "0123-29", {"2024-02-29", "2023-02-29", "1900-02-29", "2000-02-29"}},
    {"^(?:[01]\\d|2[0-3]):[0-5]\\d(?::[0-5]\\d(?:\\.\\d+)?)?$", "0129:.5", {"23:59", "24:00", "12:30:15.25"}},
    {"^(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])\\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])$",
     "0125.", {"192.168.0.1", "256.1.1.1", "1.2.3"}},
    {"^(([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,7}:|([0-9a-fA-F]{1,4}:){1,6}:[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,5}(:[0-9a-fA-F]{1,4}){1,2}|([0-9a-fA-F]{1,4}:){1,4}(:[0-9a-fA-F]{1,4}){1,3}|([0-9a-fA-F]{1,4}:){1,3}(:[0-9a-fA-F]{1,4}){1,4}|([0-9a-fA-F]{1,4}:){1,2}(:[0-9a-fA-F]{1,4}){1,5}|[0-9a-fA-F]{1,4}:((:[0-9a-fA-F]{1,4}){1,6})|:((:[0-9a-fA-F]{1,4}){1,7}|:))$",
     "0af:", {"::1", "fe80::1:2", "1:2:3:4:5:6:7:8", "1::2::3"}},
    {"^$|^(?:[0-9a-zA-Z+/]{4})*(?:(?:[0-9a-zA-Z+/]{2}==)|(?:[0-9a-zA-Z+/]{3}=))?$", "aZ9+/=", {"", "YWJj", "YWI=", "YQ=="}},
    {"^[cC][0-9a-z]{6,}$", "c0az", {"cjld2cjxh0000qzrmn831i7rn", "c12"}},
    {"^[^A-Z]*$", "aA1 ", {"abc", "aBc"}},
    {"^\\+[1-9]\\d{6,14}$", "+0195", {"+14155552671", "+0123"}},
    {"^[0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}$", "07AHJKz", {"01ARZ3NDEKTSV4RRFFQ69G5FAV"}},
    {"a|b|", "abc", {"", "c"}},
    {"^(a|ab)(c|bcd)(d*)$", "abcd", {"abcd", "acd"}},
    {"^(?:a{2,3}){2}$", "ab", {"aaaa", "aaaaaa", "aaaaaaa"}},
    {"^x*?y+?z??$", "xyz", {"xxyz", "y"}},
    {"[\\d\\-x]{3}", "1-xa", {"1-x", "a12"}},
    {"^[\\u00e9-\\u00ff\\u4e00]+$", "\xc3\xa9\xc3\xbf\xe4\xb8\x80" "a", {"\xc3\xa9\xe4\xb8\x80"}},
    {"^[^\"\\\\]+\\\\\"$", "a\"\\", {"ab\\\"", "a\"b"}},
    {"^\\t\\n\\x41\\cJ$", "\t\nA", {"\t\nA\n"}},
    {"^(?<word>[a-c]+)\\.\\/$", "abc./", {"ab./"}},
    {"\\W\\S\\D", "a1 !", {"!a a", " 1a"}},
    {"^[\\w\\s]{2}$", "a \t!", {"a ", "\t\t"}},
};

/* Does PCRE2 (compiled for ECMAScript's reading: UTF, $ only at the end, \u escapes, . not a line
 * end) match s? */
static int pcre_matches(pcre2_code *re, pcre2_match_data *md, const char *s, size_t n)
{
    return pcre2_match(re, (PCRE2_SPTR)s, n, 0, 0, md, NULL) >= 0;
}

static pcre2_code *pcre_of(const char *re)
{
    int err;
    PCRE2_SIZE off;
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    pcre2_code *c;
    pcre2_set_newline(cc, PCRE2_NEWLINE_ANYCRLF);
    pcre2_set_compile_extra_options(cc, PCRE2_EXTRA_ALT_BSUX);
    c = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_DOLLAR_ENDONLY | PCRE2_ALT_BSUX, &err, &off, cc);
    pcre2_compile_context_free(cc);
    return c;
}

/* A random string: pieces of the seeds and characters of the alphabet, sometimes others. */
static size_t random_string(const pcase *pc, char *out)
{
    size_t n = 0, alen = strlen(pc->alphabet), nseeds = 0;
    uint32_t cps[64];
    size_t ncp = 0;
    while (nseeds < 4 && pc->seeds[nseeds]) nseeds++;
    for (size_t i = 0; i < alen;) {        /* the alphabet's code points */
        unsigned char c = (unsigned char)pc->alphabet[i];
        uint32_t cp = c;
        int k = c < 0x80 ? 0 : c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : 1;
        if (k) cp = c & (0x3f >> k);
        i++;
        for (int j = 0; j < k; j++, i++) cp = (cp << 6) | ((unsigned char)pc->alphabet[i] & 0x3f);
        if (ncp < 64) cps[ncp++] = cp;
    }
    if (nseeds && (rnd() & 1)) {
        const char *s = pc->seeds[rnd() % nseeds];
        size_t l = strlen(s);
        memcpy(out, s, l);
        n = l;
        /* a few edits: a character replaced, inserted or removed (whole characters) */
        for (int e = (int)(rnd() % 3); e > 0 && n; e--) {
            size_t at = rnd() % n;
            while (at && ((unsigned char)out[at] & 0xc0) == 0x80) at--;
            if (rnd() % 3 == 0) {
                size_t end = at + 1;
                while (end < n && ((unsigned char)out[end] & 0xc0) == 0x80) end++;
                memmove(out + at, out + end, n - end);
                n -= end - at;
            } else {
                char tmp[8];
                size_t t = 0;
                put_cp(tmp, &t, cps[rnd() % ncp]);
                memmove(out + at + t, out + at, n - at);
                memcpy(out + at, tmp, t);
                n += t;
            }
        }
        return n;
    }
    for (size_t len = rnd() % 12; len > 0; len--) {
        uint32_t r = (uint32_t)(rnd() % 20), cp;
        if (r < 16 && ncp) cp = cps[rnd() % ncp];
        else if (r < 18) cp = 0x20 + (uint32_t)(rnd() % 95);
        else if (r == 18) cp = 1 + (uint32_t)(rnd() % 31);
        else cp = (uint32_t[]){0xe9, 0x4e00, 0x1f600, 0x7f, 0x80, 0xffff}[rnd() % 6];
        if (cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x85) cp = 'q';    /* PCRE2 and ECMAScript read these apart */
        put_cp(out, &n, cp);
    }
    return n;
}

static void test_patterns(void)
{
    int bad_cases = 0;
    long tried = 0, matched = 0;
    for (size_t k = 0; k < sizeof CASES / sizeof *CASES; k++) {
        const pcase *pc = &CASES[k];
        pcre2_code *re = pcre_of(pc->re);
        pcre2_match_data *md = re ? pcre2_match_data_create_from_pattern(re, NULL) : NULL;
        int wrong = 0;
        if (!re || !md) { printf("# PCRE2 refused %s\n", pc->re); bad_cases++; continue; }
        for (int enc = 0; enc < 2; enc++)
            for (int b = 0; b < 3; b++) {
                /* bounds: none, a maxLength, both */
                int32_t lo = b == 2 ? 2 : 0, hi = b ? 6 : NO_MAX;
                char msg[400];
                int empty, oom;
                kdfa *d = kregex_compile(pc->re, strlen(pc->re), 0, enc, lo, hi, &empty, &oom, msg, sizeof msg);
                if (!d) {
                    if (!empty) { printf("# %s refused: %s\n", pc->re, msg); wrong++; }
                    continue;
                }
                for (int t = 0; t < 1500; t++) {
                    char s[256], j[1600];
                    size_t n = random_string(pc, s), chars = utf8_chars(s, n), jn;
                    int want = pcre_matches(re, md, s, n) && (int32_t)chars >= lo && (int32_t)chars <= hi, got;
                    if (memchr(s, 0, n)) continue;
                    jn = enc == KDFA_JSON ? json_text(s, n, j) : (memcpy(j, s, n), n);
                    got = dfa_accepts(d, j, jn);
                    tried++;
                    matched += want;
                    if (got != want && wrong++ < 3)
                        printf("# %s (%s, %d..%d chars) on \"%.*s\": automaton %d, PCRE2 %d\n", pc->re, enc ? "raw" : "JSON", lo, hi, (int)n, s, got, want);
                }
                kdfa_free(d);
            }
        if (wrong) bad_cases++;
        pcre2_match_data_free(md);
        pcre2_code_free(re);
    }
    CHECK(!bad_cases && matched > tried / 20, "%zu patterns x (JSON, raw) x (no bounds, maxLength, both) on %ld random strings (%ld matching): "
          "the automaton accepts exactly what PCRE2 matches within the lengths", sizeof CASES / sizeof *CASES, tried, matched);
}

/* From the start, any allowed byte at random: an accepted end is always reached. */
static void test_no_dead_ends(void)
{
    int bad = 0, walks = 0;
    for (size_t k = 0; k < sizeof CASES / sizeof *CASES; k++)
        for (int b = 0; b < 2; b++) {
            char msg[400];
            int empty, oom;
            int32_t lo = b ? 3 : 0, hi = b ? 9 : NO_MAX;
            kdfa *d = kregex_compile(CASES[k].re, strlen(CASES[k].re), 0, KDFA_JSON, lo, hi, &empty, &oom, msg, sizeof msg);
            if (!d) continue;
            for (int w = 0; w < 200; w++, walks++) {
                uint32_t st = 0;
                int32_t chars = 0;
                int done = 0;
                for (int step = 0; step < 400 && !done; step++) {
                    uint8_t set[32] = {0}, opts[256];
                    int no = 0;
                    kdfa_first(d, st, chars, set);
                    for (int x = 0; x < 256; x++) {
                        uint32_t s2 = st;
                        int32_t c2 = chars;
                        if ((set[x >> 3] >> (x & 7) & 1) && kdfa_byte(d, &s2, &c2, (uint8_t)x)) opts[no++] = (uint8_t)x;
                    }
                    if (!no) { bad++; printf("# %s: a dead end after %d characters\n", CASES[k].re, chars); break; }
                    {
                        uint8_t x = (step > 60 && memchr(opts, '"', (size_t)no)) ? '"' : opts[rnd() % (uint64_t)no];
                        if (kdfa_byte(d, &st, &chars, x) == 2) done = 1;
                    }
                }
                if (chars > hi) bad++;
            }
            kdfa_free(d);
        }
    CHECK(!bad, "%d random walks through %zu automata (with and without bounds) never meet a dead end", walks, sizeof CASES / sizeof *CASES);
}

static void test_formats_and_intersection(void)
{
    char msg[400];
    int empty, oom, known, bad = 0;
    for (int i = 0; kregex_format_names[i]; i++) {
        kdfa *d = kregex_format(kregex_format_names[i], KDFA_JSON, 0, NO_MAX, &known, &empty, &oom, msg, sizeof msg);
        if (!d || !known) { bad++; printf("# format %s: %s\n", kregex_format_names[i], msg); }
        kdfa_free(d);
    }
    kregex_format("jwt", KDFA_JSON, 0, NO_MAX, &known, &empty, &oom, msg, sizeof msg);
    CHECK(!bad && !known, "every format named compiles; an unknown one is said to be unknown");
    {
        kdfa *f = kregex_format("email", KDFA_JSON, 0, NO_MAX, &known, &empty, &oom, msg, sizeof msg);
        kdfa *p = kregex_compile("^[a-z.]+@", 9, 0, KDFA_JSON, 0, NO_MAX, &empty, &oom, msg, sizeof msg);
        int big;
        /* (a format or pattern that failed to compile is a failed check, not a crash) */
        kdfa *both = f && p ? kdfa_intersect(f, p, 0, 12, &empty, &big) : NULL;
        static const struct { const char *s; int want; } t[] = {{"a.b@c.de", 1}, {"a1@c.de", 0}, {"ab@cd", 0}, {"abcdefg@hi.jk", 0}, {"ab@c.de", 1}};
        int wrong = 0;
        for (size_t i = 0; both && i < sizeof t / sizeof *t; i++) wrong += dfa_accepts(both, t[i].s, strlen(t[i].s)) != t[i].want;
        CHECK(both && !wrong, "email format & ^[a-z.]+@ & at most 12 characters: %d of 5 wrong", wrong);
        kdfa_free(f); kdfa_free(p); kdfa_free(both);
    }
    {
        kdfa *d = kregex_format("hostname", KDFA_JSON, 0, NO_MAX, &known, &empty, &oom, msg, sizeof msg);
        char host[300];
        memset(host, 'a', 253);
        for (int i = 60; i < 253; i += 61) host[i] = '.';
        int at_most = d && dfa_accepts(d, host, 253);
        host[253] = 'a';
        CHECK(at_most && !dfa_accepts(d, host, 254), "hostname: 253 characters at most");
        kdfa_free(d);
    }
}

/* Escapes PCRE2 spells otherwise: \\u{...} and a surrogate pair of \\u escapes are one character each. */
static void test_unicode_escapes(void)
{
    char msg[400];
    int empty, oom;
    const char *re = "^\\u{1F600}\\uD83D\\uDE01[\\u{10000}-\\u{10FFFF}]$";
    kdfa *d = kregex_compile(re, strlen(re), 0, KDFA_RAW, 0, NO_MAX, &empty, &oom, msg, sizeof msg);
    CHECK(d && dfa_accepts(d, "\xf0\x9f\x98\x80\xf0\x9f\x98\x81\xf4\x8f\xbf\xbf", 12) &&
          !dfa_accepts(d, "\xf0\x9f\x98\x80\xf0\x9f\x98\x81\xef\xbf\xbf", 11), "\\u{1F600}, a surrogate pair of \\u escapes, astral ranges: one character each");
    kdfa_free(d);
}

static void test_refusals(void)
{
    static const struct { const char *re, *words; } r[] = {
        {"(?=a)b", "lookahead"}, {"(?!a)b", "lookahead"}, {"(?<=a)b", "lookbehind"}, {"(a)\\1", "backreferences"},
        {"\\k<x>", "backreferences"}, {"\\bx", "word boundaries"}, {"\\p{L}", "property"}, {"[a", "not closed"},
        {"(a", "not closed"}, {"a)", "unmatched"}, {"*a", "nothing to repeat"}, {"a{2000}", "quantifiers above"},
        {"\\q", "unknown escape"}, {"[z-a]", "out of order"},
        {"a*+", "nothing to repeat"}, {"a?+b", "nothing to repeat"}, {"a{2}{3}", "nothing to repeat"}, {"a+?*", "nothing to repeat"},
        {"(a|b)*a(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)", "too complex"},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof r / sizeof *r; i++) {
        char msg[400];
        int empty, oom;
        kdfa *d = kregex_compile(r[i].re, strlen(r[i].re), 0, KDFA_JSON, 0, NO_MAX, &empty, &oom, msg, sizeof msg);
        if (d || !strstr(msg, r[i].words)) { bad++; printf("# %s: %s\n", r[i].re, d ? "compiled" : msg); }
        kdfa_free(d);
    }
    CHECK(!bad, "%zu patterns refused, each message naming what (%d wrong)", sizeof r / sizeof *r, bad);
}

/* knum: decimals on a grid, accepted exactly when strtod's double is within the bounds. */
static int num_accepts(const knum *n, const char *s)
{
    uint64_t st = 0;
    for (const char *p = s; *p; p++)
        if (!knum_byte(n, &st, (uint8_t)*p)) return 0;
    return knum_complete(n, st);
}

static void test_numbers(void)
{
    static const struct { int integer; int hl; double lo; int le; int hh; double hi; int he; uint64_t m; } b[] = {
        {0, 1, 0, 0, 1, 1, 0, 0}, {0, 1, -0.5, 0, 1, 1, 1, 0}, {0, 1, 2.5, 1, 1, 10, 1, 0}, {0, 0, 0, 0, 1, 0.1, 1, 0},
        {1, 1, 100, 0, 1, 200, 0, 0}, {1, 1, -7, 1, 1, 7, 0, 3}, {0, 1, 0, 1, 0, 0, 0, 0}, {0, 1, 1e-3, 0, 1, 1.0001, 0, 0},
        {1, 1, -9007199254740991.0, 0, 1, 9007199254740991.0, 0, 0}, {0, 1, 0.30000000000000004, 0, 1, 0.3000000000000001, 0, 0},
    };
    int bad = 0;
    long tried = 0, yes = 0;
    for (size_t i = 0; i < sizeof b / sizeof *b; i++) {
        knum n;
        knum_init(&n, b[i].integer, b[i].m);
        if (b[i].hl) knum_bound(&n, 1, b[i].lo, b[i].le);
        if (b[i].hh) knum_bound(&n, 0, b[i].hi, b[i].he);
        for (int t = 0; t < 20000; t++) {
            char s[64];
            int digits = 1 + (int)(rnd() % 15), f = b[i].integer ? 0 : (int)(rnd() % (uint64_t)digits), k = digits - f;
            size_t p = 0;
            double v;
            int want, got;
            if (rnd() & 1) s[p++] = '-';
            if (k == 1 && rnd() % 3 == 0) s[p++] = '0';
            else for (int j = 0; j < k; j++) s[p++] = (char)('0' + (j ? rnd() % 10 : (k > 3 ? 1 + rnd() % 9 : rnd() % 10)));
            if (k > 1 && s[p - k] == '0') s[p - k] = '1';
            if (f) { s[p++] = '.'; for (int j = 0; j < f; j++) s[p++] = (char)('0' + rnd() % 10); }
            s[p] = 0;
            v = strtod(s, NULL);
            want = (!b[i].hl || (b[i].le ? v > b[i].lo : v >= b[i].lo)) && (!b[i].hh || (b[i].he ? v < b[i].hi : v <= b[i].hi)) &&
                   (!b[i].integer || v == floor(v)) && (!b[i].m || fmod(v, (double)b[i].m) == 0);
            got = num_accepts(&n, s);
            tried++;
            yes += want;
            if (got != want && bad++ < 5) printf("# bounds %zu on %s: knum %d, doubles %d\n", i, s, got, want);
        }
    }
    CHECK(!bad && yes > tried / 10, "%ld decimals on %zu sets of bounds (%ld within): accepted exactly when their double is within", tried,
          sizeof b / sizeof *b, yes);
}

/* ---- the minimization against the reference (kdfa_ref.h: the implementation before Hopcroft's) ---- */

/* Everything a kdfa holds, equal (both NULL with the same *empty counts as equal). */
static int same_kdfa(const kdfa *a, const kdfa *b)
{
    if (!a || !b) return a == b;
    if (a->n != b->n || a->n_classes != b->n_classes || memcmp(a->cls, b->cls, 256) || a->enc != b->enc || a->lo != b->lo || a->hi != b->hi ||
        a->words != b->words || !a->lens != !b->lens || !a->most != !b->most)
        return 0;
    return !memcmp(a->next, b->next, (size_t)a->n * a->n_classes * sizeof *a->next) && !memcmp(a->flags, b->flags, a->n) &&
           !memcmp(a->first, b->first, (size_t)a->n * sizeof *a->first) &&
           !memcmp(a->class_bytes, b->class_bytes, (size_t)a->n_classes * sizeof *a->class_bytes) &&
           (!a->lens || !memcmp(a->lens, b->lens, (size_t)a->n * a->words * sizeof *a->lens)) &&
           (!a->most || !memcmp(a->most, b->most, (size_t)a->n * sizeof *a->most));
}

/* a (NULL: *empty e1), built from the byte table next, against the reference's minimization of it; 1
 * when they agree (a freed).  *built counts the automata built. */
static int against_reference(kdfa *a, int e1, uint32_t n, const uint32_t *next, const uint8_t *flags, int enc, int32_t lo, int32_t hi, const char *what,
                             long *built)
{
    int e2, ok;
    kdfa *b = ref_kdfa_from_table(n, next, flags, enc, lo, hi, &e2);
    ok = e1 == e2 && same_kdfa(a, b) && (a || e1);
    if (!ok) printf("# %s (%u states, %d..%d): new %u states/%u classes (empty %d), reference %u/%u (empty %d)\n", what, n, lo, hi,
                    a ? a->n : 0, a ? a->n_classes : 0, e1, b ? b->n : 0, b ? b->n_classes : 0, e2);
    *built += a != NULL;
    kdfa_free(a);
    kdfa_free(b);
    return ok;
}

static int minimize_both(uint32_t n, const uint32_t *next, const uint8_t *flags, int enc, int32_t lo, int32_t hi, const char *what, long *built)
{
    int e1;
    kdfa *a = kdfa_from_table(n, next, flags, enc, lo, hi, &e1);
    return against_reference(a, e1, n, next, flags, enc, lo, hi, what, built);
}

/* kregex_compile's automaton (its subset table in columns, kdfa_from_columns) against the reference's
 * minimization of the same table spelled out byte by byte. */
static int compile_both(const char *re, size_t len, int enc, int32_t lo, int32_t hi, uint32_t n, const uint32_t *next, const uint8_t *flags,
                        const char *what, long *built)
{
    char msg[400];
    int e1, oom;
    kdfa *a = kregex_compile(re, len, 0, enc, lo, hi, &e1, &oom, msg, sizeof msg);
    return against_reference(a, e1, n, next, flags, enc, lo, hi, what, built);
}

/* Random lengths: none, a maxLength, both, or a minLength alone. */
static void random_bounds(int32_t *lo, int32_t *hi)
{
    switch (rnd() % 4) {
    case 0: *lo = 0; *hi = NO_MAX; break;
    case 1: *lo = 0; *hi = (int32_t)(rnd() % 12); break;
    case 2: *lo = (int32_t)(rnd() % 6); *hi = *lo + (int32_t)(rnd() % 10); break;
    default: *lo = (int32_t)(rnd() % 8); *hi = NO_MAX;
    }
}

/* A random table of n states: each row runs of bytes to a state or nowhere.  With k > 0 the states
 * are copies of k core states (state s copies s % k and goes where its core goes, to any copy), so
 * that many are equivalent; chain: a line of states (the fixed point's and Moore's worst case). */
static void random_table(uint32_t n, uint32_t k, int chain, uint32_t *next, uint8_t *flags)
{
    uint32_t *core = xmalloc((size_t)(k ? k : 1) * 256 * sizeof *core);
    uint8_t *cflags = xmalloc(k ? k : 1);
    int dead_pct = (int)(rnd() % 90);
    for (uint32_t c = 0; c < (k ? k : n); c++) {
        uint32_t *row = k ? core + (size_t)c * 256 : next + (size_t)c * 256;
        uint32_t pool = k ? k : n, t = 0;
        for (int b = 0; b < 256; b++) {
            if (b == 0 || rnd() % 16 == 0) t = (int)(rnd() % 100) < dead_pct ? KDFA_DEAD : (uint32_t)(rnd() % pool);
            if (chain) t = b == 'a' ? (c + 1 < pool ? c + 1 : KDFA_DEAD) : b == 'b' && rnd() % 4 == 0 ? (uint32_t)(rnd() % pool) : KDFA_DEAD;
            row[b] = t;
        }
        (k ? cflags : flags)[c] = (uint8_t)(rnd() % 4);
        if (chain) (k ? cflags : flags)[c] = (uint8_t)(KDFA_BOUNDARY | (c + 1 == pool || rnd() % 8 == 0 ? KDFA_ACCEPT : 0));
    }
    if (k)
        for (uint32_t s = 0; s < n; s++) {
            flags[s] = cflags[s % k];
            for (int b = 0; b < 256; b++) {
                uint32_t t = core[(size_t)(s % k) * 256 + b], copies = t == KDFA_DEAD ? 0 : (n - 1 - t) / k + 1;
                next[(size_t)s * 256 + b] = t == KDFA_DEAD ? KDFA_DEAD : t + k * (uint32_t)(rnd() % copies);
            }
        }
    free(core);
    free(cflags);
}

/* The automaton d as a full table again, its states copied (each 1-3 times, the copies' transitions
 * to any copy) and shuffled (the start stays 0), with unreachable and dead states among them: what
 * minimizes back to d, but numbered nothing like it. */
static uint32_t inflate(const kdfa *d, uint32_t **next_out, uint8_t **flags_out)
{
    uint32_t m = 0, *owner = xmalloc((size_t)d->n * 3 * sizeof *owner + 64 * sizeof *owner), *first_copy = xmalloc((size_t)d->n * 4 * sizeof *first_copy);
    uint32_t *ncopies = xmalloc((size_t)d->n * sizeof *ncopies), *perm, *next;
    uint8_t *flags;
    uint32_t extra = (uint32_t)(rnd() % 5);
    for (uint32_t s = 0; s < d->n; s++) {
        ncopies[s] = 1 + (uint32_t)(rnd() % 3);
        first_copy[s] = m;
        for (uint32_t c = 0; c < ncopies[s]; c++) owner[m++] = s;
    }
    /* extra states: unreachable ones (KDFA_DEAD + 1) and a dead end reachable from a random state */
    for (uint32_t e = 0; e < extra; e++) owner[m++] = KDFA_DEAD;
    perm = xmalloc((size_t)m * sizeof *perm);
    for (uint32_t i = 0; i < m; i++) perm[i] = i;
    for (uint32_t i = m - 1; i > 1; i--) {   /* (0, the first copy of the start, stays 0) */
        uint32_t j = 1 + (uint32_t)(rnd() % i), x = perm[i];
        perm[i] = perm[j]; perm[j] = x;
    }
    next = xmalloc((size_t)m * 256 * sizeof *next);
    flags = xmalloc(m);
    for (uint32_t i = 0; i < m; i++) {
        uint32_t s = owner[i], *row = next + (size_t)perm[i] * 256;
        if (s == KDFA_DEAD) {
            /* not accepting, going to itself or back into the automaton */
            flags[perm[i]] = (uint8_t)(rnd() % 2 ? KDFA_BOUNDARY : 0);
            for (int b = 0; b < 256; b++) row[b] = rnd() % 3 ? KDFA_DEAD : rnd() % 2 ? perm[i] : perm[rnd() % m];
            continue;
        }
        flags[perm[i]] = d->flags[s];
        for (int b = 0; b < 256; b++) {
            uint32_t t = d->next[(size_t)s * d->n_classes + d->cls[b]];
            row[b] = t == KDFA_DEAD ? KDFA_DEAD : perm[first_copy[t] + (uint32_t)(rnd() % ncopies[t])];
        }
    }
    /* a live state's dead transitions: some to the dead extra states instead */
    for (uint32_t i = 0; i < m && extra; i++)
        if (owner[i] != KDFA_DEAD && rnd() % 4 == 0) {
            uint32_t *row = next + (size_t)perm[i] * 256;
            for (int b = 0; b < 256; b++)
                if (row[b] == KDFA_DEAD && rnd() % 2) row[b] = perm[d->n ? m - 1 - (uint32_t)(rnd() % extra) : 0];
        }
    free(owner); free(first_copy); free(ncopies); free(perm);
    *next_out = next;
    *flags_out = flags;
    return m;
}

/* The corpus of fuzz_regex (its seeds and regression inputs): FLAGS LO HI PATTERN [0xff ...]. */
static int fuzz_corpus_patterns(const char *dir, long *tried, long *built, int *bad)
{
    DIR *dd = opendir(dir);
    struct dirent *de;
    if (!dd) return -1;
    while ((de = readdir(dd))) {
        char path[1024], *buf, msg[400];
        size_t len;
        uint32_t n, *next;
        uint8_t *flags;
        int oom;
        if (de->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (!(buf = check_read_file(path, &len))) continue;
        if (len >= 3) {
            const char *re = buf + 3, *sep = memchr(re, 0xff, len - 3);
            size_t rlen = sep ? (size_t)(sep - re) : len - 3;
            int enc = buf[0] & 1, b = (buf[0] >> 1) & 3;
            int32_t lo = (uint8_t)buf[1] % 16, hi = lo + (uint8_t)buf[2] % 64;
            if (!kregex_table(re, rlen, 0, enc, &n, &next, &flags, &oom, msg, sizeof msg)) {
                *bad += !minimize_both(n, next, flags, enc, b == 2 ? lo : 0, b ? hi : NO_MAX, path, built);
                *bad += !minimize_both(n, next, flags, enc, 0, NO_MAX, path, built);
                *bad += !compile_both(re, rlen, enc, b == 2 ? lo : 0, b ? hi : NO_MAX, n, next, flags, path, built);
                (*tried) += 3;
                free(next); free(flags);
            }
        }
        free(buf);
    }
    closedir(dd);
    return 0;
}

static void test_minimize_reference(void)
{
    /* patterns whose subset tables are large or full of equivalent states */
    static const char *const more[] = {
        "a.{6}b", "(a|b)*a(a|b)(a|b)(a|b)(a|b)(a|b)", "^(?:[0-9a-f]{2}:){5}[0-9a-f]{2}$", "x|xy|xyz|[^x]{3}", "^\\w{1,3}(?:-\\w{1,3}){0,3}$",
        "^[\\u0080-\\u{10FFFF}]{2}$", "[\"\\\\\\n]{2}", "^(?:ab|ba)*$|^c", "\\d+\\.\\d*e[+-]?\\d+", "^.{0,40}$", "[^a-z]",
    };
    int bad = 0;
    long tried = 0, built = 0, corpus = 0;
    char msg[400];
    /* every pattern of this file, and those above, each encoding and bounds */
    for (size_t k = 0; k < sizeof CASES / sizeof *CASES + sizeof more / sizeof *more; k++) {
        const char *re = k < sizeof CASES / sizeof *CASES ? CASES[k].re : more[k - sizeof CASES / sizeof *CASES];
        for (int enc = 0; enc < 2; enc++) {
            uint32_t n, *next;
            uint8_t *flags;
            int oom;
            if (kregex_table(re, strlen(re), 0, enc, &n, &next, &flags, &oom, msg, sizeof msg)) { printf("# %s: %s\n", re, msg); bad++; continue; }
            for (int b = 0; b < 4; b++) {
                int32_t lo = b >= 2 ? 2 : 0, hi = b == 1 || b == 2 ? 7 : NO_MAX;
                bad += !minimize_both(n, next, flags, enc, lo, hi, re, &built);
                bad += !compile_both(re, strlen(re), enc, lo, hi, n, next, flags, re, &built);
                tried += 2;
            }
            free(next); free(flags);
        }
    }
    if (fuzz_corpus_patterns("tests/fuzz/corpus/regex", &corpus, &built, &bad) || fuzz_corpus_patterns("tests/fuzz/regress/regex", &corpus, &built, &bad))
        SKIP("fuzz_regex's corpus against the reference (tests/fuzz/corpus/regex not found from %s)", ".");
    tried += corpus;
    /* every format, minimized, then inflated (copies, shuffled) and minimized again by both */
    for (int i = 0; kregex_format_names[i]; i++)
        for (int enc = 0; enc < 2; enc++) {
            int known, empty, oom;
            kdfa *d = kregex_format(kregex_format_names[i], enc, 0, NO_MAX, &known, &empty, &oom, msg, sizeof msg);
            for (int r = 0; d && r < 3; r++) {
                uint32_t *next;
                uint8_t *flags;
                uint32_t m = inflate(d, &next, &flags);
                int32_t lo, hi;
                random_bounds(&lo, &hi);
                bad += !minimize_both(m, next, flags, enc, lo, hi, kregex_format_names[i], &built);
                tried++;
                free(next); free(flags);
            }
            kdfa_free(d);
        }
    /* random tables: plain, copies of a small core, chains; some given in columns (fewer under the
     * sanitizers, where the reference's rounds are slow) */
    for (int t = 0; t < (SANITIZED ? 600 : 3000); t++) {
        int kind = t % 3;
        uint32_t n = kind == 2 ? 2 + (uint32_t)(rnd() % 300) : 1 + (uint32_t)(rnd() % 80), k = kind == 1 ? 1 + (uint32_t)(rnd() % 8) : 0;
        uint32_t *next = xmalloc((size_t)n * 256 * sizeof *next);
        uint8_t *flags = xmalloc(n);
        int32_t lo, hi;
        random_table(n, k < n ? k : 0, kind == 2, next, flags);
        random_bounds(&lo, &hi);
        bad += !minimize_both(n, next, flags, (int)(rnd() % 2), lo, hi, kind == 2 ? "a random chain" : kind ? "random copies" : "a random table", &built);
        tried++;
        if (t % 2) {
            /* the same rows read through a random column map of w columns: kdfa_from_columns */
            uint32_t w = 1 + (uint32_t)(rnd() % 40), *cnext = xmalloc((size_t)n * w * sizeof *cnext);
            uint8_t col[256];
            int enc = (int)(rnd() % 2), e1;
            kdfa *a;
            for (int b = 0; b < 256; b++) col[b] = (uint8_t)(rnd() % w);
            for (uint32_t s = 0; s < n; s++)
                for (uint32_t c = 0; c < w; c++) cnext[(size_t)s * w + c] = next[(size_t)s * 256 + rnd() % 256];
            for (uint32_t s = 0; s < n; s++)
                for (int b = 0; b < 256; b++) next[(size_t)s * 256 + b] = cnext[(size_t)s * w + col[b]];
            a = kdfa_from_columns(n, w, col, cnext, flags, enc, lo, hi, &e1);
            bad += !against_reference(a, e1, n, next, flags, enc, lo, hi, "a random column table", &built);
            tried++;
            free(cnext);
        }
        free(next); free(flags);
    }
    /* intersections: each format and pattern with six others, and random automata with each other
     * (fewer under the sanitizers: the reference allocates 16 MiB for each) */
    {
        kdfa *pool[64];
        int n_pool = 0, n_pairs = 0;
        for (int i = 0; kregex_format_names[i]; i++) {
            int known, empty, oom;
            pool[n_pool] = kregex_format(kregex_format_names[i], KDFA_JSON, 0, NO_MAX, &known, &empty, &oom, msg, sizeof msg);
            n_pool += pool[n_pool] != NULL;
        }
        for (size_t k = 0; k < sizeof CASES / sizeof *CASES && n_pool < 64; k++) {
            int empty, oom;
            pool[n_pool] = kregex_compile(CASES[k].re, strlen(CASES[k].re), 0, KDFA_JSON, 0, NO_MAX, &empty, &oom, msg, sizeof msg);
            n_pool += pool[n_pool] != NULL;
        }
        for (int t = 0; t < (SANITIZED ? 100 : 400); t++) {
            uint32_t n = 1 + (uint32_t)(rnd() % 30);
            uint32_t *next = xmalloc((size_t)n * 256 * sizeof *next);
            uint8_t *flags = xmalloc(n);
            int empty;
            kdfa *r[2];
            for (int j = 0; j < 2; j++) {
                random_table(n, t % 2 && n > 4 ? 4 : 0, 0, next, flags);
                r[j] = kdfa_from_table(n, next, flags, KDFA_JSON, 0, NO_MAX, &empty);
            }
            if (r[0] && r[1]) {
                int32_t lo, hi;
                int e1, e2, big1, big2;
                kdfa *x, *y;
                random_bounds(&lo, &hi);
                x = kdfa_intersect(r[0], r[1], lo, hi, &e1, &big1);
                y = ref_kdfa_intersect(r[0], r[1], lo, hi, &e2, &big2);
                if (!same_kdfa(x, y) || e1 != e2 || big1 != big2) { bad++; printf("# random intersection %d differs from the reference\n", t); }
                built += x != NULL;
                n_pairs++;
                kdfa_free(x); kdfa_free(y);
            }
            kdfa_free(r[0]); kdfa_free(r[1]);
            free(next); free(flags);
        }
        for (int i = 0; i < n_pool; i++)
            for (int r = 0; r < (SANITIZED ? 2 : 6); r++) {
                int j = (i * 7 + r * 5) % n_pool;
                int32_t lo = j % 3 ? 0 : 2, hi = i % 2 ? 40 : NO_MAX;
                int e1, e2, big1, big2;
                kdfa *x = kdfa_intersect(pool[i], pool[j], lo, hi, &e1, &big1), *y = ref_kdfa_intersect(pool[i], pool[j], lo, hi, &e2, &big2);
                if (!same_kdfa(x, y) || e1 != e2 || big1 != big2) { bad++; printf("# intersection %d x %d differs from the reference\n", i, j); }
                built += x != NULL;
                n_pairs++;
                kdfa_free(x); kdfa_free(y);
            }
        for (int i = 0; i < n_pool; i++) kdfa_free(pool[i]);
        tried += n_pairs;
        CHECK(!bad, "%d intersections (formats and patterns, random automata) built exactly as the reference builds them", n_pairs);
    }
    CHECK(!bad && built > tried / 3, "%ld tables (the patterns' and kregex_compile's, %ld of fuzz_regex's corpus, inflated formats, random ones, in bytes and in columns; "
          "%ld not empty) minimized exactly as the reference does: same states, numbering, classes, transitions, flags, first bytes, length tables (%d differ)", tried, corpus, built, bad);
}

int main(void)
{
    test_patterns();
    test_no_dead_ends();
    test_formats_and_intersection();
    test_unicode_escapes();
    test_refusals();
    test_numbers();
    test_minimize_reference();
    return check_exit();
}
