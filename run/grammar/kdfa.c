/* Byte automata of a string's text (kdfa.h): minimizing, intersecting, the length tables, walking. */
#include "kdfa.h"

#include <stdlib.h>
#include <string.h>

#define NO_MAX 0x7ffffffe         /* hi at or above: no maxLength */
#define PRODUCT_MAX (4 * KDFA_MAX_STATES)

void kdfa_free(kdfa *d)
{
    if (!d) return;
    free(d->next);
    free(d->flags);
    free(d->first);
    free(d->class_bytes);
    free(d->lens);
    free(d->most);
    free(d);
}

/* ---- lengths ------------------------------------------------------------------------------- */

/* Any bit of w in [from, to]? */
static int any_in(const uint64_t *w, int64_t from, int64_t to)
{
    if (from < 0) from = 0;
    for (int64_t i = from >> 6; from <= to && i <= to >> 6; i++) {
        uint64_t x = w[i];
        if (i == from >> 6) x &= ~0ull << (from & 63);
        if (i == to >> 6 && (to & 63) != 63) x &= (1ull << ((to & 63) + 1)) - 1;
        if (x) return 1;
    }
    return 0;
}

/* dst |= src shifted up by k (0 or 1) bits, bits 0..span; returns whether dst changed. */
static int or_shift(uint64_t *dst, const uint64_t *src, size_t words, int k, int32_t span)
{
    int changed = 0;
    for (size_t w = words; w-- > 0;) {
        uint64_t v = k ? (src[w] << 1) | (w ? src[w - 1] >> 63 : 0) : src[w];
        if (w == words - 1) {
            unsigned top = (unsigned)((span + 1) - (int32_t)(w * 64));   /* bits used in the last word */
            if (top < 64) v &= (1ull << top) - 1;
        }
        if (v & ~dst[w]) { dst[w] |= v; changed = 1; }
    }
    return changed;
}

/* Each state's predecessors, one entry per distinct edge: pred[first[t] .. first[t + 1]); out[s]: its
 * distinct successors.  -1 when out of memory. */
static int predecessors(const kdfa *d, uint32_t **first, uint32_t **pred, uint32_t **out)
{
    uint32_t n = d->n, nc = d->n_classes;
    uint32_t *f = calloc((size_t)n + 1, sizeof *f), *o = calloc((size_t)n + 1, sizeof *o), *fill = calloc((size_t)n + 1, sizeof *fill), *p = NULL;
    uint32_t *seen = malloc((size_t)(n ? n : 1) * sizeof *seen);   /* the last (pass, s) with an edge to t */
    size_t edges = 0;
    if (!f || !o || !fill || !seen) goto fail;
    memset(seen, 0xff, (size_t)n * sizeof *seen);
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t s = 0; s < n; s++)
            for (uint32_t c = 0; c < nc; c++) {
                uint32_t t = d->next[(size_t)s * nc + c];
                if (t == KDFA_DEAD || seen[t] == (uint32_t)pass * n + s) continue;
                seen[t] = (uint32_t)pass * n + s;
                if (!pass) { f[t + 1]++; o[s]++; edges++; }
                else p[f[t] + fill[t]++] = s;
            }
        if (!pass) {
            for (uint32_t t = 0; t < n; t++) f[t + 1] += f[t];
            if (!(p = malloc((edges ? edges : 1) * sizeof *p))) goto fail;
        }
    }
    free(fill); free(seen);
    *first = f; *pred = p; *out = o;
    return 0;
fail:
    free(f); free(o); free(fill); free(p); free(seen);
    return -1;
}

