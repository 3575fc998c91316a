/* Tokenizer tests: synthetic byte-level vocabularies (always), and the real Kimi rank file with the
 * oracle vectors of $K3_SHARED/fixtures/tokenizer (skipped visibly when absent). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "check.h"
#include "run/text/tokenizer.h"
#include "run/text/tokenizer_ucd.h"

#include <jansson.h>
#include <pcre2.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------------------------------ */
/* helpers                                                                                    */

typedef struct { char *p; size_t n, cap; } sbuf;

static _Noreturn void die_oom(void)
{
    printf("not ok - out of memory in test\n");
    exit(1);
}

static void sb_add(sbuf *b, const void *p, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *q = realloc(b->p, c);
        if (!q) die_oom();
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }
static void sb_rep(sbuf *b, const char *s, size_t times) { for (size_t i = 0; i < times; i++) sb_str(b, s); }
static void sb_cp(sbuf *b, uint32_t c)
{
    uint8_t u[4];
    size_t l;
    if (c < 0x80) { u[0] = (uint8_t)c; l = 1; }
    else if (c < 0x800) { u[0] = (uint8_t)(0xC0 | (c >> 6)); u[1] = (uint8_t)(0x80 | (c & 0x3F)); l = 2; }
    else if (c < 0x10000) {
        u[0] = (uint8_t)(0xE0 | (c >> 12)); u[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        u[2] = (uint8_t)(0x80 | (c & 0x3F)); l = 3;
    } else {
        u[0] = (uint8_t)(0xF0 | (c >> 18)); u[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
        u[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F)); u[3] = (uint8_t)(0x80 | (c & 0x3F)); l = 4;
    }
    sb_add(b, u, l);
}

static int read_whole(const char *path, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    sbuf b = {0};
    char tmp[65536];
    size_t r;
    while ((r = fread(tmp, 1, sizeof tmp, f)) > 0) sb_add(&b, tmp, r);
    int bad = ferror(f);
    if (fclose(f) != 0) bad = 1;
    if (bad) { free(b.p); return -1; }
    if (!b.p) sb_add(&b, "", 0);
    *buf = b.p;
    *len = b.n;
    return 0;
}

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    return rng_state = x;
}
static uint32_t rndn(uint32_t n) { return (uint32_t)(rnd() % n); }

/* Escaped rendering of (a prefix of) a text for '#' lines. */
static void escape(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 12 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7F && c != '\\' && c != '"') { out[o++] = (char)c; continue; }
        if (c == '\\' || c == '"') { out[o++] = '\\'; out[o++] = (char)c; continue; }
        if (c < 0x80) { o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c); continue; }
        /* a whole UTF-8 sequence as \u{...} */
        uint32_t cp = 0;
        size_t l = (c >= 0xF0) ? 4 : (c >= 0xE0) ? 3 : (c >= 0xC0) ? 2 : 1;
        if (l == 1 || i + l > n) { o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c); continue; }
        cp = c & (0xFF >> (l + 1));
        for (size_t k = 1; k < l; k++) cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3F);
        o += (size_t)snprintf(out + o, cap - o, "\\u{%X}", cp);
        i += l - 1;
    }
    if (o + 12 >= cap) { out[o++] = '.'; out[o++] = '.'; out[o++] = '.'; }
    out[o] = 0;
}

static double now_s(void)
{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* decode(ids) == text? */
static int roundtrips(const ktok *t, const int32_t *ids, size_t n, const char *text, size_t len)
{
    uint8_t *out;
    size_t ol;
    long sk = ktok_decode(t, ids, n, &out, &ol);
    if (sk < 0) die_oom();
    int ok = sk == 0 && ol == len && memcmp(out, text, len) == 0;
    free(out);
    return ok;
}

static int ids_eq(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

static int enc(const ktok *t, const char *s, size_t n, int allow, int32_t **ids, size_t *ni)
{
    int rc = ktok_encode(t, s, n, allow, ids, ni);
    if (rc) printf("# ktok_encode failed\n");
    return rc;
}

/* Encoding of text without the 400k/25k cuts and without specials: regex pieces, each BPE'd. */
static int32_t *encode_nocut(const ktok *t, const char *s, size_t n, size_t *nout)
{
    size_t *ends, np;
    if (ktok_split(t, s, n, &ends, &np)) die_oom();
    sbuf b = {0};
    size_t st = 0;
    for (size_t i = 0; i < np; i++) {
        int32_t *ids;
        size_t ni;
        if (ktok_encode_piece(t, (const uint8_t *)s + st, ends[i] - st, &ids, &ni)) die_oom();
        sb_add(&b, ids, ni * sizeof *ids);
        free(ids);
        st = ends[i];
    }
    free(ends);
    *nout = b.n / sizeof(int32_t);
    return (int32_t *)b.p;
}

/* ------------------------------------------------------------------------------------------ */
/* synthetic vocabularies                                                                     */

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static void b64line(sbuf *b, const uint8_t *p, size_t n, long rank)
{
    for (size_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)p[i] << 16;
        if (i + 1 < n) w |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n) w |= p[i + 2];
        char q[4] = {B64[(w >> 18) & 63], B64[(w >> 12) & 63], i + 1 < n ? B64[(w >> 6) & 63] : '=',
                     i + 2 < n ? B64[w & 63] : '='};
        sb_add(b, q, 4);
    }
    char r[32];
    snprintf(r, sizeof r, " %ld\n", rank);
    sb_str(b, r);
}

/* 256 single bytes in byte order (rank = byte), then the given merged strings. */
static sbuf synth_rankfile(const char *const *merges, size_t nm)
{
    sbuf b = {0};
    for (int i = 0; i < 256; i++) {
        uint8_t c = (uint8_t)i;
        b64line(&b, &c, 1, i);
    }
    for (size_t i = 0; i < nm; i++) b64line(&b, (const uint8_t *)merges[i], strlen(merges[i]), (long)(256 + i));
    return b;
}

/* tiktoken's reference merge loop (O(n^2)): repeatedly merge the lowest-rank adjacent pair,
 * leftmost on ties. */
static size_t naive_bpe(const ktok *t, const uint8_t *p, size_t n, int32_t *out)
{
    int32_t w = ktok_rank_of(t, p, n);
    if (w >= 0) { out[0] = w; return 1; }
    size_t *st = malloc((n + 1) * sizeof *st);
    if (!st) die_oom();
    size_t m = n;
    for (size_t i = 0; i <= n; i++) st[i] = i;       /* part k = [st[k], st[k+1]) */
    for (;;) {
        int32_t best = -1;
        size_t bi = 0;
        for (size_t k = 0; k + 1 < m; k++) {
            int32_t r = ktok_rank_of(t, p + st[k], st[k + 2] - st[k]);
            if (r >= 0 && (best < 0 || r < best)) { best = r; bi = k; }
        }
        if (best < 0) break;
        memmove(st + bi + 1, st + bi + 2, (m - bi - 1) * sizeof *st);
        m--;
    }
    for (size_t k = 0; k < m; k++) out[k] = ktok_rank_of(t, p + st[k], st[k + 1] - st[k]);
    free(st);
    return m;
}

