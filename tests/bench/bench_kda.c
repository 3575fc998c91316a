/* The KDA recurrence step of one head (spec §4.5 step 6) at full K3 width
 * (D = 128), 96 heads x 64 positions, one thread: the four passes over the
 * state that kda.c made before (decay, read, write, output; copied here
 * verbatim as the reference) against the two passes of kernels_seq.h on each
 * SIMD level.  Every variant's final state and outputs are compared bit for
 * bit with the four passes.  Medians of 5 runs, ns per head and position.
 *
 *   gcc -std=c11 -O2 -ffp-contract=off -D_GNU_SOURCE -I. -o build/bench_kda \
 *       tests/bench/bench_kda.c run/kernels/kernels_seq.c run/kernels/kernels.c run/kernels/kernels_avx2.c \
 *       run/kernels/kernels_avx512.c run/util/threadpool.c -lpthread -lm
 *   ./build/bench_kda [D]
 *
 * Under valgrind --tool=callgrind (with --toggle-collect=four_passes or
 * --toggle-collect=two_passes) it gives the instruction counts. */
#include "bench_util.h"
#include "../unit/testrand.h"
#include "run/kernels/kernels.h"
#include "run/kernels/kernels_seq.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HEADS 96
#define POS 64
#define RUNS 5

/* kda.c's kda_step before the change (commit 482403d), unchanged */
__attribute__((noinline)) static void four_passes(float *S, const float *q, const float *k, const float *v, const float *alpha,
                                                  float beta, float *o, size_t D, float *u, float *d)
{
    for (size_t i = 0; i < D; i++)
        for (size_t c = 0; c < D; c++) S[i * D + c] = S[i * D + c] * alpha[i];
    for (size_t c = 0; c < D; c++) u[c] = 0.0f;
    for (size_t i = 0; i < D; i++)
        for (size_t c = 0; c < D; c++) u[c] = u[c] + S[i * D + c] * k[i];
    for (size_t c = 0; c < D; c++) d[c] = beta * (v[c] - u[c]);
    for (size_t i = 0; i < D; i++)
        for (size_t c = 0; c < D; c++) S[i * D + c] = S[i * D + c] + k[i] * d[c];
    for (size_t c = 0; c < D; c++) o[c] = 0.0f;
    for (size_t i = 0; i < D; i++)
        for (size_t c = 0; c < D; c++) o[c] = o[c] + S[i * D + c] * q[i];
}

/* kda.c's kda_step now */
__attribute__((noinline)) static void two_passes(float *S, const float *q, const float *k, const float *v, const float *alpha,
                                                 float beta, float *o, size_t D, float *u, float *d)
{
    kseq_decay_read(S, S, D, alpha, k, u);
    for (size_t c = 0; c < D; c++) d[c] = beta * (v[c] - u[c]);
    kseq_write_out(S, D, k, d, q, o);
}

typedef void step_fn(float *, const float *, const float *, const float *, const float *, float, float *, size_t, float *, float *);

struct data {
    size_t D;
    float *S0, *S, *q, *k, *v, *a, *o, *beta;
};

static double run(step_fn *f, const struct data *x)
{
    float u[1024], d[1024];
    const size_t D = x->D;
    double t0;
    memcpy(x->S, x->S0, HEADS * D * D * sizeof *x->S);
    t0 = now();
    for (size_t h = 0; h < HEADS; h++)
        for (size_t t = 0; t < POS; t++) {
            const size_t at = (t * HEADS + h) * D;
            f(x->S + h * D * D, x->q + at, x->k + at, x->v + at, x->a + at, x->beta[t * HEADS + h], x->o + at, D, u, d);
        }
    return (now() - t0) / (HEADS * POS) * 1e9;
}

int main(int argc, char **argv)
{
    struct data x;
    const size_t D = argc > 1 ? (size_t)atol(argv[1]) : 128, n = POS * HEADS * D;
    float *S_ref, *o_ref;
    double t[RUNS];
    static const ksimd levels[] = {KSIMD_SCALAR, KSIMD_AVX2, KSIMD_AVX512, KSIMD_NEON};
    if (D < 1 || D > 1024) return 2;
    x.D = D;
    x.S0 = malloc(HEADS * D * D * 4), x.S = malloc(HEADS * D * D * 4);
    x.q = malloc(n * 4), x.k = malloc(n * 4), x.v = malloc(n * 4), x.a = malloc(n * 4), x.o = malloc(n * 4);
    x.beta = malloc(POS * HEADS * 4);
    S_ref = malloc(HEADS * D * D * 4), o_ref = malloc(n * 4);
    if (!x.S0 || !x.S || !x.q || !x.k || !x.v || !x.a || !x.o || !x.beta || !S_ref || !o_ref) return 3;
    for (size_t i = 0; i < HEADS * D * D; i++) x.S0[i] = unif(-0.1f, 0.1f);
    for (size_t i = 0; i < n; i++) {
        x.q[i] = unif(-0.1f, 0.1f), x.k[i] = unif(-0.1f, 0.1f), x.v[i] = unif(-1, 1), x.a[i] = unif(0.5f, 1);
    }
    for (size_t i = 0; i < POS * HEADS; i++) x.beta[i] = unif(0, 1);
    printf("KDA recurrence, D %zu, %d heads x %d positions, 1 thread: ns per head and position (median of %d)\n", D, HEADS, POS, RUNS);
    for (int r = 0; r < RUNS; r++) t[r] = run(four_passes, &x);
    qsort(t, RUNS, sizeof *t, cmpd);
    memcpy(S_ref, x.S, HEADS * D * D * 4);
    memcpy(o_ref, x.o, n * 4);
    printf("  %-28s %10.0f\n", "four passes (before)", t[RUNS / 2]);
    for (size_t l = 0; l < sizeof levels / sizeof *levels; l++) {
        if (!kern_simd_supported(levels[l])) continue;
        kern_simd_set(levels[l]);
        for (int r = 0; r < RUNS; r++) t[r] = run(two_passes, &x);
        qsort(t, RUNS, sizeof *t, cmpd);
        printf("  two passes, %-16s %10.0f   %s\n", kern_simd_name(levels[l]), t[RUNS / 2],
               memcmp(S_ref, x.S, HEADS * D * D * 4) || memcmp(o_ref, x.o, n * 4) ? "DIFFERENT BITS" : "same bits");
    }
    return 0;
}
