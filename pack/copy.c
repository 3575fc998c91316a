/* The conversion data path: source -> chunk ring -> hash, place -> member writers. */
#include "copy.h"

#include "kio.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define CHUNK ((size_t)16 << 20)  /* large sequential reads and writes */
#define NBUF_MAX 12
#define ZERO_BUF ((size_t)64 << 10) /* hashed repeatedly for hole extents: stays in L2 */
#define ZERO_MEMO 64                /* hashes of all-zero extents, by length */
#define HOLE_RUN 1024               /* hole extents handed over at once (one per extent costs a thread switch) */
#define VERIFY_SCRATCH ((size_t)8 << 20)

/* Never written: the source of zeros for hashing hole extents. */
static uint8_t zero_buf[ZERO_BUF];

enum { SLOT_FREE, SLOT_FILLED, SLOT_BUSY };

struct pipe;

struct chunk {
    struct pipe *pp;
    int state;
    _Atomic int refs;    /* writes not yet done, + 1 while the dispatcher works on it */
    uint32_t extent;
    uint64_t pos;        /* offset inside the extent */
    uint64_t len;
    int all_zero;        /* nothing but holes and gaps: buf not filled, nothing written */
    uint32_t n_holes;    /* > 0: stands for this many whole extents of nothing but holes */
    uint8_t *buf;
};

struct pipe {
    const kp_input *in;
    const kp_plan *p;
    int *shard_fd;
    uint64_t *shard_size;
    uint32_t *last_use;      /* per shard: the last extent that reads from it */
    uint8_t *ends_shard;     /* per extent: 1 if it is some shard's last use */
    uint32_t first;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct chunk ring[NBUF_MAX];
    unsigned nbuf;
    unsigned head, tail;     /* produced, dispatched counters */
    int reader_done, stop, failed;
    int damaged;             /* the failure is a damaged source KPK file */
    char err[800];
    uint64_t bytes_read;
};

/* ---- holes ----------------------------------------------------------------- */

/* 1 if [off, off+len) of fd is a hole (reads as zeros without I/O). */
static int fd_range_is_hole(int fd, uint64_t off, uint64_t len)
{
    off_t d = lseek(fd, (off_t)off, SEEK_DATA);
    return (d < 0 && errno == ENXIO) || (d >= 0 && (uint64_t)d >= off + len);
}

/* A source KPK extent's decoded range [pos, pos+len) is holes (codec 0 only). */
static int kpk_range_is_hole(kpk_file *f, uint32_t i, uint64_t pos, uint64_t len)
{
    kpk_seg seg[64];
    if (kpk_extent_at(f, i)->codec != KPK_CODEC_NONE) return 0;
    while (len) {
        uint64_t done;
        size_t n = kpk_extent_segments(f, i, pos, len, seg, 64, &done);
        if (!n) return 0;
        for (size_t s = 0; s < n; s++)
            if (!fd_range_is_hole(kpk_member_fd(f, seg[s].member), seg[s].off, seg[s].len)) return 0;
        pos += done;
        len -= done;
    }
    return 1;
}

/* A tensor's source range is a hole.  A shard range past the end of the
 * file is not: reading it reports the shrink. */
static int source_is_hole(struct pipe *pp, const kp_source_ref *from, uint64_t off, uint64_t len)
{
    if (from->shard == KP_FROM_EXTRA) return 0;
    if (from->shard == KP_FROM_KPK) return kpk_range_is_hole(pp->in->kpk, from->extra, from->offset + off, len);
    if (from->offset + off + len > pp->shard_size[from->shard]) return 0;
    return fd_range_is_hole(pp->shard_fd[from->shard], from->offset + off, len);
}

/* 1 if every tensor of extent e is a hole in its source. */
static int extent_is_hole(struct pipe *pp, uint32_t e)
{
    const kp_plan *p = pp->p;
    const kpk_extent *x = &p->extents[e];
    if (pp->p->origin[e].identical) return kpk_range_is_hole(pp->in->kpk, p->origin[e].extent, 0, x->raw_len);
    for (uint64_t ti = x->first_tensor; ti < (uint64_t)x->first_tensor + x->tensor_count; ti++)
        if (p->tensors[ti].nbytes && !source_is_hole(pp, &p->from[ti], 0, p->tensors[ti].nbytes)) return 0;
    return 1;
}