static void test_synthetic(void)
{
    static const char *const merges[] = {"ab", "bc", "abc", "aa", "aaa", " a", "He", "ll", "llo", "Hello", " w", "or", " wor", "ld", " world"};
    sbuf rf = synth_rankfile(merges, sizeof merges / sizeof merges[0]);
    krun_err ke = {0, ""};
    char *err = ke.msg;
    ktok *t = ktok_load(rf.p, rf.n, NULL, 0, &ke);
    CHECK(t != NULL, "synthetic: 256 bytes + 15 merges, no specials, loads (%s)", t ? "ok" : err);
    if (!t) { free(rf.p); return; }
    CHECK(ktok_n_ranks(t) == 271 && ktok_vocab_size(t) == 271, "synthetic: n_ranks 271, vocab_size 271");

    struct { const char *piece; int32_t want[4]; size_t nw; } bp[] = {
        {"abc", {258}, 1},              /* whole piece is a rank */
        {"abcd", {258, 'd'}, 2},        /* ab(256) first, then ab+c = abc(258) */
        {"bcab", {257, 256}, 2},        /* lowest rank first: ab(256) before bc(257) */
        {"aaaa", {259, 259}, 2},        /* ties: leftmost aa first */
        {"aaaaa", {259, 260}, 2},       /* aa|a|a|a -> aa|aa|a (leftmost of the aa ties) -> aa|aaa */
        {"x", {'x'}, 1},
        {"\xff\x00", {0xFF, 0}, 2},
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof bp / sizeof bp[0]; i++) {
        int32_t *ids;
        size_t n;
        size_t pl = strlen(bp[i].piece) + (bp[i].piece[0] == '\xff');
        if (ktok_encode_piece(t, (const uint8_t *)bp[i].piece, pl, &ids, &n)) die_oom();
        if (!ids_eq(ids, n, bp[i].want, bp[i].nw)) { ok = 0; printf("# synthetic bpe \"%s\": %zu ids\n", bp[i].piece, n); }
        free(ids);
    }
    CHECK(ok, "synthetic: rank-BPE hand-worked cases (lowest rank first, leftmost on ties)");

    /* heap BPE == tiktoken's quadratic loop on random pieces, short and long */
    ok = 1;
    size_t cases = 0;
    int32_t *a = malloc(5000 * sizeof *a), *bq = malloc(5000 * sizeof *bq);
    uint8_t *pc = malloc(5000);
    if (!a || !bq || !pc) die_oom();
    for (int it = 0; it < 3000; it++) {
        size_t n = it < 2900 ? 1 + rndn(24) : 1000 + rndn(4000);
        static const char alpha[] = "aabcc dHelowr";
        for (size_t i = 0; i < n; i++) pc[i] = (uint8_t)alpha[rndn(sizeof alpha - 1)];
        size_t nb = naive_bpe(t, pc, n, bq);
        int32_t *ids;
        size_t ni;
        if (ktok_encode_piece(t, pc, n, &ids, &ni)) die_oom();
        if (!ids_eq(ids, ni, bq, nb)) {
            if (ok) printf("# heap vs naive BPE differ on a %zu-byte piece\n", n);
            ok = 0;
        }
        free(ids);
        cases++;
    }
    free(a); free(bq); free(pc);
    CHECK(ok, "synthetic: heap BPE equals the naive tiktoken merge loop on %zu random pieces", cases);

    const char *s = "Hello world, it's 12345 aaa!!\n\n  x";
    size_t *ends, np;
    if (ktok_split(t, s, strlen(s), &ends, &np)) die_oom();
    static const char *const want_p[] = {"Hello", " world", ",", " it's", " ", "123", "45", " aaa", "!!\n\n", " ", " x"};
    ok = np == sizeof want_p / sizeof want_p[0];
    for (size_t i = 0, st = 0; ok && i < np; st = ends[i], i++)
        ok = ends[i] - st == strlen(want_p[i]) && memcmp(s + st, want_p[i], ends[i] - st) == 0;
    free(ends);
    CHECK(ok, "synthetic: regex split of \"Hello world, it's 12345 aaa!!\\n\\n  x\" (%zu pieces)", np);

    int32_t *ids;
    size_t n;
    if (enc(t, s, strlen(s), 1, &ids, &n) == 0) {
        CHECK(n >= 2 && ids[0] == 256 + 9 && ids[1] == 256 + 14 && roundtrips(t, ids, n, s, strlen(s)),
              "synthetic: encode uses the merges (Hello, \" world\") and decodes back");
        free(ids);
    }
    const char bad[] = "\xff\xfe" "abc \xc3 \xe2\x82" "x\xed\xa0\x80";
    if (enc(t, bad, sizeof bad - 1, 1, &ids, &n) == 0) {
        CHECK(roundtrips(t, ids, n, bad, sizeof bad - 1), "synthetic: invalid UTF-8 input is kept byte-exact");
        free(ids);
    }
    if (enc(t, "", 0, 1, &ids, &n) == 0) {
        CHECK(n == 0 && ids == NULL, "synthetic: empty text -> no ids");
        free(ids);
    }

    /* the 25,000-code-point run cut */
    sbuf x = {0};
    sb_rep(&x, "a", 60000);
    int32_t *w1, *w2, *w3;
    size_t n1, n2, n3;
    ok = 0;
    if (enc(t, x.p, x.n, 1, &ids, &n) == 0 && enc(t, x.p, 25000, 1, &w1, &n1) == 0 && enc(t, x.p, 10000, 1, &w3, &n3) == 0) {
        ok = n == 2 * n1 + n3 && ids_eq(ids, n1, w1, n1) && ids_eq(ids + n1, n1, w1, n1) && ids_eq(ids + 2 * n1, n3, w3, n3);
        free(ids); free(w1); free(w3);
    }
    CHECK(ok, "synthetic: 60,000 letters are encoded as 25,000 + 25,000 + 10,000");
    x.n = 0;
    sb_str(&x, "x");
    sb_rep(&x, " ", 25001);
    ok = 0;
    if (enc(t, x.p, x.n, 1, &ids, &n) == 0 && enc(t, x.p, x.n - 1, 1, &w1, &n1) == 0) {
        ok = n == n1 + 1 && ids_eq(ids, n1, w1, n1) && ids[n1] == ' ';
        free(ids); free(w1);
    }
    CHECK(ok, "synthetic: \"x\" + 25,001 spaces -> cut before the last space");

    /* the 400,000-code-point slice cut: "a a a ..." has no long runs, and " a" is a token */
    x.n = 0;
    sb_rep(&x, "a ", 200500);
    ok = 0;
    if (enc(t, x.p, x.n, 1, &ids, &n) == 0 && enc(t, x.p, 400000, 1, &w1, &n1) == 0 &&
        enc(t, x.p + 400000, x.n - 400000, 1, &w2, &n2) == 0) {
        size_t nn;
        w3 = encode_nocut(t, x.p, x.n, &nn);
        ok = n == n1 + n2 && ids_eq(ids, n1, w1, n1) && ids_eq(ids + n1, n2, w2, n2) && nn == n - 1 &&
             roundtrips(t, ids, n, x.p, x.n);
        free(ids); free(w1); free(w2); free(w3);
    }
    CHECK(ok, "synthetic: 401,000 code points are encoded as slices of 400,000 + 1,000 (one id more than uncut)");
    /* long pieces: the JIT needs its own stack for these; the interpreter must agree */
    static const char *const units[] = {"y", "\xc3\xa9", "a\xcc\x81", "AB", "\xe4\xb8\x96", "\xf0\x9f\x98\x80", "!", " ", "7"};
    static const size_t want_np[] = {1, 1, 1, 1, 1, 1, 1, 2, 16667};
    ok = 1;
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        x.n = 0;
        sb_rep(&x, units[u], 50000 / (strlen(units[u]) > 3 ? 2 : 1));
        if (units[u][0] == ' ') sb_str(&x, "x");
        size_t *e1, *e2, n1p, n2p;
        int jit = ktok_uses_jit(t);
        if (ktok_split(t, x.p, x.n, &e1, &n1p)) die_oom();
        ktok_set_jit(t, 0);
        if (ktok_split(t, x.p, x.n, &e2, &n2p)) die_oom();
        ktok_set_jit(t, jit);
        int same = n1p == n2p && memcmp(e1, e2, n1p * sizeof *e1) == 0;
        if (!same || n1p != want_np[u]) {
            ok = 0;
            printf("# long piece of \"%s\": JIT %zu pieces, interpreter %zu, want %zu\n", units[u], n1p, n2p, want_np[u]);
        }
        free(e1);
        free(e2);
    }
    CHECK(ok, "regex on 25,000-50,000-code-point pieces: JIT (%s) and interpreter agree, expected piece counts",
          ktok_uses_jit(t) ? "on" : "unavailable");
    free(x.p);
    ktok_free(t);

    /* a handful of specials, one a prefix of another: longest match at the earliest position */
    ktok_special sp[] = {{300, "<s>"}, {301, "<ss>"}, {302, "<|x|>"}, {271, "é"}};
    t = ktok_load(rf.p, rf.n, sp, 4, &ke);
    CHECK(t != NULL, "synthetic: loads with 4 specials (%s)", t ? "ok" : err);
    if (t) {
        CHECK(ktok_vocab_size(t) == 303 && ktok_find_special(t, "<ss>") == 301 && ktok_find_special(t, "<s") == -1 &&
              ktok_is_special(t, 271) && !ktok_is_special(t, 270),
              "synthetic: vocab_size 303, find_special, is_special");
        size_t l;
        const uint8_t *p = ktok_id_bytes(t, 302, &l);
        CHECK(p && l == 5 && memcmp(p, "<|x|>", 5) == 0, "synthetic: special id decodes to its literal text");
        CHECK(!ktok_id_bytes(t, 290, &l) && !ktok_id_bytes(t, -1, &l) && !ktok_id_bytes(t, 303, &l),
              "synthetic: unknown ids (gap, negative, past the end) -> NULL");
        const char *q = "x<ss><s>é<s<|x|>y";
        if (enc(t, q, strlen(q), 1, &ids, &n) == 0) {
            int32_t want[] = {'x', 301, 300, 271, '<', 's', 302, 'y'};
            CHECK(ids_eq(ids, n, want, 8), "synthetic: specials matched, longest first (%zu ids)", n);
            free(ids);
        }
        if (enc(t, q, strlen(q), 0, &ids, &n) == 0) {
            int ns = 0;
            for (size_t i = 0; i < n; i++) ns += ids[i] >= 271;
            CHECK(ns == 0 && roundtrips(t, ids, n, q, strlen(q)), "synthetic: allow_special=0 encodes special text as bytes");
            free(ids);
        }
        int32_t dec[] = {'a', 999, 302, 'b'};
        uint8_t *o;
        size_t ol;
        long sk = ktok_decode(t, dec, 4, &o, &ol);
        CHECK(sk == 1 && ol == 7 && memcmp(o, "a<|x|>b", 7) == 0, "synthetic: ktok_decode skips an unknown id");
        if (sk >= 0) free(o);
        ktok_free(t);
    }
    free(rf.p);
}

