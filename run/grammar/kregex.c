/* ECMAScript patterns and JSON Schema formats -> byte automata (kregex.h).
 *
 * Three steps: the pattern is parsed into a tree of character classes; the tree is laid out as a
 * Thompson automaton over characters whose every character edge is spelled in the text's encoding
 * (UTF-8 byte ranges; for a JSON string also the escapes krun writes), giving an automaton over
 * bytes; that is made deterministic (subsets), then minimized with its length tables (kdfa.c). */
#include "kregex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CP        0x10ffff
#define MAX_NFA       60000      /* automaton states, at most (counted repetition copies its body) */
#define MAX_REPEAT    1000       /* {n,m} bounds, at most */
#define MAX_AST       20000
#define SUBSET_MAX    (4 * KDFA_MAX_STATES)

/* ---- character classes: sorted, disjoint code-point ranges ---------------------------------- */

typedef struct { uint32_t lo, hi; } range;
typedef struct { range *r; size_t n, cap; } cclass;

typedef struct {
    const char *src;
    uint32_t *cp;                /* the pattern as code points */
    size_t n, at;
    int flags, oom, bad;
    char *msg;
    size_t mlen;
} parser;

static int refuse(parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(parser *p, const char *fmt, ...)
{
    va_list ap;
    if (p->bad) return -1;
    p->bad = 1;
    va_start(ap, fmt);
    vsnprintf(p->msg, p->mlen, fmt, ap);
    va_end(ap);
    return -1;
}

static void cc_add(parser *p, cclass *c, uint32_t lo, uint32_t hi)
{
    if (lo > hi) return;
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 8;
        range *r = realloc(c->r, cap * sizeof *r);
        if (!r) { p->oom = 1; return; }
        c->r = r;
        c->cap = cap;
    }
    c->r[c->n++] = (range){lo, hi};
}

static int range_cmp(const void *a, const void *b)
{
    const range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorted, merged, without surrogates and NUL (no JSON string krun writes holds them). */
static void cc_norm(parser *p, cclass *c)
{
    size_t k = 0;
    range *old;
    size_t n;
    if (c->n) qsort(c->r, c->n, sizeof *c->r, range_cmp);     /* (an empty class, `[]`, has no array) */
    for (size_t i = 0; i < c->n; i++) {
        if (k && c->r[i].lo <= c->r[k - 1].hi + 1) { if (c->r[i].hi > c->r[k - 1].hi) c->r[k - 1].hi = c->r[i].hi; }
        else c->r[k++] = c->r[i];
    }
    c->n = k;
    old = c->r; n = c->n;
    c->r = NULL; c->n = c->cap = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t lo = old[i].lo ? old[i].lo : 1, hi = old[i].hi > MAX_CP ? MAX_CP : old[i].hi;
        if (lo <= 0xd7ff) cc_add(p, c, lo, hi < 0xd7ff ? hi : 0xd7ff);
        if (hi >= 0xe000) cc_add(p, c, lo > 0xe000 ? lo : 0xe000, hi);
    }
    free(old);
}

static void cc_negate(parser *p, cclass *c)
{
    cclass o = {0};
    uint32_t at = 0;
    cc_norm(p, c);
    for (size_t i = 0; i < c->n; i++) { if (c->r[i].lo > at) cc_add(p, &o, at, c->r[i].lo - 1); at = c->r[i].hi + 1; }
    if (at <= MAX_CP) cc_add(p, &o, at, MAX_CP);
    free(c->r);
    *c = o;
    cc_norm(p, c);
}

/* ASCII letters in either case (KREGEX_ICASE). */
static void cc_fold(parser *p, cclass *c)
{
    size_t n = c->n;
    for (size_t i = 0; i < n; i++) {
        uint32_t lo = c->r[i].lo, hi = c->r[i].hi, l, h;
        l = lo > 'a' ? lo : 'a'; h = hi < 'z' ? hi : 'z';
        if (l <= h) cc_add(p, c, l - 32, h - 32);
        l = lo > 'A' ? lo : 'A'; h = hi < 'Z' ? hi : 'Z';
        if (l <= h) cc_add(p, c, l + 32, h + 32);
    }
    cc_norm(p, c);
}

static void cc_digit(parser *p, cclass *c) { cc_add(p, c, '0', '9'); }
static void cc_word(parser *p, cclass *c) { cc_add(p, c, '0', '9'); cc_add(p, c, 'A', 'Z'); cc_add(p, c, 'a', 'z'); cc_add(p, c, '_', '_'); }
static void cc_space(parser *p, cclass *c)
{
    static const range s[] = {{9, 13}, {32, 32}, {0xa0, 0xa0}, {0x1680, 0x1680}, {0x2000, 0x200a}, {0x2028, 0x2029},
                              {0x202f, 0x202f}, {0x205f, 0x205f}, {0x3000, 0x3000}, {0xfeff, 0xfeff}};
    for (size_t i = 0; i < sizeof s / sizeof *s; i++) cc_add(p, c, s[i].lo, s[i].hi);
}

/* ---- the tree -------------------------------------------------------------------------------- */

typedef enum { A_EMPTY, A_CLASS, A_CAT, A_ALT, A_REPEAT, A_BOL, A_EOL } akind;
typedef struct {
    akind kind;
    int a, b;                    /* CAT / ALT: the two children; REPEAT: the child */
    int min, max;                /* REPEAT (max -1: unbounded) */
    cclass cls;
} anode;

typedef struct { anode *v; size_t n, cap; } atree;

static int ast_new(parser *p, atree *t, akind k)
{
    if (t->n >= MAX_AST) return refuse(p, "the pattern is too long for constrained decoding (more than %d parts)", MAX_AST);
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        anode *v = realloc(t->v, cap * sizeof *v);
        if (!v) { p->oom = 1; return -1; }
        t->v = v;
        t->cap = cap;
    }
    memset(&t->v[t->n], 0, sizeof *t->v);
    t->v[t->n].kind = k;
    return (int)t->n++;
}

static int pair(parser *p, atree *t, akind k, int a, int b)
{
    int n;
    if (a < 0 || b < 0) return -1;
    if ((n = ast_new(p, t, k)) < 0) return -1;
    t->v[n].a = a;
    t->v[n].b = b;
    return n;
}

/* ---- parsing --------------------------------------------------------------------------------- */

static int peek(const parser *p) { return p->at < p->n ? (int)p->cp[p->at] : -1; }
static int peek2(const parser *p) { return p->at + 1 < p->n ? (int)p->cp[p->at + 1] : -1; }

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static long hex_n(parser *p, int n)
{
    long v = 0;
    for (int i = 0; i < n; i++) {
        int h = hexval(peek(p));
        if (h < 0) return -1;
        v = v * 16 + h;
        p->at++;
    }
    return v;
}