/* The length tables (kdfa.h).  -1 when out of memory. */
static int lengths(kdfa *d)
{
    uint32_t n = d->n, *first, *pred, *out, *work = malloc((size_t)(n ? n : 1) * sizeof *work);
    uint8_t *queued = calloc(n ? n : 1, 1);
    size_t head = 0, tail = 0;
    int rc = -1;
    if (!work || !queued || predecessors(d, &first, &pred, &out)) { free(work); free(queued); return -1; }
    if (d->hi < NO_MAX) {
        /* worklist: a state's set grows by its successors' (shifted by one where a character starts) */
        size_t W;
        if (d->hi - d->lo > KDFA_LEN_CAP) d->hi = d->lo + KDFA_LEN_CAP;
        W = ((size_t)d->hi + 1 + 63) / 64;
        d->words = W;
        if (!(d->lens = calloc((size_t)n * W, sizeof *d->lens))) goto out;
        for (uint32_t s = 0; s < n; s++)
            if (d->flags[s] & KDFA_ACCEPT) { d->lens[(size_t)s * W] |= 1; work[tail++ % n] = s; queued[s] = 1; }
        while (head != tail) {
            uint32_t t = work[head++ % n];
            queued[t] = 0;
            for (uint32_t k = first[t]; k < first[t + 1]; k++) {
                uint32_t s = pred[k];
                if (or_shift(d->lens + (size_t)s * W, d->lens + (size_t)t * W, W, (d->flags[s] & KDFA_BOUNDARY) != 0, d->hi) && !queued[s]) {
                    queued[s] = 1;
                    work[tail++ % n] = s;
                }
            }
        }
    } else {
        /* the most characters before an end: states settled from the ends backwards once all their
         * successors are; those never settled are on or before a cycle: unbounded */
        if (!(d->most = malloc((size_t)(n ? n : 1) * sizeof *d->most))) goto out;
        for (uint32_t s = 0; s < n; s++) {
            d->most[s] = KDFA_UNBOUNDED;
            queued[s] = 0;
            if (!out[s]) { d->most[s] = 0; work[tail++] = s; }
        }
        while (head < tail) {
            uint32_t t = work[head++];
            for (uint32_t k = first[t]; k < first[t + 1]; k++) {
                uint32_t s = pred[k];
                if (--out[s]) continue;
                /* every successor settled: the most over them */
                {
                    int32_t m = (d->flags[s] & KDFA_ACCEPT) ? 0 : -1, step = (d->flags[s] & KDFA_BOUNDARY) ? 1 : 0;
                    for (uint32_t c = 0; c < d->n_classes; c++) {
                        uint32_t u = d->next[(size_t)s * d->n_classes + c];
                        if (u != KDFA_DEAD && d->most[u] + step > m) m = d->most[u] + step;
                    }
                    d->most[s] = m;
                    work[tail++] = s;
                }
            }
        }
    }
    rc = 0;
out:
    free(first); free(pred); free(out); free(work); free(queued);
    return rc;
}

/* Can an accepted end follow state t with ca characters so far? */
static int feasible(const kdfa *d, uint32_t t, int32_t ca)
{
    if (d->lens) return any_in(d->lens + (size_t)t * d->words, (int64_t)d->lo - ca, (int64_t)d->hi - ca);
    if (!d->lo) return 1;
    return d->most[t] == KDFA_UNBOUNDED || (int64_t)ca + d->most[t] >= d->lo;
}

/* ---- building ------------------------------------------------------------------------------ */

/* An automaton as kdfa_from_columns takes it: n states, next[s * w + col[b]] after byte b. */
typedef struct {
    uint32_t n, w;
    const uint8_t *col;
    const uint32_t *next;
    const uint8_t *flags;
} table;

/* live[s]: s is reachable from the start and an accepting state is reachable from it.  One search
 * forwards from the start, then one backwards over the reverse edges from the accepting states.
 * -1 when out of memory. */
