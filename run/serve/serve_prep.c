/* One API request body made ready for the engine (serve.h, srv_prepare):
 * parsed, its model checked, rendered (chat) or tokenized (completion), fitted
 * to the context, its sampling and its output (sgen) set.  krun serve's HTTP
 * side and krun batch both make their requests here, so that the same body
 * gives the same prompt ids, sampling and output bytes on either. */
#include "serve.h"

#include "run/text/chat.h"
#include "run/grammar/chat_constrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A request that was never submitted (it has no engine yet). */
void sreq_discard(sreq *r)
{
    if (!r) return;
    sgen_free(r->gen);
    kgram_free(r->gram);
    free(r->prompt);
    kbuf_free(&r->out);
    pthread_cond_destroy(&r->cv);
    free(r);
}

static void sampling_of(const oai_sampling *s, sreq *r)
{
    ksampler_opts_init(&r->sampling);
    r->sampling.temp = s->has_temperature ? (float)s->temperature : 1.0f;
    r->sampling.top_k = (int)s->top_k;
    r->sampling.top_p = (float)s->top_p;
    r->sampling.min_p = (float)s->min_p;
    r->sampling.seed = (uint64_t)s->seed;
    r->sampling.presence_penalty = (float)s->presence_penalty;
    r->sampling.frequency_penalty = (float)s->frequency_penalty;
    r->sampling.repetition_penalty = s->repetition_penalty > 0 ? (float)s->repetition_penalty : 1.0f;
    r->has_seed = s->has_seed;
    r->logprobs = s->logprobs;
    r->top_logprobs = s->top_logprobs;
    r->spec = s->speculative < 0 ? SIZE_MAX : (size_t)s->speculative;
}

/* The reply's constraint (response_format, a named tool_choice, strict tools): compiled into
 * r->gram, with the engine's token index.  A refused schema keyword is a 400 naming it. */
static int constrain(srv_engine *e, const kchat_options *o, sreq *r, oai_error *err)
{
    char param[128], msg[400];
    krun_err kerr;
    if (kchat_constraint(o, &r->gram, param, sizeof param, msg, sizeof msg)) {
        oai_error_set(err, 400, param, "unsupported_schema", "%s", msg);
        return -1;
    }
    if (r->gram && !(r->mask_index = srv_engine_mask_index(e, &kerr))) {
        oai_error_set(err, 500, NULL, NULL, "%s", kerr.msg);
        return -1;
    }
    return 0;
}

/* Does the prompt fit the context, with max_tokens?  Sets r->max_tokens. */
static int fit_context(srv_engine *e, sreq *r, long max_tokens, oai_error *err)
{
    size_t ctx = krun_model_ctx(srv_engine_model(e));
    const char *cmd = srv_engine_command(e);       /* whose --ctx set it: krun serve's, krun batch's */
    if (r->n_prompt > ctx) {
        oai_error_set(err, 400, "messages", "context_length_exceeded",
                      "the prompt is %zu tokens, more than the context of %zu positions (%s --ctx)", r->n_prompt, ctx, cmd);
        return -1;
    }
    /* the last token generated is never run: a request uses n_prompt + max_tokens - 1 positions */
    if (max_tokens < 0) max_tokens = (long)(ctx - r->n_prompt + 1);
    if (max_tokens > 0 && (size_t)max_tokens - 1 > ctx - r->n_prompt) {
        oai_error_set(err, 400, "max_tokens", "context_length_exceeded",
                      "the prompt (%zu tokens) and max_tokens %ld need %zu positions; the context is %zu (%s --ctx)",
                      r->n_prompt, max_tokens, r->n_prompt + (size_t)max_tokens - 1, ctx, cmd);
        return -1;
    }
    r->max_tokens = max_tokens;
    return 0;
}

/* The output of r: go's stop strings, end ids and limits (copied by sgen_new). */
int srv_prepare_output(krun_model *m, sreq *r, sgen_opts *go, oai_error *err)
{
    int32_t end_ids[3];
    go->end_ids = end_ids;
    go->n_end_ids = go->n_end_ids ? krun_model_stop_ids(m, end_ids) : 0;
    go->max_tokens = r->max_tokens;
    go->prompt_ids = r->prompt;
    go->n_prompt = r->n_prompt;
    r->stream = go->stream;
    r->gen = sgen_new(krun_model_tokenizer(m), go);
    if (!r->gen) {
        oai_error_set(err, 500, NULL, NULL, "out of memory");
        return -1;
    }
    snprintf(r->id, sizeof r->id, "%s", go->meta.id);
    return 0;
}

