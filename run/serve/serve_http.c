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
#include "run/text/chat.h"
#include "run/grammar/kgram.h"
#include "run/api/reqjson.h"

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
    sreq *more[OAI_MAX_N - 1];    /* n > 1: the other choices' requests */
    size_t n_more;
} conn;

/* ---- responses ------------------------------------------------------------------------------ */

/* /metrics counts every response by endpoint and status.  MHD runs one thread per connection and
 * a connection's callbacks on it, so the endpoint of the request being answered is the thread's. */
static __thread srv_engine *count_e;
static __thread int count_ep = SRV_EP_OTHER;

static enum MHD_Result queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *r)
{
    if (count_e) srv_engine_count_response(count_e, count_ep, (int)status);
    return MHD_queue_response(c, status, r);
}

static int endpoint_of(const char *url)
{
    static const char *const path[] = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
                                       "/tokenize", "/detokenize", "/v1/models", "/health", "/metrics"};
    for (int i = 0; i < (int)(sizeof path / sizeof *path); i++)
        if (!strcmp(url, path[i])) return i;
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
        if (n < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
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
    return reply(c, (unsigned)e->status, anth_error_json(e), retry_after);
}

/* srv_submit refused the request: 503 (busy, draining, damaged), with Retry-After when busy; in
 * Anthropic's error shape for /v1/messages (503: overloaded_error). */
static enum MHD_Result reply_refused(srv_http *h, struct MHD_Connection *c, const oai_error *err, int anth)
{
    int retry = !strcmp(err->code ? err->code : "", "server_busy") ? srv_retry_after(h->e) : 0;
    return anth ? reply_anth_error(c, err, retry) : reply_error(c, err, retry);
}

/* Submit r (made by srv_prepare, with k->more its other choices) and answer when its output is
 * known.  anth: an Anthropic request (its errors in Anthropic's shape). */
