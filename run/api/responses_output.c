/* Responses API output: the response object and the event stream, from the chat completion the
 * server produced for the same request (see responses.h). */
#include "responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- items ----------------------------------------------------------------------------------- */

static json_t *str_n(const char *s, size_t n) { return json_stringn(s ? s : "", s ? n : 0); }

/* An item id: "rs_" / "msg_" / "fc_", the response id's hex, the item's index. */
static json_t *item_id(const oai_meta *m, const char *kind, size_t index)
{
    char buf[160];
    const char *hex = m->id && strchr(m->id, '_') ? strchr(m->id, '_') + 1 : m->id ? m->id : "";
    snprintf(buf, sizeof buf, "%s_%s%02zu", kind, hex, index);
    return json_string(buf);
}

/* krun's reasoning blob (include reasoning.encrypted_content): "krun1:" and the text in base64, which
 * a later request's reasoning item gives back (responses_request.c reads it). */
static json_t *reasoning_blob(const char *s, size_t n)
{
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t cap = 6 + (n + 2) / 3 * 4 + 1, k = 6;
    char *out = malloc(cap);
    json_t *j;
    if (!out) return NULL;
    memcpy(out, "krun1:", 6);
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)(unsigned char)s[i] << 16 | (i + 1 < n ? (uint32_t)(unsigned char)s[i + 1] << 8 : 0) |
                     (i + 2 < n ? (uint32_t)(unsigned char)s[i + 2] : 0);
        out[k++] = A[v >> 18];
        out[k++] = A[(v >> 12) & 63];
        out[k++] = i + 1 < n ? A[(v >> 6) & 63] : '=';
        out[k++] = i + 2 < n ? A[v & 63] : '=';
    }
    j = json_stringn(out, k);
    free(out);
    return j;
}

static json_t *reasoning_item(const oai_meta *m, size_t index, const char *text, size_t len, int blob, const char *status)
{
    json_t *it = json_pack("{so ss s[] s[{ss so}] ss}", "id", item_id(m, "rs", index), "type", "reasoning", "summary", "content", "type",
                           "reasoning_text", "text", str_n(text, len), "status", status);
    if (it && blob && json_object_set_new(it, "encrypted_content", reasoning_blob(text, len))) { json_decref(it); return NULL; }
    return it;
}

static json_t *text_part(const char *text, size_t len)
{
    return json_pack("{ss so s[] s[]}", "type", "output_text", "text", str_n(text, len), "annotations", "logprobs");
}

static json_t *message_item(const oai_meta *m, size_t index, const char *text, size_t len, const char *status)
{
    return json_pack("{so ss ss ss s[o]}", "id", item_id(m, "msg", index), "type", "message", "status", status, "role", "assistant",
                     "content", text_part(text, len));
}

/* A call of a namespace's function was declared NAMESPACE.NAME (responses_request.c): its namespace
 * comes back apart, as OpenAI writes it. */
static json_t *call_item(const oai_meta *m, size_t index, const char *call_id, const char *name, const char *args, const char *status)
{
    const char *dot = name ? strchr(name, '.') : NULL;
    json_t *it = json_pack("{so ss ss ss ss ss}", "id", item_id(m, "fc", index), "type", "function_call", "status", status, "call_id",
                           call_id ? call_id : "", "name", dot ? dot + 1 : name ? name : "", "arguments", args ? args : "{}");
    if (it && dot && json_object_set_new(it, "namespace", json_stringn(name, (size_t)(dot - name)))) { json_decref(it); return NULL; }
    return it;
}

/* usage from the chat usage object (prompt, completion, cached, reasoning) */
static json_t *usage_of(const json_t *u)
{
    json_int_t pt = json_integer_value(json_object_get(u, "prompt_tokens")), ct = json_integer_value(json_object_get(u, "completion_tokens"));
    json_int_t cached = json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
    json_int_t rt = json_integer_value(json_object_get(json_object_get(u, "completion_tokens_details"), "reasoning_tokens"));
    return json_pack("{sI s{sI} sI s{sI} sI}", "input_tokens", pt, "input_tokens_details", "cached_tokens", cached, "output_tokens", ct,
                     "output_tokens_details", "reasoning_tokens", rt, "total_tokens", pt + ct);
}