/* ------------------------------------------------------------------------------------------ */
/* bad input                                                                                  */

static void expect_load_error(const char *what, const char *file, size_t len, const ktok_special *sp, size_t nsp,
                              const char *needle1, const char *needle2)
{
    krun_err ke = {0, ""};
    char *err = ke.msg;
    ktok *t = ktok_load(file, len, sp, nsp, &ke);
    int ok = t == NULL && strstr(err, needle1) && (!needle2 || strstr(err, needle2));
    CHECK(ok, "bad input: %s -> \"%s\"", what, err);
    ktok_free(t);
}

static void test_bad_input(void)
{
    static const char *const merges[] = {"ab", "bc", "abc"};
    sbuf base = synth_rankfile(merges, 3);       /* 259 lines */
    sbuf b = {0};
    /* bad base64 on line 17 */
    sb_add(&b, base.p, base.n);
    char *l17 = b.p;
    for (int i = 0; i < 16; i++) l17 = strchr(l17, '\n') + 1;
    l17[0] = '*';
    expect_load_error("bad base64", b.p, b.n, NULL, 0, "line 17", "bad base64");
    /* base64 without padding */
    b.n = 0;
    sb_add(&b, base.p, base.n);
    sb_str(&b, "eHl6 259\nYWI 260\n");
    expect_load_error("base64 missing '=' padding", b.p, b.n, NULL, 0, "line 261", "bad base64");
    /* duplicate rank */
    b.n = 0;
    sb_add(&b, base.p, base.n);
    sb_str(&b, "eHl6 5\n");
    expect_load_error("duplicate rank", b.p, b.n, NULL, 0, "line 260", "duplicate rank 5");
    /* missing rank: 258 is skipped, the last line has 259 */
    b.n = 0;
    sb_add(&b, base.p, base.n);
    sb_str(&b, "eHl6 260\n");
    char *l259 = b.p;
    for (int i = 0; i < 258; i++) l259 = strchr(l259, '\n') + 1;
    memcpy(l259, "YWJj 259", 8);      /* "abc" 258 -> 259 */
    expect_load_error("missing rank", b.p, b.n, NULL, 0, "rank 258 missing", NULL);
    /* duplicate bytes */
    b.n = 0;
    sb_add(&b, base.p, base.n);
    sb_str(&b, "YWI= 259\n");
    expect_load_error("duplicate token bytes", b.p, b.n, NULL, 0, "line 260", "same token bytes");
    /* bad rank field */
    b.n = 0;
    sb_add(&b, base.p, base.n);
    sb_str(&b, "eHl6 -1\n");
    expect_load_error("negative rank", b.p, b.n, NULL, 0, "line 260", "bad rank");
    b.n = 0;
    sb_add(&b, base.p, base.n);
    sb_str(&b, "eHl6\n");
    expect_load_error("line without rank", b.p, b.n, NULL, 0, "line 260", "expected");
    /* a byte without a rank: drop line 1 (byte 0x00) and renumber nothing -> rank 0 missing */
    const char *from2 = strchr(base.p, '\n') + 1;
    expect_load_error("first line (byte 0x00, rank 0) removed", from2, base.n - (size_t)(from2 - base.p), NULL, 0,
                      "rank 0 missing", NULL);
    b.n = 0;
    sb_add(&b, base.p, base.n);
    memcpy(b.p, "eHl6", 4);           /* rank 0 is "xyz" instead of byte 0x00 */
    expect_load_error("byte 0x00 has no rank", b.p, b.n, NULL, 0, "byte 0x00", NULL);
    expect_load_error("empty rank file", "", 0, NULL, 0, "no entries", NULL);
    expect_load_error("garbage rank file", "hello world\n", 12, NULL, 0, "line 1", NULL);
    /* specials */
    ktok_special s1[] = {{100, "<x>"}};
    expect_load_error("special id colliding with a rank", base.p, base.n, s1, 1, "collides", NULL);
    ktok_special s2[] = {{300, "<x>"}, {301, "<x>"}};
    expect_load_error("two specials with the same text", base.p, base.n, s2, 2, "same text", NULL);
    ktok_special s3[] = {{300, "<x>"}, {300, "<y>"}};
    expect_load_error("two specials with the same id", base.p, base.n, s3, 2, "given twice", NULL);
    ktok_special s4[] = {{300, ""}};
    expect_load_error("empty special text", base.p, base.n, s4, 1, "empty", NULL);
    /* CRLF and blank lines are accepted */
    b.n = 0;
    for (size_t i = 0; i < base.n; i++) {
        if (base.p[i] == '\n') sb_str(&b, "\r\n\n");
        else sb_add(&b, base.p + i, 1);
    }
    krun_err ke = {0, ""};
    ktok *t = ktok_load(b.p, b.n, NULL, 0, &ke);
    CHECK(t && ktok_n_ranks(t) == 259, "rank file with CRLF line ends and blank lines loads");
    ktok_free(t);
    free(b.p);
    free(base.p);
}

