/* krun serve: the parts of the server and what they share.
 *
 *   cmd_serve.c     options, opening the model, the listening socket, signals, shutdown
 *   serve_http.c    HTTP (libmicrohttpd): routing, auth, bodies, requests in, responses out
 *   serve_engine.c  the engine thread: the one owner of the model; the queue, the sequences,
 *                   one forward sweep after another (docs/SERVE.md: the batching policy)
 *   serve_gen.c     one request's output from the ids it generates
 *   serve_prep.c    a request body made ready to run (parsed, rendered, fitted): krun serve and krun batch
 *   serve_framing.c whether a request's body length can be known for sure (RFC 9112 6.3)
 *   serve_conns.c   every open connection: the deadline for a request to arrive, the reserve
 *   serve_store.c   stored responses (POST /v1/responses with store: previous_response_id, GET, DELETE)
 *   serve_ui.c      the page (GET /: run/serve/ui/, embedded)
 *   serve_machine.c GET /machine: the member files' reads and busy time, the expert cache
 *   serve_mem.c     the memory requests take while they are read and prepared: per request, in all
 *
 * A request (sreq) is made by an HTTP connection thread (parsed, rendered, tokenized there),
 * handed to the engine, and read back by the same connection thread as its output grows.  One
 * mutex (srv_engine.mu) guards what both sides touch; the engine holds it only between sweeps. */
#ifndef KRUN_SERVE_H
#define KRUN_SERVE_H

#include "serve_gen.h"
#include "run/session/pcache.h"
#include "run/session/sampler.h"
#include "run/session/session.h"
#include "run/text/jsontext.h"
#include "run/api/oai.h"

#include <jansson.h>
#include <pthread.h>
#include <sys/socket.h>
#include <stddef.h>
#include <stdint.h>

typedef struct srv_engine srv_engine;

typedef enum { SREQ_NEW, SREQ_QUEUED, SREQ_ACTIVE, SREQ_DONE } sreq_state;

typedef struct sreq {
    /* set before srv_submit, then the engine's */
    int32_t *prompt;           /* malloc'd */
    size_t n_prompt;
    size_t n_preamble;         /* a chat's system/tools part: prompt[0, n_preamble) (0: none) */
    long max_tokens;
    ksampler_opts sampling;
    sgen *gen;                 /* the output; the engine's while the request runs */
    int has_seed;              /* else the engine picks one */
    int logprobs, top_logprobs;   /* report each generated token's log-probability (and alternatives) */
    int echo;                  /* completions: the prompt first in the output (with logprobs: the prompt's too, from
                                  the logits of every prompt position: no prefix cache, a bounded block a sweep) */
    struct sreq *leader;       /* n > 1, choice i > 0: choice 0's request, whose prompt state it copies (a reference
                                  is held by the connection; NULL: none) */
    struct kgram *gram;        /* constrained decoding: the reply's grammar (owned; NULL: free) */
    const struct kmask_index *mask_index;   /* the engine's (srv_engine_mask_index) */
    int stream;                /* the output is server-sent events */
    int thinks;                /* chat: the reply starts in the think channel (srv_prepare_chat: the request's
                                  reasoning, or the server's default) */
    size_t spec;               /* drafts per verification at most (the request's "speculative"; the server's
                                  --spec caps it; SIZE_MAX: the server's) */
    /* the client, looked at by the connection's own thread only (serve_engine.c, client_check) */
    int client_fd;             /* the connection's socket, to notice a client that hung up; -1: none */
    int client_probe;          /* HTTP/1.1: "100 Continue" may be sent before the status to tell a
                                * client that closed from one that only half-closed */
    double t_submit;
    char id[64];               /* the response's id, for the log */
    /* the engine thread's */
    krun_session *s;
    size_t fed;                /* prompt tokens run (or held by the prefix cache's entry) */
    size_t cached;             /* of them, those the prefix cache held */
    int32_t next;              /* the token sampled last, run in the next sweep */
    struct kmask *mask;        /* the grammar's state over reply tokens [0, mask_at) */
    size_t mask_at;
    uint64_t verifications, drafted, accepted;   /* speculation: sweeps with drafts, drafts, drafts kept */
    size_t acc_last;           /* drafts kept in the last sweep */
    krun_spec_stats seen;      /* the session's speculation counters as last read: the drafter's share of a sweep */
    uint64_t dr_last[3];       /* of the last sweep, the EAGLE drafter's verifications, drafts and drafts kept */
    size_t emitted;            /* tokens handed to the output in the last sweep */
    int leader_ref;            /* a reference on leader is held (taken at srv_submit) */
    size_t copied;             /* prompt positions copied from the leader's state (0: none) */
    /* the connection's own thread */
    double last_sent;          /* when the connection last sent something (a keep-alive comment is due after
                                * srv_engine_opts.progress_every seconds of silence) */
    /* under srv_engine.mu */
    size_t prefilled;          /* prompt tokens run, as of the last sweep (fed, for the other threads) */
    size_t in_sweep;           /* prompt positions (or 1, decoding) of the sweep running now; 0: none */
    size_t generated;          /* tokens generated, as of the last sweep */
    int early_stream;          /* the stream was opened before the first token, to send progress comments:
                                * a failure from here on is an error event in it */
    sreq_state state;
    kbuf out;                  /* bytes ready to send */
    int status;                /* the response's HTTP status, once known */
    int started;               /* the status is known: output has begun or the request is over */
    int cancelled;             /* the client went away (or the server is stopping): free the sequence */
    int probed_head, probed_stream;   /* the client's input ended: probed before the status, in the stream */
    int refs;
    pthread_cond_t cv;         /* signalled when out grows or the request ends */
    struct sreq *next_in_queue;
} sreq;

