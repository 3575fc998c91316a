/* Kimi tokenizer: rank file, PCRE2 pre-tokenizer, heap rank-BPE, special tokens, 400k/25k cuts.
 * See tokenizer.h and shared/fixtures/tokenizer/README.md. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"
#include "tokenizer_ucd.h"
#include "run/util/krun_err.h"

#include <pcre2.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The Kimi pat_str (README §2), translated for PCRE2 10.42 (compiled with PCRE2_UTF|PCRE2_UCP):
 *  - `[X&&[^\p{Han}]]` (class intersection, not supported by PCRE2 10.42, which would silently
 *    read `&&[^...]` as literal characters) becomes `(?:(?!HAN)[X])`;
 *  - `\p{Han}` becomes `\p{sc:Han}`: Script=Han, not Script_Extensions (PCRE2 >= 10.40 reads a bare
 *    `\p{Han}` as scx, which would swallow 。、「」);
 *  - `\s` / `\S` become `\p{White_Space}` / `\P{White_Space}` (PCRE2's \s also matches U+180E);
 *  - the reference (tiktoken's Rust regex) has Unicode 16.0 tables, PCRE2 10.42 has 14.0 ones and
 *    treats the code points assigned since as unassigned; so a second pattern lists those code
 *    points (tokenizer_ucd.h) in every class.  It is used for text that contains one of them; other
 *    text takes the first pattern, which gives the same pieces on such text and is faster: the
 *    explicit ranges alone cost +37% encode instructions on ASCII prose and +27% on mixed-script
 *    text (callgrind); the check for post-14.0 code points costs +0.3% and +3%.
 * Alternatives are tried left to right, backtracking, leftmost-first, greedy: the same semantics
 * as fancy-regex in tiktoken. */
#define KTOK_PATTERN(HAN_X, UPPER_X, LOWER_X, LN_X, N_X) \
    "[\\p{sc:Han}" HAN_X "]+" \
    "|[^\\r\\n\\p{L}\\p{N}" LN_X "]?(?:(?![\\p{sc:Han}" HAN_X "])[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}" UPPER_X "])*" \
        "(?:(?![\\p{sc:Han}" HAN_X "])[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}" LOWER_X "])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?" \
    "|[^\\r\\n\\p{L}\\p{N}" LN_X "]?(?:(?![\\p{sc:Han}" HAN_X "])[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}" UPPER_X "])+" \
        "(?:(?![\\p{sc:Han}" HAN_X "])[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}" LOWER_X "])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?" \
    "|[\\p{N}" N_X "]{1,3}" \
    "| ?[^\\p{White_Space}\\p{L}\\p{N}" LN_X "]+[\\r\\n]*" \
    "|\\p{White_Space}*[\\r\\n]+" \
    "|\\p{White_Space}+(?!\\P{White_Space})" \
    "|\\p{White_Space}+"
static const char *const KTOK_PATTERNS[2] = {
    /* Unicode 14.0 classes, as PCRE2 10.42 has them */
    KTOK_PATTERN("", "", "", "", ""),
    /* with the code points Unicode 15.0-16.0 added to each class */
    KTOK_PATTERN(KTOK_UCD_NEW_HAN, KTOK_UCD_NEW_UPPERISH, KTOK_UCD_NEW_LOWERISH,
                 KTOK_UCD_NEW_L KTOK_UCD_NEW_N, KTOK_UCD_NEW_N),
};

/* JIT stack, created only when PCRE2's default 32 KB machine-stack area is too small for a
 * match (long pieces: the pattern's group repetitions keep one frame per code point).  The
 * maximum is a virtual reservation.  If even that fails, the interpreter takes over. */
#define KTOK_JIT_STACK_MIN  (64u * 1024u)
#define KTOK_JIT_STACK_MAX  (64u * 1024u * 1024u)

typedef struct {
    int32_t id;
    uint32_t off, len;       /* text in sp_text */
} kspec;

struct ktok {
    size_t n_ranks;
    uint8_t *blob;           /* all rank bytes */
    uint32_t *rank_off, *rank_len;
    uint32_t max_rank_len;
    uint64_t *ht;            /* slot: (tag << 32) | (rank + 1); 0 = empty */
    size_t ht_mask;
    int32_t byte_rank[256];

    size_t n_specials;
    kspec *specials;         /* sorted by id */
    char *sp_text;
    /* byte trie of the special texts: node 0 is the root; an edge (node, byte) -> child lives in
     * an open-addressing table keyed by node * 256 + byte + 1 */
    int32_t *trie_term;      /* per node: index into specials of the text ending here, or -1 */
    uint64_t *trie_key;
    int32_t *trie_child;
    size_t trie_mask;
    uint8_t trie_first[256]; /* root has an edge for this byte */

    size_t vocab_size;
    pcre2_code *re[2];       /* KTOK_PATTERNS: Unicode 14.0 classes; with the post-14.0 table */
    uint32_t (*ucd)[2];      /* every code point of the table: sorted, merged ranges */
    size_t n_ucd;
    int jit;                 /* JIT in use */
    int jit_ok;              /* JIT compiled */
};

/* ------------------------------------------------------------------------------------------ */
/* small helpers                                                                              */

static inline uint64_t load64(const uint8_t *p) { uint64_t w; memcpy(&w, p, 8); return w; }
static inline uint32_t load32(const uint8_t *p) { uint32_t w; memcpy(&w, p, 4); return w; }
static inline uint16_t load16(const uint8_t *p) { uint16_t w; memcpy(&w, p, 2); return w; }

