/* krun serve's HTTP side (serve.h): libmicrohttpd parses HTTP; this file
 * routes, checks the API key and the body's size, turns a request body into
 * prompt ids (parsed and rendered on the connection's own thread), hands it to
 * the engine and answers: one JSON body, or server-sent events as the output
 * grows.
 *
 * MHD runs a thread per connection, so a connection may block: it waits for
 * its request's output (waking five times a second to notice a client that
 * hung up: a reset, not the end of its input; serve_engine.c, client_check).
 * A response's status is chosen when it is known: a streamed reply starts
 * (200) with its first token, so an error before it (a bad extent met while
 * reading the prompt) is a real HTTP error, not an event.  Before anything, a
 * request's framing is checked (serve_framing.c); every connection is in the
 * table of serve_conns.c (the request deadline, the reserve). */
#include "serve.h"

#include "format/kprogress.h"
#include "run/text/chat.h"

#include <microhttpd.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct srv_http {
    srv_engine *e;
    srv_http_opts o;
    struct MHD_Daemon *d;
    srv_conns *conns;             /* every open connection: deadlines, the reserve */
    long long created;            /* the model's "created" in /v1/models: the server's start */
    unsigned long long next_id;   /* request ids */
    pthread_mutex_t id_mu;
};

/* One connection's request (MHD's con_cls). */
typedef struct {
    kbuf body;
    int too_big;
    int answered;                 /* a response was queued before the body was read */
    int http_1_0;                 /* no interim responses may be sent */
    sreq *req;
} conn;

/* ---- responses ------------------------------------------------------------------------------ */

/* retry_after < 0: the connection is closed after the response (what follows the request on it
 * cannot be trusted). */
static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, char *json, int retry_after)
{
    struct MHD_Response *r;
    enum MHD_Result rc;
    if (!json) return MHD_NO;               /* out of memory: close the connection */
    r = MHD_create_response_from_buffer(strlen(json), json, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(json); return MHD_NO; }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (retry_after < 0) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (retry_after > 0) {
        char s[16];
        snprintf(s, sizeof s, "%d", retry_after);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, s);
    }
    rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result reply_error(struct MHD_Connection *c, const oai_error *e, int retry_after)
{
    return reply(c, (unsigned)e->status, oai_error_json(e), retry_after);
}

static enum MHD_Result reply_json(struct MHD_Connection *c, unsigned status, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return reply(c, status, s, 0);
}

/* A streamed reply: the request's output as it grows. */
typedef struct { srv_http *h; sreq *r; } stream_ctx;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream_ctx *s = cls;
    long n = srv_read(s->h->e, s->r, buf, max);
    (void)pos;
    if (n > 0) return n;
    return n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free(void *cls)
{
    stream_ctx *s = cls;
    srv_release(s->h->e, s->r);
    free(s);
}

static enum MHD_Result reply_stream(srv_http *h, struct MHD_Connection *c, sreq *r)
{
    stream_ctx *s = malloc(sizeof *s);
    struct MHD_Response *resp;
    enum MHD_Result rc;
    if (!s) return MHD_NO;
    *s = (stream_ctx){h, r};
    resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, s, stream_free);
    if (!resp) { free(s); return MHD_NO; }
    srv_retain(h->e, r);         /* the response's reference, released by stream_free */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    rc = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* ---- requests -------------------------------------------------------------------------------- */

static void request_id(srv_http *h, const char *prefix, char *out, size_t len)
{
    unsigned long long n;
    pthread_mutex_lock(&h->id_mu);
    n = ++h->next_id;
    pthread_mutex_unlock(&h->id_mu);
    snprintf(out, len, "%s-%llx%04llx", prefix, (unsigned long long)h->created, n);
}

/* Submit r (made by srv_prepare) and answer when its output is known. */
static enum MHD_Result run_request(srv_http *h, struct MHD_Connection *c, conn *k, sreq *r)
{
    oai_error err;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    r->client_fd = ci ? ci->connect_fd : -1;
    r->client_probe = !k->http_1_0;
    k->req = r;
    if (srv_submit(h->e, r, &err)) return reply_error(c, &err, !strcmp(err.code ? err.code : "", "server_busy") ? srv_retry_after(h->e) : 0);
    if (r->stream) {
        int status = srv_wait_started(h->e, r);
        if (status < 0) return MHD_NO;                     /* the client hung up */
        if (status == 200) return reply_stream(h, c, r);
    } else {
        srv_wait_done(h->e, r);
    }
    {
        /* the whole body (or an error before a stream started) */
        char *body;
        int status = srv_take_body(h->e, r, &body);
        if (status < 0) return MHD_NO;                     /* the client hung up */
        return reply(c, (unsigned)status, body, 0);
    }
}