/* Echo with logprobs (completions): the prompt runs at most SRV_ECHO_ROWS positions a sweep, their
 * logits into one buffer of the engine's (srv_echo_bytes: the plan counts it, krun_model_opts.extra_bytes),
 * each row made log-probabilities at once; one such request a sweep. */
#define SRV_ECHO_ROWS 64
static inline uint64_t srv_echo_bytes(const k3_config *c) { return (uint64_t)SRV_ECHO_ROWS * (uint64_t)c->vocab * sizeof(float); }

typedef struct srv_engine_opts {
    size_t max_queue;          /* requests waiting for a sequence, at most */
    const char *model_name;
    int quiet;                 /* no line per request on stderr */
    double progress_every;     /* a streamed request silent this long gets an SSE comment (": prefill 1234/5000");
                                  its stream opens (200) when it comes before the first token; 0: never */
    krun_pcache *cache;        /* the prefix cache every session comes from, or NULL (--no-cache) */
    int held;                  /* start no sweep until srv_engine_release: krun batch hands its first requests over
                                  before the first sweep, which then takes as many as it has room for (a server
                                  gathers a burst of its clients' requests for a few ms instead) */
    const char *command;       /* the command whose options an error names ("krun batch"; NULL: "krun serve") */
    int ctx_lenient;           /* a request whose prompt + max_tokens exceeds the context is served up to the context
                                  (finish_reason length); 0: refused with a 400 (krun batch; krun serve --ctx-strict) */
    int default_effort;        /* with default_effort_set: a request that chooses no reasoning effort thinks this much
                                  (a kchat_effort: KCHAT_EFFORT_NONE is thinking off); else as the request's API says */
    int default_effort_set;
} srv_engine_opts;

/* The engine over an opened, prepared model (max_seqs sequences); starts its thread. */
int  srv_engine_start(krun_model *m, const srv_engine_opts *o, srv_engine **out, krun_err *err);
/* Lets an engine started held (srv_engine_opts.held) run. */
void srv_engine_release(srv_engine *e);
/* Stops the thread (after srv_engine_cancel_all or once idle) and frees the engine. */
void srv_engine_stop(srv_engine *e);

