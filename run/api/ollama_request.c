/* Ollama request bodies -> krun requests (see ollama.h). */
#include "ollama.h"

#include "reqjson.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* options and the top-level settings shared by both endpoints. */
static int get_settings(json_t *o, ollama_request *r, kreq_arena *a, oai_error *e)
{
    oai_sampling *s = &r->s;
    json_t *v, *op = kreq_field(o, "options"), *f, *th;
    memset(s, 0, sizeof *s);
    s->temperature = 1;
    s->top_p = 1;
    s->max_tokens = -1;
    s->speculative = -1;
    s->repetition_penalty = 1;
    s->n = 1;
    s->stream = 1;                         /* Ollama streams unless told not to */
    s->include_usage = 1;
    if (!(v = kreq_field(o, "model"))) return kreq_missing(e, "model");
    if (!json_is_string(v)) return kreq_wrong_type(e, "model", "a string", v);
    if (kreq_c_string(v, "model", e)) return -1;
    if (!(s->model = kreq_keep(a, strdup(json_string_value(v))))) return OOM(e);
    if (kreq_bool(o, "stream", &s->stream, e)) return -1;
    if (op) {
        if (!json_is_object(op)) return kreq_wrong_type(e, "options", "an object", op);
        if (kreq_number(op, "temperature", 0, 2, &s->temperature, &s->has_temperature, e)) return -1;
        if (kreq_number(op, "top_p", 0, 1, &s->top_p, &s->has_top_p, e)) return -1;
        if (kreq_number(op, "min_p", 0, 1, &s->min_p, NULL, e)) return -1;
        if (kreq_number(op, "presence_penalty", -2, 2, &s->presence_penalty, NULL, e)) return -1;
        if (kreq_number(op, "frequency_penalty", -2, 2, &s->frequency_penalty, NULL, e)) return -1;
        if (kreq_number(op, "repeat_penalty", 0, 100, &s->repetition_penalty, NULL, e)) return -1;
        if (s->repetition_penalty <= 0) return kreq_refuse(e, "options.repeat_penalty", "%s", "must be more than 0 (1 is off)");
        if ((v = kreq_field(op, "top_k"))) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 0x7fffffff)
                return kreq_wrong_type(e, "options.top_k", "an integer >= 0", v);
            s->top_k = (long)json_integer_value(v);
        }
        if ((v = kreq_field(op, "seed"))) {
            if (!json_is_integer(v)) return kreq_wrong_type(e, "options.seed", "an integer", v);
            s->seed = (int64_t)json_integer_value(v);
            s->has_seed = 1;
        }
        if ((v = kreq_field(op, "num_predict"))) {
            /* -1: no limit, -2: fill the context (both: up to the context here) */
            if (!json_is_integer(v) || json_integer_value(v) < -2 || json_integer_value(v) == 0 || json_integer_value(v) > 0x7fffffff)
                return kreq_refuse(e, "options.num_predict", "%s", "must be a positive count, -1 or -2");
            s->max_tokens = json_integer_value(v) > 0 ? (long)json_integer_value(v) : -1;
        }
        if ((v = kreq_field(op, "stop"))) {
            size_t n = json_is_string(v) ? 1 : json_array_size(v);
            if (!json_is_string(v) && !json_is_array(v)) return kreq_wrong_type(e, "options.stop", "an array of strings", v);
            if (n > 16) return kreq_refuse(e, "options.stop", "%s", "at most 16 stop strings");
            if (!(s->stop = kreq_keep(a, calloc(n ? n : 1, sizeof *s->stop)))) return OOM(e);
            for (size_t i = 0; i < n; i++) {
                json_t *x = json_is_string(v) ? v : json_array_get(v, i);
                if (!json_is_string(x) || !json_string_length(x)) return kreq_refuse(e, "options.stop", "%s", "stop strings must be non-empty strings");
                if (kreq_c_string(x, "options.stop", e)) return -1;
                if (!(s->stop[i] = kreq_keep(a, strdup(json_string_value(x))))) return OOM(e);
            }
            s->n_stop = n;
        }
    }
    /* format: "json" or a schema */
    if ((f = kreq_field(o, "format"))) {
        if (kreq_str_is(f, "json")) r->chat.format = KCHAT_FORMAT_JSON_OBJECT;
        else if (json_is_object(f)) {
            r->chat.format = KCHAT_FORMAT_JSON_SCHEMA;
            if (!(r->chat.format_schema = kreq_keep(a, json_dumps(f, JSON_COMPACT)))) return OOM(e);
        } else if (!(json_is_string(f) && !json_string_length(f))) {
            return kreq_refuse(e, "format", "%s", "must be \"json\" or a JSON Schema object");
        }
    }
    /* think: on by default (K3's chat templates think, at max effort) */
    if ((th = kreq_field(o, "think"))) {
        r->chat.effort_given = 1;
        if (json_is_boolean(th)) { r->chat.thinking = json_is_true(th); if (!r->chat.thinking) r->chat.effort = KCHAT_EFFORT_NONE; }
        else if (!json_is_string(th) || memchr(json_string_value(th), 0, json_string_length(th)) ||
                 (!kreq_str_is(th, "low") && !kreq_str_is(th, "medium") && !kreq_str_is(th, "high")) || kreq_effort(json_string_value(th), &r->chat))
            return kreq_refuse(e, "think", "%s", "must be true, false, \"low\", \"medium\" or \"high\"");
    }
    if ((v = kreq_field(o, "images"))) return kreq_refuse(e, "images", "%s", "images are not supported: krun runs a text model");
    return 0;
}

