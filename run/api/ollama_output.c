/* Ollama's output: objects and NDJSON lines from the server's chat or text completion (see ollama.h). */
#include "ollama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The version of Ollama's API these endpoints follow (think, format schemas, tool calls). */
#define OLLAMA_API_VERSION "0.12.0"

static char *dump(json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

/* (the message may quote the client's body, cut inside a character: sanitized, or there is no reply) */
char *ollama_error_json(const oai_error *e)
{
    json_t *m = kjson_text(e->message, strlen(e->message));
    return dump(m ? json_pack("{so}", "error", m) : NULL);
}
char *ollama_version_json(void) { return dump(json_pack("{ss}", "version", OLLAMA_API_VERSION)); }

/* RFC 3339 with nanoseconds, UTC (Ollama's created_at). */
static json_t *timestamp(double unix_s)
{
    char buf[64];
    time_t t = (time_t)unix_s;
    struct tm tm;
    gmtime_r(&t, &tm);
    snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%09ldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             (long)((unix_s - (double)t) * 1e9));
    return json_string(buf);
}

static json_int_t ns(double s) { return s > 0 ? (json_int_t)(s * 1e9) : 0; }

/* The last object of a reply: done, the reason, the counts and durations (prompt: from the start to
 * the first output; eval: from there to the end). */
static int finish_fields(json_t *o, const char *finish, const json_t *usage, double start, double first, double now)
{
    json_int_t pt = json_integer_value(json_object_get(usage, "prompt_tokens")), ct = json_integer_value(json_object_get(usage, "completion_tokens"));
    if (first <= 0) first = now;
    return json_object_set_new(o, "done", json_true()) ||
           json_object_set_new(o, "done_reason", json_string(finish && !strcmp(finish, "length") ? "length" : "stop")) ||
           json_object_set_new(o, "total_duration", json_integer(ns(now - start))) || json_object_set_new(o, "load_duration", json_integer(0)) ||
           json_object_set_new(o, "prompt_eval_count", json_integer(pt)) || json_object_set_new(o, "prompt_eval_duration", json_integer(ns(first - start))) ||
           json_object_set_new(o, "eval_count", json_integer(ct)) || json_object_set_new(o, "eval_duration", json_integer(ns(now - first)));
}

