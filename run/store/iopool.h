/* Asynchronous reads for streaming: one queue per member file (per disk),
 * each served by its own threads, so every disk of a set works at once and
 * each reads its own requests front to back.  Each queue has two levels,
 * urgent (experts the router just chose) before read-ahead (the next trunk
 * pieces); within a level requests are served in the order they were queued,
 * and the store queues them in offset order, so one step is one forward
 * sweep per disk.
 *
 * A request reads one member file's contiguous byte range, scattered into the
 * destination as stripe units (units k, k+N, ... of a stripe set are adjacent
 * in the member file but N units apart in the extent): one large sequential
 * read per disk however small the stripe unit.  A decode request (a run of
 * whole compressed blocks, docs/FORMAT.md §8) reads the blocks' stored bytes
 * into the worker's own staging buffer and decodes each block straight into
 * its destination, checking its raw XXH3 (kpk_block_decode), as the read
 * completes.  Every read can be traced (member, offset, length, start, end). */
#ifndef KRUN_IOPOOL_H
#define KRUN_IOPOOL_H

#include "format/kpk_reader.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum { KIOP_URGENT = 0, KIOP_AHEAD = 1 };

/* Runs (stripe units) of one scatter request at most: iovecs on the worker's stack. */
#define KIOP_MAX_RUNS 64

/* A group of requests completed together. */
typedef struct kiop_batch {
    int pending;
    int err;            /* errno of the first failed read, 0 if none */
    uint16_t err_member;
    uint64_t err_off;
    int decode_failed;  /* a block failed to decode or to match its checksum: decode_err says which */
    kpk_err decode_err;
    uint64_t bytes;     /* bytes read from disk */
} kiop_batch;

typedef struct kiop_req {
    uint16_t member;    /* the queue, and for a plain read the member file read */
    uint64_t off, len;  /* plain: member-file bytes; decode: the extent's stored bytes (aligned) */
    uint8_t *buf;       /* plain: where the first byte goes */
    /* plain reads of a stripe set: the first `first` bytes go to buf, then
     * runs of `unit` bytes, run j >= 1 at buf + run1 + (j - 1) * stride.
     * first == len: one run. */
    uint64_t first, run1, stride, unit;
    /* decode (b1 > b0): blocks [b0, b1) of extent; block b0's decoded bytes go to raw */
    uint32_t extent, b0, b1;
    uint8_t *raw;
    int prio;
    char kind;          /* for the trace: 'T' trunk, 'H' lm_head, 'E' expert, 'P' predicted expert, 'R' resident */
    kiop_batch *batch;
} kiop_req;

/* How one member file is read: its descriptor (O_DIRECT or buffered), and
 * whether what is read is dropped from the page cache afterwards. */
typedef struct kiop_member {
    int fd;
    int drop_cache;
} kiop_member;

typedef struct kiop_pool kiop_pool;

/* threads[m] workers for member m (0: that member is never read).  f is
 * needed for decode requests (NULL otherwise); each worker then has a
 * staging buffer of stage_bytes (kiop_stage_bytes). */
kiop_pool *kiop_pool_create(const kiop_member *members, int n_members, const int *threads, const kpk_file *f, size_t stage_bytes);
void kiop_pool_destroy(kiop_pool *p);
int kiop_pool_threads(const kiop_pool *p);
/* Room for n queued requests per member and level, so queueing allocates nothing. */
int kiop_reserve(kiop_pool *p, size_t n);
/* Queue n requests (copied); each one increments its batch's pending count. */
int kiop_submit(kiop_pool *p, const kiop_req *reqs, size_t n);
/* Wait until the batch has no pending request; returns its err (EIO for a
 * failed decode: see decode_failed). */
int kiop_wait(kiop_pool *p, kiop_batch *b);
/* Take the batch's requests that no worker has started out of the queues
 * (a prediction the router did not confirm); returns their bytes.  Those
 * already started still land: kiop_wait for them before reusing the buffer. */
uint64_t kiop_cancel(kiop_pool *p, kiop_batch *b);
/* 1 if the batch is complete (no waiting). */
int kiop_done(kiop_pool *p, kiop_batch *b);
/* Bytes read from member m so far. */
uint64_t kiop_member_bytes(const kiop_pool *p, int m);
/* Seconds member m was busy so far: while at least one read queued for it was
 * in progress (the union over its workers; a decode request's decoding is not
 * counted).  kiop_member_bytes / this is the speed the member delivers while
 * krun waits on it; the fraction of the time it is busy is its utilization. */
double kiop_member_busy(const kiop_pool *p, int m);
/* Start recording every read; kiop_trace_write dumps them as TSV. */
void kiop_trace_enable(kiop_pool *p);
int kiop_trace_write(kiop_pool *p, const char *path);
/* Seconds the caller spent blocked in kiop_wait. */
double kiop_wait_seconds(const kiop_pool *p);

/* Decode requests: the most stored bytes one request reads (its span,
 * aligned), and what each worker holds to serve them: the staging buffer,
 * the decoder's plane buffer and zstd context.  0 when the file has no
 * compressed extent krun streams. */
#define KIOP_STAGE_TARGET ((uint64_t)8 << 20)
uint64_t kiop_stage_bytes(const kpk_file *f);
uint64_t kiop_worker_bytes(const kpk_file *f);

#endif
