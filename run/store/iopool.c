#include "iopool.h"

#include "format/kio.h"
#include "format/kos.h"
#include "format/kprogress.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_estimateDCtxSize: the decoder context each worker holds */
#include <zstd.h>

#define ALIGN 4096u

struct trace_rec { uint64_t off, len; double start, end; uint16_t member; char kind; };

struct queue { kiop_req *q; size_t head, tail, cap; };

struct worker { kiop_pool *p; int member; uint8_t *stage; pthread_t tid; int started; };

struct kiop_pool {
    pthread_mutex_t mu;
    pthread_cond_t done;
    int n_members;
    kiop_member *members;
    struct queue (*level)[2];      /* [member][level] */
    pthread_cond_t *work;          /* [member] */
    uint64_t *bytes;               /* [member] */
    /* [member]: a member is busy while a read queued for it is in progress (any of its
     * workers); busy_seconds is the union of those times, so bytes / busy_seconds is the
     * speed the member's file delivers when krun is waiting on it */
    int *inflight;
    double *busy_since, *busy_seconds;
    struct worker *workers;
    int n_workers, stop;
    const kpk_file *f;
    size_t stage_bytes;
    int tracing;
    struct trace_rec *trace;
    size_t n_trace, cap_trace;
    size_t trace_lost;             /* records dropped because memory ran out */
    double t0, waited;
};

static int q_grow(struct queue *q, size_t cap)
{
    size_t n = q->tail - q->head;
    kiop_req *nq;
    if (cap <= q->cap) return 0;
    nq = malloc(cap * sizeof *nq);
    if (!nq) return -1;
    for (size_t i = 0; i < n; i++) nq[i] = q->q[(q->head + i) % q->cap];
    free(q->q);
    q->q = nq;
    q->cap = cap;
    q->head = 0;
    q->tail = n;
    return 0;
}

static int q_push(struct queue *q, const kiop_req *r)
{
    if (q->tail - q->head == q->cap && q_grow(q, q->cap ? q->cap * 2 : 64)) return -1;
    q->q[q->tail++ % q->cap] = *r;
    return 0;
}

static int q_pop(struct queue *q, kiop_req *r)
{
    if (q->head == q->tail) return 0;
    *r = q->q[q->head++ % q->cap];
    return 1;
}