/* Length (1..4) of the valid UTF-8 sequence at p (RFC 3629: no overlongs, no surrogates,
 * <= U+10FFFF; the same rules as PCRE2's UTF check), or 0 if the bytes at p are not one. */
static size_t utf8_seq(const uint8_t *p, size_t n, uint32_t *cp)
{
    uint8_t b = p[0];
    if (b < 0x80) { *cp = b; return 1; }
    if (b < 0xC2) return 0;
    if (b < 0xE0) {
        if (n < 2 || (p[1] & 0xC0) != 0x80) return 0;
        *cp = ((uint32_t)(b & 0x1F) << 6) | (p[1] & 0x3F);
        return 2;
    }
    if (b < 0xF0) {
        if (n < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (b == 0xE0 && p[1] < 0xA0) return 0;          /* overlong */
        if (b == 0xED && p[1] >= 0xA0) return 0;         /* surrogate */
        *cp = ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
        return 3;
    }
    if (b < 0xF5) {
        if (n < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        if (b == 0xF0 && p[1] < 0x90) return 0;          /* overlong */
        if (b == 0xF4 && p[1] >= 0x90) return 0;         /* > U+10FFFF */
        *cp = ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(p[1] & 0x3F) << 12) |
              ((uint32_t)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
        return 4;
    }
    return 0;
}

/* Length of the longest valid UTF-8 prefix of p[0..n). */
static size_t utf8_valid_prefix(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n && !(load64(p + i) & 0x8080808080808080ull)) i += 8;
        if (i == n) break;
        if (p[i] < 0x80) { i++; continue; }
        uint32_t cp;
        size_t l = utf8_seq(p + i, n - i, &cp);
        if (!l) break;
        i += l;
    }
    return i;
}

/* Python str.isspace(): Unicode White_Space plus U+001C..U+001F (bidi class B/S).  This is the
 * whole set (README §3); White_Space has not changed since Unicode 6.3. */
static int py_isspace(uint32_t c)
{
    if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
    switch (c) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
        return 1;
    default:
        return c >= 0x2000 && c <= 0x200A;
    }
}

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

/* Hash of a byte string (n >= 1).  Short keys are read with (possibly overlapping) fixed-size
 * loads; the length is mixed in, so overlapping reads cannot alias different lengths. */
static inline uint64_t hash_bytes(const uint8_t *p, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)n * 0xC2B2AE3D27D4EB4Full);
    uint64_t w;
    if (n <= 8) {
        if (n >= 4) w = (uint64_t)load32(p) | ((uint64_t)load32(p + n - 4) << 32);
        else if (n >= 2) w = (uint64_t)load16(p) | ((uint64_t)load16(p + n - 2) << 16);
        else w = n ? p[0] : 0;
    } else {
        while (n > 8) {
            h = rotl64(h ^ (load64(p) * 0x87C37B91114253D5ull), 31) * 0x4CF5AD432745937Full;
            p += 8;
            n -= 8;
        }
        w = load64(p + n - 8);
    }
    h ^= w * 0x87C37B91114253D5ull;
    h ^= h >> 32;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 29;
    return h;
}

static int32_t ht_get(const ktok *t, const uint8_t *p, size_t n)
{
    if (n == 0 || n > t->max_rank_len) return -1;
    uint64_t h = hash_bytes(p, n);
    uint32_t tag = (uint32_t)(h >> 32);
    size_t i = (size_t)h & t->ht_mask;
    for (;;) {
        uint64_t s = t->ht[i];
        if (!s) return -1;
        if ((uint32_t)(s >> 32) == tag) {
            uint32_t r = (uint32_t)s - 1;
            if (t->rank_len[r] == n && memcmp(t->blob + t->rank_off[r], p, n) == 0) return (int32_t)r;
        }
        i = (i + 1) & t->ht_mask;
    }
}

/* Insert rank r; returns -1 if inserted, else the rank that already has these bytes. */
static int32_t ht_put(ktok *t, uint32_t r)
{
    const uint8_t *p = t->blob + t->rank_off[r];
    size_t n = t->rank_len[r];
    uint64_t h = hash_bytes(p, n);
    uint32_t tag = (uint32_t)(h >> 32);
    size_t i = (size_t)h & t->ht_mask;
    for (;;) {
        uint64_t s = t->ht[i];
        if (!s) { t->ht[i] = ((uint64_t)tag << 32) | (uint64_t)(r + 1); return -1; }
        if ((uint32_t)(s >> 32) == tag) {
            uint32_t o = (uint32_t)s - 1;
            if (t->rank_len[o] == n && memcmp(t->blob + t->rank_off[o], p, n) == 0) return (int32_t)o;
        }
        i = (i + 1) & t->ht_mask;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* loading                                                                                    */

static int b64val(uint8_t c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Standard alphabet, '=' padding required (length a multiple of 4).  Returns the decoded
 * length, or -1. */
static long b64decode(const uint8_t *s, size_t n, uint8_t *out)
{
    if (n == 0 || n % 4) return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int last = (i + 4 == n);
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            if (s[i + k] == '=') {
                if (!last || k < 2) return -1;
                v[k] = 0;
                pad++;
            } else {
                if (pad) return -1;          /* data after '=' */
                v[k] = b64val(s[i + k]);
                if (v[k] < 0) return -1;
            }
        }
        uint32_t w = ((uint32_t)v[0] << 18) | ((uint32_t)v[1] << 12) | ((uint32_t)v[2] << 6) | (uint32_t)v[3];
        out[o++] = (uint8_t)(w >> 16);
        if (pad < 2) out[o++] = (uint8_t)(w >> 8);
        if (pad < 1) out[o++] = (uint8_t)w;
    }
    return (long)o;
}

/* A printable, truncated rendering of a line for error messages. */
static void show_line(char *dst, size_t cap, const char *p, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c >= 0x20 && c < 0x7F) dst[o++] = (char)c;
        else { snprintf(dst + o, cap - o, "\\x%02X", c); o += 4; }
        if (i + 1 < n && o + 5 >= cap) { dst[o++] = '.'; dst[o++] = '.'; break; }
    }
    dst[o < cap ? o : cap - 1] = 0;
}