/* OpenAI tool calls (arguments as JSON text) as Ollama's (arguments an object). */
static json_t *tool_calls(const json_t *calls)
{
    json_t *out = json_array();
    for (size_t k = 0; out && k < json_array_size(calls); k++) {
        json_t *f = json_object_get(json_array_get(calls, k), "function"), *args;
        const char *a = json_string_value(json_object_get(f, "arguments"));
        args = a ? json_loads(a, 0, NULL) : NULL;
        if (!json_is_object(args)) { json_decref(args); args = json_object(); }
        if (json_array_append_new(out, json_pack("{s{sO so}}", "function", "name", json_object_get(f, "name") ? json_object_get(f, "name") : json_null(),
                                                 "arguments", args))) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

/* {model, created_at} and the message (chat) or response (generate). */
static json_t *head(const ollama_meta *m, double now)
{
    return json_pack("{ss so}", "model", m->model, "created_at", timestamp(m->unix_start + (now - m->start)));
}

static int set_reply(json_t *o, int generate, const char *content, size_t clen, const json_t *reasoning, const json_t *calls)
{
    if (generate) {
        if (json_object_set_new(o, "response", json_stringn(content ? content : "", content ? clen : 0))) return -1;
        return reasoning && json_string_length(reasoning) && json_object_set(o, "thinking", (json_t *)reasoning) ? -1 : 0;
    }
    {
        json_t *msg = json_pack("{ss ss%}", "role", "assistant", "content", content ? content : "", content ? clen : 0);
        if (!msg) return -1;
        if (reasoning && json_string_length(reasoning) && json_object_set(msg, "thinking", (json_t *)reasoning)) { json_decref(msg); return -1; }
        if (json_array_size(calls) && json_object_set_new(msg, "tool_calls", tool_calls(calls))) { json_decref(msg); return -1; }
        return json_object_set_new(o, "message", msg);
    }
}

char *ollama_from_completion(const ollama_meta *m, int generate, const char *body, size_t len, double now)
{
    json_t *c = json_loadb(body, len, JSON_ALLOW_NUL, NULL), *ch = json_array_get(json_object_get(c, "choices"), 0), *o;
    json_t *msg = json_object_get(ch, "message"), *text = msg ? json_object_get(msg, "content") : json_object_get(ch, "text");
    if (!ch) { json_decref(c); return NULL; }
    o = head(m, now);
    if (!o || set_reply(o, generate, json_string_value(text), json_string_length(text), json_object_get(msg, "reasoning_content"),
                        json_object_get(msg, "tool_calls")) ||
        finish_fields(o, json_string_value(json_object_get(ch, "finish_reason")), json_object_get(c, "usage"), m->start, 0, now)) {
        json_decref(o);
        o = NULL;
    }
    json_decref(c);
    return dump(o);
}

/* ---- the stream ------------------------------------------------------------------------------ */

struct ollama_stream {
    ollama_meta m;
    char *model;
    int generate, over;
    kbuf in;
    double first;               /* when the first output came */
    const char *finish;
    json_t *usage;
    json_t *calls;              /* OpenAI calls whose header came, by index (their arguments follow) */
};

ollama_stream *ollama_stream_new(const ollama_meta *m, int generate)
{
    ollama_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->model = strdup(m->model);
    s->m = *m;
    s->m.model = s->model;
    s->generate = generate;
    s->calls = json_object();
    if (!s->model || !s->calls) { ollama_stream_free(s); return NULL; }
    return s;
}

void ollama_stream_free(ollama_stream *s)
{
    if (!s) return;
    free(s->model);
    kbuf_free(&s->in);
    json_decref(s->usage);
    json_decref(s->calls);
    free(s);
}

static void line(json_t *o, kbuf *out)
{
    char *j = dump(o);
    if (!j) { out->oom = 1; return; }
    kbuf_puts(out, j);
    kbuf_puts(out, "\n");
    free(j);
}

static void chunk(ollama_stream *s, const char *p, size_t n, double now, kbuf *out)
{
    json_t *o, *ch, *d, *err, *calls = NULL;
    if (n == 6 && !memcmp(p, "[DONE]", 6)) {
        json_t *last = head(&s->m, now);
        if (s->over) return;
        if (!last || set_reply(last, s->generate, "", 0, NULL, NULL) || finish_fields(last, s->finish, s->usage, s->m.start, s->first, now)) {
            json_decref(last);
            out->oom = 1;
            return;
        }
        line(last, out);
        s->over = 1;
        return;
    }
    if (!(o = json_loadb(p, n, JSON_ALLOW_NUL, NULL))) return;
    if ((err = json_object_get(o, "error"))) {
        json_t *msg = json_object_get(err, "message");
        line(json_pack("{so}", "error", json_is_string(msg) ? json_incref(msg) : json_string("error")), out);
        s->over = 1;
        json_decref(o);
        return;
    }
    if (json_is_object(json_object_get(o, "usage"))) { json_decref(s->usage); s->usage = json_incref(json_object_get(o, "usage")); }
    ch = json_array_get(json_object_get(o, "choices"), 0);
    if (json_is_string(json_object_get(ch, "finish_reason")))
        s->finish = !strcmp(json_string_value(json_object_get(ch, "finish_reason")), "length") ? "length" : "stop";
    d = json_object_get(ch, "delta");
    /* a call: its header's name kept, then sent whole with its arguments */
    for (size_t k = 0; k < json_array_size(json_object_get(d, "tool_calls")); k++) {
        json_t *tc = json_array_get(json_object_get(d, "tool_calls"), k), *f = json_object_get(tc, "function"), *name = json_object_get(f, "name");
        char key[32];
        snprintf(key, sizeof key, "%lld", (long long)json_integer_value(json_object_get(tc, "index")));
        if (json_string_length(json_object_get(tc, "id"))) json_object_set_new(s->calls, key, name ? json_incref(name) : json_string(""));
        else if (json_is_string(json_object_get(f, "arguments")) && json_object_get(s->calls, key)) {
            if (!calls) calls = json_array();
            if (calls) json_array_append_new(calls, json_pack("{s{sO sO}}", "function", "name", json_object_get(s->calls, key), "arguments",
                                                              json_object_get(f, "arguments")));
        }
    }
    {
        json_t *text = ch ? (d ? json_object_get(d, "content") : json_object_get(ch, "text")) : NULL, *rs = json_object_get(d, "reasoning_content");
        if (json_string_length(text) || json_string_length(rs) || json_array_size(calls)) {
            json_t *l = head(&s->m, now);
            if (s->first <= 0) s->first = now;
            if (!l || set_reply(l, s->generate, json_string_value(text), json_string_length(text), rs, calls) ||
                json_object_set_new(l, "done", json_false()))
                { json_decref(l); out->oom = 1; }
            else line(l, out);
        }
    }
    json_decref(calls);
    json_decref(o);
}

int ollama_stream_feed(ollama_stream *s, const char *p, size_t n, double now, kbuf *out)
{
    kbuf_add(&s->in, p, n);
    if (s->in.oom) return -1;
    for (size_t len; kbuf_sse_block(&s->in, &len); kbuf_drop(&s->in, len + 2))
        if (!s->over && len >= 6 && !memcmp(s->in.p, "data: ", 6)) chunk(s, s->in.p + 6, len - 6, now, out);
    return out->oom ? -1 : s->over;
}

/* ---- the model ------------------------------------------------------------------------------- */

static json_t *details(const char *family)
{
    return json_pack("{ss ss ss s[s] ss ss}", "parent_model", "", "format", "kpk", "family", family, "families", family, "parameter_size", "",
                     "quantization_level", "");
}

char *ollama_tags_json(const char *model, long long modified, unsigned long long size, const char *family)
{
    return dump(json_pack("{s[{ss ss so sI ss so}]}", "models", "name", model, "model", model, "modified_at", timestamp((double)modified), "size",
                          (json_int_t)size, "digest", "", "details", details(family)));
}

char *ollama_show_json(const char *model, long long modified, size_t ctx, const char *family)
{
    json_t *info = json_pack("{ss sI}", "general.architecture", family, "kimi-k3.context_length", (json_int_t)ctx);
    (void)model;
    return dump(json_pack("{ss ss ss so so so s[sss]}", "modelfile", "", "parameters", "", "template", "", "details", details(family),
                          "model_info", info, "modified_at", timestamp((double)modified), "capabilities", "completion", "tools", "thinking"));
}