/* The response object: the echo's settings, then id, status, output, usage. */
static json_t *response(const oai_meta *m, const json_t *echo, const char *status, json_t *output, json_t *usage, const char *finish)
{
    json_t *o = json_object(), *settings = json_deep_copy(echo);
    int bad = !o || !output || !settings;
    if (!bad)
        bad = json_object_set_new(o, "id", json_string(m->id ? m->id : "")) || json_object_set_new(o, "object", json_string("response")) ||
              json_object_set_new(o, "created_at", json_integer(m->created)) || json_object_set_new(o, "status", json_string(status)) ||
              json_object_set_new(o, "background", json_false()) || json_object_set_new(o, "error", json_null()) ||
              json_object_set_new(o, "incomplete_details", finish && !strcmp(finish, "length")
                                  ? json_pack("{ss}", "reason", "max_output_tokens") : json_null()) ||
              json_object_set_new(o, "model", json_string(m->model ? m->model : "")) || json_object_set(o, "output", output) ||
              json_object_update(o, settings) ||
              json_object_set_new(o, "service_tier", json_string("default")) || json_object_set_new(o, "top_logprobs", json_integer(0)) ||
              json_object_set_new(o, "max_tool_calls", json_null()) || json_object_set_new(o, "usage", usage ? usage : json_null());
    else json_decref(usage);
    json_decref(output);
    json_decref(settings);
    if (bad) { json_decref(o); return NULL; }
    return o;
}

json_t *oresp_from_chat(const oai_meta *m, const json_t *echo, const char *chat_body, size_t len, int encrypted_reasoning)
{
    json_t *c = json_loadb(chat_body, len, JSON_ALLOW_NUL, NULL), *ch = json_array_get(json_object_get(c, "choices"), 0);
    json_t *msg = json_object_get(ch, "message"), *out = json_array(), *rs, *content, *calls, *r;
    const char *finish = json_string_value(json_object_get(ch, "finish_reason"));
    const char *st = finish && !strcmp(finish, "length") ? "incomplete" : "completed";
    int bad = !msg || !out;
    if (!bad && json_string_length(rs = json_object_get(msg, "reasoning_content")))
        bad = json_array_append_new(out, reasoning_item(m, json_array_size(out), json_string_value(rs), json_string_length(rs), encrypted_reasoning, st));
    content = json_object_get(msg, "content");
    calls = json_object_get(msg, "tool_calls");
    if (!bad && (json_string_length(content) || !json_array_size(calls)))
        bad = json_array_append_new(out, message_item(m, json_array_size(out), json_string_value(content), json_string_length(content), st));
    for (size_t k = 0; !bad && k < json_array_size(calls); k++) {
        json_t *x = json_array_get(calls, k), *f = json_object_get(x, "function");
        bad = json_array_append_new(out, call_item(m, json_array_size(out), json_string_value(json_object_get(x, "id")),
                                                   json_string_value(json_object_get(f, "name")), json_string_value(json_object_get(f, "arguments")),
                                                   "completed"));
    }
    if (bad) { json_decref(out); json_decref(c); return NULL; }
    r = response(m, echo, st, out, usage_of(json_object_get(c, "usage")), finish);
    json_decref(c);
    return r;
}

/* ---- the stream ------------------------------------------------------------------------------ */

typedef enum { OPEN_NONE, OPEN_REASONING, OPEN_MESSAGE } open_kind;

struct oresp_stream {
    oai_meta m;
    char *id, *model;
    json_t *echo;
    int blob;                   /* encrypted reasoning */
    long seq;                   /* the next event's sequence_number */
    kbuf in;                    /* chat bytes not yet a whole event */
    json_t *output;             /* the items so far (done ones complete) */
    open_kind open;             /* the item being written */
    kbuf text;                  /* ... its text so far */
    json_t *calls;              /* call index -> {item index} for calls whose header came */
    const char *finish;         /* the chat's finish_reason */
    json_t *usage;
    json_t *final;              /* the response, once over */
    int started, over, oom;
};

oresp_stream *oresp_stream_new(const oai_meta *m, json_t *echo, int encrypted_reasoning)
{
    oresp_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->id = strdup(m->id ? m->id : "");
    s->model = strdup(m->model ? m->model : "");
    s->m = (oai_meta){s->id, s->model, m->created};
    s->echo = json_incref(echo);
    s->blob = encrypted_reasoning;
    s->output = json_array();
    s->calls = json_object();
    if (!s->id || !s->model || !s->output || !s->calls) { oresp_stream_free(s); return NULL; }
    return s;
}

