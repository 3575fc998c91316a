/* OpenAI request bodies -> krun requests (see oai.h). */
#include "oai.h"

#include "run/text/jsontext.h"
#include "reqjson.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void oai_error_set(oai_error *e, int status, const char *param, const char *code, const char *fmt, ...)
{
    if (!e) return;
    memset(e, 0, sizeof *e);
    e->status = status;
    e->type = status >= 500 ? "server_error" : "invalid_request_error";
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

/* Fields krun does not implement: an error when given a value that would change the result. */
static int unsupported(json_t *o, oai_error *e)
{
    json_t *v;
    if ((v = kreq_field(o, "logit_bias")) && !(json_is_object(v) && json_object_size(v) == 0)) {
        oai_error_set(e, 400, "logit_bias", "unsupported_value", "logit_bias is not supported");
        return -1;
    }
    return 0;
}

/* logprobs: chat {"logprobs": bool, "top_logprobs": 0..20}; completions {"logprobs": 0..20} (the
 * number of alternatives; given at all, each token's own log-probability is reported). */
static int parse_logprobs(json_t *o, int chat, oai_sampling *s, oai_error *e)
{
    json_t *v = kreq_field(o, "logprobs"), *t = kreq_field(o, "top_logprobs");
    if (chat) {
        /* the neutral values the soak's clients send: false, 0 */
        if (v && json_is_integer(v) && json_integer_value(v) == 0) v = NULL;
        else if (kreq_bool(o, "logprobs", &s->logprobs, e)) return -1;
        if (t) {
            if (!json_is_integer(t)) return kreq_wrong_type(e, "top_logprobs", "an integer", t);
            if (json_integer_value(t) < 0 || json_integer_value(t) > OAI_MAX_TOP_LOGPROBS) {
                oai_error_set(e, 400, "top_logprobs", "invalid_value", "top_logprobs must be 0 to %d, got %lld", OAI_MAX_TOP_LOGPROBS,
                              (long long)json_integer_value(t));
                return -1;
            }
            if (!s->logprobs && json_integer_value(t)) {
                oai_error_set(e, 400, "top_logprobs", "invalid_value", "top_logprobs needs logprobs: true");
                return -1;
            }
            s->top_logprobs = (int)json_integer_value(t);
        }
        return 0;
    }
    if (t && !(json_is_integer(t) && json_integer_value(t) == 0)) {
        oai_error_set(e, 400, "top_logprobs", "unsupported_value", "top_logprobs is a chat field: /v1/completions takes logprobs: N");
        return -1;
    }
    if (!v || json_is_false(v)) return 0;      /* false: off, as clients send it */
    if (!json_is_integer(v)) return kreq_wrong_type(e, "logprobs", "an integer", v);
    if (json_integer_value(v) < 0 || json_integer_value(v) > OAI_MAX_TOP_LOGPROBS) {
        oai_error_set(e, 400, "logprobs", "invalid_value", "logprobs must be 0 to %d, got %lld", OAI_MAX_TOP_LOGPROBS,
                      (long long)json_integer_value(v));
        return -1;
    }
    s->logprobs = 1;
    s->top_logprobs = (int)json_integer_value(v);
    return 0;
}

/* min_max: the least max_tokens taken (1; 0 for a completion with echo, which may only score its prompt). */
static int parse_sampling(json_t *o, oai_sampling *s, long default_max, long min_max, kreq_arena *a, oai_error *e)
{
    memset(s, 0, sizeof *s);
    s->temperature = 1;
    s->top_p = 1;
    s->max_tokens = default_max;
    json_t *v;
    if ((v = kreq_field(o, "model"))) {
        if (!json_is_string(v)) return kreq_wrong_type(e, "model", "a string", v);
        if (kreq_c_string(v, "model", e)) return -1;
        s->model = kreq_keep(a, strdup(json_string_value(v)));
        if (!s->model) return OOM(e);
    }
    static const char *const maxkeys[] = {"max_completion_tokens", "max_tokens"};
    for (int i = 0; i < 2; i++)
        if ((v = kreq_field(o, maxkeys[i]))) {
            if (!json_is_integer(v)) return kreq_wrong_type(e, maxkeys[i], "an integer", v);
            json_int_t x = json_integer_value(v);
            if (x < min_max || x > 0x7fffffff) {
                oai_error_set(e, 400, maxkeys[i], "invalid_value", "%s must be at least %ld (and at most 2147483647), got %lld%s",
                              maxkeys[i], min_max, (long long)x, min_max ? " (0 only with echo: true)" : "");
                return -1;
            }
            s->max_tokens = (long)x;
            break;
        }
    if (kreq_number(o, "temperature", 0, 2, &s->temperature, &s->has_temperature, e)) return -1;
    if (kreq_number(o, "top_p", 0, 1, &s->top_p, &s->has_top_p, e)) return -1;
    if ((v = kreq_field(o, "seed"))) {
        if (!json_is_integer(v)) return kreq_wrong_type(e, "seed", "an integer", v);
        s->seed = (int64_t)json_integer_value(v);
        s->has_seed = 1;
    }
    if ((v = kreq_field(o, "stop"))) {
        size_t n = json_is_string(v) ? 1 : json_array_size(v);
        if (!json_is_string(v) && !json_is_array(v)) return kreq_wrong_type(e, "stop", "a string or an array of strings", v);
        if (n > 4) { oai_error_set(e, 400, "stop", "invalid_value", "stop takes at most 4 strings, got %zu", n); return -1; }
        s->stop = kreq_keep(a, calloc(n ? n : 1, sizeof *s->stop));
        if (!s->stop) return OOM(e);
        for (size_t i = 0; i < n; i++) {
            json_t *x = json_is_string(v) ? v : json_array_get(v, i);
            char p[32];
            snprintf(p, sizeof p, "stop[%zu]", i);
            if (!json_is_string(x)) return kreq_wrong_type(e, json_is_string(v) ? "stop" : p, "a string", x);
            if (!json_string_length(x)) { oai_error_set(e, 400, p, "invalid_value", "stop strings must not be empty"); return -1; }
            if (kreq_c_string(x, json_is_string(v) ? "stop" : p, e)) return -1; /* matched with strlen (stopstr.c) */
            s->stop[i] = kreq_keep(a, kreq_text_copy(json_string_value(x), json_string_length(x)));
            if (!s->stop[i]) return OOM(e);
        }
        s->n_stop = n;
    }
    if (kreq_bool(o, "stream", &s->stream, e)) return -1;
    if ((v = kreq_field(o, "stream_options"))) {
        if (!json_is_object(v)) return kreq_wrong_type(e, "stream_options", "an object", v);
        if (!s->stream) {
            oai_error_set(e, 400, "stream_options", "invalid_value", "stream_options is only allowed with stream: true");
            return -1;
        }
        json_t *u = kreq_field(v, "include_usage");
        if (u && !json_is_boolean(u)) return kreq_wrong_type(e, "stream_options.include_usage", "a boolean", u);
        s->include_usage = json_is_true(u);
    }
    if ((v = kreq_field(o, "top_k"))) {
        if (!json_is_integer(v)) return kreq_wrong_type(e, "top_k", "an integer", v);
        if (json_integer_value(v) < -1 || json_integer_value(v) > 0x7fffffff) {
            oai_error_set(e, 400, "top_k", "invalid_value", "top_k must be -1 or 0 (off) or a positive count, got %lld",
                          (long long)json_integer_value(v));
            return -1;
        }
        s->top_k = json_integer_value(v) < 0 ? 0 : (long)json_integer_value(v);
    }
    if (kreq_number(o, "min_p", 0, 1, &s->min_p, NULL, e)) return -1;
    if (kreq_bool(o, "ignore_eos", &s->ignore_eos, e)) return -1;
    if (kreq_bool(o, "return_token_ids", &s->return_token_ids, e)) return -1;
    /* penalties (sampler.h has their arithmetic): OpenAI's ranges; repetition_penalty as vLLM takes it */
    if (kreq_number(o, "presence_penalty", -2, 2, &s->presence_penalty, NULL, e)) return -1;
    if (kreq_number(o, "frequency_penalty", -2, 2, &s->frequency_penalty, NULL, e)) return -1;
    s->repetition_penalty = 1;
    if (kreq_number(o, "repetition_penalty", 0, 100, &s->repetition_penalty, NULL, e)) return -1;
    if (s->repetition_penalty <= 0) {
        oai_error_set(e, 400, "repetition_penalty", "invalid_value", "repetition_penalty must be more than 0 (1 is off)");
        return -1;
    }
    if (parse_logprobs(o, default_max < 0, s, e)) return -1;
    /* n choices: choice i is the request with seed + i (docs/SERVE.md) */
    s->n = 1;
    if ((v = kreq_field(o, "n"))) {
        if (!json_is_integer(v)) return kreq_wrong_type(e, "n", "an integer", v);
        if (json_integer_value(v) < 1 || json_integer_value(v) > OAI_MAX_N) {
            oai_error_set(e, 400, "n", "invalid_value", "n must be 1 to %d, got %lld", OAI_MAX_N, (long long)json_integer_value(v));
            return -1;
        }
        s->n = (int)json_integer_value(v);
    }
    s->speculative = -1;
    if ((v = kreq_field(o, "speculative"))) {
        if (json_is_boolean(v)) s->speculative = json_is_true(v) ? -1 : 0;
        else if (!json_is_integer(v)) return kreq_wrong_type(e, "speculative", "a boolean or an integer", v);
        else if (json_integer_value(v) < 0 || json_integer_value(v) > 64) {
            oai_error_set(e, 400, "speculative", "invalid_value", "speculative must be 0 (off) to 64 drafts, got %lld",
                          (long long)json_integer_value(v));
            return -1;
        }
        else s->speculative = (long)json_integer_value(v);
    }
    return unsupported(o, e);
}

/* ------------------------------------------------------------------------------------------ */
/* chat                                                                                       */

/* content: a string, or an array of {"type": "text", "text": ...} parts (joined). */
static int get_content(json_t *m, size_t i, int required, kchat_message *out, kreq_arena *a, oai_error *e)
{
    char p[64];
    snprintf(p, sizeof p, "messages[%zu].content", i);
    json_t *c = kreq_field(m, "content");
    if (!c) {
        if (required) { oai_error_set(e, 400, p, "missing_required_parameter", "%s is required", p); return -1; }
        return 0;
    }
    if (json_is_string(c)) {
        out->content = json_string_value(c);
        out->content_len = json_string_length(c);
        return 0;
    }
    if (!json_is_array(c)) return kreq_wrong_type(e, p, "a string or an array of content parts", c);
    kbuf b = {0};
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *part = json_array_get(c, k), *t = json_object_get(part, "type"), *x = json_object_get(part, "text");
        char pp[96];
        snprintf(pp, sizeof pp, "%s[%zu]", p, k);
        if (!json_is_object(part)) { kbuf_free(&b); return kreq_wrong_type(e, pp, "an object", part); }
        if (!kreq_str_is(t, "text")) {
            kbuf_free(&b);
            oai_error_set(e, 400, pp, "unsupported_value", "%s: only text content parts are supported (type \"text\")", pp);
            return -1;
        }
        if (!json_is_string(x)) { kbuf_free(&b); return kreq_wrong_type(e, pp, "a text part with a string \"text\"", x ? x : part); }
        kbuf_add(&b, json_string_value(x), json_string_length(x));
    }
    kbuf_add(&b, "", 0);
    if (b.oom || !kreq_keep(a, b.p)) { if (b.oom) kbuf_free(&b); return OOM(e); }
    out->content = b.p;
    out->content_len = b.n;
    return 0;
}

