/* Anthropic Messages API request bodies -> krun requests (see anth.h). */
#include "anth.h"

#include "run/text/jsontext.h"
#include "reqjson.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STOP_SEQUENCES 16

/* A list the parse grows: messages, one Anthropic message giving several (tool results, then text). */
typedef struct {
    kchat_message *m;
    size_t n, cap;
} msgs;

static kchat_message *push(msgs *l, kreq_arena *a)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        kchat_message *m = realloc(l->m, cap * sizeof *m);
        if (!m) return NULL;
        l->m = m;
        l->cap = cap;
    }
    (void)a;
    memset(&l->m[l->n], 0, sizeof *l->m);
    return &l->m[l->n++];
}

static int refuse(oai_error *e, const char *param, const char *fmt, const char *detail)
{
    char msg[400];
    snprintf(msg, sizeof msg, fmt, detail ? detail : "");
    oai_error_set(e, 400, param, "invalid_request_error", "%s: %s", param, msg);
    return -1;
}

static int required(oai_error *e, const char *param)
{
    oai_error_set(e, 400, param, "invalid_request_error", "%s: Field required", param);
    return -1;
}

/* Text blocks (or a string) joined: system, tool_result content. */
static int text_of(json_t *v, const char *param, kreq_arena *a, const char **out, size_t *len, oai_error *e)
{
    kbuf b = {0};
    if (json_is_string(v)) { *out = json_string_value(v); *len = json_string_length(v); return 0; }
    if (!json_is_array(v)) return kreq_wrong_type(e, param, "a string or an array of text blocks", v);
    for (size_t k = 0; k < json_array_size(v); k++) {
        json_t *blk = json_array_get(v, k), *t = json_object_get(blk, "text");
        char p[128];
        snprintf(p, sizeof p, "%s.%zu", param, k);
        if (!json_is_object(blk)) { kbuf_free(&b); return kreq_wrong_type(e, p, "a content block", blk); }
        if (!kreq_str_is(json_object_get(blk, "type"), "text")) {
            kbuf_free(&b);
            strcat(p, ".type");
            return refuse(e, p, "%s", "only text blocks are supported here");
        }
        strcat(p, ".text");
        if (!json_is_string(t)) { kbuf_free(&b); return t ? kreq_wrong_type(e, p, "a string", t) : required(e, p); }
        kbuf_add(&b, json_string_value(t), json_string_length(t));
    }
    kbuf_add(&b, "", 0);
    if (b.oom || !kreq_keep(a, b.p)) { if (b.oom) kbuf_free(&b); return OOM(e); }
    *out = b.p;
    *len = b.n;
    return 0;
}

/* A text block's text appended to a message's content (assistant text, user text). */
static int add_text(kchat_message *m, const char *s, size_t n, kreq_arena *a, oai_error *e)
{
    char *c = malloc(m->content_len + n + 1);
    if (!c || !kreq_keep(a, c)) return OOM(e);
    if (m->content_len) memcpy(c, m->content, m->content_len);
    memcpy(c + m->content_len, s, n);
    c[m->content_len + n] = 0;
    m->content = c;
    m->content_len += n;
    return 0;
}

/* Content block k of message i: an object with a string "type" (returned; p then names it,
 * "messages.I.content.K.type"), or NULL with e. */
static json_t *block_type(json_t *blk, size_t i, size_t k, char *p, size_t plen, oai_error *e)
{
    json_t *type = json_object_get(blk, "type");
    snprintf(p, plen, "messages.%zu.content.%zu", i, k);
    if (!json_is_object(blk)) { kreq_wrong_type(e, p, "a content block", blk); return NULL; }
    snprintf(p, plen, "messages.%zu.content.%zu.type", i, k);
    if (!json_is_string(type)) { if (type) kreq_wrong_type(e, p, "a string", type); else required(e, p); return NULL; }
    return type;
}