/* POST /v1/chat/completions (chat) or /v1/completions: the body made a request (serve_prep.c). */
static enum MHD_Result api_request(srv_http *h, struct MHD_Connection *c, conn *k, int chat)
{
    oai_error err;
    char id[64];
    sreq *r;
    enum MHD_Result rc;
    oai_meta meta = {id, srv_engine_model_name(h->e), (long long)time(NULL)};
    request_id(h, chat ? "chatcmpl" : "cmpl", id, sizeof id);
    r = srv_prepare(srv_engine_model(h->e), srv_engine_model_name(h->e), chat, k->body.p, k->body.n, &meta, &err);
    if (!r) return reply_error(c, &err, 0);
    rc = run_request(h, c, k, r);
    if (!k->req) srv_release(h->e, r);
    return rc;
}

/* ---- routing ---------------------------------------------------------------------------------- */

static int authorized(struct MHD_Connection *c, const char *key)
{
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    size_t n = strlen(key);
    if (!v || strncmp(v, "Bearer ", 7)) return 0;
    v += 7;
    while (*v == ' ') v++;
    return strlen(v) == n && CRYPTO_memcmp(v, key, n) == 0;
}

static enum MHD_Result route(srv_http *h, struct MHD_Connection *c, const char *url, const char *method, conn *k)
{
    static const struct { const char *path, *method; } routes[] = {
        {"/health", "GET"}, {"/v1/models", "GET"}, {"/v1/chat/completions", "POST"}, {"/v1/completions", "POST"},
    };
    oai_error err;
    int known = -1;
    for (int i = 0; i < 4; i++)
        if (!strcmp(url, routes[i].path)) known = i;
    if (known < 0) {
        oai_error_set(&err, 404, NULL, "not_found", "no such endpoint: %s %s (krun serves POST /v1/chat/completions, POST "
                      "/v1/completions, GET /v1/models, GET /health)", method, url);
        return reply_error(c, &err, 0);
    }
    if (strcmp(method, routes[known].method)) {
        struct MHD_Response *r;
        char *json;
        enum MHD_Result rc;
        oai_error_set(&err, 405, NULL, "method_not_allowed", "%s takes %s, not %s", url, routes[known].method, method);
        json = oai_error_json(&err);
        if (!json) return MHD_NO;
        r = MHD_create_response_from_buffer(strlen(json), json, MHD_RESPMEM_MUST_FREE);
        if (!r) { free(json); return MHD_NO; }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, routes[known].method);
        rc = MHD_queue_response(c, 405, r);
        MHD_destroy_response(r);
        return rc;
    }
    if (k->too_big) {
        oai_error_set(&err, 413, NULL, "request_too_large", "the request body is larger than %zu bytes (krun serve --max-body)",
                      h->o.max_body);
        return reply_error(c, &err, 0);
    }
    switch (known) {
    case 0: {
        /* open to all (a load balancer's probe has no key), but with --api-key only the status is
         * shown without the key: the file's path, the plan and the counters are the operator's */
        int status;
        json_t *j = srv_engine_health(h->e, &status);
        if (j && h->o.api_key && !authorized(c, h->o.api_key)) {
            json_t *brief = json_pack("{sO}", "status", json_object_get(j, "status"));
            json_decref(j);
            j = brief;
        } else if (j && json_object_set_new(j, "connections", srv_conns_json(h->conns))) {
            json_decref(j);
            j = NULL;
        }
        return reply_json(c, (unsigned)status, j);
    }
    case 1: return reply(c, 200, oai_models_response(srv_engine_model_name(h->e), h->created, "krun"), 0);
    case 2: return api_request(h, c, k, 1);
    default: return api_request(h, c, k, 0);
    }
}

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    srv_framing_header(cls, key, value);
    return MHD_YES;
}