static int live_states(const table *tb, uint8_t *live)
{
    uint32_t n = tb->n, w = tb->w;
    const uint32_t *next = tb->next;
    uint8_t *reach = calloc(n, 1);
    uint32_t *stack = malloc((size_t)n * sizeof *stack), *first = calloc((size_t)n + 1, sizeof *first), *pred = NULL;
    size_t sp = 0, edges = 0;
    int rc = -1;
    if (!reach || !stack || !first) goto out;
    reach[0] = 1;
    stack[sp++] = 0;
    while (sp) {
        uint32_t s = stack[--sp];
        for (uint32_t c = 0; c < w; c++) {
            uint32_t t = next[(size_t)s * w + c];
            if (t != KDFA_DEAD && !reach[t]) { reach[t] = 1; stack[sp++] = t; }
        }
    }
    /* the reverse edges of the reachable states (a run of columns to the same state: one edge) */
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t s = 0; s < n; s++) {
            uint32_t prev = KDFA_DEAD;
            if (!reach[s]) continue;
            for (uint32_t c = 0; c < w; c++) {
                uint32_t t = next[(size_t)s * w + c];
                if (t == KDFA_DEAD || t == prev) continue;
                prev = t;
                if (!pass) { first[t + 1]++; edges++; }
                else pred[first[t]++] = s;
            }
        }
        if (!pass) {
            for (uint32_t t = 0; t < n; t++) first[t + 1] += first[t];
            if (!(pred = malloc((edges ? edges : 1) * sizeof *pred))) goto out;
        } else {
            /* the fill moved each first[t] to the start of t + 1's: back by one */
            memmove(first + 1, first, (size_t)n * sizeof *first);
            first[0] = 0;
        }
    }
    for (uint32_t s = 0; s < n; s++) {
        live[s] = reach[s] && (tb->flags[s] & KDFA_ACCEPT);
        if (live[s]) stack[sp++] = s;
    }
    while (sp) {
        uint32_t t = stack[--sp];
        for (uint32_t k = first[t]; k < first[t + 1]; k++)
            if (!live[pred[k]]) { live[pred[k]] = 1; stack[sp++] = pred[k]; }
    }
    rc = 0;
out:
    free(reach); free(stack); free(first); free(pred);
    return rc;
}

/* A transition (column c) over the live states: a dead one, or one to a state that is not live, is
 * KDFA_DEAD. */
static uint32_t live_next(const table *tb, const uint8_t *live, uint32_t s, uint32_t c)
{
    uint32_t t = tb->next[(size_t)s * tb->w + c];
    return t != KDFA_DEAD && live[t] ? t : KDFA_DEAD;
}

/* Byte classes: bytes whose columns (over the live states) are equal, numbered in the order of their
 * first byte.  The columns' partition refined by one row after another (the table read in its
 * order): columns stay together while their class and their target in the row agree; then each
 * byte takes its column's class.  Returns the count. */
static uint32_t byte_classes(const table *tb, const uint8_t *live, uint8_t cls[256])
{
    uint32_t w = tb->w, n_cls = 1, count = 0, num[256];
    uint8_t ccls[256];
    memset(ccls, 0, w);
    for (uint32_t s = 0; s < tb->n && n_cls < w; s++) {
        /* (class, target) -> new class, open addressing over the row's at most 256 pairs */
        uint32_t key_cls[512], key_t[512];
        uint8_t val[512], fresh[256];
        if (!live[s]) continue;
        count = 0;
        memset(key_cls, 0xff, sizeof key_cls);
        for (uint32_t c = 0; c < w; c++) {
            uint32_t t = live_next(tb, live, s, c), h = (ccls[c] * 0x9E3779B1u ^ t * 0x85EBCA77u) >> 23;
            while (key_cls[h] != 0xffffffffu && !(key_cls[h] == ccls[c] && key_t[h] == t)) h = (h + 1) & 511;
            if (key_cls[h] == 0xffffffffu) { key_cls[h] = ccls[c]; key_t[h] = t; val[h] = (uint8_t)count++; }
            fresh[c] = val[h];
        }
        memcpy(ccls, fresh, w);
        n_cls = count;
    }
    /* numbered by first byte (the columns need not be in byte order) */
    for (uint32_t k = 0; k < 256; k++) num[k] = KDFA_DEAD;
    count = 0;
    for (int b = 0; b < 256; b++) {
        uint8_t k = ccls[tb->col[b]];
        if (num[k] == KDFA_DEAD) num[k] = count++;
        cls[b] = (uint8_t)num[k];
    }
    return count;
}