static int user_message(json_t *content, size_t i, msgs *l, kreq_arena *a, oai_error *e)
{
    kchat_message *cur = NULL;        /* the user message text blocks go to */
    char p[128];
    if (json_is_string(content)) {
        if (!(cur = push(l, a))) return OOM(e);
        cur->role = KCHAT_USER;
        cur->content = json_string_value(content);
        cur->content_len = json_string_length(content);
        return 0;
    }
    snprintf(p, sizeof p, "messages.%zu.content", i);
    if (!json_is_array(content)) return content ? kreq_wrong_type(e, p, "a string or an array of content blocks", content) : required(e, p);
    for (size_t k = 0; k < json_array_size(content); k++) {
        json_t *blk = json_array_get(content, k), *type;
        if (!(type = block_type(blk, i, k, p, sizeof p, e))) return -1;
        if (kreq_str_is(type, "text")) {
            json_t *t = json_object_get(blk, "text");
            snprintf(p, sizeof p, "messages.%zu.content.%zu.text", i, k);
            if (!json_is_string(t)) return t ? kreq_wrong_type(e, p, "a string", t) : required(e, p);
            if (!cur) {
                if (!(cur = push(l, a))) return OOM(e);
                cur->role = KCHAT_USER;
            }
            if (add_text(cur, json_string_value(t), json_string_length(t), a, e)) return -1;
        } else if (kreq_str_is(type, "tool_result")) {
            json_t *id = json_object_get(blk, "tool_use_id"), *c = json_object_get(blk, "content"), *err = json_object_get(blk, "is_error");
            kchat_message *m;
            snprintf(p, sizeof p, "messages.%zu.content.%zu.tool_use_id", i, k);
            if (!json_is_string(id)) return id ? kreq_wrong_type(e, p, "a string", id) : required(e, p);
            if (kreq_c_string(id, p, e)) return -1;
            snprintf(p, sizeof p, "messages.%zu.content.%zu.is_error", i, k);
            if (err && !json_is_boolean(err)) return kreq_wrong_type(e, p, "a boolean", err);
            if (!(m = push(l, a))) return OOM(e);
            m->role = KCHAT_TOOL;
            m->tool_call_id = json_string_value(id);
            snprintf(p, sizeof p, "messages.%zu.content.%zu.content", i, k);
            if (c && !json_is_null(c) && text_of(c, p, a, &m->content, &m->content_len, e)) return -1;
            cur = NULL;               /* text after a result is a message of its own */
        } else {
            return refuse(e, p, "content blocks of type \"%.40s\" are not supported in a user message (text and tool_result are)",
                          json_string_value(type));
        }
    }
    return 0;
}