/* The chat rendered to ids (the tokenizer's chat markers checked).  0, or -1 with err. */
static int render(srv_engine *e, const kchat_message *msgs, size_t n_msgs, const kchat_options *chat, kchat_rendering *rend,
                  oai_error *err)
{
    const ktok *tk = krun_model_tokenizer(srv_engine_model(e));
    krun_err rerr;
    if (ktok_find_special(tk, KCHAT_OPEN) < 0 || ktok_find_special(tk, KCHAT_END_OF_MSG) < 0) {
        oai_error_set(err, 400, NULL, "chat_unsupported", "this model's tokenizer has no chat markers (%s, %s): use /v1/completions",
                      KCHAT_OPEN, KCHAT_END_OF_MSG);
        return -1;
    }
    if (kchat_render(tk, msgs, n_msgs, chat, rend, &rerr)) {
        oai_error_set(err, 400, NULL, "invalid_value", "%s", rerr.msg);
        return -1;
    }
    free(rend->text);
    rend->text = NULL;
    return 0;
}

long srv_count_chat(srv_engine *e, const kchat_message *msgs, size_t n_msgs, const kchat_options *chat, oai_error *err)
{
    kchat_rendering rend;
    if (render(e, msgs, n_msgs, chat, &rend, err)) return -1;
    free(rend.ids);
    return (long)rend.n_ids;
}

sreq *srv_prepare_chat(srv_engine *e, const kchat_message *msgs, size_t n_msgs, const kchat_options *chat, const oai_sampling *s,
                       oai_error *err)
{
    kchat_rendering rend;
    sreq *r;
    if (render(e, msgs, n_msgs, chat, &rend, err)) return NULL;
    if (!(r = sreq_new())) { free(rend.ids); oai_error_set(err, 500, NULL, NULL, "out of memory"); return NULL; }
    r->prompt = rend.ids;
    r->n_prompt = rend.n_ids;
    r->n_preamble = rend.n_preamble;     /* the prefix cache keeps the state at its end */
    sampling_of(s, r);
    if (fit_context(e, r, s->max_tokens, err) || constrain(e, chat, r, err)) { sreq_discard(r); return NULL; }
    return r;
}

/* n > 1: choice i (1 .. n-1) as a request of its own: r0's prompt, settings, constraint and
 * output options, with seed + i (r0's seed is fixed first) and the id "ID.i".  Into more[]. */
static int add_choices(srv_engine *e, sreq *r0, int n, const kchat_options *chat, sgen_opts *go, sreq **more, size_t *n_more,
                       oai_error *err)
{
    if (!r0->has_seed) { r0->sampling.seed = srv_engine_fresh_seed(e); r0->has_seed = 1; }
    go->choice_of_n = go->stream;
    for (int i = 1; i < n; i++) {
        sreq *r = sreq_new();
        sgen_opts o = *go;
        if (r) {
            r->prompt = malloc(r0->n_prompt * sizeof *r->prompt);
            more[(*n_more)++] = r;
        }
        if (!r || !r->prompt) { oai_error_set(err, 500, NULL, NULL, "out of memory"); return -1; }
        memcpy(r->prompt, r0->prompt, r0->n_prompt * sizeof *r->prompt);
        r->n_prompt = r0->n_prompt;
        r->n_preamble = r0->n_preamble;
        r->max_tokens = r0->max_tokens;
        r->sampling = r0->sampling;
        r->sampling.seed = r0->sampling.seed + (uint64_t)i;
        r->has_seed = 1;
        r->logprobs = r0->logprobs;
        r->top_logprobs = r0->top_logprobs;
        r->echo = r0->echo;
        r->spec = r0->spec;
        r->leader = r0;                /* its prompt is prefilled once, by r0, and copied (serve_engine.c) */
        if (chat && constrain(e, chat, r, err)) return -1;
        o.index = i;                   /* the response's id, choice i (its chunks are the stream's) */
        if (srv_prepare_output(srv_engine_model(e), r, &o, err)) return -1;
        snprintf(r->id, sizeof r->id, "%s.%d", go->meta.id, i);     /* the log's name for it */
        /* streamed, the response's status is choice 0's: a failure of this choice, even before its
         * first token, is an error event in the stream */
        if (go->stream) sgen_stream_opened(r->gen);
    }
    return 0;
}

