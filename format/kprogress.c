#include "kprogress.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct kprogress {
    char label[64];
    uint64_t total;
    _Atomic uint64_t done;
    uint64_t base;          /* bytes already done when we started (resume) */
    double t0;
    _Atomic double last_draw;
    int draw;
    pthread_mutex_t lock;
    kprogress_detail_fn detail;
    void *detail_ctx;
};

double know(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void kfmt_bytes(uint64_t n, char *buf, int len)
{
    static const char *u[] = {"B", "kB", "MB", "GB", "TB", "PB"};
    double v = (double)n;
    int i = 0;
    while (v >= 1000.0 && i < 5) { v /= 1000.0; i++; }
    if (i == 0) snprintf(buf, (size_t)len, "%llu B", (unsigned long long)n);
    else snprintf(buf, (size_t)len, "%.*f %s", v < 10 ? 2 : v < 100 ? 1 : 0, v, u[i]);
}

void kfmt_duration(double s, char *buf, int len)
{
    if (s < 0 || s > 1e8) { snprintf(buf, (size_t)len, "--"); return; }
    unsigned long t = (unsigned long)(s + 0.5);
    if (t >= 3600) snprintf(buf, (size_t)len, "%luh%02lum", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(buf, (size_t)len, "%lum%02lus", t / 60, t % 60);
    else snprintf(buf, (size_t)len, "%lus", t);
}

kprogress *kprogress_start(const char *label, uint64_t total, int enabled)
{
    kprogress *p = calloc(1, sizeof *p);
    if (!p) return NULL; /* progress is optional: callers accept NULL */
    snprintf(p->label, sizeof p->label, "%s", label);
    p->total = total;
    p->t0 = know();
    p->draw = enabled && isatty(2);
    pthread_mutex_init(&p->lock, NULL);
    return p;
}

static void draw(kprogress *p, int force)
{
    double now = know();
    uint64_t done = atomic_load(&p->done);
    char d[32], t[32], eta[32], line[400], more[240] = "";
    double rate, el;
    if (!p->draw) return;
    if (!force && now - atomic_load(&p->last_draw) < 0.25) return;
    if (pthread_mutex_trylock(&p->lock) != 0) return;
    atomic_store(&p->last_draw, now);
    el = now - p->t0;
    rate = el > 0 ? (double)(done - p->base) / el : 0;
    kfmt_bytes(done, d, sizeof d);
    kfmt_bytes(p->total, t, sizeof t);
    kfmt_duration(rate > 0 && p->total > done ? (double)(p->total - done) / rate : -1, eta, sizeof eta);
    if (p->detail) p->detail(p->detail_ctx, el, more, sizeof more);
    snprintf(line, sizeof line, "\r%s: %s / %s (%.1f%%)  %.1f MB/s  ETA %s%s%s\033[K", p->label, d, t,
             p->total ? 100.0 * (double)done / (double)p->total : 100.0, rate / 1e6, eta, more[0] ? "  | " : "", more);
    fputs(line, stderr);
    fflush(stderr);
    pthread_mutex_unlock(&p->lock);
}

void kprogress_add(kprogress *p, uint64_t bytes)
{
    if (!p) return;
    atomic_fetch_add(&p->done, bytes);
    draw(p, 0);
}

void kprogress_set_done(kprogress *p, uint64_t done)
{
    if (!p) return;
    atomic_store(&p->done, done);
    p->base = done;
    draw(p, 1);
}

void kprogress_set_detail(kprogress *p, kprogress_detail_fn fn, void *ctx)
{
    if (!p) return;
    p->detail_ctx = ctx;
    p->detail = fn;
}

double kprogress_elapsed(const kprogress *p) { return p ? know() - p->t0 : 0; }

double kprogress_finish(kprogress *p)
{
    double el;
    if (!p) return 0;
    el = know() - p->t0;
    if (p->draw) { fputs("\r\033[K", stderr); fflush(stderr); }
    pthread_mutex_destroy(&p->lock);
    free(p);
    return el;
}