static int cmp_range(const void *a, const void *b)
{
    const uint32_t *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

static int cmp_spec_id(const void *a, const void *b)
{
    const kspec *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

static int32_t trie_get(const ktok *t, int32_t node, uint8_t byte)
{
    uint64_t k = (uint64_t)node * 256 + byte + 1;
    size_t i = (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & t->trie_mask;
    for (;;) {
        if (t->trie_key[i] == k) return t->trie_child[i];
        if (!t->trie_key[i]) return -1;
        i = (i + 1) & t->trie_mask;
    }
}

static void trie_put(ktok *t, int32_t node, uint8_t byte, int32_t child)
{
    uint64_t k = (uint64_t)node * 256 + byte + 1;
    size_t i = (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & t->trie_mask;
    while (t->trie_key[i]) i = (i + 1) & t->trie_mask;
    t->trie_key[i] = k;
    t->trie_child[i] = child;
}

static int load_specials(ktok *t, const ktok_special *sp, size_t n, krun_err *err)
{
    if (n > (size_t)INT32_MAX / 4) { krun_err_set(err, KRUN_EINPUT, "too many special tokens"); return -1; }
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!sp[i].text) { krun_err_set(err, KRUN_EINPUT, "special token %zu (id %d): NULL text", i, (int)sp[i].id); return -1; }
        size_t l = strlen(sp[i].text);
        if (l == 0) { krun_err_set(err, KRUN_EINPUT, "special token id %d: empty text", (int)sp[i].id); return -1; }
        if (l > (size_t)INT32_MAX / 4 || total > (size_t)INT32_MAX / 4) { krun_err_set(err, KRUN_EINPUT, "special token texts too long"); return -1; }
        if (utf8_valid_prefix((const uint8_t *)sp[i].text, l) != l) {
            krun_err_set(err, KRUN_EINPUT, "special token id %d: text is not valid UTF-8", (int)sp[i].id);
            return -1;
        }
        if (sp[i].id < 0 || (size_t)sp[i].id < t->n_ranks) {
            krun_err_set(err, KRUN_EINPUT, "special token %d \"%.60s\": id collides with the ranks 0..%zu",
                         (int)sp[i].id, sp[i].text, t->n_ranks - 1);
            return -1;
        }
        total += l;
    }
    /* trie: at most total + 1 nodes and total edges; edge table load factor <= 1/2 */
    size_t cap = 16;
    while (cap < 2 * total) cap <<= 1;
    t->specials = malloc((n ? n : 1) * sizeof *t->specials);
    t->sp_text = malloc(total + 1);
    t->trie_term = malloc((total + 1) * sizeof *t->trie_term);
    t->trie_key = calloc(cap, sizeof *t->trie_key);
    t->trie_child = malloc(cap * sizeof *t->trie_child);
    if (!t->specials || !t->sp_text || !t->trie_term || !t->trie_key || !t->trie_child) {
        krun_err_set(err, KRUN_ENOMEM, "out of memory");
        return -1;
    }
    t->trie_mask = cap - 1;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(sp[i].text);
        memcpy(t->sp_text + off, sp[i].text, l);
        t->specials[i].id = sp[i].id;
        t->specials[i].off = (uint32_t)off;
        t->specials[i].len = (uint32_t)l;
        off += l;
    }
    t->sp_text[off] = 0;
    t->n_specials = n;
    if (n) qsort(t->specials, n, sizeof *t->specials, cmp_spec_id);
    for (size_t i = 1; i < n; i++)
        if (t->specials[i].id == t->specials[i - 1].id) {
            krun_err_set(err, KRUN_EINPUT, "special token id %d given twice", (int)t->specials[i].id);
            return -1;
        }
    int32_t nodes = 1;
    t->trie_term[0] = -1;
    for (size_t i = 0; i < n; i++) {
        const kspec *k = &t->specials[i];
        const uint8_t *x = (const uint8_t *)t->sp_text + k->off;
        int32_t node = 0;
        for (uint32_t j = 0; j < k->len; j++) {
            int32_t c = trie_get(t, node, x[j]);
            if (c < 0) {
                c = nodes++;
                t->trie_term[c] = -1;
                trie_put(t, node, x[j], c);
            }
            node = c;
        }
        if (t->trie_term[node] >= 0) {
            krun_err_set(err, KRUN_EINPUT, "special tokens %d and %d have the same text \"%.*s\"",
                         (int)t->specials[t->trie_term[node]].id, (int)k->id, (int)(k->len < 60 ? k->len : 60),
                         (const char *)x);
            return -1;
        }
        t->trie_term[node] = (int32_t)i;
        t->trie_first[x[0]] = 1;
    }
    if (n) {
        size_t maxid = (size_t)t->specials[n - 1].id;
        if (maxid + 1 > t->vocab_size) t->vocab_size = maxid + 1;
    }
    return 0;
}

/* The code points of tokenizer_ucd.h's classes as sorted, merged ranges (parsed from the same
 * strings the second pattern is built from: one source of truth). */
static int load_ucd_ranges(ktok *t)
{
    static const char *const bodies[] = {KTOK_UCD_NEW_HAN, KTOK_UCD_NEW_L, KTOK_UCD_NEW_N, KTOK_UCD_NEW_UPPERISH,
                                         KTOK_UCD_NEW_LOWERISH};
    size_t cap = 0;
    for (size_t b = 0; b < sizeof bodies / sizeof *bodies; b++)
        for (const char *p = bodies[b]; (p = strstr(p, "\\x{")) != NULL; p++) cap++;
    t->ucd = malloc((cap ? cap : 1) * sizeof *t->ucd);
    if (!t->ucd) return -1;
    size_t n = 0;
    for (size_t b = 0; b < sizeof bodies / sizeof *bodies; b++)
        for (const char *p = bodies[b]; (p = strstr(p, "\\x{")) != NULL;) {
            char *e;
            uint32_t lo = (uint32_t)strtoul(p + 3, &e, 16), hi = lo;
            p = e + 1;
            if (!strncmp(p, "-\\x{", 4)) { hi = (uint32_t)strtoul(p + 4, &e, 16); p = e + 1; }
            t->ucd[n][0] = lo;
            t->ucd[n][1] = hi;
            n++;
        }
    qsort(t->ucd, n, sizeof *t->ucd, cmp_range);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && t->ucd[i][0] <= t->ucd[m - 1][1] + 1) {
            if (t->ucd[i][1] > t->ucd[m - 1][1]) t->ucd[m - 1][1] = t->ucd[i][1];
        } else {
            t->ucd[m][0] = t->ucd[i][0];
            t->ucd[m][1] = t->ucd[i][1];
            m++;
        }
    }
    t->n_ucd = m;
    return 0;
}

