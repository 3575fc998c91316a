/* The conversion data path: shards -> chunk ring -> hash + sparse write. */
#include "copy.h"

#include "kio.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define CHUNK ((size_t)16 << 20)  /* large sequential reads and writes; 4 in flight */
#define NBUF 4
#define BLOCK 4096u

struct chunk {
    uint32_t extent;
    uint64_t pos;        /* offset inside the extent */
    size_t len;
    int all_zero;        /* nothing but holes and padding: skip hashing scan and writing */
    uint8_t *buf;
};

struct pipe {
    const k3_source *src;
    const kp_plan *p;
    int *shard_fd;
    uint32_t first;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct chunk ring[NBUF];
    unsigned head, tail;     /* produced, consumed counters */
    int reader_done, stop, failed;
    char err[600];
    uint64_t bytes_read;
};

/* Fill chunk [pos, pos+len) of extent e from its tensors; returns -1 on I/O error. */
static int fill_chunk(struct pipe *pp, uint32_t e, uint64_t pos, size_t len, struct chunk *c)
{
    const kp_plan *p = pp->p;
    const kpk_extent *x = &p->extents[e];
    int any_data = 0;
    memset(c->buf, 0, len);
    for (uint64_t ti = x->first_tensor; ti < (uint64_t)x->first_tensor + x->tensor_count; ti++) {
        const kpk_tensor *t = &p->tensors[ti];
        const kp_source_ref *from = &p->from[ti];
        uint64_t a = t->offset > pos ? t->offset : pos;
        uint64_t b = t->offset + t->nbytes < pos + len ? t->offset + t->nbytes : pos + len;
        if (a >= b) continue;
        if (from->shard == UINT32_MAX) {
            memcpy(c->buf + (a - pos), pp->src->extras[from->extra].data + (a - t->offset), b - a);
            any_data = 1;
            continue;
        }
        {
            int fd = pp->shard_fd[from->shard];
            uint64_t so = from->offset + (a - t->offset);
            off_t d = lseek(fd, (off_t)so, SEEK_DATA);
            /* a range that is entirely a hole reads as zeros: skip the read */
            if ((d < 0 && errno == ENXIO) || (d >= 0 && (uint64_t)d >= so + (b - a))) continue;
            if (kio_pread_full(fd, c->buf + (a - pos), b - a, so)) {
                snprintf(pp->err, sizeof pp->err, "%s: reading tensor %s: %s", pp->src->shards[from->shard].path, t->name,
                         errno == ENODATA ? "unexpected end of file (the shard shrank?)" : strerror(errno));
                return -1;
            }
            pp->bytes_read += b - a;
            any_data = 1;
        }
    }
    c->extent = e;
    c->pos = pos;
    c->len = len;
    c->all_zero = !any_data;
    return 0;
}

static void *reader_main(void *arg)
{
    struct pipe *pp = arg;
    const kp_plan *p = pp->p;
    for (uint32_t e = pp->first; e < p->n_extents; e++) {
        const kpk_extent *x = &p->extents[e];
        /* an empty extent still produces one (empty) chunk so the writer sees it */
        for (uint64_t pos = 0; pos < x->raw_len || (pos == 0 && x->raw_len == 0);) {
            size_t len = x->raw_len - pos < CHUNK ? (size_t)(x->raw_len - pos) : CHUNK;
            struct chunk *c;
            pthread_mutex_lock(&pp->mu);
            while (pp->head - pp->tail == NBUF && !pp->stop) pthread_cond_wait(&pp->cv, &pp->mu);
            if (pp->stop) { pthread_mutex_unlock(&pp->mu); return NULL; }
            c = &pp->ring[pp->head % NBUF];
            pthread_mutex_unlock(&pp->mu);
            if (fill_chunk(pp, e, pos, len, c)) {
                pthread_mutex_lock(&pp->mu);
                pp->failed = 1;
                pp->reader_done = 1;
                pthread_cond_broadcast(&pp->cv);
                pthread_mutex_unlock(&pp->mu);
                return NULL;
            }
            pthread_mutex_lock(&pp->mu);
            pp->head++;
            pthread_cond_broadcast(&pp->cv);
            pthread_mutex_unlock(&pp->mu);
            pos += len;
            if (len == 0) break;
        }
    }
    pthread_mutex_lock(&pp->mu);
    pp->reader_done = 1;
    pthread_cond_broadcast(&pp->cv);
    pthread_mutex_unlock(&pp->mu);
    return NULL;
}

/* Write the non-zero 4 KiB blocks of buf at file offset off (off is block aligned). */
static int write_sparse(int fd, const uint8_t *buf, size_t len, uint64_t off, uint64_t *written)
{
    size_t i = 0;
    while (i < len) {
        size_t j;
        size_t n = len - i < BLOCK ? len - i : BLOCK;
        if (kio_is_zero(buf + i, n)) { i += n; continue; }
        for (j = i + n; j < len; j += BLOCK) {
            size_t m = len - j < BLOCK ? len - j : BLOCK;
            if (kio_is_zero(buf + j, m)) break;
        }
        if (j > len) j = len;
        if (kio_pwrite_full(fd, buf + i, j - i, off + i)) return -1;
        *written += j - i;
        i = j;
    }
    return 0;
}

