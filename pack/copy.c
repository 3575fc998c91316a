/* The conversion data path: shards -> chunk ring -> hash + sparse write. */
#include "copy.h"

#include "kio.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define CHUNK ((size_t)16 << 20)  /* large sequential reads and writes; 4 in flight */
#define NBUF 4
#define BLOCK 4096u
#define WB_LAG 2                    /* chunks of output in writeback before the oldest is waited for */
#define ZERO_BUF ((size_t)64 << 10) /* hashed repeatedly for hole extents: stays in L2 */
#define ZERO_MEMO 64                /* hashes of all-zero extents, by length */
#define HOLE_RUN 1024               /* hole extents handed over at once (one per extent costs a thread switch) */

/* Never written: the source of zeros for hashing hole extents. */
static uint8_t zero_buf[ZERO_BUF];

struct chunk {
    uint32_t extent;
    uint64_t pos;        /* offset inside the extent */
    uint64_t len;
    int all_zero;        /* nothing but holes and gaps: buf not filled, nothing written */
    uint32_t n_holes;    /* > 0: stands for this many whole extents of nothing but holes */
    uint8_t *buf;
};

struct pipe {
    const k3_source *src;
    const kp_plan *p;
    int *shard_fd;
    uint64_t *shard_size;
    uint32_t *last_use;      /* per shard: the last extent that reads from it */
    uint8_t *ends_shard;     /* per extent: 1 if it is some shard's last use */
    uint32_t first;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct chunk ring[NBUF];
    unsigned head, tail;     /* produced, consumed counters */
    int reader_done, stop, failed;
    char err[600];
    uint64_t bytes_read;
};

/* 1 if [off, off+len) of the shard is a hole (reads as zeros without I/O).
 * A range past the end of the file is not: reading it reports the shrink. */
static int range_is_hole(struct pipe *pp, uint32_t shard, uint64_t off, uint64_t len)
{
    int fd = pp->shard_fd[shard];
    off_t d;
    if (off + len > pp->shard_size[shard]) return 0;
    d = lseek(fd, (off_t)off, SEEK_DATA);
    return (d < 0 && errno == ENXIO) || (d >= 0 && (uint64_t)d >= off + len);
}

/* 1 if every tensor of extent e is a hole in its shard. */
static int extent_is_hole(struct pipe *pp, uint32_t e)
{
    const kp_plan *p = pp->p;
    const kpk_extent *x = &p->extents[e];
    for (uint64_t ti = x->first_tensor; ti < (uint64_t)x->first_tensor + x->tensor_count; ti++) {
        const kp_source_ref *from = &p->from[ti];
        if (p->tensors[ti].nbytes == 0) continue;
        if (from->shard == UINT32_MAX || !range_is_hole(pp, from->shard, from->offset, p->tensors[ti].nbytes)) return 0;
    }
    return 1;
}

/* The part [*a, *b) of tensor t that lies in [pos, pos+len): 1 if it is not
 * empty, 0 if the tensor lies before the range, -1 if it lies past it (and,
 * since tensors are in offset order, so do all that follow). */
static int tensor_in_range(const kpk_tensor *t, uint64_t pos, uint64_t len, uint64_t *a, uint64_t *b)
{
    *a = t->offset > pos ? t->offset : pos;
    *b = t->offset + t->nbytes < pos + len ? t->offset + t->nbytes : pos + len;
    if (*a < *b) return 1;
    return t->offset >= pos + len ? -1 : 0;
}

/* Fill chunk [pos, pos+len) of extent e from its tensors; returns -1 on I/O
 * error.  Tensors are in increasing offset order within an extent (the plan
 * builds them so), so only the gaps between them need zeroing. */