/* An escape after the backslash (at p->at): a class escape into c (returns 1), or one character
 * (returns 0, *cp).  in_class: inside [...], where \b is a backspace.  -1: refused. */
static int escape(parser *p, cclass *c, uint32_t *cp, int in_class)
{
    int e = peek(p);
    size_t where = p->at;
    if (e < 0) return refuse(p, "the pattern ends with a lone backslash");
    p->at++;
    switch (e) {
    case 'd': cc_digit(p, c); return 1;
    case 'w': cc_word(p, c); return 1;
    case 's': cc_space(p, c); return 1;
    case 'D': case 'W': case 'S': {
        cclass t = {0};
        if (e == 'D') cc_digit(p, &t); else if (e == 'W') cc_word(p, &t); else cc_space(p, &t);
        cc_negate(p, &t);
        for (size_t i = 0; i < t.n; i++) cc_add(p, c, t.r[i].lo, t.r[i].hi);
        free(t.r);
        return 1;
    }
    case 'p': case 'P':
        return refuse(p, "Unicode property escapes (\\%c{...}, at offset %zu) are not supported by constrained decoding", e, where - 1);
    case 'b':
        if (in_class) { *cp = 8; return 0; }
        return refuse(p, "word boundaries (\\b) are not supported by constrained decoding");
    case 'B': return refuse(p, "word boundaries (\\B) are not supported by constrained decoding");
    case 'k': return refuse(p, "backreferences (\\k<name>) are not supported by constrained decoding");
    case 't': *cp = 9; return 0;
    case 'n': *cp = 10; return 0;
    case 'v': *cp = 11; return 0;
    case 'f': *cp = 12; return 0;
    case 'r': *cp = 13; return 0;
    case '0':
        if (peek(p) >= '0' && peek(p) <= '9') return refuse(p, "octal escapes (\\0%c) are not allowed in a pattern", peek(p));
        *cp = 0;
        return 0;
    case 'c': {
        int l = peek(p);
        if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z'))) return refuse(p, "\\c must be followed by a letter");
        p->at++;
        *cp = (uint32_t)(l % 32);
        return 0;
    }
    case 'x': {
        long v = hex_n(p, 2);
        if (v < 0) return refuse(p, "\\x must be followed by two hexadecimal digits");
        *cp = (uint32_t)v;
        return 0;
    }
    case 'u': {
        long v;
        if (peek(p) == '{') {
            p->at++;
            v = 0;
            if (hexval(peek(p)) < 0) return refuse(p, "\\u{...} must hold hexadecimal digits");
            while (hexval(peek(p)) >= 0) { v = v * 16 + hexval(peek(p)); p->at++; if (v > MAX_CP) return refuse(p, "\\u{...} beyond U+10FFFF"); }
            if (peek(p) != '}') return refuse(p, "\\u{... must end with }");
            p->at++;
            *cp = (uint32_t)v;
            return 0;
        }
        v = hex_n(p, 4);
        if (v < 0) return refuse(p, "\\u must be followed by four hexadecimal digits");
        /* a surrogate pair spelled as two escapes is one character */
        if (v >= 0xd800 && v <= 0xdbff && peek(p) == '\\' && peek2(p) == 'u') {
            size_t save = p->at;
            long w;
            p->at += 2;
            w = hex_n(p, 4);
            if (w >= 0xdc00 && w <= 0xdfff) { *cp = (uint32_t)(0x10000 + ((v - 0xd800) << 10) + (w - 0xdc00)); return 0; }
            p->at = save;
        }
        *cp = (uint32_t)v;
        return 0;
    }
    default:
        if (e >= '1' && e <= '9') return refuse(p, "backreferences (\\%c) are not supported by constrained decoding", e);
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) return refuse(p, "unknown escape \\%c in the pattern", e);
        *cp = (uint32_t)e;        /* an identity escape: \. \/ \- \\ ... */
        return 0;
    }
}

/* [...] (p->at just after '[') into c. */
static int bracket(parser *p, cclass *c)
{
    int neg = 0;
    if (peek(p) == '^') { neg = 1; p->at++; }
    for (;;) {
        int ch = peek(p), cls;
        uint32_t lo, hi;
        cclass esc = {0};
        if (ch < 0) return refuse(p, "a character class [ is not closed");
        if (ch == ']') { p->at++; break; }
        p->at++;
        if (ch == '\\') {
            if ((cls = escape(p, &esc, &lo, 1)) < 0) { free(esc.r); return -1; }
            if (cls) {
                for (size_t i = 0; i < esc.n; i++) cc_add(p, c, esc.r[i].lo, esc.r[i].hi);
                free(esc.r);
                continue;
            }
        } else {
            lo = (uint32_t)ch;
        }
        hi = lo;
        if (peek(p) == '-' && peek2(p) != ']' && peek2(p) >= 0) {
            int h;
            p->at++;
            h = peek(p);
            p->at++;
            if (h == '\\') {
                uint32_t x;
                if ((cls = escape(p, &esc, &x, 1)) < 0) { free(esc.r); return -1; }
                if (cls) {
                    /* [a-\d]: the dash is a character (Annex B) */
                    for (size_t i = 0; i < esc.n; i++) cc_add(p, c, esc.r[i].lo, esc.r[i].hi);
                    free(esc.r);
                    cc_add(p, c, lo, lo);
                    cc_add(p, c, '-', '-');
                    continue;
                }
                hi = x;
            } else {
                hi = (uint32_t)h;
            }
            if (hi < lo) return refuse(p, "the class range %s is out of order", "[..-..]");
        }
        cc_add(p, c, lo, hi);
    }
    if (p->flags & KREGEX_ICASE) cc_fold(p, c);
    if (neg) cc_negate(p, c);
    else cc_norm(p, c);
    return 0;
}

static int disjunction(parser *p, atree *t);

/* {n}, {n,}, {n,m} at p->at ('{'): 1 with *min, *max; 0 when it is no quantifier (a literal '{'). */
static int braces(parser *p, int *min, int *max)
{
    size_t save = p->at;
    long a = 0, b;
    int digits = 0;
    p->at++;
    while (peek(p) >= '0' && peek(p) <= '9') { a = a * 10 + (peek(p) - '0'); if (a > 100000) a = 100000; p->at++; digits++; }
    if (!digits) { p->at = save; return 0; }
    b = a;
    if (peek(p) == ',') {
        p->at++;
        if (peek(p) == '}') b = -1;
        else {
            b = 0;
            digits = 0;
            while (peek(p) >= '0' && peek(p) <= '9') { b = b * 10 + (peek(p) - '0'); if (b > 100000) b = 100000; p->at++; digits++; }
            if (!digits) { p->at = save; return 0; }
        }
    }
    if (peek(p) != '}') { p->at = save; return 0; }
    p->at++;
    *min = (int)a;
    *max = (int)b;
    return 1;
}

