/* Asynchronous reads for streaming: a few threads execute pread requests
 * (buffered or O_DIRECT) from a two-level queue, urgent requests (experts the
 * router just chose) before read-ahead (the next trunk layer).  Requests are
 * served in the order they were queued within a level; the store queues them
 * in file-offset order.  Every read can be traced (offset, length, start, end). */
#ifndef KRUN_IOPOOL_H
#define KRUN_IOPOOL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum { KIO_URGENT = 0, KIO_AHEAD = 1 };

/* A group of requests completed together. */
typedef struct kio_batch {
    int pending;
    int err;            /* errno of the first failure, 0 if none */
    uint64_t bytes;
} kio_batch;

typedef struct kio_req {
    int fd;
    void *buf;
    uint64_t off;
    size_t len;
    int prio;
    char kind;          /* for the trace: 'T' trunk, 'E' expert, 'G' globals, 'R' resident */
    int drop_cache;     /* posix_fadvise(DONTNEED) after reading: no hidden page cache */
    kio_batch *batch;
} kio_req;

typedef struct kio_pool kio_pool;

kio_pool *kio_pool_create(int threads);
void kio_pool_destroy(kio_pool *p);
/* Room for n queued requests per level, so that queueing allocates nothing. */
int kio_reserve(kio_pool *p, size_t n);
/* Queue n requests (copied); each one increments its batch's pending count. */
int kio_submit(kio_pool *p, const kio_req *reqs, size_t n);
/* Wait until the batch has no pending request; returns its err. */
int kio_wait(kio_pool *p, kio_batch *b);
/* 1 if the batch is complete (no waiting). */
int kio_done(kio_pool *p, kio_batch *b);
/* Start recording every read; kio_trace_write dumps them as TSV. */
void kio_trace_enable(kio_pool *p);
int kio_trace_write(kio_pool *p, const char *path);
/* Seconds the caller spent blocked in kio_wait. */
double kio_wait_seconds(const kio_pool *p);

#endif