/* A request made ready to run: status 0 until known.  NULL on allocation failure. */
sreq *sreq_new(void);
/* Free a request that was never submitted (serve_prep.c). */
void sreq_discard(sreq *r);
/* A body of POST /v1/chat/completions (chat) or /v1/completions made into a request for the
 * engine's model, served as model_name (serve_prep.c): parsed, its model checked, rendered or
 * tokenized, fitted to the context, its sampling (penalties, logprobs, speculation), its reply's
 * constraint (response_format, tool_choice, strict tools) and its output (sgen, with meta's id,
 * model and created) set.  n > 1: the other choices (the same request with seed + i, ids "ID.i")
 * into more[OAI_MAX_N - 1] (*n_more of them, discard them too); more NULL: n > 1 is a 400 naming
 * n (krun batch).  NULL with err filled (400, or 500 when out of memory).  Submit it, or
 * sreq_discard it. */
sreq *srv_prepare(srv_engine *e, const char *model_name, int chat, const char *body, size_t len, const oai_meta *meta, sreq **more,
                  size_t *n_more, oai_error *err);
/* A parsed chat (either API) made into a request: the tokenizer's chat markers checked, the
 * messages rendered, sampling, context and constraint set; no output yet (srv_prepare_output).
 * The caller checks the model name.  NULL with err. */
sreq *srv_prepare_chat(srv_engine *e, const kchat_message *msgs, size_t n_msgs, const kchat_options *chat, const oai_sampling *s,
                       oai_error *err);
/* A text prompt (special-token strings honoured, as /v1/completions and krun --prompt) made into a
 * request: tokenized, sampling and context set; no output yet.  NULL with err. */
sreq *srv_prepare_prompt(srv_engine *e, const char *text, size_t len, const oai_sampling *s, oai_error *err);
/* The chat's prompt length in tokens, as srv_prepare_chat renders it, whatever the context
 * (/v1/messages/count_tokens).  -1 with err (no chat markers, a chat the renderer refuses). */
long srv_count_chat(srv_engine *e, const kchat_message *msgs, size_t n_msgs, const kchat_options *chat, oai_error *err);
/* r's output from go (end ids: go->n_end_ids nonzero asks for the model's; max_tokens, prompt and
 * stream from r).  Returns 0, or -1 with err (out of memory). */
int srv_prepare_output(krun_model *m, sreq *r, sgen_opts *go, oai_error *err);
/* Is the request over (its output complete)?  Does not wait. */
int  srv_done(srv_engine *e, sreq *r);
/* Hand a request to the engine (it takes a reference).  Fails with e filled: 503 when the
 * queue is full (with Retry-After) or the server is draining, 503 when the model is damaged. */
int  srv_submit(srv_engine *e, sreq *r, oai_error *err);
/* n requests at once (all or none): n > 1 choices, rs[0] first. */
int  srv_submit_n(srv_engine *e, sreq *const *rs, size_t n, oai_error *err);
/* A seed for a request without one (what srv_submit would pick). */
uint64_t srv_engine_fresh_seed(srv_engine *e);
/* Seconds to put in Retry-After when the server is busy. */
int  srv_retry_after(srv_engine *e);
/* The connection's side: wait until the status is known (started or over), or until the
 * client hangs up (then the request is cancelled).  Returns the status.  A request still
 * queued or reading its prompt after progress_every seconds is started then (200): its
 * stream carries progress comments until the first token (a failure after that is an
 * error event in the stream). */
int  srv_wait_started(srv_engine *e, sreq *r);
/* Copy up to max bytes of output into buf, waiting for some; 0 once the request is over and
 * everything was taken; -1 when the client hung up (the request is cancelled).  After
 * progress_every seconds without output, an SSE comment saying where the request is
 * (": prefill 1234/5000", ": queued", ": generating"): clients and proxies see it alive. */