static int fill_chunk(struct pipe *pp, uint32_t e, uint64_t pos, size_t len, struct chunk *c)
{
    const kp_plan *p = pp->p;
    const kpk_extent *x = &p->extents[e];
    uint64_t z = pos; /* [pos, z) is filled */
    c->extent = e;
    c->n_holes = 0;
    c->pos = pos;
    c->len = len;
    c->all_zero = 1;
    /* First look: a chunk of nothing but holes and gaps is not filled at all. */
    for (uint64_t ti = x->first_tensor; ti < (uint64_t)x->first_tensor + x->tensor_count && c->all_zero; ti++) {
        const kpk_tensor *t = &p->tensors[ti];
        const kp_source_ref *from = &p->from[ti];
        uint64_t a, b;
        int in = tensor_in_range(t, pos, len, &a, &b);
        if (in < 0) break;
        if (in == 0) continue;
        if (from->shard == UINT32_MAX || !range_is_hole(pp, from->shard, from->offset + (a - t->offset), b - a)) c->all_zero = 0;
    }
    if (c->all_zero) return 0;
    for (uint64_t ti = x->first_tensor; ti < (uint64_t)x->first_tensor + x->tensor_count; ti++) {
        const kpk_tensor *t = &p->tensors[ti];
        const kp_source_ref *from = &p->from[ti];
        uint64_t a, b;
        int in = tensor_in_range(t, pos, len, &a, &b);
        if (in < 0) break;
        if (in == 0) continue;
        if (a > z) memset(c->buf + (z - pos), 0, a - z);
        if (b > z) z = b;
        if (from->shard == UINT32_MAX) {
            memcpy(c->buf + (a - pos), pp->src->extras[from->extra].data + (a - t->offset), b - a);
            continue;
        }
        {
            int fd = pp->shard_fd[from->shard];
            uint64_t so = from->offset + (a - t->offset);
            /* a range that is entirely a hole reads as zeros: skip the read */
            if (range_is_hole(pp, from->shard, so, b - a)) {
                memset(c->buf + (a - pos), 0, b - a);
                continue;
            }
            if (kio_pread_full(fd, c->buf + (a - pos), b - a, so)) {
                snprintf(pp->err, sizeof pp->err, "%s: reading tensor %s: %s", pp->src->shards[from->shard].path, t->name,
                         errno == ENODATA ? "unexpected end of file (the shard shrank?)" : strerror(errno));
                return -1;
            }
            /* read once: drop it from the page cache rather than let 1.5 TB push everything else out */
            posix_fadvise(fd, (off_t)so, (off_t)(b - a), POSIX_FADV_DONTNEED);
            pp->bytes_read += b - a;
        }
    }
    if (z < pos + len) memset(c->buf + (z - pos), 0, pos + len - z);
    c->all_zero = 0;
    return 0;
}

/* Wait for a free ring slot; NULL if the copy was stopped. */
static struct chunk *slot(struct pipe *pp)
{
    struct chunk *c;
    pthread_mutex_lock(&pp->mu);
    while (pp->head - pp->tail == NBUF && !pp->stop) pthread_cond_wait(&pp->cv, &pp->mu);
    c = pp->stop ? NULL : &pp->ring[pp->head % NBUF];
    pthread_mutex_unlock(&pp->mu);
    return c;
}

static void publish(struct pipe *pp)
{
    pthread_mutex_lock(&pp->mu);
    pp->head++;
    pthread_cond_broadcast(&pp->cv);
    pthread_mutex_unlock(&pp->mu);
}

/* Hand over extent e chunk by chunk; -1 if the copy was stopped or a read failed. */
static int send_extent(struct pipe *pp, uint32_t e)
{
    const kpk_extent *x = &pp->p->extents[e];
    /* an empty extent still produces one (empty) chunk so the writer sees it */
    for (uint64_t pos = 0; pos < x->raw_len || (pos == 0 && x->raw_len == 0);) {
        size_t len = x->raw_len - pos < CHUNK ? (size_t)(x->raw_len - pos) : CHUNK;
        struct chunk *c = slot(pp);
        if (!c) return -1;
        if (fill_chunk(pp, e, pos, len, c)) {
            pthread_mutex_lock(&pp->mu);
            pp->failed = 1;
            pp->reader_done = 1;
            pthread_cond_broadcast(&pp->cv);
            pthread_mutex_unlock(&pp->mu);
            return -1;
        }
        publish(pp);
        pos += len;
        if (len == 0) break;
    }
    return 0;
}

/* Extent e is nothing but holes: hand it over, with the hole extents that
 * follow it, as one chunk (nothing to read or write; one hand-over per extent
 * would cost a thread switch each).  A run ends at a shard's last extent.
 * Returns how many extents it covers, 0 if the copy was stopped. */
static uint32_t send_holes(struct pipe *pp, uint32_t e)
{
    const kp_plan *p = pp->p;
    struct chunk *c = slot(pp);
    uint32_t n = 1;
    if (!c) return 0;
    while (n < HOLE_RUN && e + n < p->n_extents && !pp->ends_shard[e + n - 1] && p->extents[e + n].raw_len > 0 &&
           extent_is_hole(pp, e + n))
        n++;
    c->extent = e;
    c->n_holes = n;
    c->pos = 0;
    c->len = p->extents[e].raw_len;
    c->all_zero = 1;
    publish(pp);
    return n;
}