static int get_string(json_t *o, const char *key, const char *param, const char **out, oai_error *e)
{
    json_t *v = kreq_field(o, key);
    if (!v) return 0;
    if (!json_is_string(v)) return kreq_wrong_type(e, param, "a string", v);
    if (kreq_c_string(v, param, e)) return -1;
    *out = json_string_value(v);
    return 0;
}

static int get_tool_calls(json_t *m, size_t i, kchat_message *out, kreq_arena *a, oai_error *e)
{
    char p[96];
    snprintf(p, sizeof p, "messages[%zu].tool_calls", i);
    json_t *tc = kreq_field(m, "tool_calls");
    if (!tc) return 0;
    if (!json_is_array(tc)) return kreq_wrong_type(e, p, "an array", tc);
    size_t n = json_array_size(tc);
    kchat_tool_call *calls = kreq_keep(a, calloc(n ? n : 1, sizeof *calls));
    if (!calls) return OOM(e);
    for (size_t k = 0; k < n; k++) {
        json_t *c = json_array_get(tc, k), *f = json_object_get(c, "function");
        snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu]", i, k);
        if (!json_is_object(c)) return kreq_wrong_type(e, p, "an object", c);
        json_t *type = kreq_field(c, "type");
        if (type && !kreq_str_is(type, "function")) {
            oai_error_set(e, 400, p, "invalid_value", "%s.type must be \"function\"", p);
            return -1;
        }
        if (!json_is_object(f)) { strcat(p, ".function"); return f ? kreq_wrong_type(e, p, "an object", f) :
                                  (oai_error_set(e, 400, p, "missing_required_parameter", "%s is required", p), -1); }
        char q[128];
        snprintf(q, sizeof q, "%s.id", p);
        if (get_string(c, "id", q, &calls[k].id, e)) return -1;
        json_t *name = json_object_get(f, "name"), *args = kreq_field(f, "arguments");
        if (!json_is_string(name) || !json_string_length(name)) {
            strcat(p, ".function.name");
            oai_error_set(e, 400, p, "missing_required_parameter", "%s must be a non-empty string", p);
            return -1;
        }
        snprintf(q, sizeof q, "%s.function.name", p);
        if (kreq_c_string(name, q, e)) return -1;
        calls[k].name = json_string_value(name);
        snprintf(q, sizeof q, "%s.function.arguments", p);
        if (json_is_string(args) && kreq_c_string(args, q, e)) return -1;
        if (json_is_string(args)) calls[k].arguments = json_string_value(args);
        else if (json_is_object(args)) {
            /* some clients send the arguments as an object rather than JSON text */
            calls[k].arguments = kreq_keep(a, json_dumps(args, JSON_COMPACT));
            if (!calls[k].arguments) return OOM(e);
        } else if (args) {
            strcat(p, ".function.arguments");
            return kreq_wrong_type(e, p, "a string of JSON", args);
        }
    }
    out->tool_calls = calls;
    out->n_tool_calls = n;
    return 0;
}