void oresp_stream_free(oresp_stream *s)
{
    if (!s) return;
    free(s->id);
    free(s->model);
    json_decref(s->echo);
    json_decref(s->output);
    json_decref(s->calls);
    json_decref(s->usage);
    json_decref(s->final);
    kbuf_free(&s->in);
    kbuf_free(&s->text);
    free(s);
}

const json_t *oresp_stream_response(const oresp_stream *s) { return s->final; }

/* "event: TYPE\ndata: {...,"type", "sequence_number"}\n\n" (o consumed) */
static void emit(oresp_stream *s, kbuf *out, const char *type, json_t *o)
{
    json_t *ev = json_pack("{ss sI}", "type", type, "sequence_number", (json_int_t)s->seq++);
    char *j;
    if (!o || !ev || json_object_update(ev, o) || !(j = json_dumps(ev, JSON_COMPACT))) {
        json_decref(o);
        json_decref(ev);
        s->oom = 1;
        return;
    }
    json_decref(o);
    json_decref(ev);
    kbuf_puts(out, "event: ");
    kbuf_puts(out, type);
    kbuf_puts(out, "\ndata: ");
    kbuf_puts(out, j);
    kbuf_puts(out, "\n\n");
    free(j);
}

static json_t *snapshot(oresp_stream *s, const char *status)
{
    return response(&s->m, s->echo, status, json_incref(s->output), s->usage ? json_deep_copy(s->usage) : NULL, NULL);
}

/* Close the item being written: its done events, its full form in output. */
static void close_item(oresp_stream *s, kbuf *out, const char *status)
{
    size_t idx = json_array_size(s->output) - 1;
    json_t *id, *it;
    if (s->open == OPEN_NONE) return;
    id = json_object_get(json_array_get(s->output, idx), "id");
    if (s->open == OPEN_REASONING) {
        emit(s, out, "response.reasoning_text.done", json_pack("{sO sI sI so}", "item_id", id, "output_index", (json_int_t)idx,
                                                                "content_index", (json_int_t)0, "text", str_n(s->text.p, s->text.n)));
        emit(s, out, "response.content_part.done", json_pack("{sO sI sI s{ss so}}", "item_id", id, "output_index", (json_int_t)idx,
                                                              "content_index", (json_int_t)0, "part", "type", "reasoning_text", "text",
                                                              str_n(s->text.p, s->text.n)));
        it = reasoning_item(&s->m, idx, s->text.p, s->text.n, s->blob, status);
    } else {
        emit(s, out, "response.output_text.done", json_pack("{sO sI sI so s[]}", "item_id", id, "output_index", (json_int_t)idx,
                                                             "content_index", (json_int_t)0, "text", str_n(s->text.p, s->text.n), "logprobs"));
        emit(s, out, "response.content_part.done", json_pack("{sO sI sI so}", "item_id", id, "output_index", (json_int_t)idx,
                                                              "content_index", (json_int_t)0, "part", text_part(s->text.p, s->text.n)));
        it = message_item(&s->m, idx, s->text.p, s->text.n, status);
    }
    if (!it || json_array_set(s->output, idx, it)) s->oom = 1;
    emit(s, out, "response.output_item.done", json_pack("{sI so}", "output_index", (json_int_t)idx, "item", it));
    s->open = OPEN_NONE;
    s->text.n = 0;
}

/* Open a reasoning or message item (closing the one being written unless it is of that kind). */
static void open_item(oresp_stream *s, kbuf *out, open_kind k)
{
    size_t idx;
    json_t *it, *id;
    if (s->open == k) return;
    close_item(s, out, "completed");
    idx = json_array_size(s->output);
    it = k == OPEN_REASONING ? json_pack("{so ss s[] s[] ss}", "id", item_id(&s->m, "rs", idx), "type", "reasoning", "summary", "content",
                                         "status", "in_progress")
                             : json_pack("{so ss ss ss s[]}", "id", item_id(&s->m, "msg", idx), "type", "message", "status", "in_progress",
                                         "role", "assistant", "content");
    if (!it || json_array_append(s->output, it)) { json_decref(it); s->oom = 1; return; }
    id = json_object_get(it, "id");
    emit(s, out, "response.output_item.added", json_pack("{sI so}", "output_index", (json_int_t)idx, "item", json_deep_copy(it)));
    emit(s, out, "response.content_part.added",
         json_pack("{sO sI sI so}", "item_id", id, "output_index", (json_int_t)idx, "content_index", (json_int_t)0, "part",
                   k == OPEN_REASONING ? json_pack("{ss ss}", "type", "reasoning_text", "text", "") : text_part("", 0)));
    json_decref(it);
    s->open = k;
}

