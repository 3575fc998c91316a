/* Kernel throughput: matvec (T=1) GB/s of weight bytes vs memcpy of the same
 * bytes, and GFLOP/s of matrix products at T=16, per SIMD level, 1 thread and a
 * pool.  Medians of 5 runs.  Not part of `make`; build and run with
 *
 *   gcc -std=c11 -O2 -ffp-contract=off -D_GNU_SOURCE -I. -o build/bench_kernels \
 *       tests/bench/bench_kernels.c run/kernels/kernels.c run/kernels/kernels_avx2.c \
 *       run/kernels/kernels_avx512.c run/util/threadpool.c -lpthread -lm
 *   ./build/bench_kernels [threads]        # threads for the pool rows (default: all CPUs)
 *
 * MXFP4 expert matrices are small (5.8 MB), so the MXFP4 matvec cycles through
 * enough distinct copies (> 64 MB) that the weights stream from DRAM as they do in
 * the runtime; the BF16 shapes are already far larger than the caches.  Scalar
 * T=16 runs use the first rows only (at most 1024) to keep the bench short; a
 * rate does not depend on the row count. */
#include "bench_util.h"
#include "run/kernels/kernels.h"
#include "run/util/threadpool.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RUNS 5

static uint64_t rs = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

static void *xmalloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bench_kernels: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* Random weights: BF16 of values in [-1,1); MXFP4 random nibbles, scales 118..125. */
static void fill_bf16(uint16_t *w, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float f = (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2 - 1);
        uint32_t u;
        memcpy(&u, &f, 4);
        w[i] = (uint16_t)(u >> 16);
    }
}
static void fill_bytes(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd();
}

typedef struct {
    kmat *mats;      /* ncopies matrices of the same shape */
    int ncopies;
    size_t rows_used; /* rows actually multiplied */
    const float *X;
    size_t ldx, T;
    float *Y;
    kpool *pool;
} job_t;

static double run_job(const job_t *j)
{
    double t0 = now();
    for (int c = 0; c < j->ncopies; c++) {
        kmat m = j->mats[c];
        m.rows = j->rows_used;
        if (j->pool) kmatmul(j->pool, &m, j->X, j->ldx, j->T, j->Y, m.rows);
        else kmatmul_rows(&m, 0, m.rows, j->X, j->ldx, j->T, j->Y, m.rows);
    }
    return now() - t0;
}

/* Median of RUNS timings; *best gets the fastest (a shared machine only ever
 * slows a run down, so the best is the better estimate when others are busy). */
static double median_job(const job_t *j, double *best)
{
    double t[RUNS];
    run_job(j); /* warm-up */
    for (int i = 0; i < RUNS; i++) t[i] = run_job(j);
    qsort(t, RUNS, sizeof *t, cmpd);
    *best = t[0];
    return t[RUNS / 2];
}

static double median_memcpy(void *dst, const void *src, size_t bytes, double *best)
{
    double t[RUNS];
    memcpy(dst, src, bytes);
    for (int i = 0; i < RUNS; i++) {
        double t0 = now();
        memcpy(dst, src, bytes);
        t[i] = now() - t0;
    }
    qsort(t, RUNS, sizeof *t, cmpd);
    *best = t[0];
    return t[RUNS / 2];
}

/* Read-only streaming: the best a matvec that only reads its weights could do. */
static volatile uint64_t sink;
static double median_read(const void *src, size_t bytes, double *best)
{
    double t[RUNS];
    const uint64_t *p = src;
    size_t n = bytes / 8;
    for (int i = 0; i < RUNS + 1; i++) {
        double t0 = now();
        uint64_t a = 0, b = 0, c = 0, d = 0;
        for (size_t k = 0; k + 4 <= n; k += 4) {
            a += p[k];
            b += p[k + 1];
            c += p[k + 2];
            d += p[k + 3];
        }
        sink = a + b + c + d;
        if (i) t[i - 1] = now() - t0;
    }
    qsort(t, RUNS, sizeof *t, cmpd);
    *best = t[0];
    return t[RUNS / 2];
}

typedef struct {
    const char *name;
    kd_type type;
    size_t rows, cols;
} shape_t;

