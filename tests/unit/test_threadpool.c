/* Thread pool: coverage of every index exactly once over thousands of calls,
 * n = 0, n < threads, sleeping workers, nested and concurrent calls, workers
 * really participate, create/destroy churn. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "check.h"
#include "run/util/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXN 4096

typedef struct {
    _Atomic int hits[MAXN];
    _Atomic int calls;
    _Atomic int bad_range;
    size_t n;
    pthread_t caller;
    _Atomic int foreign; /* chunks run on a thread other than the caller */
    long spin_ns;        /* each chunk sleeps this long */
    kpool *pool;         /* for the nested test */
} cov_t;

static _Thread_local uint64_t rs = 88172645463325252ull;
static uint64_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void cov_fn(void *ctx, size_t b, size_t e)
{
    cov_t *c = ctx;
    atomic_fetch_add(&c->calls, 1);
    if (!(b < e && e <= c->n)) atomic_store(&c->bad_range, 1);
    if (!pthread_equal(pthread_self(), c->caller)) atomic_store(&c->foreign, 1);
    for (size_t i = b; i < e && i < MAXN; i++) atomic_fetch_add(&c->hits[i], 1);
    if (c->spin_ns) { /* sleep, not spin: lets the other threads run even under valgrind */
        struct timespec ts = {0, c->spin_ns};
        nanosleep(&ts, NULL);
    }
}

/* Runs one kpool_for over n and checks exact coverage; resets the counters. */
static int cover_once(kpool *p, cov_t *c, size_t n)
{
    c->n = n;
    c->caller = pthread_self();
    atomic_store(&c->calls, 0);
    atomic_store(&c->bad_range, 0);
    kpool_for(p, n, cov_fn, c);
    int ok = !atomic_load(&c->bad_range);
    for (size_t i = 0; i < n; i++) {
        ok &= atomic_load(&c->hits[i]) == 1;
        atomic_store(&c->hits[i], 0);
    }
    for (size_t i = n; i < MAXN; i++) ok &= atomic_load(&c->hits[i]) == 0;
    if (n == 0) ok &= atomic_load(&c->calls) == 0;
    return ok;
}

static cov_t *cov_new(void)
{
    cov_t *c = calloc(1, sizeof *c);
    if (!c) {
        printf("not ok - out of memory\n");
        exit(1);
    }
    return c;
}

static void nested_fn(void *ctx, size_t b, size_t e)
{
    cov_t *c = ctx;
    (void)b;
    (void)e;
    /* a nested call on the same pool must run inline and still cover [0, 64) of a
     * private counter set */
    cov_t *inner = cov_new();
    inner->n = 64;
    inner->caller = pthread_self();
    kpool_for(c->pool, 64, cov_fn, inner);
    int ok = 1;
    for (int i = 0; i < 64; i++) ok &= atomic_load(&inner->hits[i]) == 1;
    if (!ok) atomic_store(&c->bad_range, 1);
    free(inner);
}

typedef struct {
    kpool *p;
    int ok;
} conc_arg;

static void *concurrent_caller(void *arg)
{
    conc_arg *a = arg;
    cov_t *c = cov_new();
    a->ok = 1;
    for (int i = 0; i < 2000; i++) a->ok &= cover_once(a->p, c, 1 + rnd() % 300);
    free(c);
    return NULL;
}

