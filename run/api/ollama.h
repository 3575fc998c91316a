/* Ollama's API (POST /api/chat, /api/generate, /api/show; GET /api/tags, /api/version), for the
 * local apps that speak it (Open WebUI, Continue, editor plugins, the ollama npm client): request
 * bodies parsed into a chat or a prompt (the structures of oai.h), and the server's chat or text
 * completion -- whole or streamed -- written as Ollama's objects and NDJSON lines.
 *
 * /api/chat: model, messages (system, user, assistant with thinking and tool_calls, tool with
 * tool_name), tools (OpenAI's function shape), format ("json" or a JSON Schema: constrained
 * decoding), options (temperature, top_p, top_k, min_p, seed, num_predict, stop, repeat_penalty,
 * presence_penalty, frequency_penalty; the others, num_ctx included, do not change a reply here
 * and are ignored), stream (default true), think (true, false, "low", "medium", "high"; default
 * on), keep_alive (ignored).  /api/generate: prompt, system, the same settings; raw: the prompt as
 * it is (a completion, special tokens honoured).  Images, suffix, template and context are a 400
 * naming them.  Errors are {"error": MESSAGE} with the HTTP status. */
#ifndef KRUN_OLLAMA_H
#define KRUN_OLLAMA_H

#include "oai.h"
#include "run/text/jsontext.h"

typedef struct {
    kchat_message *messages;   /* chat (and generate without raw) */
    size_t n_messages;
    kchat_options chat;
    oai_sampling s;            /* stream defaults to true; include_usage on (the counts come from it) */
    int raw;                   /* generate raw: prompt is the whole text */
    const char *prompt;
    size_t prompt_len;
    void *own;
} ollama_request;

int  ollama_parse_chat(const char *body, size_t len, ollama_request *r, oai_error *e);
int  ollama_parse_generate(const char *body, size_t len, ollama_request *r, oai_error *e);
void ollama_request_free(ollama_request *r);
/* A model name as Ollama clients send it ("rt", "rt:latest") against the one served: 404 otherwise. */
int  ollama_check_model(const char *requested, const char *served, oai_error *e);
/* {"error": MESSAGE} */
char *ollama_error_json(const oai_error *e);

/* What a response says besides the reply: the model's name, when the request arrived (Unix
 * seconds, for created_at; a monotonic clock's seconds, for the durations). */
typedef struct {
    const char *model;
    double unix_start, start;
} ollama_meta;

/* The reply of a chat completion (generate: a "response" object; raw: from a text completion) as
 * Ollama's object; NULL for a body that is none (or out of memory). */
char *ollama_from_completion(const ollama_meta *m, int generate, const char *body, size_t len, double now);

typedef struct ollama_stream ollama_stream;
ollama_stream *ollama_stream_new(const ollama_meta *m, int generate);
/* The chat (or text) completion's SSE bytes in any pieces, as NDJSON lines appended to out.
 * Returns 1 once the last line ("done": true, or an error) is written, 0 to go on, -1 out of memory. */
int  ollama_stream_feed(ollama_stream *s, const char *p, size_t n, double now, kbuf *out);
void ollama_stream_free(ollama_stream *s);

/* GET /api/tags, POST /api/show, GET /api/version. */
char *ollama_tags_json(const char *model, long long modified, unsigned long long size, const char *family);
char *ollama_show_json(const char *model, long long modified, size_t ctx, const char *family);
char *ollama_version_json(void);

/* One fuzzing input: both parsers, what parses rendered, the output converters.  Returns the number
 * of inconsistencies found: 0. */
int ollama_fuzz_one(const uint8_t *data, size_t n);

#endif
