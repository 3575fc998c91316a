/* OpenAI response bodies and server-sent-event chunks (see oai.h). */
#include "oai.h"

#include "run/text/jsontext.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* A JSON string of bytes that may not be valid UTF-8 (model output cut inside a character). */
static json_t *text_json(const char *s, size_t n)
{
    kbuf b = {0};
    kutf8_sanitize(s ? s : "", s ? n : 0, &b);
    json_t *j = b.oom ? NULL : json_stringn(b.p ? b.p : "", b.n);
    kbuf_free(&b);
    return j;
}

/* json_object_set_new that tolerates a NULL value (allocation failure): the object is marked bad. */
static int set(json_t *o, const char *k, json_t *v, int *bad)
{
    if (!o || !v) { json_decref(v); *bad = 1; return -1; }
    if (json_object_set_new(o, k, v)) { *bad = 1; return -1; }   /* v is released either way */
    return 0;
}

static char *dump(json_t *o, int bad)
{
    char *s = (!bad && o) ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

/* "data: " + JSON + "\n\n" */
static char *sse(char *json)
{
    if (!json) return NULL;
    size_t n = strlen(json);
    char *s = malloc(n + 9);
    if (s) {
        memcpy(s, "data: ", 6);
        memcpy(s + 6, json, n);
        memcpy(s + 6 + n, "\n\n", 3);
    }
    free(json);
    return s;
}

char *oai_error_json(const oai_error *e)
{
    int bad = 0;
    json_t *o = json_object(), *x = json_object();
    set(x, "message", text_json(e->message, strlen(e->message)), &bad);
    set(x, "type", json_string(e->type ? e->type : (e->status >= 500 ? "server_error" : "invalid_request_error")), &bad);
    set(x, "param", e->param[0] ? text_json(e->param, strlen(e->param)) : json_null(), &bad);
    set(x, "code", e->code ? json_string(e->code) : json_null(), &bad);
    set(o, "error", x, &bad);
    return dump(o, bad);
}

static json_t *usage_json(long prompt, long completion, long cached)
{
    json_t *u = json_object(), *d = json_object();
    int bad = 0;
    set(u, "prompt_tokens", json_integer(prompt), &bad);
    set(u, "completion_tokens", json_integer(completion), &bad);
    set(u, "total_tokens", json_integer(prompt + completion), &bad);
    set(d, "cached_tokens", json_integer(cached), &bad);
    set(u, "prompt_tokens_details", d, &bad);
    if (bad) { json_decref(u); return NULL; }
    return u;
}

/* id, object, created, model */
static json_t *head(const oai_meta *m, const char *object, int *bad)
{
    json_t *o = json_object();
    set(o, "id", json_string(m->id ? m->id : ""), bad);
    set(o, "object", json_string(object), bad);
    set(o, "created", json_integer(m->created), bad);
    set(o, "model", text_json(m->model, m->model ? strlen(m->model) : 0), bad);
    return o;
}

static json_t *tool_call_json(int index, const char *id, const char *name, const char *args, size_t args_len,
                              int with_index, int *bad)
{
    json_t *c = json_object(), *f = json_object();
    if (with_index) set(c, "index", json_integer(index), bad);
    if (id) set(c, "id", json_string(id), bad);
    if (id) set(c, "type", json_string("function"), bad);
    if (name) set(f, "name", text_json(name, strlen(name)), bad);
    if (args) set(f, "arguments", text_json(args, args_len), bad);
    set(c, "function", f, bad);
    return c;
}

char *oai_chat_response(const oai_meta *m, const oai_chat_result *r)
{
    int bad = 0;
    json_t *o = head(m, "chat.completion", &bad), *ch = json_object(), *msg = json_object(), *arr = json_array();
    set(msg, "role", json_string("assistant"), &bad);
    set(msg, "content", r->n_calls && !r->content_len ? json_null() : text_json(r->content, r->content_len), &bad);
    if (r->reasoning) set(msg, "reasoning_content", text_json(r->reasoning, r->reasoning_len), &bad);
    if (r->n_calls) {
        json_t *calls = json_array();
        for (size_t i = 0; i < r->n_calls; i++) {
            const char *args = r->calls[i].arguments ? r->calls[i].arguments : "{}";
            if (json_array_append_new(calls, tool_call_json((int)i, r->call_ids ? r->call_ids[i] : "", r->calls[i].name,
                                                            args, strlen(args), 0, &bad)))
                bad = 1;
        }
        set(msg, "tool_calls", calls, &bad);
    }
    set(ch, "index", json_integer(0), &bad);
    set(ch, "message", msg, &bad);
    set(ch, "logprobs", json_null(), &bad);
    set(ch, "finish_reason", json_string(r->finish_reason ? r->finish_reason : "stop"), &bad);
    if (!arr || json_array_append_new(arr, ch)) bad = 1;
    set(o, "choices", arr, &bad);
    set(o, "usage", usage_json(r->prompt_tokens, r->completion_tokens, r->cached_tokens), &bad);
    return dump(o, bad);
}

char *oai_completion_response(const oai_meta *m, const char *text, size_t len, const char *finish_reason,
                              long prompt_tokens, long completion_tokens, long cached_tokens)
{
    int bad = 0;
    json_t *o = head(m, "text_completion", &bad), *ch = json_object(), *arr = json_array();
    set(ch, "text", text_json(text, len), &bad);
    set(ch, "index", json_integer(0), &bad);
    set(ch, "logprobs", json_null(), &bad);
    set(ch, "finish_reason", json_string(finish_reason ? finish_reason : "stop"), &bad);
    if (!arr || json_array_append_new(arr, ch)) bad = 1;
    set(o, "choices", arr, &bad);
    set(o, "usage", usage_json(prompt_tokens, completion_tokens, cached_tokens), &bad);
    return dump(o, bad);
}

/* One chat.completion.chunk with a single choice. */
static char *chat_chunk(const oai_meta *m, json_t *delta, const char *finish_reason)
{
    int bad = 0;
    json_t *o = head(m, "chat.completion.chunk", &bad), *ch = json_object(), *arr = json_array();
    set(ch, "index", json_integer(0), &bad);
    set(ch, "delta", delta, &bad);
    set(ch, "logprobs", json_null(), &bad);
    set(ch, "finish_reason", finish_reason ? json_string(finish_reason) : json_null(), &bad);
    if (!arr || json_array_append_new(arr, ch)) bad = 1;
    set(o, "choices", arr, &bad);
    return sse(dump(o, bad));
}

char *oai_sse_chat_role(const oai_meta *m)
{
    int bad = 0;
    json_t *d = json_object();
    set(d, "role", json_string("assistant"), &bad);
    set(d, "content", json_string(""), &bad);
    if (bad) { json_decref(d); return NULL; }
    return chat_chunk(m, d, NULL);
}

char *oai_sse_chat_event(const oai_meta *m, const kchat_event *ev, const char *call_id, int *none)
{
    int bad = 0;
    json_t *d = json_object(), *calls;
    *none = 0;
    switch (ev->kind) {
    case KCHAT_EV_REASONING:
    case KCHAT_EV_CONTENT:
        if (!ev->len) { json_decref(d); *none = 1; return NULL; }
        set(d, ev->kind == KCHAT_EV_REASONING ? "reasoning_content" : "content", text_json(ev->text, ev->len), &bad);
        break;
    case KCHAT_EV_TOOL_CALL_BEGIN:
        calls = json_array();
        if (!calls || json_array_append_new(calls, tool_call_json(ev->index, call_id ? call_id : "", ev->name ? ev->name : "",
                                                                  "", 0, 1, &bad)))
            bad = 1;
        set(d, "tool_calls", calls, &bad);
        break;
    case KCHAT_EV_TOOL_CALL:
        calls = json_array();
        if (!calls || json_array_append_new(calls, tool_call_json(ev->index, NULL, NULL, ev->text, ev->len, 1, &bad)))
            bad = 1;
        set(d, "tool_calls", calls, &bad);
        break;
    }
    if (bad) { json_decref(d); return NULL; }
    return chat_chunk(m, d, NULL);
}

char *oai_sse_chat_finish(const oai_meta *m, const char *finish_reason)
{
    json_t *d = json_object();
    if (!d) return NULL;
    return chat_chunk(m, d, finish_reason ? finish_reason : "stop");
}

char *oai_sse_usage(const oai_meta *m, int chat, long prompt_tokens, long completion_tokens, long cached_tokens)
{
    int bad = 0;
    json_t *o = head(m, chat ? "chat.completion.chunk" : "text_completion", &bad);
    set(o, "choices", json_array(), &bad);
    set(o, "usage", usage_json(prompt_tokens, completion_tokens, cached_tokens), &bad);
    return sse(dump(o, bad));
}

char *oai_sse_completion(const oai_meta *m, const char *text, size_t len, const char *finish_reason)
{
    int bad = 0;
    json_t *o = head(m, "text_completion", &bad), *ch = json_object(), *arr = json_array();
    set(ch, "text", text_json(text, len), &bad);
    set(ch, "index", json_integer(0), &bad);
    set(ch, "logprobs", json_null(), &bad);
    set(ch, "finish_reason", finish_reason ? json_string(finish_reason) : json_null(), &bad);
    if (!arr || json_array_append_new(arr, ch)) bad = 1;
    set(o, "choices", arr, &bad);
    return sse(dump(o, bad));
}

char *oai_models_response(const char *model, long long created, const char *owned_by)
{
    int bad = 0;
    json_t *o = json_object(), *arr = json_array(), *x = json_object();
    set(x, "id", text_json(model, model ? strlen(model) : 0), &bad);
    set(x, "object", json_string("model"), &bad);
    set(x, "created", json_integer(created), &bad);
    set(x, "owned_by", text_json(owned_by, owned_by ? strlen(owned_by) : 0), &bad);
    if (!arr || json_array_append_new(arr, x)) bad = 1;
    set(o, "object", json_string("list"), &bad);
    set(o, "data", arr, &bad);
    return dump(o, bad);
}