/* A refinable partition of the states (Valmari and Lehtinen's layout) and Hopcroft's queue of splitters. */
typedef struct {
    uint32_t *elems, *loc, *blk;     /* the states, each block a run of elems; where each is; its block */
    uint32_t *bfirst, *bend, *bmid;  /* per block: its run [bfirst, bend), marked states [bfirst, bmid) */
    uint32_t *touched, n_touched;    /* blocks with a marked state */
    uint32_t *work, n_work;          /* splitters to come */
    uint8_t *queued;
    uint32_t n_blocks;
} partition;

static void part_mark(partition *p, uint32_t s)
{
    uint32_t b = p->blk[s], i = p->loc[s], j = p->bmid[b], o;
    if (i < j) return;
    o = p->elems[j];
    if (j == p->bfirst[b]) p->touched[p->n_touched++] = b;
    p->elems[j] = s; p->loc[s] = j;
    p->elems[i] = o; p->loc[o] = i;
    p->bmid[b] = j + 1;
}

static void part_queue(partition *p, uint32_t b)
{
    p->queued[b] = 1;
    p->work[p->n_work++] = b;
}

/* Each touched block: its marked states split off (unless all are). */
static void part_split(partition *p)
{
    while (p->n_touched) {
        uint32_t b = p->touched[--p->n_touched], nb;
        if (p->bmid[b] == p->bend[b]) { p->bmid[b] = p->bfirst[b]; continue; }
        nb = p->n_blocks++;
        p->bfirst[nb] = p->bmid[nb] = p->bfirst[b];
        p->bend[nb] = p->bmid[b];
        p->bfirst[b] = p->bmid[b] = p->bend[nb];
        for (uint32_t i = p->bfirst[nb]; i < p->bend[nb]; i++) p->blk[p->elems[i]] = nb;
        if (p->queued[b]) part_queue(p, nb);
        else part_queue(p, p->bend[nb] - p->bfirst[nb] <= p->bend[b] - p->bfirst[b] ? nb : b);
    }
}

/* Equivalent live states merged: Hopcroft's refinement over the byte classes, starting from the
 * states' flags (KDFA_ACCEPT, KDFA_BOUNDARY), with one more state standing for every dead transition.
 * A block taken as splitter splits, class by class, every block that holds both predecessors of its
 * states by that class and others; of two halves only the smaller is queued (both when the split
 * block was queued still), so each state is in O(log n) splitters: O(k n log n) for k classes.
 * block[s] for each live state: blocks numbered in the order of their first state (the start's is
 * 0), rep[k] that first state.  Returns the count, or KDFA_DEAD when out of memory. */