static int get_message(json_t *m, size_t i, kchat_message *out, kreq_arena *a, oai_error *e)
{
    char p[64];
    snprintf(p, sizeof p, "messages[%zu]", i);
    if (!json_is_object(m)) return kreq_wrong_type(e, p, "an object", m);
    json_t *role = json_object_get(m, "role");
    snprintf(p, sizeof p, "messages[%zu].role", i);
    if (!role) { oai_error_set(e, 400, p, "missing_required_parameter", "%s is required", p); return -1; }
    if (!json_is_string(role)) return kreq_wrong_type(e, p, "a string", role);
    if (kreq_c_string(role, p, e)) return -1;
    const char *r = json_string_value(role);
    if (!strcmp(r, "system") || !strcmp(r, "developer")) out->role = KCHAT_SYSTEM;
    else if (!strcmp(r, "user")) out->role = KCHAT_USER;
    else if (!strcmp(r, "assistant")) out->role = KCHAT_ASSISTANT;
    else if (!strcmp(r, "tool")) out->role = KCHAT_TOOL;
    else {
        oai_error_set(e, 400, p, "invalid_value", "%s: unknown role \"%.40s\" (expected system, developer, user, assistant or tool)", p, r);
        return -1;
    }
    snprintf(p, sizeof p, "messages[%zu].name", i);
    if (get_string(m, "name", p, &out->name, e)) return -1;
    if (out->role == KCHAT_ASSISTANT) {
        if (get_tool_calls(m, i, out, a, e)) return -1;
        if (get_content(m, i, out->n_tool_calls == 0, out, a, e)) return -1;
        /* reasoning_content (DeepSeek / vLLM) or reasoning: the think channel of the history */
        static const char *const rk[] = {"reasoning_content", "reasoning"};
        for (int k = 0; k < 2 && !out->reasoning; k++) {
            json_t *v = kreq_field(m, rk[k]);
            snprintf(p, sizeof p, "messages[%zu].%s", i, rk[k]);
            if (v && !json_is_string(v)) return kreq_wrong_type(e, p, "a string", v);
            if (v) { out->reasoning = json_string_value(v); out->reasoning_len = json_string_length(v); }
        }
        return 0;
    }
    if (get_content(m, i, 1, out, a, e)) return -1;
    if (out->role == KCHAT_TOOL) {
        snprintf(p, sizeof p, "messages[%zu].tool_call_id", i);
        json_t *id = kreq_field(m, "tool_call_id");
        if (!id) { oai_error_set(e, 400, p, "missing_required_parameter", "%s is required", p); return -1; }
        if (get_string(m, "tool_call_id", p, &out->tool_call_id, e)) return -1;
        out->tool_name = out->name;
        out->name = NULL;
    }
    return 0;
}

