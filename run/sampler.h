/* Choosing the next token from the logits.  Greedy by default (argmax, first
 * index on ties); with a temperature, top-k / top-p / min-p filtering and a
 * draw from a seeded PRNG (xoshiro256**, seeded through splitmix64), so the
 * same seed gives the same text on any machine. */
#ifndef KRUN_SAMPLER_H
#define KRUN_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

typedef struct ksampler {
    float temp;        /* 0 = greedy */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off */
    float min_p;       /* 0 = off */
    uint64_t s[4];     /* PRNG state */
    /* scratch */
    uint32_t *order;
    double *prob;
    size_t cap;
} ksampler;

int ksampler_init(ksampler *s, float temp, int top_k, float top_p, float min_p, uint64_t seed);
void ksampler_free(ksampler *s);
int32_t ksampler_argmax(const float *logits, size_t n);
/* Returns the chosen id, or -1 on allocation failure. */
int32_t ksampler_pick(ksampler *s, const float *logits, size_t n);
/* The PRNG itself: uniform in [0, 1) with 53 random bits. */
double ksampler_uniform(ksampler *s);

#endif