static int atom(parser *p, atree *t)
{
    int ch = peek(p), n;
    p->at++;
    if (ch == '(') {
        if (peek(p) == '?') {
            int k = peek2(p);
            if (k == ':') p->at += 2;
            else if (k == '=' || k == '!') return refuse(p, "lookahead (?%c...) is not supported by constrained decoding", k);
            else if (k == '<' && p->at + 2 < p->n && (p->cp[p->at + 2] == '=' || p->cp[p->at + 2] == '!'))
                return refuse(p, "lookbehind (?<%c...) is not supported by constrained decoding", (int)p->cp[p->at + 2]);
            else if (k == '<') {
                p->at += 2;
                while (peek(p) >= 0 && peek(p) != '>') p->at++;
                if (peek(p) != '>') return refuse(p, "a group name (?<... is not closed");
                p->at++;
            } else {
                return refuse(p, "unknown group (?%c...) in the pattern", k < 0 ? '?' : k);
            }
        }
        n = disjunction(p, t);
        if (n < 0) return -1;
        if (peek(p) != ')') return refuse(p, "a group ( is not closed");
        p->at++;
        return n;
    }
    if ((n = ast_new(p, t, A_CLASS)) < 0) return -1;
    if (ch == '.') {
        cc_add(p, &t->v[n].cls, '\n', '\n');
        cc_add(p, &t->v[n].cls, '\r', '\r');
        cc_add(p, &t->v[n].cls, 0x2028, 0x2029);
        cc_negate(p, &t->v[n].cls);
        return n;
    }
    if (ch == '[') {
        cclass c = {0};
        if (bracket(p, &c)) { free(c.r); return -1; }
        t->v[n].cls = c;
        return n;
    }
    if (ch == '\\') {
        uint32_t cp;
        cclass c = {0};
        int cls = escape(p, &c, &cp, 0);
        if (cls < 0) { free(c.r); return -1; }
        if (!cls) cc_add(p, &c, cp, cp);
        t->v[n].cls = c;
    } else {
        if (ch == ')' ) return refuse(p, "an unmatched ) in the pattern");
        if (ch == '*' || ch == '+' || ch == '?') return refuse(p, "nothing to repeat before %c", ch);
        cc_add(p, &t->v[n].cls, (uint32_t)ch, (uint32_t)ch);
    }
    if (p->flags & KREGEX_ICASE) cc_fold(p, &t->v[n].cls);
    else cc_norm(p, &t->v[n].cls);
    return n;
}

static int term(parser *p, atree *t)
{
    int ch = peek(p), n, min, max;
    if (ch == '^') { p->at++; return ast_new(p, t, A_BOL); }
    if (ch == '$') { p->at++; return ast_new(p, t, A_EOL); }
    if (ch == '{' && braces(p, &min, &max)) return refuse(p, "nothing to repeat before {");
    if ((n = atom(p, t)) < 0) return -1;
    /* at most one quantifier (ECMAScript: a*+ or a{2}{3} is "nothing to repeat"; PCRE2 would read
     * a*+ as possessive) */
    ch = peek(p);
    if (ch == '*') { min = 0; max = -1; p->at++; }
    else if (ch == '+') { min = 1; max = -1; p->at++; }
    else if (ch == '?') { min = 0; max = 1; p->at++; }
    else if (ch == '{' && braces(p, &min, &max)) {
        if (max >= 0 && max < min) return refuse(p, "the quantifier {%d,%d} is out of order", min, max);
        if (min > MAX_REPEAT || max > MAX_REPEAT) return refuse(p, "quantifiers above {%d} are not supported by constrained decoding", MAX_REPEAT);
    } else return n;
    if (peek(p) == '?') p->at++;              /* lazy: the same set of strings */
    ch = peek(p);
    if (ch == '*' || ch == '+' || ch == '?') return refuse(p, "nothing to repeat before %c (one quantifier per atom)", ch);
    if (ch == '{') {
        size_t at = p->at;
        int m1, m2;
        if (braces(p, &m1, &m2)) return refuse(p, "nothing to repeat before { (one quantifier per atom)");
        p->at = at;
    }
    {
        int r = ast_new(p, t, A_REPEAT);
        if (r < 0) return -1;
        t->v[r].a = n;
        t->v[r].min = min;
        t->v[r].max = max;
        return r;
    }
}

static int alternative(parser *p, atree *t)
{
    int n = -2;
    while (peek(p) >= 0 && peek(p) != '|' && peek(p) != ')') {
        int x = term(p, t);
        if (x < 0) return -1;
        n = n == -2 ? x : pair(p, t, A_CAT, n, x);
        if (n < 0) return -1;
    }
    return n == -2 ? ast_new(p, t, A_EMPTY) : n;
}

static int disjunction(parser *p, atree *t)
{
    int n = alternative(p, t);
    while (n >= 0 && peek(p) == '|') {
        p->at++;
        n = pair(p, t, A_ALT, n, alternative(p, t));
    }
    return n;
}

/* ---- the character automaton, spelled in bytes --------------------------------------------- */

typedef enum { N_EDGES, N_SPLIT, N_EPS, N_BOL, N_EOL, N_ACCEPT } nkind;
typedef struct { uint8_t lo, hi; uint32_t to; } edge;
typedef struct {
    uint8_t kind, mid;           /* mid: inside a character's bytes */
    uint32_t out, out1;          /* SPLIT, EPS, BOL, EOL */
    uint32_t e0, ne;             /* N_EDGES: edges [e0, e0 + ne) (made contiguous at the end) */
} nstate;

typedef struct {
    nstate *s;
    size_t n, cap;
    edge *e;
    uint32_t *e_from;            /* the state each edge leaves */
    size_t ne, cap_e;
    int enc;
    parser *p;
} nfa;