/* ---- reading the source ------------------------------------------------------- */

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

static int read_failed(struct pipe *pp, const char *fmt, const char *a, const char *b)
{
    snprintf(pp->err, sizeof pp->err, fmt, a, b);
    return -1;
}

/* Bytes [off, off+len) of a tensor from its source into dst. */
static int read_tensor(struct pipe *pp, const kpk_tensor *t, const kp_source_ref *from, uint64_t off, uint64_t len,
                       uint8_t *dst)
{
    if (from->shard == KP_FROM_EXTRA) {
        memcpy(dst, pp->in->src->extras[from->extra].data + off, len);
        return 0;
    }
    if (source_is_hole(pp, from, off, len)) {
        memset(dst, 0, len);
        return 0;
    }
    if (from->shard == KP_FROM_KPK) {
        kpk_err e = {0};
        if (kpk_extent_read_raw(pp->in->kpk, from->extra, dst, len, from->offset + off, &e)) {
            pp->damaged = kpk_err_is_damage(e.code);
            return read_failed(pp, "reading the source: %s%s", e.msg, "");
        }
    } else {
        int fd = pp->shard_fd[from->shard];
        uint64_t so = from->offset + off;
        if (kio_pread_full(fd, dst, len, so)) {
            snprintf(pp->err, sizeof pp->err, "%s: reading tensor %s: %s", pp->in->src->shards[from->shard].path, t->name,
                     errno == ENODATA ? "unexpected end of file (the shard shrank?)" : strerror(errno));
            return -1;
        }
        /* read once: drop it from the page cache rather than let 1.5 TB push everything else out */
        posix_fadvise(fd, (off_t)so, (off_t)len, POSIX_FADV_DONTNEED);
    }
    pp->bytes_read += len;
    return 0;
}

/* Fill chunk [pos, pos+len) of extent e; -1 on a read error.  Tensors are
 * in increasing offset order within an extent, so only the gaps between them
 * need zeroing. */
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
    if (p->origin[e].identical) {
        /* a KPK source laid out the same: its decoded bytes, as they are */
        kpk_err er = {0};
        if (kpk_range_is_hole(pp->in->kpk, p->origin[e].extent, pos, len)) return 0;
        if (kpk_extent_read_raw(pp->in->kpk, p->origin[e].extent, c->buf, len, pos, &er)) {
            pp->damaged = kpk_err_is_damage(er.code);
            return read_failed(pp, "reading the source: %s%s", er.msg, "");
        }
        pp->bytes_read += len;
        c->all_zero = 0;
        return 0;
    }
    /* First look: a chunk of nothing but holes and gaps is not filled at all. */
    for (uint64_t ti = x->first_tensor; ti < (uint64_t)x->first_tensor + x->tensor_count && c->all_zero; ti++) {
        uint64_t a, b;
        int r = tensor_in_range(&p->tensors[ti], pos, len, &a, &b);
        if (r < 0) break;
        if (r > 0 && !source_is_hole(pp, &p->from[ti], a - p->tensors[ti].offset, b - a)) c->all_zero = 0;
    }
    if (c->all_zero) return 0;
    for (uint64_t ti = x->first_tensor; ti < (uint64_t)x->first_tensor + x->tensor_count; ti++) {
        const kpk_tensor *t = &p->tensors[ti];
        uint64_t a, b;
        int r = tensor_in_range(t, pos, len, &a, &b);
        if (r < 0) break;
        if (r == 0) continue;
        if (a > z) memset(c->buf + (z - pos), 0, a - z);
        if (b > z) z = b;
        if (read_tensor(pp, t, &p->from[ti], a - t->offset, b - a, c->buf + (a - pos))) return -1;
    }
    if (z < pos + len) memset(c->buf + (z - pos), 0, pos + len - z);
    c->all_zero = 0;
    return 0;
}

/* A KPK source extent copied tensor by tensor (not laid out the same) is
 * checked whole first: its bytes are not otherwise compared with its checksum. */
