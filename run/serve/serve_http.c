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
#include "run/api/anth.h"
#include "run/api/ollama.h"
#include "run/api/responses.h"
#include "run/text/chat.h"
#include "run/grammar/kgram.h"
#include "run/api/reqjson.h"

#include <malloc.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct srv_http {
    srv_engine *e;
    srv_http_opts o;
    struct MHD_Daemon *d;
    srv_conns *conns;             /* every open connection: deadlines, the reserve */
    srv_mem *mem;                 /* the memory requests being read and prepared take, in all */
    long long created;            /* the model's "created" in /v1/models: the server's start */
    int loopback;                 /* listening on a loopback address only (GET /machine says it) */
    unsigned long long next_id;   /* request ids */
    pthread_mutex_t id_mu;
    srv_store *store;             /* stored responses (POST /v1/responses with store) */
};

/* One connection's request (MHD's con_cls). */
typedef struct {
    kbuf body;
    int too_big;
    int answered;                 /* a response was queued before the body was read */
    int early;                    /* route() on the headers alone: answer what needs no body, else go on reading it */
    int takes_body;               /* a route that reads a body (POST): only then is the body kept */
    size_t share;                 /* reserved from srv_http.mem while the request is read and prepared (0: none) */
    size_t body_len;              /* the body's length as declared (--max-body when chunked) */
    int http_1_0;                 /* no interim responses may be sent */
    sreq *req;
    sreq *more[OAI_MAX_N - 1];    /* n > 1: the other choices' requests */
    size_t n_more;
} conn;

/* ---- responses ------------------------------------------------------------------------------ */

/* /metrics counts every response by endpoint and status.  MHD runs one thread per connection and
 * a connection's callbacks on it, so the endpoint of the request being answered is the thread's. */
static __thread srv_engine *count_e;
static __thread int count_ep = SRV_EP_OTHER;
/* The connection's server (for its CORS origins), and whether its client went away: the abort
 * libmicrohttpd then logs as an "application error" is a normal client's (mhd_log stays quiet). */
static __thread const srv_http *conn_h;
static __thread int client_gone;

/* --cors-origin: the origin a browser's request came from, when the server answers it (NULL: no CORS
 * headers). */
static const char *cors_origin(const srv_http *h, struct MHD_Connection *c)
{
    const char *o = h ? MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin") : NULL;
    if (!o) return NULL;
    for (size_t i = 0; i < h->o.n_cors; i++)
        if (!strcmp(h->o.cors[i], "*") || !strcmp(h->o.cors[i], o)) return o;
    return NULL;
}

/* The request this connection's thread is reading (MHD runs a thread per connection): set when
 * its request line is parsed (uri_logged), so that an error libmicrohttpd answers on its own
 * before krun sees the request can be answered by krun instead (mhd_log, own_error). */
static __thread struct {
    struct MHD_Connection *c;     /* NULL: no request being read, or one krun has answered */
    const char *last_fmt;         /* libmicrohttpd's last message about it */
    int answered_here;            /* own_error answered it: MHD's own messages about it are noise */
    int target_ok;                /* the request target as sent: srv_framing_target_ok */
} cur;

static enum MHD_Result queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *r)
{
    const char *origin = cors_origin(conn_h, c);
    if (count_e) srv_engine_count_response(count_e, count_ep, (int)status);
    if (origin) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        MHD_add_response_header(r, MHD_HTTP_HEADER_VARY, "Origin");
        MHD_add_response_header(r, "Access-Control-Expose-Headers", "Retry-After");
    }
    cur.c = NULL;                 /* a response of krun's: nothing of MHD's to replace */
    return MHD_queue_response(c, status, r);
}

