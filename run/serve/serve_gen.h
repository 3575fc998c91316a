/* One request's output, token by token: what krun serve sends for the ids a
 * sequence generates.  Chat replies go through the K3 reply parser
 * (reasoning_content, content, tool calls), completions are the tokens' bytes;
 * content is cut at the request's stop strings; the end ids, max_tokens and
 * the stop strings end the request.  Streamed requests get server-sent-event
 * chunks as they become certain, the others one JSON body at the end.
 *
 * Nothing here needs the model, only the tokenizer, so the whole path from ids
 * to bytes on the wire is tested without one (tests/unit/test_serve_gen.c). */
#ifndef KRUN_SERVE_GEN_H
#define KRUN_SERVE_GEN_H

#include "run/text/jsontext.h"
#include "run/api/oai.h"
#include "run/text/tokenizer.h"

#include <stddef.h>
#include <stdint.h>

typedef struct sgen_opts {
    int chat;                  /* a chat.completion (else a text_completion) */
    int thinking;              /* chat: the generation prompt opened the think channel */
    int stream, include_usage, return_token_ids;
    char *const *stop;         /* stop strings (applied to content, or to a completion's text; copied) */
    size_t n_stop;
    const int32_t *end_ids;    /* ids that end the reply (the model's end-of-message ids; copied); none with ignore_eos */
    size_t n_end_ids;
    long max_tokens;           /* generated tokens at most */
    oai_meta meta;             /* id, model, created (the strings are copied) */
    const int32_t *prompt_ids; /* for return_token_ids (copied) */
    size_t n_prompt;
    int logprobs;              /* choices[0].logprobs in the body (sgen_logprob gives them) */
    int anthropic;             /* chat: the body is an Anthropic message (anth.h), not a chat.completion */
    int index;                 /* the choice's index (n > 1: choice i is its own sgen) */
    int choice_of_n;           /* streamed, one of n > 1 choices: no usage chunk and no [DONE] (the stream's, once) */
    int echo;                  /* completions: the prompt's text first (sgen_echo) */
} sgen_opts;

typedef struct sgen sgen;

/* NULL on allocation failure (or a chat request with a tokenizer that lacks the chat markers).
 * Nothing o points to is used after sgen_new returns: the request that made o may be freed
 * while its output is still being generated (a stream, a client that hung up).  Only tk is
 * borrowed (the model's, alive as long as the server). */
sgen *sgen_new(const ktok *tk, const sgen_opts *o);
void sgen_free(sgen *g);

/* The prompt tokens a prefix cache held (usage.prompt_tokens_details.cached_tokens; 0 by default). */
void sgen_set_cached(sgen *g, size_t n);

/* One generated id.  Returns 1 when the request is complete (an end id, a
 * stop string, max_tokens), 0 to go on, -1 on allocation failure. */
int sgen_token(sgen *g, int32_t id);
/* Before sgen_token(id), with logprobs asked for: the id's log-probability and its n (at most
 * OAI_MAX_TOP_LOGPROBS) most likely alternatives, the most likely first.  The non-streamed
 * response carries them (choices[0].logprobs, OpenAI's shapes).  Returns 0, -1 on allocation failure. */
int sgen_logprob(sgen *g, int32_t id, double lp, const int32_t *top_ids, const double *top_lp, size_t n);
/* Streamed, each chunk carries the entries of the tokens given since the last chunk that did
 * (choices[0].logprobs in OpenAI's streamed shapes): together they are the non-streamed list.
 * Echo with logprobs: the prompt's entries come first, the first token's without a
 * log-probability (null, as OpenAI and vLLM show it): sgen_logprob_null. */
int sgen_logprob_null(sgen *g, int32_t id);
/* The first n logprob entries of src (the prompt's, echo) as dst's first (dst has none yet):
 * choice i > 0 of n copies choice 0's prompt.  0, or -1 (src has fewer, or out of memory). */
int sgen_copy_logprobs(sgen *dst, const sgen *src, size_t n);
/* Echo (completions): the prompt ids' text (and the prompt's logprob entries given so far)
 * before the completion's, once the prompt has run.  Returns 0, -1 on allocation failure. */
int sgen_echo(sgen *g, const int32_t *ids, size_t n);
/* The generation stopped for another reason (the context is full: "length").
 * Builds the end of the output.  No-op once complete. */
void sgen_end(sgen *g, const char *finish_reason);
/* The request failed: a streamed reply that has started gets an error event
 * and [DONE]; otherwise the response is e's status and error object. */
void sgen_fail(sgen *g, const oai_error *e);

/* The HTTP stream was opened (200) before any output, to carry progress
 * comments: a failure from now on is an error event in it, not a status. */
void sgen_stream_opened(sgen *g);
int sgen_done(const sgen *g);              /* complete or failed: no more output */
int sgen_started(const sgen *g);           /* a streamed reply has output: its status is 200, whatever comes */
/* Append the bytes ready to send to out and forget them. */
void sgen_take(sgen *g, kbuf *out);
int sgen_status(const sgen *g);            /* the HTTP status of the response */
const sgen_opts *sgen_options(const sgen *g);   /* as given (its strings the sgen's copies) */
size_t sgen_cached(const sgen *g);         /* sgen_set_cached's */
const char *sgen_finish_reason(const sgen *g);   /* NULL until complete */
size_t sgen_n_tokens(const sgen *g);       /* ids generated */
const int32_t *sgen_tokens(const sgen *g);

#endif