static int assistant_message(json_t *content, size_t i, msgs *l, kreq_arena *a, oai_error *e)
{
    kchat_message *m = push(l, a);
    kchat_tool_call *calls;
    char p[128];
    if (!m) return OOM(e);
    m->role = KCHAT_ASSISTANT;
    if (json_is_string(content)) {
        m->content = json_string_value(content);
        m->content_len = json_string_length(content);
        return 0;
    }
    snprintf(p, sizeof p, "messages.%zu.content", i);
    if (!json_is_array(content)) return content ? kreq_wrong_type(e, p, "a string or an array of content blocks", content) : required(e, p);
    calls = kreq_keep(a, calloc(json_array_size(content) + 1, sizeof *calls));
    if (!calls) return OOM(e);
    m->tool_calls = calls;
    for (size_t k = 0; k < json_array_size(content); k++) {
        json_t *blk = json_array_get(content, k), *type;
        if (!(type = block_type(blk, i, k, p, sizeof p, e))) return -1;
        if (kreq_str_is(type, "text") || kreq_str_is(type, "thinking")) {
            int thinking = kreq_str_is(type, "thinking");
            json_t *t = json_object_get(blk, thinking ? "thinking" : "text");
            snprintf(p, sizeof p, "messages.%zu.content.%zu.%s", i, k, thinking ? "thinking" : "text");
            if (!json_is_string(t)) return t ? kreq_wrong_type(e, p, "a string", t) : required(e, p);
            if (thinking) {
                /* the think channel of the history (the signature is not checked: krun made it, or did not) */
                kchat_message r = *m;
                r.content = m->reasoning;
                r.content_len = m->reasoning_len;
                if (add_text(&r, json_string_value(t), json_string_length(t), a, e)) return -1;
                m->reasoning = r.content;
                m->reasoning_len = r.content_len;
            } else if (add_text(m, json_string_value(t), json_string_length(t), a, e)) {
                return -1;
            }
        } else if (kreq_str_is(type, "redacted_thinking")) {
            continue;                 /* nothing readable to render */
        } else if (kreq_str_is(type, "tool_use")) {
            json_t *id = json_object_get(blk, "id"), *name = json_object_get(blk, "name"), *in = json_object_get(blk, "input");
            kchat_tool_call *c = &calls[m->n_tool_calls];
            snprintf(p, sizeof p, "messages.%zu.content.%zu.id", i, k);
            if (!json_is_string(id)) return id ? kreq_wrong_type(e, p, "a string", id) : required(e, p);
            if (kreq_c_string(id, p, e)) return -1;
            snprintf(p, sizeof p, "messages.%zu.content.%zu.name", i, k);
            if (!json_is_string(name) || !json_string_length(name)) return name ? refuse(e, p, "%s", "must be a non-empty string") : required(e, p);
            if (kreq_c_string(name, p, e)) return -1;
            snprintf(p, sizeof p, "messages.%zu.content.%zu.input", i, k);
            if (!json_is_object(in)) return in ? kreq_wrong_type(e, p, "an object", in) : required(e, p);
            c->id = json_string_value(id);
            c->name = json_string_value(name);
            c->arguments = kreq_keep(a, json_dumps(in, JSON_COMPACT));
            if (!c->arguments) return OOM(e);
            m->n_tool_calls++;
        } else {
            return refuse(e, p, "content blocks of type \"%.40s\" are not supported in an assistant message (text, thinking, "
                          "redacted_thinking and tool_use are)", json_string_value(type));
        }
    }
    if (!m->n_tool_calls) m->tool_calls = NULL;
    if (!m->content && !m->n_tool_calls) { m->content = ""; m->content_len = 0; }
    return 0;
}

