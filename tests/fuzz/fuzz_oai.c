/* The OpenAI request parsers (run/api/oai_request.c) on arbitrary bytes, as
 * bodies of /v1/chat/completions and /v1/completions.  oai_fuzz_one
 * (run/api/oai_fuzz.c: both parsers, the renderer, the error objects, the reply
 * parser and its SSE chunks) must find nothing; and beyond it:
 *  - what a parser accepts is within the documented ranges (run/api/oai.h,
 *    docs/CHAT.md): max_tokens absent (chat) / 16 (completions) or 1 ..
 *    2^31-1, temperature [0, 2], top_p, min_p [0, 1], top_k >= 0, at most 4
 *    stop strings, none empty, include_usage only with stream; a chat has
 *    messages of known roles, each with the content its role requires, tool
 *    calls with names, tool results with a call id, a known effort, tools as a
 *    JSON array when given (and when tool_choice is required); a completion
 *    has exactly one prompt, non-empty, a text NUL-terminated at prompt_len,
 *    or ids in the vocabulary;
 *  - a refusal is a 4xx status (500 only for "out of memory") with a message
 *    and an error object that is JSON carrying that message and status type;
 *  - parsing is deterministic: the same body parsed twice gives the same
 *    result (fields, or error status, param, code and message). */
#include "fuzz.h"

#include "run/api/oai.h"

#include <jansson.h>
#include <string.h>
#include <xxhash.h>

#define VOCAB 1000 /* small, so that ids outside it are easy to reach */

static void check_error(const oai_error *e)
{
    char *j;
    json_t *o, *x;
    FUZZ_CHECK(e->message[0]);
    FUZZ_CHECK((e->status >= 400 && e->status < 500) || (e->status == 500 && strstr(e->message, "out of memory")));
    FUZZ_CHECK(e->type && !strcmp(e->type, e->status >= 500 ? "server_error" : "invalid_request_error"));
    FUZZ_CHECK((j = oai_error_json(e)) != NULL);
    FUZZ_CHECK((o = json_loads(j, 0, NULL)) != NULL);
    x = json_object_get(o, "error");
    FUZZ_CHECK(json_is_object(x) && json_is_string(json_object_get(x, "message")));
    FUZZ_CHECK(json_is_string(json_object_get(x, "type")));
    FUZZ_CHECK(e->param[0] ? json_is_string(json_object_get(x, "param")) : json_is_null(json_object_get(x, "param")));
    FUZZ_CHECK(e->code ? json_is_string(json_object_get(x, "code")) && !strcmp(json_string_value(json_object_get(x, "code")), e->code)
                       : json_is_null(json_object_get(x, "code")));
    json_decref(o);
    free(j);
}

/* A digest of a parse's result: strings with their lengths, numbers as they are. */
typedef struct { XXH3_state_t *h; } digest;
static void d_bytes(digest *d, const void *p, size_t n) { XXH3_64bits_update(d->h, &n, sizeof n); if (n) XXH3_64bits_update(d->h, p, n); }
static void d_str(digest *d, const char *s)
{
    static const size_t none = (size_t)-1; /* NULL, unlike "" */
    if (s) d_bytes(d, s, strlen(s));
    else XXH3_64bits_update(d->h, &none, sizeof none);
}
static void d_open(digest *d)
{
    FUZZ_CHECK((d->h = XXH3_createState()) != NULL);
    XXH3_64bits_reset(d->h);
}
static uint64_t d_close(digest *d)
{
    uint64_t r = XXH3_64bits_digest(d->h);
    XXH3_freeState(d->h);
    return r;
}

/* A refusal: checked, and its digest (status, message, param, code). */
static uint64_t refused(const oai_error *e, digest *d)
{
    check_error(e);
    XXH3_64bits_update(d->h, &e->status, sizeof e->status);
    d_str(d, e->message);
    d_str(d, e->param);
    d_str(d, e->code);
    return d_close(d);
}
#define D(d, x) XXH3_64bits_update((d)->h, &(x), sizeof(x))

