/* The member writers (output.h). */
#include "output.h"

#include "format/kio.h"
#include "format/kos.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCK 4096u
#define WB_LAG 2 /* write-behind: writes in flight before the oldest is waited for */

struct req {
    const uint8_t *buf;
    size_t len;
    uint64_t off;    /* a sync request: the size the file must have at least */
    void *tag;       /* NULL: a sync request */
};

/* Write-behind: start writeback of each write as soon as it is issued, wait
 * for the one issued WB_LAG writes earlier and drop it from the page cache.
 * Not a durability point: the journal still waits for fdatasync. */
struct wb { uint64_t off[WB_LAG + 1], len[WB_LAG + 1]; unsigned n; int disabled; };

struct writer {
    kp_out *o;
    uint16_t m;
    int fd;
    pthread_t thread;
    int started;
    struct req *q;
    size_t head, tail, cap;  /* ring of queued requests */
    _Atomic uint64_t bytes;   /* handed over */
    _Atomic uint64_t written; /* written (all-zero blocks are left as holes) */
    struct wb wb;
};

struct kp_out {
    const kp_plan *p;
    kp_out_ref_fn hold, release;
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* queue changes, syncs complete */
    struct writer *w;
    uint16_t n;
    int stop;
    unsigned syncs_pending;
    int failed;
    char err[600];
};

static int write_behind(struct wb *w, int fd, uint64_t off, uint64_t len)
{
    unsigned k;
    if (w->disabled || !len) return 0;
    if (kos_writeback_start(fd, off, len)) {
        if (errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP) { w->disabled = 1; return 0; } /* plain writeback then */
        return -1;
    }
    w->off[w->n % (WB_LAG + 1)] = off;
    w->len[w->n % (WB_LAG + 1)] = len;
    w->n++;
    if (w->n <= WB_LAG) return 0;
    k = (w->n - 1 - WB_LAG) % (WB_LAG + 1);
    if (kos_writeback_wait(fd, w->off[k], w->len[k])) return -1;
    kos_cache_drop(fd, w->off[k], w->len[k]);
    return 0;
}