static void delta(oresp_stream *s, kbuf *out, open_kind k, const json_t *d)
{
    size_t idx;
    open_item(s, out, k);
    if (s->oom) return;
    idx = json_array_size(s->output) - 1;
    kbuf_add(&s->text, json_string_value(d), json_string_length(d));
    emit(s, out, k == OPEN_REASONING ? "response.reasoning_text.delta" : "response.output_text.delta",
         k == OPEN_REASONING ? json_pack("{sO sI sI sO}", "item_id", json_object_get(json_array_get(s->output, idx), "id"), "output_index",
                                         (json_int_t)idx, "content_index", (json_int_t)0, "delta", d)
                             : json_pack("{sO sI sI sO s[]}", "item_id", json_object_get(json_array_get(s->output, idx), "id"), "output_index",
                                         (json_int_t)idx, "content_index", (json_int_t)0, "delta", d, "logprobs"));
}

/* A chat tool_calls delta: a call's header (id, name: the item added) or its arguments (whole: the
 * arguments' delta and done, the item done). */
static void tool_delta(oresp_stream *s, kbuf *out, const json_t *tc)
{
    json_t *f = json_object_get(tc, "function"), *idj = json_object_get(tc, "id"), *args = json_object_get(f, "arguments");
    char key[32];
    snprintf(key, sizeof key, "%lld", (long long)json_integer_value(json_object_get(tc, "index")));
    if (json_is_string(idj) && json_string_length(idj)) {
        size_t idx;
        json_t *it;
        close_item(s, out, "completed");
        idx = json_array_size(s->output);
        it = call_item(&s->m, idx, json_string_value(idj), json_string_value(json_object_get(f, "name")), "", "in_progress");
        if (!it || json_array_append(s->output, it) || json_object_set_new(s->calls, key, json_integer((json_int_t)idx))) {
            json_decref(it);
            s->oom = 1;
            return;
        }
        emit(s, out, "response.output_item.added", json_pack("{sI so}", "output_index", (json_int_t)idx, "item", json_deep_copy(it)));
        json_decref(it);
        return;
    }
    if (json_is_string(args) && json_object_get(s->calls, key)) {
        size_t idx = (size_t)json_integer_value(json_object_get(s->calls, key));
        json_t *it = json_array_get(s->output, idx), *id = json_object_get(it, "id");
        emit(s, out, "response.function_call_arguments.delta", json_pack("{sO sI sO}", "item_id", id, "output_index", (json_int_t)idx, "delta", args));
        emit(s, out, "response.function_call_arguments.done", json_pack("{sO sI sO sO}", "item_id", id, "output_index", (json_int_t)idx,
                                                                          "name", json_object_get(it, "name"), "arguments", args));
        if (json_object_set(it, "arguments", args) || json_object_set_new(it, "status", json_string("completed"))) s->oom = 1;
        emit(s, out, "response.output_item.done", json_pack("{sI so}", "output_index", (json_int_t)idx, "item", json_deep_copy(it)));
    }
}

/* The end: completed, or incomplete when the chat was cut at max_tokens. */
static void finish(oresp_stream *s, kbuf *out)
{
    int cut = s->finish && !strcmp(s->finish, "length");
    const char *status = cut ? "incomplete" : "completed";
    close_item(s, out, status);
    s->final = response(&s->m, s->echo, status, json_incref(s->output), s->usage ? json_deep_copy(s->usage) : NULL, s->finish);
    if (!s->final) { s->oom = 1; return; }
    emit(s, out, cut ? "response.incomplete" : "response.completed", json_pack("{sO}", "response", s->final));
    s->over = 1;
}

static void start(oresp_stream *s, kbuf *out)
{
    if (s->started) return;
    s->started = 1;
    emit(s, out, "response.created", json_pack("{so}", "response", snapshot(s, "in_progress")));
    emit(s, out, "response.in_progress", json_pack("{so}", "response", snapshot(s, "in_progress")));
}