static int endpoint_of(const char *url)
{
    static const char *const path[] = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
                                       "/tokenize", "/detokenize", "/v1/models", "/health", "/metrics", "/machine"};
    for (int i = 0; i < (int)(sizeof path / sizeof *path); i++)
        if (!strcmp(url, path[i])) return i;
    if (!strcmp(url, "/v1/responses") || !strncmp(url, "/v1/responses/", 14)) return SRV_EP_RESPONSES;
    if (!strncmp(url, "/v1/models/", 11)) return SRV_EP_MODELS;
    if (!strncmp(url, "/api/", 5)) return SRV_EP_OLLAMA;
    return SRV_EP_OTHER;
}

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
    rc = queue(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

/* A body follows the headers: an answer given before it is read closes the connection (-1, as the
 * retry_after of reply()), since what comes after it on the connection is that body, not a request. */
static int body_follows(const srv_framing *f)
{
    return f->n_te || (f->n_cl && f->cl) ? -1 : 0;
}

/* A request whose JSON took more than its share of memory (serve_mem.c) fails somewhere in its
 * parse with "out of memory": what it is refused for is its size. */
static const oai_error *too_complex(const oai_error *e, oai_error *over)
{
    if (!srv_mem_scope_over()) return e;
    oai_error_set(over, 413, NULL, "request_too_complex", "the request's JSON needs more memory than krun serve gives a request of "
                  "its size (%d bytes per byte of the body): send fewer, larger values (docs/SERVE.md, \"Memory\")",
                  SRV_MEM_JSON_PER_BYTE);
    return over;
}

static enum MHD_Result reply_error(struct MHD_Connection *c, const oai_error *e, int retry_after)
{
    oai_error over;
    e = too_complex(e, &over);
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
    if (n < 0) client_gone = 1;
    return n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free(void *cls)
{
    stream_ctx *s = cls;
    srv_release(s->h->e, s->r);
    free(s);
}

/* A server-sent-event response (its headers) queued with status 200, the reference to it dropped. */
static enum MHD_Result queue_sse(struct MHD_Connection *c, struct MHD_Response *resp)
{
    enum MHD_Result rc;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    rc = queue(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* n > 1 streamed: the choices' events interleaved as they come (each chunk names its choice's
 * index), then the usage (prompt once, completion tokens summed) and [DONE], once. */
typedef struct {
    srv_http *h;
    sreq *rs[OAI_MAX_N];
    size_t n;
    int cur, nl;               /* srv_read_choices' */
    int tail;                  /* the usage and [DONE] were sent */
    kbuf left;                 /* ... what of them did not fit */
} choices_ctx;

static ssize_t choices_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    choices_ctx *s = cls;
    long n;
    (void)pos;
    if (!s->tail) {
        n = srv_read_choices(s->h->e, s->rs, s->n, &s->cur, &s->nl, buf, max);
        if (n > 0) return n;
        if (n < 0) { client_gone = 1; return MHD_CONTENT_READER_END_WITH_ERROR; }
        {
            long pt, ct, cached;
            const sgen_opts *o;
            srv_choices_usage(s->h->e, s->rs, s->n, &pt, &ct, &cached, &o);
            if (o->include_usage) {
                char *u = oai_sse_usage(&o->meta, o->chat, pt, ct, cached);
                if (!u) return MHD_CONTENT_READER_END_WITH_ERROR;
                kbuf_puts(&s->left, u);
                free(u);
            }
            kbuf_puts(&s->left, OAI_SSE_DONE);
            if (s->left.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
            s->tail = 1;
        }
    }
    if (!s->left.n) return MHD_CONTENT_READER_END_OF_STREAM;
    n = (long)(s->left.n < max ? s->left.n : max);
    memcpy(buf, s->left.p, (size_t)n);
    memmove(s->left.p, s->left.p + n, s->left.n - (size_t)n);
    s->left.n -= (size_t)n;
    return n;
}

static void choices_free(void *cls)
{
    choices_ctx *s = cls;
    for (size_t i = 0; i < s->n; i++) srv_release(s->h->e, s->rs[i]);
    kbuf_free(&s->left);
    free(s);
}

static enum MHD_Result reply_stream_choices(srv_http *h, struct MHD_Connection *c, sreq *r, sreq *const *more, size_t n_more)
{
    choices_ctx *s = calloc(1, sizeof *s);
    struct MHD_Response *resp;
    if (!s) return MHD_NO;
    s->h = h;
    s->cur = -1;
    s->rs[0] = r;
    for (size_t i = 0; i < n_more; i++) s->rs[1 + i] = more[i];
    s->n = 1 + n_more;
    resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, choices_read, s, choices_free);
    if (!resp) { free(s); return MHD_NO; }
    for (size_t i = 0; i < s->n; i++) srv_retain(h->e, s->rs[i]);   /* the response's references (choices_free) */
    return queue_sse(c, resp);
}

static enum MHD_Result reply_stream(srv_http *h, struct MHD_Connection *c, sreq *r)
{
    stream_ctx *s = malloc(sizeof *s);
    struct MHD_Response *resp;
    if (!s) return MHD_NO;
    *s = (stream_ctx){h, r};
    resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, s, stream_free);
    if (!resp) { free(s); return MHD_NO; }
    srv_retain(h->e, r);         /* the response's reference, released by stream_free */
    return queue_sse(c, resp);
}

/* An API whose reply is another API's JSON made from the chat (or text) completion the engine
 * writes: the Responses API, Ollama's (run/api/responses.h, ollama.h).  Made by the request's
 * handler; a streamed reply's stream owns it (xstream_free). */
enum { API_OPENAI, API_ANTHROPIC, API_OLLAMA };
typedef struct xform {
    int api;                       /* whose error shape */
    const char *content_type;      /* of a streamed reply */
    /* the whole body (status 200) as the API's: consumes body; NULL when out of memory */
    char *(*whole)(struct xform *x, char *body);
    /* a streamed reply's bytes: the API's appended to out; 1 once over, -1 out of memory */
    int (*feed)(struct xform *x, const char *p, size_t n, kbuf *out);
    void (*free)(struct xform *x);
} xform;

/* A streamed reply through a transcoder. */
typedef struct { srv_http *h; sreq *r; xform *x; kbuf out; int done; } xstream_ctx;

static ssize_t xstream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    xstream_ctx *s = cls;
    (void)pos;
    while (!s->out.n && !s->done) {
        char tmp[16 * 1024];
        long n = srv_read(s->h->e, s->r, tmp, sizeof tmp);
        if (n < 0) { client_gone = 1; return MHD_CONTENT_READER_END_WITH_ERROR; }
        if (n == 0) { s->done = 1; break; }
        if (s->x->feed(s->x, tmp, (size_t)n, &s->out) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (!s->out.n) return MHD_CONTENT_READER_END_OF_STREAM;
    {
        size_t n = s->out.n < max ? s->out.n : max;
        memcpy(buf, s->out.p, n);
        memmove(s->out.p, s->out.p + n, s->out.n - n);
        s->out.n -= n;
        return (ssize_t)n;
    }
}

static void xstream_free(void *cls)
{
    xstream_ctx *s = cls;
    srv_release(s->h->e, s->r);
    s->x->free(s->x);
    kbuf_free(&s->out);
    free(s);
}

static enum MHD_Result reply_xstream(srv_http *h, struct MHD_Connection *c, sreq *r, xform *x)
{
    xstream_ctx *s = calloc(1, sizeof *s);
    struct MHD_Response *resp;
    enum MHD_Result rc;
    if (!s) { x->free(x); return MHD_NO; }
    *s = (xstream_ctx){h, r, x, {0}, 0};
    resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, xstream_read, s, xstream_free);
    if (!resp) { x->free(x); free(s); return MHD_NO; }
    srv_retain(h->e, r);           /* the response's reference, released by xstream_free */
    if (!strcmp(x->content_type, "text/event-stream")) return queue_sse(c, resp);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, x->content_type);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    rc = queue(c, MHD_HTTP_OK, resp);
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

/* n > 1: one body from the choices' bodies (each a whole response with one choice): the first's
 * id and fields, every choice with its index, completion tokens summed. */
static char *merge_choices(char **bodies, size_t n)
{
    json_t *o = json_loads(bodies[0], JSON_ALLOW_NUL, NULL), *all = json_array();
    json_int_t ct = 0, pt = 0, cached = 0;
    char *s = NULL;
    int bad = !o || !all;
    for (size_t i = 0; !bad && i < n; i++) {
        json_t *b = i ? json_loads(bodies[i], JSON_ALLOW_NUL, NULL) : json_incref(o);
        json_t *ch = json_array_get(json_object_get(b, "choices"), 0), *u = json_object_get(b, "usage");
        bad = !ch || json_object_set_new(ch, "index", json_integer((json_int_t)i)) || json_array_append(all, ch);
        ct += json_integer_value(json_object_get(u, "completion_tokens"));
        if (!i) {          /* the prompt once, as OpenAI counts it: choice 0's (the others copied its state) */
            pt = json_integer_value(json_object_get(u, "prompt_tokens"));
            cached = json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
        }
        json_decref(b);
    }
    if (!bad) bad = json_object_set(o, "choices", all) ||
                    json_object_set_new(o, "usage", json_pack("{sIsIsIs{sI}}", "prompt_tokens", pt, "completion_tokens", ct, "total_tokens", pt + ct,
                                                          "prompt_tokens_details", "cached_tokens", cached));
    if (!bad) s = json_dumps(o, JSON_COMPACT);
    json_decref(all);
    json_decref(o);
    return s;
}

static enum MHD_Result reply_anth_error(struct MHD_Connection *c, const oai_error *e, int retry_after)
{
    oai_error over;
    e = too_complex(e, &over);
    return reply(c, (unsigned)e->status, anth_error_json(e), retry_after);
}

static enum MHD_Result reply_ollama_error(struct MHD_Connection *c, const oai_error *e)
{
    oai_error over;
    e = too_complex(e, &over);
    return reply(c, (unsigned)e->status, ollama_error_json(e), 0);
}

/* srv_submit refused the request: 503 (busy, draining, damaged), with Retry-After when busy; in
 * Anthropic's error shape for /v1/messages (503: overloaded_error), Ollama's for /api/. */
static enum MHD_Result reply_refused(srv_http *h, struct MHD_Connection *c, const oai_error *err, int api)
{
    int retry = !strcmp(err->code ? err->code : "", "server_busy") ? srv_retry_after(h->e) : 0;
    if (api == API_OLLAMA) return reply_ollama_error(c, err);
    return api == API_ANTHROPIC ? reply_anth_error(c, err, retry) : reply_error(c, err, retry);
}

/* The engine's body (an OpenAI error object when status is not 200) in the API's shape. */
static enum MHD_Result reply_body(struct MHD_Connection *c, int status, char *body, xform *x)
{
    if (x && status == 200) body = x->whole(x, body);
    else if (x && x->api == API_OLLAMA && body) {
        json_t *o = json_loads(body, 0, NULL);
        oai_error e;
        oai_error_set(&e, status, NULL, NULL, "%s", json_string_value(json_object_get(json_object_get(o, "error"), "message")) ?
                      json_string_value(json_object_get(json_object_get(o, "error"), "message")) : "the request failed");
        json_decref(o);
        free(body);
        body = ollama_error_json(&e);
    }
    if (x) x->free(x);
    return reply(c, (unsigned)status, body, 0);
}

static enum MHD_Result run_request_x(srv_http *h, struct MHD_Connection *c, conn *k, sreq *r, int api, xform *x);

/* The request is prepared (or answered): its body, its JSON's accounting and its share of the
 * request memory are given back.  A thread that held a large share returns the freed pages to
 * the system (glibc keeps them in the thread's arena otherwise: issue 34.4's "kept afterwards"). */
static void body_done(srv_http *h, conn *k)
{
    srv_mem_scope_end();
    kbuf_free(&k->body);
    if (k->share) {
        srv_mem_release(h->mem, k->share);
        if (k->share > 16 * SRV_MEM_BASE) malloc_trim(0);
        k->share = 0;
    }
}

/* Submit r (made by srv_prepare, with k->more its other choices) and answer when its output is
 * known.  anth: an Anthropic request (its errors in Anthropic's shape). */
static enum MHD_Result run_request(srv_http *h, struct MHD_Connection *c, conn *k, sreq *r, int anth)
{
    return run_request_x(h, c, k, r, anth ? API_ANTHROPIC : API_OPENAI, NULL);
}

/* run_request with the reply made another API's by x (taken: freed here or by the stream). */
static enum MHD_Result run_request_x(srv_http *h, struct MHD_Connection *c, conn *k, sreq *r, int api, xform *x)
{
    oai_error err;
    body_done(h, k);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    sreq *all[OAI_MAX_N];
    size_t n = 1 + k->n_more;
    r->client_fd = ci ? ci->connect_fd : -1;
    r->client_probe = !k->http_1_0;
    k->req = r;
    all[0] = r;
    for (size_t i = 0; i < k->n_more; i++) {
        all[1 + i] = k->more[i];
        k->more[i]->client_fd = r->client_fd;
        k->more[i]->client_probe = r->client_probe;
    }
    if (srv_submit_n(h->e, all, n, &err)) { if (x) x->free(x); return reply_refused(h, c, &err, api); }
    if (k->n_more && r->stream) {
        /* n choices streamed: the stream starts (200) with choice 0's first event */
        int status = srv_wait_started(h->e, r);
        if (status == 200) return reply_stream_choices(h, c, r, k->more, k->n_more);
        for (size_t i = 0; i < k->n_more; i++) srv_cancel(h->e, k->more[i]);
        if (status < 0) { client_gone = 1; return MHD_NO; }                     /* the client hung up */
        {
            char *body;
            status = srv_take_body(h->e, r, &body);
            if (status < 0) { client_gone = 1; return MHD_NO; }
            return reply(c, (unsigned)status, body, 0);
        }
    }
    if (k->n_more) {
        /* n choices (not streamed): each its own sequence, answered together */
        char *bodies[OAI_MAX_N] = {0}, *merged = NULL;
        int status = 200, gone = 0;
        for (size_t i = 0; i < n; i++) {
            int st;
            srv_wait_done(h->e, all[i]);
            st = srv_take_body(h->e, all[i], &bodies[i]);
            if (st < 0) gone = 1;
            else if (st != 200 && status == 200) status = st;
        }
        if (!gone && status == 200) merged = merge_choices(bodies, n);
        else if (!gone) {
            /* the first failure's body */
            for (size_t i = 0; i < n && !merged; i++)
                if (bodies[i] && !strstr(bodies[i], "\"choices\"")) { merged = bodies[i]; bodies[i] = NULL; }
        }
        for (size_t i = 0; i < n; i++) free(bodies[i]);
        if (gone) { free(merged); client_gone = 1; return MHD_NO; }
        return reply(c, (unsigned)status, merged, 0);
    }
    if (r->stream) {
        int status = srv_wait_started(h->e, r);
        if (status < 0) { if (x) x->free(x); client_gone = 1; return MHD_NO; }        /* the client hung up */
        if (status == 200) return x ? reply_xstream(h, c, r, x) : reply_stream(h, c, r);
    } else {
        srv_wait_done(h->e, r);
    }
    {
        /* the whole body (or an error before a stream started) */
        char *body;
        int status = srv_take_body(h->e, r, &body);
        if (status < 0) { if (x) x->free(x); client_gone = 1; return MHD_NO; }        /* the client hung up */
        return reply_body(c, status, body, x);
    }
}

/* POST /v1/chat/completions (chat) or /v1/completions: the body made a request (serve_prep.c),
 * with its other choices (n > 1) in k->more. */
static enum MHD_Result api_request(srv_http *h, struct MHD_Connection *c, conn *k, int chat)
{
    oai_error err;
    char id[64];
    sreq *r;
    enum MHD_Result rc;
    oai_meta meta = {id, srv_engine_model_name(h->e), (long long)time(NULL)};
    request_id(h, chat ? "chatcmpl" : "cmpl", id, sizeof id);
    r = srv_prepare(h->e, srv_engine_model_name(h->e), chat, k->body.p, k->body.n, &meta, k->more, &k->n_more, &err);
    if (!r) return reply_error(c, &err, 0);
    rc = run_request(h, c, k, r, 0);
    if (!k->req) srv_release(h->e, r);
    return rc;
}

/* POST /v1/messages (count: /v1/messages/count_tokens): the Anthropic Messages API on the same
 * engine, renderer and constraint as the chat endpoint; only the JSON differs (anth.h). */
static enum MHD_Result messages(srv_http *h, struct MHD_Connection *c, conn *k, int count)
{
    anth_request q;
    oai_error err;
    char id[64];
    sreq *r;
    enum MHD_Result rc;
    request_id(h, "msg", id, sizeof id);
    if (anth_parse_request(k->body.p, k->body.n, count, &q, &err)) return reply_anth_error(c, &err, 0);
    if (count) {
        /* counted whatever the context: a prompt too long for --ctx is what a client counts to find out */
        long n = oai_check_model(q.s.model, srv_engine_model_name(h->e), &err) ? -1
                 : srv_count_chat(h->e, q.messages, q.n_messages, &q.chat, &err);
        anth_request_free(&q);
        if (n < 0) anth_error_rename(&err);
        return n < 0 ? reply_anth_error(c, &err, 0) : reply(c, 200, anth_count_tokens_response(n), 0);
    }
    if (oai_check_model(q.s.model, srv_engine_model_name(h->e), &err) ||
        !(r = srv_prepare_chat(h->e, q.messages, q.n_messages, &q.chat, &q.s, &err))) {
        anth_request_free(&q);
        anth_error_rename(&err);
        return reply_anth_error(c, &err, 0);
    }
    {
        sgen_opts go = {1, r->thinks, q.s.stream, 0, 0, q.s.stop, q.s.n_stop, NULL, 1, 0,
                        {id, srv_engine_model_name(h->e), (long long)time(NULL)}, NULL, 0, 0, 1, 0, 0, 0, q.omit_thinking};
        if (srv_prepare_output(srv_engine_model(h->e), r, &go, &err)) {
            sreq_discard(r);
            anth_request_free(&q);
            return reply_anth_error(c, &err, 0);
        }
    }
    rc = run_request(h, c, k, r, 1);
    if (!k->req) srv_release(h->e, r);
    anth_request_free(&q);
    return rc;
}

/* ---- the Responses API ---------------------------------------------------------------------------- */

/* A stored conversation is the server's, not the request's: its copy is not the body's to pay for. */
static json_t *store_lookup(void *ctx, const char *id)
{
    int was = srv_mem_scope_pause();
    json_t *conv = srv_store_conversation(((srv_http *)ctx)->store, id);
    srv_mem_scope_resume(was);
    return conv;
}

/* A response's reply: the response object from the chat completion; kept when the request says store
 * (with its conversation: the one before it, its input, its output). */
typedef struct {
    xform x;
    srv_http *h;
    char id[64], *model;
    long long created;
    json_t *echo, *prior, *input;
    int store, blob;
    oresp_stream *st;
} resp_xform;

static void resp_keep(resp_xform *rx, const json_t *response)
{
    json_t *conv = json_array();
    if (!rx->store || !conv || !json_is_object(response)) { json_decref(conv); return; }
    if (rx->prior) json_array_extend(conv, rx->prior);
    json_array_extend(conv, rx->input);
    json_array_extend(conv, json_object_get(response, "output"));
    if (srv_store_put(rx->h->store, rx->id, response, conv, rx->input))
        fprintf(stderr, "krun serve: %s: not stored (out of memory)\n", rx->id);
    json_decref(conv);
}

static char *resp_whole(xform *x, char *body)
{
    resp_xform *rx = (resp_xform *)x;
    oai_meta m = {rx->id, rx->model, rx->created};
    json_t *r = body ? oresp_from_chat(&m, rx->echo, body, strlen(body), rx->blob) : NULL;
    char *s = r ? json_dumps(r, JSON_COMPACT) : NULL;
    if (r) resp_keep(rx, r);
    json_decref(r);
    free(body);
    return s;
}

static int resp_feed(xform *x, const char *p, size_t n, kbuf *out)
{
    resp_xform *rx = (resp_xform *)x;
    int over;
    if (!rx->st) {
        oai_meta m = {rx->id, rx->model, rx->created};
        if (!(rx->st = oresp_stream_new(&m, rx->echo, rx->blob))) return -1;
    }
    over = oresp_stream_feed(rx->st, p, n, out);
    if (over == 1 && oresp_stream_response(rx->st) && rx->store) {
        resp_keep(rx, oresp_stream_response(rx->st));
        rx->store = 0;                     /* once */
    }
    return over;
}

static void resp_free(xform *x)
{
    resp_xform *rx = (resp_xform *)x;
    free(rx->model);
    json_decref(rx->echo);
    json_decref(rx->prior);
    json_decref(rx->input);
    oresp_stream_free(rx->st);
    free(rx);
}

/* POST /v1/responses: parsed (previous_response_id from the store), run as a chat, answered as a
 * response (responses.h). */
static enum MHD_Result responses(srv_http *h, struct MHD_Connection *c, conn *k)
{
    oresp_request q;
    oai_error err;
    sreq *r;
    resp_xform *rx = calloc(1, sizeof *rx);
    enum MHD_Result rc;
    if (!rx) return MHD_NO;
    request_id(h, "resp", rx->id, sizeof rx->id);
    rx->id[4] = '_';                       /* resp_...: OpenAI's spelling */
    if (oresp_parse_request(k->body.p, k->body.n, store_lookup, h, &q, &err)) { free(rx); return reply_error(c, &err, 0); }
    if (oai_check_model(q.s.model, srv_engine_model_name(h->e), &err) ||
        !(r = srv_prepare_chat(h->e, q.messages, q.n_messages, &q.chat, &q.s, &err))) {
        oresp_request_free(&q);
        free(rx);
        return reply_error(c, &err, 0);
    }
    rx->x = (xform){API_OPENAI, "text/event-stream", resp_whole, resp_feed, resp_free};
    rx->h = h;
    rx->model = strdup(srv_engine_model_name(h->e));
    rx->created = (long long)time(NULL);
    rx->echo = json_incref(q.echo);
    rx->prior = json_incref(q.prior);
    rx->input = json_incref(q.input);
    rx->store = q.store;
    rx->blob = q.encrypted_reasoning;
    {
        sgen_opts go = {1, r->thinks, q.s.stream, 1, 0, q.s.stop, q.s.n_stop, NULL, 1, 0,
                        {rx->id, srv_engine_model_name(h->e), rx->created}, NULL, 0, 0, 0, 0, 0, 0, 0};
        if (!rx->model || srv_prepare_output(srv_engine_model(h->e), r, &go, &err)) {
            if (!rx->model) oai_error_set(&err, 500, NULL, NULL, "out of memory");
            sreq_discard(r);
            oresp_request_free(&q);
            resp_free(&rx->x);
            return reply_error(c, &err, 0);
        }
    }
    oresp_request_free(&q);
    rc = run_request_x(h, c, k, r, API_OPENAI, &rx->x);
    if (!k->req) srv_release(h->e, r);
    return rc;
}

/* GET /v1/responses/ID (and /input_items), DELETE /v1/responses/ID. */
static enum MHD_Result stored_response(srv_http *h, struct MHD_Connection *c, const char *url, const char *method)
{
    char id[64];
    const char *rest = url + 14, *slash = strchr(rest, '/');
    size_t n = slash ? (size_t)(slash - rest) : strlen(rest);
    int items = slash && !strcmp(slash, "/input_items");
    oai_error err;
    json_t *j;
    if (!n || n >= sizeof id || (slash && !items)) {
        oai_error_set(&err, 404, NULL, "not_found", "no such endpoint: %s %s", method, url);
        return reply_error(c, &err, 0);
    }
    memcpy(id, rest, n);
    id[n] = 0;
    if (strcmp(method, "GET") && (items || strcmp(method, "DELETE"))) {
        oai_error_set(&err, 405, NULL, "method_not_allowed", "%s takes %s, not %s", url, items ? "GET" : "GET or DELETE", method);
        return reply_error(c, &err, 0);
    }
    if (!strcmp(method, "DELETE")) {
        if (srv_store_delete(h->store, id)) return reply(c, 200, oresp_deleted_json(id), 0);
    } else if ((j = items ? srv_store_input(h->store, id) : srv_store_response(h->store, id))) {
        char *s = items ? oresp_input_items_json(j) : json_dumps(j, JSON_COMPACT);
        json_decref(j);
        return reply(c, 200, s, 0);
    }
    oai_error_set(&err, 404, "response_id", "not_found", "Response with id '%s' not found.", id);
    return reply_error(c, &err, 0);
}

/* GET /v1/models/ID: the model, or 404 model_not_found. */
static enum MHD_Result model_one(srv_http *h, struct MHD_Connection *c, const char *url, const char *method)
{
    oai_error err;
    if (strcmp(method, "GET")) {
        oai_error_set(&err, 405, NULL, "method_not_allowed", "%s takes GET, not %s", url, method);
        return reply_error(c, &err, 0);
    }
    if (oai_check_model(url + 11, srv_engine_model_name(h->e), &err)) return reply_error(c, &err, 0);
    return reply(c, 200, oai_model_response(srv_engine_model_name(h->e), h->created, "krun"), 0);
}

/* ---- Ollama's API ------------------------------------------------------------------------------------ */

static double now_mono(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double now_unix(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct {
    xform x;
    ollama_meta m;
    char *model;
    int generate;
    ollama_stream *st;
} ollama_xform;

static char *ollama_whole(xform *x, char *body)
{
    ollama_xform *ox = (ollama_xform *)x;
    char *s = body ? ollama_from_completion(&ox->m, ox->generate, body, strlen(body), now_mono()) : NULL;
    free(body);
    return s;
}

static int ollama_feed(xform *x, const char *p, size_t n, kbuf *out)
{
    ollama_xform *ox = (ollama_xform *)x;
    if (!ox->st && !(ox->st = ollama_stream_new(&ox->m, ox->generate))) return -1;
    return ollama_stream_feed(ox->st, p, n, now_mono(), out);
}

static void ollama_free(xform *x)
{
    ollama_xform *ox = (ollama_xform *)x;
    ollama_stream_free(ox->st);
    free(ox->model);
    free(ox);
}

/* POST /api/chat, /api/generate: run as a chat (generate: a turn of the prompt; raw: a completion of
 * it), answered in Ollama's objects, streamed as NDJSON by default. */
static enum MHD_Result ollama_run(srv_http *h, struct MHD_Connection *c, conn *k, int generate)
{
    ollama_request q;
    oai_error err;
    sreq *r;
    char id[64];
    ollama_xform *ox = calloc(1, sizeof *ox);
    enum MHD_Result rc;
    if (!ox) return MHD_NO;
    ox->m = (ollama_meta){NULL, now_unix(), now_mono()};
    request_id(h, generate ? "gen" : "chat", id, sizeof id);
    if ((generate ? ollama_parse_generate : ollama_parse_chat)(k->body.p, k->body.n, &q, &err)) { free(ox); return reply_ollama_error(c, &err); }
    if (ollama_check_model(q.s.model, srv_engine_model_name(h->e), &err) ||
        !(r = q.raw ? srv_prepare_prompt(h->e, q.prompt, q.prompt_len, &q.s, &err)
                    : srv_prepare_chat(h->e, q.messages, q.n_messages, &q.chat, &q.s, &err))) {
        ollama_request_free(&q);
        free(ox);
        return reply_ollama_error(c, &err);
    }
    ox->x = (xform){API_OLLAMA, "application/x-ndjson", ollama_whole, ollama_feed, ollama_free};
    ox->model = strdup(q.s.model);
    ox->m.model = ox->model;
    ox->generate = generate;
    {
        sgen_opts go = {!q.raw, !q.raw && r->thinks, q.s.stream, 1, 0, q.s.stop, q.s.n_stop, NULL, 1, 0,
                        {id, srv_engine_model_name(h->e), (long long)time(NULL)}, NULL, 0, 0, 0, 0, 0, 0, 0};
        if (!ox->model || srv_prepare_output(srv_engine_model(h->e), r, &go, &err)) {
            if (!ox->model) oai_error_set(&err, 500, NULL, NULL, "out of memory");
            sreq_discard(r);
            ollama_request_free(&q);
            ollama_free(&ox->x);
            return reply_ollama_error(c, &err);
        }
    }
    ollama_request_free(&q);
    rc = run_request_x(h, c, k, r, API_OLLAMA, &ox->x);
    if (!k->req) srv_release(h->e, r);
    return rc;
}

/* GET /api/tags, POST /api/show, GET /api/version. */
static enum MHD_Result ollama_model(srv_http *h, struct MHD_Connection *c, conn *k, int which)
{
    krun_model *m = srv_engine_model(h->e);
    struct stat st;
    long long mtime = h->created;
    unsigned long long size = 0;
    if (!stat(krun_model_path(m), &st)) { mtime = (long long)st.st_mtime; size = (unsigned long long)st.st_size; }
    if (which == 0) return reply(c, 200, ollama_tags_json(srv_engine_model_name(h->e), mtime, size, "kimi-k3"), 0);
    if (which == 2) return reply(c, 200, ollama_version_json(), 0);
    {
        /* show: {"model": NAME} (or "name", as older clients send it) */
        oai_error err;
        json_t *o = kreq_body(k->body.p, k->body.n, &err), *name;
        if (!o) return reply_ollama_error(c, &err);
        name = json_object_get(o, "model") ? json_object_get(o, "model") : json_object_get(o, "name");
        if (ollama_check_model(json_string_value(name), srv_engine_model_name(h->e), &err)) { json_decref(o); return reply_ollama_error(c, &err); }
        json_decref(o);
        return reply(c, 200, ollama_show_json(srv_engine_model_name(h->e), mtime, krun_model_ctx(m), "kimi-k3"), 0);
    }
}

/* A CORS preflight from an origin --cors-origin allows: the methods and headers it may use (queue()
 * adds Access-Control-Allow-Origin). */
static enum MHD_Result preflight(struct MHD_Connection *c)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    const char *want = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    enum MHD_Result rc;
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers",
                            want && *want ? want : "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta, openai-beta");
    MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
    rc = queue(c, MHD_HTTP_NO_CONTENT, r);
    MHD_destroy_response(r);
    return rc;
}

/* /tokenize's answer, written as MHD sends it: {"tokens": [ids]} or, with pieces, [{"id", "piece"}]. */
typedef struct {
    const ktok *tk;
    int32_t *ids;
    size_t n, next;               /* tokens; the next one to write */
    int pieces, opened, closed;
    kbuf out;                     /* written, not sent yet: out.p[at, out.n) */
    size_t at;
} tokens_ctx;

/* s[0, n) as a JSON string, as jansson writes one ('"', '\\' and control characters escaped). */
static void json_str(kbuf *b, const char *s, size_t n)
{
    kbuf_add(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        const char *esc = ch == '"' ? "\\\"" : ch == '\\' ? "\\\\" : ch == '\n' ? "\\n" : ch == '\r' ? "\\r" : ch == '\t' ? "\\t"
                          : ch == '\b' ? "\\b" : ch == '\f' ? "\\f" : NULL;
        if (esc) kbuf_puts(b, esc);
        else if (ch < 0x20) kbuf_printf(b, "\\u%04x", ch);
        else kbuf_add(b, s + i, 1);
    }
    kbuf_add(b, "\"", 1);
}

static ssize_t tokens_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    tokens_ctx *t = cls;
    size_t n;
    (void)pos;
    if (t->at == t->out.n) {
        /* the next 64 KB or so */
        t->out.n = t->at = 0;
        if (!t->opened) { kbuf_puts(&t->out, "{\"tokens\":["); t->opened = 1; }
        while (t->next < t->n && t->out.n < 64 * 1024) {
            int32_t id = t->ids[t->next];
            if (t->next++) kbuf_add(&t->out, ",", 1);
            if (!t->pieces) { kbuf_printf(&t->out, "%d", (int)id); continue; }
            {
                size_t len = 0;
                const uint8_t *b = ktok_id_bytes(t->tk, id, &len);
                kbuf clean = {0};
                kutf8_sanitize((const char *)b, len, &clean);
                kbuf_printf(&t->out, "{\"id\":%d,\"piece\":", (int)id);
                json_str(&t->out, clean.p ? clean.p : "", clean.n);
                kbuf_add(&t->out, "}", 1);
                if (clean.oom) t->out.oom = 1;
                kbuf_free(&clean);
            }
        }
        if (t->next == t->n && !t->closed) { kbuf_puts(&t->out, "]}"); t->closed = 1; }
        if (t->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (t->at == t->out.n) return MHD_CONTENT_READER_END_OF_STREAM;
    }
    n = t->out.n - t->at < max ? t->out.n - t->at : max;
    memcpy(buf, t->out.p + t->at, n);
    t->at += n;
    return (ssize_t)n;
}

static void tokens_free(void *cls)
{
    tokens_ctx *t = cls;
    free(t->ids);
    kbuf_free(&t->out);
    free(t);
}

/* POST /tokenize {"content": TEXT, "add_special": bool, "with_pieces": bool} -> {"tokens": [...]}
 * (llama-server's shapes; with_pieces: [{"id", "piece"}]).  Special tokens' text is read as those
 * tokens only with "parse_special": true (llama-server's default is to read them, krun's is not:
 * text from a user is text). */
static enum MHD_Result tokenize(srv_http *h, struct MHD_Connection *c, conn *k)
{
    const ktok *tk = krun_model_tokenizer(srv_engine_model(h->e));
    oai_error err;
    json_t *o = kreq_body(k->body.p, k->body.n, &err), *v;
    int pieces = 0, special = 0;
    tokens_ctx *t;
    struct MHD_Response *r;
    enum MHD_Result rc;
    if (!o) return reply_error(c, &err, 0);
    v = kreq_field(o, "content");
    if (!json_is_string(v)) { kreq_wrong_type(&err, "content", "a string", v ? v : json_null()); json_decref(o); return reply_error(c, &err, 0); }
    if (kreq_bool(o, "with_pieces", &pieces, &err) || kreq_bool(o, "parse_special", &special, &err)) { json_decref(o); return reply_error(c, &err, 0); }
    if (!(t = calloc(1, sizeof *t)) ||
        ktok_encode(tk, json_string_value(v), json_string_length(v), special, &t->ids, &t->n)) {
        free(t);
        json_decref(o);
        oai_error_set(&err, 500, NULL, NULL, "out of memory");
        return reply_error(c, &err, 0);
    }
    json_decref(o);
    /* the answer is written as it is sent (tokens_read): 4 bytes per token are kept, not the
     * whole text (issue 34.4: with pieces, 1.7 GB for an 8 MB body) */
    t->tk = tk;
    t->pieces = pieces;
    r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, tokens_read, t, tokens_free);
    if (!r) { tokens_free(t); return MHD_NO; }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    rc = queue(c, 200, r);
    MHD_destroy_response(r);
    return rc;
}