static uint32_t st_new(nfa *a, nkind k, int mid)
{
    if (a->n >= MAX_NFA) { refuse(a->p, "the pattern is too complex for constrained decoding (its automaton exceeds %d states)", MAX_NFA); return 0; }
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 256;
        nstate *s = realloc(a->s, cap * sizeof *s);
        if (!s) { a->p->oom = 1; return 0; }
        a->s = s;
        a->cap = cap;
    }
    memset(&a->s[a->n], 0, sizeof *a->s);
    a->s[a->n].kind = (uint8_t)k;
    a->s[a->n].mid = (uint8_t)mid;
    return (uint32_t)a->n++;
}

static void edge_add(nfa *a, uint32_t from, uint8_t lo, uint8_t hi, uint32_t to)
{
    if (a->p->oom || a->p->bad) return;
    if (a->ne == a->cap_e) {
        size_t cap = a->cap_e ? 2 * a->cap_e : 1024;
        edge *e = realloc(a->e, cap * sizeof *e);
        uint32_t *f = e ? realloc(a->e_from, cap * sizeof *f) : NULL;
        if (e) a->e = e;
        if (f) a->e_from = f;
        if (!e || !f) { a->p->oom = 1; return; }
        a->cap_e = cap;
    }
    a->e[a->ne] = (edge){lo, hi, to};
    a->e_from[a->ne++] = from;
}

/* The state reached from `from` by the byte range [lo, hi], made once per (from, range): the
 * bytes of several characters share their prefixes. */
static uint32_t step_to(nfa *a, uint32_t from, uint8_t lo, uint8_t hi)
{
    uint32_t t;
    for (size_t i = a->ne; i-- > 0;) {
        if (a->e_from[i] == from && a->e[i].lo == lo && a->e[i].hi == hi && a->s[a->e[i].to].mid) return a->e[i].to;
        if (a->e_from[i] != from && i + 64 < a->ne) break;       /* a state's edges are made together */
    }
    t = st_new(a, N_EDGES, 1);
    if (t) edge_add(a, from, lo, hi, t);
    return t;
}

static void utf8_bytes(uint32_t c, uint8_t *b, int *n)
{
    if (c < 0x80) { b[0] = (uint8_t)c; *n = 1; }
    else if (c < 0x800) { b[0] = (uint8_t)(0xc0 | c >> 6); b[1] = (uint8_t)(0x80 | (c & 0x3f)); *n = 2; }
    else if (c < 0x10000) { b[0] = (uint8_t)(0xe0 | c >> 12); b[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3f)); b[2] = (uint8_t)(0x80 | (c & 0x3f)); *n = 3; }
    else { b[0] = (uint8_t)(0xf0 | c >> 18); b[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3f)); b[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3f)); b[3] = (uint8_t)(0x80 | (c & 0x3f)); *n = 4; }
}

/* The code points lo..hi (one UTF-8 length) as byte-range sequences from `from` to `to`
 * (the usual split: each sequence a range per byte). */
static void utf8_range(nfa *a, uint32_t from, uint32_t lo, uint32_t hi, uint32_t to)
{
    uint8_t bl[4], bh[4];
    int n, m;
    for (int i = 1; i < 4; i++) {
        uint32_t mask = (1u << (6 * i)) - 1;
        if ((lo & ~mask) != (hi & ~mask)) {
            if (lo & mask) { utf8_range(a, from, lo, lo | mask, to); utf8_range(a, from, (lo | mask) + 1, hi, to); return; }
            if ((hi & mask) != mask) { utf8_range(a, from, lo, (hi & ~mask) - 1, to); utf8_range(a, from, hi & ~mask, hi, to); return; }
        }
    }
    utf8_bytes(lo, bl, &n);
    utf8_bytes(hi, bh, &m);
    for (int i = 0; i < n - 1; i++) from = step_to(a, from, bl[i], bh[i]);
    edge_add(a, from, bl[n - 1], bh[n - 1], to);
}

static void utf8_class(nfa *a, uint32_t from, uint32_t lo, uint32_t hi, uint32_t to)
{
    static const uint32_t cut[] = {0x7f, 0x7ff, 0xffff, MAX_CP};
    for (int k = 0; k < 4 && lo <= hi; k++) {
        uint32_t top = hi < cut[k] ? hi : cut[k];
        if (lo <= top) { utf8_range(a, from, lo, top, to); lo = top + 1; }
    }
}

/* The characters of c from `from` to `to`, spelled in the encoding. */
static void spell(nfa *a, uint32_t from, const cclass *c, uint32_t to)
{
    uint32_t esc = 0;
    for (size_t i = 0; i < c->n; i++) {
        uint32_t lo = c->r[i].lo, hi = c->r[i].hi;
        if (a->enc == KDFA_JSON) {
            /* what JSON escapes: the controls, '"' and '\' */
            for (uint32_t x = lo; x <= hi && x < 0x20; x++) {
                static const char short_esc[32] = {[8] = 'b', [9] = 't', [10] = 'n', [12] = 'f', [13] = 'r'};
                if (!esc) esc = step_to(a, from, '\\', '\\');
                if (short_esc[x]) edge_add(a, esc, (uint8_t)short_esc[x], (uint8_t)short_esc[x], to);
                else {
                    static const char hexd[] = "0123456789abcdef";
                    uint32_t u = step_to(a, esc, 'u', 'u');
                    u = step_to(a, u, '0', '0');
                    u = step_to(a, u, '0', '0');
                    u = step_to(a, u, (uint8_t)hexd[x >> 4], (uint8_t)hexd[x >> 4]);
                    edge_add(a, u, (uint8_t)hexd[x & 15], (uint8_t)hexd[x & 15], to);
                }
            }
            if (lo < 0x20) lo = 0x20;
            if (lo > hi) continue;
            if (lo <= '"' && '"' <= hi) {
                if (!esc) esc = step_to(a, from, '\\', '\\');
                edge_add(a, esc, '"', '"', to);
                if (lo < '"') edge_add(a, from, (uint8_t)lo, '"' - 1, to);
                lo = '"' + 1;
                if (lo > hi) continue;
            }
            if (lo <= '\\' && '\\' <= hi) {
                if (!esc) esc = step_to(a, from, '\\', '\\');
                edge_add(a, esc, '\\', '\\', to);
                if (lo < '\\') edge_add(a, from, (uint8_t)lo, '\\' - 1, to);
                lo = '\\' + 1;
                if (lo > hi) continue;
            }
        }
        utf8_class(a, from, lo, hi, to);
    }
}

/* Every character of the encoding (the search's prefix and suffix). */
static void spell_any(nfa *a, uint32_t from, uint32_t to)
{
    cclass all = {0};
    cc_add(a->p, &all, 1, MAX_CP);
    cc_norm(a->p, &all);
    spell(a, from, &all, to);
    free(all.r);
}