static int compile_regex(ktok *t, krun_err *err)
{
    uint32_t have_jit = 0;
    int jit = pcre2_config(PCRE2_CONFIG_JIT, &have_jit) >= 0 && have_jit;
    for (int k = 0; k < 2; k++) {
        int ec;
        PCRE2_SIZE eo;
        t->re[k] = pcre2_compile((PCRE2_SPTR)KTOK_PATTERNS[k], PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
        if (!t->re[k]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            krun_err_set(err, KRUN_EINPUT, "pre-tokenizer pattern %d does not compile at offset %zu: %s", k, (size_t)eo, (char *)msg);
            return -1;
        }
        jit = jit && pcre2_jit_compile(t->re[k], PCRE2_JIT_COMPLETE) == 0;
    }
    t->jit = t->jit_ok = jit;
    if (load_ucd_ranges(t)) { krun_err_set(err, KRUN_ENOMEM, "out of memory"); return -1; }
    return 0;
}

ktok *ktok_load(const char *rank_file, size_t len, const ktok_special *specials, size_t n_specials,
                krun_err *err)
{
    krun_err_set(err, KRUN_OK, "ok");
    if (!rank_file && len) { krun_err_set(err, KRUN_EINPUT, "tiktoken.model: NULL buffer"); return NULL; }
    if (!specials && n_specials) { krun_err_set(err, KRUN_EINPUT, "special tokens: NULL list"); return NULL; }
    const uint8_t *s = (const uint8_t *)rank_file;

    /* pass 1: count entries */
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        const uint8_t *nl = memchr(s + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - s) : len;
        size_t le = e;
        if (le > i && s[le - 1] == '\r') le--;
        if (le > i) n++;
        i = e + 1;
    }
    if (n == 0) { krun_err_set(err, KRUN_EINPUT, "tiktoken.model: no entries"); return NULL; }
    if (n > (size_t)INT32_MAX || len > UINT32_MAX) { krun_err_set(err, KRUN_EINPUT, "tiktoken.model: too large"); return NULL; }

    ktok *t = calloc(1, sizeof *t);
    uint32_t *rank_line = NULL;
    if (!t) { krun_err_set(err, KRUN_ENOMEM, "out of memory"); return NULL; }
    t->n_ranks = n;
    t->vocab_size = n;
    t->blob = malloc(len / 4 * 3 + 3);
    t->rank_off = malloc(n * sizeof *t->rank_off);
    t->rank_len = malloc(n * sizeof *t->rank_len);
    rank_line = calloc(n, sizeof *rank_line);
    if (!t->blob || !t->rank_off || !t->rank_len || !rank_line) { krun_err_set(err, KRUN_ENOMEM, "out of memory"); goto fail; }

    /* pass 2: parse */
    size_t bo = 0, line = 0;
    size_t over_line = 0, over_rank = 0;        /* first rank >= n (means one is missing) */
    for (size_t i = 0; i < len;) {
        const uint8_t *nl = memchr(s + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - s) : len;
        size_t le = e;
        line++;
        if (le > i && s[le - 1] == '\r') le--;
        if (le == i) { i = e + 1; continue; }
        char shown[64];
        const uint8_t *sp = memchr(s + i, ' ', le - i);
        if (!sp) {
            show_line(shown, sizeof shown, (const char *)s + i, le - i);
            krun_err_set(err, KRUN_EINPUT, "tiktoken.model line %zu: expected \"<base64> <rank>\", got \"%s\"", line, shown);
            goto fail;
        }
        size_t bl = (size_t)(sp - (s + i));
        long dl = b64decode(s + i, bl, t->blob + bo);
        if (dl <= 0) {
            show_line(shown, sizeof shown, (const char *)s + i, bl);
            krun_err_set(err, KRUN_EINPUT, "tiktoken.model line %zu: bad base64 \"%s\"", line, shown);
            goto fail;
        }
        const uint8_t *rp = sp + 1, *re = s + le;
        uint64_t rank = 0;
        if (rp == re) { krun_err_set(err, KRUN_EINPUT, "tiktoken.model line %zu: missing rank", line); goto fail; }
        for (const uint8_t *q = rp; q < re; q++) {
            if (*q < '0' || *q > '9' || rank > (uint64_t)INT32_MAX) {
                show_line(shown, sizeof shown, (const char *)rp, (size_t)(re - rp));
                krun_err_set(err, KRUN_EINPUT, "tiktoken.model line %zu: bad rank \"%s\"", line, shown);
                goto fail;
            }
            rank = rank * 10 + (uint64_t)(*q - '0');
        }
        if (rank > (uint64_t)INT32_MAX) {
            krun_err_set(err, KRUN_EINPUT, "tiktoken.model line %zu: rank %llu out of range", line, (unsigned long long)rank);
            goto fail;
        }
        if (rank >= n) {
            if (!over_line) { over_line = line; over_rank = (size_t)rank; }
        } else if (rank_line[rank]) {
            krun_err_set(err, KRUN_EINPUT, "tiktoken.model line %zu: duplicate rank %llu (also on line %u)", line,
                         (unsigned long long)rank, rank_line[rank]);
            goto fail;
        } else {
            if (line > UINT32_MAX) { krun_err_set(err, KRUN_EINPUT, "tiktoken.model: too many lines"); goto fail; }
            rank_line[rank] = (uint32_t)line;
            t->rank_off[rank] = (uint32_t)bo;
            t->rank_len[rank] = (uint32_t)dl;
            if ((uint32_t)dl > t->max_rank_len) t->max_rank_len = (uint32_t)dl;
        }
        bo += (size_t)dl;
        i = e + 1;
    }
    if (over_line) {
        size_t miss = 0;
        while (miss < n && rank_line[miss]) miss++;
        krun_err_set(err, KRUN_EINPUT, "tiktoken.model: rank %zu missing (%zu entries, so ranks must be 0..%zu; "
                     "line %zu has rank %zu)", miss, n, n - 1, over_line, over_rank);
        goto fail;
    }

    /* rank lookup table: open addressing, load factor <= 1/2 */
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    t->ht = calloc(cap, sizeof *t->ht);
    if (!t->ht) { krun_err_set(err, KRUN_ENOMEM, "out of memory"); goto fail; }
    t->ht_mask = cap - 1;
    for (size_t r = 0; r < n; r++) {
        int32_t o = ht_put(t, (uint32_t)r);
        if (o >= 0) {
            uint32_t l1 = rank_line[o], l2 = rank_line[r];
            krun_err_set(err, KRUN_EINPUT, "tiktoken.model line %u: same token bytes as line %u (ranks %d and %zu)",
                         l1 > l2 ? l1 : l2, l1 < l2 ? l1 : l2, (int)o, r);
            goto fail;
        }
    }
    free(rank_line);
    rank_line = NULL;
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        t->byte_rank[b] = ht_get(t, &c, 1);
        if (t->byte_rank[b] < 0) {
            krun_err_set(err, KRUN_EINPUT, "tiktoken.model: byte 0x%02X has no rank (every single byte needs one)", b);
            goto fail;
        }
    }
    if (load_specials(t, specials, n_specials, err)) goto fail;
    if (compile_regex(t, err)) goto fail;
    return t;