static srv_conn *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    srv_http *h = cls;
    conn *k = *con_cls;
    if (!k) {
        /* the headers: refuse early what needs no body to refuse */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        oai_error err;
        srv_framing fr;
        char why[200];
        int bad;
        k = calloc(1, sizeof *k);
        if (!k) return MHD_NO;
        *con_cls = k;
        k->http_1_0 = version && !strcmp(version, MHD_HTTP_VERSION_1_0);
        /* first: a request whose length is uncertain is answered and the connection closed, so
         * nothing after it is read as a request */
        srv_framing_init(&fr);
        MHD_get_connection_values(c, MHD_HEADER_KIND, framing_header, &fr);
        if ((bad = srv_framing_verdict(&fr, k->http_1_0, why, sizeof why))) {
            k->answered = 1;
            oai_error_set(&err, bad, NULL, bad == 400 ? "bad_framing" : "unsupported_transfer_encoding", "%s", why);
            return reply_error(c, &err, -1);
        }
        if (h->o.api_key && !strncmp(url, "/v1/", 4) && !authorized(c, h->o.api_key)) {
            k->answered = 1;
            oai_error_set(&err, 401, NULL, "invalid_api_key", "a valid API key is needed: send the header Authorization: Bearer KEY");
            return reply_error(c, &err, 0);
        }
        if (cl && strtoull(cl, NULL, 10) > h->o.max_body) {
            k->answered = 1;
            oai_error_set(&err, 413, NULL, "request_too_large", "the request body is %s bytes, more than %zu (krun serve --max-body)", cl,
                          h->o.max_body);
            return reply_error(c, &err, 0);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!k->answered && !k->too_big) {
            if (k->body.n + *upload_size > h->o.max_body) {
                k->too_big = 1;            /* answered once the body is over (MHD reads it, we keep none of it) */
                kbuf_free(&k->body);
            } else {
                kbuf_add(&k->body, upload, *upload_size);
                if (k->body.oom) return MHD_NO;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    srv_conn_busy(h->conns, conn_of(c));      /* the request arrived whole: its deadline is met */
    if (k->answered) return MHD_YES;
    return route(h, c, url, method, k);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    srv_http *h = cls;
    conn *k = *con_cls;
    srv_conn_waiting(h->conns, conn_of(c));   /* for its next request, if it has one */
    if (!k) return;
    if (k->req) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) srv_cancel(h->e, k->req);
        srv_release(h->e, k->req);
    }
    kbuf_free(&k->body);
    free(k);
    *con_cls = NULL;
}

/* Connections accepted and closed: the table of serve_conns.c. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code)
{
    srv_http *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fd = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *sa = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        *socket_context = fd ? srv_conn_open(h->conns, fd->connect_fd, sa ? sa->client_addr : NULL) : NULL;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        srv_conn_close(h->conns, *socket_context);
        *socket_context = NULL;
    }
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    fprintf(stderr, "krun serve: http: ");
    vfprintf(stderr, fmt, ap);
}

int srv_http_start(srv_engine *e, const srv_http_opts *o, srv_http **out, krun_err *err)
{
    srv_http *h = calloc(1, sizeof *h);
    *out = NULL;
    if (!h || pthread_mutex_init(&h->id_mu, NULL)) { free(h); return krun_err_set(err, KRUN_ENOMEM, "out of memory"); }
    h->e = e;
    h->o = *o;
    h->created = (long long)time(NULL);
    {
        srv_conns_opts co = {o->max_connections, o->max_connections_per_ip, o->request_timeout};
        if (srv_conns_start(&co, &h->conns, err)) { pthread_mutex_destroy(&h->id_mu); free(h); return -1; }
    }
    /* MHD_USE_POLL: without it every connection's thread waits in select(2), which cannot watch a
     * descriptor at or above FD_SETSIZE (1024): a --max-connections near that would fail */
    h->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG |
                            MHD_USE_ITC, 0,
                            NULL, NULL, on_request, h,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,      /* first, so that every message goes through it */
                            MHD_OPTION_LISTEN_SOCKET, o->listen_fd,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
                            MHD_OPTION_CONNECTION_LIMIT, o->max_connections,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, o->max_connections_per_ip,
                            MHD_OPTION_CONNECTION_TIMEOUT, o->idle_timeout,
                            MHD_OPTION_END);
    if (!h->d) {
        krun_err_set(err, KRUN_EINPUT, "libmicrohttpd could not start on the listening socket");
        srv_conns_stop(h->conns);
        pthread_mutex_destroy(&h->id_mu);
        free(h);
        return -1;
    }
    *out = h;
    return 0;
}

void srv_http_quiesce(srv_http *h)
{
    int fd = (int)MHD_quiesce_daemon(h->d);
    if (fd >= 0) close(fd);
}

void srv_http_stop(srv_http *h)
{
    if (!h) return;
    MHD_stop_daemon(h->d);             /* every connection closed: the table is empty */
    srv_conns_stop(h->conns);
    pthread_mutex_destroy(&h->id_mu);
    free(h);
}