static int get_tool_choice(json_t *o, kchat_options *c, int declared, oai_error *e);

/* A function of that name is in tools. */
static int tool_declared(json_t *o, const char *name)
{
    json_t *t = kreq_field(o, "tools");
    for (size_t k = 0; k < json_array_size(t); k++) {
        json_t *n = json_object_get(json_object_get(json_array_get(t, k), "function"), "name");
        if (json_is_string(n) && !strcmp(json_string_value(n), name)) return 1;
    }
    return 0;
}

static int get_tools(json_t *o, kchat_options *c, kreq_arena *a, oai_error *e)
{
    json_t *t = kreq_field(o, "tools");
    if (!t) return get_tool_choice(o, c, 0, e);
    if (!json_is_array(t)) return kreq_wrong_type(e, "tools", "an array", t);
    for (size_t k = 0; k < json_array_size(t); k++) {
        json_t *x = json_array_get(t, k), *type = json_object_get(x, "type"), *f = json_object_get(x, "function");
        char p[64];
        snprintf(p, sizeof p, "tools[%zu]", k);
        if (!json_is_object(x)) return kreq_wrong_type(e, p, "an object", x);
        if (!kreq_str_is(type, "function")) {
            oai_error_set(e, 400, p, "invalid_value", "%s.type must be \"function\"", p);
            return -1;
        }
        if (!json_is_object(f)) { strcat(p, ".function"); return kreq_wrong_type(e, p, "an object", f ? f : json_null()); }
        json_t *name = json_object_get(f, "name"), *params = kreq_field(f, "parameters"), *desc = kreq_field(f, "description");
        if (!json_is_string(name) || !json_string_length(name) || json_string_length(name) > 64) {
            strcat(p, ".function.name");
            oai_error_set(e, 400, p, "invalid_value", "%s must be a string of 1 to 64 characters", p);
            return -1;
        }
        if (memchr(json_string_value(name), 0, json_string_length(name))) {
            strcat(p, ".function.name");
            return kreq_c_string(name, p, e);
        }
        for (const char *s = json_string_value(name); *s; s++)
            if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' || *s == '-')) {
                strcat(p, ".function.name");
                oai_error_set(e, 400, p, "invalid_value", "%s may contain only a-z, A-Z, 0-9, _ and -", p);
                return -1;
            }
        if (params && !json_is_object(params)) { strcat(p, ".function.parameters"); return kreq_wrong_type(e, p, "an object", params); }
        if (desc && !json_is_string(desc)) { strcat(p, ".function.description"); return kreq_wrong_type(e, p, "a string", desc); }
        {
            json_t *strict = kreq_field(f, "strict");
            if (strict && !json_is_boolean(strict)) { strcat(p, ".function.strict"); return kreq_wrong_type(e, p, "a boolean", strict); }
        }
    }
    c->tools_json = kreq_keep(a, json_dumps(t, JSON_COMPACT));
    if (!c->tools_json) return OOM(e);
    return get_tool_choice(o, c, json_array_size(t) > 0, e);
}