/* preadv until every byte is in: a short read advances through the iovecs. */
static int preadv_full(int fd, struct iovec *iov, int n, uint64_t off)
{
    while (n > 0) {
        ssize_t got = preadv(fd, iov, n, (off_t)off);
        if (got < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (got == 0) { errno = ENODATA; return -1; }
        off += (uint64_t)got;
        while (n > 0 && (size_t)got >= iov->iov_len) { got -= (ssize_t)iov->iov_len; iov++; n--; }
        if (n > 0) { iov->iov_base = (uint8_t *)iov->iov_base + got; iov->iov_len -= (size_t)got; }
    }
    return 0;
}

static void drop(const kiop_member *m, uint64_t off, uint64_t len)
{
    if (m->drop_cache) kos_cache_drop(m->fd, off, len);
}

/* A plain request: one member's contiguous range, scattered run by run. */
static int read_plain(kiop_pool *p, const kiop_req *r, uint16_t *bad_member, uint64_t *bad_off)
{
    struct iovec iov[KIOP_MAX_RUNS];
    const kiop_member *m = &p->members[r->member];
    int n = 0;
    uint64_t done = 0;
    while (done < r->len) {
        uint64_t l = n == 0 ? r->first : (r->len - done < r->unit ? r->len - done : r->unit);
        if (n == KIOP_MAX_RUNS) { errno = EINVAL; *bad_member = r->member; *bad_off = r->off; return -1; }
        iov[n].iov_base = n == 0 ? r->buf : r->buf + r->run1 + (uint64_t)(n - 1) * r->stride;
        iov[n].iov_len = (size_t)l;
        done += l;
        n++;
    }
    if (preadv_full(m->fd, iov, n, r->off)) { *bad_member = r->member; *bad_off = r->off; return -1; }
    drop(m, r->off, r->len);
    return 0;
}

/* A read queued for member m is over (lock: take p->mu; else the caller holds
 * it): the member stops being busy when its last read in progress ends. */
static void read_done(kiop_pool *p, int m, int lock)
{
    if (lock) pthread_mutex_lock(&p->mu);
    if (--p->inflight[m] == 0) p->busy_seconds[m] += know() - p->busy_since[m];
    if (lock) pthread_mutex_unlock(&p->mu);
}

/* The stored bytes of a decode request's blocks, from whichever members hold
 * them, into the worker's staging buffer; bytes read per member added to got[]. */
static int read_stored(kiop_pool *p, struct worker *w, const kiop_req *r, uint64_t *got, uint16_t *bad_member, uint64_t *bad_off)
{
    uint64_t pos = r->off;
    while (pos < r->off + r->len) {
        kpk_seg seg[16];
        uint64_t done = 0;
        size_t n = kpk_extent_segments(p->f, r->extent, pos, r->off + r->len - pos, seg, 16, &done);
        if (!n) { errno = EINVAL; *bad_member = r->member; *bad_off = pos; return -1; }
        for (size_t s = 0; s < n; s++) {
            const kiop_member *m = &p->members[seg[s].member];
            if (kio_pread_full(m->fd, w->stage + (pos - r->off), (size_t)seg[s].len, seg[s].off)) {
                *bad_member = seg[s].member;
                *bad_off = seg[s].off;
                return -1;
            }
            drop(m, seg[s].off, seg[s].len);
            got[seg[s].member] += seg[s].len;
            pos += seg[s].len;
        }
    }
    return 0;
}

/* A decode request: its stored bytes read (read_stored; the member is busy
 * for that part only, not while the worker decodes), then each block decoded
 * into place. */
static int read_decode(kiop_pool *p, struct worker *w, const kiop_req *r, uint64_t *got, uint16_t *bad_member,
                       uint64_t *bad_off, kpk_err *derr)
{
    const kpk_block *blk = kpk_extent_blocks(p->f, r->extent);
    int rc = read_stored(p, w, r, got, bad_member, bad_off);
    read_done(p, r->member, 1);
    if (rc) return rc;
    for (uint32_t b = r->b0; b < r->b1; b++)
        if (kpk_block_decode(p->f, r->extent, b, w->stage + (blk[b].stored_off - r->off), r->raw + (blk[b].raw_off - blk[r->b0].raw_off),
                             derr))
            return -2;
    return 0;
}

static void *worker(void *arg)
{
    struct worker *w = arg;
    kiop_pool *p = w->p;
    struct queue *lv = p->level[w->member];
    uint64_t *got = calloc((size_t)p->n_members, sizeof *got);
    for (;;) {
        kiop_req r;
        double a, b;
        int rc, err = 0;
        uint16_t bad_member = 0;
        uint64_t bad_off = 0;
        kpk_err derr;
        pthread_mutex_lock(&p->mu);
        while (!p->stop && !q_pop(&lv[0], &r) && !q_pop(&lv[1], &r)) pthread_cond_wait(&p->work[w->member], &p->mu);
        if (p->stop) { pthread_mutex_unlock(&p->mu); free(got); return NULL; }
        a = know();
        if (p->inflight[r.member]++ == 0) p->busy_since[r.member] = a;
        pthread_mutex_unlock(&p->mu);
        if (r.b1 > r.b0) {
            if (!got) { rc = -1; errno = ENOMEM; bad_member = r.member; read_done(p, r.member, 1); }
            else {
                memset(got, 0, (size_t)p->n_members * sizeof *got);
                rc = read_decode(p, w, &r, got, &bad_member, &bad_off, &derr);
            }
        } else {
            rc = read_plain(p, &r, &bad_member, &bad_off);
        }
        if (rc == -1) err = errno ? errno : EIO;
        b = know();
        pthread_mutex_lock(&p->mu);
        if (r.b1 <= r.b0) read_done(p, r.member, 0);
        if (p->tracing) {
            if (p->n_trace == p->cap_trace) {
                size_t cap = p->cap_trace ? p->cap_trace * 2 : 1024;
                struct trace_rec *t = realloc(p->trace, cap * sizeof *t);
                if (t) { p->trace = t; p->cap_trace = cap; }
            }
            if (p->n_trace < p->cap_trace)
                p->trace[p->n_trace++] = (struct trace_rec){r.off, r.len, a - p->t0, b - p->t0, r.member, r.kind};
            else
                p->trace_lost++;
        }
        if (err && !r.batch->err) {
            r.batch->err = err;
            r.batch->err_member = bad_member;
            r.batch->err_off = bad_off;
        }
        if (rc == -2 && !r.batch->decode_failed) {
            r.batch->decode_failed = 1;
            r.batch->decode_err = derr;
        }
        if (rc == 0) {
            if (r.b1 > r.b0)
                for (int m = 0; m < p->n_members; m++) p->bytes[m] += got[m];
            else
                p->bytes[r.member] += r.len;
            r.batch->bytes += r.len;
        }
        r.batch->pending--;
        pthread_cond_broadcast(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

kiop_pool *kiop_pool_create(const kiop_member *members, int n_members, const int *threads, const kpk_file *f, size_t stage_bytes)
{
    kiop_pool *p = calloc(1, sizeof *p);
    int total = 0;
    if (!p) return NULL;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->done, NULL);
    p->t0 = know();
    p->f = f;
    p->stage_bytes = f ? stage_bytes : 0;
    p->n_members = n_members;
    p->members = calloc((size_t)n_members, sizeof *p->members);
    p->level = calloc((size_t)n_members, sizeof *p->level);
    p->work = calloc((size_t)n_members, sizeof *p->work);
    p->bytes = calloc((size_t)n_members, sizeof *p->bytes);
    p->inflight = calloc((size_t)n_members, sizeof *p->inflight);
    p->busy_since = calloc((size_t)n_members, sizeof *p->busy_since);
    p->busy_seconds = calloc((size_t)n_members, sizeof *p->busy_seconds);
    for (int m = 0; m < n_members; m++) total += threads[m] > 0 ? threads[m] : 0;
    p->workers = calloc((size_t)(total ? total : 1), sizeof *p->workers);
    if (!p->members || !p->level || !p->work || !p->bytes || !p->inflight || !p->busy_since || !p->busy_seconds || !p->workers) {
        free(p->members); free(p->level); free(p->work); free(p->bytes); free(p->workers);
        free(p->inflight); free(p->busy_since); free(p->busy_seconds);
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->done);
        free(p);
        return NULL;
    }
    for (int m = 0; m < n_members; m++) {
        p->members[m] = members[m];
        pthread_cond_init(&p->work[m], NULL);
    }
    for (int m = 0; m < n_members; m++)
        for (int k = 0; k < threads[m]; k++) {
            struct worker *w = &p->workers[p->n_workers];
            void *st = NULL;
            w->p = p;
            w->member = m;
            if (p->stage_bytes && posix_memalign(&st, ALIGN, p->stage_bytes)) { kiop_pool_destroy(p); return NULL; }
            w->stage = st;
            p->n_workers++;
            if (pthread_create(&w->tid, NULL, worker, w)) { kiop_pool_destroy(p); return NULL; }
            w->started = 1;
        }
    return p;
}

void kiop_pool_destroy(kiop_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    for (int m = 0; m < p->n_members; m++) pthread_cond_broadcast(&p->work[m]);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_workers; i++) {
        if (p->workers[i].started) pthread_join(p->workers[i].tid, NULL);
        free(p->workers[i].stage);
    }
    for (int m = 0; m < p->n_members; m++) {
        free(p->level[m][0].q);
        free(p->level[m][1].q);
        pthread_cond_destroy(&p->work[m]);
    }
    free(p->workers);
    free(p->members);
    free(p->level);
    free(p->work);
    free(p->bytes);
    free(p->inflight);
    free(p->busy_since);
    free(p->busy_seconds);
    free(p->trace);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->done);
    free(p);
}