long srv_read(srv_engine *e, sreq *r, char *buf, size_t max);
/* n > 1 streamed: the output of the choices rs[0..n) interleaved, whole events at a time (an
 * event cut by max is finished first: *cur names its request, -1 none; *nl: the last byte taken
 * was a newline).  Waits for some; 0 once every choice is over and everything was taken; -1
 * when the client hung up (every choice is cancelled).  rs[0]'s client is watched. */
long srv_read_choices(srv_engine *e, sreq *const *rs, size_t n, int *cur, int *nl, char *buf, size_t max);
/* After srv_read_choices returned 0: the usage of the n choices, as OpenAI counts it (the prompt
 * once, choice 0's cached tokens; completion tokens summed), and choice 0's output options (its
 * id, model, created, include_usage). */
void srv_choices_usage(srv_engine *e, sreq *const *rs, size_t n, long *prompt, long *completion, long *cached, const sgen_opts **o);
/* Wait until the request is over (r->out then holds the whole body), or the client hangs up. */
void srv_wait_done(srv_engine *e, sreq *r);
/* The output so far as one malloc'd string (*body), and the status; -1 if the client hung up. */
int  srv_take_body(srv_engine *e, sreq *r, char **body);
/* The client went away: the engine frees the sequence at the end of the sweep. */
void srv_cancel(srv_engine *e, sreq *r);
void srv_retain(srv_engine *e, sreq *r);
void srv_release(srv_engine *e, sreq *r);

/* Shutdown: refuse new requests (503); wait for the running ones and for their output to be
 * taken by their connections, at most timeout seconds (<0: forever) or until *interrupt becomes
 * non-zero; returns 1 if nothing is left. */
void srv_engine_drain(srv_engine *e);
int  srv_engine_wait_idle(srv_engine *e, double timeout, volatile int *interrupt);
/* Fail every queued and running request (503, "the server is shutting down"). */
void srv_engine_cancel_all(srv_engine *e);

/* GET /health: the model, the plan, live sequences, the queue, damage, counters.  *status:
 * 200, or 503 when the model is damaged. */
json_t *srv_engine_health(srv_engine *e, int *status);
/* The token index for constrained decoding, built on first use (about 0.1 s; immutable, freed
 * with the engine).  NULL with err on allocation failure. */
const struct kmask_index *srv_engine_mask_index(srv_engine *e, krun_err *err);
/* GET /metrics: the Prometheus text exposition (malloc'd; NULL on allocation failure). */
char *srv_engine_metrics(srv_engine *e);
/* Count a response by endpoint and status for /metrics. */
void srv_engine_count_response(srv_engine *e, int endpoint, int status);
enum { SRV_EP_CHAT, SRV_EP_COMPLETIONS, SRV_EP_MESSAGES, SRV_EP_COUNT_TOKENS, SRV_EP_TOKENIZE, SRV_EP_DETOKENIZE,
       SRV_EP_MODELS, SRV_EP_HEALTH, SRV_EP_METRICS, SRV_EP_MACHINE, SRV_EP_RESPONSES, SRV_EP_OLLAMA, SRV_EP_OTHER, SRV_N_EP };
/* The model's name in the API. */
const char *srv_engine_model_name(const srv_engine *e);
krun_model *srv_engine_model(srv_engine *e);
const char *srv_engine_command(const srv_engine *e);
int srv_engine_ctx_lenient(const srv_engine *e);
/* The reasoning effort of requests that choose none (a kchat_effort), or -1: the request's own default. */
int srv_engine_default_effort(const srv_engine *e);

/* A request's framing (serve_framing.c): fed its header fields in order, says whether its body's
 * length is certain and its header sound.  Refused (RFC 9112 6.1, 6.3; what a proxy in front may
 * have read otherwise): Content-Length values that disagree or are not one decimal number;
 * Transfer-Encoding with Content-Length; Transfer-Encoding in HTTP/1.0; Transfer-Encoding that is
 * not exactly one field "chunked" (libmicrohttpd decodes chunked only then, and otherwise reads the
 * body to the connection's end); a field name that is not a token (whitespace before the colon,
 * RFC 9112 5.1); a field value with a control character (RFC 9110 5.5); an HTTP/1.1 request
 * without exactly one valid Host (RFC 9112 3.2).  Codings before chunked (gzip, chunked): 501. */
