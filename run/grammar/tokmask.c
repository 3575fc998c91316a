/* Token masks for constrained decoding (tokmask.h). */
#include "tokmask.h"

#include "run/text/chat.h"
#include "run/util/krun_err.h"

#include <stdlib.h>
#include <string.h>

#define KCUM 32               /* cumulative bit sets for tokens adding 0..KCUM characters */

/* A trie in depth-first order: node i's subtree is [i, end[i]); its children are i+1, end[i+1], ...
 * Node 0 is the root (no byte).  A node's tokens are tok[tok_first[i] .. tok_first[i+1]). */
typedef struct {
    uint8_t *byte;
    uint32_t *end;
    uint32_t *tok_first;      /* n + 1 entries */
    int32_t *tok;             /* token ids */
    uint16_t *tok_chars;      /* characters each adds before the rest (the exit trie) */
    size_t n, n_tok;
} trie;

/* A text kind's table from a character boundary (KG_TEXT_JSON, KG_TEXT_RAW, KG_TEXT_ATTR). */
typedef struct {
    uint64_t *cum;            /* [(KCUM + 1) * words]: tokens staying inside with <= k characters */
    uint64_t *inside;         /* [words]: all tokens staying inside */
    int32_t *longer;          /* tokens staying inside with more than KCUM characters, fewest first */
    uint16_t *longer_chars;
    size_t n_longer;
    int32_t max_chars;        /* the most characters a token staying inside adds */
    trie exit;                /* JSON, ATTR: the rest of each token that ends the text, after its quote */
} text_table;

struct kmask_index {
    const ktok *tk;           /* borrowed: the model's */
    size_t vocab, words;
    trie t;
    uint64_t *text;           /* every text token */
    text_table json, raw, attr;
    int32_t marker[4];        /* ids of <|open|> <|close|> <|sep|> <|end_of_msg|>, -1 if absent */
    size_t bytes;
};

struct kmask {
    const kmask_index *ix;
    const kgram *g;
    kg_set cur, tmp;
    uint32_t *cur_w, *tmp_w;
    uint32_t *arena;          /* the walk's sets, level after level */
    size_t arena_cap;
    uint32_t *gen_w;          /* the threads that walk the trie (KG_SET_WORDS) */
    uint64_t *bits;           /* the caller's, during kmask_allowed */
    long count;
    uint64_t steps;           /* trie nodes walked, in all */
    int oom;
};

/* ---- building the index ------------------------------------------------------------------- */

typedef struct { const uint8_t *p; size_t len; int32_t id; uint16_t chars; } entry;

static int entry_cmp(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = n ? memcmp(x->p, y->p, n) : 0;
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static void trie_free(trie *t)
{
    free(t->byte);
    free(t->end);
    free(t->tok_first);
    free(t->tok);
    free(t->tok_chars);
    memset(t, 0, sizeof *t);
}

/* The trie of the entries (sorted), each entry's id at the node its bytes end at. */
static int trie_build(trie *t, entry *e, size_t n)
{
    size_t nodes = 1, cap;
    uint32_t *stack = NULL;
    size_t sp = 0;
    memset(t, 0, sizeof *t);
    for (size_t i = 0; i < n; i++) {
        size_t l = 0;
        if (i) while (l < e[i].len && l < e[i - 1].len && e[i].p[l] == e[i - 1].p[l]) l++;
        nodes += e[i].len - l;
    }
    cap = nodes;
    t->byte = malloc(cap);
    t->end = malloc(cap * sizeof *t->end);
    t->tok_first = calloc(cap + 1, sizeof *t->tok_first);
    t->tok = malloc((n ? n : 1) * sizeof *t->tok);
    t->tok_chars = malloc((n ? n : 1) * sizeof *t->tok_chars);
    stack = malloc((cap + 1) * sizeof *stack);       /* the open nodes, one per depth */
    if (!t->byte || !t->end || !t->tok_first || !t->tok || !t->tok_chars || !stack) { free(stack); trie_free(t); return -1; }
    /* node 0: the root */
    t->byte[0] = 0;
    t->n = 1;
    stack[sp++] = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = 0;
        if (i) while (l < e[i].len && l < e[i - 1].len && e[i].p[l] == e[i - 1].p[l]) l++;
        if (i && l == e[i].len && l == e[i - 1].len) {
            /* the same bytes as the previous entry: one more token at its node */
        } else {
            /* close the nodes deeper than the common prefix */
            while (sp > l + 1) t->end[stack[--sp]] = (uint32_t)t->n;
            for (size_t d = l; d < e[i].len; d++) {
                t->byte[t->n] = e[i].p[d];
                stack[sp++] = (uint32_t)t->n;
                t->n++;
            }
        }
        /* tokens of node k are counted in tok_first[k + 1], made cumulative below */
        t->tok_first[stack[sp - 1] + 1]++;
        t->tok[t->n_tok] = e[i].id;
        t->tok_chars[t->n_tok++] = e[i].chars;
    }
    while (sp) t->end[stack[--sp]] = (uint32_t)t->n;
    for (size_t k = 0; k < t->n; k++) t->tok_first[k + 1] += t->tok_first[k];
    free(stack);
    return 0;
}