/* One chat event (the text after "data: "). */
static void chat_event(oresp_stream *s, const char *p, size_t n, kbuf *out)
{
    json_t *o, *ch, *d, *err;
    if (n == 6 && !memcmp(p, "[DONE]", 6)) { if (!s->over) { start(s, out); finish(s, out); } return; }
    if (!(o = json_loadb(p, n, JSON_ALLOW_NUL, NULL))) return;          /* not ours: skipped */
    start(s, out);
    if ((err = json_object_get(o, "error"))) {
        /* a failure after the start: an error event, the response failed */
        json_t *failed, *code = json_object_get(err, "code"), *msg = json_object_get(err, "message"), *param = json_object_get(err, "param");
        close_item(s, out, "incomplete");
        emit(s, out, "error", json_pack("{sO so sO}", "code", code ? code : json_null(),
                                        "message", json_is_string(msg) ? json_incref(msg) : json_string("error"), "param", param ? param : json_null()));
        failed = snapshot(s, "failed");
        if (failed) json_object_set_new(failed, "error", json_pack("{so so}", "code", code ? json_incref(code) : json_string("server_error"),
                                                                   "message", json_is_string(msg) ? json_incref(msg) : json_string("error")));
        emit(s, out, "response.failed", json_pack("{so}", "response", failed));
        s->over = 1;
        json_decref(o);
        return;
    }
    if (json_object_get(o, "usage") && json_is_object(json_object_get(o, "usage"))) {
        json_decref(s->usage);
        s->usage = usage_of(json_object_get(o, "usage"));
    }
    ch = json_array_get(json_object_get(o, "choices"), 0);
    d = json_object_get(ch, "delta");
    if (json_string_length(json_object_get(d, "reasoning_content"))) delta(s, out, OPEN_REASONING, json_object_get(d, "reasoning_content"));
    if (json_string_length(json_object_get(d, "content"))) delta(s, out, OPEN_MESSAGE, json_object_get(d, "content"));
    for (size_t k = 0; k < json_array_size(json_object_get(d, "tool_calls")); k++) tool_delta(s, out, json_array_get(json_object_get(d, "tool_calls"), k));
    if (json_is_string(json_object_get(ch, "finish_reason"))) {
        static const char *const reasons[] = {"stop", "length", "tool_calls"};
        for (size_t k = 0; k < 3; k++)
            if (!strcmp(json_string_value(json_object_get(ch, "finish_reason")), reasons[k])) s->finish = reasons[k];
        /* an empty reply still has its message */
        if (!json_array_size(s->output)) { open_item(s, out, OPEN_MESSAGE); }
        close_item(s, out, s->finish && !strcmp(s->finish, "length") ? "incomplete" : "completed");
    }
    json_decref(o);
}

int oresp_stream_feed(oresp_stream *s, const char *p, size_t n, kbuf *out)
{
    kbuf_add(&s->in, p, n);
    if (s->in.oom) return -1;
    for (size_t len; kbuf_sse_block(&s->in, &len); kbuf_drop(&s->in, len + 2)) {
        if (s->over) {
            /* nothing more: what follows the end is the chat's [DONE] */
        } else if (len >= 6 && !memcmp(s->in.p, "data: ", 6)) {
            chat_event(s, s->in.p + 6, len - 6, out);
        } else if (len && s->in.p[0] == ':') {
            kbuf_add(out, s->in.p, len + 2);            /* a progress comment: passed on */
        }
    }
    if (s->oom || out->oom) return -1;
    return s->over;
}

/* ---- the rest -------------------------------------------------------------------------------- */

char *oresp_deleted_json(const char *id)
{
    json_t *o = json_pack("{ss ss sb}", "id", id, "object", "response.deleted", "deleted", 1);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

char *oresp_input_items_json(const json_t *input)
{
    json_t *data = json_array(), *o;
    char *s;
    for (size_t i = 0; data && i < json_array_size(input); i++) {
        json_t *it = json_deep_copy(json_array_get(input, i));
        char id[32];
        if (it && !json_object_get(it, "id")) {
            snprintf(id, sizeof id, "item_%zu", i);
            json_object_set_new(it, "id", json_string(id));
        }
        if (!it || json_array_append_new(data, it)) { json_decref(data); data = NULL; }
    }
    if (!data) return NULL;
    o = json_pack("{ss so sO* sO* sb}", "object", "list", "data", data,
                  "first_id", json_object_get(json_array_get(data, 0), "id"),
                  "last_id", json_object_get(json_array_get(data, json_array_size(data) ? json_array_size(data) - 1 : 0), "id"), "has_more", 0);
    s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}
