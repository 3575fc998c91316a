/* krun serve's connections (serve.h): which are answering a request and which are waiting for
 * one, the deadline for a request to arrive, and the reserve that keeps a slot for a new client.
 *
 * libmicrohttpd's own timeout is an idle timeout: a client that sends a byte a second is never
 * idle and holds its connection (and its thread) for ever, and enough such clients, or enough
 * silent ones, take every connection (issue 25.2).  So this keeps its own table of connections,
 * filled by MHD's connection-notify callback, and a thread that looks at it ten times a second:
 *
 *   - a request must arrive whole (headers and body) within request_timeout seconds of its first
 *     byte; the first byte is seen in the kernel's count of bytes received on the socket
 *     (TCP_INFO), so a keep-alive connection idle between requests is not on the clock (MHD's
 *     idle timeout closes it) but one trickling its next request is;
 *   - when the open connections come within a reserve of a limit (in all, or from one address),
 *     the connection that has waited longest for its request is closed (the address with the most
 *     connections first), provided it has waited SRV_GRACE seconds: a client that behaves sends
 *     its request in milliseconds, so a new one gets through while the slow and the silent make
 *     room.  Connections answering a request are never closed here.
 *
 * A connection is closed by shutdown(2) on its socket: MHD's thread for it wakes, reads the end
 * and closes it as if the client had.  The table's lock is held meanwhile, and MHD calls the
 * notify callback (which takes it) before it closes the socket, so the descriptor shut down is
 * always still this connection's. */
#include "serve.h"

#include "format/kos.h"
#include "format/kprogress.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <time.h>

/* A connection younger than this (waiting since) is not closed to make room. */
#define SRV_GRACE 0.5
/* The sweep's period, seconds. */
#define SRV_SWEEP 0.1

struct srv_conn {
    int fd;
    int family;
    unsigned char addr[16];       /* the client's address (4 or 16 bytes) */
    int busy;                     /* a request arrived whole and is being answered */
    int closing;                  /* shut down here; MHD has not closed it yet */
    double since;                 /* waiting since: accepted, or its last response ended */
    double first_byte;            /* when a byte of the awaited request was first seen; 0: none yet */
    unsigned long long bytes_then;/* bytes received on it when it started waiting */
    struct srv_conn *prev, *next;
};

struct srv_conns {
    srv_conns_opts o;
    unsigned soft_total, soft_ip; /* beyond these, waiting connections make room */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int have_thread, quit;
    srv_conn *head;
    unsigned n;                   /* connections in the table that are not closing */
    unsigned long long opened, timed_out, evicted;
};

unsigned srv_conns_reserve(unsigned limit)
{
    unsigned r = limit / 8 > 2 ? limit / 8 : 2;
    return r < limit ? r : limit ? limit - 1 : 0;
}

/* The connection starts waiting for a request (under mu): fresh, just accepted (whatever it
 * received is its request's), or after a response. */
static void start_waiting(srv_conn *c, double now, int fresh)
{
    long long b = kos_tcp_bytes_received(c->fd);
    c->busy = 0;
    c->since = now;
    c->bytes_then = b < 0 || fresh ? 0 : (unsigned long long)b;
    c->first_byte = b < 0 || (unsigned long long)b > c->bytes_then ? now : 0;   /* b < 0: cannot tell, so from now */
}

static int same_addr(const srv_conn *a, const srv_conn *b)
{
    return a->family == b->family && !memcmp(a->addr, b->addr, sizeof a->addr);
}

static unsigned count_addr(const srv_conns *t, const srv_conn *c)
{
    unsigned n = 0;
    for (const srv_conn *x = t->head; x; x = x->next) n += !x->closing && same_addr(x, c);
    return n;
}

static void close_conn(srv_conns *t, srv_conn *c)
{
    c->closing = 1;
    t->n--;
    shutdown(c->fd, SHUT_RDWR);
}

/* Make room if the connections are within a reserve of a limit: close the connection that has
 * waited longest for its request (of addr when its address is over its share; otherwise of the
 * address with the most connections).  Returns 1 if one was closed. */
static int make_room(srv_conns *t, const srv_conn *addr, double now)
{
    srv_conn *victim = NULL;
    unsigned victim_count = 0;
    int per_ip = t->o.per_ip && addr && count_addr(t, addr) > t->soft_ip;
    if (!per_ip && t->n <= t->soft_total) return 0;
    for (srv_conn *x = t->head; x; x = x->next) {
        unsigned k;
        if (x->closing || x->busy || now - x->since < SRV_GRACE) continue;
        if (per_ip && !same_addr(x, addr)) continue;
        k = per_ip ? 0 : count_addr(t, x);
        if (!victim || k > victim_count || (k == victim_count && x->since < victim->since)) { victim = x; victim_count = k; }
    }
    if (!victim) return 0;
    close_conn(t, victim);
    t->evicted++;
    return 1;
}