static size_t trie_bytes(const trie *t) { return t->n * (1 + 4 + 4) + t->n_tok * 6; }

static void bit_set(uint64_t *b, size_t i) { b[i >> 6] |= 1ull << (i & 63); }

/* The fate of every text token from a character boundary of kind k. */
static int table_build(kmask_index *ix, const ktok *tk, kg_body_kind kind, text_table *tt)
{
    size_t W = ix->words, n_exit = 0, n_long = 0;
    entry *ex = NULL;
    int rc = -1;
    tt->cum = calloc((KCUM + 1) * W, sizeof *tt->cum);
    tt->inside = calloc(W, sizeof *tt->inside);
    ex = malloc(ix->vocab * sizeof *ex);
    tt->longer = malloc(ix->vocab * sizeof *tt->longer);
    tt->longer_chars = malloc(ix->vocab * sizeof *tt->longer_chars);
    if (!tt->cum || !tt->inside || !ex || !tt->longer || !tt->longer_chars) goto out;
    for (size_t id = 0; id < ix->vocab; id++) {
        size_t len, i;
        const uint8_t *b;
        uint32_t sub = 0;
        int32_t chars = 0;
        int r = 1;
        if (!(ix->text[id >> 6] & (1ull << (id & 63)))) continue;
        b = ktok_id_bytes(tk, (int32_t)id, &len);
        for (i = 0; i < len && r == 1; i++) r = kg_text_byte(kind, &sub, &chars, 0, KG_INF, b[i]);
        if (r == 0) continue;
        if (chars > 65535) continue;          /* cannot be: a token is at most a few hundred bytes */
        if (r == 2) {
            ex[n_exit++] = (entry){b + i, len - i, (int32_t)id, (uint16_t)chars};
            continue;
        }
        bit_set(tt->inside, id);
        if (chars > tt->max_chars) tt->max_chars = chars;
        if (chars <= KCUM) {
            bit_set(tt->cum + (size_t)chars * W, id);      /* made cumulative below */
        } else {
            tt->longer[n_long] = (int32_t)id;
            tt->longer_chars[n_long++] = (uint16_t)chars;
        }
    }
    for (size_t k = 1; k <= KCUM; k++)
        for (size_t w = 0; w < W; w++) tt->cum[k * W + w] |= tt->cum[(k - 1) * W + w];
    tt->n_longer = n_long;
    /* fewest characters first (insertion sort: a few hundred long tokens) */
    for (size_t i = 1; i < n_long; i++)
        for (size_t j = i; j > 0 && tt->longer_chars[j - 1] > tt->longer_chars[j]; j--) {
            int32_t t = tt->longer[j]; uint16_t c = tt->longer_chars[j];
            tt->longer[j] = tt->longer[j - 1]; tt->longer_chars[j] = tt->longer_chars[j - 1];
            tt->longer[j - 1] = t; tt->longer_chars[j - 1] = c;
        }
    qsort(ex, n_exit, sizeof *ex, entry_cmp);
    if (trie_build(&tt->exit, ex, n_exit)) goto out;
    ix->bytes += (KCUM + 2) * W * 8 + n_long * 6 + trie_bytes(&tt->exit);
    rc = 0;
out:
    free(ex);
    return rc;
}