static uint32_t refine(const table *tb, const uint8_t *live, const uint8_t cls[256], uint32_t n_cls, uint32_t *block, uint32_t *rep)
{
    uint32_t n = tb->n;
    partition p = {0};
    uint32_t m = 0, *idx = malloc((size_t)n * sizeof *idx), *orig = malloc((size_t)n * sizeof *orig), *first = NULL, *src = NULL, *snap = NULL;
    uint32_t *cnt = NULL, *bucket = NULL, *num = NULL, result = KDFA_DEAD, sink;
    uint8_t *pcls = NULL, rep_col[256];
    size_t edges = 0;
    if (!idx || !orig) goto out;
    for (uint32_t s = 0; s < n; s++) if (live[s]) { idx[s] = m; orig[m++] = s; }
    sink = m;
    for (int b = 255; b >= 0; b--) rep_col[cls[b]] = tb->col[b];
    /* the predecessors of each state (and the sink) by class: (src, pcls)[first[t] .. first[t + 1]) */
    if (!(first = calloc((size_t)m + 2, sizeof *first))) goto out;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < m; i++)
            for (uint32_t c = 0; c < n_cls; c++) {
                uint32_t t = live_next(tb, live, orig[i], rep_col[c]);
                t = t == KDFA_DEAD ? sink : idx[t];
                if (!pass) first[t + 1]++;
                else { src[first[t]] = i; pcls[first[t]++] = (uint8_t)c; }
            }
        if (!pass) {
            for (uint32_t t = 0; t <= m; t++) first[t + 1] += first[t];
            edges = first[m + 1];
            src = malloc((edges ? edges : 1) * sizeof *src);
            pcls = malloc(edges ? edges : 1);
            if (!src || !pcls) goto out;
        } else {
            memmove(first + 1, first, ((size_t)m + 1) * sizeof *first);
            first[0] = 0;
        }
    }
    {
        size_t k = (size_t)m + 1;
        p.elems = malloc(k * sizeof *p.elems); p.loc = malloc(k * sizeof *p.loc); p.blk = malloc(k * sizeof *p.blk);
        p.bfirst = malloc(k * sizeof *p.bfirst); p.bend = malloc(k * sizeof *p.bend); p.bmid = malloc(k * sizeof *p.bmid);
        p.touched = malloc(k * sizeof *p.touched); p.work = malloc(k * sizeof *p.work); p.queued = calloc(k, 1);
        snap = malloc(k * sizeof *snap);
        cnt = malloc(((size_t)n_cls + 1) * sizeof *cnt);
        bucket = malloc((edges ? edges : 1) * sizeof *bucket);
        num = malloc(k * sizeof *num);
        if (!p.elems || !p.loc || !p.blk || !p.bfirst || !p.bend || !p.bmid || !p.touched || !p.work || !p.queued || !snap || !cnt || !bucket || !num)
            goto out;
    }
    /* the initial blocks: the live states by their flags (0..3), the sink (4); all but the largest
     * queued (the partition is stable with respect to all the states, so with respect to that one
     * once with respect to the others) */
    {
        uint32_t of_key[5], at = 0, largest = 0;
        for (int key = 0; key < 5; key++) {
            of_key[key] = KDFA_DEAD;
            for (uint32_t i = 0; i <= m; i++) {
                if ((i == sink ? 4 : tb->flags[orig[i]] & (KDFA_ACCEPT | KDFA_BOUNDARY)) != key) continue;
                if (of_key[key] == KDFA_DEAD) {
                    of_key[key] = p.n_blocks++;
                    p.bfirst[of_key[key]] = p.bmid[of_key[key]] = at;
                }
                p.elems[at] = i; p.loc[i] = at++; p.blk[i] = of_key[key];
                p.bend[of_key[key]] = at;
            }
        }
        for (uint32_t b = 1; b < p.n_blocks; b++) if (p.bend[b] - p.bfirst[b] > p.bend[largest] - p.bfirst[largest]) largest = b;
        for (uint32_t b = 0; b < p.n_blocks; b++) if (b != largest) part_queue(&p, b);
    }
    while (p.n_work) {
        uint32_t b = p.work[--p.n_work], ns = 0;
        size_t total = 0;
        p.queued[b] = 0;
        /* its states as they are now (splitting it below does not change what it splits by) */
        for (uint32_t i = p.bfirst[b]; i < p.bend[b]; i++) snap[ns++] = p.elems[i];
        /* their predecessors, bucketed by class */
        memset(cnt, 0, ((size_t)n_cls + 1) * sizeof *cnt);
        for (uint32_t i = 0; i < ns; i++)
            for (uint32_t k = first[snap[i]]; k < first[snap[i] + 1]; k++) cnt[pcls[k] + 1]++;
        for (uint32_t c = 0; c < n_cls; c++) cnt[c + 1] += cnt[c];
        total = cnt[n_cls];
        if (!total) continue;
        for (uint32_t i = 0; i < ns; i++)
            for (uint32_t k = first[snap[i]]; k < first[snap[i] + 1]; k++) bucket[cnt[pcls[k]]++] = src[k];
        /* (cnt[c] is now the end of class c's bucket) */
        for (uint32_t c = 0, from = 0; c < n_cls; from = cnt[c++]) {
            if (from == cnt[c]) continue;
            for (uint32_t k = from; k < cnt[c]; k++) part_mark(&p, bucket[k]);
            part_split(&p);
        }
    }
    /* numbered in the order of their first state */
    for (uint32_t k = 0; k < p.n_blocks; k++) num[k] = KDFA_DEAD;
    result = 0;
    for (uint32_t i = 0; i < m; i++) {
        uint32_t b = p.blk[i];
        if (num[b] == KDFA_DEAD) { num[b] = result; rep[result++] = orig[i]; }
        block[orig[i]] = num[b];
    }