int main(int argc, char **argv)
{
    int nthreads = argc > 1 ? atoi(argv[1]) : kpool_ncpu();
    if (nthreads < 1) nthreads = 1;
    kpool *pool = nthreads > 1 ? kpool_create(nthreads) : NULL;
    if (nthreads > 1 && !pool) {
        fprintf(stderr, "bench_kernels: kpool_create failed\n");
        return 1;
    }
    ksimd best = kern_simd_detect();
    printf("# bench_kernels: best SIMD %s, pool of %d threads, medians of %d runs\n", kern_simd_name(best), nthreads,
           RUNS);

    static const shape_t S[] = {
        {"q_b/up 12288x7168", KD_BF16, 12288, 7168},
        {"down 7168x12288", KD_BF16, 7168, 12288},
        {"q_a 1536x7168", KD_BF16, 1536, 7168},
        {"expert w1 3072x3584", KD_MXFP4, 3072, 3584},
        {"expert w2 3584x3072", KD_MXFP4, 3584, 3072},
    };
    const size_t TBIG = 16;

    printf("# ms, GB/s (weight bytes), GFLOP/s and /memcpy are medians; 'best' columns use the fastest run\n");
    printf("\n%-22s %-6s %3s %-7s %3s %8s %7s %8s %8s | %7s %8s %8s\n", "shape", "type", "T", "simd", "thr", "ms",
           "GB/s", "GFLOP/s", "/memcpy", "GB/s", "GFLOP/s", "/memcpy");
    for (size_t s = 0; s < sizeof S / sizeof *S; s++) {
        const shape_t *sh = &S[s];
        size_t rows = sh->rows, cols = sh->cols;
        kmat proto = {sh->type, rows, cols, NULL, NULL};
        size_t bytes1 = kmat_bytes(&proto);
        int ncopies = sh->type == KD_MXFP4 ? (int)((64u << 20) / bytes1 + 1) : 1;
        kmat *mats = xmalloc(sizeof(kmat) * (size_t)ncopies);
        /* all copies in one block so memcpy sees the same bytes */
        size_t vbytes = sh->type == KD_MXFP4 ? rows * cols / 2 : rows * cols * 2;
        size_t sbytes = sh->type == KD_MXFP4 ? rows * (cols / 32) : 0;
        uint8_t *block = xmalloc(bytes1 * (size_t)ncopies);
        for (int c = 0; c < ncopies; c++) {
            uint8_t *base = block + (size_t)c * bytes1;
            mats[c] = proto;
            mats[c].data = base;
            if (sh->type == KD_MXFP4) {
                fill_bytes(base, vbytes);
                mats[c].scales = base + vbytes;
                for (size_t i = 0; i < sbytes; i++) base[vbytes + i] = (uint8_t)(118 + rnd() % 8);
            } else {
                fill_bf16((uint16_t *)base, rows * cols);
            }
        }
        size_t total = bytes1 * (size_t)ncopies;
        uint8_t *dst = xmalloc(total);
        memset(dst, 0, total);
        double bmc, brd;
        double tmc = median_memcpy(dst, block, total, &bmc);
        double trd = median_read(block, total, &brd);
        free(dst);
        double mc_gbs = total / tmc * 1e-9, mc_best = total / bmc * 1e-9;
        const char *tn = sh->type == KD_MXFP4 ? "mxfp4" : "bf16";
        printf("%-22s %-6s %3s %-7s %3d %8.2f %7.2f %8s %8s | %7.2f %8s %8s   (%.0f MB%s)\n", sh->name, tn, "-",
               "memcpy", 1, tmc * 1e3, mc_gbs, "-", "1.00", mc_best, "-", "1.00", total / 1e6,
               ncopies > 1 ? ", all copies" : "");
        printf("%-22s %-6s %3s %-7s %3d %8.2f %7.2f %8s %8.2f | %7.2f %8s %8.2f\n", sh->name, tn, "-", "read", 1,
               trd * 1e3, total / trd * 1e-9, "-", (total / trd * 1e-9) / mc_gbs, total / brd * 1e-9, "-",
               (total / brd * 1e-9) / mc_best);

        float *X = xmalloc(sizeof(float) * cols * TBIG);
        float *Y = xmalloc(sizeof(float) * rows * TBIG);
        for (size_t i = 0; i < cols * TBIG; i++) X[i] = (float)((double)(rnd() >> 11) / 9007199254740992.0 - 0.5);

        for (int lv = 0; lv < KSIMD_COUNT; lv++) {
            if (!kern_simd_supported((ksimd)lv)) continue;
            kern_simd_set((ksimd)lv);
            for (int th = 0; th < 2; th++) {
                if (th && !pool) continue;
                for (int ti = 0; ti < 2; ti++) {
                    size_t T = ti ? TBIG : 1;
                    job_t j = {mats, ncopies, rows, X, cols, T, Y, th ? pool : NULL};
                    if (T > 1) j.ncopies = 1;
                    if (T > 1 && lv == KSIMD_SCALAR && j.rows_used > 1024) j.rows_used = 1024;
                    double tb, t = median_job(&j, &tb);
                    double wbytes = (double)bytes1 * (double)j.rows_used / rows * j.ncopies;
                    double flops = 2.0 * (double)j.rows_used * cols * T * j.ncopies;
                    double gbs = wbytes / t * 1e-9, gbb = wbytes / tb * 1e-9;
                    char ratio[16] = "-", rbest[16] = "-";
                    if (T == 1) {
                        snprintf(ratio, sizeof ratio, "%.2f", gbs / mc_gbs);
                        snprintf(rbest, sizeof rbest, "%.2f", gbb / mc_best);
                    }
                    printf("%-22s %-6s %3zu %-7s %3d %8.2f %7.2f %8.2f %8s | %7.2f %8.2f %8s%s\n", sh->name, tn, T,
                           kern_simd_name((ksimd)lv), th ? nthreads : 1, t * 1e3, gbs, flops / t * 1e-9, ratio, gbb,
                           flops / tb * 1e-9, rbest, j.rows_used < rows ? "   (first 1024 rows)" : "");
                    fflush(stdout);
                }
            }
        }
        free(X);
        free(Y);
        free(block);
        free(mats);
    }
    kpool_destroy(pool);
    return 0;
}