static void table_free(text_table *tt)
{
    free(tt->cum);
    free(tt->inside);
    free(tt->longer);
    free(tt->longer_chars);
    trie_free(&tt->exit);
}

kmask_index *kmask_index_new(const ktok *tk, size_t vocab, krun_err *err)
{
    static const char *const mk[4] = {KCHAT_OPEN, KCHAT_CLOSE, KCHAT_SEP, KCHAT_END_OF_MSG};
    kmask_index *ix = calloc(1, sizeof *ix);
    entry *e = NULL;
    size_t n = 0;
    if (!ix) goto oom;
    ix->tk = tk;
    ix->vocab = vocab;
    ix->words = (vocab + 63) / 64;
    ix->text = calloc(ix->words, sizeof *ix->text);
    e = malloc((vocab ? vocab : 1) * sizeof *e);
    if (!ix->text || !e) goto oom;
    for (size_t id = 0; id < vocab; id++) {
        size_t len;
        const uint8_t *b = ktok_id_bytes(tk, (int32_t)id, &len);
        if (!b || !len || ktok_is_special(tk, (int32_t)id)) continue;
        bit_set(ix->text, id);
        e[n++] = (entry){b, len, (int32_t)id, 0};
    }
    qsort(e, n, sizeof *e, entry_cmp);
    if (trie_build(&ix->t, e, n)) goto oom;
    free(e);
    e = NULL;
    ix->bytes = sizeof *ix + ix->words * 8 + trie_bytes(&ix->t);
    if (table_build(ix, tk, KG_TEXT_JSON, &ix->json) || table_build(ix, tk, KG_TEXT_RAW, &ix->raw) ||
        table_build(ix, tk, KG_TEXT_ATTR, &ix->attr))
        goto oom;
    for (int k = 0; k < 4; k++) {
        int32_t id = ktok_find_special(tk, mk[k]);
        ix->marker[k] = id >= 0 && (size_t)id < vocab ? id : -1;
    }
    return ix;
oom:
    free(e);
    kmask_index_free(ix);
    krun_err_set(err, KRUN_ENOMEM, "out of memory building the token index for constrained decoding");
    return NULL;
}

void kmask_index_free(kmask_index *ix)
{
    if (!ix) return;
    trie_free(&ix->t);
    free(ix->text);
    table_free(&ix->json);
    table_free(&ix->raw);
    table_free(&ix->attr);
    free(ix);
}

size_t kmask_index_vocab(const kmask_index *ix) { return ix->vocab; }
size_t kmask_index_bytes(const kmask_index *ix) { return ix->bytes; }

/* ---- a sequence ------------------------------------------------------------------------------ */

kmask *kmask_new(const kmask_index *ix, const kgram *g)
{
    kmask *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->ix = ix;
    m->g = g;
    m->cur_w = malloc(KG_SET_WORDS * sizeof *m->cur_w);
    m->tmp_w = malloc(KG_SET_WORDS * sizeof *m->tmp_w);
    m->gen_w = malloc(KG_SET_WORDS * sizeof *m->gen_w);
    if (!m->cur_w || !m->tmp_w || !m->gen_w) { kmask_free(m); return NULL; }
    m->cur = (kg_set){m->cur_w, 0, KG_SET_WORDS, 0};
    m->tmp = (kg_set){m->tmp_w, 0, KG_SET_WORDS, 0};
    kgram_start(g, &m->cur);
    return m;
}

void kmask_free(kmask *m)
{
    if (!m) return;
    free(m->cur_w);
    free(m->tmp_w);
    free(m->gen_w);
    free(m->arena);
    free(m);
}

int kmask_complete(const kmask *m) { return kgram_accepts(m->g, &m->cur); }
uint64_t kmask_steps(const kmask *m) { return m->steps; }
const kg_set *kmask_state(const kmask *m) { return &m->cur; }