/* ------------------------------------------------------------------------------------------ */
/* UTF-8 streaming                                                                            */

static void test_utf8_complete(void)
{
    struct { const char *s; size_t len, want; } c[] = {
        {"", 0, 0},
        {"abc", 3, 3},
        {"a\xc3", 2, 1},                      /* é split after the lead byte */
        {"a\xc3\xa9", 3, 3},
        {"\xe4\xbd", 2, 0},                   /* 你 split after 2 of 3 */
        {"\xe4", 1, 0},
        {"x\xe4\xbd\xa0", 4, 4},
        {"\xf0\x9f\x98", 3, 0},               /* 😀 split after 3 of 4 */
        {"\xf0\x9f", 2, 0},
        {"\xf0", 1, 0},
        {"ab\xf0\x9f\x98\x80", 6, 6},
        {"\x80", 1, 1},                       /* stray continuation: passed through */
        {"a\x80\x80\x80\x80", 5, 5},
        {"\xff", 1, 1},                       /* invalid lead */
        {"\xc0", 1, 1},                       /* overlong lead */
        {"\xf5\x80", 2, 2},
        {"\xe0\x80", 2, 2},                   /* overlong: never completes */
        {"\xed\xa0", 2, 2},                   /* surrogate */
        {"\xf4\x90", 2, 2},                   /* > U+10FFFF */
        {"\xf0\x8f", 2, 2},                   /* overlong 4-byte */
        {"\xe0\xa0", 2, 0},                   /* valid prefix of U+0800 */
        {"\xc3\xa9\xc3", 3, 2},
        {"\xe4\xbd\xa0\xa0", 4, 4},           /* excess continuation */
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        size_t got = ktok_utf8_complete((const uint8_t *)c[i].s, c[i].len);
        if (got != c[i].want) { ok = 0; printf("# utf8_complete case %zu: got %zu want %zu\n", i, got, c[i].want); }
    }
    CHECK(ok, "ktok_utf8_complete: split 2/3/4-byte sequences held back, invalid bytes passed through (%zu cases)",
          sizeof c / sizeof c[0]);

    /* streaming a byte-split multibyte text reassembles it exactly */
    const char *s = "héllo 你好 😀 ok";
    size_t n = strlen(s), held = 0, emitted = 0;
    uint8_t buf[16];
    sbuf out = {0};
    ok = 1;
    for (size_t i = 0; i < n; i++) {
        buf[held++] = (uint8_t)s[i];
        size_t k = ktok_utf8_complete(buf, held);
        sb_add(&out, buf, k);
        emitted += k;
        memmove(buf, buf + k, held - k);
        held -= k;
        if (held > 3) ok = 0;
    }
    ok = ok && held == 0 && out.n == n && memcmp(out.p, s, n) == 0 && emitted == n;
    free(out.p);
    CHECK(ok, "ktok_utf8_complete: byte-by-byte streaming of mixed text emits only whole characters");
}

/* ------------------------------------------------------------------------------------------ */
/* special tables                                                                             */

static void test_special_tables(void)
{
    ktok_special *k3, *k2;
    size_t n3, n2;
    int r3 = ktok_specials_builtin("k3", &k3, &n3), r2 = ktok_specials_builtin("k2", &k2, &n2);
    CHECK(r3 == 0 && r2 == 0 && n3 == 256 && n2 == 256, "builtin special tables: k3 and k2 have 256 entries");
    if (r3 || r2) return;
    int ok = 1;
    for (size_t i = 0; i < 256; i++) ok &= k3[i].id == 163584 + (int32_t)i && k2[i].id == 163584 + (int32_t)i;
    ok &= strcmp(k3[2].text, "<|end_of_msg|>") == 0 && strcmp(k2[2].text, "<|im_end|>") == 0 &&
          strcmp(k3[5].text, "<|sep|>") == 0 && strcmp(k2[5].text, "<|reserved_token_163589|>") == 0 &&
          strcmp(k3[65].text, "<osagent_mode>") == 0 && strcmp(k2[22].text, "<think>") == 0 &&
          strcmp(k3[22].text, "<|reserved_token_163606|>") == 0 && strcmp(k3[255].text, "[PAD]") == 0 &&
          strcmp(k2[254].text, "[UNK]") == 0 && strcmp(k3[8].text, "<|reserved_token_163592|>") == 0;
    CHECK(ok, "builtin special tables: ids 163584..163839 in order, names per README section 4");
    /* tiktoken matches specials with a regex alternation built from a hash set (order unspecified);
     * we take the longest match.  The two agree as long as no special is a prefix of another. */
    int prefix = 0;
    for (int f = 0; f < 2; f++) {
        const ktok_special *tab = f ? k2 : k3;
        for (size_t i = 0; i < 256; i++)
            for (size_t j = 0; j < 256; j++)
                if (i != j && strncmp(tab[i].text, tab[j].text, strlen(tab[i].text)) == 0) {
                    prefix++;
                    printf("# %s: \"%s\" is a prefix of \"%s\"\n", f ? "k2" : "k3", tab[i].text, tab[j].text);
                }
    }
    CHECK(prefix == 0, "builtin special tables: no special text is a prefix of another (match order cannot matter)");
    ktok_special *x;
    size_t nx;
    CHECK(ktok_specials_builtin("k4", &x, &nx) == -1, "builtin special tables: unknown family rejected");

    const char *cfg =
        "{\"add_bos_token\": false, \"added_tokens_decoder\": {"
        " \"163586\": {\"content\": \"<|end_of_msg|>\", \"lstrip\": false, \"special\": true},"
        " \"163584\": {\"content\": \"[BOS]\", \"special\": true},"
        " \"163649\": {\"content\": \"<osagent_mode>\", \"special\": true}},"
        " \"tokenizer_class\": \"TikTokenTokenizer\"}";
    krun_err ke = {0, ""};
    char *err = ke.msg;
    ktok_special *c;
    size_t nc;
    int rc = ktok_specials_from_config(cfg, strlen(cfg), &c, &nc, &ke);
    CHECK(rc == 0 && nc == 3 && c[0].id == 163584 && strcmp(c[0].text, "[BOS]") == 0 && c[1].id == 163586 &&
          strcmp(c[2].text, "<osagent_mode>") == 0,
          "tokenizer_config.json: added_tokens_decoder parsed, ids from the keys, sorted (%s)", rc ? err : "ok");
    if (rc == 0) {
        rc = ktok_specials_fill_reserved(&c, &nc, 163584, 256);
        ok = rc == 0 && nc == 256;
        for (size_t i = 0; ok && i < 256; i++) ok = c[i].id == k3[i].id;
        ok = ok && strcmp(c[2].text, "<|end_of_msg|>") == 0 && strcmp(c[3].text, "<|reserved_token_163587|>") == 0;
        CHECK(ok, "ktok_specials_fill_reserved: 3 named + 253 <|reserved_token_{id}|> = 256");
        ktok_specials_free(c, nc);
    }
    const char *bad[] = {
        "{\"added_tokens_decoder\": {\"abc\": {\"content\": \"x\"}}}",
        "{\"added_tokens_decoder\": {\"5\": {\"lstrip\": true}}}",
        "{\"added_tokens_decoder\": {\"5\": {\"content\": \"x\"}, \"5\": {\"content\": \"y\"}}}",
        "{\"tokenizer_class\": \"x\"}",
        "{\"added_tokens_decoder\": {",
        "[1,2]",
    };
    const char *why[] = {"not a token id", "content", "duplicate", "added_tokens_decoder", "line", "added_tokens_decoder"};
    ok = 1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        rc = ktok_specials_from_config(bad[i], strlen(bad[i]), &c, &nc, &ke);
        if (rc != -1 || !strstr(err, why[i])) { ok = 0; printf("# config case %zu: rc %d err \"%s\"\n", i, rc, err); }
        if (rc == 0) ktok_specials_free(c, nc);
    }
    CHECK(ok, "tokenizer_config.json: bad key, missing content, duplicate key, missing table, bad JSON -> errors");
    ktok_specials_free(k3, n3);
    ktok_specials_free(k2, n2);
}