/* POST /detokenize {"tokens": [ids]} -> {"content": TEXT} (ill-formed UTF-8 as U+FFFD). */
static enum MHD_Result detokenize(srv_http *h, struct MHD_Connection *c, conn *k)
{
    krun_model *m = srv_engine_model(h->e);
    const ktok *tk = krun_model_tokenizer(m);
    size_t vocab = (size_t)krun_model_config(m)->vocab, n;
    oai_error err;
    json_t *o = kreq_body(k->body.p, k->body.n, &err), *v;
    int32_t *ids;
    uint8_t *text = NULL;
    size_t len = 0;
    kbuf clean = {0};
    json_t *res;
    if (!o) return reply_error(c, &err, 0);
    v = kreq_field(o, "tokens");
    if (!json_is_array(v)) { kreq_wrong_type(&err, "tokens", "an array of token ids", v ? v : json_null()); json_decref(o); return reply_error(c, &err, 0); }
    n = json_array_size(v);
    ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) { json_decref(o); oai_error_set(&err, 500, NULL, NULL, "out of memory"); return reply_error(c, &err, 0); }
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || (size_t)json_integer_value(x) >= vocab) {
            oai_error_set(&err, 400, "tokens", "invalid_value", "tokens[%zu] must be a token id from 0 to %zu", i, vocab - 1);
            free(ids);
            json_decref(o);
            return reply_error(c, &err, 0);
        }
        ids[i] = (int32_t)json_integer_value(x);
    }
    json_decref(o);
    if (ktok_decode(tk, ids, n, &text, &len) < 0) { free(ids); oai_error_set(&err, 500, NULL, NULL, "out of memory"); return reply_error(c, &err, 0); }
    free(ids);
    kutf8_sanitize((const char *)text, len, &clean);
    free(text);
    res = json_pack("{so}", "content", json_stringn(clean.p ? clean.p : "", clean.n));
    kbuf_free(&clean);
    return reply_json(c, 200, res);
}