fail:
    free(rank_line);
    ktok_free(t);
    return NULL;
}

void ktok_free(ktok *t)
{
    if (!t) return;
    free(t->blob);
    free(t->rank_off);
    free(t->rank_len);
    free(t->ht);
    free(t->specials);
    free(t->sp_text);
    free(t->trie_term);
    free(t->trie_key);
    free(t->trie_child);
    for (int k = 0; k < 2; k++)
        if (t->re[k]) pcre2_code_free(t->re[k]);
    free(t->ucd);
    free(t);
}

/* ------------------------------------------------------------------------------------------ */
/* queries                                                                                    */

static const kspec *spec_by_id(const ktok *t, int32_t id)
{
    size_t lo = 0, hi = t->n_specials;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->specials[mid].id < id) lo = mid + 1;
        else hi = mid;
    }
    return (lo < t->n_specials && t->specials[lo].id == id) ? &t->specials[lo] : NULL;
}

const uint8_t *ktok_id_bytes(const ktok *t, int32_t id, size_t *len)
{
    if (!t || id < 0) return NULL;
    if ((size_t)id < t->n_ranks) {
        if (len) *len = t->rank_len[id];
        return t->blob + t->rank_off[id];
    }
    const kspec *s = spec_by_id(t, id);
    if (!s) return NULL;
    if (len) *len = s->len;
    return (const uint8_t *)t->sp_text + s->off;
}

size_t ktok_vocab_size(const ktok *t) { return t ? t->vocab_size : 0; }
size_t ktok_n_ranks(const ktok *t) { return t ? t->n_ranks : 0; }
int ktok_uses_jit(const ktok *t) { return t ? t->jit : 0; }
int ktok_set_jit(ktok *t, int enable)
{
    if (!t) return 0;
    t->jit = enable && t->jit_ok;
    return t->jit;
}
int ktok_is_special(const ktok *t, int32_t id) { return t && id >= 0 && spec_by_id(t, id) != NULL; }