/* ------------------------------------------------------------------------------------------ */
/* the post-Unicode-14 table (tokenizer_ucd.h), checked range by range without the rank file  */

/* The ranges of one KTOK_UCD_NEW_* class body ("\x{HEX}" items and "\x{HEX}-\x{HEX}" ranges). */
static size_t ucd_ranges(const char *body, uint32_t (*r)[2], size_t cap)
{
    size_t n = 0;
    for (const char *p = body; (p = strstr(p, "\\x{")) != NULL && n < cap;) {
        char *e;
        uint32_t a = (uint32_t)strtoul(p + 3, &e, 16), b = a;
        p = e + 1;
        if (strncmp(p, "-\\x{", 4) == 0) { b = (uint32_t)strtoul(p + 4, &e, 16); p = e + 1; }
        r[n][0] = a;
        r[n][1] = b;
        n++;
    }
    return n;
}

static int in_ranges(uint32_t c, uint32_t (*r)[2], size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (c >= r[i][0] && c <= r[i][1]) return 1;
    return 0;
}

/* Pieces of s as a "|"-joined string. */
static void split_str(const ktok *t, const char *s, size_t n, sbuf *out)
{
    size_t *ends, k;
    out->n = 0;
    if (ktok_split(t, s, n, &ends, &k)) die_oom();
    for (size_t i = 0, st = 0; i < k; st = ends[i], i++) {
        if (i) sb_str(out, "|");
        sb_add(out, s + st, ends[i] - st);
    }
    if (!out->p) sb_str(out, "");
    free(ends);
}

static void test_ucd_table(void)
{
    sbuf rf = synth_rankfile(NULL, 0);
    krun_err ke = {0, ""};
    char *err = ke.msg;
    ktok *t = ktok_load(rf.p, rf.n, NULL, 0, &ke);
    free(rf.p);
    if (!t) { CHECK(0, "byte-level tokenizer for the table checks (%s)", err); return; }
    static uint32_t han[64][2], let[256][2], num[64][2], up[256][2], lo[256][2];
    size_t nh = ucd_ranges(KTOK_UCD_NEW_HAN, han, 64), nl = ucd_ranges(KTOK_UCD_NEW_L, let, 256),
           nn = ucd_ranges(KTOK_UCD_NEW_N, num, 64), nu = ucd_ranges(KTOK_UCD_NEW_UPPERISH, up, 256),
           nw = ucd_ranges(KTOK_UCD_NEW_LOWERISH, lo, 256);
    CHECK(nh >= 3 && nl >= 30 && nn >= 10 && nu >= 40 && nw >= 40 && in_ranges(0x138ED, let, nl) &&
          in_ranges(0x313CE, han, nh) && in_ranges(0x2EDC7, han, nh),
          "tokenizer_ucd.h (Unicode %s): %zu Han, %zu letter, %zu number, %zu + %zu letter-class ranges, with U+138ED, "
          "U+313CE, U+2EDC7", KTOK_UCD_VERSION, nh, nl, nn, nu, nw);
    /* every range starts and ends at a code point PCRE2 10.42 has as unassigned: the table only adds */
    int pe;
    PCRE2_SIZE eo;
    pcre2_code *cn = pcre2_compile((PCRE2_SPTR) "^\\p{Cn}$", PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &pe, &eo, NULL);
    pcre2_match_data *md = cn ? pcre2_match_data_create_from_pattern(cn, NULL) : NULL;
    if (!md) die_oom();
    int cn_ok = 1, han_ok = 1, let_ok = 1, num_ok = 1;
    sbuf s = {0}, got = {0}, want = {0};
    uint32_t (*lists[])[2] = {han, let, num, up, lo};
    size_t counts[] = {nh, nl, nn, nu, nw};
    for (int li = 0; li < 5; li++)
        for (size_t i = 0; i < counts[li]; i++)
            for (int end = 0; end < 2; end++) {
                uint32_t c = lists[li][i][end];
                s.n = 0;
                sb_cp(&s, c);
                if (pcre2_match(cn, (PCRE2_SPTR)s.p, s.n, 0, 0, md, NULL) < 0) {
                    cn_ok = 0;
                    printf("# U+%04X is in the table but PCRE2 already classifies it\n", (unsigned)c);
                }
                /* what the class means to the pattern: Han runs split off ("a", "HH", "'s"); a new
                 * letter or mark takes a contraction ("X's"); digits group by three */
                sbuf cp = {0};
                sb_cp(&cp, c);
                if (li == 0) {
                    s.n = 0; sb_str(&s, "a"); sb_str(&s, cp.p); sb_str(&s, cp.p); sb_str(&s, "'s");
                    want.n = 0; sb_str(&want, "a|"); sb_str(&want, cp.p); sb_str(&want, cp.p); sb_str(&want, "|'s");
                    split_str(t, s.p, s.n, &got);
                    if (strcmp(got.p, want.p)) { han_ok = 0; printf("# new Han U+%04X: split %s\n", (unsigned)c, got.p); }
                } else if (li != 2 && !in_ranges(c, han, nh)) {
                    s.n = 0; sb_str(&s, "!"); sb_str(&s, cp.p); sb_str(&s, "'s");
                    split_str(t, s.p, s.n, &got);
                    if (strcmp(got.p, s.p)) { let_ok = 0; printf("# new letter/mark U+%04X: split %s\n", (unsigned)c, got.p); }
                } else if (li == 2) {
                    s.n = 0; sb_rep(&s, cp.p, 4);
                    want.n = 0; sb_rep(&want, cp.p, 3); sb_str(&want, "|"); sb_str(&want, cp.p);
                    split_str(t, s.p, s.n, &got);
                    if (strcmp(got.p, want.p)) { num_ok = 0; printf("# new number U+%04X: split %s\n", (unsigned)c, got.p); }
                }
                free(cp.p);
            }
    CHECK(cn_ok, "tokenizer_ucd.h: every range's ends are unassigned in PCRE2's own tables (the table only adds)");
    CHECK(han_ok, "new Han (CJK Ext H, Ext I, ...): \"aHH's\" splits as a|HH|'s at every range end");
    CHECK(let_ok, "new letters and marks: \"!X's\" is one piece (prefix, letter class, contraction) at every range end");
    CHECK(num_ok, "new numbers: four digits split as three and one at every range end");
    free(s.p);
    free(got.p);
    free(want.p);
    pcre2_match_data_free(md);
    pcre2_code_free(cn);
    ktok_free(t);
}

