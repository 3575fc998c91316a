/* Fork-join pool.  One job at a time; a job is published as a single 64-bit
 * "claim" word (generation << 32 | chunks not yet claimed).  Every participant
 * (the caller included) claims chunks with a CAS on that word, so a worker that
 * wakes up late can never touch a finished job: a successful claim means the job
 * is live, and the caller does not return (nor overwrite the job) before every
 * claimed chunk has been reported done.  The caller therefore never waits for a
 * worker to wake up: if the workers are asleep it simply runs the chunks itself. */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNKS_PER_THREAD 4
#define SPIN_ITERS 4000        /* ~tens of microseconds of polling before sleeping */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

struct kpool {
    int nthreads;                      /* including the caller */
    int nstarted;                      /* workers actually started */
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;

    _Alignas(64) _Atomic uint64_t claim;
    _Alignas(64) _Atomic size_t done;  /* chunks finished in the current job */
    _Atomic int sleepers;              /* workers inside the cv_work wait section */
    _Atomic int caller_sleeping;
    _Atomic int stop;
    _Atomic int busy;                  /* a kpool_for is in progress */

    /* The job; written by the caller before the claim word is published. */
    _Alignas(64) void (*fn)(void *, size_t, size_t);
    void *ctx;
    size_t n, nchunks;
    uint32_t gen;                      /* caller-private generation counter */
};

int kpool_ncpu(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= 1 ? (int)n : 1;
}

int kpool_threads(const kpool *p) { return p ? p->nthreads : 1; }

/* Runs chunk k of the live job, then reports it done. */
static void run_chunk(kpool *p, size_t k)
{
    size_t n = p->n, nc = p->nchunks;
    size_t q = n / nc, rem = n % nc;
    size_t b = k * q + (k < rem ? k : rem);
    size_t e = b + q + (k < rem ? 1 : 0);
    p->fn(p->ctx, b, e);
    /* After this increment the job may be gone: touch only pool fields. */
    if (atomic_fetch_add(&p->done, 1) + 1 == nc && atomic_load(&p->caller_sleeping)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_signal(&p->cv_done);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Claims and runs chunks while any are left; *seen gets the last generation observed. */
static void drain(kpool *p, uint32_t *seen)
{
    uint64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
    for (;;) {
        *seen = (uint32_t)(c >> 32);
        if ((uint32_t)c == 0) return;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c - 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        run_chunk(p, (size_t)(uint32_t)c - 1);
        c = atomic_load_explicit(&p->claim, memory_order_acquire);
    }
}

static void *worker(void *arg)
{
    kpool *p = arg;
    uint32_t seen = 0;
    for (;;) {
        int spins = 0;
        while ((uint32_t)(atomic_load_explicit(&p->claim, memory_order_acquire) >> 32) == seen) {
            if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return NULL;
            if (++spins < SPIN_ITERS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((uint32_t)(atomic_load(&p->claim) >> 32) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv_work, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return NULL;
        drain(p, &seen);
    }
}

kpool *kpool_create(int nthreads)
{
    /* aligned_alloc, not calloc: the struct has cache-line (_Alignas(64))
     * members, and calloc's 16-byte alignment would be undefined behaviour
     * (UBSan: misaligned member access) and share their lines after all */
    kpool *p = aligned_alloc(_Alignof(kpool), sizeof *p);
    if (!p) return NULL;
    memset(p, 0, sizeof *p);
    p->nthreads = nthreads < 1 ? 1 : nthreads;
    atomic_init(&p->claim, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->caller_sleeping, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->busy, 0);
    if (p->nthreads == 1) return p;

    if (pthread_mutex_init(&p->mu, NULL)) goto fail_mu;
    if (pthread_cond_init(&p->cv_work, NULL)) goto fail_cv1;
    if (pthread_cond_init(&p->cv_done, NULL)) goto fail_cv2;
    p->th = calloc((size_t)p->nthreads - 1, sizeof *p->th);
    if (!p->th) goto fail_th;
    for (int i = 0; i < p->nthreads - 1; i++) {
        if (pthread_create(&p->th[i], NULL, worker, p)) {
            kpool_destroy(p);
            return NULL;
        }
        p->nstarted++;
    }
    return p;

fail_th:
    pthread_cond_destroy(&p->cv_done);
fail_cv2:
    pthread_cond_destroy(&p->cv_work);
fail_cv1:
    pthread_mutex_destroy(&p->mu);
fail_mu:
    free(p);
    return NULL;
}

void kpool_destroy(kpool *p)
{
    if (!p) return;
    if (p->nthreads > 1) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->stop, 1);
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < p->nstarted; i++) pthread_join(p->th[i], NULL);
        free(p->th);
        pthread_cond_destroy(&p->cv_done);
        pthread_cond_destroy(&p->cv_work);
        pthread_mutex_destroy(&p->mu);
    }
    free(p);
}

void kpool_for(kpool *p, size_t n, void (*fn)(void *ctx, size_t begin, size_t end), void *ctx)
{
    if (n == 0) return;
    if (!p || p->nthreads <= 1 || n == 1 || atomic_exchange(&p->busy, 1)) {
        fn(ctx, 0, n);
        return;
    }
    size_t nc = (size_t)p->nthreads * CHUNKS_PER_THREAD;
    if (nc > n) nc = n;
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->nchunks = nc;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    p->gen++;
    /* seq_cst store, then the sleepers load: pairs with the worker's increment of
     * sleepers before it re-checks the claim word under the mutex. */
    atomic_store(&p->claim, ((uint64_t)p->gen << 32) | (uint64_t)nc);
    if (atomic_load(&p->sleepers)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
    }

    uint32_t seen;
    drain(p, &seen);

    int spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) != nc) {
        if (++spins < SPIN_ITERS) {
            cpu_relax();
            continue;
        }
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_sleeping, 1);
        while (atomic_load(&p->done) != nc) pthread_cond_wait(&p->cv_done, &p->mu);
        atomic_store(&p->caller_sleeping, 0);
        pthread_mutex_unlock(&p->mu);
    }
    atomic_store_explicit(&p->busy, 0, memory_order_release);
}