static int verify_source_extents(struct pipe *pp, uint32_t e)
{
    const kp_plan *p = pp->p;
    const kpk_extent *x = &p->extents[e];
    uint32_t last = UINT32_MAX;
    void *scratch;
    if (!pp->in->kpk || p->origin[e].identical) return 0;
    if (!(scratch = malloc(VERIFY_SCRATCH))) return read_failed(pp, "out of memory%s%s", "", "");
    for (uint64_t ti = x->first_tensor; ti < (uint64_t)x->first_tensor + x->tensor_count; ti++) {
        kpk_err er = {0};
        uint32_t s = p->from[ti].extra;
        if (s == last) continue;
        last = s;
        if (kpk_extent_verify(pp->in->kpk, s, scratch, VERIFY_SCRATCH, &er)) {
            free(scratch);
            pp->damaged = kpk_err_is_damage(er.code);
            return read_failed(pp, "the source is damaged: %s; run kpack verify on it%s", er.msg, "");
        }
    }
    free(scratch);
    return 0;
}

/* Wait for the next free ring slot; NULL if the copy was stopped. */
static struct chunk *slot(struct pipe *pp)
{
    struct chunk *c;
    pthread_mutex_lock(&pp->mu);
    while (pp->ring[pp->head % pp->nbuf].state != SLOT_FREE && !pp->stop) pthread_cond_wait(&pp->cv, &pp->mu);
    c = pp->stop ? NULL : &pp->ring[pp->head % pp->nbuf];
    pthread_mutex_unlock(&pp->mu);
    return c;
}

static void publish(struct pipe *pp, struct chunk *c)
{
    pthread_mutex_lock(&pp->mu);
    c->state = SLOT_FILLED;
    pp->head++;
    pthread_cond_broadcast(&pp->cv);
    pthread_mutex_unlock(&pp->mu);
}

static void reader_failed(struct pipe *pp)
{
    pthread_mutex_lock(&pp->mu);
    pp->failed = 1;
    pp->reader_done = 1;
    pthread_cond_broadcast(&pp->cv);
    pthread_mutex_unlock(&pp->mu);
}

/* Hand over extent e chunk by chunk; -1 if the copy was stopped or a read failed. */
static int send_extent(struct pipe *pp, uint32_t e)
{
    const kpk_extent *x = &pp->p->extents[e];
    if (verify_source_extents(pp, e)) { reader_failed(pp); return -1; }
    /* an empty extent still produces one (empty) chunk so the writer sees it */
    for (uint64_t pos = 0; pos < x->raw_len || (pos == 0 && x->raw_len == 0);) {
        size_t len = x->raw_len - pos < CHUNK ? (size_t)(x->raw_len - pos) : CHUNK;
        struct chunk *c = slot(pp);
        if (!c) return -1;
        if (fill_chunk(pp, e, pos, len, c)) { reader_failed(pp); return -1; }
        publish(pp, c);
        pos += len;
        if (len == 0) break;
    }
    return 0;
}

/* Extent e is nothing but holes: hand it over, with the hole extents that
 * follow it, as one chunk (nothing to read or write).  A run ends at a
 * shard's last extent.  Returns how many extents it covers, 0 if stopped. */
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
    publish(pp, c);
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
            for (size_t i = 0; pp->in->src && i < pp->in->src->n_shards; i++)
                if (pp->last_use[i] == e) posix_fadvise(pp->shard_fd[i], 0, 0, POSIX_FADV_DONTNEED);
    }
    pthread_mutex_lock(&pp->mu);
    pp->reader_done = 1;
    pthread_cond_broadcast(&pp->cv);
    pthread_mutex_unlock(&pp->mu);
    return NULL;
}

/* ---- the writers' references to chunks ------------------------------------------ */

void kp_chunk_hold(void *ctx, void *tag)
{
    (void)ctx;
    atomic_fetch_add(&((struct chunk *)tag)->refs, 1);
}

void kp_chunk_release(void *ctx, void *tag)
{
    struct chunk *c = tag;
    struct pipe *pp = c->pp;
    (void)ctx;
    if (atomic_fetch_sub(&c->refs, 1) == 1) {
        pthread_mutex_lock(&pp->mu);
        c->state = SLOT_FREE;
        pthread_cond_broadcast(&pp->cv);
        pthread_mutex_unlock(&pp->mu);
    }
}

/* ---- hashing ----------------------------------------------------------------------- */

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

/* ---- the dispatcher -------------------------------------------------------------- */

struct dispatch {
    kp_copy_stats *stats;
    kp_plan *p;
    kp_out *out;
    uint64_t *cursor;
    kp_extent_done_fn done;
    void *ctx;
    char *err;
    size_t errlen;
};