/* ------------------------------------------------------------------------------------------ */
/* the real rank file and the oracle vectors                                                  */

static pcre2_code *g_cn;     /* \p{Cn} under PCRE2's Unicode tables: "unassigned in Unicode 14" */

static int has_post14(const char *s, size_t n)
{
    if (!g_cn) return 0;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(g_cn, NULL);
    if (!md) die_oom();
    int rc = pcre2_match(g_cn, (PCRE2_SPTR)s, n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0;
}

typedef struct { char name[16]; int total, pass, fail, u14; } kstat;

static kstat *kind_stat(kstat *ks, int *nk, const char *kind)
{
    for (int i = 0; i < *nk; i++)
        if (strcmp(ks[i].name, kind) == 0) return &ks[i];
    if (*nk == 16) return &ks[15];
    kstat *k = &ks[(*nk)++];
    memset(k, 0, sizeof *k);
    snprintf(k->name, sizeof k->name, "%s", kind);
    return k;
}

static void test_vectors(ktok *k2, ktok *k3, const char *path, const char *label)
{
    char *buf;
    size_t len;
    if (read_whole(path, &buf, &len)) { SKIP("kimi_vectors.jsonl (%s): cannot read %s", label, path); return; }
    kstat ks[16];
    int nk = 0, lines = 0, bad_lines = 0, rt_bad = 0;
    char esc[200];
    for (char *p = buf, *e; p < buf + len; p = e + 1) {
        e = memchr(p, '\n', (size_t)(buf + len - p));
        if (!e) e = buf + len;
        if (e == p) continue;
        lines++;
        json_error_t je;
        json_t *o = json_loadb(p, (size_t)(e - p), 0, &je);
        json_t *jf = json_object_get(o, "family"), *jk = json_object_get(o, "kind"), *jt = json_object_get(o, "text"),
               *ji = json_object_get(o, "ids");
        if (!o || !json_is_string(jf) || !json_is_string(jk) || !json_is_string(jt) || !json_is_array(ji)) {
            bad_lines++;
            json_decref(o);
            continue;
        }
        const char *fam = json_string_value(jf), *text = json_string_value(jt);
        size_t tl = json_string_length(jt), nw = json_array_size(ji);
        ktok *t = strcmp(fam, "k3") == 0 ? k3 : k2;
        kstat *k = kind_stat(ks, &nk, json_string_value(jk));
        k->total++;
        int32_t *ids;
        size_t n;
        if (ktok_encode(t, text, tl, 1, &ids, &n)) die_oom();
        size_t d = 0;
        while (d < n && d < nw && ids[d] == (int32_t)json_integer_value(json_array_get(ji, d))) d++;
        if (d == n && d == nw) {
            k->pass++;
        } else {
            int u14 = has_post14(text, tl);
            if (u14) k->u14++;
            else k->fail++;
            escape(text, tl, esc, sizeof esc);
            printf("# %s %s %s vector %d \"%s\": first difference at id index %zu: got %ld, want %ld (%zu vs %zu ids)%s\n",
                   label, fam, k->name, lines, esc, d, d < n ? (long)ids[d] : -1L,
                   d < nw ? (long)json_integer_value(json_array_get(ji, d)) : -1L, n, nw,
                   u14 ? " [contains code points unassigned in PCRE2's Unicode 14 tables]" : "");
        }
        if (!roundtrips(t, ids, n, text, tl)) rt_bad++;
        free(ids);
        json_decref(o);
    }
    free(buf);
    CHECK(bad_lines == 0 && lines == 1110, "kimi_vectors.jsonl (%s): %d vectors read (%d unparsable)", label, lines, bad_lines);
    int u14 = 0;
    for (int i = 0; i < nk; i++) {
        u14 += ks[i].u14;
        CHECK(ks[i].fail == 0, "kimi_vectors.jsonl (%s) kind=%s: %d/%d exact%s", label, ks[i].name, ks[i].pass, ks[i].total,
              ks[i].u14 ? " (plus Unicode-14 differences, see below)" : "");
    }
    if (u14)
        printf("# kimi_vectors.jsonl (%s): %d vector(s) differ only where the text has code points that PCRE2 10.42's "
               "Unicode 14 tables do not know (the oracle uses Unicode 16; README section 7); not counted as failures\n",
               label, u14);
    CHECK(rt_bad == 0, "kimi_vectors.jsonl (%s): decode(encode(text)) == text for every vector (%d differ)", label, rt_bad);
}

static void test_presplit(ktok *t, const char *path, const char *label)
{
    char *buf;
    size_t len;
    if (read_whole(path, &buf, &len)) { SKIP("kimi_presplit.jsonl (%s): cannot read %s", label, path); return; }
    kstat ks[16];
    int nk = 0, lines = 0, bad_lines = 0, flagged = 0, flagged_match = 0;
    char esc[200];
    for (char *p = buf, *e; p < buf + len; p = e + 1) {
        e = memchr(p, '\n', (size_t)(buf + len - p));
        if (!e) e = buf + len;
        if (e == p) continue;
        lines++;
        json_error_t je;
        json_t *o = json_loadb(p, (size_t)(e - p), 0, &je);
        json_t *jk = json_object_get(o, "kind"), *jt = json_object_get(o, "text"), *jp = json_object_get(o, "pieces"),
               *ju = json_object_get(o, "needs_unicode_15");
        if (!o || !json_is_string(jk) || !json_is_string(jt) || !json_is_array(jp)) {
            bad_lines++;
            json_decref(o);
            continue;
        }
        const char *text = json_string_value(jt);
        size_t tl = json_string_length(jt), nw = json_array_size(jp);
        size_t *ends, n;
        if (ktok_split(t, text, tl, &ends, &n)) die_oom();
        size_t d = 0, st = 0;
        for (; d < n && d < nw; st = ends[d], d++) {
            json_t *pw = json_array_get(jp, d);
            if (!json_is_string(pw) || json_string_length(pw) != ends[d] - st || memcmp(json_string_value(pw), text + st, ends[d] - st))
                break;
        }
        int match = d == n && d == nw;
        if (json_is_true(ju)) {
            /* needs the post-14.0 table of tokenizer_ucd.h: compared like every other vector */
            flagged++;
            flagged_match += match;
            escape(text, tl, esc, sizeof esc);
            if (!match) printf("# %s presplit vector %d \"%s\" (needs_unicode_15) differs\n", label, lines, esc);
        } else {
            kstat *k = kind_stat(ks, &nk, json_string_value(jk));
            k->total++;
            if (match) k->pass++;
            else {
                k->fail++;
                escape(text, tl, esc, sizeof esc);
                char g[80] = "", w[80] = "";
                if (d < n) escape(text + st, ends[d] - st, g, sizeof g);
                if (d < nw) escape(json_string_value(json_array_get(jp, d)), json_string_length(json_array_get(jp, d)), w, sizeof w);
                printf("# %s presplit %s vector %d \"%s\": first difference at piece %zu: got \"%s\", want \"%s\"%s\n", label,
                       k->name, lines, esc, d, g, w, has_post14(text, tl) ? " [has post-Unicode-14 code points]" : "");
            }
        }
        free(ends);
        json_decref(o);
    }
    free(buf);
    CHECK(bad_lines == 0 && lines == 1048, "kimi_presplit.jsonl (%s): %d vectors read (%d unparsable)", label, lines, bad_lines);
    for (int i = 0; i < nk; i++)
        CHECK(ks[i].fail == 0, "kimi_presplit.jsonl (%s) kind=%s: %d/%d piece lists exact", label, ks[i].name, ks[i].pass, ks[i].total);
    CHECK(flagged >= 1 && flagged_match == flagged, "kimi_presplit.jsonl (%s): %d/%d vector(s) flagged needs_unicode_15 "
          "exact (PCRE2 10.42 has Unicode 14 tables; tokenizer_ucd.h adds Unicode %s's)", label, flagged_match, flagged,
          KTOK_UCD_VERSION);
}

/* Code points assigned after Unicode 14.0 (issue 11: U+138ED, U+313CE, U+2EDC7 and one of each other
 * kind of range: Mn, Nd, Lu, Ll, Han in Ext C, Lo).  Ids from npm tiktoken 1.0.22 over the real rank
 * file with the Kimi pattern (tests/tiktoken/compare.mjs); each of these differed before the
 * tokenizer_ucd.h table (PCRE2 10.42 alone treats the code point as unassigned). */
static void test_post14_vectors(const ktok *t)
{
    static const struct { uint32_t cp; const char *text; int32_t ids[20]; size_t n; } v[] = {
        {0x138ED, "!\xF0\x93\xA3\xAD" "?\xF0\x93\xA3\xAD" "'s",
         {0,172,241,96,255,30,172,241,96,255,1048}, 11},
        {0x138ED, "\xF0\x93\xA3\xAD" "'s",
         {172,241,96,255,1048}, 5},
        {0x313CE, "!\xF0\xB1\x8F\x8E" "?\xF0\xB1\x8F\x8E" "'s",
         {0,172,109,237,236,30,172,109,237,236,1048}, 11},
        {0x313CE, "\xF0\xB1\x8F\x8E" "'s",
         {172,109,237,236,1048}, 5},
        {0x2EDC7, "!\xF0\xAE\xB7\x87" "?\xF0\xAE\xB7\x87" "'s",
         {0,172,106,115,229,30,172,106,115,229,1048}, 11},
        {0x2EDC7, "\xF0\xAE\xB7\x87" "'s",
         {172,106,115,229,1048}, 5},
        {0x897, "!\xE0\xA2\x97" "?\xE0\xA2\x97" "'s",
         {0,156,95,245,30,156,95,245,1048}, 9},
        {0x1E4F0, "!\xF0\x9E\x93\xB0" "?\xF0\x9E\x93\xB0" "'s",
         {0,172,252,241,108,30,172,252,241,108,1048}, 11},
        {0xA7CB, "!\xEA\x9F\x8B" "?\xEA\x9F\x8B" "'s",
         {0,166,253,233,30,166,253,233,1048}, 9},
        {0x1C8A, "\xE1\xB2\x8A" "'s",
         {157,110,232,1048}, 4},
        {0x2B739, "!\xF0\xAB\x9C\xB9" "?\xF0\xAB\x9C\xB9" "'s",
         {0,172,104,250,117,30,172,104,250,117,1048}, 11},
        {0x11F04, "\xF0\x91\xBC\x84" "'s",
         {172,239,120,226,1048}, 5},
        {0x16D40, "!\xF0\x96\xB5\x80" "?\xF0\x96\xB5\x80" "'s",
         {0,172,244,113,222,30,172,244,113,222,1048}, 11},
    };
    int ok = 0;
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        int32_t *ids;
        size_t n;
        if (ktok_encode(t, v[i].text, strlen(v[i].text), 0, &ids, &n)) die_oom();
        int same = ids_eq(ids, n, v[i].ids, v[i].n);
        ok += same;
        if (!same) printf("# post-Unicode-14 vector with U+%04X differs\n", (unsigned)v[i].cp);
        free(ids);
    }
    CHECK(ok == (int)(sizeof v / sizeof *v), "post-Unicode-14 code points (U+138ED, U+313CE, U+2EDC7, ...): %d/%zu vectors "
          "identical to npm tiktoken", ok, sizeof v / sizeof *v);
}