static void *reader_main(void *arg)
{
    struct pipe *pp = arg;
    const kp_plan *p = pp->p;
    for (uint32_t e = pp->first; e < p->n_extents; e++) {
        if (p->extents[e].raw_len > 0 && extent_is_hole(pp, e)) {
            uint32_t n = send_holes(pp, e);
            if (!n) return NULL;
            e += n - 1;
        } else if (send_extent(pp, e)) {
            return NULL;
        }
        /* A shard read for the last time: drop what the per-range drops left
         * behind (page cache folios that straddle a range's ends). */
        if (pp->ends_shard[e])
            for (size_t i = 0; i < pp->src->n_shards; i++)
                if (pp->last_use[i] == e) posix_fadvise(pp->shard_fd[i], 0, 0, POSIX_FADV_DONTNEED);
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

/* Feed len zero bytes to the hash without touching a chunk buffer. */
static void hash_zeros(XXH3_state_t *st, uint64_t len)
{
    for (uint64_t done = 0; done < len;) {
        size_t n = len - done < ZERO_BUF ? (size_t)(len - done) : ZERO_BUF;
        XXH3_64bits_update(st, zero_buf, n);
        done += n;
    }
}

/* XXH3 of len zero bytes, remembered by length: a sparse source repeats the
 * same few extent sizes (every routed expert has one), so 1.45 TB of expert
 * holes cost one 17.5 MB hash, and 118 GB of trunk holes a few trunk-sized
 * ones. */
struct zero_memo { uint64_t len[ZERO_MEMO], h[ZERO_MEMO]; unsigned n, next; };

static uint64_t zero_xxh3(struct zero_memo *m, XXH3_state_t *st, uint64_t len)
{
    uint64_t h;
    for (unsigned i = 0; i < m->n; i++)
        if (m->len[i] == len) return m->h[i];
    XXH3_64bits_reset(st);
    hash_zeros(st, len);
    h = XXH3_64bits_digest(st);
    XXH3_64bits_reset(st);
    m->len[m->next] = len;
    m->h[m->next] = h;
    m->next = (m->next + 1) % ZERO_MEMO;
    if (m->n < ZERO_MEMO) m->n++;
    return h;
}

/* Write-behind: start writeback of each chunk as soon as it is written, wait
 * for the one written WB_LAG chunks earlier and drop it from the page cache.
 * The dirty set stays a few chunks (the journal's fdatasync has little left
 * to do), the disk writes while the shards are read, and 1.5 TB of output
 * does not push everything else out of memory.  Not a durability point: the
 * journal still waits for fdatasync. */
struct wb { uint64_t off[WB_LAG + 1], len[WB_LAG + 1]; unsigned n; int disabled; };

static int write_behind(struct wb *w, int fd, uint64_t off, uint64_t len)
{
    unsigned k;
    if (w->disabled || !len) return 0;
    if (sync_file_range(fd, (off_t)off, (off_t)len, SYNC_FILE_RANGE_WRITE)) {
        if (errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP) { w->disabled = 1; return 0; } /* plain writeback then */
        return -1;
    }
    w->off[w->n % (WB_LAG + 1)] = off;
    w->len[w->n % (WB_LAG + 1)] = len;
    w->n++;
    if (w->n <= WB_LAG) return 0;
    k = (w->n - 1 - WB_LAG) % (WB_LAG + 1);
    if (sync_file_range(fd, (off_t)w->off[k], (off_t)w->len[k],
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER))
        return -1;
    posix_fadvise(fd, (off_t)w->off[k], (off_t)w->len[k], POSIX_FADV_DONTNEED);
    return 0;
}

int kp_copy_extents(const k3_source *src, const kp_plan *p, int out_fd, uint32_t first, kp_extent_done_fn done,
                    void *ctx, kprogress *prog, kp_copy_stats *stats, char *err, size_t errlen)
{
    struct pipe pp;
    pthread_t reader;
    XXH3_state_t *st = XXH3_createState();
    struct zero_memo *memo = calloc(1, sizeof *memo);
    struct wb wb = {{0}, {0}, 0, 0};
    uint64_t zero_prefix = 0; /* leading zero bytes of the current extent, not yet hashed */
    int extent_zero = 1;      /* the current extent has been all zeros so far */
    int rc = -1, started = 0;

    memset(&pp, 0, sizeof pp);
    memset(stats, 0, sizeof *stats);
    pp.src = src;
    pp.p = p;
    pp.first = first;
    pthread_mutex_init(&pp.mu, NULL);
    pthread_cond_init(&pp.cv, NULL);
    pp.shard_fd = malloc(sizeof *pp.shard_fd * (src->n_shards + 1));
    for (size_t i = 0; pp.shard_fd && i < src->n_shards; i++) pp.shard_fd[i] = -1;
    pp.shard_size = malloc(sizeof *pp.shard_size * (src->n_shards + 1));
    pp.last_use = malloc(sizeof *pp.last_use * (src->n_shards + 1));
    pp.ends_shard = calloc(p->n_extents + 1, 1);
    if (!st || !memo || !pp.shard_fd || !pp.shard_size || !pp.last_use || !pp.ends_shard) { snprintf(err, errlen, "out of memory"); goto out; }
    for (size_t i = 0; i < src->n_shards; i++) pp.last_use[i] = UINT32_MAX;
    for (uint32_t e = first; e < p->n_extents; e++)
        for (uint64_t ti = p->extents[e].first_tensor; ti < (uint64_t)p->extents[e].first_tensor + p->extents[e].tensor_count; ti++)
            if (p->from[ti].shard != UINT32_MAX) pp.last_use[p->from[ti].shard] = e;
    for (size_t i = 0; i < src->n_shards; i++)
        if (pp.last_use[i] != UINT32_MAX) pp.ends_shard[pp.last_use[i]] = 1;
    for (size_t i = 0; i < src->n_shards; i++) {
        struct stat sst;
        pp.shard_fd[i] = open(src->shards[i].path, O_RDONLY | O_CLOEXEC);
        if (pp.shard_fd[i] < 0 || fstat(pp.shard_fd[i], &sst)) { snprintf(err, errlen, "%s: %s", src->shards[i].path, strerror(errno)); goto out; }
        pp.shard_size[i] = (uint64_t)sst.st_size;
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
        int last, zero;
        pthread_mutex_lock(&pp.mu);
        while (pp.head == pp.tail && !pp.reader_done) pthread_cond_wait(&pp.cv, &pp.mu);
        if (pp.head == pp.tail) { /* reader finished or failed, ring drained */
            pthread_mutex_unlock(&pp.mu);
            break;
        }
        c = &pp.ring[pp.tail % NBUF];
        pthread_mutex_unlock(&pp.mu);

        if (c->n_holes) {
            for (uint32_t k = 0; k < c->n_holes; k++) {
                uint64_t len = p->extents[c->extent + k].raw_len;
                stats->bytes_in += len;
                kprogress_add(prog, len);
                if (done(ctx, c->extent + k, zero_xxh3(memo, st, len))) { snprintf(err, errlen, "stopped"); goto stop; }
            }
            goto next;
        }
        x = &p->extents[c->extent];
        last = c->pos + c->len == x->raw_len;
        if (c->pos == 0) {
            zero_prefix = 0;
            extent_zero = 1;
        }
        zero = c->all_zero;
        if (!zero) {
            uint64_t before = stats->bytes_written;
            if (write_sparse(out_fd, c->buf, c->len, x->offset + c->pos, &stats->bytes_written) ||
                write_behind(&wb, out_fd, x->offset + c->pos, c->len)) {
                char d[64];
                kpk_extent_describe(x, d, sizeof d);
                snprintf(err, errlen, "writing %s: %s", d, strerror(errno));
                goto stop;
            }
            zero = stats->bytes_written == before; /* every block was zero */
        }
        /* While an extent is all zeros, only its length is counted: an
         * extent that ends that way is hashed by length (remembered). */
        if (zero && extent_zero) {
            zero_prefix += c->len;
        } else {
            if (extent_zero) {
                hash_zeros(st, zero_prefix);
                extent_zero = 0;
            }
            if (c->all_zero) hash_zeros(st, c->len);
            else XXH3_64bits_update(st, c->buf, c->len);
        }
        stats->bytes_in += c->len;
        kprogress_add(prog, c->len);
        if (last) {
            uint64_t h = extent_zero ? zero_xxh3(memo, st, x->raw_len) : XXH3_64bits_digest(st);
            XXH3_64bits_reset(st);
            if (done(ctx, c->extent, h)) { snprintf(err, errlen, "stopped"); goto stop; }
        }
    next:
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
    free(pp.shard_size);
    free(pp.last_use);
    free(pp.ends_shard);
    free(memo);
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