/* Lay out tree node k from state `from`; returns the state it ends in (0 on failure: state 0 is
 * made first and is never an end). */
static uint32_t emit(nfa *a, const atree *t, int k, uint32_t from)
{
    const anode *x = &t->v[k];
    uint32_t end, s;
    if (a->p->oom || a->p->bad) return 0;
    switch (x->kind) {
    case A_EMPTY: return from;
    case A_CLASS:
        end = st_new(a, N_EDGES, 0);
        if (end) spell(a, from, &x->cls, end);
        return end;
    case A_CAT:
        s = emit(a, t, x->a, from);
        return s ? emit(a, t, x->b, s) : 0;
    case A_ALT: {
        uint32_t l = st_new(a, N_EDGES, 0), r = st_new(a, N_EDGES, 0), le, re;
        end = st_new(a, N_EDGES, 0);
        if (!end) return 0;
        /* from --eps--> l and r (a split state in front of from's edges) */
        a->s[from].kind = N_SPLIT;
        a->s[from].out = l;
        a->s[from].out1 = r;
        le = emit(a, t, x->a, l);
        re = emit(a, t, x->b, r);
        if (!le || !re) return 0;
        a->s[le].kind = N_EPS; a->s[le].out = end;
        a->s[re].kind = N_EPS; a->s[re].out = end;
        return end;
    }
    case A_BOL: case A_EOL:
        end = st_new(a, N_EDGES, 0);
        if (!end) return 0;
        a->s[from].kind = x->kind == A_BOL ? N_BOL : N_EOL;
        a->s[from].out = end;
        return end;
    case A_REPEAT: {
        uint32_t cur = from;
        for (int i = 0; i < x->min; i++) if (!(cur = emit(a, t, x->a, cur))) return 0;
        if (x->max < 0) {
            /* cur: split into the body (which comes back to cur) or out */
            uint32_t body = st_new(a, N_EDGES, 0), be;
            end = st_new(a, N_EDGES, 0);
            if (!end) return 0;
            a->s[cur].kind = N_SPLIT;
            a->s[cur].out = body;
            a->s[cur].out1 = end;
            if (!(be = emit(a, t, x->a, body))) return 0;
            a->s[be].kind = N_EPS;
            a->s[be].out = cur;
            return end;
        }
        end = st_new(a, N_EDGES, 0);
        if (!end) return 0;
        for (int i = x->min; i < x->max; i++) {
            uint32_t body = st_new(a, N_EDGES, 0), be;
            if (!body) return 0;
            a->s[cur].kind = N_SPLIT;
            a->s[cur].out = body;
            a->s[cur].out1 = end;
            if (!(be = emit(a, t, x->a, body))) return 0;
            cur = be;
        }
        a->s[cur].kind = N_EPS;
        a->s[cur].out = end;
        return end;
    }
    }
    return 0;
}

/* ---- subsets -------------------------------------------------------------------------------- */

typedef struct {
    const nfa *a;
    uint32_t *first;             /* edges of state s: [first[s], first[s + 1]) in order (sorted by state) */
    uint32_t *order;             /* edge indices sorted by their state */
    uint32_t *mark;              /* visit stamps: [2 * n] (mode 0, mode 1) */
    uint32_t stamp;
    uint32_t *stack;
} closer;

static int u32_cmp(const void *x, const void *y)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return a < b ? -1 : a > b;
}

/* The states reachable from seeds without a byte (at_start: ^ holds), those with edges into out
 * (sorted), *accept when the end is reachable (through $ too).  Returns the count. */
static size_t closure(closer *c, const uint32_t *seeds, size_t n_seeds, int at_start, uint32_t *out, int *accept)
{
    const nfa *a = c->a;
    size_t sp = 0, n_out = 0;
    *accept = 0;
    c->stamp++;
    for (size_t i = 0; i < n_seeds; i++) c->stack[sp++] = seeds[i] << 1;
    while (sp) {
        uint32_t v = c->stack[--sp], s = v >> 1, mode = v & 1;
        const nstate *x = &a->s[s];
        if (c->mark[2 * s + mode] == c->stamp) continue;
        c->mark[2 * s + mode] = c->stamp;
        switch ((nkind)x->kind) {
        case N_EDGES: if (!mode && x->ne) out[n_out++] = s; break;
        case N_SPLIT: c->stack[sp++] = x->out << 1 | mode; c->stack[sp++] = x->out1 << 1 | mode; break;
        case N_EPS: c->stack[sp++] = x->out << 1 | mode; break;
        case N_BOL: if (at_start) c->stack[sp++] = x->out << 1 | mode; break;
        case N_EOL: c->stack[sp++] = x->out << 1 | 1; break;
        case N_ACCEPT: *accept = 1; break;
        }
    }
    /* sorted, so that equal sets compare equal (most closures are a few dozen states: inserted) */
    if (n_out > 64) qsort(out, n_out, sizeof *out, u32_cmp);
    else
        for (size_t i = 1; i < n_out; i++) {
            uint32_t v = out[i];
            size_t j = i;
            for (; j && out[j - 1] > v; j--) out[j] = out[j - 1];
            out[j] = v;
        }
    return n_out;
}

/* The subsets' states and table live in chunks of at most 64 KiB that are never moved: a pattern
 * that reaches SUBSET_MAX subsets fills megabytes, and growing one array by doubling copied them
 * into fresh pages (page faults, and under ASan fresh mappings) -- the most of such a pattern's time. */
#define SET_CHUNK 16384          /* words of subset states per chunk (a larger subset: a chunk of its own) */
#define ROW_CHUNK 64             /* table rows per chunk (at most 256 columns of 4 bytes) */

typedef struct {
    uint32_t **chunk;            /* the chunks of subset states; the last one filled to `used` of `size` */
    size_t n_chunks, cap_chunks, used, size;
    uint32_t **set, *len;        /* per subset: its states (sorted), how many */
    uint8_t *flags;
    uint32_t *rows[SUBSET_MAX / ROW_CHUNK];  /* the table: ROW_CHUNK rows of w columns per chunk, a column per
                                              * run of bytes no edge tells apart */
    size_t n, cap, w;
    uint32_t *hash;              /* open addressing over the subsets, at most a quarter full */
    size_t hcap;
} subsets;

static uint32_t *table_row(const subsets *z, size_t s) { return z->rows[s / ROW_CHUNK] + (s % ROW_CHUNK) * z->w; }

static uint64_t subset_hash(const uint32_t *buf, size_t n, int acc)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)acc;
    for (size_t i = 0; i < n; i++) h = (h ^ buf[i]) * 1099511628211ull;
    return h;
}