/* tool_choice, checked whether or not tools are given (declared: at least one is): "required"
 * without a tool is a 400, as OpenAI answers (issue 25.8); "auto" and "none" need none. */
static int get_tool_choice(json_t *o, kchat_options *c, int declared, oai_error *e)
{
    json_t *tc = kreq_field(o, "tool_choice");
    if (tc) {
        if (json_is_object(tc)) {
            /* {"type": "function", "function": {"name": NAME}}: that tool, by constrained decoding */
            json_t *type = json_object_get(tc, "type"), *f = json_object_get(tc, "function"), *name = json_object_get(f, "name");
            if (!kreq_str_is(type, "function")) {
                oai_error_set(e, 400, "tool_choice.type", "invalid_value", "tool_choice.type must be \"function\" (or give \"auto\", \"required\" or \"none\")");
                return -1;
            }
            if (!json_is_string(name)) return kreq_wrong_type(e, "tool_choice.function.name", "a string", name ? name : json_null());
            if (kreq_c_string(name, "tool_choice.function.name", e)) return -1;
            if (!declared || !tool_declared(o, json_string_value(name))) {
                oai_error_set(e, 400, "tool_choice.function.name", "invalid_value", "tool_choice names the function \"%.64s\", which is not in tools",
                              json_string_value(name));
                return -1;
            }
            c->tool_choice = KCHAT_TOOL_CHOICE_NAMED;
            c->tool_name = json_string_value(name);
            return 0;
        }
        if (!json_is_string(tc)) return kreq_wrong_type(e, "tool_choice", "a string", tc);
        if (kreq_c_string(tc, "tool_choice", e)) return -1;
        const char *s = json_string_value(tc);
        if (!strcmp(s, "auto")) c->tool_choice = KCHAT_TOOL_CHOICE_AUTO;
        else if (!strcmp(s, "none")) c->tool_choice = KCHAT_TOOL_CHOICE_NONE;
        else if (!strcmp(s, "required")) c->tool_choice = KCHAT_TOOL_CHOICE_REQUIRED;
        else {
            oai_error_set(e, 400, "tool_choice", "invalid_value", "tool_choice must be \"auto\", \"required\" or \"none\", got \"%.40s\"", s);
            return -1;
        }
        if (c->tool_choice == KCHAT_TOOL_CHOICE_REQUIRED && !declared) {
            oai_error_set(e, 400, "tool_choice", "invalid_value", "tool_choice \"required\" needs at least one tool in tools");
            return -1;
        }
    }
    return 0;
}

