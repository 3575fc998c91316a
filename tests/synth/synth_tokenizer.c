/* Tokenizer files (spec §1.6, §6): tiktoken.model ("base64 SP rank" lines) and
 * tokenizer_config.json (added_tokens_decoder keyed by decimal id).
 *
 * Synthetic (default): ranks 0..255 are the 256 single bytes in the real file's
 * GPT-2 order (' ' = 220, '\n' = 198), then merged byte strings (common English
 * words and their prefixes, printable pairs, lowercase runs) up to the rank
 * count; specials sit at the top ids in the K3 table's relative positions:
 * vocab < 272: none; < 1024: the first 16 ([BOS], [EOS], <|end_of_msg|>,
 * <|open|>, <|close|>, <|sep|>, ...); otherwise all 256.
 * Real (--tokenizer): the rank file is copied byte for byte and the 256-entry
 * K3 table follows its ranks (163,584 ranks -> ids 163,584..163,839). */
#include "synth.h"
#include "format/errbuf.h"

#include "format/kio.h"
#include "run/text/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define K3_SPECIAL_BASE 163584
#define MAX_TOKEN 64

static int count_lines(const char *p, size_t n)
{
    int lines = 0;
    size_t i = 0;
    while (i < n) {
        size_t s = i;
        while (i < n && p[i] != '\n') i++;
        if (i > s && !(i == s + 1 && p[s] == '\r')) lines++;
        i++;
    }
    return lines;
}

int synth_tok_plan(int vocab, const char *real_path, synth_tok *tok, char *err, size_t errlen)
{
    memset(tok, 0, sizeof *tok);
    if (real_path) {
        char *buf;
        size_t len;
        if (kio_read_file(real_path, 64u << 20, &buf, &len) != 0) {
            errbuf_set(err, errlen, "--tokenizer %s: cannot read: %s", real_path, strerror(errno));
            return -1;
        }
        tok->n_ranks = count_lines(buf, len);
        free(buf);
        if (tok->n_ranks < 256) {
            errbuf_set(err, errlen, "--tokenizer %s: %d ranks; a byte-level rank file has at least 256", real_path,
                   tok->n_ranks);
            return -1;
        }
        tok->n_specials = 256;
    } else {
        if (vocab < 256) {
            errbuf_set(err, errlen, "--vocab %d: a byte-level vocabulary needs at least 256 ids", vocab);
            return -1;
        }
        tok->n_specials = vocab < 256 + 16 ? 0 : (vocab < 1024 ? 16 : 256);
        tok->n_ranks = vocab - tok->n_specials;
    }
    tok->bos_id = tok->n_specials > 0 ? tok->n_ranks : -1;
    tok->eos_id = tok->n_specials > 2 ? tok->n_ranks + 2 : -1;      /* <|end_of_msg|>, as K3's config */
    tok->media_id = tok->n_specials > 21 ? tok->n_ranks + 21 : -1;  /* <|media_pad|> */
    return 0;
}

/* ---- synthetic rank file ------------------------------------------------- */

typedef struct {
    uint8_t *arena;       /* tokens back to back */
    uint32_t *off;        /* rank -> offset in arena */
    uint8_t *len;         /* rank -> length */
    int n, want;
    uint32_t *slots;      /* open addressing: rank + 1, 0 = empty */
    size_t nslots;
    size_t arena_len, arena_cap;
} vocab_set;

static uint64_t hash_bytes(const uint8_t *p, size_t n)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 0x100000001B3ull; }
    return h;
}

/* Add a token if it is new and there is room; returns 1 when the set is full,
 * -1 when out of memory (callers stop on any non-zero). */
static int vs_add(vocab_set *v, const uint8_t *p, size_t n)
{
    size_t i;
    if (v->n >= v->want) return 1;
    if (n == 0 || n > MAX_TOKEN) return 0;
    i = (size_t)hash_bytes(p, n) & (v->nslots - 1);
    while (v->slots[i]) {
        uint32_t r = v->slots[i] - 1;
        if (v->len[r] == n && memcmp(v->arena + v->off[r], p, n) == 0) return 0;
        i = (i + 1) & (v->nslots - 1);
    }
    if (v->arena_len + n > v->arena_cap) {
        size_t cap = v->arena_cap * 2 + n;
        uint8_t *a = realloc(v->arena, cap);
        if (!a) return -1;
        v->arena = a;
        v->arena_cap = cap;
    }
    v->slots[i] = (uint32_t)v->n + 1;
    v->off[v->n] = (uint32_t)v->arena_len;
    v->len[v->n] = (uint8_t)n;
    memcpy(v->arena + v->arena_len, p, n);
    v->arena_len += n;
    v->n++;
    return v->n >= v->want;
}

