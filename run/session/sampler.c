/* The sampler (sampler.h: the contract, step by step). */
#include "sampler.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* ---- the draw: Philox4x64-10 ------------------------------------------------------------------ */

__extension__ typedef unsigned __int128 u128;

/* The constants of Philox4x64 (Random123): the multipliers, and the Weyl increments of the key
 * (the golden ratio and sqrt(3) - 1 as 64-bit fractions). */
#define PHILOX_M0 0xD2E7470EE14C6C93ULL
#define PHILOX_M1 0xCA5A826395121157ULL
#define PHILOX_W0 0x9E3779B97F4A7C15ULL
#define PHILOX_W1 0xBB67AE8584CAA73BULL

void ksampler_philox(const uint64_t ctr[4], const uint64_t key[2], uint64_t out[4])
{
    uint64_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        const u128 p0 = (u128)PHILOX_M0 * c0, p1 = (u128)PHILOX_M1 * c2;
        const uint64_t hi0 = (uint64_t)(p0 >> 64), lo0 = (uint64_t)p0, hi1 = (uint64_t)(p1 >> 64), lo1 = (uint64_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

double ksampler_draw(uint64_t seed, uint64_t stream, uint64_t pos)
{
    const uint64_t ctr[4] = {pos, 0, 0, 0}, key[2] = {seed, stream};
    uint64_t out[4];
    ksampler_philox(ctr, key, out);
    return (double)(out[0] >> 11) * 0x1.0p-53;
}

/* ---- options ----------------------------------------------------------------------------------- */

void ksampler_opts_init(ksampler_opts *o)
{
    memset(o, 0, sizeof *o);
    o->top_p = 1.0f;
    o->repetition_penalty = 1.0f;
}

static float rep_penalty(const ksampler_opts *o) { return o->repetition_penalty > 0 ? o->repetition_penalty : 1.0f; }

int ksampler_uses_history(const ksampler_opts *o)
{
    return rep_penalty(o) != 1.0f || o->presence_penalty != 0 || o->frequency_penalty != 0;
}

void ksampler_init(ksampler *s, const ksampler_opts *o, const ksampler_scratch *x, size_t cap)
{
    memset(s, 0, sizeof *s);
    s->o = *o;
    s->x = *x;
    s->cap = cap;
    memset(s->x.count, 0, cap * sizeof *s->x.count);
}

int32_t ksampler_argmax(const float *x, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

/* ---- step 1: penalties -------------------------------------------------------------------------- */

#define SEEN 0x80000000u   /* count's top bit: the token was penalized already */

/* w (a copy of the logits) penalized for the sequence; count is zero before and after. */
static void penalize(ksampler *s, float *w, size_t n, const ksampler_seq *q)
{
    const float r = rep_penalty(&s->o), f = s->o.frequency_penalty, p = s->o.presence_penalty;
    const int rep = r != 1.0f;
    const size_t from = q->reply_from < q->pos ? q->reply_from : q->pos, first = rep ? 0 : from;
    uint32_t *c = s->x.count;
    for (size_t i = from; i < q->pos; i++)
        if (q->tokens[i] >= 0 && (size_t)q->tokens[i] < n) c[q->tokens[i]]++;
    for (size_t i = first; i < q->pos; i++) {
        const int32_t t = q->tokens[i];
        uint32_t cnt;
        float x;
        if (t < 0 || (size_t)t >= n || (c[t] & SEEN)) continue;
        cnt = c[t];
        c[t] |= SEEN;
        x = w[t];
        if (rep) x = x > 0 ? x / r : x * r;
        if (cnt && f != 0) x = x - (float)cnt * f;
        if (cnt && p != 0) x = x - p;
        if (!isfinite(x)) x = x > 0 ? FLT_MAX : -FLT_MAX;
        w[t] = x;
    }
    for (size_t i = first; i < q->pos; i++)
        if (q->tokens[i] >= 0 && (size_t)q->tokens[i] < n) c[q->tokens[i]] = 0;
}

/* ---- steps 2-5 ---------------------------------------------------------------------------------- */

static int allowed_at(const uint64_t *a, size_t i) { return !a || (a[i / 64] >> (i % 64) & 1); }

/* The canonical order: a before b when its w is larger, ties to the lower id. */
static int first(const float *w, uint32_t a, uint32_t b) { return w[a] != w[b] ? w[a] > w[b] : a < b; }

/* A heap of ids whose top is the first in the canonical order. */
static void sift(uint32_t *h, size_t i, size_t n, const float *w)
{
    for (;;) {
        size_t c = 2 * i + 1;
        uint32_t t;
        if (c >= n) return;
        if (c + 1 < n && first(w, h[c + 1], h[c])) c++;
        if (!first(w, h[c], h[i])) return;
        t = h[i]; h[i] = h[c]; h[c] = t;
        i = c;
    }
}

static void heapify(uint32_t *h, size_t n, const float *w)
{
    for (size_t i = n / 2; i-- > 0;) sift(h, i, n, w);
}

/* The heap's top out (to h[n - 1]); the heap is then h[0..n-1). */
static uint32_t pop(uint32_t *h, size_t n, const float *w)
{
    uint32_t t = h[0];
    h[0] = h[n - 1];
    h[n - 1] = t;
    sift(h, 0, n - 1, w);
    return t;
}

/* The kept ids (prob >= 0) into the heap; returns how many. */
static size_t kept_heap(ksampler *s, size_t n, const float *w)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (s->x.prob[i] >= 0) s->x.order[m++] = (uint32_t)i;
    heapify(s->x.order, m, w);
    return m;
}

static double kept_sum(const double *prob, size_t n)
{
    double z = 0;
    for (size_t i = 0; i < n; i++)
        if (prob[i] >= 0) z += prob[i];
    return z;
}

int32_t ksampler_pick(ksampler *s, const float *logits, size_t n, const ksampler_seq *q)
{
    static const ksampler_seq none = {NULL, 0, 0, NULL};
    const ksampler_opts *o = &s->o;
    const float *w = logits;
    const uint64_t *allowed;
    double *prob = s->x.prob, z, t, acc = 0;
    size_t best = n, kept = 0;
    int32_t last = -1;
    if (!q) q = &none;
    allowed = q->allowed;
    if (n == 0 || n > s->cap) return -1;
    if (ksampler_uses_history(o) && q->pos) {
        memcpy(s->x.work, logits, n * sizeof *s->x.work);
        penalize(s, s->x.work, n, q);
        w = s->x.work;
    }
    /* the best candidate (greedy's answer, and w_max) */
    for (size_t i = 0; i < n; i++)
        if (allowed_at(allowed, i) && (best == n || w[i] > w[best])) best = i;
    if (best == n) return -1;
    if (o->temp <= 0) return (int32_t)best;

    for (size_t i = 0; i < n; i++) {
        prob[i] = allowed_at(allowed, i) ? exp(((double)w[i] - (double)w[best]) / (double)o->temp) : -1.0;
        kept += prob[i] >= 0;
    }
    if (o->top_k > 0 && (size_t)o->top_k < kept) {
        /* the first k in the canonical order stay: pop them, drop what is left in the heap */
        size_t m = kept_heap(s, n, w);
        for (size_t j = 0; j < (size_t)o->top_k; j++) pop(s->x.order, m - j, w);
        for (size_t j = 0; j < m - (size_t)o->top_k; j++) prob[s->x.order[j]] = -1.0;
    }
    if (o->min_p > 0)
        for (size_t i = 0; i < n; i++)
            if (prob[i] >= 0 && prob[i] < (double)o->min_p && i != best) prob[i] = -1.0;
    if (o->top_p < 1) {
        /* the shortest canonical prefix reaching top_p of the mass left */
        const double want = (double)o->top_p * kept_sum(prob, n);
        size_t m = kept_heap(s, n, w), j = 0;
        double run = 0;
        do run += prob[pop(s->x.order, m - j++, w)];
        while (run < want && j < m);
        for (size_t i = 0; i < m - j; i++) prob[s->x.order[i]] = -1.0;
    }
    /* the draw, over the kept tokens in id order */
    z = kept_sum(prob, n);
    t = ksampler_draw(o->seed, o->stream, (uint64_t)q->pos) * z;
    for (size_t i = 0; i < n; i++) {
        if (prob[i] < 0) continue;
        acc += prob[i];
        last = (int32_t)i;
        if (t < acc) return last;
    }
    return last;
}

/* ---- log-probabilities -------------------------------------------------------------------------- */

double ksampler_logprobs(const float *l, size_t n, int32_t id, size_t top_n, int32_t *top_ids, double *top_lp)
{
    size_t best = 0, have = 0;
    double z = 0, logz;
    for (size_t i = 1; i < n; i++) if (l[i] > l[best]) best = i;
    for (size_t i = 0; i < n; i++) z += exp((double)l[i] - (double)l[best]);
    logz = log(z);
    if (top_n > n) top_n = n;
    /* the top_n first in the canonical order, kept sorted by insertion */
    for (size_t i = 0; i < n && top_n; i++) {
        size_t at = have;
        if (have == top_n && !first(l, (uint32_t)i, (uint32_t)top_ids[have - 1])) continue;
        while (at > 0 && first(l, (uint32_t)i, (uint32_t)top_ids[at - 1])) at--;
        if (have < top_n) have++;
        memmove(top_ids + at + 1, top_ids + at, (have - 1 - at) * sizeof *top_ids);
        top_ids[at] = (int32_t)i;
    }
    for (size_t j = 0; j < have; j++) top_lp[j] = ((double)l[top_ids[j]] - (double)l[best]) - logz;
    return id >= 0 && (size_t)id < n ? ((double)l[id] - (double)l[best]) - logz : -INFINITY;
}