/* reasoning_effort and chat_template_kwargs -> thinking and effort. */
static int get_thinking(json_t *o, kchat_options *c, oai_error *e)
{
    json_t *v = kreq_field(o, "reasoning_effort");
    if (v) {
        if (!json_is_string(v)) return kreq_wrong_type(e, "reasoning_effort", "a string", v);
        if (kreq_c_string(v, "reasoning_effort", e)) return -1;
        const char *s = json_string_value(v);
        static const struct { const char *name; int thinking; kchat_effort effort; } map[] = {
            {"none", 0, KCHAT_EFFORT_NONE}, {"minimal", 1, KCHAT_EFFORT_LOW}, {"low", 1, KCHAT_EFFORT_LOW},
            {"medium", 1, KCHAT_EFFORT_HIGH}, {"high", 1, KCHAT_EFFORT_HIGH}, {"max", 1, KCHAT_EFFORT_MAX},
            {"xhigh", 1, KCHAT_EFFORT_MAX},
        };
        size_t k = 0;
        while (k < sizeof map / sizeof *map && strcmp(map[k].name, s)) k++;
        if (k == sizeof map / sizeof *map) {
            oai_error_set(e, 400, "reasoning_effort", "invalid_value",
                          "reasoning_effort must be none, minimal, low, medium, high, xhigh or max, got \"%.40s\"", s);
            return -1;
        }
        c->thinking = map[k].thinking;
        c->effort = map[k].effort;
    }
    json_t *kw = kreq_field(o, "chat_template_kwargs");
    if (!kw) return 0;
    if (!json_is_object(kw)) return kreq_wrong_type(e, "chat_template_kwargs", "an object", kw);
    json_t *t = json_object_get(kw, "thinking");
    if (t) {
        if (!json_is_boolean(t)) return kreq_wrong_type(e, "chat_template_kwargs.thinking", "a boolean", t);
        c->thinking = json_is_true(t);
        if (c->thinking && !v && c->effort == KCHAT_EFFORT_NONE) c->effort = KCHAT_EFFORT_MAX;
    }
    json_t *te = json_object_get(kw, "thinking_effort");
    if (te) {
        if (json_is_null(te)) c->effort = KCHAT_EFFORT_NONE;
        else if (!json_is_string(te) || memchr(json_string_value(te), 0, json_string_length(te)) ||
                 kchat_effort_parse(json_string_value(te)) == KCHAT_EFFORT_INVALID) {
            oai_error_set(e, 400, "chat_template_kwargs.thinking_effort", "invalid_value",
                          "chat_template_kwargs.thinking_effort must be \"low\", \"high\", \"max\" or null");
            return -1;
        } else c->effort = kchat_effort_parse(json_string_value(te));
    }
    return 0;
}