/* tools: OpenAI's chat shape, declared as given. */
static int get_tools(json_t *o, ollama_request *r, kreq_arena *a, oai_error *e)
{
    json_t *t = kreq_field(o, "tools");
    if (!t) return 0;
    if (!json_is_array(t)) return kreq_wrong_type(e, "tools", "an array", t);
    for (size_t k = 0; k < json_array_size(t); k++) {
        json_t *x = json_array_get(t, k), *f = json_object_get(x, "function"), *name = json_object_get(f, "name"), *params = json_object_get(f, "parameters");
        char p[64];
        snprintf(p, sizeof p, "tools[%zu]", k);
        if (!json_is_object(x) || (json_object_get(x, "type") && !kreq_str_is(json_object_get(x, "type"), "function")) || !json_is_object(f))
            return kreq_refuse(e, p, "%s", "must be {\"type\": \"function\", \"function\": {name, description, parameters}}");
        if (!json_is_string(name) || !kreq_tool_name_ok(name)) {
            strcat(p, ".function.name");
            return kreq_refuse(e, p, "%s", "must match ^[a-zA-Z0-9_-]{1,64}$");
        }
        if (params && !json_is_object(params)) { strcat(p, ".function.parameters"); return kreq_wrong_type(e, p, "an object", params); }
    }
    if (json_array_size(t) && !(r->chat.tools_json = kreq_keep(a, json_dumps(t, JSON_COMPACT)))) return OOM(e);
    return 0;
}

static int get_message(json_t *m, size_t i, kchat_message *out, kreq_arena *a, oai_error *e)
{
    json_t *role = json_object_get(m, "role"), *content = kreq_field(m, "content"), *v;
    char p[64];
    snprintf(p, sizeof p, "messages[%zu]", i);
    if (!json_is_object(m)) return kreq_wrong_type(e, p, "an object", m);
    snprintf(p, sizeof p, "messages[%zu].role", i);
    if (!json_is_string(role)) return role ? kreq_wrong_type(e, p, "a string", role) : kreq_missing(e, p);
    if (kreq_str_is(role, "system")) out->role = KCHAT_SYSTEM;
    else if (kreq_str_is(role, "user")) out->role = KCHAT_USER;
    else if (kreq_str_is(role, "assistant")) out->role = KCHAT_ASSISTANT;
    else if (kreq_str_is(role, "tool")) out->role = KCHAT_TOOL;
    else return kreq_refuse(e, p, "unknown role \"%.40s\" (system, user, assistant or tool)", json_string_value(role));
    snprintf(p, sizeof p, "messages[%zu].content", i);
    if (content && !json_is_string(content)) return kreq_wrong_type(e, p, "a string", content);
    if (content) { out->content = json_string_value(content); out->content_len = json_string_length(content); }
    snprintf(p, sizeof p, "messages[%zu].images", i);
    if ((v = kreq_field(m, "images")) && json_array_size(v)) return kreq_refuse(e, p, "%s", "images are not supported: krun runs a text model");
    if (out->role == KCHAT_ASSISTANT) {
        json_t *th = kreq_field(m, "thinking"), *tc = kreq_field(m, "tool_calls");
        snprintf(p, sizeof p, "messages[%zu].thinking", i);
        if (th && !json_is_string(th)) return kreq_wrong_type(e, p, "a string", th);
        if (th) { out->reasoning = json_string_value(th); out->reasoning_len = json_string_length(th); }
        snprintf(p, sizeof p, "messages[%zu].tool_calls", i);
        if (tc && !json_is_array(tc)) return kreq_wrong_type(e, p, "an array", tc);
        if (json_array_size(tc)) {
            kchat_tool_call *calls = kreq_keep(a, calloc(json_array_size(tc), sizeof *calls));
            if (!calls) return OOM(e);
            for (size_t k = 0; k < json_array_size(tc); k++) {
                json_t *f = json_object_get(json_array_get(tc, k), "function"), *name = json_object_get(f, "name"), *args = json_object_get(f, "arguments");
                snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].function", i, k);
                if (!json_is_string(name) || !json_string_length(name)) return kreq_refuse(e, p, "%s", "needs a name");
                if (kreq_c_string(name, p, e)) return -1;
                if (args && !json_is_object(args)) return kreq_refuse(e, p, "%s", "arguments must be an object");
                calls[k].name = json_string_value(name);
                if (!(calls[k].arguments = kreq_keep(a, args ? json_dumps(args, JSON_COMPACT) : strdup("{}")))) return OOM(e);
            }
            out->tool_calls = calls;
            out->n_tool_calls = json_array_size(tc);
        }
    } else if (out->role == KCHAT_TOOL) {
        json_t *tn = kreq_field(m, "tool_name");
        snprintf(p, sizeof p, "messages[%zu].tool_name", i);
        if (tn && !json_is_string(tn)) return kreq_wrong_type(e, p, "a string", tn);
        if (tn && kreq_c_string(tn, p, e)) return -1;
        if (tn) out->tool_name = json_string_value(tn);
    }
    return 0;
}

