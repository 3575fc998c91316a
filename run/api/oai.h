/* The OpenAI HTTP API's JSON, without HTTP or an engine: parsing and validating request bodies of
 * POST /v1/chat/completions and POST /v1/completions into what krun needs (a chat for
 * kchat_render, sampling settings), and building response bodies and server-sent-event chunks.
 *
 * Every parser takes arbitrary bytes (it is fuzzed): malformed JSON, wrong types, unknown roles,
 * missing fields and out-of-range values give an OpenAI error object
 *   {"error": {"message", "type": "invalid_request_error", "param", "code"}}
 * and the HTTP status to answer with.  Unknown fields are ignored, as most OpenAI-compatible
 * servers do; fields krun cannot honour (logit_bias, suffix, best_of > 1, non-text content parts) are
 * errors rather than silently ignored. */
#ifndef KRUN_OAI_H
#define KRUN_OAI_H
#include "run/text/chat.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int status;               /* HTTP status to answer with (400, 404, 413, ...) */
    char message[512];
    char param[128];          /* the offending field ("messages[2].role"); "" = null */
    const char *type;         /* "invalid_request_error", ... */
    const char *code;         /* a short code ("invalid_value", "model_not_found") or NULL */
} oai_error;

/* Fill e (printf-style message).  type defaults to "invalid_request_error" for 4xx and
 * "server_error" for 5xx. */