static enum MHD_Result metrics(srv_http *h, struct MHD_Connection *c)
{
    char *text = srv_engine_metrics(h->e);
    struct MHD_Response *r;
    enum MHD_Result rc;
    if (!text) return MHD_NO;
    r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(text); return MHD_NO; }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4");
    rc = queue(c, 200, r);
    MHD_destroy_response(r);
    return rc;
}

/* GET /: the page (serve_ui.c), open to all like any web server's files: what it shows comes
 * from the API, with the key. */
static enum MHD_Result page(struct MHD_Connection *c)
{
    unsigned status;
    struct MHD_Response *r = srv_ui_response(c, &status);
    enum MHD_Result rc;
    if (!r) return MHD_NO;
    rc = queue(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

/* ---- routing ---------------------------------------------------------------------------------- */

/* Authorization: Bearer KEY, or (as Anthropic's clients send it) x-api-key: KEY. */
static int authorized(struct MHD_Connection *c, const char *key)
{
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    size_t n = strlen(key);
    if (x && strlen(x) == n && CRYPTO_memcmp(x, key, n) == 0) return 1;
    /* the scheme is case-insensitive (RFC 9110 11.1): "bearer KEY" too */
    if (!v || strncasecmp(v, "Bearer", 6) || (v[6] != ' ' && v[6] != '\t')) return 0;
    v += 6;
    while (*v == ' ' || *v == '\t') v++;
    return strlen(v) == n && CRYPTO_memcmp(v, key, n) == 0;
}

static enum MHD_Result route(srv_http *h, struct MHD_Connection *c, const char *url, const char *method, conn *k)
{
    static const struct { const char *path, *method; } routes[] = {
        {"/health", "GET"}, {"/v1/models", "GET"}, {"/v1/chat/completions", "POST"}, {"/v1/completions", "POST"},
        {"/v1/messages", "POST"}, {"/v1/messages/count_tokens", "POST"}, {"/tokenize", "POST"}, {"/detokenize", "POST"},
        {"/metrics", "GET"}, {"/machine", "GET"}, {"/", "GET"},
        {"/v1/responses", "POST"}, {"/api/chat", "POST"}, {"/api/generate", "POST"}, {"/api/tags", "GET"}, {"/api/show", "POST"},
        {"/api/version", "GET"},
    };
    oai_error err;
    int known = -1;
    for (int i = 0; i < (int)(sizeof routes / sizeof *routes); i++)
        if (!strcmp(url, routes[i].path) && !(h->o.no_ui && !strcmp(url, "/"))) known = i;
    if (known < 0 && !k->too_big && !strncmp(url, "/v1/responses/", 14)) return stored_response(h, c, url, method);
    if (known < 0 && !k->too_big && !strncmp(url, "/v1/models/", 11)) return model_one(h, c, url, method);
    if (known < 0) {
        oai_error_set(&err, 404, NULL, "not_found", "no such endpoint: %s %s (krun serves POST /v1/chat/completions, POST "
                      "/v1/completions, POST /v1/messages, POST /v1/messages/count_tokens, POST /v1/responses, GET and DELETE "
                      "/v1/responses/ID, GET /v1/models, GET /v1/models/ID, POST /tokenize, POST /detokenize, GET /metrics, "
                      "GET /machine, GET /health; Ollama's POST /api/chat, /api/generate, /api/show, GET /api/tags, /api/version%s)",
                      method, url, h->o.no_ui ? "" : "; GET / (the page)");
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
        rc = queue(c, 405, r);
        MHD_destroy_response(r);
        return rc;
    }
    if (k->too_big) {
        oai_error_set(&err, 413, NULL, "request_too_large", "the request body is larger than %zu bytes (krun serve --max-body)",
                      h->o.max_body);
        return known == 4 || known == 5 ? reply_anth_error(c, &err, 0) : reply_error(c, &err, 0);
    }
    if (k->early) {
        /* the headers alone: a route that reads a body goes on to read it; the others answer now */
        k->takes_body = !strcmp(routes[known].method, "POST");
        if (k->takes_body) return MHD_YES;
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
        } else if (j && (json_object_set_new(j, "connections", srv_conns_json(h->conns)) ||
                         json_object_set_new(j, "responses_store", srv_store_json(h->store)) ||
                         json_object_set_new(j, "request_memory", srv_mem_json(h->mem)))) {
            json_decref(j);
            j = NULL;
        }
        return reply_json(c, (unsigned)status, j);
    }
    case 1: return reply(c, 200, oai_models_response(srv_engine_model_name(h->e), h->created, "krun"), 0);
    case 2: return api_request(h, c, k, 1);
    case 3: return api_request(h, c, k, 0);
    case 4: return messages(h, c, k, 0);
    case 5: return messages(h, c, k, 1);
    case 6: return tokenize(h, c, k);
    case 7: return detokenize(h, c, k);
    case 8: return metrics(h, c);
    case 9: return reply_json(c, 200, srv_machine_json(h->e, h->o.api_key != NULL, h->loopback));
    case 10: return page(c);
    case 11: return responses(h, c, k);
    case 12: return ollama_run(h, c, k, 0);
    case 13: return ollama_run(h, c, k, 1);
    case 14: return ollama_model(h, c, k, 0);
    case 15: return ollama_model(h, c, k, 1);
    case 16: return ollama_model(h, c, k, 2);
    default: return MHD_NO;                   /* known indexes routes[] */
    }
}

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size, const char *value,
                                     size_t value_size)
{
    (void)kind;
    (void)key_size;
    srv_framing_header(cls, key, value, value_size);
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
    count_e = h->e;
    count_ep = endpoint_of(url);
    conn_h = h;
    client_gone = 0;
    if (!k) {
        /* the headers: refuse early what needs no body to refuse */
        oai_error err;
        srv_framing fr;
        char why[240];
        int bad;
        enum MHD_Result rc;
        k = calloc(1, sizeof *k);
        if (!k) return MHD_NO;
        *con_cls = k;
        k->http_1_0 = version && !strcmp(version, MHD_HTTP_VERSION_1_0);
        /* first: a request whose length is uncertain is answered and the connection closed, so
         * nothing after it is read as a request */
        srv_framing_init(&fr);
        srv_framing_request_line(&fr, method, cur.c != c || cur.target_ok);
        MHD_get_connection_values_n(c, MHD_HEADER_KIND, framing_header, &fr);
        if ((bad = srv_framing_verdict(&fr, k->http_1_0, why, sizeof why))) {
            k->answered = 1;
            oai_error_set(&err, bad, NULL, bad == 400 ? "bad_framing" : "unsupported_transfer_encoding", "%s", why);
            return reply_error(c, &err, -1);
        }
        if (!strcmp(method, "OPTIONS") && cors_origin(h, c) && MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Method")) {
            /* a browser's preflight carries no key: answered before the check */
            k->answered = 1;
            return preflight(c);
        }
        /* then the key, on every path but /health and the page, before a byte of the body is read
         * (issue 34.5): a client without it costs the server nothing but its headers.  The page
         * (GET /) is open like any web server's files; what it shows comes from the API, with the key. */
        if (h->o.api_key && strcmp(url, "/health") && strcmp(url, "/") && !authorized(c, h->o.api_key)) {
            k->answered = 1;
            oai_error_set(&err, 401, NULL, "invalid_api_key", "a valid API key is needed: send the header Authorization: Bearer KEY "
                          "(or x-api-key: KEY)");
            if (!strncmp(url, "/v1/messages", 12)) return reply(c, 401, anth_error_json(&err), body_follows(&fr));
            return reply_error(c, &err, body_follows(&fr));
        }
        if (fr.n_cl && fr.cl > h->o.max_body) {
            k->answered = 1;
            oai_error_set(&err, 413, NULL, "request_too_large", "the request body is %llu bytes, more than %zu (krun serve --max-body)",
                          fr.cl, h->o.max_body);
            if (!strncmp(url, "/v1/messages", 12)) return reply_anth_error(c, &err, -1);
            return reply_error(c, &err, -1);
        }
        /* with a body following, what needs none is answered now (an unknown path, a wrong method,
         * a GET): the body is never read, and the connection is closed after the answer (MHD
         * closes a connection answered before its request was read whole; so a request without a
         * body is routed as usual, once it is whole, and its connection kept) */
        if (!body_follows(&fr)) return MHD_YES;
        k->early = 1;
        rc = route(h, c, url, method, k);
        k->early = 0;
        if (!k->takes_body) { k->answered = 1; return rc; }
        /* its share of the request memory, before a byte of its body is read */
        k->body_len = fr.n_cl ? (size_t)fr.cl : h->o.max_body;
        /* waiting at most half the request's deadline: the 503 goes out before serve_conns.c would close it */
        if (srv_mem_reserve(h->mem, srv_mem_share(k->body_len), h->o.request_timeout / 2)) {
            k->answered = 1;
            oai_error_set(&err, 503, NULL, "server_busy", "krun serve is reading and preparing as many requests as its "
                          "--request-memory allows: retry shortly");
            if (!strncmp(url, "/v1/messages", 12)) return reply_anth_error(c, &err, -1);
            return reply_error(c, &err, -1);
        }
        k->share = srv_mem_share(k->body_len);
        return MHD_YES;
    }
    if (*upload_size) {
        if (!k->answered && !k->too_big && k->takes_body) {
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
    {
        /* the body's JSON may take its share (serve_mem.c); an oversized one fails with 413 */
        enum MHD_Result rc;
        if (k->takes_body) srv_mem_scope_begin(SRV_MEM_JSON_PER_BYTE * k->body.n + SRV_MEM_BASE / 2);
        rc = route(h, c, url, method, k);
        body_done(h, k);
        return rc;
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    srv_http *h = cls;
    conn *k = *con_cls;
    cur.c = NULL;
    srv_conn_waiting(h->conns, conn_of(c));   /* for its next request, if it has one */
    if (!k) return;
    body_done(h, k);
    if (k->req) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) srv_cancel(h->e, k->req);
        srv_release(h->e, k->req);
    }
    for (size_t i = 0; i < k->n_more; i++) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) srv_cancel(h->e, k->more[i]);
        srv_release(h->e, k->more[i]);
    }
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

