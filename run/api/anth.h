/* The Anthropic Messages API's JSON (POST /v1/messages, /v1/messages/count_tokens), without HTTP
 * or an engine: a request body parsed into what krun needs (a chat for kchat_render, sampling
 * settings; the same structures as the OpenAI layer, oai.h), and the response bodies, the
 * server-sent events of a streamed message and the error object in Anthropic's shapes.
 *
 * Requests: model, max_tokens (required), messages (user / assistant, content a string or blocks:
 * text, tool_use, tool_result, thinking, redacted_thinking), system (a string or text blocks),
 * tools ({name, description, input_schema}), tool_choice ({type: auto | any | tool | none, name}),
 * thinking ({type: enabled, budget_tokens} | {type: disabled}), stop_sequences, temperature,
 * top_p, top_k, stream, metadata (ignored); and, as krun's own extensions, seed.  What krun cannot
 * honour (images, documents, server tools, ...) is refused, naming the field.  Errors are HTTP
 * 4xx with {"type": "error", "error": {"type", "message"}}, the message naming the field as
 * Anthropic does ("messages.1.content.0.type: ...").
 *
 * Every parser takes arbitrary bytes (it is fuzzed). */
#ifndef KRUN_ANTH_H
#define KRUN_ANTH_H

#include "oai.h"

typedef struct {
    kchat_message *messages;  /* ready for kchat_render */
    size_t n_messages;
    kchat_options chat;       /* thinking, tools (as an OpenAI tools array), tool_choice */
    oai_sampling s;           /* model, max_tokens, temperature, top_p, top_k, stop_sequences, stream, seed */
    int budget_tokens;        /* thinking: the budget asked for (it picks the effort: docs/SERVE.md), 0 without thinking */
    void *own;
} anth_request;

/* Parse a /v1/messages body (count_tokens: a /v1/messages/count_tokens body, which has no
 * max_tokens).  Returns 0, or -1 with e (status 400, or 500 on allocation failure; the message
 * names the field).  Free with anth_request_free. */
int  anth_parse_request(const char *body, size_t len, int count_tokens, anth_request *req, oai_error *e);
void anth_request_free(anth_request *req);

/* {"type": "error", "error": {"type", "message"}}: the type from the HTTP status
 * (invalid_request_error, authentication_error, not_found_error, request_too_large, ...). */
char *anth_error_json(const oai_error *e);

/* ---- responses (malloc'd; NULL on allocation failure) -------------------------------------- */

/* A whole message: thinking block (when reasoning is not NULL), text block (when there is text, or
 * nothing else), tool_use blocks; stop_reason end_turn / max_tokens / stop_sequence / tool_use. */
typedef struct {
    const char *reasoning;    /* NULL: thinking was off */
    size_t reasoning_len;
    const char *text;
    size_t text_len;
    const kchat_call *calls;
    size_t n_calls;
    const char *const *call_ids;
    const char *stop_reason;
    const char *stop_sequence;    /* the stop sequence that ended it, or NULL */
    long input_tokens, output_tokens;
} anth_result;
char *anth_message_response(const oai_meta *m, const anth_result *r);
/* {"input_tokens": n} */
char *anth_count_tokens_response(long input_tokens);

/* Server-sent events: "event: NAME\ndata: JSON\n\n". */
char *anth_sse_message_start(const oai_meta *m, long input_tokens);   /* message_start, then a ping */
/* content_block_start of a thinking / text block (index), or of a tool_use block (id, name). */
char *anth_sse_block_start(int index, const char *type, const char *id, const char *name);
/* content_block_delta: thinking_delta, text_delta or input_json_delta (kind: "thinking", "text", "json"). */
char *anth_sse_delta(int index, const char *kind, const char *text, size_t len);
char *anth_sse_block_stop(int index);
/* message_delta (stop_reason, stop_sequence, usage.output_tokens), then message_stop. */
char *anth_sse_message_end(const char *stop_reason, const char *stop_sequence, long output_tokens);
/* An error event in a started stream. */
char *anth_sse_error(const oai_error *e);

/* The OpenAI finish_reason as Anthropic's stop_reason (stop with a stop string: stop_sequence). */
const char *anth_stop_reason(const char *finish_reason, int stop_string);

/* One fuzzing input: both request forms parsed, what parses rendered (text) and its constraint
 * built, the error objects made.  Returns the number of inconsistencies found: 0. */
int anth_fuzz_one(const uint8_t *data, size_t n);

#endif
