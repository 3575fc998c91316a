#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro256ss(uint64_t s[4])
{
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
    return r;
}

double ksampler_uniform(ksampler *s) { return (double)(xoshiro256ss(s->s) >> 11) * 0x1.0p-53; }

void ksampler_init(ksampler *s, const ksampler_opts *o, uint32_t *order, double *prob, size_t cap)
{
    uint64_t seed = o->seed;
    memset(s, 0, sizeof *s);
    s->o = *o;
    for (int i = 0; i < 4; i++) s->s[i] = splitmix64(&seed);
    s->order = order;
    s->prob = prob;
    s->cap = cap;
}

int32_t ksampler_argmax(const float *x, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

/* Ids by descending logit, ties to the lower id: a total order, so any
 * correct sort gives the same permutation. */
static int before(const float *x, uint32_t i, uint32_t j) { return x[i] != x[j] ? x[i] > x[j] : i < j; }

static void sift(uint32_t *a, size_t root, size_t n, const float *x)
{
    for (;;) {
        size_t c = 2 * root + 1;
        uint32_t t;
        if (c >= n) return;
        /* a max-heap of "last in the order" */
        if (c + 1 < n && before(x, a[c], a[c + 1])) c++;
        if (!before(x, a[root], a[c])) return;
        t = a[root]; a[root] = a[c]; a[c] = t;
        root = c;
    }
}

/* Heapsort: in place, no allocation, O(n log n) whatever the input. */
static void sort_by_logit(uint32_t *a, size_t n, const float *x)
{
    for (size_t i = n / 2; i-- > 0;) sift(a, i, n, x);
    for (size_t end = n; end-- > 1;) {
        uint32_t t = a[0]; a[0] = a[end]; a[end] = t;
        sift(a, 0, end, x);
    }
}

int32_t ksampler_pick(ksampler *s, const float *logits, size_t n)
{
    size_t m = n;
    double z = 0, u, acc = 0;
    if (s->o.temp <= 0) return ksampler_argmax(logits, n);
    if (n > s->cap || n == 0) return -1;
    for (size_t i = 0; i < n; i++) s->order[i] = (uint32_t)i;
    sort_by_logit(s->order, n, logits);
    if (s->o.top_k > 0 && (size_t)s->o.top_k < m) m = (size_t)s->o.top_k;
    /* probabilities at temperature, in descending order */
    for (size_t i = 0; i < m; i++) {
        s->prob[i] = exp(((double)logits[s->order[i]] - (double)logits[s->order[0]]) / s->o.temp);
        z += s->prob[i];
    }
    for (size_t i = 0; i < m; i++) s->prob[i] /= z;
    if (s->o.min_p > 0) {
        size_t k = 1;
        while (k < m && s->prob[k] >= s->o.min_p * s->prob[0]) k++;
        m = k;
    }
    if (s->o.top_p < 1) {
        double c = 0;
        size_t k = 0;
        while (k < m) { c += s->prob[k++]; if (c >= s->o.top_p) break; }
        m = k;
    }
    z = 0;
    for (size_t i = 0; i < m; i++) z += s->prob[i];
    u = ksampler_uniform(s) * z;
    for (size_t i = 0; i < m; i++) {
        acc += s->prob[i];
        if (u < acc) return (int32_t)s->order[i];
    }
    return (int32_t)s->order[m - 1];
}