int main(void)
{
    cov_t *c = cov_new();

    /* NULL pool and 1-thread pools run inline */
    CHECK(kpool_threads(NULL) == 1, "kpool_threads(NULL) == 1");
    CHECK(cover_once(NULL, c, 100) && atomic_load(&c->calls) == 1 && !atomic_load(&c->foreign),
          "NULL pool runs fn(ctx, 0, n) once, inline");
    kpool *p1 = kpool_create(1);
    CHECK(p1 && kpool_threads(p1) == 1, "kpool_create(1)");
    CHECK(cover_once(p1, c, 100) && atomic_load(&c->calls) == 1, "1-thread pool runs inline");
    kpool_destroy(p1);
    kpool *p0 = kpool_create(0);
    CHECK(p0 && kpool_threads(p0) == 1 && cover_once(p0, c, 7), "kpool_create(0) behaves as 1 thread");
    kpool_destroy(p0);
    kpool_destroy(NULL);
    CHECK(kpool_ncpu() >= 1, "kpool_ncpu() = %d", kpool_ncpu());

    static const int TH[] = {2, 3, 4, 8};
    for (size_t ti = 0; ti < sizeof TH / sizeof *TH; ti++) {
        int nt = TH[ti];
        kpool *p = kpool_create(nt);
        if (!CHECK(p != NULL && kpool_threads(p) == nt, "kpool_create(%d)", nt)) continue;
        int ok = 1;
        for (int i = 0; i < 5000; i++) ok &= cover_once(p, c, rnd() % 700);
        CHECK(ok, "%d threads: 5000 calls, random n in [0,700), every index exactly once, ranges non-empty", nt);
        ok = 1;
        for (size_t n = 0; n <= (size_t)nt + 1; n++) ok &= cover_once(p, c, n);
        CHECK(ok, "%d threads: n = 0 .. threads+1", nt);
        CHECK(cover_once(p, c, 0) && atomic_load(&c->calls) == 0, "%d threads: n = 0 never calls fn", nt);
        CHECK(cover_once(p, c, MAXN), "%d threads: n = %d", nt, MAXN);
        /* let the workers fall asleep, then call again (the wake-up path) */
        ok = 1;
        for (int i = 0; i < 5; i++) {
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
            ok &= cover_once(p, c, 1 + rnd() % 1000);
        }
        CHECK(ok, "%d threads: calls after the workers went to sleep", nt);
        /* workers really take chunks */
        atomic_store(&c->foreign, 0);
        c->spin_ns = 200 * 1000;
        for (int i = 0; i < 200 && !atomic_load(&c->foreign); i++) cover_once(p, c, 64);
        c->spin_ns = 0;
        CHECK(atomic_load(&c->foreign), "%d threads: chunks run on worker threads", nt);
        /* nested call from inside fn runs inline */
        c->pool = p;
        c->n = 16;
        c->caller = pthread_self();
        atomic_store(&c->bad_range, 0);
        kpool_for(p, 16, nested_fn, c);
        CHECK(!atomic_load(&c->bad_range), "%d threads: nested kpool_for from inside fn runs inline, full coverage", nt);
        /* two external threads calling the same pool at once */
        conc_arg a = {p, 0}, b = {p, 0};
        pthread_t t1, t2;
        int started = !pthread_create(&t1, NULL, concurrent_caller, &a);
        started &= !pthread_create(&t2, NULL, concurrent_caller, &b);
        if (started) {
            pthread_join(t1, NULL);
            pthread_join(t2, NULL);
        }
        CHECK(started && a.ok && b.ok, "%d threads: concurrent callers on one pool both get full coverage", nt);
        /* overhead of an almost empty call */
        int reps = 20000;
        c->n = (size_t)nt * 4;
        atomic_store(&c->calls, 0);
        double t0 = now();
        for (int i = 0; i < reps; i++) kpool_for(p, (size_t)nt * 4, cov_fn, c);
        double us = (now() - t0) / reps * 1e6;
        /* (a pool stuck in its "busy" state would run every call inline, as one chunk) */
        CHECK(atomic_load(&c->calls) >= 2 * reps && atomic_load(&c->calls) <= reps * nt * 4,
              "%d threads: calls are split into chunks (%.1f per call, n = %d)", nt,
              (double)atomic_load(&c->calls) / reps, nt * 4);
        for (size_t i = 0; i < MAXN; i++) atomic_store(&c->hits[i], 0);
        printf("# %d threads: %.2f us per kpool_for (n = %d, trivial fn)\n", nt, us, nt * 4);
        CHECK(!atomic_load(&c->bad_range), "%d threads: ranges valid in the overhead loop", nt);
        CHECK(us < 2000.0, "%d threads: kpool_for overhead %.2f us per call", nt, us);
        kpool_destroy(p);
    }

    /* create / destroy churn, some with a call in between, some without */
    int ok = 1;
    for (int i = 0; i < 200; i++) {
        kpool *p = kpool_create(1 + (int)(rnd() % 6));
        if (!p) {
            ok = 0;
            break;
        }
        if (i % 2) ok &= cover_once(p, c, rnd() % 500);
        kpool_destroy(p);
    }
    CHECK(ok, "200 create/destroy cycles");
    free(c);
    return check_exit();
}