/* response_format: text, json_object, or json_schema {name, schema, strict, description}.  The
 * schema is compiled later (kchat_constraint: a refused keyword is a 400 there). */
static int get_response_format(json_t *o, kchat_options *c, kreq_arena *a, oai_error *e)
{
    json_t *rf = kreq_field(o, "response_format"), *rt, *js, *sc;
    if (!rf) return 0;
    if (!json_is_object(rf)) return kreq_wrong_type(e, "response_format", "an object", rf);
    rt = json_object_get(rf, "type");
    if (kreq_str_is(rt, "text")) return 0;
    if (kreq_str_is(rt, "json_object")) { c->format = KCHAT_FORMAT_JSON_OBJECT; return 0; }
    if (!kreq_str_is(rt, "json_schema")) {
        oai_error_set(e, 400, "response_format.type", "invalid_value", "response_format.type must be \"text\", \"json_object\" or \"json_schema\"");
        return -1;
    }
    js = json_object_get(rf, "json_schema");
    if (!json_is_object(js)) return kreq_wrong_type(e, "response_format.json_schema", "an object", js ? js : json_null());
    {
        json_t *name = json_object_get(js, "name"), *strict = kreq_field(js, "strict");
        if (name && !json_is_string(name)) return kreq_wrong_type(e, "response_format.json_schema.name", "a string", name);
        if (strict && !json_is_boolean(strict)) return kreq_wrong_type(e, "response_format.json_schema.strict", "a boolean", strict);
    }
    sc = kreq_field(js, "schema");
    if (sc && !json_is_object(sc) && !json_is_boolean(sc))
        return kreq_wrong_type(e, "response_format.json_schema.schema", "a JSON Schema (an object)", sc);
    c->format = KCHAT_FORMAT_JSON_SCHEMA;
    /* no schema: any JSON value */
    c->format_schema = kreq_keep(a, sc ? json_dumps(sc, JSON_COMPACT | JSON_ENCODE_ANY) : strdup("{}"));
    if (!c->format_schema) return OOM(e);
    return 0;
}

int oai_parse_chat_request(const char *body, size_t len, oai_chat_request *req, oai_error *e)
{
    memset(req, 0, sizeof *req);
    kreq_arena *a = calloc(1, sizeof *a);
    if (!a) return OOM(e);
    if (!(a->root = kreq_body(body, len, e))) { kreq_arena_free(a); return -1; }
    json_t *o = a->root, *msgs = json_object_get(o, "messages");
    kchat_options_default(&req->chat);
    if (!msgs) { oai_error_set(e, 400, "messages", "missing_required_parameter", "messages is required"); goto bad; }
    if (!json_is_array(msgs)) { kreq_wrong_type(e, "messages", "an array", msgs); goto bad; }
    size_t n = json_array_size(msgs);
    if (!n) { oai_error_set(e, 400, "messages", "invalid_value", "messages must not be empty"); goto bad; }
    req->messages = kreq_keep(a, calloc(n, sizeof *req->messages));
    if (!req->messages) { kreq_oom(e); goto bad; }
    for (size_t i = 0; i < n; i++)
        if (get_message(json_array_get(msgs, i), i, &req->messages[i], a, e)) goto bad;
    req->n_messages = n;
    if (get_tools(o, &req->chat, a, e) || get_thinking(o, &req->chat, e)) goto bad;
    if (get_response_format(o, &req->chat, a, e)) goto bad;
    if (parse_sampling(o, &req->s, -1, 1, a, e)) goto bad;
    return kreq_end(a, &req->own, req, sizeof *req, 1);
bad:
    return kreq_end(a, &req->own, req, sizeof *req, 0);
}