/* A word and every prefix of it (longer tokens stay reachable by rank-BPE). */
static int vs_add_prefixes(vocab_set *v, const char *s)
{
    size_t n = strlen(s);
    for (size_t k = 2; k <= n; k++)
        if (vs_add(v, (const uint8_t *)s, k)) return 1;
    return 0;
}

static const char *const WORDS[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
    "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were",
    "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will", "would",
    "who", "so", "no", "she", "other", "its", "may", "these", "what", "them", "than", "some", "him", "time",
    "into", "only", "do", "could", "new", "about", "two", "first", "then", "also", "after", "any", "like",
    "should", "people", "over", "such", "our", "most", "between", "where", "through", "model", "capital",
    "France", "Paris", "The", "In", "It", "This", "A", "I", "He", "We", "They", "ing", "ed", "er", "tion",
    "ly", "es", "re", "al", "ent", "ation", "ment", "ness", "able", "ous", "ive", "ity", "return", "def",
    "int", "void", "const", "struct", "include", "import", "self", "None", "true", "false", "null", "function",
    "class", "static", "char", "uint", "size", "data", "value", "name", "string", "list", "error", "file",
};

static int build_ranks(int n_ranks, vocab_set *v)
{
    static const char alpha[] = "abcdefghijklmnopqrstuvwxyz";
    uint8_t tmp[MAX_TOKEN];
    memset(v, 0, sizeof *v);
    v->want = n_ranks;
    v->nslots = 1024;
    while (v->nslots < (size_t)n_ranks * 2) v->nslots *= 2;
    v->arena_cap = (size_t)n_ranks * 4 + MAX_TOKEN;
    v->arena = malloc(v->arena_cap);
    v->off = malloc((size_t)n_ranks * sizeof *v->off);
    v->len = malloc((size_t)n_ranks);
    v->slots = calloc(v->nslots, sizeof *v->slots);
    if (!v->arena || !v->off || !v->len || !v->slots) return -1;
    /* ranks 0..255: GPT-2 bytes_to_unicode order */
    for (int b = 0x21; b <= 0x7E; b++) { tmp[0] = (uint8_t)b; vs_add(v, tmp, 1); }
    for (int b = 0xA1; b <= 0xAC; b++) { tmp[0] = (uint8_t)b; vs_add(v, tmp, 1); }
    for (int b = 0xAE; b <= 0xFF; b++) { tmp[0] = (uint8_t)b; vs_add(v, tmp, 1); }
    for (int b = 0x00; b <= 0x20; b++) { tmp[0] = (uint8_t)b; vs_add(v, tmp, 1); }
    for (int b = 0x7F; b <= 0xA0; b++) { tmp[0] = (uint8_t)b; vs_add(v, tmp, 1); }
    tmp[0] = 0xAD;
    if (vs_add(v, tmp, 1)) goto done;
    /* common strings and their prefixes: "  ", "    ", " t", "in" first, as in the real file */
    if (vs_add(v, (const uint8_t *)"  ", 2) || vs_add(v, (const uint8_t *)"    ", 4)) goto done;
    for (size_t i = 0; i < sizeof WORDS / sizeof WORDS[0]; i++) {
        char w[MAX_TOKEN];
        snprintf(w, sizeof w, " %s", WORDS[i]);
        if (vs_add_prefixes(v, w) || vs_add_prefixes(v, WORDS[i])) goto done;
    }
    /* printable pairs */
    for (int a = 0x20; a <= 0x7E; a++)
        for (int b = 0x20; b <= 0x7E; b++) {
            tmp[0] = (uint8_t)a; tmp[1] = (uint8_t)b;
            if (vs_add(v, tmp, 2)) goto done;
        }
    /* lowercase runs of growing length, with and without a leading space */
    for (int k = 2; k < MAX_TOKEN - 1; k++) {
        for (int sp = 1; sp >= 0; sp--) {
            int idx[MAX_TOKEN] = {0};
            for (;;) {
                int n = 0;
                if (sp) tmp[n++] = ' ';
                for (int i = 0; i < k; i++) tmp[n++] = (uint8_t)alpha[idx[i]];
                if (vs_add(v, tmp, (size_t)n)) goto done;
                int i = k - 1;
                while (i >= 0 && ++idx[i] == 26) idx[i--] = 0;
                if (i < 0) break;
            }
        }
    }
done:
    return v->n == v->want ? 0 : -1;
}