typedef struct {
    unsigned long long cl;     /* the Content-Length value, when valid */
    int n_cl, cl_invalid, cl_differ;
    int n_te;                  /* Transfer-Encoding fields */
    int n_codings, n_chunked, last_chunked;
    int te_exact;              /* the first Transfer-Encoding field is exactly "chunked" (any case) */
    int n_host, host_invalid;
    int bad_name, bad_value;   /* a field name that is not a token; a value with a control character */
    int bad_line;              /* a method that is not a token, a target with a byte outside VCHAR */
    char bad[48];              /* ... its name, for the message */
} srv_framing;

void srv_framing_init(srv_framing *f);
/* A field: its name and value as libmicrohttpd holds them (value_len: its length, so that a NUL
 * inside it is seen). */
void srv_framing_header(srv_framing *f, const char *key, const char *value, size_t value_len);
/* The request line: its method, and whether its target as sent (before libmicrohttpd decodes it)
 * is sound, srv_framing_target_ok.  libmicrohttpd reads more than RFC 9112 3 allows (a target with
 * spaces, up to the last one; bytes past 0x7e; a method with control characters): refused, as a
 * proxy may have read the line otherwise (fuzz_http). */
void srv_framing_request_line(srv_framing *f, const char *method, int target_ok);
int  srv_framing_target_ok(const char *target);
/* 0: the length is certain and the header sound; else the HTTP status to refuse it with (400, or
 * 501 for a coding other than chunked), msg saying why. */
int  srv_framing_verdict(const srv_framing *f, int http_1_0, char *msg, size_t len);

/* The connections (serve_conns.c).  A request must arrive whole within request_timeout seconds
 * of its first byte; when the open connections come within a reserve (srv_conns_reserve) of
 * max_connections, or of per_ip from one address, the connection that has waited longest for a
 * request (half a second at least) is closed to make room.  The limits themselves are MHD's. */
typedef struct {
    unsigned max_connections;  /* open connections at most */
    unsigned per_ip;           /* from one address at most; 0: no limit */
    double request_timeout;    /* seconds */
} srv_conns_opts;
typedef struct srv_conns srv_conns;
typedef struct srv_conn srv_conn;

/* The connections kept free of slow and silent ones under a limit: limit/8, at least 2. */
unsigned srv_conns_reserve(unsigned limit);
int  srv_conns_start(const srv_conns_opts *o, srv_conns **out, krun_err *err);
/* After every connection is closed (MHD stopped). */
void srv_conns_stop(srv_conns *t);
/* A connection accepted (MHD's notify callback; sa: the client's address).  NULL when out of
 * memory: then it is not watched. */
srv_conn *srv_conn_open(srv_conns *t, int fd, const struct sockaddr *sa);
void srv_conn_close(srv_conns *t, srv_conn *c);
/* Its request arrived whole / its response is over (it waits for the next request). */
void srv_conn_busy(srv_conns *t, srv_conn *c);
void srv_conn_waiting(srv_conns *t, srv_conn *c);
/* {"open", "busy", "waiting", limits, "accepted", "timed_out", "made_room", ...} for /health. */
json_t *srv_conns_json(srv_conns *t);

/* Stored responses (serve_store.c): at most cap of them (0: none kept), and at most 256 MB of JSON,
 * least recently used out.  Thread-safe; what comes out is a copy (a new reference). */
typedef struct srv_store srv_store;
srv_store *srv_store_new(size_t cap);
void srv_store_free(srv_store *s);
/* Keep (or replace) response id: the response object, its conversation (the items before it, its
 * input and its output: what previous_response_id continues), its input items.  0, or -1 (memory). */