/* Write the non-zero 4 KiB blocks of buf at file offset off (off is block aligned). */
static int write_sparse(int fd, const uint8_t *buf, size_t len, uint64_t off, uint64_t *written)
{
    size_t i = 0;
    while (i < len) {
        size_t j, n = len - i < BLOCK ? len - i : BLOCK;
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

static void fail(kp_out *o, uint16_t m, const char *what, int e)
{
    pthread_mutex_lock(&o->mu);
    if (!o->failed) {
        o->failed = 1;
        snprintf(o->err, sizeof o->err, "%s %s: %s", what, o->p->members[m].partial, strerror(e));
    }
    pthread_mutex_unlock(&o->mu);
}

static void *writer_main(void *arg)
{
    struct writer *w = arg;
    kp_out *o = w->o;
    for (;;) {
        struct req r;
        int skip;
        pthread_mutex_lock(&o->mu);
        while (w->head == w->tail && !o->stop) pthread_cond_wait(&o->cv, &o->mu);
        if (w->head == w->tail) { pthread_mutex_unlock(&o->mu); break; }
        r = w->q[w->tail % w->cap];
        w->tail++;
        skip = o->failed;
        pthread_cond_broadcast(&o->cv);
        pthread_mutex_unlock(&o->mu);
        if (!r.tag) { /* a sync request */
            int64_t size = kio_file_size(w->fd);
            if (!skip && size >= 0 && (uint64_t)size < r.off && ftruncate(w->fd, (off_t)r.off)) fail(o, w->m, "extending", errno);
            else if (!skip && fdatasync(w->fd)) fail(o, w->m, "fdatasync", errno);
            pthread_mutex_lock(&o->mu);
            o->syncs_pending--;
            pthread_cond_broadcast(&o->cv);
            pthread_mutex_unlock(&o->mu);
            continue;
        }
        if (!skip) {
            uint64_t written = 0;
            if (write_sparse(w->fd, r.buf, r.len, r.off, &written) || write_behind(&w->wb, w->fd, r.off, r.len))
                fail(o, w->m, "writing", errno);
            atomic_fetch_add(&w->bytes, r.len);
            atomic_fetch_add(&w->written, written);
        }
        o->release(o->ctx, r.tag);
    }
    return NULL;
}

static int push(kp_out *o, struct writer *w, struct req r)
{
    pthread_mutex_lock(&o->mu);
    if (w->head - w->tail == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 64;
        struct req *q = malloc(sizeof *q * cap);
        if (!q) { pthread_mutex_unlock(&o->mu); return -1; }
        for (size_t i = w->tail; i < w->head; i++) q[i - w->tail] = w->q[i % w->cap];
        w->head -= w->tail;
        w->tail = 0;
        free(w->q);
        w->q = q;
        w->cap = cap;
    }
    w->q[w->head % w->cap] = r;
    w->head++;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    return 0;
}

int kp_out_start(kp_out **out, const kp_plan *p, const int *fds, kp_out_ref_fn hold, kp_out_ref_fn release, void *ctx,
                 char *err, size_t errlen)
{
    kp_out *o = calloc(1, sizeof *o);
    *out = NULL;
    if (!o) { snprintf(err, errlen, "out of memory"); return -1; }
    o->p = p;
    o->hold = hold;
    o->release = release;
    o->ctx = ctx;
    o->n = p->n_members;
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    o->w = calloc(o->n, sizeof *o->w);
    if (!o->w) { snprintf(err, errlen, "out of memory"); kp_out_stop(o, NULL, 0); return -1; }
    for (uint16_t m = 0; m < o->n; m++) {
        o->w[m].o = o;
        o->w[m].m = m;
        o->w[m].fd = fds[m];
        if (pthread_create(&o->w[m].thread, NULL, writer_main, &o->w[m])) {
            snprintf(err, errlen, "cannot start a writer thread");
            kp_out_stop(o, NULL, 0);
            return -1;
        }
        o->w[m].started = 1;
    }
    *out = o;
    return 0;
}

int kp_out_write(kp_out *o, uint16_t target, uint64_t pos, const uint8_t *buf, size_t len, void *tag)
{
    while (len) {
        uint16_t m = target;
        uint64_t off = pos, left = len;
        struct req r;
        if (target == KPK_STRIPED) kp_stripe_locate(o->p, pos, &m, &off, &left);
        r.buf = buf;
        r.len = len < left ? len : (size_t)left;
        r.off = off;
        r.tag = tag;
        o->hold(o->ctx, tag);
        if (push(o, &o->w[m], r)) { o->release(o->ctx, tag); return -1; }
        buf += r.len;
        pos += r.len;
        len -= r.len;
    }
    return 0;
}

int kp_out_sync(kp_out *o, const uint64_t *min_size)
{
    pthread_mutex_lock(&o->mu);
    o->syncs_pending += o->n;
    pthread_mutex_unlock(&o->mu);
    for (uint16_t m = 0; m < o->n; m++) {
        struct req r = {NULL, 0, min_size ? min_size[m] : 0, NULL};
        if (push(o, &o->w[m], r)) {
            pthread_mutex_lock(&o->mu);
            o->syncs_pending -= (unsigned)(o->n - m);
            pthread_mutex_unlock(&o->mu);
            return -1;
        }
    }
    pthread_mutex_lock(&o->mu);
    while (o->syncs_pending) pthread_cond_wait(&o->cv, &o->mu);
    pthread_mutex_unlock(&o->mu);
    return o->failed ? -1 : 0;
}

int kp_out_failed(kp_out *o, char *err, size_t errlen)
{
    int f;
    pthread_mutex_lock(&o->mu);
    f = o->failed;
    if (f && err) snprintf(err, errlen, "%s", o->err);
    pthread_mutex_unlock(&o->mu);
    return f ? -1 : 0;
}

uint64_t kp_out_bytes(const kp_out *o, uint16_t m) { return atomic_load(&o->w[m].bytes); }
uint64_t kp_out_written(const kp_out *o, uint16_t m) { return atomic_load(&o->w[m].written); }

int kp_out_stop(kp_out *o, char *err, size_t errlen)
{
    int rc;
    if (!o) return 0;
    pthread_mutex_lock(&o->mu);
    o->stop = 1;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    for (uint16_t m = 0; o->w && m < o->n; m++)
        if (o->w[m].started) pthread_join(o->w[m].thread, NULL);
    rc = kp_out_failed(o, err, errlen);
    for (uint16_t m = 0; o->w && m < o->n; m++) free(o->w[m].q);
    free(o->w);
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    free(o);
    return rc;
}

int kp_read_target(const kp_plan *p, const int *fds, uint16_t target, uint64_t pos, uint8_t *buf, size_t len)
{
    if (target != KPK_STRIPED) return kio_pread_full(fds[target], buf, len, pos);
    while (len) {
        uint16_t m;
        uint64_t off, left;
        size_t n;
        kp_stripe_locate(p, pos, &m, &off, &left);
        n = len < left ? len : (size_t)left;
        if (kio_pread_full(fds[m], buf, n, off)) return -1;
        buf += n;
        pos += n;
        len -= n;
    }
    return 0;
}