/* Room for one more subset: the per-subset arrays grown by doubling (most patterns need a few dozen
 * subsets), the hash table rebuilt, a chunk of rows added when the last is full. */
static int subsets_grow(subsets *z)
{
    if (z->n == z->cap) {
        size_t cap = z->cap ? 2 * z->cap : 64, hcap = 4 * cap + 1;
        uint32_t **set, *len, *hash;
        uint8_t *flags;
        if (cap > SUBSET_MAX) cap = SUBSET_MAX;
        if ((set = realloc(z->set, cap * sizeof *set))) z->set = set;
        if ((len = realloc(z->len, cap * sizeof *len))) z->len = len;
        if ((flags = realloc(z->flags, cap))) z->flags = flags;
        if (!set || !len || !flags || !(hash = malloc(hcap * sizeof *hash))) return -1;
        memset(hash, 0xff, hcap * sizeof *hash);
        for (size_t k = 0; k < z->n; k++) {
            size_t h = (size_t)(subset_hash(z->set[k], z->len[k], z->flags[k] & KDFA_ACCEPT) % hcap);
            while (hash[h] != 0xffffffffu) h = (h + 1) % hcap;
            hash[h] = (uint32_t)k;
        }
        free(z->hash);
        z->hash = hash;
        z->hcap = hcap;
        z->cap = cap;
    }
    if (z->n % ROW_CHUNK == 0 && !(z->rows[z->n / ROW_CHUNK] = malloc(ROW_CHUNK * z->w * sizeof **z->rows))) return -1;
    return 0;
}

/* Where n more subset states go: the last chunk, or a new one. */
static uint32_t *set_room(subsets *z, size_t n)
{
    if (!z->n_chunks || z->used + n > z->size) {
        size_t size = n > SET_CHUNK ? n : SET_CHUNK;
        uint32_t *c;
        if (z->n_chunks == z->cap_chunks) {
            size_t cap = z->cap_chunks ? 2 * z->cap_chunks : 16;
            uint32_t **v = realloc(z->chunk, cap * sizeof *v);
            if (!v) return NULL;
            z->chunk = v;
            z->cap_chunks = cap;
        }
        if (!(c = malloc(size * sizeof *c))) return NULL;
        z->chunk[z->n_chunks++] = c;
        z->used = 0;
        z->size = size;
    }
    z->used += n;
    return z->chunk[z->n_chunks - 1] + z->used - n;
}

/* The subset (buf[0..n), acc) numbered: its number, or KDFA_DEAD when out of room or memory. */
static uint32_t intern(subsets *z, const nfa *a, const uint32_t *buf, size_t n, int acc)
{
    uint64_t h = subset_hash(buf, n, acc ? KDFA_ACCEPT : 0);
    uint32_t *set;
    size_t at;
    if (z->hcap) {
        at = (size_t)(h % z->hcap);
        while (z->hash[at] != 0xffffffffu) {
            uint32_t k = z->hash[at];
            if (z->len[k] == n && (z->flags[k] & KDFA_ACCEPT) == (acc ? KDFA_ACCEPT : 0) && !memcmp(z->set[k], buf, n * sizeof *buf))
                return k;
            at = (at + 1) % z->hcap;
        }
    }
    if (z->n == SUBSET_MAX) {
        refuse(a->p, "the pattern is too complex for constrained decoding (more than %d states)", KDFA_MAX_STATES);
        return KDFA_DEAD;
    }
    if (subsets_grow(z) || !(set = set_room(z, n))) { a->p->oom = 1; return KDFA_DEAD; }
    at = (size_t)(h % z->hcap);
    while (z->hash[at] != 0xffffffffu) at = (at + 1) % z->hcap;
    if (n) memcpy(set, buf, n * sizeof *buf);
    z->set[z->n] = set;
    z->len[z->n] = (uint32_t)n;
    /* a subset holds states at a character boundary or states inside one: never both (the
     * encodings are prefix-free) */
    z->flags[z->n] = (uint8_t)((acc ? KDFA_ACCEPT : 0) | (n && a->s[buf[0]].mid ? 0 : KDFA_BOUNDARY));
    z->hash[at] = (uint32_t)z->n;
    return (uint32_t)z->n++;
}

/* The subset table spelled out byte by byte, when asked for (kregex_table) instead of the minimized
 * automaton. */
typedef struct { uint32_t n, *next; uint8_t *flags; } raw_table;

/* The deterministic automaton of a (start state 0) as a table of byte columns, then minimized (or,
 * with raw, that table spelled out byte by byte and handed over). */