int kp_copy_extents(const k3_source *src, const kp_plan *p, int out_fd, uint32_t first, kp_extent_done_fn done,
                    void *ctx, kprogress *prog, kp_copy_stats *stats, char *err, size_t errlen)
{
    struct pipe pp;
    pthread_t reader;
    XXH3_state_t *st = XXH3_createState();
    int rc = -1, started = 0;

    memset(&pp, 0, sizeof pp);
    memset(stats, 0, sizeof *stats);
    pp.src = src;
    pp.p = p;
    pp.first = first;
    pthread_mutex_init(&pp.mu, NULL);
    pthread_cond_init(&pp.cv, NULL);
    pp.shard_fd = malloc(sizeof *pp.shard_fd * (src->n_shards + 1));
    if (!st || !pp.shard_fd) { snprintf(err, errlen, "out of memory"); goto out; }
    for (size_t i = 0; i < src->n_shards; i++) pp.shard_fd[i] = -1;
    for (size_t i = 0; i < src->n_shards; i++) {
        pp.shard_fd[i] = open(src->shards[i].path, O_RDONLY | O_CLOEXEC);
        if (pp.shard_fd[i] < 0) { snprintf(err, errlen, "%s: %s", src->shards[i].path, strerror(errno)); goto out; }
        posix_fadvise(pp.shard_fd[i], 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    for (int i = 0; i < NBUF; i++)
        if (!(pp.ring[i].buf = malloc(CHUNK))) { snprintf(err, errlen, "out of memory"); goto out; }
    if (pthread_create(&reader, NULL, reader_main, &pp)) { snprintf(err, errlen, "cannot start the reader thread"); goto out; }
    started = 1;

    XXH3_64bits_reset(st);
    for (;;) {
        struct chunk *c;
        const kpk_extent *x;
        pthread_mutex_lock(&pp.mu);
        while (pp.head == pp.tail && !pp.reader_done) pthread_cond_wait(&pp.cv, &pp.mu);
        if (pp.head == pp.tail) { /* reader finished or failed, ring drained */
            pthread_mutex_unlock(&pp.mu);
            break;
        }
        c = &pp.ring[pp.tail % NBUF];
        pthread_mutex_unlock(&pp.mu);

        x = &p->extents[c->extent];
        XXH3_64bits_update(st, c->buf, c->len);
        if (!c->all_zero && write_sparse(out_fd, c->buf, c->len, x->offset + c->pos, &stats->bytes_written)) {
            char d[64];
            kpk_extent_describe(x, d, sizeof d);
            snprintf(err, errlen, "writing %s: %s", d, strerror(errno));
            goto stop;
        }
        stats->bytes_in += c->len;
        kprogress_add(prog, c->len);
        if (c->pos + c->len == x->raw_len) {
            uint64_t h = XXH3_64bits_digest(st);
            XXH3_64bits_reset(st);
            if (done(ctx, c->extent, h)) { snprintf(err, errlen, "stopped"); goto stop; }
        }
        pthread_mutex_lock(&pp.mu);
        pp.tail++;
        pthread_cond_broadcast(&pp.cv);
        pthread_mutex_unlock(&pp.mu);
    }
    if (pp.failed) { snprintf(err, errlen, "%s", pp.err); goto out; }
    rc = 0;
    goto out;
stop:
    pthread_mutex_lock(&pp.mu);
    pp.stop = 1;
    pthread_cond_broadcast(&pp.cv);
    pthread_mutex_unlock(&pp.mu);
out:
    if (started) pthread_join(reader, NULL);
    stats->bytes_read = pp.bytes_read;
    for (int i = 0; i < NBUF; i++) free(pp.ring[i].buf);
    if (pp.shard_fd)
        for (size_t i = 0; i < src->n_shards; i++)
            if (pp.shard_fd[i] >= 0) close(pp.shard_fd[i]);
    free(pp.shard_fd);
    XXH3_freeState(st);
    pthread_mutex_destroy(&pp.mu);
    pthread_cond_destroy(&pp.cv);
    return rc;
}

int kp_hash_written_extent(int out_fd, const kp_plan *p, uint32_t i, uint64_t *xxh3)
{
    const kpk_extent *x = &p->extents[i];
    XXH3_state_t *st = XXH3_createState();
    uint8_t *buf = malloc(CHUNK);
    int rc = -1;
    if (!st || !buf) { errno = ENOMEM; goto out; }
    XXH3_64bits_reset(st);
    for (uint64_t pos = 0; pos < x->stored_len;) {
        size_t n = x->stored_len - pos < CHUNK ? (size_t)(x->stored_len - pos) : CHUNK;
        if (kio_pread_full(out_fd, buf, n, x->offset + pos)) goto out;
        XXH3_64bits_update(st, buf, n);
        pos += n;
    }
    *xxh3 = XXH3_64bits_digest(st);
    rc = 0;
out:
    free(buf);
    XXH3_freeState(st);
    return rc;
}