static void test_spec_vectors(const ktok *t)
{
    int32_t *ids;
    size_t n;
    const char *s = "The capital of France is";
    if (ktok_encode(t, s, strlen(s), 1, &ids, &n)) die_oom();
    int32_t want[] = {1008, 10484, 318, 15383, 387};
    CHECK(ids_eq(ids, n, want, 5), "spec: \"The capital of France is\" -> 1008,10484,318,15383,387");
    free(ids);
    int32_t d[] = {3, 4, 5, 6, 7};
    uint8_t *o;
    size_t ol;
    long sk = ktok_decode(t, d, 5, &o, &ol);
    CHECK(sk == 0 && ol == 5 && memcmp(o, "$%&'(", 5) == 0, "spec: ids 3,4,5,6,7 decode to \"$%%&'(\"");
    if (sk >= 0) free(o);
    size_t l;
    const uint8_t *p = ktok_id_bytes(t, 17374, &l);
    CHECK(p && l == 6 && memcmp(p, " Paris", 6) == 0, "spec: 17374 = \" Paris\"");
    p = ktok_id_bytes(t, 220, &l);
    const uint8_t *q = ktok_id_bytes(t, 198, &l);
    CHECK(p && q && *p == ' ' && *q == '\n', "README: ' ' = 220, '\\n' = 198");
    CHECK(ktok_n_ranks(t) == 163584 && ktok_vocab_size(t) == 163840, "real rank file: 163,584 ranks, vocab_size 163,840");
    CHECK(ktok_id_bytes(t, 163840, &l) == NULL && ktok_id_bytes(t, -5, &l) == NULL && ktok_id_bytes(t, 163584, &l) != NULL,
          "real rank file: unknown ids decode to NULL, specials to text");

    /* README section 3: " "*26000+"x" -> 106 ids with the cut, 104 without */
    sbuf x = {0};
    sb_rep(&x, " ", 26000);
    sb_str(&x, "x");
    if (ktok_encode(t, x.p, x.n, 1, &ids, &n)) die_oom();
    size_t nn;
    int32_t *w = encode_nocut(t, x.p, x.n, &nn);
    CHECK(n == 106 && nn == 104, "README: \" \"*26000+\"x\" -> %zu ids with the 25k cut (want 106), %zu without (want 104)", n, nn);
    free(ids);
    free(w);
    free(x.p);
}

static void add_random_utf8(sbuf *b, size_t n_cp)
{
    for (size_t i = 0; i < n_cp; i++) {
        uint32_t c;
        switch (rndn(8)) {
        case 0: c = 0x20 + rndn(0x5F); break;
        case 1: c = 0xA0 + rndn(0x560); break;
        case 2: c = 0x400 + rndn(0x100); break;
        case 3: c = 0x4E00 + rndn(0x5200); break;
        case 4: c = 0xAC00 + rndn(0x2BA4); break;
        case 5: c = 0x1F300 + rndn(0x700); break;
        case 6: c = rndn(3) ? 0x20 : (uint32_t)"\n\t\r\x0b\x0c"[rndn(5)]; break;
        default:
            do c = rndn(0x110000); while (c >= 0xD800 && c < 0xE000);
        }
        sb_cp(b, c);
    }
}