/* A request line was parsed (MHD_OPTION_URI_LOG_CALLBACK), on the connection's own thread: the
 * request from here on is this thread's (cur), until krun answers it or it completes. */
static void *uri_logged(void *cls, const char *uri, struct MHD_Connection *c)
{
    (void)cls;
    cur.c = c;
    cur.last_fmt = NULL;
    cur.answered_here = 0;
    cur.target_ok = srv_framing_target_ok(uri);
    return NULL;                  /* the request's con_cls: made on the first call (on_request) */
}

/* libmicrohttpd 0.9.75 answers some requests on its own, before krun sees them: a malformed or
 * too large Content-Length, a malformed header line, a bad chunk.  Its answer is an HTML page,
 * and for a bad Content-Length it is sent with two status lines (the state after its error is
 * overwritten, and the header is built twice: the first one's Content-Length frames the second
 * as its body; issue 34.8).  It says so in its log, on the connection's thread, before a byte of
 * it is sent: krun then sends its own answer -- one status line, a JSON error, Connection: close
 * -- and shuts the socket's sending side, so that MHD's answer is never sent (its write fails and
 * it closes the connection). */
static const char MHD_ERROR_FMT[] = "Error processing request (HTTP response code is %u ('%s')). Closing connection.\n";

static void own_error(unsigned status, const char *mhd_says)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(cur.c, MHD_CONNECTION_INFO_CONNECTION_FD);
    oai_error err;
    char *json, head[256];
    kbuf why = {0};
    const char *b = mhd_says ? strstr(mhd_says, "<body>") : NULL, *e = b ? strstr(b, "</body>") : NULL;
    int n;
    if (!ci) return;
    /* MHD's reason, its HTML tags dropped */
    for (const char *p = b ? b + 6 : ""; e && p < e; p++) {
        if (*p == '<') { while (p < e && *p != '>') p++; continue; }
        kbuf_add(&why, p, 1);
    }
    if (cur.last_fmt && strstr(cur.last_fmt, "Content-Length"))
        oai_error_set(&err, (int)status, NULL, status == 413 ? "request_too_large" : "bad_framing",
                      status == 413 ? "the request's Content-Length is too large" : "Content-Length must be one decimal number "
                      "(RFC 9110 8.6): the request's length cannot be known");
    else
        oai_error_set(&err, (int)status, NULL, "bad_request", "the request could not be read: %.*s", why.n ? (int)why.n : 9,
                      why.n ? why.p : "malformed");
    kbuf_free(&why);
    if (!(json = oai_error_json(&err))) return;
    n = snprintf(head, sizeof head, "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                 status, MHD_get_reason_phrase_for(status), strlen(json));
    if (count_e) srv_engine_count_response(count_e, SRV_EP_OTHER, (int)status);
    /* a fresh connection's send buffer holds these few hundred bytes at once; what does not go
     * is lost with the connection, which closes either way */
    if (send(ci->connect_fd, head, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) == n)
        (void)!send(ci->connect_fd, json, strlen(json), MSG_NOSIGNAL | MSG_DONTWAIT);
    shutdown(ci->connect_fd, SHUT_WR);
    free(json);
    cur.answered_here = 1;
    cur.c = NULL;
}

