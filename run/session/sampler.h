/* Choosing the next token from the logits.  Greedy by default (argmax, first
 * index on ties); with a temperature, top-k / top-p / min-p filtering and a
 * draw from a seeded PRNG (xoshiro256**, seeded through splitmix64), so the
 * same seed gives the same text on any machine.  The scratch comes from the
 * caller (a session's slot): picking allocates nothing. */
#ifndef KRUN_SAMPLER_H
#define KRUN_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

typedef struct ksampler_opts {
    float temp;        /* 0 = greedy */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off */
    float min_p;       /* 0 = off */
    uint64_t seed;
} ksampler_opts;

typedef struct ksampler {
    ksampler_opts o;
    uint64_t s[4];     /* PRNG state */
    uint32_t *order;   /* scratch: [cap] */
    double *prob;      /* scratch: [cap] */
    size_t cap;
} ksampler;

/* order and prob: room for cap entries (the vocabulary). */
void ksampler_init(ksampler *s, const ksampler_opts *o, uint32_t *order, double *prob, size_t cap);
int32_t ksampler_argmax(const float *logits, size_t n);
/* The chosen id; -1 only if n exceeds the scratch. */
int32_t ksampler_pick(ksampler *s, const float *logits, size_t n);
/* The PRNG itself: uniform in [0, 1) with 53 random bits. */
double ksampler_uniform(ksampler *s);

#endif
