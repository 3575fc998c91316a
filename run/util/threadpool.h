/* A small fork-join thread pool for krun's kernels.
 *
 * kpool_for(pool, n, fn, ctx) calls fn(ctx, begin, end) over [0, n) split into
 * contiguous chunks, on the pool's workers and the calling thread, and returns when
 * every chunk is done.  Idle workers spin briefly, then sleep on a condition
 * variable, so a pool costs nothing between bursts of work and a burst of calls
 * costs little.
 *
 * Rules:
 *  - Chunks are handed out dynamically, so which thread runs which chunk varies
 *    from call to call: fn must write only outputs that belong to its own range
 *    (results must never depend on the split).
 *  - A call made while the pool is busy (from inside fn, i.e. nested, or from a
 *    second thread at the same time) runs fn(ctx, 0, n) inline on the caller.
 *  - n == 0 never calls fn.  A pool of one thread (or a NULL pool) runs inline. */
#ifndef KRUN_THREADPOOL_H
#define KRUN_THREADPOOL_H
#include <stddef.h>

typedef struct kpool kpool;

/* nthreads counts the calling thread: nthreads<=1 starts no thread and runs every
 * kpool_for inline.  Returns NULL only on allocation / thread-creation failure. */
kpool *kpool_create(int nthreads);
void   kpool_destroy(kpool *);           /* NULL is fine */
int    kpool_threads(const kpool *);     /* 1 for NULL */
void   kpool_for(kpool *, size_t n, void (*fn)(void *ctx, size_t begin, size_t end), void *ctx);

/* Number of online CPUs (>= 1). */
int    kpool_ncpu(void);
#endif