static void check_sampling(const oai_sampling *s, long default_max, digest *d)
{
    FUZZ_CHECK(s->max_tokens == default_max || (s->max_tokens >= 1 && s->max_tokens <= 0x7fffffffL));
    FUZZ_CHECK(s->temperature >= 0 && s->temperature <= 2 && (s->has_temperature || s->temperature == 1));
    FUZZ_CHECK(s->top_p >= 0 && s->top_p <= 1 && (s->has_top_p || s->top_p == 1));
    FUZZ_CHECK(s->min_p >= 0 && s->min_p <= 1);
    FUZZ_CHECK(s->top_k >= 0 && s->top_k <= 0x7fffffffL);
    FUZZ_CHECK(s->has_seed || s->seed == 0);
    FUZZ_CHECK(s->n_stop <= 4 && (s->n_stop == 0 || s->stop));
    for (size_t i = 0; i < s->n_stop; i++) FUZZ_CHECK(s->stop[i] && s->stop[i][0]); /* C strings (kstop uses strlen) */
    FUZZ_CHECK(!s->include_usage || s->stream);
    FUZZ_CHECK(s->stream == 0 || s->stream == 1);
    d_str(d, s->model);
    D(d, s->max_tokens); D(d, s->temperature); D(d, s->top_p); D(d, s->seed); D(d, s->has_temperature);
    D(d, s->has_top_p); D(d, s->has_seed); D(d, s->n_stop); D(d, s->stream); D(d, s->include_usage);
    D(d, s->top_k); D(d, s->min_p); D(d, s->ignore_eos); D(d, s->return_token_ids);
    for (size_t i = 0; i < s->n_stop; i++) d_str(d, s->stop[i]);
}

/* 1 if the chat body parsed; *hash: a digest of the result or of the error */
static int chat(const char *body, size_t len, uint64_t *hash)
{
    oai_chat_request r;
    oai_error e;
    digest d;
    d_open(&d);
    memset(&e, 0, sizeof e);
    if (oai_parse_chat_request(body, len, &r, &e)) {
        FUZZ_CHECK(r.messages == NULL && r.own == NULL);
        *hash = refused(&e, &d);
        return 0;
    }
    FUZZ_CHECK(r.n_messages >= 1 && r.messages && r.own);
    for (size_t i = 0; i < r.n_messages; i++) {
        const kchat_message *m = &r.messages[i];
        FUZZ_CHECK(m->role >= KCHAT_SYSTEM && m->role <= KCHAT_TOOL);
        FUZZ_CHECK(m->content || m->content_len == 0);
        FUZZ_CHECK(m->content || (m->role == KCHAT_ASSISTANT && m->n_tool_calls > 0)); /* content is required otherwise */
        FUZZ_CHECK(m->n_tool_calls == 0 || (m->role == KCHAT_ASSISTANT && m->tool_calls));
        for (size_t k = 0; k < m->n_tool_calls; k++) FUZZ_CHECK(m->tool_calls[k].name && m->tool_calls[k].name[0]);
        FUZZ_CHECK(m->role != KCHAT_TOOL || (m->tool_call_id && !m->name));
        FUZZ_CHECK(m->reasoning == NULL || m->role == KCHAT_ASSISTANT);
        D(&d, m->role);
        d_bytes(&d, m->content ? m->content : "", m->content_len);
        d_str(&d, m->name);
        d_str(&d, m->tool_call_id);
        d_str(&d, m->tool_name);
        d_bytes(&d, m->reasoning ? m->reasoning : "", m->reasoning_len);
        for (size_t k = 0; k < m->n_tool_calls; k++) {
            d_str(&d, m->tool_calls[k].id);
            d_str(&d, m->tool_calls[k].name);
            d_str(&d, m->tool_calls[k].arguments);
        }
    }
    FUZZ_CHECK(r.chat.thinking == 0 || r.chat.thinking == 1);
    FUZZ_CHECK(r.chat.effort >= KCHAT_EFFORT_NONE && r.chat.effort <= KCHAT_EFFORT_MAX);
    FUZZ_CHECK(r.chat.tool_choice >= KCHAT_TOOL_CHOICE_AUTO && r.chat.tool_choice <= KCHAT_TOOL_CHOICE_NAMED);
    FUZZ_CHECK(r.chat.tool_choice != KCHAT_TOOL_CHOICE_NAMED || (r.chat.tool_name && r.chat.tools_json && strstr(r.chat.tools_json, r.chat.tool_name)));
    FUZZ_CHECK(r.chat.format >= KCHAT_FORMAT_TEXT && r.chat.format <= KCHAT_FORMAT_JSON_SCHEMA && (r.chat.format != KCHAT_FORMAT_JSON_SCHEMA || r.chat.format_schema));
    if (r.chat.tools_json) {
        json_t *t = json_loads(r.chat.tools_json, JSON_ALLOW_NUL, NULL); /* as chat_render.c: a string may hold U+0000 */
        FUZZ_CHECK(json_is_array(t));
        FUZZ_CHECK(r.chat.tool_choice != KCHAT_TOOL_CHOICE_REQUIRED || json_array_size(t) > 0);
        json_decref(t);
    } else {
        FUZZ_CHECK(r.chat.tool_choice == KCHAT_TOOL_CHOICE_AUTO);
    }
    D(&d, r.chat.thinking); D(&d, r.chat.effort); D(&d, r.chat.tool_choice); D(&d, r.chat.add_generation_prompt); D(&d, r.chat.format);
    d_str(&d, r.chat.tool_name);
    d_str(&d, r.chat.format_schema);
    d_str(&d, r.chat.tools_json);
    check_sampling(&r.s, -1, &d);
    *hash = d_close(&d);
    oai_chat_request_free(&r);
    FUZZ_CHECK(r.messages == NULL && r.own == NULL);
    return 1;
}