/* Extent i starts: the next offset of its file or of the stripe space. */
static void extent_start(struct dispatch *d, uint32_t i)
{
    kpk_extent *x = &d->p->extents[i];
    x->offset = d->cursor[kp_target(d->p, x->member)];
}

/* Extent i is complete with hash h: record it, advance its target's cursor. */
static int extent_end(struct dispatch *d, uint32_t i, uint64_t h)
{
    kp_plan *p = d->p;
    kpk_extent *x = &p->extents[i];
    char w[64];
    x->stored_len = x->raw_len; /* codec 0 (compressed extents: a later kpack) */
    x->stored_xxh3 = x->raw_xxh3 = h;
    d->cursor[kp_target(p, x->member)] = x->offset + kpk_round_up(x->stored_len, p->opt.align);
    if (p->origin[i].identical && h != p->origin[i].expect_xxh3) {
        kpk_extent_describe(x, w, sizeof w);
        snprintf(d->err, d->errlen, "the source is damaged: its %s does not match its checksum; run kpack verify on it", w);
        d->stats->source_damaged = 1;
        return -1;
    }
    if (d->done(d->ctx, i)) { snprintf(d->err, d->errlen, "stopped"); return -1; }
    return 0;
}

int kp_copy_extents(const kp_input *in, kp_plan *p, kp_out *out, uint64_t *cursor, uint32_t first, kp_extent_done_fn done,
                    void *ctx, kprogress *prog, kp_copy_stats *stats, char *err, size_t errlen)
{
    struct pipe pp;
    pthread_t reader;
    XXH3_state_t *st = XXH3_createState();
    struct zero_memo *memo = calloc(1, sizeof *memo);
    struct dispatch d = {stats, p, out, cursor, done, ctx, err, errlen};
    size_t n_shards = in->src ? in->src->n_shards : 0;
    uint64_t zero_prefix = 0; /* leading zero bytes of the current extent, not yet hashed */
    int extent_zero = 1;      /* the current extent has been all zeros so far */
    int rc = -1, started = 0;

    memset(&pp, 0, sizeof pp);
    memset(stats, 0, sizeof *stats);
    pp.in = in;
    pp.p = p;
    pp.first = first;
    pp.nbuf = 4u + p->n_members < NBUF_MAX ? 4u + p->n_members : NBUF_MAX;
    pthread_mutex_init(&pp.mu, NULL);
    pthread_cond_init(&pp.cv, NULL);
    pp.shard_fd = malloc(sizeof *pp.shard_fd * (n_shards + 1));
    for (size_t i = 0; pp.shard_fd && i < n_shards; i++) pp.shard_fd[i] = -1;
    pp.shard_size = malloc(sizeof *pp.shard_size * (n_shards + 1));
    pp.last_use = malloc(sizeof *pp.last_use * (n_shards + 1));
    pp.ends_shard = calloc(p->n_extents + 1, 1);
    if (!st || !memo || !pp.shard_fd || !pp.shard_size || !pp.last_use || !pp.ends_shard) { snprintf(err, errlen, "out of memory"); goto out; }
    for (size_t i = 0; i < n_shards; i++) pp.last_use[i] = UINT32_MAX;
    for (uint32_t e = first; e < p->n_extents; e++)
        for (uint64_t ti = p->extents[e].first_tensor; ti < (uint64_t)p->extents[e].first_tensor + p->extents[e].tensor_count; ti++)
            if (p->from[ti].shard < n_shards) pp.last_use[p->from[ti].shard] = e;
    for (size_t i = 0; i < n_shards; i++)
        if (pp.last_use[i] != UINT32_MAX) pp.ends_shard[pp.last_use[i]] = 1;
    for (size_t i = 0; i < n_shards; i++) {
        struct stat sst;
        pp.shard_fd[i] = open(in->src->shards[i].path, O_RDONLY | O_CLOEXEC);
        if (pp.shard_fd[i] < 0 || fstat(pp.shard_fd[i], &sst)) { snprintf(err, errlen, "%s: %s", in->src->shards[i].path, strerror(errno)); goto out; }
        pp.shard_size[i] = (uint64_t)sst.st_size;
        posix_fadvise(pp.shard_fd[i], 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    for (unsigned i = 0; i < pp.nbuf; i++) {
        pp.ring[i].pp = &pp;
        if (!(pp.ring[i].buf = malloc(CHUNK))) { snprintf(err, errlen, "out of memory"); goto out; }
    }
    if (pthread_create(&reader, NULL, reader_main, &pp)) { snprintf(err, errlen, "cannot start the reader thread"); goto out; }
    started = 1;

    XXH3_64bits_reset(st);
    for (;;) {
        struct chunk *c;
        kpk_extent *x;
        uint32_t e;
        uint64_t len;
        int last, zero;
        pthread_mutex_lock(&pp.mu);
        while (pp.ring[pp.tail % pp.nbuf].state != SLOT_FILLED && !(pp.reader_done && pp.head == pp.tail))
            pthread_cond_wait(&pp.cv, &pp.mu);
        if (pp.ring[pp.tail % pp.nbuf].state != SLOT_FILLED) { /* reader finished or failed, ring drained */
            pthread_mutex_unlock(&pp.mu);
            break;
        }
        c = &pp.ring[pp.tail % pp.nbuf];
        c->state = SLOT_BUSY;
        atomic_store(&c->refs, 1);
        pp.tail++;
        pthread_mutex_unlock(&pp.mu);

        if (c->n_holes) {
            for (uint32_t k = 0; k < c->n_holes; k++) {
                uint64_t len = p->extents[c->extent + k].raw_len;
                stats->bytes_in += len;
                kprogress_add(prog, len);
                extent_start(&d, c->extent + k);
                if (extent_end(&d, c->extent + k, zero_xxh3(memo, st, len))) { kp_chunk_release(NULL, c); goto stop; }
            }
            kp_chunk_release(NULL, c);
            continue;
        }
        x = &p->extents[c->extent];
        e = c->extent;
        len = c->len;
        last = c->pos + len == x->raw_len;
        if (c->pos == 0) {
            zero_prefix = 0;
            extent_zero = 1;
            extent_start(&d, e);
        }
        zero = c->all_zero || kio_is_zero(c->buf, c->len);
        if (!zero && kp_out_write(out, x->member, x->offset + c->pos, c->buf, c->len, c)) {
            snprintf(err, errlen, "out of memory queueing writes");
            kp_chunk_release(NULL, c);
            goto stop;
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
        kp_chunk_release(NULL, c); /* c may be refilled from here on */
        stats->bytes_in += len;
        kprogress_add(prog, len);
        if (kp_out_failed(out, err, errlen)) goto stop;
        if (last) {
            uint64_t h = extent_zero ? zero_xxh3(memo, st, x->raw_len) : XXH3_64bits_digest(st);
            XXH3_64bits_reset(st);
            if (extent_end(&d, e, h)) goto stop;
        }
    }
    if (pp.failed) {
        snprintf(err, errlen, "%s", pp.err);
        stats->source_damaged |= pp.damaged;
        goto out;
    }
    rc = 0;
    goto out;
stop:
    pthread_mutex_lock(&pp.mu);
    pp.stop = 1;
    pthread_cond_broadcast(&pp.cv);
    pthread_mutex_unlock(&pp.mu);
out:
    if (started) pthread_join(reader, NULL);
    /* the writers may still hold chunk buffers: wait for them before freeing */
    if (started) kp_out_sync(out, NULL);
    stats->bytes_read = pp.bytes_read;
    for (unsigned i = 0; i < pp.nbuf; i++) free(pp.ring[i].buf);
    if (pp.shard_fd)
        for (size_t i = 0; i < n_shards; i++)
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

int kp_hash_written_extent(const kp_plan *p, const int *fds, uint32_t i, uint64_t *xxh3)
{
    const kpk_extent *x = &p->extents[i];
    XXH3_state_t *st = XXH3_createState();
    uint8_t *buf = malloc(CHUNK);
    int rc = -1;
    if (!st || !buf) { errno = ENOMEM; goto out; }
    XXH3_64bits_reset(st);
    for (uint64_t pos = 0; pos < x->stored_len;) {
        size_t n = x->stored_len - pos < CHUNK ? (size_t)(x->stored_len - pos) : CHUNK;
        if (kp_read_target(p, fds, x->member, x->offset + pos, buf, n)) goto out;
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
