/* Anthropic Messages API responses, events and errors (see anth.h). */
#include "anth.h"

#include "run/text/jsontext.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *text_json(const char *s, size_t n)
{
    kbuf b = {0};
    json_t *j;
    kutf8_sanitize(s ? s : "", s ? n : 0, &b);
    j = b.oom ? NULL : json_stringn(b.p ? b.p : "", b.n);
    kbuf_free(&b);
    return j;
}

static char *dump(json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

/* "event: NAME\ndata: JSON\n\n" (json consumed) */
static char *event(const char *name, json_t *o)
{
    char *j = dump(o), *s = NULL;
    if (j && asprintf(&s, "event: %s\ndata: %s\n\n", name, j) < 0) s = NULL;
    free(j);
    return s;
}

static const char *error_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

static json_t *error_object(const oai_error *e)
{
    return json_pack("{ss s{ss so}}", "type", "error", "error", "type", error_type(e->status), "message",
                     text_json(e->message, strlen(e->message)));
}

char *anth_error_json(const oai_error *e) { return dump(error_object(e)); }

char *anth_sse_error(const oai_error *e) { return event("error", error_object(e)); }

const char *anth_stop_reason(const char *finish_reason, int stop_string)
{
    if (!finish_reason) return "end_turn";
    if (!strcmp(finish_reason, "length")) return "max_tokens";
    if (!strcmp(finish_reason, "tool_calls")) return "tool_use";
    return stop_string ? "stop_sequence" : "end_turn";
}

static json_t *usage(long in, long out)
{
    return json_pack("{sI sI}", "input_tokens", (json_int_t)in, "output_tokens", (json_int_t)out);
}

static json_t *head(const oai_meta *m)
{
    return json_pack("{ss ss ss so}", "id", m->id ? m->id : "", "type", "message", "role", "assistant", "model",
                     text_json(m->model, m->model ? strlen(m->model) : 0));
}

char *anth_message_response(const oai_meta *m, const anth_result *r)
{
    json_t *o = head(m), *content = json_array();
    int bad = !o || !content;
    if (!bad && r->reasoning)
        bad |= json_array_append_new(content, json_pack("{ss so ss}", "type", "thinking", "thinking", text_json(r->reasoning, r->reasoning_len),
                                                        "signature", ""));
    if (!bad && (r->text_len || !r->n_calls))
        bad |= json_array_append_new(content, json_pack("{ss so}", "type", "text", "text", text_json(r->text, r->text_len)));
    for (size_t k = 0; !bad && k < r->n_calls; k++) {
        json_t *in = json_loads(r->calls[k].arguments ? r->calls[k].arguments : "{}", JSON_ALLOW_NUL, NULL);
        if (!json_is_object(in)) { json_decref(in); in = json_object(); }
        bad |= json_array_append_new(content, json_pack("{ss ss ss so}", "type", "tool_use", "id", r->call_ids[k], "name",
                                                        r->calls[k].name ? r->calls[k].name : "", "input", in));
    }
    if (!bad) {
        bad |= json_object_set_new(o, "content", content);
        content = NULL;
        bad |= json_object_set_new(o, "stop_reason", json_string(r->stop_reason));
        bad |= json_object_set_new(o, "stop_sequence", r->stop_sequence ? text_json(r->stop_sequence, strlen(r->stop_sequence)) : json_null());
        bad |= json_object_set_new(o, "usage", usage(r->input_tokens, r->output_tokens));
    }
    json_decref(content);
    if (bad) { json_decref(o); return NULL; }
    return dump(o);
}

char *anth_count_tokens_response(long input_tokens) { return dump(json_pack("{sI}", "input_tokens", (json_int_t)input_tokens)); }

char *anth_sse_message_start(const oai_meta *m, long input_tokens)
{
    json_t *msg = head(m);
    char *a, *b, *s = NULL;
    if (!msg || json_object_set_new(msg, "content", json_array()) || json_object_set_new(msg, "stop_reason", json_null()) ||
        json_object_set_new(msg, "stop_sequence", json_null()) || json_object_set_new(msg, "usage", usage(input_tokens, 0))) {
        json_decref(msg);
        return NULL;
    }
    a = event("message_start", json_pack("{ss so}", "type", "message_start", "message", msg));
    b = event("ping", json_pack("{ss}", "type", "ping"));
    if (a && b && asprintf(&s, "%s%s", a, b) < 0) s = NULL;
    free(a);
    free(b);
    return s;
}

char *anth_sse_block_start(int index, const char *type, const char *id, const char *name)
{
    json_t *blk;
    if (!strcmp(type, "thinking")) blk = json_pack("{ss ss ss}", "type", "thinking", "thinking", "", "signature", "");
    else if (!strcmp(type, "text")) blk = json_pack("{ss ss}", "type", "text", "text", "");
    else blk = json_pack("{ss ss ss s{}}", "type", "tool_use", "id", id ? id : "", "name", name ? name : "", "input");
    return event("content_block_start", json_pack("{ss si so}", "type", "content_block_start", "index", index, "content_block", blk));
}

char *anth_sse_delta(int index, const char *kind, const char *text, size_t len)
{
    json_t *d;
    if (!strcmp(kind, "thinking")) d = json_pack("{ss so}", "type", "thinking_delta", "thinking", text_json(text, len));
    else if (!strcmp(kind, "text")) d = json_pack("{ss so}", "type", "text_delta", "text", text_json(text, len));
    else d = json_pack("{ss so}", "type", "input_json_delta", "partial_json", text_json(text, len));
    return event("content_block_delta", json_pack("{ss si so}", "type", "content_block_delta", "index", index, "delta", d));
}

char *anth_sse_block_stop(int index)
{
    return event("content_block_stop", json_pack("{ss si}", "type", "content_block_stop", "index", index));
}

char *anth_sse_message_end(const char *stop_reason, const char *stop_sequence, long output_tokens)
{
    char *a = event("message_delta", json_pack("{ss s{ss so} s{sI}}", "type", "message_delta", "delta", "stop_reason", stop_reason,
                                               "stop_sequence", stop_sequence ? text_json(stop_sequence, strlen(stop_sequence)) : json_null(),
                                               "usage", "output_tokens", (json_int_t)output_tokens));
    char *b = event("message_stop", json_pack("{ss}", "type", "message_stop")), *s = NULL;
    if (a && b && asprintf(&s, "%s%s", a, b) < 0) s = NULL;
    free(a);
    free(b);
    return s;
}