static void allow(kmask *m, int32_t id)
{
    uint64_t bit = 1ull << (id & 63), *w = &m->bits[id >> 6];
    if (!(*w & bit)) { *w |= bit; m->count++; }
}

/* Room in the arena for a set at word offset at. */
static int arena_room(kmask *m, size_t at)
{
    size_t need = at + KG_SET_WORDS;
    if (need <= m->arena_cap) return 0;
    {
        size_t cap = m->arena_cap ? m->arena_cap : KG_SET_WORDS * 4;
        uint32_t *a;
        while (cap < need) cap *= 2;
        a = realloc(m->arena, cap * sizeof *a);
        if (!a) { m->oom = 1; return -1; }
        m->arena = a;
        m->arena_cap = cap;
    }
    return 0;
}

/* One level of the walk: a trie node, the state after its bytes (in the arena at `at`, n words),
 * the bytes that may follow, and the next child to look at. */
typedef struct { uint32_t node, child; size_t at, n; unsigned threads; uint8_t first[32]; } level;

/* Walk trie t from its root with the state s (copied into the arena): every token whose bytes
 * continue s is allowed, if chars_ok allows its characters. */
static void walk(kmask *m, const trie *t, const kg_set *s, int32_t room, int32_t need)
{
    level lv[300];
    int d = 0;
    if (!t->n || !s->threads || arena_room(m, 0)) return;
    memcpy(m->arena, s->w, s->n * sizeof *s->w);
    lv[0] = (level){0, 1, 0, s->n, s->threads, {0}};
    kgram_first_bytes(m->g, s, lv[0].first);
    for (uint32_t k = t->tok_first[0]; k < t->tok_first[1]; k++)      /* the root's tokens: nothing more to walk */
        if (t->tok_chars[k] <= room && t->tok_chars[k] >= need) allow(m, t->tok[k]);
    while (d >= 0) {
        level *L = &lv[d];
        uint32_t c = L->child;
        kg_set in, out;
        uint8_t b;
        if (c >= t->end[L->node]) { d--; continue; }
        L->child = t->end[c];
        b = t->byte[c];
        if (!(L->first[b >> 3] & (1u << (b & 7)))) continue;
        if (arena_room(m, L->at + L->n)) return;
        in = (kg_set){m->arena + L->at, L->n, L->n, L->threads};
        out = (kg_set){m->arena + L->at + L->n, 0, KG_SET_WORDS, 0};
        kgram_step(m->g, &in, b, &out);
        m->steps++;
        if (!out.threads) continue;
        for (uint32_t k = t->tok_first[c]; k < t->tok_first[c + 1]; k++)
            if (t->tok_chars[k] <= room && t->tok_chars[k] >= need) allow(m, t->tok[k]);
        if (t->end[c] > c + 1 && d + 1 < (int)(sizeof lv / sizeof *lv)) {
            level *N = &lv[++d];
            N->node = c;
            N->child = c + 1;
            N->at = L->at + L->n;
            N->n = out.n;
            N->threads = out.threads;
            kgram_first_bytes(m->g, &out, N->first);
        }
    }
}

static void or_bits(kmask *m, const uint64_t *src)
{
    for (size_t w = 0; w < m->ix->words; w++) {
        uint64_t add = src[w] & ~m->bits[w];
        m->bits[w] |= add;
        m->count += __builtin_popcountll(add);
    }
}

/* A thread resting inside a text (JSON string, raw text, attribute value), at a character boundary
 * with `chars` characters: the tokens that stay inside (from the table), and for a text a quote
 * ends, those that close it and go on (their rest walked from the state after the quote). */
