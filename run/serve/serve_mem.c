/* The memory krun serve's requests take while they are read and prepared (serve.h), bounded per
 * request and in all (issue 34.3-5; docs/SERVE.md, "Memory").
 *
 * Per request: its body (at most --max-body), the JSON tree jansson parses it into, and what is
 * made from them on the connection's thread (the rendered prompt, its ids).  The tree is what a
 * hostile body inflates: jansson takes 16 bytes per byte of `[1,1,...]`, 41 of `[[],[],...]`, 73
 * of `[{},{},...]`.  So every allocation jansson makes on a connection's thread while a request is
 * prepared is counted (json_set_alloc_funcs: malloc and free with malloc_usable_size, so a tree
 * made before the functions were set is freed as well), and past the request's share it fails:
 * jansson reports "out of memory", and the request is refused 413 (`request_too_complex`).
 *
 * In all: a request reserves its share -- SRV_MEM_PER_BYTE times its body plus SRV_MEM_BASE --
 * from the server's --request-memory before its body is read (the declared Content-Length, or
 * --max-body for a chunked body), waits for room up to its deadline, and gives it back once it is
 * prepared (handed to the engine, or answered).  What a request holds after that (its prompt ids,
 * its output) is bounded by --ctx and counted per running or queued request (docs/SERVE.md). */
#include "serve.h"

#include "format/kprogress.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

/* The thread's request being prepared: jansson's bytes, and the most it may take. */
static __thread struct srv_mem_scope {
    size_t used, cap;
    int active, over;
} scope;

static void *counted_malloc(size_t n)
{
    void *p;
    if (scope.active && (n > scope.cap || scope.used > scope.cap - n)) { scope.over = 1; return NULL; }
    p = malloc(n);
    if (p && scope.active) scope.used += malloc_usable_size(p);
    return p;
}

static void counted_free(void *p)
{
    if (p && scope.active) {
        size_t n = malloc_usable_size(p);
        scope.used = scope.used > n ? scope.used - n : 0;   /* a tree made elsewhere: never below 0 */
    }
    free(p);
}

void srv_mem_install(void)
{
    json_set_alloc_funcs(counted_malloc, counted_free);
}

struct srv_mem {
    size_t cap, used;
    size_t peak;                  /* the most reserved at once */
    unsigned long long waited, refused;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

size_t srv_mem_share(size_t body)
{
    return body > (SIZE_MAX - SRV_MEM_BASE) / SRV_MEM_PER_BYTE ? SIZE_MAX : SRV_MEM_PER_BYTE * body + SRV_MEM_BASE;
}

srv_mem *srv_mem_new(size_t cap)
{
    srv_mem *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->cap = cap;
    if (pthread_mutex_init(&m->mu, NULL)) { free(m); return NULL; }
    if (pthread_cond_init(&m->cv, NULL)) { pthread_mutex_destroy(&m->mu); free(m); return NULL; }
    return m;
}

void srv_mem_free(srv_mem *m)
{
    if (!m) return;
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

int srv_mem_reserve(srv_mem *m, size_t n, double seconds)
{
    double until = know() + seconds;
    int waited = 0;
    pthread_mutex_lock(&m->mu);
    while (n > m->cap - m->used) {
        struct timespec ts;
        double left = until - know();
        if (n > m->cap || left <= 0) {
            m->refused++;
            pthread_mutex_unlock(&m->mu);
            return -1;
        }
        waited = 1;
        clock_gettime(CLOCK_REALTIME, &ts);
        left = left < 0.2 ? left : 0.2;
        ts.tv_sec += (time_t)left;
        ts.tv_nsec += (long)((left - (double)(time_t)left) * 1e9);
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&m->cv, &m->mu, &ts);
    }
    m->used += n;
    if (m->used > m->peak) m->peak = m->used;
    m->waited += (unsigned long long)waited;
    pthread_mutex_unlock(&m->mu);
    return 0;
}

void srv_mem_release(srv_mem *m, size_t n)
{
    if (!n) return;
    pthread_mutex_lock(&m->mu);
    m->used -= n < m->used ? n : m->used;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

json_t *srv_mem_json(srv_mem *m)
{
    json_t *j;
    pthread_mutex_lock(&m->mu);
    j = json_pack("{sIsIsIsIsI}", "limit", (json_int_t)m->cap, "reserved", (json_int_t)m->used, "peak", (json_int_t)m->peak,
                  "waited", (json_int_t)m->waited, "refused", (json_int_t)m->refused);
    pthread_mutex_unlock(&m->mu);
    return j;
}

void srv_mem_scope_begin(size_t cap)
{
    scope.used = 0;
    scope.cap = cap;
    scope.over = 0;
    scope.active = 1;
}

int srv_mem_scope_over(void) { return scope.active && scope.over; }

int srv_mem_scope_pause(void)
{
    int was = scope.active;
    scope.active = 0;
    return was;
}

void srv_mem_scope_resume(int was) { scope.active = was; }

void srv_mem_scope_end(void)
{
    scope.active = 0;
    scope.over = 0;
}