static kdfa *determinize(nfa *a, int32_t lo, int32_t hi, int *empty, raw_table *raw)
{
    parser *p = a->p;
    closer c = {0};
    subsets z = {0};
    uint32_t *buf = NULL, *seeds = NULL, *table = NULL, zero = 0, at_col[257], fill[256];
    uint8_t col[256];
    int n_cols = 0, acc;
    size_t n_buf, seeds_cap = 0;
    kdfa *d = NULL;
    c.a = a;
    c.first = calloc(a->n + 1, sizeof *c.first);
    c.order = malloc((a->ne ? a->ne : 1) * sizeof *c.order);
    c.mark = calloc(2 * a->n, sizeof *c.mark);
    c.stack = malloc((4 * a->n + a->ne + 8) * sizeof *c.stack);
    buf = malloc((a->n + 1) * sizeof *buf);
    if (!c.first || !c.order || !c.mark || !c.stack || !buf) { p->oom = 1; goto out; }
    /* the edges by the state they leave */
    for (size_t i = 0; i < a->ne; i++) c.first[a->e_from[i] + 1]++;
    for (size_t s = 0; s < a->n; s++) { c.first[s + 1] += c.first[s]; a->s[s].ne = c.first[s + 1] - c.first[s]; }
    {
        uint32_t *fill = calloc(a->n + 1, sizeof *fill);
        if (!fill) { p->oom = 1; goto out; }
        for (size_t i = 0; i < a->ne; i++) c.order[c.first[a->e_from[i]] + fill[a->e_from[i]]++] = (uint32_t)i;
        free(fill);
    }
    /* the runs of bytes no edge tells apart: a column each */
    {
        uint8_t cut[257] = {0};
        cut[0] = 1;
        for (size_t i = 0; i < a->ne; i++) { cut[a->e[i].lo] = 1; cut[a->e[i].hi + 1] = 1; }
        for (int b = 0; b < 256; b++) {
            n_cols += cut[b];
            col[b] = (uint8_t)(n_cols - 1);
        }
        z.w = (size_t)n_cols;
    }
    n_buf = closure(&c, &zero, 1, 1, buf, &acc);
    if (intern(&z, a, buf, n_buf, acc) == KDFA_DEAD) goto out;
    z.flags[0] |= KDFA_BOUNDARY;
    for (size_t s = 0; s < z.n; s++) {
        /* the targets of the subset's edges, bucketed by the columns each edge covers: seeds[at_col[k] ..
         * at_col[k + 1]) for column k */
        size_t total = 0;
        memset(at_col, 0, ((size_t)n_cols + 1) * sizeof *at_col);
        for (uint32_t i = 0; i < z.len[s]; i++) {
            uint32_t st = z.set[s][i];
            for (uint32_t j = c.first[st]; j < c.first[st + 1]; j++) {
                const edge *e = &a->e[c.order[j]];
                for (int k = col[e->lo]; k <= col[e->hi]; k++) at_col[k + 1]++;
                total += (size_t)(col[e->hi] - col[e->lo]) + 1;
            }
        }
        if (total > seeds_cap) {
            size_t cap = total > 2 * seeds_cap ? total : 2 * seeds_cap;
            uint32_t *v = realloc(seeds, cap * sizeof *v);
            if (!v) { p->oom = 1; goto out; }
            seeds = v;
            seeds_cap = cap;
        }
        for (int k = 0; k < n_cols; k++) { at_col[k + 1] += at_col[k]; fill[k] = at_col[k]; }
        for (uint32_t i = 0; i < z.len[s]; i++) {
            uint32_t st = z.set[s][i];
            for (uint32_t j = c.first[st]; j < c.first[st + 1]; j++) {
                const edge *e = &a->e[c.order[j]];
                for (int k = col[e->lo]; k <= col[e->hi]; k++) seeds[fill[k]++] = e->to;
            }
        }
        for (int k = 0; k < n_cols; k++) {
            size_t n_seeds = at_col[k + 1] - at_col[k];
            uint32_t target = KDFA_DEAD;
            if (n_seeds) {
                n_buf = closure(&c, seeds + at_col[k], n_seeds, 0, buf, &acc);
                if (n_buf || acc) {
                    target = intern(&z, a, buf, n_buf, acc);
                    if (target == KDFA_DEAD) goto out;
                }
            }
            table_row(&z, s)[k] = target;
        }
    }
    if (raw) {
        if (!(raw->next = malloc(z.n * 256 * sizeof *raw->next))) { p->oom = 1; goto out; }
        for (size_t s = 0; s < z.n; s++)
            for (int b = 0; b < 256; b++) raw->next[s * 256 + (size_t)b] = table_row(&z, s)[col[b]];
        raw->n = (uint32_t)z.n; raw->flags = z.flags;
        z.flags = NULL;
        goto out;
    }
    /* the table in one piece */
    if (!(table = malloc(z.n * z.w * sizeof *table))) { p->oom = 1; goto out; }
    for (size_t s = 0; s < z.n; s += ROW_CHUNK)
        memcpy(table + s * z.w, z.rows[s / ROW_CHUNK], (z.n - s < ROW_CHUNK ? z.n - s : ROW_CHUNK) * z.w * sizeof *table);
    d = kdfa_from_columns((uint32_t)z.n, (uint32_t)z.w, col, table, z.flags, a->enc, lo, hi, empty);
    if (!d && !*empty) p->oom = 1;
    else if (d && d->n > KDFA_MAX_STATES) {
        kdfa_free(d);
        d = NULL;
        refuse(p, "the pattern is too complex for constrained decoding (more than %d states)", KDFA_MAX_STATES);
    }
out:
    free(c.first); free(c.order); free(c.mark); free(c.stack);
    free(buf); free(seeds);
    free(table);
    for (size_t i = 0; i < z.n_chunks; i++) free(z.chunk[i]);
    for (size_t i = 0; i < SUBSET_MAX / ROW_CHUNK; i++) free(z.rows[i]);
    free(z.chunk); free(z.set); free(z.len); free(z.flags); free(z.hash);
    return d;
}

/* ---- the whole ------------------------------------------------------------------------------ */

static size_t utf8_decode(const char *s, size_t len, uint32_t *out)
{
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint8_t b = (uint8_t)s[i];
        uint32_t c = b;
        int k = b < 0x80 ? 0 : b >= 0xf0 ? 3 : b >= 0xe0 ? 2 : b >= 0xc0 ? 1 : 0;
        if (k) c = b & (0x3f >> k);
        i++;
        for (int j = 0; j < k && i < len; j++, i++) c = (c << 6) | ((uint8_t)s[i] & 0x3f);
        out[n++] = c;
    }
    return n;
}

static kdfa *compile(const char *re, size_t len, int flags, int enc, int32_t lo, int32_t hi, int *empty, int *oom,
                     char *msg, size_t mlen, raw_table *raw)
{
    parser p = {0};
    atree t = {0};
    nfa a = {0};
    kdfa *d = NULL;
    int root;
    *empty = *oom = 0;
    if (mlen) msg[0] = 0;
    p.src = re;
    p.flags = flags;
    p.msg = msg;
    p.mlen = mlen;
    p.cp = malloc((len + 1) * sizeof *p.cp);
    if (!p.cp) { *oom = 1; return NULL; }
    p.n = utf8_decode(re, len, p.cp);
    root = disjunction(&p, &t);
    if (root >= 0 && peek(&p) == ')') refuse(&p, "an unmatched ) in the pattern");
    if (root >= 0 && !p.bad && !p.oom) {
        /* state 0: the search's prefix (any characters, then the pattern), the pattern, then the
         * suffix (any characters) and the end */
        uint32_t start, pre, body, end, post, acc;
        a.enc = enc;
        a.p = &p;
        start = st_new(&a, N_SPLIT, 0);
        pre = st_new(&a, N_EDGES, 0);
        body = st_new(&a, N_EDGES, 0);
        if (!p.bad && !p.oom) {
            a.s[start].out = body;
            a.s[start].out1 = pre;
            spell_any(&a, pre, start);
            end = emit(&a, &t, root, body);
            post = st_new(&a, N_SPLIT, 0);
            acc = st_new(&a, N_ACCEPT, 0);
            if (end && post && acc) {
                uint32_t more = st_new(&a, N_EDGES, 0);
                a.s[end].kind = N_EPS;
                a.s[end].out = post;
                a.s[post].out = acc;
                a.s[post].out1 = more;
                spell_any(&a, more, post);
                if (!p.bad && !p.oom) d = determinize(&a, lo, hi, empty, raw);
            }
        }
    }
    if (*empty && mlen && !msg[0]) snprintf(msg, mlen, "no string of %d to %d characters matches the pattern", lo, hi);
    *oom = p.oom;
    if (p.oom && mlen) snprintf(msg, mlen, "out of memory compiling the pattern");
    for (size_t i = 0; i < t.n; i++) free(t.v[i].cls.r);
    free(t.v);
    free(a.s);
    free(a.e);
    free(a.e_from);
    free(p.cp);
    return d;
}