static void from_table(kmask *m, const text_table *tt, kg_body_kind kind, const uint32_t *thread, size_t len)
{
    const kmask_index *ix = m->ix;
    const uint32_t *top = thread + len - 3;
    const kg_node *x = kgram_node(m->g, top[0]);
    int32_t chars = (int32_t)top[1], room = x->hi - chars;
    if (room >= tt->max_chars) {
        or_bits(m, tt->inside);
    } else if (room >= 0) {
        or_bits(m, tt->cum + (size_t)(room < KCUM ? room : KCUM) * ix->words);
        for (size_t k = 0; k < tt->n_longer && tt->longer_chars[k] <= room; k++) allow(m, tt->longer[k]);
    }
    if (kind != KG_TEXT_RAW) {
        /* after the closing quote: the thread with enough characters to close, stepped by '"' */
        uint32_t one[KG_THREAD_WORDS(KG_MAX_DEPTH)];
        kg_set s1 = {one, len, len, 1}, s2 = {m->tmp.w, 0, KG_SET_WORDS, 0};   /* (m->cur holds the state) */
        int32_t need = x->lo - chars;
        memcpy(one, thread, len * sizeof *one);
        one[len - 2] = (uint32_t)(chars > x->lo ? chars : x->lo);
        kgram_step(m->g, &s1, '"', &s2);
        walk(m, &tt->exit, &s2, room < 0 ? -1 : room, need < 0 ? 0 : need);
    }
}

long kmask_allowed(kmask *m, uint64_t *bits)
{
    const kmask_index *ix = m->ix;
    kg_set gen = {m->gen_w, 0, KG_SET_WORDS, 0};
    m->bits = bits;
    m->count = 0;
    m->oom = 0;
    memset(bits, 0, ix->words * sizeof *bits);
    /* threads a table answers; the others walk the trie together */
    for (size_t i = 0; i < m->cur.n;) {
        size_t len = KG_THREAD_WORDS(m->cur.w[i]);
        const uint32_t *t = m->cur.w + i, *top = t + len - 3;
        const kg_node *x = kgram_node(m->g, top[0]);
        i += len;
        if (x->kind == KG_BODY && x->arg == KG_TEXT_FREE) {
            or_bits(m, ix->text);
        } else if (x->kind == KG_BODY && top[2] == 0) {
            from_table(m, x->arg == KG_TEXT_JSON ? &ix->json : x->arg == KG_TEXT_RAW ? &ix->raw : &ix->attr, (kg_body_kind)x->arg, t, len);
        } else if (x->kind != KG_SYM && x->kind != KG_ACCEPT) {
            memcpy(gen.w + gen.n, t, len * sizeof *t);
            gen.n += len;
            gen.threads++;
        }
    }
    walk(m, &ix->t, &gen, KG_INF, 0);
    for (int k = 0; k < 4; k++) {
        if (ix->marker[k] < 0) continue;
        kgram_step(m->g, &m->cur, KG_SYM_OPEN + k, &m->tmp);
        if (m->tmp.threads) allow(m, ix->marker[k]);
    }
    return m->oom ? -1 : m->count;
}

/* The state after sym, if it continues the text: swapped in. */
static int take_sym(kmask *m, int sym)
{
    kg_set t;
    kgram_step(m->g, &m->cur, sym, &m->tmp);
    if (!m->tmp.threads) return -1;
    t = m->cur;
    m->cur = m->tmp;
    m->tmp = t;
    return 0;
}

int kmask_take(kmask *m, int32_t id)
{
    const kmask_index *ix = m->ix;
    const uint8_t *p;
    size_t len;
    kg_set save;
    for (int k = 0; k < 4; k++)
        if (id == ix->marker[k]) return take_sym(m, KG_SYM_OPEN + k);
    if (id < 0 || (size_t)id >= ix->vocab || !(ix->text[id >> 6] & (1ull << (id & 63)))) return -1;
    p = ktok_id_bytes(ix->tk, id, &len);
    /* byte by byte through the two buffers; on a dead end, the state before the token comes back */
    save = m->cur;
    memcpy(m->gen_w, m->cur.w, m->cur.n * sizeof *m->gen_w);
    for (size_t i = 0; i < len; i++)
        if (take_sym(m, p[i])) {
            memcpy(m->cur.w, m->gen_w, save.n * sizeof *m->gen_w);
            m->cur.n = save.n;
            m->cur.threads = save.threads;
            return -1;
        }
    return 0;
}
