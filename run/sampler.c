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

int ksampler_init(ksampler *s, float temp, int top_k, float top_p, float min_p, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    s->temp = temp;
    s->top_k = top_k;
    s->top_p = top_p;
    s->min_p = min_p;
    for (int i = 0; i < 4; i++) s->s[i] = splitmix64(&seed);
    return 0;
}

void ksampler_free(ksampler *s)
{
    free(s->order);
    free(s->prob);
    memset(s, 0, sizeof *s);
}

int32_t ksampler_argmax(const float *x, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

static const float *sort_logits;
static int by_logit(const void *a, const void *b)
{
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    if (sort_logits[i] != sort_logits[j]) return sort_logits[i] > sort_logits[j] ? -1 : 1;
    return (i > j) - (i < j);  /* ties: lower id first, so the order is total */
}

int32_t ksampler_pick(ksampler *s, const float *logits, size_t n)
{
    size_t m = n;
    double z = 0, u, acc = 0;
    if (s->temp <= 0) return ksampler_argmax(logits, n);
    if (s->cap < n) {
        uint32_t *o = realloc(s->order, n * sizeof *o);
        double *p = o ? realloc(s->prob, n * sizeof *p) : NULL;
        if (o) s->order = o;
        if (!o || !p) return -1;
        s->prob = p;
        s->cap = n;
    }
    for (size_t i = 0; i < n; i++) s->order[i] = (uint32_t)i;
    sort_logits = logits;
    qsort(s->order, n, sizeof *s->order, by_logit);
    if (s->top_k > 0 && (size_t)s->top_k < m) m = (size_t)s->top_k;
    /* probabilities at temperature, in descending order */
    for (size_t i = 0; i < m; i++) {
        s->prob[i] = exp(((double)logits[s->order[i]] - (double)logits[s->order[0]]) / s->temp);
        z += s->prob[i];
    }
    for (size_t i = 0; i < m; i++) s->prob[i] /= z;
    if (s->min_p > 0) {
        size_t k = 1;
        while (k < m && s->prob[k] >= s->min_p * s->prob[0]) k++;
        m = k;
    }
    if (s->top_p < 1) {
        double c = 0;
        size_t k = 0;
        while (k < m) { c += s->prob[k++]; if (c >= s->top_p) break; }
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