int kiop_pool_threads(const kiop_pool *p) { return p->n_workers; }

int kiop_reserve(kiop_pool *p, size_t n)
{
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    for (int m = 0; m < p->n_members && !rc; m++)
        rc = q_grow(&p->level[m][0], n) || q_grow(&p->level[m][1], n) ? -1 : 0;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int kiop_submit(kiop_pool *p, const kiop_req *reqs, size_t n)
{
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < n; i++) {
        if (reqs[i].member >= p->n_members || q_push(&p->level[reqs[i].member][reqs[i].prio ? 1 : 0], &reqs[i])) { rc = -1; break; }
        reqs[i].batch->pending++;
        pthread_cond_signal(&p->work[reqs[i].member]);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

uint64_t kiop_cancel(kiop_pool *p, kiop_batch *b)
{
    uint64_t bytes = 0;
    pthread_mutex_lock(&p->mu);
    for (int m = 0; m < p->n_members; m++)
        for (int l = 0; l < 2; l++) {
            struct queue *q = &p->level[m][l];
            size_t keep = q->head;
            for (size_t i = q->head; i < q->tail; i++) { /* compacting forward: keep <= i */
                const kiop_req *r = &q->q[i % q->cap];
                if (r->batch == b) { bytes += r->len; b->pending--; continue; }
                q->q[keep++ % q->cap] = *r;
            }
            q->tail = keep;
        }
    if (b->pending == 0) pthread_cond_broadcast(&p->done);
    pthread_mutex_unlock(&p->mu);
    return bytes;
}

int kiop_wait(kiop_pool *p, kiop_batch *b)
{
    int err;
    double a = know();
    pthread_mutex_lock(&p->mu);
    while (b->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    err = b->err ? b->err : b->decode_failed ? EIO : 0;
    pthread_mutex_unlock(&p->mu);
    p->waited += know() - a;
    return err;
}

int kiop_done(kiop_pool *p, kiop_batch *b)
{
    int d;
    pthread_mutex_lock(&p->mu);
    d = b->pending == 0;
    pthread_mutex_unlock(&p->mu);
    return d;
}

uint64_t kiop_member_bytes(const kiop_pool *p, int m)
{
    uint64_t v;
    pthread_mutex_lock((pthread_mutex_t *)&p->mu);
    v = m >= 0 && m < p->n_members ? p->bytes[m] : 0;
    pthread_mutex_unlock((pthread_mutex_t *)&p->mu);
    return v;
}

double kiop_member_busy(const kiop_pool *p, int m)
{
    double v = 0;
    pthread_mutex_lock((pthread_mutex_t *)&p->mu);
    if (m >= 0 && m < p->n_members) v = p->busy_seconds[m] + (p->inflight[m] ? know() - p->busy_since[m] : 0);
    pthread_mutex_unlock((pthread_mutex_t *)&p->mu);
    return v;
}

void kiop_trace_enable(kiop_pool *p) { p->tracing = 1; }

double kiop_wait_seconds(const kiop_pool *p) { return p->waited; }

int kiop_trace_write(kiop_pool *p, const char *path)
{
    FILE *f = fopen(path, "w");
    int ok;
    size_t lost;
    if (!f) return -1;
    fprintf(f, "kind\tmember\toffset\tlength\tstart_s\tend_s\n");
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n_trace; i++)
        fprintf(f, "%c\t%u\t%llu\t%llu\t%.6f\t%.6f\n", p->trace[i].kind, p->trace[i].member,
                (unsigned long long)p->trace[i].off, (unsigned long long)p->trace[i].len, p->trace[i].start, p->trace[i].end);
    lost = p->trace_lost;
    pthread_mutex_unlock(&p->mu);
    ok = !ferror(f);
    if (fclose(f)) ok = 0;
    if (ok && lost) errno = ENOMEM; /* records were dropped: the file is incomplete */
    return ok && !lost ? 0 : -1;
}

/* ---- what decoding costs per worker ----------------------------------------------- */

static int streamed_kind(uint8_t kind) { return kind == KPK_KIND_GLOBALS || kind == KPK_KIND_TRUNK || kind == KPK_KIND_EXPERT; }

uint64_t kiop_stage_bytes(const kpk_file *f)
{
    uint64_t block = 0, extent = 0;
    for (uint32_t i = 0; i < kpk_extent_count(f); i++) {
        const kpk_extent *x = kpk_extent_at(f, i);
        const kpk_block *b = kpk_extent_blocks(f, i);
        uint32_t n = kpk_extent_block_count(f, i);
        if (!n || !streamed_kind(x->kind)) continue;
        for (uint32_t k = 0; k < n; k++) {
            uint64_t a = b[k].stored_off / ALIGN * ALIGN, e = (b[k].stored_off + b[k].stored_len + ALIGN - 1) / ALIGN * ALIGN;
            if (e - a > block) block = e - a;
        }
        {
            uint64_t span = (x->stored_len + ALIGN - 1) / ALIGN * ALIGN;
            if (span > extent) extent = span;
        }
    }
    if (!block) return 0;
    /* requests group blocks up to the target; a lone block larger than it is read alone */
    extent = extent < KIOP_STAGE_TARGET ? extent : KIOP_STAGE_TARGET;
    return block > extent ? block : extent;
}

uint64_t kiop_worker_bytes(const kpk_file *f)
{
    uint64_t stage = kiop_stage_bytes(f), planes = 0;
    int zstd = 0;
    if (!stage) return 0;
    for (uint32_t i = 0; i < kpk_extent_count(f); i++) {
        const kpk_block *b = kpk_extent_blocks(f, i);
        uint32_t n = kpk_extent_block_count(f, i);
        if (!streamed_kind(kpk_extent_at(f, i)->kind)) continue;
        for (uint32_t k = 0; k < n; k++) {
            /* kpk_block_decode's per-thread plane buffer: a SPLIT2 block with a coded plane */
            if (b[k].method == KPK_METHOD_SPLIT2 && b[k].planes && b[k].raw_len > planes) planes = b[k].raw_len;
            if (b[k].method != KPK_METHOD_RAW) zstd = 1;
        }
    }
    return stage + planes + (zstd ? (uint64_t)ZSTD_estimateDCtxSize() : 0);
}