void oai_error_set(oai_error *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* {"error": {...}} as malloc'd JSON text (NULL on allocation failure). */
char *oai_error_json(const oai_error *e);

/* Sampling and limits common to both endpoints.  has_* say whether the client gave the field. */
typedef struct {
    char *model;              /* NULL when absent */
    long max_tokens;          /* -1: absent (max_completion_tokens wins over max_tokens) */
    double temperature;       /* OpenAI default 1 */
    double top_p;             /* default 1 */
    int64_t seed;
    int has_temperature, has_top_p, has_seed;
    char **stop;              /* stop strings (at most 4, non-empty) */
    size_t n_stop;
    int stream;
    int include_usage;        /* stream_options.include_usage */
    /* extensions, spelled as vLLM takes them */
    long top_k;               /* 0: off (-1 is taken as off too) */
    double min_p;             /* 0: off */
    int ignore_eos;           /* generate past the model's end-of-message ids */
    int return_token_ids;     /* the response carries prompt_token_ids and choices[].token_ids */
    /* penalties: 0, 0, 1 = off (sampler.h) */
    double presence_penalty, frequency_penalty, repetition_penalty;
    int logprobs;             /* report each generated token's log-probability */
    int top_logprobs;         /* and this many alternatives (0 .. OAI_MAX_TOP_LOGPROBS) */
    int n;                    /* choices (1 .. OAI_MAX_N): choice i is the request with seed + i */
    long speculative;         /* krun's: drafts per verification at most (0: none; true: the server's
                                 --spec; false: 0); -1: absent (the server's) */
} oai_sampling;
#define OAI_MAX_N 16
#define OAI_MAX_TOP_LOGPROBS 20

typedef struct {
    kchat_message *messages;  /* ready for kchat_render */
    size_t n_messages;
    kchat_options chat;       /* thinking / effort from reasoning_effort (or chat_template_kwargs), tools */
    oai_sampling s;
    void *own;                /* everything the pointers above point into */
} oai_chat_request;

/* Parse a /v1/chat/completions body.  Returns 0, or -1 with e filled (status 400, or 500 on
 * allocation failure).  On success free with oai_chat_request_free.
 * reasoning_effort: "none" -> thinking off; "minimal", "low" -> low; "medium", "high" -> high;
 * "max", "xhigh" -> max; absent -> thinking on, max.  chat_template_kwargs {"thinking": bool,
 * "thinking_effort": "low"|"high"|"max"|null} (as vLLM and SGLang take it) overrides it; a null
 * thinking_effort means no effort message. */
int  oai_parse_chat_request(const char *body, size_t len, oai_chat_request *req, oai_error *e);
void oai_chat_request_free(oai_chat_request *req);

typedef struct {
    char *prompt;             /* text prompt (NUL-terminated, prompt_len bytes), or NULL */
    size_t prompt_len;
    int32_t *prompt_ids;      /* token-id prompt, or NULL */
    size_t n_prompt_ids;
    oai_sampling s;           /* max_tokens defaults to 16 here, as in OpenAI's API (0 allowed with echo) */
    int echo;                 /* the prompt's text (and with logprobs its tokens' log-probabilities) first */
    void *own;
} oai_completion_request;

/* Parse a /v1/completions body.  prompt: a string, an array of one string, an array of token ids
 * or an array of one such array; ids must be < vocab.  Returns 0 or -1 with e. */
int  oai_parse_completion_request(const char *body, size_t len, size_t vocab, oai_completion_request *req,
                                  oai_error *e);
void oai_completion_request_free(oai_completion_request *req);

/* 404 model_not_found unless requested is NULL or equals served.  Returns 0 or -1 with e. */
int  oai_check_model(const char *requested, const char *served, oai_error *e);

/* ---- responses (malloc'd JSON text; NULL on allocation failure) ---------------------------- */

typedef struct {
    const char *id;           /* "chatcmpl-..." / "cmpl-..." */
    const char *model;
    long long created;        /* Unix seconds */
} oai_meta;

typedef struct {
    const char *content;      /* may contain ill-formed UTF-8: shown as U+FFFD */
    size_t content_len;
    const char *reasoning;    /* reasoning_content; NULL: omitted */
    size_t reasoning_len;
    const kchat_call *calls;
    size_t n_calls;
    const char *const *call_ids;   /* one id per call ("call_..."), chosen by the server */
    const char *finish_reason;     /* "stop" | "length" | "tool_calls" */
    long prompt_tokens, completion_tokens;
    long cached_tokens;            /* of the prompt's, those a prefix cache held (usage.prompt_tokens_details) */
} oai_chat_result;

/* The non-streaming chat.completion object. */
char *oai_chat_response(const oai_meta *m, const oai_chat_result *r);
/* The text_completion object. */
char *oai_completion_response(const oai_meta *m, const char *text, size_t len, const char *finish_reason,
                              long prompt_tokens, long completion_tokens, long cached_tokens);

/* Server-sent events, each "data: {chat.completion.chunk}\n\n":
 *  - the first, with the assistant role and empty content;
 *  - one per parser event: reasoning_content / content deltas, a tool call's header (id, type,
 *    name, empty arguments) and its arguments (call_id: the server's id for ev->index); NULL
 *    (and *none = 1) for an event that needs no chunk;
 *  - the last, with an empty delta and finish_reason;
 *  - with stream_options.include_usage, a usage chunk (empty choices);
 *  (usage everywhere: prompt_tokens, completion_tokens, total_tokens and
 *  prompt_tokens_details.cached_tokens, the prompt positions a prefix cache held, as OpenAI's)
 *  - then OAI_SSE_DONE. */
char *oai_sse_chat_role(const oai_meta *m);
char *oai_sse_chat_event(const oai_meta *m, const kchat_event *ev, const char *call_id, int *none);
char *oai_sse_chat_finish(const oai_meta *m, const char *finish_reason);
char *oai_sse_usage(const oai_meta *m, int chat, long prompt_tokens, long completion_tokens, long cached_tokens);
/* A text_completion chunk: text (may be empty) and finish_reason (NULL while going on). */
char *oai_sse_completion(const oai_meta *m, const char *text, size_t len, const char *finish_reason);
#define OAI_SSE_DONE "data: [DONE]\n\n"

/* GET /v1/models: {"object": "list", "data": [{"id", "object": "model", "created", "owned_by"}]}. */
char *oai_models_response(const char *model, long long created, const char *owned_by);

/* One fuzzing input (libFuzzer's LLVMFuzzerTestOneInput or AFL can call it as is): data goes
 * through both request parsers, what parses is rendered (text only) and its stream options
 * answered, the error objects are built, and data is also read as a model reply (text, thinking
 * on and off) whose events become SSE chunks.  Returns the number of inconsistencies found (an
 * error without a status or message, a reply the parser rejects): 0.  Crashes and sanitizer
 * reports are the other findings. */
int oai_fuzz_one(const uint8_t *data, size_t n);

#endif
