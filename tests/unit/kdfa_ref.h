/* The reference for tests/unit/test_kregex.c: kdfa_from_table as it was before Hopcroft's
 * refinement replaced Moore's (commit bd2f00e's run/grammar/kdfa.c, its building half, renamed
 * ref_*): a naive fixed point for liveness, byte classes by comparing columns, Moore's rounds, and
 * the length tables; and kdfa_intersect with its product table of 16,384 x 256 entries allocated
 * up front.  The test checks that the library builds exactly the same automata. */
#ifndef KRUN_TEST_KDFA_REF_H
#define KRUN_TEST_KDFA_REF_H

#include "run/grammar/kdfa.h"

#include <stdlib.h>
#include <string.h>

#define REF_NO_MAX 0x7ffffffe
/* ---- lengths ------------------------------------------------------------------------------- */

/* Any bit of w in [from, to]? */
static int ref_any_in(const uint64_t *w, int64_t from, int64_t to)
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
static int ref_or_shift(uint64_t *dst, const uint64_t *src, size_t words, int k, int32_t span)
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
static int ref_predecessors(const kdfa *d, uint32_t **first, uint32_t **pred, uint32_t **out)
{
    uint32_t n = d->n, nc = d->n_classes;
    uint32_t *f = calloc((size_t)n + 1, sizeof *f), *o = calloc((size_t)n + 1, sizeof *o), *fill = calloc((size_t)n + 1, sizeof *fill), *p = NULL;
    size_t edges = 0;
    if (!f || !o || !fill) goto fail;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t s = 0; s < n; s++)
            for (uint32_t c = 0; c < nc; c++) {
                uint32_t t = d->next[(size_t)s * nc + c], c2;
                if (t == KDFA_DEAD) continue;
                for (c2 = 0; c2 < c && d->next[(size_t)s * nc + c2] != t; c2++) {}
                if (c2 < c) continue;
                if (!pass) { f[t + 1]++; o[s]++; edges++; }
                else p[f[t] + fill[t]++] = s;
            }
        if (!pass) {
            for (uint32_t t = 0; t < n; t++) f[t + 1] += f[t];
            if (!(p = malloc((edges ? edges : 1) * sizeof *p))) goto fail;
        }
    }
    free(fill);
    *first = f; *pred = p; *out = o;
    return 0;
fail:
    free(f); free(o); free(fill); free(p);
    return -1;
}