int32_t ktok_rank_of(const ktok *t, const uint8_t *bytes, size_t len)
{
    if (!t || (!bytes && len)) return -1;
    return ht_get(t, bytes, len);
}

/* Longest special that is a prefix of p[0..n): its index into specials, or -1. */
static int32_t special_at(const ktok *t, const uint8_t *p, size_t n)
{
    int32_t node = 0, best = -1;
    for (size_t j = 0; j < n; j++) {
        node = trie_get(t, node, p[j]);
        if (node < 0) break;
        if (t->trie_term[node] >= 0) best = t->trie_term[node];
    }
    return best;
}

int32_t ktok_find_special(const ktok *t, const char *text)
{
    if (!t || !text || !text[0] || !t->n_specials) return -1;
    size_t l = strlen(text);
    int32_t k = special_at(t, (const uint8_t *)text, l);
    return (k >= 0 && t->specials[k].len == l) ? t->specials[k].id : -1;
}

long ktok_decode(const ktok *t, const int32_t *ids, size_t n, uint8_t **out, size_t *out_len)
{
    if (!t || !out || !out_len || (!ids && n)) return -1;
    size_t total = 0;
    long skipped = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        if (ktok_id_bytes(t, ids[i], &l)) total += l;
        else skipped++;
    }
    uint8_t *b = malloc(total + 1);
    if (!b) return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const uint8_t *p = ktok_id_bytes(t, ids[i], &l);
        if (p) { memcpy(b + o, p, l); o += l; }
    }
    b[o] = 0;
    *out = b;
    *out_len = o;
    return skipped;
}

/* ------------------------------------------------------------------------------------------ */
/* encoding                                                                                   */

typedef struct {
    const ktok *t;
    int err;
    /* output: ids (encode) or piece ends (split) */
    int split_mode;
    int32_t *ids;
    size_t n_ids, cap_ids;
    size_t *ends;
    size_t n_ends, cap_ends;
    size_t base;               /* offset of the current stretch in the whole text (split mode) */
    /* BPE scratch, sized for pieces of up to scap bytes */
    size_t scap;
    int32_t *nx, *pv, *node_rank, *pair_rank;
    uint64_t *heap;
    /* regex state */
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *js;
    int nojit;
} enc;

static int enc_init(enc *e, const ktok *t, int split_mode)
{
    memset(e, 0, sizeof *e);
    e->t = t;
    e->split_mode = split_mode;
    e->md = pcre2_match_data_create_from_pattern(t->re[1], NULL);
    e->mctx = pcre2_match_context_create(NULL);
    if (!e->md || !e->mctx) return -1;
    return 0;
}

static void enc_fini(enc *e)
{
    free(e->nx);
    free(e->pv);
    free(e->node_rank);
    free(e->pair_rank);
    free(e->heap);
    if (e->md) pcre2_match_data_free(e->md);
    if (e->mctx) pcre2_match_context_free(e->mctx);
    if (e->js) pcre2_jit_stack_free(e->js);
}

static void push_id(enc *e, int32_t id)
{
    if (e->n_ids == e->cap_ids) {
        size_t nc = e->cap_ids ? e->cap_ids * 2 : 256;
        int32_t *p = realloc(e->ids, nc * sizeof *p);
        if (!p) { e->err = 1; return; }
        e->ids = p;
        e->cap_ids = nc;
    }
    e->ids[e->n_ids++] = id;
}

static int scratch(enc *e, size_t n)
{
    if (n <= e->scap) return 0;
    size_t c = e->scap ? e->scap : 64;
    while (c < n) c *= 2;
    if (c > SIZE_MAX / (3 * sizeof(uint64_t))) return -1;
    int32_t *a = realloc(e->nx, c * sizeof *a);
    if (!a) return -1;
    e->nx = a;
    a = realloc(e->pv, c * sizeof *a);
    if (!a) return -1;
    e->pv = a;
    a = realloc(e->node_rank, c * sizeof *a);
    if (!a) return -1;
    e->node_rank = a;
    a = realloc(e->pair_rank, c * sizeof *a);
    if (!a) return -1;
    e->pair_rank = a;
    uint64_t *h = realloc(e->heap, 3 * c * sizeof *h);
    if (!h) return -1;
    e->heap = h;
    e->scap = c;
    return 0;
}

