/* The conversion data path's dispatcher: chunks in extent order -> hash,
 * place, queue to the member writers (copy_pipe.h has the whole pipeline;
 * copy_read.c the reader, copy_encode.c the encoders). */
#include "copy_pipe.h"

#include "consume.h"

#include "format/kio.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define ZERO_BUF ((size_t)64 << 10) /* hashed repeatedly for hole extents: stays in L2 */
#define ZERO_MEMO 64                /* hashes of all-zero extents, by length */
#define MAX_ENCODERS 64

/* Never written: the source of zeros for hashing hole extents. */
static uint8_t zero_buf[ZERO_BUF];

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
    /* the current extent */
    XXH3_state_t *raw, *stored;  /* its decoded and (codec 2) stored bytes' hashes */
    uint64_t zero_prefix;        /* leading zero bytes not yet hashed into raw */
    int extent_zero;             /* the extent has been all zeros so far */
    uint64_t stored_pos;         /* codec 2: stored bytes so far */
    struct zero_memo *memo;
    long kill_mid;               /* test hook: die once the first chunk of this extent is on disk */
};

/* Extent i starts: the next offset of its file or of the stripe space. */
static void extent_start(struct dispatch *d, uint32_t i)
{
    kpk_extent *x = &d->p->extents[i];
    x->offset = d->cursor[kp_target(d->p, x->member)];
    d->zero_prefix = 0;
    d->extent_zero = 1;
    d->stored_pos = 0;
    XXH3_64bits_reset(d->raw);
    XXH3_64bits_reset(d->stored);
}

/* Raw bytes of the current extent, in order (buf NULL: len zero bytes).
 * While an extent is all zeros only its length is counted: an extent that
 * ends that way is hashed by length (remembered). */
static void hash_raw(struct dispatch *d, const uint8_t *buf, uint64_t len)
{
    int zero = !buf || kio_is_zero(buf, len);
    if (zero && d->extent_zero) { d->zero_prefix += len; return; }
    if (d->extent_zero) {
        hash_zeros(d->raw, d->zero_prefix);
        d->extent_zero = 0;
    }
    if (buf) XXH3_64bits_update(d->raw, buf, len);
    else hash_zeros(d->raw, len);
}

/* Extent i is complete: record it, advance its target's cursor. */
static int extent_end(struct dispatch *d, uint32_t i)
{
    kp_plan *p = d->p;
    kpk_extent *x = &p->extents[i];
    uint64_t h = d->extent_zero ? zero_xxh3(d->memo, d->raw, x->raw_len) : XXH3_64bits_digest(d->raw);
    char w[64];
    x->raw_xxh3 = h;
    if (x->codec == KPK_CODEC_BLOCKS) {
        x->stored_len = d->stored_pos;
        x->stored_xxh3 = XXH3_64bits_digest(d->stored);
    } else {
        x->stored_len = x->raw_len;
        x->stored_xxh3 = h;
    }
    d->stats->bytes_stored += x->stored_len;
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

/* A codec-2 chunk: its blocks' stored bytes made contiguous in c->out, in
 * order; each block's place in the extent recorded; returns their length. */
static size_t gather_blocks(struct dispatch *d, struct chunk *c)
{
    size_t at = 0;
    for (uint32_t k = 0; k < c->ncut; k++) {
        kpk_block *b = &d->p->blocks[c->cut0 + k];
        b->raw_off = d->p->cuts[c->cut0 + k].raw_off;
        b->stored_off = d->stored_pos + at;
        if (c->slot[k] != at) memmove(c->out + at, c->out + c->slot[k], b->stored_len);
        at += b->stored_len;
    }
    return at;
}

/* One chunk of extent e: hashed and queued to the writers.  Returns -1 (err set) on failure. */
static int dispatch_chunk(struct dispatch *d, struct chunk *c, kprogress *prog)
{
    kp_plan *p = d->p;
    uint32_t e = c->extent;
    kpk_extent *x = &p->extents[e];
    const uint8_t *bytes = c->buf;
    uint64_t len = c->len, at;
    int last = c->pos + c->len == x->raw_len;
    if (c->pos == 0) extent_start(d, e);
    at = x->offset + c->pos;
    if (c->ncut) { /* codec 2: the stored bytes go out, the raw ones are hashed */
        len = gather_blocks(d, c);
        bytes = c->out;
        at = x->offset + d->stored_pos;
        XXH3_64bits_update(d->stored, bytes, len);
        d->stored_pos += len;
        hash_raw(d, c->all_zero ? NULL : c->buf, c->len);
    } else {
        hash_raw(d, c->all_zero ? NULL : c->buf, c->len);
    }
    if (!(c->all_zero && !c->ncut) && !kio_is_zero(bytes, len) && kp_out_write(d->out, x->member, at, bytes, len, c)) {
        snprintf(d->err, d->errlen, "out of memory queueing writes");
        return -1;
    }
    d->stats->bytes_in += c->len;
    kprogress_add(prog, c->len);
    if (d->kill_mid >= 0 && (uint32_t)d->kill_mid == e && c->pos == 0 && !last) {
        kp_out_sync(d->out, NULL); /* the extent's first bytes are on disk, its record is not */
        raise(SIGKILL);
    }
    return last ? 1 : 0;
}

static long env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    char *end;
    long n;
    if (!v || !*v) return dflt;
    n = strtol(v, &end, 10);
    return *end ? dflt : n;
}