/* n: 1, or the choices made into more (NULL: n > 1 refused, krun batch). */
static int choices(srv_engine *e, sreq *r0, int n, const kchat_options *chat, sgen_opts *go, sreq **more, size_t *n_more,
                   oai_error *err)
{
    if (n <= 1) return 0;
    if (!more) {
        oai_error_set(err, 400, "n", "unsupported_value", "n > 1 is not supported by krun batch: give n: 1 (one line per choice, "
                      "each with its own seed)");
        return -1;
    }
    if (add_choices(e, r0, n, chat, go, more, n_more, err)) {
        for (size_t i = 0; i < *n_more; i++) sreq_discard(more[i]);
        *n_more = 0;
        return -1;
    }
    return 0;
}

static sreq *prepare_chat(srv_engine *e, const char *name, const char *body, size_t len, const oai_meta *meta, sreq **more,
                          size_t *n_more, oai_error *err)
{
    krun_model *m = srv_engine_model(e);
    oai_chat_request q;
    sreq *r = NULL;
    if (oai_parse_chat_request(body, len, &q, err)) return NULL;
    if (oai_check_model(q.s.model, name, err)) goto fail;
    if (q.s.ignore_eos) {
        oai_error_set(err, 400, "ignore_eos", "unsupported_value", "ignore_eos is for /v1/completions: a chat reply ends at <|end_of_msg|>");
        goto fail;
    }
    if (!(r = srv_prepare_chat(e, q.messages, q.n_messages, &q.chat, &q.s, err))) goto fail;
    {
        sgen_opts go = {1, q.chat.thinking, q.s.stream, q.s.include_usage, q.s.return_token_ids, q.s.stop, q.s.n_stop, NULL, 1, 0,
                        *meta, NULL, 0, q.s.logprobs, 0, 0, 0, 0};
        if (choices(e, r, q.s.n, &q.chat, &go, more, n_more, err)) goto fail;
        if (srv_prepare_output(m, r, &go, err)) goto fail;
    }
    oai_chat_request_free(&q);
    return r;
fail:
    sreq_discard(r);
    oai_chat_request_free(&q);
    return NULL;
}

static sreq *prepare_completion(srv_engine *e, const char *name, const char *body, size_t len, const oai_meta *meta, sreq **more,
                                size_t *n_more, oai_error *err)
{
    krun_model *m = srv_engine_model(e);
    const ktok *tk = krun_model_tokenizer(m);
    oai_completion_request q;
    sreq *r = NULL;
    if (oai_parse_completion_request(body, len, (size_t)krun_model_config(m)->vocab, &q, err)) return NULL;
    if (oai_check_model(q.s.model, name, err)) goto fail;
    r = sreq_new();
    if (!r) { oai_error_set(err, 500, NULL, NULL, "out of memory"); goto fail; }
    if (q.prompt_ids) {
        r->prompt = malloc(q.n_prompt_ids * sizeof *r->prompt);
        if (r->prompt) memcpy(r->prompt, q.prompt_ids, q.n_prompt_ids * sizeof *r->prompt);
        r->n_prompt = q.n_prompt_ids;
    } else if (ktok_encode(tk, q.prompt, q.prompt_len, 1, &r->prompt, &r->n_prompt)) {
        r->prompt = NULL;
    }
    if (!r->prompt) { oai_error_set(err, 500, NULL, NULL, "out of memory"); goto fail; }
    sampling_of(&q.s, r);
    r->echo = q.echo;
    if (fit_context(e, r, q.s.max_tokens, err)) {
        snprintf(err->param, sizeof err->param, "%s", r->n_prompt > krun_model_ctx(m) ? "prompt" : "max_tokens");
        goto fail;
    }
    {
        sgen_opts go = {0, 0, q.s.stream, q.s.include_usage, q.s.return_token_ids, q.s.stop, q.s.n_stop, NULL, !q.s.ignore_eos, 0,
                        *meta, NULL, 0, q.s.logprobs, 0, 0, 0, q.echo};
        if (choices(e, r, q.s.n, NULL, &go, more, n_more, err)) goto fail;
        if (srv_prepare_output(m, r, &go, err)) goto fail;
    }
    oai_completion_request_free(&q);
    return r;
fail:
    sreq_discard(r);
    oai_completion_request_free(&q);
    return NULL;
}

sreq *srv_prepare(srv_engine *e, const char *model_name, int chat, const char *body, size_t len, const oai_meta *meta, sreq **more,
                  size_t *n_more, oai_error *err)
{
    if (n_more) *n_more = 0;
    return chat ? prepare_chat(e, model_name, body, len, meta, more, n_more, err)
                : prepare_completion(e, model_name, body, len, meta, more, n_more, err);
}
