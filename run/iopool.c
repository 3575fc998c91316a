#include "iopool.h"

#include "kio.h"
#include "kprogress.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct trace_rec { uint64_t off, len; double start, end; char kind; };

struct queue { kio_req *q; size_t head, tail, cap; };

struct kio_pool {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    struct queue level[2];
    pthread_t *threads;
    int n_threads, stop;
    int tracing;
    struct trace_rec *trace;
    size_t n_trace, cap_trace;
    size_t trace_lost;      /* records dropped because memory ran out */
    double t0, waited;
};

static int q_grow(struct queue *q, size_t cap)
{
    size_t n = q->tail - q->head;
    kio_req *nq;
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

static int q_push(struct queue *q, const kio_req *r)
{
    if (q->tail - q->head == q->cap && q_grow(q, q->cap ? q->cap * 2 : 64)) return -1;
    q->q[q->tail++ % q->cap] = *r;
    return 0;
}

static int q_pop(struct queue *q, kio_req *r)
{
    if (q->head == q->tail) return 0;
    *r = q->q[q->head++ % q->cap];
    return 1;
}

static void *worker(void *arg)
{
    kio_pool *p = arg;
    for (;;) {
        kio_req r;
        double a, b;
        int err = 0;
        pthread_mutex_lock(&p->mu);
        while (!p->stop && !q_pop(&p->level[0], &r) && !q_pop(&p->level[1], &r)) pthread_cond_wait(&p->work, &p->mu);
        if (p->stop) { pthread_mutex_unlock(&p->mu); return NULL; }
        pthread_mutex_unlock(&p->mu);
        a = know();
        if (kio_pread_full(r.fd, r.buf, r.len, r.off)) err = errno ? errno : EIO;
        else if (r.drop_cache) posix_fadvise(r.fd, (off_t)r.off, (off_t)r.len, POSIX_FADV_DONTNEED);
        b = know();
        pthread_mutex_lock(&p->mu);
        if (p->tracing) {
            if (p->n_trace == p->cap_trace) {
                size_t cap = p->cap_trace ? p->cap_trace * 2 : 1024;
                struct trace_rec *t = realloc(p->trace, cap * sizeof *t);
                if (t) { p->trace = t; p->cap_trace = cap; }
            }
            if (p->n_trace < p->cap_trace)
                p->trace[p->n_trace++] = (struct trace_rec){r.off, r.len, a - p->t0, b - p->t0, r.kind};
            else
                p->trace_lost++;
        }
        if (err && !r.batch->err) r.batch->err = err;
        r.batch->bytes += r.len;
        r.batch->pending--;
        pthread_cond_broadcast(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

kio_pool *kio_pool_create(int threads)
{
    kio_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    if (threads < 1) threads = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    p->t0 = know();
    p->threads = calloc((size_t)threads, sizeof *p->threads);
    if (!p->threads) { kio_pool_destroy(p); return NULL; }
    for (int i = 0; i < threads; i++) {
        if (pthread_create(&p->threads[i], NULL, worker, p)) { kio_pool_destroy(p); return NULL; }
        p->n_threads++;
    }
    return p;
}

void kio_pool_destroy(kio_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p->level[0].q);
    free(p->level[1].q);
    free(p->trace);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    free(p);
}

int kio_reserve(kio_pool *p, size_t n)
{
    int rc;
    pthread_mutex_lock(&p->mu);
    rc = q_grow(&p->level[0], n) || q_grow(&p->level[1], n) ? -1 : 0;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int kio_submit(kio_pool *p, const kio_req *reqs, size_t n)
{
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < n; i++) {
        if (q_push(&p->level[reqs[i].prio ? 1 : 0], &reqs[i])) { rc = -1; break; }
        reqs[i].batch->pending++;
    }
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int kio_wait(kio_pool *p, kio_batch *b)
{
    int err;
    double a = know();
    pthread_mutex_lock(&p->mu);
    while (b->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    err = b->err;
    pthread_mutex_unlock(&p->mu);
    p->waited += know() - a;
    return err;
}

int kio_done(kio_pool *p, kio_batch *b)
{
    int d;
    pthread_mutex_lock(&p->mu);
    d = b->pending == 0;
    pthread_mutex_unlock(&p->mu);
    return d;
}

void kio_trace_enable(kio_pool *p) { p->tracing = 1; }

double kio_wait_seconds(const kio_pool *p) { return p->waited; }

int kio_trace_write(kio_pool *p, const char *path)
{
    FILE *f = fopen(path, "w");
    int ok;
    size_t lost;
    if (!f) return -1;
    fprintf(f, "kind\toffset\tlength\tstart_s\tend_s\n");
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n_trace; i++)
        fprintf(f, "%c\t%llu\t%llu\t%.6f\t%.6f\n", p->trace[i].kind, (unsigned long long)p->trace[i].off,
                (unsigned long long)p->trace[i].len, p->trace[i].start, p->trace[i].end);
    lost = p->trace_lost;
    pthread_mutex_unlock(&p->mu);
    ok = !ferror(f);
    if (fclose(f)) ok = 0;
    if (ok && lost) errno = ENOMEM; /* records were dropped: the file is incomplete */
    return ok && !lost ? 0 : -1;
}