static void vs_free(vocab_set *v)
{
    free(v->arena); free(v->off); free(v->len); free(v->slots);
    memset(v, 0, sizeof *v);
}

static size_t b64(const uint8_t *p, size_t n, char *out)
{
    static const char T[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0, i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t x = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        out[o++] = T[x >> 18]; out[o++] = T[(x >> 12) & 63]; out[o++] = T[(x >> 6) & 63]; out[o++] = T[x & 63];
    }
    if (n - i == 1) {
        uint32_t x = (uint32_t)p[i] << 16;
        out[o++] = T[x >> 18]; out[o++] = T[(x >> 12) & 63]; out[o++] = '='; out[o++] = '=';
    } else if (n - i == 2) {
        uint32_t x = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
        out[o++] = T[x >> 18]; out[o++] = T[(x >> 12) & 63]; out[o++] = T[(x >> 6) & 63]; out[o++] = '=';
    }
    return o;
}

static int synthetic_rank_file(int n_ranks, char **out, size_t *outlen)
{
    vocab_set v;
    char *buf = NULL;
    size_t cap, o = 0;
    if (build_ranks(n_ranks, &v) != 0) { vs_free(&v); return -1; }
    cap = (size_t)n_ranks * (4 * ((MAX_TOKEN + 2) / 3) + 16);
    buf = malloc(cap);
    if (!buf) { vs_free(&v); return -1; }
    for (int r = 0; r < v.n; r++) {
        o += b64(v.arena + v.off[r], v.len[r], buf + o);
        o += (size_t)snprintf(buf + o, cap - o, " %d\n", r);
    }
    vs_free(&v);
    *out = buf;
    *outlen = o;
    return 0;
}

/* ---- specials ------------------------------------------------------------- */

/* The K3 table moved to start at `base`, first `count` entries; reserved names
 * follow their new absolute ids. */
static int special_table(int base, int count, ktok_special **out, size_t *nout)
{
    ktok_special *k3 = NULL, *list = NULL;
    size_t nk3 = 0, n = 0;
    *out = NULL;
    *nout = 0;
    if (count == 0) return 0;
    if (ktok_specials_builtin("k3", &k3, &nk3) != 0) return -1;
    list = calloc(nk3, sizeof *list);
    if (!list) { ktok_specials_free(k3, nk3); return -1; }
    for (size_t i = 0; i < nk3; i++) {
        int32_t rel = k3[i].id - K3_SPECIAL_BASE;
        if (rel < 0 || rel >= count || strncmp(k3[i].text, "<|reserved_token_", 17) == 0) continue;
        size_t l = strlen(k3[i].text);
        char *t = malloc(l + 1);
        if (!t) { ktok_specials_free(list, n); ktok_specials_free(k3, nk3); return -1; }
        memcpy(t, k3[i].text, l + 1);
        list[n].id = base + rel;
        list[n].text = t;
        n++;
    }
    ktok_specials_free(k3, nk3);
    if (ktok_specials_fill_reserved(&list, &n, base, count) != 0) { ktok_specials_free(list, n); return -1; }
    *out = list;
    *nout = n;
    return 0;
}

static const char *find_text(const ktok_special *s, size_t n, const char *text)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(s[i].text, text) == 0) return s[i].text;
    return NULL;
}