/* binary min-heap of (rank << 32 | position): lowest rank first, leftmost on ties */
static void heap_down(uint64_t *h, size_t n, size_t i)
{
    uint64_t v = h[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

/* Rank-BPE of one piece.  Parts form a linked list over byte positions; pair_rank[i] is the rank
 * of (part at i) ++ (next part), or -1.  A heap entry is current iff its part is alive and its
 * rank equals pair_rank[i]: a part's right pair only ever grows, and a rank names exactly one
 * byte string, so an outdated entry can never carry the current rank. */
static void bpe(enc *e, const uint8_t *p, size_t n)
{
    const ktok *t = e->t;
    if (n == 0) return;
    if (n == 1) { push_id(e, t->byte_rank[p[0]]); return; }
    int32_t whole = ht_get(t, p, n);
    if (whole >= 0) { push_id(e, whole); return; }
    if (n > (size_t)INT32_MAX - 1 || scratch(e, n)) { e->err = 1; return; }
    int32_t *nx = e->nx, *pv = e->pv, *nr = e->node_rank, *pr = e->pair_rank;
    uint64_t *h = e->heap;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        nx[i] = (int32_t)(i + 1);
        pv[i] = (int32_t)i - 1;
        nr[i] = t->byte_rank[p[i]];
        pr[i] = i + 1 < n ? ht_get(t, p + i, 2) : -1;
        if (pr[i] >= 0) h[hn++] = ((uint64_t)(uint32_t)pr[i] << 32) | i;
    }
    for (size_t i = hn / 2; i-- > 0;) heap_down(h, hn, i);
    const int32_t N = (int32_t)n;
    while (hn) {
        uint64_t top = h[0];
        h[0] = h[--hn];
        if (hn) heap_down(h, hn, 0);
        int32_t i = (int32_t)(uint32_t)top, r = (int32_t)(top >> 32);
        if (nr[i] < 0 || pr[i] != r) continue;       /* outdated */
        int32_t j = nx[i], k = nx[j];
        nr[i] = r;
        nr[j] = -1;
        nx[i] = k;
        if (k < N) pv[k] = i;
        if (k < N) {
            int32_t end = nx[k];
            pr[i] = ht_get(t, p + i, (size_t)(end - i));
            if (pr[i] >= 0) heap_push(h, &hn, ((uint64_t)(uint32_t)pr[i] << 32) | (uint32_t)i);
        } else {
            pr[i] = -1;
        }
        int32_t q = pv[i];
        if (q >= 0) {
            pr[q] = ht_get(t, p + q, (size_t)(k - q));
            if (pr[q] >= 0) heap_push(h, &hn, ((uint64_t)(uint32_t)pr[q] << 32) | (uint32_t)q);
        }
    }
    for (int32_t i = 0; i < N; i = nx[i]) push_id(e, nr[i]);
}

static void emit_piece(enc *e, const uint8_t *p, size_t off, size_t end)
{
    if (e->split_mode) {
        if (e->n_ends == e->cap_ends) {
            size_t nc = e->cap_ends ? e->cap_ends * 2 : 64;
            size_t *q = realloc(e->ends, nc * sizeof *q);
            if (!q) { e->err = 1; return; }
            e->ends = q;
            e->cap_ends = nc;
        }
        e->ends[e->n_ends++] = e->base + end;
    } else {
        bpe(e, p + off, end - off);
    }
}

static int re_match(enc *e, const pcre2_code *re, const uint8_t *p, size_t n, size_t pos)
{
    const ktok *t = e->t;
    int rc;
    if (t->jit && !e->nojit) {
        rc = pcre2_jit_match(re, p, n, pos, 0, e->md, e->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !e->js) {
            e->js = pcre2_jit_stack_create(KTOK_JIT_STACK_MIN, KTOK_JIT_STACK_MAX, NULL);
            if (e->js) {
                pcre2_jit_stack_assign(e->mctx, NULL, e->js);
                rc = pcre2_jit_match(re, p, n, pos, 0, e->md, e->mctx);
            }
        }
        if (rc != PCRE2_ERROR_JIT_STACKLIMIT) return rc;
        e->nojit = 1;    /* the interpreter gives the same results; use it for the rest of this call */
    }
    return pcre2_match(re, p, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, e->md, e->mctx);
}

/* Whether valid UTF-8 text has a code point of the post-14.0 table (all are >= U+0800, so only
 * 3- and 4-byte sequences are decoded). */
static int has_post14(const ktok *t, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n;) {
        while (i + 8 <= n && !(load64(p + i) & 0x8080808080808080ull)) i += 8;
        if (i >= n) break;
        if (p[i] < 0xE0) { i += p[i] < 0x80 ? 1 : 2; continue; }
        uint32_t c;
        size_t l = utf8_seq(p + i, n - i, &c);
        if (!l) return 1;                      /* not valid: cannot happen here; be safe */
        size_t lo = 0, hi = t->n_ucd;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (t->ucd[mid][1] < c) lo = mid + 1;
            else hi = mid;
        }
        if (lo < t->n_ucd && t->ucd[lo][0] <= c) return 1;
        i += l;
    }
    return 0;
}

/* Split valid UTF-8 text p[0..n) with the pattern and emit the pieces. */
static void regex_split(enc *e, const uint8_t *p, size_t n)
{
    const pcre2_code *re = e->t->re[has_post14(e->t, p, n)];
    size_t pos = 0;
    while (pos < n && !e->err) {
        int rc = re_match(e, re, p, n, pos);
        if (rc == PCRE2_ERROR_NOMATCH) { emit_piece(e, p, pos, n); return; }
        if (rc < 0) { e->err = 1; return; }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t s = ov[0], x = ov[1];
        /* Every code point of valid text is covered by some alternative, so there are no gaps;
         * tiktoken would drop one, we keep the bytes as a piece so that decoding is exact. */
        if (s > pos) emit_piece(e, p, pos, s);
        if (x <= s) {   /* empty match: impossible with this pattern; step one code point */
            uint32_t cp;
            size_t l = utf8_seq(p + s, n - s, &cp);
            x = s + (l ? l : 1);
        }
        emit_piece(e, p, s, x);
        pos = x;
    }
}

/* Ordinary text (no specials): valid runs go through the regex, each invalid byte is a piece. */
static void ordinary(enc *e, const uint8_t *p, size_t n)
{
    size_t base0 = e->base;
    size_t off = 0;
    while (off < n && !e->err) {
        size_t v = utf8_valid_prefix(p + off, n - off);
        if (v) {
            e->base = base0 + off;
            regex_split(e, p + off, v);
            off += v;
        }
        if (off < n && !e->err) {
            e->base = base0 + off;
            emit_piece(e, p + off, 0, 1);
            off++;
        }
    }
    e->base = base0;
}