void oai_chat_request_free(oai_chat_request *req)
{
    if (req) kreq_end(req->own, &req->own, req, sizeof *req, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* completions                                                                                */

static int get_ids(json_t *arr, const char *param, size_t vocab, oai_completion_request *req, kreq_arena *a, oai_error *e)
{
    size_t n = json_array_size(arr);
    req->prompt_ids = kreq_keep(a, malloc((n ? n : 1) * sizeof *req->prompt_ids));
    if (!req->prompt_ids) return OOM(e);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(arr, i);
        if (!json_is_integer(x)) {
            oai_error_set(e, 400, param, "invalid_type", "%s[%zu] must be a token id (an integer), not %s", param, i, kreq_kind(x));
            return -1;
        }
        json_int_t id = json_integer_value(x);
        if (id < 0 || (uint64_t)id >= vocab) {
            oai_error_set(e, 400, param, "invalid_value", "token id %lld at %s[%zu] is outside the vocabulary (0..%zu)",
                          (long long)id, param, i, vocab ? vocab - 1 : 0);
            return -1;
        }
        req->prompt_ids[i] = (int32_t)id;
    }
    req->n_prompt_ids = n;
    return 0;
}

int oai_parse_completion_request(const char *body, size_t len, size_t vocab, oai_completion_request *req, oai_error *e)
{
    memset(req, 0, sizeof *req);
    kreq_arena *a = calloc(1, sizeof *a);
    if (!a) return OOM(e);
    if (!(a->root = kreq_body(body, len, e))) { kreq_arena_free(a); return -1; }
    json_t *o = a->root, *p = json_object_get(o, "prompt");
    if (!p) { oai_error_set(e, 400, "prompt", "missing_required_parameter", "prompt is required"); goto bad; }
    /* an array of one prompt is that prompt */
    if (json_is_array(p) && json_array_size(p) >= 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)))) {
        if (json_array_size(p) > 1) {
            oai_error_set(e, 400, "prompt", "unsupported_value", "one prompt per request (got %zu)", json_array_size(p));
            goto bad;
        }
        p = json_array_get(p, 0);
    }
    if (json_is_string(p)) {
        /* all prompt_len bytes (a "\u0000" inside is a byte of the text, not its end) */
        req->prompt = kreq_keep(a, kreq_text_copy(json_string_value(p), json_string_length(p)));
        if (!req->prompt) { kreq_oom(e); goto bad; }
        req->prompt_len = json_string_length(p);
        if (!req->prompt_len) { oai_error_set(e, 400, "prompt", "invalid_value", "prompt must not be empty"); goto bad; }
    } else if (json_is_array(p)) {
        if (!json_array_size(p)) { oai_error_set(e, 400, "prompt", "invalid_value", "prompt must not be empty"); goto bad; }
        if (get_ids(p, "prompt", vocab, req, a, e)) goto bad;
    } else {
        kreq_wrong_type(e, "prompt", "a string, an array of token ids, or an array of one of those", p);
        goto bad;
    }
    json_t *v;
    if (kreq_bool(o, "echo", &req->echo, e)) goto bad;
    if ((v = kreq_field(o, "suffix"))) {
        oai_error_set(e, 400, "suffix", "unsupported_value", "suffix is not supported");
        goto bad;
    }
    if ((v = kreq_field(o, "best_of")) && !(json_is_integer(v) && json_integer_value(v) == 1)) {
        oai_error_set(e, 400, "best_of", "unsupported_value", "best_of must be 1");
        goto bad;
    }
    if (parse_sampling(o, &req->s, 16, req->echo ? 0 : 1, a, e)) goto bad;
    return kreq_end(a, &req->own, req, sizeof *req, 1);
bad:
    return kreq_end(a, &req->own, req, sizeof *req, 0);
}

void oai_completion_request_free(oai_completion_request *req)
{
    if (req) kreq_end(req->own, &req->own, req, sizeof *req, 0);
}

int oai_check_model(const char *requested, const char *served, oai_error *e)
{
    if (!requested || (served && !strcmp(requested, served))) return 0;
    oai_error_set(e, 404, "model", "model_not_found", "The model `%.200s` does not exist; this server serves `%.200s`",
                  requested, served ? served : "");
    return -1;
}