out:
    free(idx); free(orig); free(first); free(src); free(pcls); free(snap); free(cnt); free(bucket); free(num);
    free(p.elems); free(p.loc); free(p.blk); free(p.bfirst); free(p.bend); free(p.bmid); free(p.touched); free(p.work); free(p.queued);
    return result;
}

/* Minimize the automaton (states that cannot reach an accepting one, or cannot be reached, dropped;
 * equivalent states merged), into d. */
static kdfa *from_table(const table *tb, int enc, int32_t lo, int32_t hi, int *empty)
{
    uint32_t n = tb->n;
    const uint32_t *next = tb->next;
    const uint8_t *flags = tb->flags;
    kdfa *d = NULL;
    uint8_t *live = calloc(n ? n : 1, 1);
    uint32_t *block = malloc((size_t)(n ? n : 1) * sizeof *block), *rep = malloc((size_t)(n ? n : 1) * sizeof *rep);
    uint8_t col_cls[256], rep_col[256];
    uint32_t n_cls, n_blocks;
    *empty = 0;
    if (!live || !block || !rep) goto fail;
    if (!n) { *empty = 1; goto fail; }
    if (live_states(tb, live)) goto fail;
    if (!live[0]) { *empty = 1; goto fail; }
    n_cls = byte_classes(tb, live, col_cls);
    if ((n_blocks = refine(tb, live, col_cls, n_cls, block, rep)) == KDFA_DEAD) goto fail;
    d = calloc(1, sizeof *d);
    if (!d) goto fail;
    d->n = n_blocks;
    d->n_classes = n_cls;
    memcpy(d->cls, col_cls, 256);
    d->enc = enc;
    d->lo = lo;
    d->hi = hi;
    d->next = malloc((size_t)n_blocks * n_cls * sizeof *d->next);
    d->flags = malloc(n_blocks);
    d->first = calloc(n_blocks, sizeof *d->first);
    d->class_bytes = calloc(n_cls, sizeof *d->class_bytes);
    if (!d->next || !d->flags || !d->first || !d->class_bytes) goto fail;
    for (int b = 255; b >= 0; b--) {
        d->class_bytes[col_cls[b]][b >> 3] |= (uint8_t)(1u << (b & 7));
        rep_col[col_cls[b]] = tb->col[b];
    }
    for (uint32_t k = 0; k < n_blocks; k++) {
        uint32_t s = rep[k];
        d->flags[k] = flags[s] & (KDFA_ACCEPT | KDFA_BOUNDARY);
        for (uint32_t c = 0; c < n_cls; c++) {
            uint32_t t = next[(size_t)s * tb->w + rep_col[c]];
            uint32_t v = t != KDFA_DEAD && live[t] ? block[t] : KDFA_DEAD;
            d->next[(size_t)k * n_cls + c] = v;
            if (v != KDFA_DEAD)
                for (int x = 0; x < 32; x++) d->first[k][x] |= d->class_bytes[c][x];
        }
    }
    if (lengths(d)) goto fail;
    if (!feasible(d, 0, 0)) { *empty = 1; goto fail; }
    free(live); free(block); free(rep);
    return d;
fail:
    kdfa_free(d);
    free(live); free(block); free(rep);
    return NULL;
}