static void test_roundtrip_large(const ktok *t)
{
    static const char *const words[] = {"the", "of", "and", "to", "in", "tokenizer", "model", "Paris", "capital",
                                        "is", "a", "with", "KV-cache", "attention", "don't", "we'll", "12345", "3.14159"};
    static const char *const code =
        "static int f(const char *s, size_t n) {\n\tfor (size_t i = 0; i < n; i++)\n\t\tif (s[i] == '\\n') return (int)i;\n"
        "    return -1; // done\n}\n#include <stdio.h>\nx = {\"a\": [1, 2, 3], 'b': None}  # python\n";
    sbuf b = {0};
    for (int i = 0; i < 20000; i++) {           /* ~130 KB ASCII prose */
        sb_str(&b, words[rndn(sizeof words / sizeof words[0])]);
        sb_str(&b, rndn(12) ? " " : (rndn(2) ? ".\n" : ", "));
    }
    for (int i = 0; i < 300; i++) sb_str(&b, code);                                   /* ~60 KB code */
    for (int i = 0; i < 2000; i++) sb_str(&b, "中文测试：你好世界。日本語のテスト、ひらがな。한국어 텍스트 ");  /* CJK */
    for (int i = 0; i < 3000; i++) sb_str(&b, "😀🎉🚀 👨‍👩‍👧‍👦🇫🇷 ");                          /* emoji */
    sb_rep(&b, " ", 30000);                                                           /* > 25,000 spaces */
    sb_str(&b, "x");
    sb_rep(&b, "\n\t ", 9000);                                                        /* 27,000 mixed whitespace */
    sb_rep(&b, "y", 60000);                                                           /* 60,000-letter word */
    sb_rep(&b, "7", 30000);
    sb_rep(&b, "!?", 15000);
    sb_rep(&b, "世", 30000);                                                          /* Han run */
    sb_rep(&b, "😀", 30000);                                                          /* emoji without spaces */
    sb_rep(&b, "é", 26000);
    add_random_utf8(&b, 60000);
    sb_str(&b, "<|open|>message<|sep|> [BOS] <|im_end|> ");
    add_random_utf8(&b, 60000);
    size_t cps = 0;
    for (size_t i = 0; i < b.n; i++) cps += ((unsigned char)b.p[i] & 0xC0) != 0x80;

    int32_t *ids = NULL;
    size_t n = 0;
    double t0 = now_s();
    int rc = ktok_encode(t, b.p, b.n, 1, &ids, &n);
    double dt = now_s() - t0;
    CHECK(rc == 0 && roundtrips(t, ids, n, b.p, b.n),
          "round trip: decode(encode(x)) == x on %zu bytes / %zu code points (prose, code, CJK, emoji, runs > 25k, random UTF-8) -> %zu ids",
          b.n, cps, n);
    printf("# encode throughput (mixed, %.0f KB): %.2f MB/s (%.3f s, JIT %s)\n", (double)b.n / 1024, (double)b.n / dt / 1e6,
           dt, ktok_uses_jit(t) ? "on" : "off");
    free(ids);
    int32_t *ids2;
    size_t n2;
    rc = ktok_encode(t, b.p, b.n, 0, &ids2, &n2);
    int nsp = 0;
    for (size_t i = 0; rc == 0 && i < n2; i++) nsp += ids2[i] >= 163584;
    CHECK(rc == 0 && nsp == 0 && roundtrips(t, ids2, n2, b.p, b.n), "round trip with allow_special=0 (no special ids emitted)");
    free(ids2);

    /* plain prose throughput */
    b.n = 0;
    for (int i = 0; i < 150000; i++) {
        sb_str(&b, words[rndn(sizeof words / sizeof words[0])]);
        sb_str(&b, rndn(12) ? " " : ".\n");
    }
    t0 = now_s();
    rc = ktok_encode(t, b.p, b.n, 1, &ids, &n);
    dt = now_s() - t0;
    CHECK(rc == 0 && roundtrips(t, ids, n, b.p, b.n), "round trip: %zu bytes of English-like prose -> %zu ids", b.n, n);
    printf("# encode throughput (prose, %.0f KB): %.2f MB/s\n", (double)b.n / 1024, (double)b.n / dt / 1e6);
    free(ids);

    /* pure random valid UTF-8, many small texts */
    int ok = 1;
    for (int it = 0; it < 300 && ok; it++) {
        b.n = 0;
        add_random_utf8(&b, 1 + rndn(200));
        if (ktok_encode(t, b.p, b.n, 1, &ids, &n)) die_oom();
        ok = roundtrips(t, ids, n, b.p, b.n);
        free(ids);
    }
    CHECK(ok, "round trip: 300 random valid UTF-8 strings");
    free(b.p);
}

static void test_fixtures(void)
{
    const char *sh = check_shared_dir();
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s/fixtures/tokenizer", sh);
    snprintf(path, sizeof path, "%s/tiktoken.model", dir);
    char *rf;
    size_t rl;
    if (read_whole(path, &rf, &rl)) {
        const char *why = "fixtures absent";
        SKIP("kimi_vectors.jsonl: %s (%s)", why, path);
        SKIP("kimi_presplit.jsonl: %s (%s)", why, path);
        SKIP("spec vectors: %s (%s)", why, path);
        SKIP("large round trips and throughput with the real vocabulary: %s (%s)", why, path);
        return;
    }
    ktok_special *s2, *s3;
    size_t n2, n3;
    if (ktok_specials_builtin("k2", &s2, &n2) || ktok_specials_builtin("k3", &s3, &n3)) die_oom();
    krun_err ke = {0, ""};
    char *err = ke.msg;
    double t0 = now_s();
    ktok *k3 = ktok_load(rf, rl, s3, n3, &ke);
    double dt = now_s() - t0;
    CHECK(k3 != NULL, "real tiktoken.model + K3 specials loads (%s)", k3 ? "ok" : err);
    ktok *k2 = ktok_load(rf, rl, s2, n2, &ke);
    CHECK(k2 != NULL, "real tiktoken.model + K2 specials loads (%s)", k2 ? "ok" : err);
    ktok_specials_free(s2, n2);
    ktok_specials_free(s3, n3);
    free(rf);
    if (!k2 || !k3) { ktok_free(k2); ktok_free(k3); return; }
    printf("# load time %.3f s, JIT %s\n", dt, ktok_uses_jit(k3) ? "on" : "off");
    CHECK(ktok_find_special(k3, "<|open|>") == 163587 && ktok_find_special(k2, "<|open|>") == -1 &&
          ktok_find_special(k2, "<|im_end|>") == 163586, "K2/K3 tables: <|open|> only in K3, <|im_end|> = 163586 in K2");

    int pcre_err;
    PCRE2_SIZE eo;
    g_cn = pcre2_compile((PCRE2_SPTR) "\\p{Cn}", PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &pcre_err, &eo, NULL);

    test_spec_vectors(k3);
    test_post14_vectors(k3);
    snprintf(path, sizeof path, "%s/kimi_vectors.jsonl", dir);
    test_vectors(k2, k3, path, ktok_uses_jit(k3) ? "JIT" : "interpreter");
    char ppath[1200];
    snprintf(ppath, sizeof ppath, "%s/kimi_presplit.jsonl", dir);
    test_presplit(k3, ppath, ktok_uses_jit(k3) ? "JIT" : "interpreter");
    if (ktok_uses_jit(k3)) {
        /* the same vectors through the PCRE2 interpreter: results must not depend on the JIT */
        ktok_set_jit(k2, 0);
        ktok_set_jit(k3, 0);
        test_vectors(k2, k3, path, "interpreter");
        test_presplit(k3, ppath, "interpreter");
        ktok_set_jit(k2, 1);
        ktok_set_jit(k3, 1);
    } else {
        SKIP("JIT/interpreter agreement: PCRE2 JIT not available");
    }
    test_roundtrip_large(k3);
    pcre2_code_free(g_cn);
    g_cn = NULL;
    ktok_free(k2);
    ktok_free(k3);
}

int main(void)
{
    test_synthetic();
    test_bad_input();
    test_utf8_complete();
    test_special_tables();
    test_ucd_table();
    test_fixtures();
    return check_exit();
}