static int begin(const char *body, size_t len, ollama_request *r, kreq_arena **a, oai_error *e)
{
    memset(r, 0, sizeof *r);
    if (!(*a = calloc(1, sizeof **a))) return OOM(e);
    if (!((*a)->root = kreq_body(body, len, e))) { kreq_arena_free(*a); *a = NULL; return -1; }
    kchat_options_default(&r->chat);
    return 0;
}

int ollama_parse_chat(const char *body, size_t len, ollama_request *r, oai_error *e)
{
    kreq_arena *a;
    json_t *o, *ms;
    if (begin(body, len, r, &a, e)) return -1;
    o = a->root;
    if (get_settings(o, r, a, e) || get_tools(o, r, a, e)) goto bad;
    ms = json_object_get(o, "messages");
    if (!json_is_array(ms)) { if (ms) kreq_wrong_type(e, "messages", "an array", ms); else kreq_missing(e, "messages"); goto bad; }
    if (!json_array_size(ms)) { kreq_refuse(e, "messages", "%s", "at least one message is needed (Ollama's empty chat only loads a model)"); goto bad; }
    if (!(r->messages = kreq_keep(a, calloc(json_array_size(ms), sizeof *r->messages)))) { OOM(e); goto bad; }
    for (size_t i = 0; i < json_array_size(ms); i++)
        if (get_message(json_array_get(ms, i), i, &r->messages[i], a, e)) goto bad;
    r->n_messages = json_array_size(ms);
    return kreq_end(a, &r->own, r, sizeof *r, 1);
bad:
    return kreq_end(a, &r->own, r, sizeof *r, 0);
}

int ollama_parse_generate(const char *body, size_t len, ollama_request *r, oai_error *e)
{
    static const char *const refused[] = {"suffix", "template", "context"};
    kreq_arena *a;
    json_t *o, *p, *sys, *v;
    if (begin(body, len, r, &a, e)) return -1;
    o = a->root;
    if (get_settings(o, r, a, e)) goto bad;
    for (size_t k = 0; k < sizeof refused / sizeof *refused; k++)
        if ((v = kreq_field(o, refused[k])) && !(json_is_string(v) && !json_string_length(v)) && !(json_is_array(v) && !json_array_size(v))) {
            kreq_refuse(e, refused[k], "%s", "is not supported by krun (send the conversation to /api/chat)");
            goto bad;
        }
    if (kreq_bool(o, "raw", &r->raw, e)) goto bad;
    p = json_object_get(o, "prompt");
    if (!json_is_string(p)) { if (p) kreq_wrong_type(e, "prompt", "a string", p); else kreq_missing(e, "prompt"); goto bad; }
    if (!json_string_length(p)) { kreq_refuse(e, "prompt", "%s", "is empty (Ollama's empty prompt only loads a model)"); goto bad; }
    r->prompt = json_string_value(p);
    r->prompt_len = json_string_length(p);
    if (r->raw) {
        if (r->chat.format != KCHAT_FORMAT_TEXT) { kreq_refuse(e, "format", "%s", "needs the chat format: not with raw"); goto bad; }
        if (!(r->prompt = kreq_keep(a, kreq_text_copy(r->prompt, r->prompt_len)))) { OOM(e); goto bad; }
        return kreq_end(a, &r->own, r, sizeof *r, 1);
    }
    /* the chat template's turn: [system] user */
    if (!(r->messages = kreq_keep(a, calloc(2, sizeof *r->messages)))) { OOM(e); goto bad; }
    if ((sys = kreq_field(o, "system"))) {
        if (!json_is_string(sys)) { kreq_wrong_type(e, "system", "a string", sys); goto bad; }
        r->messages[r->n_messages++] = (kchat_message){KCHAT_SYSTEM, json_string_value(sys), json_string_length(sys), NULL, NULL, 0, NULL, 0, NULL, NULL};
    }
    r->messages[r->n_messages++] = (kchat_message){KCHAT_USER, r->prompt, r->prompt_len, NULL, NULL, 0, NULL, 0, NULL, NULL};
    return kreq_end(a, &r->own, r, sizeof *r, 1);
bad:
    return kreq_end(a, &r->own, r, sizeof *r, 0);
}

void ollama_request_free(ollama_request *r)
{
    if (r) kreq_end(r->own, &r->own, r, sizeof *r, 0);
}

int ollama_check_model(const char *requested, const char *served, oai_error *e)
{
    size_t n = strlen(served);
    if (requested && (!strcmp(requested, served) || (!strncmp(requested, served, n) && !strcmp(requested + n, ":latest")))) return 0;
    oai_error_set(e, 404, "model", "model_not_found", "model \"%.200s\" not found (this server serves \"%.200s\")", requested ? requested : "",
                  served);
    return -1;
}