kdfa *kdfa_from_table(uint32_t n, const uint32_t *next, const uint8_t *flags, int enc, int32_t lo, int32_t hi, int *empty)
{
    uint8_t identity[256];
    table tb = {n, 256, identity, next, flags};
    for (int b = 0; b < 256; b++) identity[b] = (uint8_t)b;
    return from_table(&tb, enc, lo, hi, empty);
}

kdfa *kdfa_from_columns(uint32_t n, uint32_t w, const uint8_t col[256], const uint32_t *next, const uint8_t *flags, int enc, int32_t lo, int32_t hi,
                        int *empty)
{
    table tb = {n, w, col, next, flags};
    return from_table(&tb, enc, lo, hi, empty);
}

/* The product's states so far: pairs (pa, pb), their flags and rows of w columns, and an open-addressing
 * table of the pairs (at most a quarter full); grown by doubling. */
typedef struct {
    uint32_t *pa, *pb, *next, *hash;
    uint8_t *flags;
    size_t n, cap, hcap, w;
} product;

static size_t pair_slot(const product *z, uint32_t x, uint32_t y)
{
    uint64_t key = (uint64_t)x * 0x9E3779B97F4A7C15ull ^ ((uint64_t)y + 0x632BE59BD9B4E019ull);
    size_t h = (size_t)(key % z->hcap);
    while (z->hash[h] != 0xffffffffu && !(z->pa[z->hash[h]] == x && z->pb[z->hash[h]] == y)) h = (h + 1) % z->hcap;
    return h;
}

static int product_grow(product *z)
{
    size_t cap = z->cap ? 2 * z->cap : 64, hcap = 4 * cap + 1;
    uint32_t *pa, *pb, *next, *hash;
    uint8_t *flags;
    if (cap > PRODUCT_MAX) cap = PRODUCT_MAX;
    if ((pa = realloc(z->pa, cap * sizeof *pa))) z->pa = pa;
    if ((pb = realloc(z->pb, cap * sizeof *pb))) z->pb = pb;
    if ((flags = realloc(z->flags, cap))) z->flags = flags;
    if ((next = realloc(z->next, cap * z->w * sizeof *next))) z->next = next;
    if (!pa || !pb || !flags || !next || !(hash = malloc(hcap * sizeof *hash))) return -1;
    memset(hash, 0xff, hcap * sizeof *hash);
    free(z->hash);
    z->hash = hash;
    z->hcap = hcap;
    z->cap = cap;
    for (size_t k = 0; k < z->n; k++) z->hash[pair_slot(z, z->pa[k], z->pb[k])] = (uint32_t)k;
    return 0;
}

/* The pair's state, made when new: KDFA_DEAD when there is no room (*too_big) or memory. */
static uint32_t pair_state(product *z, uint32_t x, uint32_t y, int *too_big)
{
    size_t h = z->hcap ? pair_slot(z, x, y) : 0;
    if (z->hcap && z->hash[h] != 0xffffffffu) return z->hash[h];
    if (z->n == PRODUCT_MAX) { *too_big = 1; return KDFA_DEAD; }
    if (z->n == z->cap) {
        if (product_grow(z)) return KDFA_DEAD;
        h = pair_slot(z, x, y);
    }
    z->pa[z->n] = x;
    z->pb[z->n] = y;
    z->hash[h] = (uint32_t)z->n;
    return (uint32_t)z->n++;
}