static int completion(const char *body, size_t len, uint64_t *hash)
{
    oai_completion_request r;
    oai_error e;
    digest d;
    d_open(&d);
    memset(&e, 0, sizeof e);
    if (oai_parse_completion_request(body, len, VOCAB, &r, &e)) {
        FUZZ_CHECK(r.prompt == NULL && r.prompt_ids == NULL && r.own == NULL);
        *hash = refused(&e, &d);
        return 0;
    }
    FUZZ_CHECK(!r.prompt != !r.prompt_ids); /* exactly one prompt */
    if (r.prompt) {
        /* prompt_len bytes, then a NUL: the tokenizer reads prompt_len bytes */
        FUZZ_CHECK(r.prompt_len > 0 && r.prompt[r.prompt_len] == 0);
        d_bytes(&d, r.prompt, r.prompt_len);
    } else {
        FUZZ_CHECK(r.n_prompt_ids > 0);
        for (size_t i = 0; i < r.n_prompt_ids; i++) FUZZ_CHECK(r.prompt_ids[i] >= 0 && r.prompt_ids[i] < VOCAB);
        d_bytes(&d, r.prompt_ids, r.n_prompt_ids * sizeof *r.prompt_ids);
    }
    check_sampling(&r.s, 16, &d);
    *hash = d_close(&d);
    oai_completion_request_free(&r);
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *body = (const char *)data;
    uint64_t h1, h2;
    int c, p;
    FUZZ_CHECK(oai_fuzz_one(data, size) == 0);
    c = chat(body, size, &h1);
    FUZZ_CHECK(chat(body, size, &h2) == c && h1 == h2);
    p = completion(body, size, &h1);
    FUZZ_CHECK(completion(body, size, &h2) == p && h1 == h2);
    if (c || p) fuzz_accepted++;
    return 0;
}