/* tools -> the OpenAI tools array the renderer declares; tool_choice. */
static int get_tools(json_t *o, anth_request *r, kreq_arena *a, oai_error *e)
{
    json_t *t = kreq_field(o, "tools"), *tc = kreq_field(o, "tool_choice"), *out;
    size_t n = json_array_size(t);
    if (t && !json_is_array(t)) return kreq_wrong_type(e, "tools", "an array", t);
    out = json_array();
    if (!out) return OOM(e);
    for (size_t k = 0; k < n; k++) {
        json_t *x = json_array_get(t, k), *name = json_object_get(x, "name"), *desc = kreq_field(x, "description");
        json_t *schema = json_object_get(x, "input_schema"), *type = kreq_field(x, "type"), *strict = kreq_field(x, "strict"), *f;
        char p[64];
        snprintf(p, sizeof p, "tools.%zu", k);
        if (!json_is_object(x)) { json_decref(out); return kreq_wrong_type(e, p, "an object", x); }
        if (type && !kreq_str_is(type, "custom")) {
            json_decref(out);
            strcat(p, ".type");
            return refuse(e, p, "server tools (type \"%.60s\") are not supported: declare a client tool (name, description, input_schema)",
                          json_is_string(type) ? json_string_value(type) : "?");
        }
        snprintf(p, sizeof p, "tools.%zu.name", k);
        if (!json_is_string(name)) { json_decref(out); return name ? kreq_wrong_type(e, p, "a string", name) : required(e, p); }
        {
            size_t l = json_string_length(name);
            const char *s = json_string_value(name);
            int ok = l >= 1 && l <= 64;
            for (size_t i = 0; ok && i < l; i++)
                ok = (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-';
            if (!ok) { json_decref(out); return refuse(e, p, "%s", "must match ^[a-zA-Z0-9_-]{1,64}$"); }
        }
        snprintf(p, sizeof p, "tools.%zu.description", k);
        if (desc && !json_is_string(desc)) { json_decref(out); return kreq_wrong_type(e, p, "a string", desc); }
        snprintf(p, sizeof p, "tools.%zu.input_schema", k);
        if (!json_is_object(schema)) { json_decref(out); return schema ? kreq_wrong_type(e, p, "an object (a JSON Schema)", schema) : required(e, p); }
        snprintf(p, sizeof p, "tools.%zu.strict", k);
        if (strict && !json_is_boolean(strict)) { json_decref(out); return kreq_wrong_type(e, p, "a boolean", strict); }
        f = json_pack("{sO sO*}", "name", name, "description", desc);
        if (!f || json_object_set(f, "parameters", schema) || (strict && json_object_set(f, "strict", strict)) ||
            json_array_append_new(out, json_pack("{ss so}", "type", "function", "function", f))) {
            json_decref(out);
            return OOM(e);
        }
    }
    if (n) {
        r->chat.tools_json = kreq_keep(a, json_dumps(out, JSON_COMPACT));
        if (!r->chat.tools_json) { json_decref(out); return OOM(e); }
    }
    json_decref(out);
    if (tc) {
        json_t *type = json_object_get(tc, "type"), *name = json_object_get(tc, "name"), *dp = kreq_field(tc, "disable_parallel_tool_use");
        if (!json_is_object(tc)) return kreq_wrong_type(e, "tool_choice", "an object", tc);
        if (!json_is_string(type)) return type ? kreq_wrong_type(e, "tool_choice.type", "a string", type) : required(e, "tool_choice.type");
        if (dp && !json_is_boolean(dp)) return kreq_wrong_type(e, "tool_choice.disable_parallel_tool_use", "a boolean", dp);
        if (kreq_str_is(type, "auto")) r->chat.tool_choice = KCHAT_TOOL_CHOICE_AUTO;
        else if (kreq_str_is(type, "none")) r->chat.tool_choice = KCHAT_TOOL_CHOICE_NONE;
        else if (kreq_str_is(type, "any")) r->chat.tool_choice = KCHAT_TOOL_CHOICE_REQUIRED;
        else if (kreq_str_is(type, "tool")) {
            size_t k = 0;
            if (!json_is_string(name)) return name ? kreq_wrong_type(e, "tool_choice.name", "a string", name) : required(e, "tool_choice.name");
            if (kreq_c_string(name, "tool_choice.name", e)) return -1;
            while (k < n && strcmp(json_string_value(json_object_get(json_array_get(t, k), "name")), json_string_value(name))) k++;
            if (k == n) return refuse(e, "tool_choice.name", "the tool \"%.64s\" is not in tools", json_string_value(name));
            r->chat.tool_choice = KCHAT_TOOL_CHOICE_NAMED;
            r->chat.tool_name = json_string_value(name);
        } else {
            return refuse(e, "tool_choice.type", "must be \"auto\", \"any\", \"tool\" or \"none\", not \"%.40s\"", json_string_value(type));
        }
        if (r->chat.tool_choice == KCHAT_TOOL_CHOICE_REQUIRED && !n) return refuse(e, "tool_choice.type", "%s", "\"any\" needs at least one tool in tools");
    }
    return 0;
}

static int get_thinking(json_t *o, anth_request *r, oai_error *e)
{
    json_t *t = kreq_field(o, "thinking"), *type, *b;
    r->chat.thinking = 0;              /* Anthropic's default: no extended thinking */
    r->chat.effort = KCHAT_EFFORT_NONE;
    if (!t) return 0;
    if (!json_is_object(t)) return kreq_wrong_type(e, "thinking", "an object", t);
    type = json_object_get(t, "type");
    if (kreq_str_is(type, "disabled")) return 0;
    if (!kreq_str_is(type, "enabled"))
        return type ? refuse(e, "thinking.type", "must be \"enabled\" or \"disabled\", not \"%.40s\"", json_is_string(type) ? json_string_value(type) : "?")
                    : required(e, "thinking.type");
    b = json_object_get(t, "budget_tokens");
    if (!json_is_integer(b)) return b ? kreq_wrong_type(e, "thinking.budget_tokens", "an integer", b) : required(e, "thinking.budget_tokens");
    if (json_integer_value(b) < 1024 || json_integer_value(b) > 0x7fffffff)
        return refuse(e, "thinking.budget_tokens", "%s", "must be at least 1024");
    r->budget_tokens = (int)json_integer_value(b);
    /* K3 takes an effort, not a budget: up to 4096 tokens low, up to 16384 high, beyond max */
    r->chat.thinking = 1;
    r->chat.effort = r->budget_tokens <= 4096 ? KCHAT_EFFORT_LOW : r->budget_tokens <= 16384 ? KCHAT_EFFORT_HIGH : KCHAT_EFFORT_MAX;
    return 0;
}

static int get_sampling(json_t *o, anth_request *r, int count_tokens, kreq_arena *a, oai_error *e)
{
    oai_sampling *s = &r->s;
    json_t *v;
    memset(s, 0, sizeof *s);
    s->temperature = 1;
    s->top_p = 1;
    s->max_tokens = -1;
    s->speculative = -1;       /* the server's --spec */
    s->repetition_penalty = 1;
    s->n = 1;
    v = kreq_field(o, "model");
    if (!v) return required(e, "model");
    if (!json_is_string(v)) return kreq_wrong_type(e, "model", "a string", v);
    if (kreq_c_string(v, "model", e)) return -1;
    s->model = kreq_keep(a, strdup(json_string_value(v)));
    if (!s->model) return OOM(e);
    if (!count_tokens) {
        v = kreq_field(o, "max_tokens");
        if (!v) return required(e, "max_tokens");
        if (!json_is_integer(v)) return kreq_wrong_type(e, "max_tokens", "an integer", v);
        if (json_integer_value(v) < 1 || json_integer_value(v) > 0x7fffffff) return refuse(e, "max_tokens", "%s", "must be at least 1");
        s->max_tokens = (long)json_integer_value(v);
        if (r->budget_tokens && r->budget_tokens >= s->max_tokens)
            return refuse(e, "max_tokens", "%s", "must be greater than thinking.budget_tokens");
    }
    if (kreq_number(o, "temperature", 0, 1, &s->temperature, &s->has_temperature, e)) return -1;
    if (kreq_number(o, "top_p", 0, 1, &s->top_p, &s->has_top_p, e)) return -1;
    if ((v = kreq_field(o, "top_k"))) {
        if (!json_is_integer(v)) return kreq_wrong_type(e, "top_k", "an integer", v);
        if (json_integer_value(v) < 0 || json_integer_value(v) > 0x7fffffff) return refuse(e, "top_k", "%s", "must be 0 or more");
        s->top_k = (long)json_integer_value(v);
    }
    if ((v = kreq_field(o, "seed"))) {
        if (!json_is_integer(v)) return kreq_wrong_type(e, "seed", "an integer", v);
        s->seed = (int64_t)json_integer_value(v);
        s->has_seed = 1;
    }
    if (kreq_bool(o, "stream", &s->stream, e)) return -1;
    if ((v = kreq_field(o, "stop_sequences"))) {
        size_t n = json_array_size(v);
        if (!json_is_array(v)) return kreq_wrong_type(e, "stop_sequences", "an array of strings", v);
        if (n > MAX_STOP_SEQUENCES) return refuse(e, "stop_sequences", "%s", "at most 16 stop sequences");
        s->stop = kreq_keep(a, calloc(n ? n : 1, sizeof *s->stop));
        if (!s->stop) return OOM(e);
        for (size_t i = 0; i < n; i++) {
            json_t *x = json_array_get(v, i);
            char p[40];
            snprintf(p, sizeof p, "stop_sequences.%zu", i);
            if (!json_is_string(x)) return kreq_wrong_type(e, p, "a string", x);
            if (!json_string_length(x)) return refuse(e, p, "%s", "must not be empty");
            if (kreq_c_string(x, p, e)) return -1;
            s->stop[i] = kreq_keep(a, kreq_text_copy(json_string_value(x), json_string_length(x)));
            if (!s->stop[i]) return OOM(e);
        }
        s->n_stop = n;
    }
    if ((v = kreq_field(o, "metadata")) && !json_is_object(v)) return kreq_wrong_type(e, "metadata", "an object", v);
    return 0;
}

int anth_parse_request(const char *body, size_t len, int count_tokens, anth_request *req, oai_error *e)
{
    kreq_arena *a = calloc(1, sizeof *a);
    msgs l = {0};
    json_t *o, *ms, *sys;
    memset(req, 0, sizeof *req);
    if (!a) return OOM(e);
    if (!(a->root = kreq_body(body, len, e))) { kreq_arena_free(a); return -1; }
    o = a->root;
    kchat_options_default(&req->chat);
    if (get_thinking(o, req, e) || get_sampling(o, req, count_tokens, a, e) || get_tools(o, req, a, e)) goto bad;
    sys = kreq_field(o, "system");
    if (sys) {
        kchat_message *m = push(&l, a);
        if (!m) { OOM(e); goto bad; }
        m->role = KCHAT_SYSTEM;
        if (text_of(sys, "system", a, &m->content, &m->content_len, e)) goto bad;
    }
    ms = json_object_get(o, "messages");
    if (!ms) { required(e, "messages"); goto bad; }
    if (!json_is_array(ms)) { kreq_wrong_type(e, "messages", "an array", ms); goto bad; }
    if (!json_array_size(ms)) { refuse(e, "messages", "%s", "at least one message is required"); goto bad; }
    for (size_t i = 0; i < json_array_size(ms); i++) {
        json_t *m = json_array_get(ms, i), *role;
        char p[64];
        snprintf(p, sizeof p, "messages.%zu", i);
        if (!json_is_object(m)) { kreq_wrong_type(e, p, "an object", m); goto bad; }
        role = json_object_get(m, "role");
        snprintf(p, sizeof p, "messages.%zu.role", i);
        if (kreq_str_is(role, "user")) { if (user_message(json_object_get(m, "content"), i, &l, a, e)) goto bad; }
        else if (kreq_str_is(role, "assistant")) { if (assistant_message(json_object_get(m, "content"), i, &l, a, e)) goto bad; }
        else if (!role) { required(e, p); goto bad; }
        else { refuse(e, p, "%s", "must be \"user\" or \"assistant\" (the system prompt is the top-level system field)"); goto bad; }
    }
    if (l.n && l.m[l.n - 1].role == KCHAT_ASSISTANT) {
        /* a final assistant message would be continued (prefill): not supported */
        char p[64];
        snprintf(p, sizeof p, "messages.%zu", json_array_size(ms) - 1);
        refuse(e, p, "%s", "a final assistant message (prefilling the reply) is not supported: end with a user message");
        goto bad;
    }
    req->messages = kreq_keep(a, l.m);
    if (!req->messages) { l.m = NULL; OOM(e); goto bad; }
    l.m = NULL;
    req->n_messages = l.n;
    return kreq_end(a, &req->own, req, sizeof *req, 1);
bad:
    free(l.m);
    return kreq_end(a, &req->own, req, sizeof *req, 0);
}

void anth_request_free(anth_request *req)
{
    if (req) kreq_end(req->own, &req->own, req, sizeof *req, 0);
}