kdfa *kdfa_intersect(const kdfa *a, const kdfa *b, int32_t lo, int32_t hi, int *empty, int *too_big)
{
    product z = {0};
    uint8_t col[256], rep[256];  /* the product's columns: bytes of one class in a and one in b; a byte of each */
    kdfa *d = NULL;
    *empty = *too_big = 0;
    for (int c = 0; c < 256; c++) {
        size_t k = 0;
        while (k < z.w && !(a->cls[rep[k]] == a->cls[c] && b->cls[rep[k]] == b->cls[c])) k++;
        if (k == z.w) rep[z.w++] = (uint8_t)c;
        col[c] = (uint8_t)k;
    }
    if (pair_state(&z, 0, 0, too_big) == KDFA_DEAD) goto out;
    for (size_t s = 0; s < z.n; s++) {
        uint32_t sa = z.pa[s], sb = z.pb[s];
        z.flags[s] = (uint8_t)((a->flags[sa] & b->flags[sb] & KDFA_ACCEPT) | (a->flags[sa] & KDFA_BOUNDARY));
        for (size_t k = 0; k < z.w; k++) {
            uint32_t x = a->next[(size_t)sa * a->n_classes + a->cls[rep[k]]], y = b->next[(size_t)sb * b->n_classes + b->cls[rep[k]]], t = KDFA_DEAD;
            if (x != KDFA_DEAD && y != KDFA_DEAD && (t = pair_state(&z, x, y, too_big)) == KDFA_DEAD) goto out;
            z.next[s * z.w + k] = t;
        }
    }
    d = kdfa_from_columns((uint32_t)z.n, (uint32_t)z.w, col, z.next, z.flags, a->enc, lo, hi, empty);
    if (d && d->n > KDFA_MAX_STATES) { kdfa_free(d); d = NULL; *too_big = 1; }
out:
    free(z.pa); free(z.pb); free(z.next); free(z.flags); free(z.hash);
    return d;
}

/* ---- walking ------------------------------------------------------------------------------- */

int kdfa_byte(const kdfa *d, uint32_t *s, int32_t *chars, uint8_t b)
{
    uint8_t fl = d->flags[*s];
    uint32_t t;
    int32_t ca;
    if (d->enc == KDFA_JSON && b == '"' && (fl & KDFA_BOUNDARY))
        return (fl & KDFA_ACCEPT) && *chars >= d->lo && *chars <= d->hi ? 2 : 0;
    t = d->next[(size_t)*s * d->n_classes + d->cls[b]];
    if (t == KDFA_DEAD) return 0;
    ca = *chars + ((fl & KDFA_BOUNDARY) ? 1 : 0);
    if (ca > d->hi || !feasible(d, t, ca)) return 0;
    *s = t;
    *chars = ca;
    return 1;
}

int kdfa_may_end(const kdfa *d, uint32_t s, int32_t chars)
{
    return (d->flags[s] & KDFA_ACCEPT) && chars >= d->lo && chars <= d->hi;
}

void kdfa_first(const kdfa *d, uint32_t s, int32_t chars, uint8_t set[32])
{
    if (kdfa_unbounded(d)) {
        for (int k = 0; k < 32; k++) set[k] |= d->first[s][k];
    } else {
        /* the lengths decide: class by class, those whose next state can still end in time */
        int32_t ca = chars + ((d->flags[s] & KDFA_BOUNDARY) ? 1 : 0);
        for (uint32_t c = 0; c < d->n_classes && ca <= d->hi; c++) {
            uint32_t t = d->next[(size_t)s * d->n_classes + c];
            if (t == KDFA_DEAD || !feasible(d, t, ca)) continue;
            for (int k = 0; k < 32; k++) set[k] |= d->class_bytes[c][k];
        }
    }
    if (d->enc == KDFA_JSON && (d->flags[s] & KDFA_BOUNDARY) && kdfa_may_end(d, s, chars)) set['"' >> 3] |= (uint8_t)(1u << ('"' & 7));
}

int kdfa_unbounded(const kdfa *d) { return !d->lens && !d->lo; }