/* The length tables (kdfa.h).  -1 when out of memory. */
static int ref_lengths(kdfa *d)
{
    uint32_t n = d->n, *first, *pred, *out, *work = malloc((size_t)(n ? n : 1) * sizeof *work);
    uint8_t *queued = calloc(n ? n : 1, 1);
    size_t head = 0, tail = 0;
    int rc = -1;
    if (!work || !queued || ref_predecessors(d, &first, &pred, &out)) { free(work); free(queued); return -1; }
    if (d->hi < REF_NO_MAX) {
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
                if (ref_or_shift(d->lens + (size_t)s * W, d->lens + (size_t)t * W, W, (d->flags[s] & KDFA_BOUNDARY) != 0, d->hi) && !queued[s]) {
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
static int ref_feasible(const kdfa *d, uint32_t t, int32_t ca)
{
    if (d->lens) return ref_any_in(d->lens + (size_t)t * d->words, (int64_t)d->lo - ca, (int64_t)d->hi - ca);
    if (!d->lo) return 1;
    return d->most[t] == KDFA_UNBOUNDED || (int64_t)ca + d->most[t] >= d->lo;
}

/* ---- building ------------------------------------------------------------------------------ */

/* Minimize the automaton given by a full byte table (states that cannot reach an accepting one, or
 * cannot be reached, dropped; equivalent states merged), into d. */
static kdfa *ref_kdfa_from_table(uint32_t n, const uint32_t *next, const uint8_t *flags, int enc, int32_t lo, int32_t hi, int *empty)
{
    kdfa *d = NULL;
    uint8_t *live = calloc(n ? n : 1, 1), *reach = calloc(n ? n : 1, 1);
    uint32_t *block = malloc((size_t)(n ? n : 1) * sizeof *block), *nb = malloc((size_t)(n ? n : 1) * sizeof *nb);
    uint32_t *stack = malloc((size_t)(n ? n : 1) * sizeof *stack), *sig = NULL, *rep = NULL;
    uint8_t col_cls[256];
    uint32_t n_cls = 0, n_blocks = 0;
    *empty = 0;
    if (!live || !reach || !block || !nb || !stack) goto fail;
    /* reachable from the start */
    {
        size_t sp = 0;
        if (n) { reach[0] = 1; stack[sp++] = 0; }
        while (sp) {
            uint32_t s = stack[--sp];
            for (int b = 0; b < 256; b++) {
                uint32_t t = next[(size_t)s * 256 + b];
                if (t != KDFA_DEAD && !reach[t]) { reach[t] = 1; stack[sp++] = t; }
            }
        }
    }
    /* live: reachable and an accepting state reachable from it (fixed point: n is small) */
    for (uint32_t s = 0; s < n; s++) live[s] = reach[s] && (flags[s] & KDFA_ACCEPT);
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t s = 0; s < n; s++) {
            if (live[s] || !reach[s]) continue;
            for (int b = 0; b < 256; b++) {
                uint32_t t = next[(size_t)s * 256 + b];
                if (t != KDFA_DEAD && live[t]) { live[s] = 1; changed = 1; break; }
            }
        }
    }
    if (!n || !live[0]) { *empty = 1; goto fail; }
    /* byte classes: bytes whose columns (over the live states) are equal */
    {
        uint64_t h[256];
        for (int b = 0; b < 256; b++) {
            h[b] = 1469598103934665603ull;
            for (uint32_t s = 0; s < n; s++) {
                uint32_t x = next[(size_t)s * 256 + b];
                if (!live[s]) continue;
                if (x != KDFA_DEAD && !live[x]) x = KDFA_DEAD;
                h[b] = (h[b] ^ x) * 1099511628211ull;
            }
        }
        for (int b = 0; b < 256; b++) {
            int found = -1;
            for (int b2 = 0; b2 < b && found < 0; b2++) {
                uint32_t s;
                if (h[b2] != h[b]) continue;
                for (s = 0; s < n; s++) {
                    uint32_t x = next[(size_t)s * 256 + b], y = next[(size_t)s * 256 + b2];
                    if (!live[s]) continue;
                    if (x != KDFA_DEAD && !live[x]) x = KDFA_DEAD;
                    if (y != KDFA_DEAD && !live[y]) y = KDFA_DEAD;
                    if (x != y) break;
                }
                if (s == n) found = col_cls[b2];
            }
            col_cls[b] = found >= 0 ? (uint8_t)found : (uint8_t)n_cls++;
        }
    }
    /* Moore's refinement: blocks by flags, then by the blocks of the successors, until stable;
     * signatures numbered through a hash table in the order of their first state (the start's is 0) */
    for (uint32_t s = 0; s < n; s++) block[s] = live[s] ? flags[s] & (KDFA_ACCEPT | KDFA_BOUNDARY) : KDFA_DEAD;
    sig = malloc((size_t)n * (n_cls + 1) * sizeof *sig);
    rep = malloc((size_t)n * sizeof *rep);
    {
        size_t hcap = 2 * (size_t)n + 1;
        uint32_t *tab = malloc(hcap * sizeof *tab);
        if (!sig || !rep || !tab) { free(tab); goto fail; }
        for (;;) {
            uint32_t count = 0;
            memset(tab, 0xff, hcap * sizeof *tab);
            for (uint32_t s = 0; s < n; s++) {
                uint32_t *g = sig + (size_t)s * (n_cls + 1);
                uint64_t hv = 1469598103934665603ull;
                size_t at;
                if (!live[s]) continue;
                g[0] = block[s];
                for (int b = 0; b < 256; b++) {
                    uint32_t t = next[(size_t)s * 256 + b];
                    g[1 + col_cls[b]] = t != KDFA_DEAD && live[t] ? block[t] : KDFA_DEAD;
                }
                for (uint32_t k = 0; k <= n_cls; k++) hv = (hv ^ g[k]) * 1099511628211ull;
                at = (size_t)(hv % hcap);
                while (tab[at] != 0xffffffffu &&
                       memcmp(sig + (size_t)rep[tab[at]] * (n_cls + 1), g, (n_cls + 1) * sizeof *sig)) at = (at + 1) % hcap;
                if (tab[at] == 0xffffffffu) { tab[at] = count; rep[count++] = s; }
                nb[s] = tab[at];
            }
            if (count == n_blocks) break;
            n_blocks = count;
            for (uint32_t s = 0; s < n; s++) if (live[s]) block[s] = nb[s];
        }
        free(tab);
    }
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
    for (int b = 0; b < 256; b++) d->class_bytes[col_cls[b]][b >> 3] |= (uint8_t)(1u << (b & 7));
    for (uint32_t k = 0; k < n_blocks; k++) {
        uint32_t s = rep[k];
        d->flags[k] = flags[s] & (KDFA_ACCEPT | KDFA_BOUNDARY);
        for (int b = 0; b < 256; b++) {
            uint32_t t = next[(size_t)s * 256 + b];
            uint32_t v = t != KDFA_DEAD && live[t] ? block[t] : KDFA_DEAD;
            d->next[(size_t)k * n_cls + col_cls[b]] = v;
            if (v != KDFA_DEAD) d->first[k][b >> 3] |= (uint8_t)(1u << (b & 7));
        }
    }
    if (ref_lengths(d)) goto fail;
    if (!ref_feasible(d, 0, 0)) { *empty = 1; goto fail; }
    free(live); free(reach); free(block); free(nb); free(stack); free(sig); free(rep);
    return d;
fail:
    kdfa_free(d);
    free(live); free(reach); free(block); free(nb); free(stack); free(sig); free(rep);
    return NULL;
}

#define REF_PRODUCT_MAX (4 * KDFA_MAX_STATES)

static kdfa *ref_kdfa_intersect(const kdfa *a, const kdfa *b, int32_t lo, int32_t hi, int *empty, int *too_big)
{
    uint32_t *pa = malloc(REF_PRODUCT_MAX * sizeof *pa), *pb = malloc(REF_PRODUCT_MAX * sizeof *pb), *next = NULL;
    uint8_t *flags = malloc(REF_PRODUCT_MAX);
    uint32_t n = 0;
    kdfa *d = NULL;
    /* an open-addressing table of the pairs seen */
    size_t hcap = 2 * REF_PRODUCT_MAX;
    uint32_t *hash = malloc(hcap * sizeof *hash);
    *empty = *too_big = 0;
    if (!pa || !pb || !flags || !hash) goto out;
    memset(hash, 0xff, hcap * sizeof *hash);
    next = malloc((size_t)REF_PRODUCT_MAX * 256 * sizeof *next);
    if (!next) goto out;
    pa[0] = 0; pb[0] = 0; n = 1;
    hash[0 % hcap] = 0;
    for (uint32_t s = 0; s < n; s++) {
        flags[s] = (uint8_t)((a->flags[pa[s]] & b->flags[pb[s]] & KDFA_ACCEPT) | (a->flags[pa[s]] & KDFA_BOUNDARY));
        for (int c = 0; c < 256; c++) {
            uint32_t x = a->next[(size_t)pa[s] * a->n_classes + a->cls[c]], y = b->next[(size_t)pb[s] * b->n_classes + b->cls[c]];
            uint64_t key;
            size_t h;
            if (x == KDFA_DEAD || y == KDFA_DEAD) { next[(size_t)s * 256 + c] = KDFA_DEAD; continue; }
            key = (uint64_t)x * 0x9E3779B97F4A7C15ull ^ ((uint64_t)y + 0x632BE59BD9B4E019ull);
            h = (size_t)(key % hcap);
            while (hash[h] != 0xffffffffu && !(pa[hash[h]] == x && pb[hash[h]] == y)) h = (h + 1) % hcap;
            if (hash[h] == 0xffffffffu) {
                if (n == REF_PRODUCT_MAX) { *too_big = 1; goto out; }
                pa[n] = x; pb[n] = y;
                hash[h] = n++;
            }
            next[(size_t)s * 256 + c] = hash[h];
        }
    }
    d = ref_kdfa_from_table(n, next, flags, a->enc, lo, hi, empty);
    if (d && d->n > KDFA_MAX_STATES) { kdfa_free(d); d = NULL; *too_big = 1; }
out:
    free(pa); free(pb); free(next); free(flags); free(hash);
    return d;
}

#endif