/* Leftmost special at or after from; longest at that position. */
static int find_special(const ktok *t, const uint8_t *p, size_t n, size_t from, size_t *at, const kspec **which)
{
    for (size_t i = from; i < n; i++) {
        if (!t->trie_first[p[i]]) continue;
        int32_t k = special_at(t, p + i, n - i);
        if (k >= 0) {
            *at = i;
            *which = &t->specials[k];
            return 1;
        }
    }
    return 0;
}

/* One part of the 400k/25k cut: what tiktoken's encode() sees. */
static void encode_part(enc *e, const uint8_t *p, size_t n, int allow_special)
{
    if (n == 0) return;
    if (!allow_special || e->t->n_specials == 0) { ordinary(e, p, n); return; }
    size_t pos = 0, at;
    const kspec *s;
    while (!e->err && find_special(e->t, p, n, pos, &at, &s)) {
        ordinary(e, p + pos, at - pos);
        push_id(e, s->id);
        pos = at + s->len;
    }
    if (!e->err) ordinary(e, p + pos, n - pos);
}

int ktok_encode(const ktok *t, const char *text, size_t len, int allow_special, int32_t **ids, size_t *n_ids)
{
    if (!ids || !n_ids) return -1;
    *ids = NULL;
    *n_ids = 0;
    if (!t || (!text && len)) return -1;
    if (len == 0) return 0;
    enc e;
    if (enc_init(&e, t, 0)) { enc_fini(&e); return -1; }
    const uint8_t *p = (const uint8_t *)text;
    /* _split_whitespaces_or_nonwhitespaces over 400k-code-point slices */
    size_t part = 0, slice_cp = 0, run = 0;
    int run_space = 0;
    for (size_t i = 0; i < len && !e.err;) {
        uint32_t cp = p[i];
        size_t l = cp < 0x80 ? 1 : utf8_seq(p + i, len - i, &cp);
        int sp = l ? py_isspace(cp) : 0;    /* an invalid byte: one non-space "code point" */
        if (!l) l = 1;
        if (slice_cp == KTOK_MAX_ENCODE_CHARS) {
            encode_part(&e, p + part, i - part, allow_special);
            part = i;
            slice_cp = 0;
        }
        if (slice_cp == 0) { run_space = sp; run = 0; }
        if (sp != run_space) {
            run = 1;
            run_space = sp;
        } else if (++run > KTOK_MAX_RUN_CHARS) {
            encode_part(&e, p + part, i - part, allow_special);
            part = i;
            run = 1;
        }
        slice_cp++;
        i += l;
    }
    if (!e.err) encode_part(&e, p + part, len - part, allow_special);
    if (e.err) {
        free(e.ids);
        enc_fini(&e);
        return -1;
    }
    *ids = e.ids;
    *n_ids = e.n_ids;
    enc_fini(&e);
    return 0;
}

int ktok_encode_piece(const ktok *t, const uint8_t *piece, size_t len, int32_t **ids, size_t *n_ids)
{
    if (!ids || !n_ids) return -1;
    *ids = NULL;
    *n_ids = 0;
    if (!t || (!piece && len)) return -1;
    enc e;
    memset(&e, 0, sizeof e);
    e.t = t;
    bpe(&e, piece, len);
    free(e.nx);
    free(e.pv);
    free(e.node_rank);
    free(e.pair_rank);
    free(e.heap);
    if (e.err) { free(e.ids); return -1; }
    *ids = e.ids;
    *n_ids = e.n_ids;
    return 0;
}

int ktok_split(const ktok *t, const char *text, size_t len, size_t **piece_ends, size_t *n_pieces)
{
    if (!piece_ends || !n_pieces) return -1;
    *piece_ends = NULL;
    *n_pieces = 0;
    if (!t || (!text && len)) return -1;
    if (len == 0) return 0;
    enc e;
    if (enc_init(&e, t, 1)) { enc_fini(&e); return -1; }
    ordinary(&e, (const uint8_t *)text, len);
    if (e.err) { free(e.ends); enc_fini(&e); return -1; }
    *piece_ends = e.ends;
    *n_pieces = e.n_ends;
    enc_fini(&e);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* streaming                                                                                  */

size_t ktok_utf8_complete(const uint8_t *buf, size_t len)
{
    if (!buf || len == 0) return 0;
    /* find the lead byte of the last sequence (at most 3 continuation bytes back) */
    size_t i = len, back = 0;
    while (i > 0 && back < 3 && (buf[i - 1] & 0xC0) == 0x80) { i--; back++; }
    if (i == 0) return len;                    /* only continuation bytes: invalid, pass through */
    uint8_t b = buf[i - 1];
    size_t need;
    if (b >= 0xC2 && b <= 0xDF) need = 2;
    else if (b >= 0xE0 && b <= 0xEF) need = 3;
    else if (b >= 0xF0 && b <= 0xF4) need = 4;
    else return len;                           /* ASCII or invalid lead: nothing to hold */
    size_t have = len - (i - 1);
    if (have >= need) return len;              /* complete (or invalid: excess continuations) */
    /* hold back only a valid prefix of a sequence */
    if (have >= 2) {
        uint8_t c = buf[i];
        if (b == 0xE0 && c < 0xA0) return len;
        if (b == 0xED && c >= 0xA0) return len;
        if (b == 0xF0 && c < 0x90) return len;
        if (b == 0xF4 && c >= 0x90) return len;
    }
    return i - 1;
}
