/* Decoding-step time at long contexts, without running the context: the
 * state of one sequence is given S cached positions (every MLA layer's latent
 * cache filled with pseudo-random rows in [-1, 1), the KDA state left at
 * zero), then single-token forward blocks run at position S, each from the
 * same state.  The model is used in place (resident), so the time is the
 * arithmetic: the weights' products plus attention over S positions.
 *
 *   bench_attn MODEL.kpk [--steps N] [--threads N] [--dump FILE] S1 S2 ...
 *
 * Prints, per S, the median milliseconds of N steps (after one warm-up step
 * that also verifies the extents).  --dump appends each S's logits (float32)
 * to FILE: two builds must write the same bytes (the cache contents are the
 * same pseudo-random rows in every build).  Built by tests/bench/bench_krun.sh (or by
 * hand, linking build/libkrun.a and build/libkpkformat.a); under
 * `valgrind --tool=callgrind --toggle-collect=mla_forward` it gives the MLA
 * layers' instructions alone. */
#include "bench_util.h"
#include "format/kpk_reader.h"
#include "../unit/testrand.h"
#include "run/engine/forward.h"
#include "run/engine/state.h"
#include "run/model/model.h"
#include "run/store/store.h"
#include "run/util/threadpool.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Builds against trees before speculative decoding too (BENCH_OLD_BUILD in
 * bench_seq.sh): they have no journal and no spec argument. */
#if defined(K3_RUN_TAPS)
#define RUN_INIT(r, m, st, p, T, S, ctx, e) k3_run_init(r, m, st, p, T, S, ctx, 0, 0, e)
#elif defined(KRUN_JOURNAL_H)
#define RUN_INIT(r, m, st, p, T, S, ctx, e) k3_run_init(r, m, st, p, T, S, ctx, 0, e)
#else
#define RUN_INIT(r, m, st, p, T, S, ctx, e) k3_run_init(r, m, st, p, T, S, ctx, e)
#endif

int main(int argc, char **argv)
{
    const char *path = NULL, *dump = NULL;
    FILE *df = NULL;
    size_t S[16], nS = 0, steps = 5;
    int threads = kpool_ncpu();
    kpk_file *f;
    kpk_err e = {0};
    k3_model m;
    kstore *store;
    kstore_opts so;
    kpool *pool;
    krun_err err;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc) dump = argv[++i];
        else if (!path) path = argv[i];
        else if (nS < 16) S[nS++] = (size_t)atol(argv[i]);
    }
    if (!path || !nS || !steps) { fprintf(stderr, "usage: bench_attn MODEL.kpk [--steps N] [--threads N] S1 S2 ...\n"); return 2; }
    if (kpk_open(path, &f, &e)) { fprintf(stderr, "bench_attn: %s\n", e.msg); return 2; }
    if (k3_model_open(f, &m, &err)) { fprintf(stderr, "bench_attn: %s\n", err.msg); return 2; }
    memset(&so, 0, sizeof so);
    so.verify = KSTORE_VERIFY_FIRST;
    so.model = &m;
    if (kstore_open(f, &so, &store, &err)) { fprintf(stderr, "bench_attn: %s\n", err.msg); return 2; }
    pool = kpool_create(threads);
    if (!pool) return 2;
    if (dump && !(df = fopen(dump, "wb"))) { fprintf(stderr, "bench_attn: cannot write %s\n", dump); return 2; }
    printf("%-10s %12s %10s   (%s, %d threads, median of %zu steps)\n", "positions", "ms / step", "MLA layers", path, threads, steps);
    for (size_t k = 0; k < nS; k++) {
        const k3_config *c = &m.cfg;
        const size_t ctx = S[k] + 1, row = k3_mla_row(c);
        k3_run run;
        k3_state st;
        karena a = {NULL, 0};
        uint8_t *buf;
        float *logits = malloc((size_t)c->vocab * sizeof *logits);
        double *t = malloc(steps * sizeof *t);
        int32_t tok = 7;
        int n_mla = 0;
        if (RUN_INIT(&run, &m, store, pool, 1, 1, ctx, &err)) { fprintf(stderr, "bench_attn: %s\n", err.msg); return 2; }
        k3_state_carve(&st, c, ctx, &a);
        buf = aligned_alloc(KARENA_ALIGN, karena_round(a.used));
        if (!buf || !logits || !t) { fprintf(stderr, "bench_attn: out of memory\n"); return 3; }
        a = (karena){buf, 0};
        k3_state_carve(&st, c, ctx, &a);
        k3_state_reset(&st);
        for (int L = 0; L < c->n_layers; L++)
            if (st.mla_cache[L]) {
                n_mla++;
                for (size_t i = 0; i < S[k] * row; i++) st.mla_cache[L][i] = unif(-1.0f, 1.0f);
            }
        for (size_t s = 0; s <= steps; s++) {
            k3_seg seg = {.st = &st, .ids = &tok, .n = 1, .logits = logits};
            double t0 = now();
            st.pos = S[k];
            if (k3_forward(&run, &seg, 1, &err)) { fprintf(stderr, "bench_attn: %s\n", err.msg); return 1; }
            if (s) t[s - 1] = (now() - t0) * 1e3;
        }
        if (df && fwrite(logits, sizeof *logits, (size_t)c->vocab, df) != (size_t)c->vocab) { fprintf(stderr, "bench_attn: writing %s\n", dump); return 2; }
        qsort(t, steps, sizeof *t, cmpd);
        printf("%-10zu %12.2f %10d\n", S[k], t[steps / 2], n_mla);
        fflush(stdout);
        k3_run_free(&run);
        free(buf);
        free(logits);
        free(t);
    }
    if (df && fclose(df)) { fprintf(stderr, "bench_attn: writing %s\n", dump); return 2; }
    kpool_destroy(pool);
    kstore_close(store);
    k3_model_close(&m);
    kpk_close(f);
    return 0;
}