int kp_copy_extents(const kp_input *in, kp_plan *p, kp_out *out, uint64_t *cursor, uint32_t first, kp_extent_done_fn done,
                    void *ctx, kprogress *prog, kp_copy_stats *stats, char *err, size_t errlen)
{
    struct pipe pp;
    pthread_t reader, enc_tid[MAX_ENCODERS];
    struct dispatch d = {stats, p, out, cursor, done, ctx, err, errlen, NULL, NULL, 0, 1, 0, NULL, -1};
    size_t n_shards = in->src ? in->src->n_shards : 0;
    int rc = -1, started = 0, n_enc = 0, threads = in->threads > 0 ? in->threads : 1;

    memset(&pp, 0, sizeof pp);
    memset(stats, 0, sizeof *stats);
    pp.in = in;
    pp.p = p;
    pp.blocks = p->blocks;
    pp.codec = &p->opt.codec;
    pp.first = first;
    pp.nbuf = 4u + p->n_members < KP_NBUF_MAX ? 4u + p->n_members : KP_NBUF_MAX;
    if (p->n_blocks && pp.nbuf < 4u + (unsigned)threads) pp.nbuf = 4u + (unsigned)threads < KP_NBUF_MAX ? 4u + (unsigned)threads : KP_NBUF_MAX;
    pp.chunk_bytes = (size_t)env_long("KPACK_TEST_CHUNK_BYTES", (long)KP_CHUNK);
    if (pp.chunk_bytes < 4096) pp.chunk_bytes = KP_CHUNK;
    d.kill_mid = env_long("KPACK_TEST_KILL_MID_EXTENT", -1);
    pthread_mutex_init(&pp.mu, NULL);
    pthread_cond_init(&pp.cv, NULL);
    d.raw = XXH3_createState();
    d.stored = XXH3_createState();
    d.memo = calloc(1, sizeof *d.memo);
    pp.last_use = malloc(sizeof *pp.last_use * (n_shards + 1));
    pp.ends_shard = calloc(p->n_extents + 1, 1);
    if (!d.raw || !d.stored || !d.memo || !pp.last_use || !pp.ends_shard) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n_shards; i++) pp.last_use[i] = UINT32_MAX;
    for (uint32_t e = first; e < p->n_extents; e++)
        for (uint64_t ti = p->extents[e].first_tensor; ti < (uint64_t)p->extents[e].first_tensor + p->extents[e].tensor_count; ti++)
            if (p->from[ti].shard < n_shards) pp.last_use[p->from[ti].shard] = e;
    for (size_t i = 0; in->consume && i < n_shards; i++) { /* --consume: the file is read up to its release point only */
        uint32_t u = kc_file_last_use(in->consume, (uint32_t)i);
        if (u != UINT32_MAX) pp.last_use[i] = u >= first ? u : UINT32_MAX;
    }
    for (size_t i = 0; i < n_shards; i++)
        if (pp.last_use[i] != UINT32_MAX) pp.ends_shard[pp.last_use[i]] = 1;
    if (kp_sources_open(&pp, err, errlen)) goto out;
    for (unsigned i = 0; i < pp.nbuf; i++) {
        pp.ring[i].pp = &pp;
        pp.ring[i].buf_cap = pp.chunk_bytes > p->max_cut ? pp.chunk_bytes : p->max_cut;
        if (!(pp.ring[i].buf = malloc(pp.ring[i].buf_cap))) { snprintf(err, errlen, "out of memory"); goto out; }
    }
    if (threads > MAX_ENCODERS) threads = MAX_ENCODERS;
    if (kp_encoders_start(&pp, threads, enc_tid, &n_enc)) { snprintf(err, errlen, "cannot start the encoder threads"); goto out; }
    if (pthread_create(&reader, NULL, kp_reader_main, &pp)) { snprintf(err, errlen, "cannot start the reader thread"); goto out; }
    started = 1;

    for (;;) {
        struct chunk *c;
        int r;
        pthread_mutex_lock(&pp.mu);
        for (;;) {
            c = &pp.ring[pp.tail % pp.nbuf];
            if ((c->state == SLOT_FILLED && !c->ncut) || c->state == SLOT_ENCODED) break;
            if (pp.stop || (pp.reader_done && pp.head == pp.tail)) { c = NULL; break; }
            pthread_cond_wait(&pp.cv, &pp.mu);
        }
        if (!c) { /* reader finished or failed and the ring is drained, or an encoder failed */
            pthread_mutex_unlock(&pp.mu);
            break;
        }
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
                d.zero_prefix = len;
                if (extent_end(&d, c->extent + k)) { kp_chunk_release(NULL, c); goto stop; }
            }
            kp_chunk_release(NULL, c);
            continue;
        }
        {
            uint32_t e = c->extent;
            r = dispatch_chunk(&d, c, prog);
            kp_chunk_release(NULL, c); /* c may be refilled from here on */
            if (r < 0) goto stop;
            if (kp_out_failed(out, err, errlen)) goto stop;
            if (r == 1 && extent_end(&d, e)) goto stop;
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
    kp_encoders_stop(&pp, enc_tid, n_enc);
    /* the writers may still hold chunk buffers: wait for them before freeing */
    if (started) kp_out_sync(out, NULL);
    stats->bytes_read = pp.bytes_read;
    for (unsigned i = 0; i < pp.nbuf; i++) {
        free(pp.ring[i].buf);
        free(pp.ring[i].out);
        free(pp.ring[i].slot);
    }
    kp_sources_close(&pp);
    free(pp.last_use);
    free(pp.ends_shard);
    free(d.memo);
    XXH3_freeState(d.raw);
    XXH3_freeState(d.stored);
    pthread_mutex_destroy(&pp.mu);
    pthread_cond_destroy(&pp.cv);
    return rc;
}

int kp_hash_written_extent(const kp_plan *p, const int *fds, uint32_t i, uint64_t *xxh3)
{
    const kpk_extent *x = &p->extents[i];
    XXH3_state_t *st = XXH3_createState();
    uint8_t *buf = malloc(KP_CHUNK);
    int rc = -1;
    if (!st || !buf) { errno = ENOMEM; goto out; }
    XXH3_64bits_reset(st);
    for (uint64_t pos = 0; pos < x->stored_len;) {
        size_t n = x->stored_len - pos < KP_CHUNK ? (size_t)(x->stored_len - pos) : KP_CHUNK;
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