/* libmicrohttpd's messages, each the same line at most once a second (with a count of those held
 * back): a process out of descriptors gets "Error accepting connection" thousands of times a
 * second (issue 34.9). */
#define LOG_KINDS 16
static struct { const char *fmt; double last; unsigned long held; } log_seen[LOG_KINDS];
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    double now = know();
    unsigned long held = 0;
    int slot = -1;
    (void)cls;
    if (cur.answered_here) return;             /* MHD failing to send what own_error made it not send */
    if (client_gone) return;                   /* the abort a client that left causes: not an error (the request's line says it) */
    if (cur.c && !strcmp(fmt, MHD_ERROR_FMT)) {
        va_list aq;
        unsigned status;
        const char *msg;
        va_copy(aq, ap);
        status = va_arg(aq, unsigned);
        msg = va_arg(aq, const char *);
        va_end(aq);
        own_error(status, msg);
        if (cur.answered_here) return;
    }
    if (cur.c) cur.last_fmt = fmt;
    pthread_mutex_lock(&log_mu);
    for (int i = 0; i < LOG_KINDS && slot < 0; i++)
        if (log_seen[i].fmt == fmt) slot = i;
    if (slot < 0) {                            /* a new kind replaces the one seen longest ago */
        slot = 0;
        for (int i = 1; i < LOG_KINDS; i++)
            if (log_seen[i].last < log_seen[slot].last) slot = i;
        log_seen[slot].fmt = fmt;
        log_seen[slot].last = 0;
        log_seen[slot].held = 0;
    }
    if (now - log_seen[slot].last < 1.0) {
        log_seen[slot].held++;
        pthread_mutex_unlock(&log_mu);
        return;
    }
    held = log_seen[slot].held;
    log_seen[slot].held = 0;
    log_seen[slot].last = now;
    pthread_mutex_unlock(&log_mu);
    if (held) fprintf(stderr, "krun serve: http: (%lu more like the next line in the last second)\n", held);
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
    if (!(h->mem = srv_mem_new(o->request_memory))) { pthread_mutex_destroy(&h->id_mu); free(h); return krun_err_set(err, KRUN_ENOMEM, "out of memory"); }
    if (!(h->store = srv_store_new(o->responses_store))) {
        srv_mem_free(h->mem);
        pthread_mutex_destroy(&h->id_mu);
        free(h);
        return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    }
    h->loopback = srv_listen_loopback(o->listen_fd);
    {
        srv_conns_opts co = {o->max_connections, o->max_connections_per_ip, o->request_timeout};
        if (srv_conns_start(&co, &h->conns, err)) { srv_store_free(h->store); srv_mem_free(h->mem); pthread_mutex_destroy(&h->id_mu); free(h); return -1; }
    }
    /* MHD_USE_POLL: without it every connection's thread waits in select(2), which cannot watch a
     * descriptor at or above FD_SETSIZE (1024): a --max-connections near that would fail */
    h->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG |
                            MHD_USE_ITC, 0,
                            NULL, NULL, on_request, h,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,      /* first, so that every message goes through it */
                            MHD_OPTION_URI_LOG_CALLBACK, uri_logged, NULL,
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
        srv_store_free(h->store);
        srv_mem_free(h->mem);
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
    srv_store_free(h->store);
    srv_mem_free(h->mem);
    pthread_mutex_destroy(&h->id_mu);
    free(h);
}
