/* The OpenAI Responses API's JSON (POST /v1/responses, GET / DELETE /v1/responses/ID), without HTTP
 * or an engine: a request body parsed into a chat (the same structures as the chat endpoint, oai.h),
 * and the reply -- which the server produces as a chat completion, whole or streamed -- written as
 * a response object or as the Responses event stream.
 *
 * Requests: model, input (a string, or items: messages of role user / system / developer /
 * assistant with input_text / output_text parts, function_call, function_call_output, reasoning),
 * instructions, tools (function tools, strict by default as OpenAI has it, and namespaces of them,
 * declared NAMESPACE.NAME; OpenAI's hosted tools -- web_search, file_search, ... -- accepted and
 * not offered: krun has none to run), tool_choice, parallel_tool_calls, text.format (text,
 * json_object, json_schema: constrained decoding), max_output_tokens, reasoning {effort, summary},
 * temperature, top_p, stream, store, previous_response_id, include
 * ["reasoning.encrypted_content"], metadata, user, truncation, and krun's seed.  What krun cannot
 * honour (images, files, custom tools, background, logprobs, ...) is a 400 naming it.
 *
 * Output: a reasoning item (K3's think channel as reasoning_text content; no summary: K3 writes
 * none), a message item with output_text, function_call items; status completed or incomplete
 * (max_output_tokens); usage with input_tokens_details.cached_tokens and
 * output_tokens_details.reasoning_tokens.  Streamed: response.created, response.in_progress,
 * output_item.added / done, content_part.added / done, reasoning_text.delta / done,
 * output_text.delta / done, function_call_arguments.delta / done, response.completed or
 * response.incomplete, each with its sequence_number; a failure after the start is an `error`
 * event and response.failed.
 *
 * Every parser takes arbitrary bytes (it is fuzzed). */
#ifndef KRUN_RESPONSES_H
#define KRUN_RESPONSES_H

#include "oai.h"
#include "run/text/jsontext.h"

#include <jansson.h>

typedef struct {
    kchat_message *messages;   /* the conversation: previous_response_id's, instructions, this input */
    size_t n_messages;
    kchat_options chat;
    oai_sampling s;
    int store;                 /* keep the response (default true) */
    const char *previous_response_id;   /* NULL: none */
    int encrypted_reasoning;   /* include "reasoning.encrypted_content": reasoning items carry it */
    json_t *echo;              /* the request's settings as the response object shows them (owned) */
    json_t *input;             /* this request's input as items (owned): stored with the response */
    json_t *prior;             /* previous_response_id's conversation (owned: the messages point into it) */
    void *own;
} oresp_request;

/* The stored conversation of a previous response (its input items and output items, those of the
 * responses before it first), a new reference; NULL when there is no such response. */
typedef json_t *(*oresp_lookup)(void *ctx, const char *id);

/* Parse a /v1/responses body.  Returns 0, or -1 with e (400; 404 for an unknown previous_response_id,
 * code previous_response_not_found, as OpenAI answers; 500 out of memory). */
int  oresp_parse_request(const char *body, size_t len, oresp_lookup lookup, void *ctx, oresp_request *req, oai_error *e);
void oresp_request_free(oresp_request *req);

/* A response object made from a chat.completion body (what the chat endpoint answers for the same
 * request): output items, status, usage.  m: id ("resp_..."), model, created.  *items: the output
 * items (a new reference; may be NULL).  NULL on allocation failure or a body that is not one. */
json_t *oresp_from_chat(const oai_meta *m, const json_t *echo, const char *chat_body, size_t len, int encrypted_reasoning);

/* The streamed chat completion (its SSE chunks, in any pieces) as the Responses event stream. */
typedef struct oresp_stream oresp_stream;
oresp_stream *oresp_stream_new(const oai_meta *m, json_t *echo, int encrypted_reasoning);
/* Appends the events for bytes p[0..n) to out.  Returns 1 once the stream is over (the final event
 * written), 0 to go on, -1 on allocation failure. */
int  oresp_stream_feed(oresp_stream *s, const char *p, size_t n, kbuf *out);
/* The response object, once over (NULL before; borrowed). */
const json_t *oresp_stream_response(const oresp_stream *s);
void oresp_stream_free(oresp_stream *s);

/* {"id", "object": "response.deleted", "deleted": true} */
char *oresp_deleted_json(const char *id);
/* GET /v1/responses/ID/input_items: {"object": "list", "data", "first_id", "last_id", "has_more"}. */
char *oresp_input_items_json(const json_t *input);

/* One fuzzing input: the request parser (with and without a previous conversation), what parses
 * rendered (text only) and its constraint built; data also fed as a chat stream to the transcoder
 * and as a chat body to oresp_from_chat.  Returns the number of inconsistencies found: 0. */
int oresp_fuzz_one(const uint8_t *data, size_t n);

#endif