static enum MHD_Result run_request(srv_http *h, struct MHD_Connection *c, conn *k, sreq *r, int anth)
{
    oai_error err;
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
    if (srv_submit_n(h->e, all, n, &err)) return reply_refused(h, c, &err, anth);
    if (k->n_more && r->stream) {
        /* n choices streamed: the stream starts (200) with choice 0's first event */
        int status = srv_wait_started(h->e, r);
        if (status == 200) return reply_stream_choices(h, c, r, k->more, k->n_more);
        for (size_t i = 0; i < k->n_more; i++) srv_cancel(h->e, k->more[i]);
        if (status < 0) return MHD_NO;                     /* the client hung up */
        {
            char *body;
            status = srv_take_body(h->e, r, &body);
            if (status < 0) return MHD_NO;
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
        if (gone) { free(merged); return MHD_NO; }
        return reply(c, (unsigned)status, merged, 0);
    }
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
        return n < 0 ? reply_anth_error(c, &err, 0) : reply(c, 200, anth_count_tokens_response(n), 0);
    }
    if (oai_check_model(q.s.model, srv_engine_model_name(h->e), &err) ||
        !(r = srv_prepare_chat(h->e, q.messages, q.n_messages, &q.chat, &q.s, &err))) {
        anth_request_free(&q);
        return reply_anth_error(c, &err, 0);
    }
    {
        sgen_opts go = {1, q.chat.thinking, q.s.stream, 0, 0, q.s.stop, q.s.n_stop, NULL, 1, 0,
                        {id, srv_engine_model_name(h->e), (long long)time(NULL)}, NULL, 0, 0, 1, 0, 0, 0};
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

/* POST /tokenize {"content": TEXT, "add_special": bool, "with_pieces": bool} -> {"tokens": [...]}
 * (llama-server's shapes; with_pieces: [{"id", "piece"}]).  Special tokens' text is read as those
 * tokens only with "parse_special": true (llama-server's default is to read them, krun's is not:
 * text from a user is text). */
static enum MHD_Result tokenize(srv_http *h, struct MHD_Connection *c, conn *k)
{
    const ktok *tk = krun_model_tokenizer(srv_engine_model(h->e));
    oai_error err;
    json_t *o = kreq_body(k->body.p, k->body.n, &err), *v, *out;
    int pieces = 0, special = 0;
    int32_t *ids = NULL;
    size_t n = 0;
    if (!o) return reply_error(c, &err, 0);
    v = kreq_field(o, "content");
    if (!json_is_string(v)) { kreq_wrong_type(&err, "content", "a string", v ? v : json_null()); json_decref(o); return reply_error(c, &err, 0); }
    if (kreq_bool(o, "with_pieces", &pieces, &err) || kreq_bool(o, "parse_special", &special, &err)) { json_decref(o); return reply_error(c, &err, 0); }
    if (ktok_encode(tk, json_string_value(v), json_string_length(v), special, &ids, &n)) {
        json_decref(o);
        oai_error_set(&err, 500, NULL, NULL, "out of memory");
        return reply_error(c, &err, 0);
    }
    json_decref(o);
    out = json_array();
    for (size_t i = 0; out && i < n; i++) {
        if (!pieces) { json_array_append_new(out, json_integer(ids[i])); continue; }
        size_t len = 0;
        const uint8_t *b = ktok_id_bytes(tk, ids[i], &len);
        kbuf clean = {0};
        kutf8_sanitize((const char *)b, len, &clean);
        json_array_append_new(out, json_pack("{sisO}", "id", (int)ids[i], "piece", json_stringn(clean.p ? clean.p : "", clean.n)));
        kbuf_free(&clean);
    }
    free(ids);
    return reply_json(c, 200, out ? json_pack("{so}", "tokens", out) : NULL);
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

/* ---- routing ---------------------------------------------------------------------------------- */

/* Authorization: Bearer KEY, or (as Anthropic's clients send it) x-api-key: KEY. */
static int authorized(struct MHD_Connection *c, const char *key)
{
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    size_t n = strlen(key);
    if (x && strlen(x) == n && CRYPTO_memcmp(x, key, n) == 0) return 1;
    if (!v || strncmp(v, "Bearer ", 7)) return 0;
    v += 7;
    while (*v == ' ') v++;
    return strlen(v) == n && CRYPTO_memcmp(v, key, n) == 0;
}

static enum MHD_Result route(srv_http *h, struct MHD_Connection *c, const char *url, const char *method, conn *k)
{
    static const struct { const char *path, *method; } routes[] = {
        {"/health", "GET"}, {"/v1/models", "GET"}, {"/v1/chat/completions", "POST"}, {"/v1/completions", "POST"},
        {"/v1/messages", "POST"}, {"/v1/messages/count_tokens", "POST"}, {"/tokenize", "POST"}, {"/detokenize", "POST"},
        {"/metrics", "GET"},
    };
    oai_error err;
    int known = -1;
    for (int i = 0; i < (int)(sizeof routes / sizeof *routes); i++)
        if (!strcmp(url, routes[i].path)) known = i;
    if (known < 0) {
        oai_error_set(&err, 404, NULL, "not_found", "no such endpoint: %s %s (krun serves POST /v1/chat/completions, POST "
                      "/v1/completions, POST /v1/messages, POST /v1/messages/count_tokens, GET /v1/models, POST /tokenize, "
                      "POST /detokenize, GET /metrics, GET /health)", method, url);
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
    case 3: return api_request(h, c, k, 0);
    case 4: return messages(h, c, k, 0);
    case 5: return messages(h, c, k, 1);
    case 6: return tokenize(h, c, k);
    case 7: return detokenize(h, c, k);
    default: return metrics(h, c);
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
    count_e = h->e;
    count_ep = endpoint_of(url);
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
        if (h->o.api_key && (!strncmp(url, "/v1/", 4) || endpoint_of(url) != SRV_EP_OTHER) && strcmp(url, "/health") &&
            !authorized(c, h->o.api_key)) {
            k->answered = 1;
            oai_error_set(&err, 401, NULL, "invalid_api_key", "a valid API key is needed: send the header Authorization: Bearer KEY "
                          "(or x-api-key: KEY)");
            if (!strncmp(url, "/v1/messages", 12)) return reply(c, 401, anth_error_json(&err), 0);
            return reply_error(c, &err, 0);
        }
        if (cl && strtoull(cl, NULL, 10) > h->o.max_body) {
            k->answered = 1;
            oai_error_set(&err, 413, NULL, "request_too_large", "the request body is %s bytes, more than %zu (krun serve --max-body)", cl,
                          h->o.max_body);
            if (!strncmp(url, "/v1/messages", 12)) return reply_anth_error(c, &err, 0);
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
    for (size_t i = 0; i < k->n_more; i++) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) srv_cancel(h->e, k->more[i]);
        srv_release(h->e, k->more[i]);
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