int srv_store_put(srv_store *s, const char *id, const json_t *response, const json_t *conversation, const json_t *input);
json_t *srv_store_response(srv_store *s, const char *id);          /* NULL: none */
json_t *srv_store_conversation(srv_store *s, const char *id);
json_t *srv_store_input(srv_store *s, const char *id);
int srv_store_delete(srv_store *s, const char *id);                /* 1 if it was there */
json_t *srv_store_json(srv_store *s);                              /* for /health */
/* The memory requests take while they are read and prepared (serve_mem.c; docs/SERVE.md,
 * "Memory"): a request's share is SRV_MEM_PER_BYTE bytes per byte of its body plus SRV_MEM_BASE,
 * reserved from the server's limit before the body is read; of it, the JSON tree may take
 * SRV_MEM_JSON_PER_BYTE per byte plus SRV_MEM_BASE / 2 (jansson's allocations on the thread are
 * counted; past that they fail, and the request is refused 413). */
#define SRV_MEM_PER_BYTE 32
#define SRV_MEM_JSON_PER_BYTE 24
#define SRV_MEM_BASE ((size_t)1 << 20)
typedef struct srv_mem srv_mem;
/* jansson's allocations through the counting functions: once, before any thread uses jansson. */
void    srv_mem_install(void);
size_t  srv_mem_share(size_t body);
srv_mem *srv_mem_new(size_t cap);
void    srv_mem_free(srv_mem *m);
/* Reserve n bytes, waiting up to seconds for room; -1 when there is none by then (or n > the limit). */
int     srv_mem_reserve(srv_mem *m, size_t n, double seconds);
void    srv_mem_release(srv_mem *m, size_t n);
/* {"limit", "reserved", "peak", "waited", "refused"} for /health. */
json_t *srv_mem_json(srv_mem *m);
/* This thread's jansson allocations counted from now, at most cap bytes; over: one failed. */
void    srv_mem_scope_begin(size_t cap);
int     srv_mem_scope_over(void);
/* Not counted between pause and resume: what the server copies of its own (a stored conversation
 * previous_response_id continues), whose size the request's body does not bound. */
int     srv_mem_scope_pause(void);
void    srv_mem_scope_resume(int was);
void    srv_mem_scope_end(void);

/* The HTTP side (serve_http.c). */
typedef struct srv_http_opts {
    const char *api_key;       /* NULL: no auth */
    size_t max_body;           /* bytes */
    size_t request_memory;     /* what requests being read and prepared may reserve in all (serve_mem.c) */
    int listen_fd;             /* a bound, listening socket */
    unsigned max_connections;
    unsigned max_connections_per_ip;   /* 0: no limit */
    unsigned idle_timeout;     /* seconds a connection may stay idle */
    double request_timeout;    /* seconds for a request to arrive whole, from its first byte */
    const char *const *cors;   /* origins browsers may call from ("*": any); none: no CORS headers */
    size_t n_cors;
    size_t responses_store;    /* stored responses kept (POST /v1/responses), at most */
    int no_ui;                 /* GET / is a 404 (--no-ui) */
} srv_http_opts;

typedef struct srv_http srv_http;
int  srv_http_start(srv_engine *e, const srv_http_opts *o, srv_http **out, krun_err *err);
/* Stop accepting connections (the listening socket is closed); connections in progress go on. */
void srv_http_quiesce(srv_http *h);
void srv_http_stop(srv_http *h);

/* The page (serve_ui.c): GET /'s response, its status (200, or 304 when the request's
 * If-None-Match names this page) in *status; NULL when out of memory. */
struct MHD_Connection;
struct MHD_Response;
struct MHD_Response *srv_ui_response(struct MHD_Connection *c, unsigned *status);
/* GET /machine (serve_machine.c): the member files' bytes and busy seconds, the bytes read by
 * kind, the expert cache's hits, memory; api_key: the server has one; loopback: it listens on
 * a loopback address only (otherwise, without a key, anyone who reaches the port is served). */
json_t *srv_machine_json(srv_engine *e, int api_key, int loopback);
/* 1 when the listening socket fd is bound to a loopback address (127/8, ::1, ::ffff:127/104). */
int srv_listen_loopback(int fd);

#endif