static void *sweep_main(void *arg)
{
    srv_conns *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->quit) {
        struct timespec ts;
        double now = know();
        for (srv_conn *c = t->head; c; c = c->next) {
            if (c->closing || c->busy) continue;
            if (!c->first_byte) {
                long long b = kos_tcp_bytes_received(c->fd);
                if (b < 0 || (unsigned long long)b > c->bytes_then) c->first_byte = now;
            }
            if (c->first_byte && now - c->first_byte > t->o.request_timeout) {
                close_conn(t, c);
                t->timed_out++;
            }
        }
        /* room within each address's share, then in all */
        for (srv_conn *c = t->head; c && t->o.per_ip; c = c->next)
            while (!c->closing && count_addr(t, c) > t->soft_ip && make_room(t, c, now)) {}
        while (make_room(t, NULL, now)) {}
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(SRV_SWEEP * 1e9);
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int srv_conns_start(const srv_conns_opts *o, srv_conns **out, krun_err *err)
{
    srv_conns *t = calloc(1, sizeof *t);
    int rc;
    *out = NULL;
    if (!t) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    t->o = *o;
    t->soft_total = o->max_connections - srv_conns_reserve(o->max_connections);
    t->soft_ip = o->per_ip ? o->per_ip - srv_conns_reserve(o->per_ip) : 0;
    if (pthread_mutex_init(&t->mu, NULL)) { free(t); return krun_err_set(err, KRUN_ENOMEM, "out of memory"); }
    if (pthread_cond_init(&t->cv, NULL)) { pthread_mutex_destroy(&t->mu); free(t); return krun_err_set(err, KRUN_ENOMEM, "out of memory"); }
    if ((rc = pthread_create(&t->thread, NULL, sweep_main, t)) != 0) {
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        free(t);
        return krun_err_set(err, KRUN_ENOMEM, "cannot start the connections' thread: %s", strerror(rc));
    }
    t->have_thread = 1;
    *out = t;
    return 0;
}

void srv_conns_stop(srv_conns *t)
{
    if (!t) return;
    if (t->have_thread) {
        pthread_mutex_lock(&t->mu);
        t->quit = 1;
        pthread_cond_signal(&t->cv);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->thread, NULL);
    }
    while (t->head) {                       /* MHD closed them all before (srv_http_stop) */
        srv_conn *c = t->head;
        t->head = c->next;
        free(c);
    }
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

srv_conn *srv_conn_open(srv_conns *t, int fd, const struct sockaddr *sa)
{
    srv_conn *c = calloc(1, sizeof *c);
    double now = know();
    if (!c) return NULL;
    c->fd = fd;
    if (sa && sa->sa_family == AF_INET) {
        c->family = AF_INET;
        memcpy(c->addr, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
    } else if (sa && sa->sa_family == AF_INET6) {
        c->family = AF_INET6;
        memcpy(c->addr, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
    }
    pthread_mutex_lock(&t->mu);
    start_waiting(c, now, 1);
    c->next = t->head;
    if (t->head) t->head->prev = c;
    t->head = c;
    t->n++;
    t->opened++;
    /* room for the newcomer, taken from those that waited longest (never from it: it is new) */
    make_room(t, c, now);
    pthread_mutex_unlock(&t->mu);
    return c;
}

void srv_conn_close(srv_conns *t, srv_conn *c)
{
    if (!c) return;
    pthread_mutex_lock(&t->mu);
    if (c->prev) c->prev->next = c->next;
    else t->head = c->next;
    if (c->next) c->next->prev = c->prev;
    if (!c->closing) t->n--;
    pthread_mutex_unlock(&t->mu);
    free(c);
}

void srv_conn_busy(srv_conns *t, srv_conn *c)
{
    if (!c) return;
    pthread_mutex_lock(&t->mu);
    c->busy = 1;
    pthread_mutex_unlock(&t->mu);
}

void srv_conn_waiting(srv_conns *t, srv_conn *c)
{
    if (!c) return;
    pthread_mutex_lock(&t->mu);
    start_waiting(c, know(), 0);
    pthread_mutex_unlock(&t->mu);
}

json_t *srv_conns_json(srv_conns *t)
{
    unsigned busy = 0, waiting = 0;
    json_t *j;
    pthread_mutex_lock(&t->mu);
    for (const srv_conn *c = t->head; c; c = c->next) {
        if (c->closing) continue;
        busy += c->busy;
        waiting += !c->busy;
    }
    j = json_pack("{sIsIsIsIsIsIsIsIsf}", "open", (json_int_t)(busy + waiting), "busy", (json_int_t)busy, "waiting", (json_int_t)waiting,
                  "max_connections", (json_int_t)t->o.max_connections, "max_connections_per_ip", (json_int_t)t->o.per_ip,
                  "accepted", (json_int_t)t->opened, "timed_out", (json_int_t)t->timed_out, "made_room", (json_int_t)t->evicted,
                  "reserve", (json_int_t)(t->o.max_connections - t->soft_total), "request_timeout", t->o.request_timeout);
    pthread_mutex_unlock(&t->mu);
    return j;
}