kdfa *kregex_compile(const char *re, size_t len, int flags, int enc, int32_t lo, int32_t hi, int *empty, int *oom,
                     char *msg, size_t mlen)
{
    return compile(re, len, flags, enc, lo, hi, empty, oom, msg, mlen, NULL);
}

int kregex_table(const char *re, size_t len, int flags, int enc, uint32_t *n, uint32_t **next, uint8_t **fl, int *oom, char *msg, size_t mlen)
{
    raw_table raw = {0};
    int empty;
    compile(re, len, flags, enc, 0, 0, &empty, oom, msg, mlen, &raw);
    if (!raw.next) { free(raw.flags); return -1; }
    *n = raw.n; *next = raw.next; *fl = raw.flags;
    return 0;
}

/* ---- formats -------------------------------------------------------------------------------- */

#define DATE_RE "(?:\\d\\d(?:[2468][048]|[13579][26]|0[48])|(?:[02468][048]|[13579][26])00)-02-29|" \
                "\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|02-(?:0[1-9]|1\\d|2[0-8]))"
#define TIME_RE "(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d+)?(?:z|[+-](?:[01]\\d|2[0-3])(?::?[0-5]\\d)?)"
#define DUR_TIME "T(?:\\d+H(?:\\d+M)?(?:\\d+S)?|\\d+M(?:\\d+S)?|\\d+S)"
#define IPV4_OCTET "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)"
#define IPV4_RE "(?:" IPV4_OCTET "\\.){3}" IPV4_OCTET
#define H16 "[0-9a-f]{1,4}"
#define LS32 "(?:" H16 ":" H16 "|" IPV4_RE ")"

/* Each a grammar in this file's own pattern dialect, anchored, case-insensitive where ajv's is;
 * max: a length no string of the format exceeds here (0: none). */
static const struct { const char *name, *re; int icase; int32_t max; } FORMATS[] = {
    {"date", "^(?:" DATE_RE ")$", 0, 0},
    {"time", "^" TIME_RE "$", 1, 0},
    {"date-time", "^(?:" DATE_RE ")[t ]" TIME_RE "$", 1, 0},
    /* ajv's with its lookaheads spelled out: P, then weeks alone, or a date part and/or a time part
     * that each hold at least one figure */
    {"duration", "^P(?:\\d+W|(?:\\d+Y(?:\\d+M)?(?:\\d+D)?|\\d+M(?:\\d+D)?|\\d+D)(?:" DUR_TIME ")?|" DUR_TIME ")$", 0, 0},
    {"email", "^[a-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\\.)+"
              "[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$", 1, 0},
    /* ajv's lookahead (?=.{1,253}\.?$) as a length: at most 253 characters, the final dot included */
    {"hostname", "^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\\.[a-z0-9](?:[-0-9a-z]{0,61}[0-9a-z])?)*\\.?$", 1, 253},
    {"ipv4", "^" IPV4_RE "$", 0, 0},
    {"ipv6", "^(?:(?:" H16 ":){6}" LS32 "|::(?:" H16 ":){5}" LS32 "|(?:" H16 ")?::(?:" H16 ":){4}" LS32
             "|(?:(?:" H16 ":){0,1}" H16 ")?::(?:" H16 ":){3}" LS32 "|(?:(?:" H16 ":){0,2}" H16 ")?::(?:" H16 ":){2}" LS32
             "|(?:(?:" H16 ":){0,3}" H16 ")?::" H16 ":" LS32 "|(?:(?:" H16 ":){0,4}" H16 ")?::" LS32
             "|(?:(?:" H16 ":){0,5}" H16 ")?::" H16 "|(?:(?:" H16 ":){0,6}" H16 ")?::)$", 1, 0},
    /* RFC 3986 as ajv reads it, without the [IP-literal] host */
    {"uri", "^[a-z][a-z0-9+\\-.]*:(?:\\/?\\/(?:(?:[a-z0-9\\-._~!$&'()*+,;=:]|%[0-9a-f]{2})*@)?"
            "(?:" IPV4_RE "|(?:[a-z0-9\\-._~!$&'()*+,;=]|%[0-9a-f]{2})*)(?::\\d*)?"
            "(?:\\/(?:[a-z0-9\\-._~!$&'()*+,;=:@]|%[0-9a-f]{2})*)*"
            "|\\/(?:(?:[a-z0-9\\-._~!$&'()*+,;=:@]|%[0-9a-f]{2})+(?:\\/(?:[a-z0-9\\-._~!$&'()*+,;=:@]|%[0-9a-f]{2})*)*)?"
            "|(?:[a-z0-9\\-._~!$&'()*+,;=:@]|%[0-9a-f]{2})+(?:\\/(?:[a-z0-9\\-._~!$&'()*+,;=:@]|%[0-9a-f]{2})*)*)"
            "(?:\\?(?:[a-z0-9\\-._~!$&'()*+,;=:@/?]|%[0-9a-f]{2})*)?(?:#(?:[a-z0-9\\-._~!$&'()*+,;=:@/?]|%[0-9a-f]{2})*)?$", 1, 0},
    {"uuid", "^(?:urn:uuid:)?[0-9a-f]{8}-(?:[0-9a-f]{4}-){3}[0-9a-f]{12}$", 1, 0},
};
#define N_FORMATS (sizeof FORMATS / sizeof *FORMATS)

const char *const kregex_format_names[] = {"date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uuid", NULL};

kdfa *kregex_format(const char *name, int enc, int32_t lo, int32_t hi, int *known, int *empty, int *oom, char *msg, size_t mlen)
{
    *known = 0;
    *empty = *oom = 0;
    for (size_t i = 0; i < N_FORMATS; i++) {
        if (strcmp(FORMATS[i].name, name)) continue;
        *known = 1;
        if (FORMATS[i].max && hi > FORMATS[i].max) hi = FORMATS[i].max;
        return kregex_compile(FORMATS[i].re, strlen(FORMATS[i].re), FORMATS[i].icase ? KREGEX_ICASE : 0, enc, lo, hi, empty, oom, msg, mlen);
    }
    return NULL;
}
