/* Grammars for constrained decoding (kgram.h): building, what each node needs to finish, and
 * stepping sets of threads. */
#include "kgram.h"

#include <stdlib.h>
#include <string.h>

struct kgram {
    kg_node *nodes;
    size_t n, cap;
    uint8_t (*sets)[32];         /* byte sets; 0..255 are the single bytes */
    size_t n_sets, cap_sets;
    uint32_t *rules;             /* start node of each rule (0 until its body is set) */
    size_t n_rules, cap_rules;
    int32_t *need;               /* kgram_finish: frames beyond its own a way from the node to the end needs */
    uint32_t start, ret, accept;
    int oom, finished;
};

/* ---- building --------------------------------------------------------------------------- */

static int grow(void **p, size_t *cap, size_t need, size_t size)
{
    size_t c;
    void *q;
    if (need <= *cap) return 0;
    c = *cap ? *cap * 2 : 64;
    while (c < need) c *= 2;
    q = realloc(*p, c * size);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

uint32_t kg_node_new(kgram *g, kg_kind kind, uint32_t next, uint32_t alt, int32_t lo, int32_t hi)
{
    kg_node *x;
    if (g->oom || grow((void **)&g->nodes, &g->cap, g->n + 1, sizeof *g->nodes)) { g->oom = 1; return 0; }
    x = &g->nodes[g->n];
    memset(x, 0, sizeof *x);
    x->kind = (uint8_t)kind;
    x->next = next;
    x->alt = alt;
    x->lo = lo;
    x->hi = hi;
    return (uint32_t)g->n++;
}

kgram *kgram_new(void)
{
    kgram *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    kg_node_new(g, KG_FAIL, 0, 0, 0, 0);                 /* node 0 */
    g->ret = kg_node_new(g, KG_RET, 0, 0, 0, 0);
    g->accept = kg_node_new(g, KG_ACCEPT, 0, 0, 0, 0);
    if (!grow((void **)&g->sets, &g->cap_sets, 256, sizeof *g->sets)) {
        memset(g->sets, 0, 256 * sizeof *g->sets);
        for (int b = 0; b < 256; b++) g->sets[b][b >> 3] = (uint8_t)(1u << (b & 7));
        g->n_sets = 256;
    } else {
        g->oom = 1;
    }
    return g;
}

void kgram_free(kgram *g)
{
    if (!g) return;
    free(g->nodes);
    free(g->sets);
    free(g->rules);
    free(g->need);
    free(g);
}

int kgram_oom(const kgram *g) { return g->oom; }
uint32_t kg_fail(kgram *g) { (void)g; return 0; }
uint32_t kg_ret(kgram *g) { return g->ret; }
uint32_t kg_accept(kgram *g) { return g->accept; }

uint32_t kg_byteset(kgram *g, const uint8_t set[32], uint32_t next)
{
    size_t k, ones = 0, last = 0;
    uint32_t n;
    for (k = 0; k < 32; k++)
        if (set[k]) { ones += (size_t)__builtin_popcount(set[k]); last = k * 8 + (size_t)(31 - __builtin_clz(set[k])); }
    if (!ones) return 0;
    if (ones == 1) return kg_byte(g, (uint8_t)last, next);      /* the single bytes are sets 0..255 */
    for (k = 256; k < g->n_sets; k++)
        if (!memcmp(g->sets[k], set, 32)) break;
    if (k == g->n_sets) {
        if (k >= 65535 || grow((void **)&g->sets, &g->cap_sets, k + 1, sizeof *g->sets)) { g->oom = 1; return 0; }
        memcpy(g->sets[k], set, 32);
        g->n_sets++;
    }
    n = kg_node_new(g, KG_BYTES, next, 0, 0, 0);
    if (n) g->nodes[n].set = (uint16_t)k;
    return n;
}

uint32_t kg_byte(kgram *g, uint8_t b, uint32_t next)
{
    uint32_t n = kg_node_new(g, KG_BYTES, next, 0, 0, 0);
    if (n) g->nodes[n].set = b;
    return n;
}

uint32_t kg_range(kgram *g, uint8_t lo, uint8_t hi, uint32_t next)
{
    uint8_t set[32] = {0};
    for (unsigned b = lo; b <= hi; b++) set[b >> 3] |= (uint8_t)(1u << (b & 7));
    return kg_byteset(g, set, next);
}

uint32_t kg_lit(kgram *g, const char *s, size_t n, uint32_t next)
{
    while (n--) next = kg_byte(g, (uint8_t)s[n], next);
    return next;
}

uint32_t kg_sym(kgram *g, int sym, uint32_t next)
{
    uint32_t n = kg_node_new(g, KG_SYM, next, 0, 0, 0);
    if (n) g->nodes[n].arg = (uint8_t)(sym - 256);
    return n;
}

uint32_t kg_body(kgram *g, kg_body_kind kind, int32_t lo, int32_t hi, uint32_t next)
{
    uint32_t n;
    if (kind == KG_TEXT_FREE) lo = 0, hi = KG_INF;
    n = kg_node_new(g, KG_BODY, next, 0, lo, hi);
    if (n) g->nodes[n].arg = (uint8_t)kind;
    return n;
}

uint32_t kg_split(kgram *g, uint32_t a, uint32_t b)
{
    if (!a) return b;                 /* an alternative that cannot be: the other one */
    if (!b) return a;
    return kg_node_new(g, KG_SPLIT, a, b, 0, 0);
}

void kg_set_next(kgram *g, uint32_t node, uint32_t next, uint32_t alt)
{
    if (!node || node >= g->n) return;
    g->nodes[node].next = next;
    g->nodes[node].alt = alt;
}

uint32_t kg_rule_new(kgram *g)
{
    if (g->oom || grow((void **)&g->rules, &g->cap_rules, g->n_rules + 1, sizeof *g->rules)) { g->oom = 1; return 0; }
    g->rules[g->n_rules] = 0;
    return (uint32_t)g->n_rules++;
}

void kg_rule_body(kgram *g, uint32_t rule, uint32_t start)
{
    if (rule < g->n_rules) g->rules[rule] = start;
}

uint32_t kg_call(kgram *g, uint32_t rule, uint32_t next)
{
    return kg_node_new(g, KG_CALL, next, 0, (int32_t)rule, 0);
}

/* ---- what each node needs ---------------------------------------------------------------- */

static int32_t need_max(int32_t a, int32_t b) { return a > b ? a : b; }

/* need[n]: the frames beyond its own that the cheapest way from n to KG_RET or KG_ACCEPT opens at
 * once (a call of rule r opens 1 + need[start of r]); KG_INF if there is none within
 * KG_MAX_DEPTH.  Values only fall from KG_INF, so repeating the passes until nothing changes
 * gives the least solution (a loop is never the way out). */
static int32_t need_of(const kgram *g, const kg_node *x)
{
    const int32_t *need = g->need;
    int32_t v;
    switch ((kg_kind)x->kind) {
    case KG_FAIL: return KG_INF;
    case KG_RET: case KG_ACCEPT: return 0;
    case KG_BODY: return x->lo <= x->hi ? need[x->next] : KG_INF;
    case KG_SPLIT: return need[x->next] < need[x->alt] ? need[x->next] : need[x->alt];
    case KG_CALL: {
        uint32_t s = (size_t)x->lo < g->n_rules ? g->rules[x->lo] : 0;
        v = need[s] >= KG_INF ? KG_INF : 1 + need[s];
        return need_max(v, need[x->next]);
    }
    case KG_CLT: return x->hi > 0 ? need[x->next] : KG_INF;
    case KG_CGE: return x->lo > 0 ? need_max(need[x->next], need[x->alt]) : need[x->next];
    default: return need[x->next];
    }
}

int kgram_finish(kgram *g, uint32_t start)
{
    int changed = 1;
    if (g->oom) return -1;
    free(g->need);
    g->need = malloc(g->n * sizeof *g->need);
    if (!g->need) { g->oom = 1; return -1; }
    for (size_t i = 0; i < g->n; i++) g->need[i] = KG_INF;
    for (size_t i = 0; i < g->n; i++) {
        /* every edge stays inside the graph (a node made out of order by a failed allocation is 0) */
        kg_node *x = &g->nodes[i];
        if (x->next >= g->n) x->next = 0;
        if (x->alt >= g->n) x->alt = 0;
        if (x->kind == KG_CALL && (size_t)x->lo >= g->n_rules) x->kind = KG_FAIL;
    }
    /* nodes are made back to front (a node's next is older than it): oldest first, most settle in one pass */
    while (changed) {
        changed = 0;
        for (size_t i = 0; i < g->n; i++) {
            int32_t v = need_of(g, &g->nodes[i]);
            if (v > KG_MAX_DEPTH) v = KG_INF;
            if (v < g->need[i]) { g->need[i] = v; changed = 1; }
        }
    }
    g->start = start;
    g->finished = 1;
    return g->need[start] < KG_MAX_DEPTH ? 0 : -1;     /* a first frame, and what it needs */
}

const kg_node *kgram_node(const kgram *g, uint32_t n) { return &g->nodes[n]; }
size_t kgram_n_nodes(const kgram *g) { return g->n; }
const uint8_t *kgram_byteset(const kgram *g, uint16_t set) { return g->sets[set]; }

/* ---- the text machine ---------------------------------------------------------------------- */

enum { S_NORMAL, S_C1, S_C2, S_C3, S_E0, S_ED, S_F0, S_F4, S_ESC, S_U1, S_U2D, S_U2, S_U3, S_U4, S_U2Z, S_U3Z, S_U4Z };

static int is_hex(uint8_t b) { return (b >= '0' && b <= '9') || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

/* A UTF-8 lead byte (>= 0x80): the state after it, or -1. */
static int utf8_lead(uint8_t b)
{
    if (b >= 0xc2 && b <= 0xdf) return S_C1;
    if (b == 0xe0) return S_E0;
    if (b == 0xed) return S_ED;
    if (b >= 0xe1 && b <= 0xef) return S_C2;
    if (b == 0xf0) return S_F0;
    if (b == 0xf4) return S_F4;
    if (b >= 0xf1 && b <= 0xf3) return S_C3;
    return -1;
}

int kg_text_byte(kg_body_kind kind, uint32_t *sub, int32_t *chars, int32_t lo, int32_t hi, uint8_t b)
{
    int lead;
    if (kind == KG_TEXT_FREE) return 1;
    switch (*sub) {
    case S_NORMAL:
        break;
    case S_C1: if (b < 0x80 || b > 0xbf) return 0; *sub = S_NORMAL; return 1;
    case S_C2: if (b < 0x80 || b > 0xbf) return 0; *sub = S_C1; return 1;
    case S_C3: if (b < 0x80 || b > 0xbf) return 0; *sub = S_C2; return 1;
    case S_E0: if (b < 0xa0 || b > 0xbf) return 0; *sub = S_C1; return 1;
    case S_ED: if (b < 0x80 || b > 0x9f) return 0; *sub = S_C1; return 1;
    case S_F0: if (b < 0x90 || b > 0xbf) return 0; *sub = S_C2; return 1;
    case S_F4: if (b < 0x80 || b > 0x8f) return 0; *sub = S_C2; return 1;
    case S_ESC:
        if (b == 'u') { *sub = S_U1; return 1; }
        if (!strchr("\"\\/bfnrt", b) || !b) return 0;
        *sub = S_NORMAL;
        return 1;
    /* \uXXXX: no surrogates (D800..DFFF), which would need a pair (other characters are written as
     * UTF-8), and no NUL (\u0000: C strings, and jansson's object keys, cannot hold it) */
    case S_U1: if (!is_hex(b)) return 0; *sub = (b == 'd' || b == 'D') ? S_U2D : b == '0' ? S_U2Z : S_U2; return 1;
    case S_U2D: if (b < '0' || b > '7') return 0; *sub = S_U3; return 1;
    case S_U2: if (!is_hex(b)) return 0; *sub = S_U3; return 1;
    case S_U3: if (!is_hex(b)) return 0; *sub = S_U4; return 1;
    case S_U4: if (!is_hex(b)) return 0; *sub = S_NORMAL; return 1;
    case S_U2Z: if (!is_hex(b)) return 0; *sub = b == '0' ? S_U3Z : S_U3; return 1;
    case S_U3Z: if (!is_hex(b)) return 0; *sub = b == '0' ? S_U4Z : S_U4; return 1;
    case S_U4Z: if (!is_hex(b) || b == '0') return 0; *sub = S_NORMAL; return 1;
    default: return 0;
    }
    /* between characters */
    if (b == '"' && kind != KG_TEXT_RAW) return *chars >= lo ? 2 : 0;
    if (kind == KG_TEXT_JSON && b < 0x20) return 0;
    if (kind == KG_TEXT_ATTR && (b < 0x20 || b == '&' || b == '<')) return 0;
    if (*chars >= hi) return 0;
    if (b < 0x80) {
        if (kind == KG_TEXT_JSON && b == '\\') *sub = S_ESC;
        ++*chars;
        return 1;
    }
    lead = utf8_lead(b);
    if (lead < 0) return 0;
    *sub = (uint32_t)lead;
    ++*chars;
    return 1;
}

static void set_range(uint8_t set[32], unsigned lo, unsigned hi)
{
    unsigned b = lo;
    for (; b <= hi && (b & 7); b++) set[b >> 3] |= (uint8_t)(1u << (b & 7));
    for (; b + 7 <= hi; b += 8) set[b >> 3] = 0xff;
    for (; b <= hi; b++) set[b >> 3] |= (uint8_t)(1u << (b & 7));
}

static void set_chars(uint8_t set[32], const char *s)
{
    for (; *s; s++) set[(uint8_t)*s >> 3] |= (uint8_t)(1u << ((uint8_t)*s & 7));
}

/* What kg_text_byte takes, by ranges (it is asked at every step of a walk: 256 calls would be most
 * of a mask's time). */
void kg_text_first(kg_body_kind kind, uint32_t sub, int32_t chars, int32_t lo, int32_t hi, uint8_t set[32])
{
    if (kind == KG_TEXT_FREE) { memset(set, 0xff, 32); return; }
    switch (sub) {
    case S_NORMAL:
        if (kind != KG_TEXT_RAW && chars >= lo) set_chars(set, "\"");
        if (chars >= hi) return;
        if (kind == KG_TEXT_RAW) set_range(set, 0x00, 0x7f);
        else if (kind == KG_TEXT_JSON) { set_range(set, 0x20, 0x21); set_range(set, 0x23, 0x7f); }
        else { set_range(set, 0x20, 0x21); set_range(set, 0x23, 0x25); set_range(set, 0x27, 0x3b); set_range(set, 0x3d, 0x7f); }
        set_range(set, 0xc2, 0xf4);
        return;
    case S_C1: case S_C2: case S_C3: set_range(set, 0x80, 0xbf); return;
    case S_E0: set_range(set, 0xa0, 0xbf); return;
    case S_ED: set_range(set, 0x80, 0x9f); return;
    case S_F0: set_range(set, 0x90, 0xbf); return;
    case S_F4: set_range(set, 0x80, 0x8f); return;
    case S_ESC: set_chars(set, "\"\\/bfnrtu"); return;
    case S_U1: case S_U2: case S_U3: case S_U4: case S_U2Z: case S_U3Z:
        set_range(set, '0', '9'); set_range(set, 'a', 'f'); set_range(set, 'A', 'F'); return;
    case S_U4Z: set_range(set, '1', '9'); set_range(set, 'a', 'f'); set_range(set, 'A', 'F'); return;
    case S_U2D: set_range(set, '0', '7'); return;
    default: return;
    }
}

/* ---- threads ----------------------------------------------------------------------------- */

/* A thread being moved: its words (depth, then frames), room for KG_MAX_DEPTH frames. */
typedef struct { uint32_t w[KG_THREAD_WORDS(KG_MAX_DEPTH)]; } thread;

#define DEPTH(t) ((t)->w[0])
#define TOP(t) (&(t)->w[1 + 3 * (DEPTH(t) - 1)])      /* node, count, sub */

/* Only the words in use (a whole thread is 580 bytes; most use a few dozen). */
static void copy_thread(thread *to, const thread *from) { memcpy(to->w, from->w, KG_THREAD_WORDS(from->w[0]) * sizeof *to->w); }

/* Alternatives followed by recursion, at most this deep (each level holds a thread on the stack). */
#define SETTLE_NEST 128

/* Add a resting thread (at a consuming node) to out, unless it is there already or out is full. */
static void add(kg_set *out, const thread *t)
{
    size_t len = KG_THREAD_WORDS(t->w[0]), i = 0;
    const uint32_t *top = TOP(t);
    while (i < out->n) {
        size_t l = KG_THREAD_WORDS(out->w[i]);
        if (l == len && out->w[i + l - 3] == top[0] && !memcmp(out->w + i, t->w, len * sizeof *t->w)) return;
        i += l;
    }
    if (out->threads >= KG_MAX_THREADS || out->n + len > out->cap) return;
    memcpy(out->w + out->n, t->w, len * sizeof *t->w);
    out->n += len;
    out->threads++;
}

/* Budget of moves without a symbol for one settle: ends any loop a grammar might have. */
#define SETTLE_MOVES 4096

static void settle(const kgram *g, thread *t, kg_set *out, int *moves, int nest);

/* A thread resting at a consuming node; a text that may end here also goes on past it. */
static void rest(const kgram *g, thread *t, kg_set *out, int *moves, int nest)
{
    uint32_t *top = TOP(t);
    const kg_node *x = &g->nodes[top[0]];
    if (x->kind == KG_BODY && (x->arg == KG_TEXT_RAW || x->arg == KG_TEXT_FREE)) {
        if (top[2] == 0 && (int32_t)top[1] >= x->lo && nest < SETTLE_NEST) {
            thread u;
            copy_thread(&u, t);
            TOP(&u)[0] = x->next;
            settle(g, &u, out, moves, nest + 1);
        }
        if (x->arg == KG_TEXT_RAW && top[2] == 0 && (int32_t)top[1] >= x->hi) return;   /* full: only its end is left */
    }
    add(out, t);
}

/* Follow the moves without a symbol from the thread's top node to consuming nodes. */
static void settle(const kgram *g, thread *t, kg_set *out, int *moves, int nest)
{
    for (;;) {
        uint32_t *top = TOP(t);
        const kg_node *x = &g->nodes[top[0]];
        if (g->need[top[0]] > KG_MAX_DEPTH - (int32_t)DEPTH(t)) return;   /* could not finish from here */
        if (++*moves > SETTLE_MOVES) return;
        switch ((kg_kind)x->kind) {
        case KG_FAIL: return;
        case KG_BYTES: case KG_SYM: case KG_ACCEPT: add(out, t); return;
        case KG_BODY: top[1] = 0; top[2] = 0; rest(g, t, out, moves, nest); return;   /* entering the text */
        case KG_SPLIT:
            if (nest < SETTLE_NEST) {
                thread u;
                copy_thread(&u, t);
                TOP(&u)[0] = x->next;
                settle(g, &u, out, moves, nest + 1);
            }
            top[0] = x->alt;
            continue;
        case KG_CALL:
            if (DEPTH(t) >= KG_MAX_DEPTH) return;
            top[0] = x->next;
            t->w[0]++;
            top = TOP(t);
            top[0] = g->rules[x->lo];
            top[1] = top[2] = 0;
            continue;
        case KG_RET:
            if (DEPTH(t) <= 1) return;
            t->w[0]--;
            continue;
        case KG_CZERO: top[1] = 0; top[0] = x->next; continue;
        case KG_CINC: top[1]++; top[0] = x->next; continue;
        case KG_CGE: if ((int32_t)top[1] < x->lo) return; top[0] = x->next; continue;
        case KG_CLT: if ((int32_t)top[1] >= x->hi) return; top[0] = x->next; continue;
        }
        return;
    }
}

static void set_clear(kg_set *s)
{
    s->n = 0;
    s->threads = 0;
}

void kgram_start(const kgram *g, kg_set *out)
{
    thread t;
    int moves = 0;
    set_clear(out);
    if (!g->finished) return;
    t.w[0] = 1;
    t.w[1] = g->start;
    t.w[2] = t.w[3] = 0;
    settle(g, &t, out, &moves, 0);
}

void kgram_step(const kgram *g, const kg_set *in, int sym, kg_set *out)
{
    size_t i = 0;
    set_clear(out);
    while (i < in->n) {
        size_t len = KG_THREAD_WORDS(in->w[i]);
        thread t;
        uint32_t *top;
        const kg_node *x;
        int moves = 0;
        memcpy(t.w, in->w + i, len * sizeof *t.w);
        i += len;
        top = TOP(&t);
        x = &g->nodes[top[0]];
        if (sym >= 256) {
            if (x->kind != KG_SYM || x->arg != sym - 256) continue;
            top[0] = x->next;
            settle(g, &t, out, &moves, 0);
            continue;
        }
        if (x->kind == KG_BYTES) {
            const uint8_t *set = g->sets[x->set];
            if (!(set[sym >> 3] & (1u << (sym & 7)))) continue;
            top[0] = x->next;
            settle(g, &t, out, &moves, 0);
        } else if (x->kind == KG_BODY) {
            int32_t chars = (int32_t)top[1];
            int r = kg_text_byte((kg_body_kind)x->arg, &top[2], &chars, x->lo, x->hi, (uint8_t)sym);
            top[1] = (uint32_t)chars;
            if (r == 1) rest(g, &t, out, &moves, 0);
            else if (r == 2) { top[0] = x->next; settle(g, &t, out, &moves, 0); }
        }
    }
}

int kgram_accepts(const kgram *g, const kg_set *s)
{
    for (size_t i = 0; i < s->n; i += KG_THREAD_WORDS(s->w[i]))
        if (g->nodes[s->w[i + 1 + 3 * (s->w[i] - 1)]].kind == KG_ACCEPT) return 1;
    return 0;
}

void kgram_first_bytes(const kgram *g, const kg_set *s, uint8_t set[32])
{
    memset(set, 0, 32);
    for (size_t i = 0; i < s->n; i += KG_THREAD_WORDS(s->w[i])) {
        const uint32_t *top = &s->w[i + 1 + 3 * (s->w[i] - 1)];
        const kg_node *x = &g->nodes[top[0]];
        if (x->kind == KG_BYTES) {
            for (int k = 0; k < 32; k++) set[k] |= g->sets[x->set][k];
        } else if (x->kind == KG_BODY) {
            kg_text_first((kg_body_kind)x->arg, top[2], (int32_t)top[1], x->lo, x->hi, set);
        }
    }
}