static char *tokenizer_config(const ktok_special *s, size_t n)
{
    json_t *root = json_object(), *dec = json_object();
    int e = !root || !dec;
    char *out = NULL;
    static const struct { const char *key, *text; } named[] = {
        {"bos_token", "[BOS]"}, {"eos_token", "[EOS]"}, {"unk_token", "[UNK]"}, {"pad_token", "[PAD]"},
    };
    for (size_t i = 0; !e && i < n; i++) {
        char id[16];
        json_t *t = json_pack("{s:s,s:b,s:b,s:b,s:b,s:b}", "content", s[i].text, "lstrip", 0, "normalized", 0,
                              "rstrip", 0, "single_word", 0, "special", 1);
        snprintf(id, sizeof id, "%d", (int)s[i].id);
        e |= !t || json_object_set_new(dec, id, t) != 0;
    }
    if (!e) { e |= json_object_set_new(root, "added_tokens_decoder", dec) != 0; dec = NULL; }
    for (size_t i = 0; !e && i < sizeof named / sizeof named[0]; i++) {
        const char *t = find_text(s, n, named[i].text);
        if (t) e |= json_object_set_new(root, named[i].key, json_string(t)) != 0;
    }
    if (!e) {
        e |= json_object_set_new(root, "clean_up_tokenization_spaces", json_false()) != 0;
        e |= json_object_set_new(root, "model_max_length", json_integer(1048576)) != 0;
        e |= json_object_set_new(root, "tokenizer_class", json_string("TikTokenTokenizer")) != 0;
        e |= json_object_set_new(root, "auto_map",
                                 json_pack("{s:[s,n]}", "AutoTokenizer", "tokenization_kimi.TikTokenTokenizer")) != 0;
    }
    if (!e) out = json_dumps(root, JSON_INDENT(2));
    json_decref(dec);
    json_decref(root);
    return out;
}

int synth_tok_write(const char *outdir, const char *real_path, const synth_tok *tok, char *err, size_t errlen)
{
    char *ranks = NULL, *cfg = NULL, path[4096];
    size_t rlen = 0;
    ktok_special *sp = NULL;
    size_t nsp = 0;
    ktok *kt = NULL;
    krun_err kerr = {0, ""};
    int rc = -1;

    if (real_path) {
        if (kio_read_file(real_path, 64u << 20, &ranks, &rlen) != 0) {
            errbuf_set(err, errlen, "--tokenizer %s: cannot read: %s", real_path, strerror(errno));
            goto out;
        }
    } else if (synthetic_rank_file(tok->n_ranks, &ranks, &rlen) != 0) {
        errbuf_set(err, errlen, "cannot build a synthetic vocabulary of %d ranks", tok->n_ranks);
        goto out;
    }
    if (special_table(tok->n_ranks, tok->n_specials, &sp, &nsp) != 0) {
        errbuf_set(err, errlen, "cannot build the special-token table");
        goto out;
    }
    /* self-check with krun's own loader before writing anything */
    kt = ktok_load(ranks, rlen, sp, nsp, &kerr);
    if (!kt) {
        errbuf_set(err, errlen, "%s: the tokenizer does not load: %s", real_path ? real_path : "synthetic tokenizer", kerr.msg);
        goto out;
    }
    if (ktok_n_ranks(kt) != (size_t)tok->n_ranks || ktok_vocab_size(kt) != (size_t)(tok->n_ranks + tok->n_specials)) {
        errbuf_set(err, errlen, "tokenizer: %zu ranks / vocab %zu, expected %d / %d", ktok_n_ranks(kt),
               ktok_vocab_size(kt), tok->n_ranks, tok->n_ranks + tok->n_specials);
        goto out;
    }
    cfg = tokenizer_config(sp, nsp);
    if (!cfg) {
        errbuf_set(err, errlen, "cannot build tokenizer_config.json");
        goto out;
    }
    snprintf(path, sizeof path, "%s/tiktoken.model", outdir);
    if (synth_write_file(path, ranks, rlen, err, errlen) != 0) goto out;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", outdir);
    {
        size_t l = strlen(cfg);
        char *c2 = realloc(cfg, l + 2);
        if (!c2) { errbuf_set(err, errlen, "out of memory"); goto out; }
        cfg = c2;
        cfg[l] = '\n';
        cfg[l + 1] = 0;
        if (synth_write_file(path, cfg, l + 1, err, errlen) != 0) goto out;
    }
    rc = 0;
out:
    if (kt) ktok_free(kt);
    ktok_specials_free(sp, nsp);
    free(ranks);
    free(cfg);
    return rc;
}
