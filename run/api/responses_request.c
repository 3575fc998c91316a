/* Responses API request bodies -> krun requests (see responses.h). */
#include "responses.h"

#include "reqjson.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_INCLUDE 16

/* The conversation as it is read: messages, an assistant message being assembled (its reasoning,
 * text and calls come as separate items). */
typedef struct {
    kchat_message *m;
    size_t n, cap;
    int open;                 /* m[n - 1] is an assistant message still taking items */
    kreq_arena *a;
    oai_error *e;
} conv;

static kchat_message *push(conv *c, kchat_role role)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        kchat_message *m = realloc(c->m, cap * sizeof *m);
        if (!m) return NULL;
        c->m = m;
        c->cap = cap;
    }
    memset(&c->m[c->n], 0, sizeof *c->m);
    c->m[c->n].role = role;
    c->open = role == KCHAT_ASSISTANT;
    return &c->m[c->n++];
}

/* s appended to *text (*len bytes, kept in the arena). */
static int append(conv *c, const char **text, size_t *len, const char *s, size_t n)
{
    char *t = malloc(*len + n + 1);
    if (!t || !kreq_keep(c->a, t)) return OOM(c->e);
    if (*len) memcpy(t, *text, *len);
    memcpy(t + *len, s, n);
    t[*len + n] = 0;
    *text = t;
    *len += n;
    return 0;
}

/* A message's content: a string, or parts of the text kinds (joined). */
static int content_text(conv *c, json_t *content, const char *p, const char **text, size_t *len)
{
    char q[160];
    *text = NULL;
    *len = 0;
    if (json_is_string(content)) { *text = json_string_value(content); *len = json_string_length(content); return 0; }
    if (!json_is_array(content)) return content ? kreq_wrong_type(c->e, p, "a string or an array of content parts", content) : kreq_missing(c->e, p);
    for (size_t k = 0; k < json_array_size(content); k++) {
        json_t *part = json_array_get(content, k), *type = json_object_get(part, "type"), *t = json_object_get(part, "text");
        snprintf(q, sizeof q, "%s[%zu]", p, k);
        if (!json_is_object(part)) return kreq_wrong_type(c->e, q, "a content part", part);
        if (!kreq_str_is(type, "input_text") && !kreq_str_is(type, "output_text") && !kreq_str_is(type, "text")) {
            strcat(q, ".type");
            return kreq_refuse(c->e, q, "content parts of type \"%.40s\" are not supported (input_text and output_text are)",
                          json_is_string(type) ? json_string_value(type) : "?");
        }
        strcat(q, ".text");
        if (!json_is_string(t)) return t ? kreq_wrong_type(c->e, q, "a string", t) : kreq_missing(c->e, q);
        if (append(c, text, len, json_string_value(t), json_string_length(t))) return -1;
    }
    if (!*text) *text = "";
    return 0;
}

/* The assistant message items join (reasoning, text, calls in that order): a new one unless the
 * open one can still take what comes. */
static kchat_message *assistant(conv *c, int what)      /* 0 reasoning, 1 text, 2 a call */
{
    kchat_message *m = c->open && c->n ? &c->m[c->n - 1] : NULL;
    if (m && ((what == 0 && (m->content_len || m->n_tool_calls)) || (what == 1 && m->n_tool_calls))) m = NULL;
    return m ? m : push(c, KCHAT_ASSISTANT);
}

/* Reasoning an earlier response gave back to the client (encrypted_content): krun's is the text,
 * base64, after "krun1:". */
static int reasoning_from_blob(conv *c, const char *blob, const char **text, size_t *len)
{
    static const char tag[] = "krun1:";
    size_t n = strlen(blob), k = 0;
    unsigned char *out;
    uint32_t acc = 0;
    int bits = 0;
    if (strncmp(blob, tag, sizeof tag - 1)) return 0;          /* not krun's: nothing readable */
    blob += sizeof tag - 1;
    n -= sizeof tag - 1;
    out = malloc(n + 1);
    if (!out || !kreq_keep(c->a, out)) return OOM(c->e);
    for (size_t i = 0; i < n && blob[i] != '='; i++) {
        const char *A = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", *at = strchr(A, blob[i]);
        if (!at || !blob[i]) return 0;
        acc = acc << 6 | (uint32_t)(at - A);
        bits += 6;
        if (bits >= 8) { bits -= 8; out[k++] = (unsigned char)(acc >> bits); }
    }
    out[k] = 0;
    return append(c, text, len, (const char *)out, k);
}

static int item(conv *c, json_t *it, const char *p)
{
    json_t *type = json_object_get(it, "type"), *role = json_object_get(it, "role");
    char q[160];
    if (!json_is_object(it)) return kreq_wrong_type(c->e, p, "an item (an object)", it);
    if (type && !json_is_string(type)) { snprintf(q, sizeof q, "%s.type", p); return kreq_wrong_type(c->e, q, "a string", type); }
    if (!type || kreq_str_is(type, "message")) {
        kchat_message *m;
        const char *text;
        size_t len;
        snprintf(q, sizeof q, "%s.role", p);
        if (!json_is_string(role)) return role ? kreq_wrong_type(c->e, q, "a string", role) : kreq_missing(c->e, q);
        snprintf(q, sizeof q, "%s.content", p);
        if (content_text(c, json_object_get(it, "content"), q, &text, &len)) return -1;
        if (kreq_str_is(role, "assistant")) {
            if (!(m = assistant(c, 1))) return OOM(c->e);
            return append(c, &m->content, &m->content_len, text, len);
        }
        if (kreq_str_is(role, "user")) m = push(c, KCHAT_USER);
        else if (kreq_str_is(role, "system") || kreq_str_is(role, "developer")) m = push(c, KCHAT_SYSTEM);
        else {
            snprintf(q, sizeof q, "%s.role", p);
            return kreq_refuse(c->e, q, "unknown role \"%.40s\" (user, system, developer or assistant)", json_string_value(role));
        }
        if (!m) return OOM(c->e);
        m->content = text;
        m->content_len = len;
        return 0;
    }
    if (kreq_str_is(type, "function_call")) {
        json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name"), *args = json_object_get(it, "arguments");
        kchat_message *m = assistant(c, 2);
        kchat_tool_call *calls;
        if (!m) return OOM(c->e);
        snprintf(q, sizeof q, "%s.call_id", p);
        if (!json_is_string(id)) return id ? kreq_wrong_type(c->e, q, "a string", id) : kreq_missing(c->e, q);
        if (kreq_c_string(id, q, c->e)) return -1;
        snprintf(q, sizeof q, "%s.name", p);
        if (!json_is_string(name)) return name ? kreq_wrong_type(c->e, q, "a string", name) : kreq_missing(c->e, q);
        if (kreq_c_string(name, q, c->e)) return -1;
        snprintf(q, sizeof q, "%s.arguments", p);
        if (!json_is_string(args)) return args ? kreq_wrong_type(c->e, q, "a string of JSON", args) : kreq_missing(c->e, q);
        if (kreq_c_string(args, q, c->e)) return -1;
        calls = malloc((m->n_tool_calls + 1) * sizeof *calls);
        if (!calls || !kreq_keep(c->a, calls)) return OOM(c->e);
        if (m->n_tool_calls) memcpy(calls, m->tool_calls, m->n_tool_calls * sizeof *calls);
        calls[m->n_tool_calls] = (kchat_tool_call){json_string_value(id), json_string_value(name), json_string_value(args)};
        {
            /* a call of a namespace's function: NAMESPACE.NAME, as it was declared */
            json_t *ns = kreq_field(it, "namespace");
            char *full;
            if (ns && !json_is_string(ns)) { snprintf(q, sizeof q, "%s.namespace", p); return kreq_wrong_type(c->e, q, "a string", ns); }
            if (ns && asprintf(&full, "%s.%s", json_string_value(ns), json_string_value(name)) >= 0) {
                if (!kreq_keep(c->a, full)) return OOM(c->e);
                calls[m->n_tool_calls].name = full;
            } else if (ns) {
                return OOM(c->e);
            }
        }
        m->tool_calls = calls;
        m->n_tool_calls++;
        return 0;
    }
    if (kreq_str_is(type, "function_call_output")) {
        json_t *id = json_object_get(it, "call_id");
        kchat_message *m;
        snprintf(q, sizeof q, "%s.call_id", p);
        if (!json_is_string(id)) return id ? kreq_wrong_type(c->e, q, "a string", id) : kreq_missing(c->e, q);
        if (kreq_c_string(id, q, c->e)) return -1;
        if (!(m = push(c, KCHAT_TOOL))) return OOM(c->e);
        m->tool_call_id = json_string_value(id);
        snprintf(q, sizeof q, "%s.output", p);
        return content_text(c, json_object_get(it, "output"), q, &m->content, &m->content_len);
    }
    if (kreq_str_is(type, "reasoning")) {
        /* the think channel of the assistant message that follows: its reasoning_text content, else
         * krun's encrypted_content, else its summary */
        json_t *content = kreq_field(it, "content"), *enc = kreq_field(it, "encrypted_content"), *sum = kreq_field(it, "summary");
        kchat_message *m = assistant(c, 0);
        if (!m) return OOM(c->e);
        snprintf(q, sizeof q, "%s.content", p);
        if (content && json_array_size(content)) {
            for (size_t k = 0; k < json_array_size(content); k++) {
                json_t *t = json_object_get(json_array_get(content, k), "text");
                if (!json_is_string(t)) {
                    snprintf(q, sizeof q, "%s.content[%zu].text", p, k);
                    return kreq_wrong_type(c->e, q, "a string", t ? t : json_null());
                }
                if (append(c, &m->reasoning, &m->reasoning_len, json_string_value(t), json_string_length(t))) return -1;
            }
            return 0;
        }
        if (json_is_string(enc) && !memchr(json_string_value(enc), 0, json_string_length(enc)))
            return reasoning_from_blob(c, json_string_value(enc), &m->reasoning, &m->reasoning_len);
        for (size_t k = 0; json_is_array(sum) && k < json_array_size(sum); k++) {
            json_t *t = json_object_get(json_array_get(sum, k), "text");
            if (json_is_string(t) && append(c, &m->reasoning, &m->reasoning_len, json_string_value(t), json_string_length(t))) return -1;
        }
        return 0;
    }
    snprintf(q, sizeof q, "%s.type", p);
    return kreq_refuse(c->e, q, "items of type \"%.40s\" are not supported (message, function_call, function_call_output and "
                  "reasoning are)", json_string_value(type));
}

static int items(conv *c, json_t *arr, const char *name)
{
    for (size_t i = 0; i < json_array_size(arr); i++) {
        char p[64];
        snprintf(p, sizeof p, "%s[%zu]", name, i);
        if (item(c, json_array_get(arr, i), p)) return -1;
    }
    c->open = 0;
    return 0;
}

/* The tools OpenAI's servers run (web search, file search, code interpreter, ...): accepted, not offered. */
static int hosted_tool(const json_t *type)
{
    static const char *const hosted[] = {"web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11",
                                         "file_search", "code_interpreter", "image_generation", "computer_use_preview", "mcp"};
    for (size_t k = 0; k < sizeof hosted / sizeof *hosted; k++)
        if (kreq_str_is(type, hosted[k])) return 1;
    return 0;
}

/* A function tool {type, name, description, parameters, strict} (in namespace ns, or none) into the chat
 * tools array, strict unless it says otherwise (the Responses API's default). */
static int function_tool(json_t *x, const char *ns, const char *p, json_t *chat, oai_error *e)
{
    json_t *name = json_object_get(x, "name"), *params = kreq_field(x, "parameters"), *desc = kreq_field(x, "description");
    json_t *strict = kreq_field(x, "strict"), *f;
    char q[96], full[160];
    snprintf(q, sizeof q, "%s.type", p);
    if (!json_is_object(x)) return kreq_wrong_type(e, p, "an object", x);
    if (ns && !kreq_str_is(json_object_get(x, "type"), "function"))
        return kreq_refuse(e, q, "%s", "a namespace holds function tools only here");
    snprintf(q, sizeof q, "%s.name", p);
    if (!json_is_string(name) || !kreq_tool_name_ok(name)) return name ? kreq_refuse(e, q, "%s", "must match ^[a-zA-Z0-9_-]{1,64}$") : kreq_missing(e, q);
    snprintf(q, sizeof q, "%s.parameters", p);
    if (params && !json_is_object(params)) return kreq_wrong_type(e, q, "an object", params);
    snprintf(q, sizeof q, "%s.description", p);
    if (desc && !json_is_string(desc)) return kreq_wrong_type(e, q, "a string", desc);
    snprintf(q, sizeof q, "%s.strict", p);
    if (strict && !json_is_boolean(strict)) return kreq_wrong_type(e, q, "a boolean", strict);
    snprintf(full, sizeof full, "%s%s%s", ns ? ns : "", ns ? "." : "", json_string_value(name));
    f = json_pack("{ss sO* so sb}", "name", full, "description", desc, "parameters", params ? json_incref(params) : json_object(),
                  "strict", strict ? json_is_true(strict) : 1);
    if (!f || json_array_append_new(chat, json_pack("{ss so}", "type", "function", "function", f))) return OOM(e);
    return 0;
}

/* tools -> the chat tools array (OpenAI's chat shape) and the echo's; tool_choice; parallel_tool_calls. */
static int get_tools(json_t *o, oresp_request *r, kreq_arena *a, oai_error *e)
{
    json_t *t = kreq_field(o, "tools"), *tc = kreq_field(o, "tool_choice"), *chat = json_array(), *echo = json_array();
    int parallel = 1;
    size_t n = json_array_size(t);
    char p[64];
    if (!chat || !echo) goto oom;
    if (t && !json_is_array(t)) { json_decref(chat); json_decref(echo); return kreq_wrong_type(e, "tools", "an array", t); }
    for (size_t k = 0; k < n; k++) {
        json_t *x = json_array_get(t, k), *type = json_object_get(x, "type");
        snprintf(p, sizeof p, "tools[%zu]", k);
        if (!json_is_object(x)) { json_decref(chat); json_decref(echo); return kreq_wrong_type(e, p, "an object", x); }
        if (kreq_str_is(type, "namespace")) {
            /* a group of functions: declared as NAMESPACE.NAME (a call of one comes back with its namespace) */
            json_t *ns = json_object_get(x, "name"), *fs = json_object_get(x, "tools");
            snprintf(p, sizeof p, "tools[%zu].name", k);
            if (!json_is_string(ns) || !kreq_tool_name_ok(ns)) {
                json_decref(chat);
                json_decref(echo);
                return kreq_refuse(e, p, "%s", "must match ^[a-zA-Z0-9_-]{1,64}$");
            }
            snprintf(p, sizeof p, "tools[%zu].tools", k);
            if (!json_is_array(fs)) { json_decref(chat); json_decref(echo); return kreq_wrong_type(e, p, "an array of function tools", fs ? fs : json_null()); }
            for (size_t i = 0; i < json_array_size(fs); i++) {
                snprintf(p, sizeof p, "tools[%zu].tools[%zu]", k, i);
                if (function_tool(json_array_get(fs, i), json_string_value(ns), p, chat, e)) { json_decref(chat); json_decref(echo); return -1; }
            }
        } else if (kreq_str_is(type, "function")) {
            if (function_tool(x, NULL, p, chat, e)) { json_decref(chat); json_decref(echo); return -1; }
        } else if (hosted_tool(type)) {
            /* run by OpenAI's servers: krun has none to run, so the model is not offered it (docs/SERVE.md) */
            continue;
        } else {
            json_decref(chat); json_decref(echo);
            strcat(p, ".type");
            return kreq_refuse(e, p, "tools of type \"%.40s\" are not supported: krun runs function tools (and namespaces of them)",
                          json_is_string(type) ? json_string_value(type) : "?");
        }
        if (json_array_append(echo, x)) goto oom;
    }
    n = json_array_size(chat);
    if (n) {
        r->chat.tools_json = kreq_keep(a, json_dumps(chat, JSON_COMPACT));
        if (!r->chat.tools_json) goto oom;
    }
    if (json_object_set_new(r->echo, "tools", echo)) { json_decref(chat); return OOM(e); }
    if (tc) {
        if (json_is_string(tc)) {
            if (kreq_str_is(tc, "auto")) r->chat.tool_choice = KCHAT_TOOL_CHOICE_AUTO;
            else if (kreq_str_is(tc, "none")) r->chat.tool_choice = KCHAT_TOOL_CHOICE_NONE;
            else if (kreq_str_is(tc, "required")) r->chat.tool_choice = KCHAT_TOOL_CHOICE_REQUIRED;
            else {
                json_decref(chat);
                return kreq_refuse(e, "tool_choice", "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\"}, "
                                   "not \"%.40s\"", json_string_value(tc));
            }
            if (r->chat.tool_choice == KCHAT_TOOL_CHOICE_REQUIRED && !n) {
                json_decref(chat);
                return kreq_refuse(e, "tool_choice", "%s", "\"required\" needs at least one tool in tools");
            }
        } else if (json_is_object(tc) && kreq_str_is(json_object_get(tc, "type"), "function")) {
            json_t *name = json_object_get(tc, "name"), *ns = kreq_field(tc, "namespace");
            size_t k = 0;
            char full[160], *kept;
            int bad = !json_is_string(name) ? (name ? kreq_wrong_type(e, "tool_choice.name", "a string", name) : kreq_missing(e, "tool_choice.name"))
                      : kreq_c_string(name, "tool_choice.name", e) ? -1
                      : ns && !json_is_string(ns) ? kreq_wrong_type(e, "tool_choice.namespace", "a string", ns)
                      : ns && kreq_c_string(ns, "tool_choice.namespace", e) ? -1 : 0;
            if (bad) { json_decref(chat); return -1; }
            snprintf(full, sizeof full, "%s%s%s", ns ? json_string_value(ns) : "", ns ? "." : "", json_string_value(name));
            while (k < n && strcmp(json_string_value(json_object_get(json_object_get(json_array_get(chat, k), "function"), "name")), full)) k++;
            if (k == n) { json_decref(chat); return kreq_refuse(e, "tool_choice.name", "the function \"%.64s\" is not in tools", full); }
            if (!(kept = kreq_keep(a, strdup(full)))) { json_decref(chat); return OOM(e); }
            r->chat.tool_choice = KCHAT_TOOL_CHOICE_NAMED;
            r->chat.tool_name = kept;
        } else if (json_is_object(tc)) {
            json_t *type = json_object_get(tc, "type");
            json_decref(chat);
            return kreq_refuse(e, "tool_choice.type", "\"%.40s\" is not supported (function is)", json_is_string(type) ? json_string_value(type) : "?");
        } else {
            json_decref(chat);
            return kreq_wrong_type(e, "tool_choice", "a string or an object", tc);
        }
        if (json_object_set(r->echo, "tool_choice", tc)) { json_decref(chat); return OOM(e); }
    } else if (json_object_set_new(r->echo, "tool_choice", json_string("auto"))) {
        json_decref(chat);
        return OOM(e);
    }
    json_decref(chat);
    if (kreq_bool(o, "parallel_tool_calls", &parallel, e)) return -1;
    r->chat.single_call = !parallel;
    if (json_object_set_new(r->echo, "parallel_tool_calls", json_boolean(parallel))) return OOM(e);
    return 0;
oom:
    json_decref(chat);
    json_decref(echo);
    return OOM(e);
}

/* text: {format: {type: text | json_object | json_schema (name, schema, strict, description)}, verbosity}. */
static int get_text(json_t *o, oresp_request *r, kreq_arena *a, oai_error *e)
{
    json_t *t = kreq_field(o, "text"), *f, *v;
    if (!t) return json_object_set_new(r->echo, "text", json_pack("{s{ss}}", "format", "type", "text")) ? OOM(e) : 0;
    if (!json_is_object(t)) return kreq_wrong_type(e, "text", "an object", t);
    if ((v = kreq_field(t, "verbosity")) && !kreq_str_is(v, "low") && !kreq_str_is(v, "medium") && !kreq_str_is(v, "high"))
        return kreq_refuse(e, "text.verbosity", "%s", "must be \"low\", \"medium\" or \"high\"");
    if ((f = kreq_field(t, "format"))) {
        json_t *type = json_object_get(f, "type");
        if (!json_is_object(f)) return kreq_wrong_type(e, "text.format", "an object", f);
        if (kreq_str_is(type, "json_object")) r->chat.format = KCHAT_FORMAT_JSON_OBJECT;
        else if (kreq_str_is(type, "json_schema")) {
            json_t *schema = json_object_get(f, "schema"), *name = json_object_get(f, "name"), *strict = kreq_field(f, "strict");
            if (!json_is_string(name)) return name ? kreq_wrong_type(e, "text.format.name", "a string", name) : kreq_missing(e, "text.format.name");
            if (!schema) return kreq_missing(e, "text.format.schema");
            if (!json_is_object(schema) && !json_is_boolean(schema)) return kreq_wrong_type(e, "text.format.schema", "a JSON Schema (an object)", schema);
            if (strict && !json_is_boolean(strict)) return kreq_wrong_type(e, "text.format.strict", "a boolean", strict);
            r->chat.format = KCHAT_FORMAT_JSON_SCHEMA;
            r->chat.format_schema = kreq_keep(a, json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY));
            if (!r->chat.format_schema) return OOM(e);
        } else if (!kreq_str_is(type, "text")) {
            return kreq_refuse(e, "text.format.type", "%s", "must be \"text\", \"json_object\" or \"json_schema\"");
        }
    }
    return json_object_set(r->echo, "text", t) ? OOM(e) : 0;
}

/* reasoning: {effort, summary}: K3's thinking and effort (as the chat endpoint's reasoning_effort). */
static int get_reasoning(json_t *o, oresp_request *r, oai_error *e)
{
    json_t *rs = kreq_field(o, "reasoning"), *ef, *sum;
    if (!rs) return json_object_set_new(r->echo, "reasoning", json_pack("{snsn}", "effort", "summary")) ? OOM(e) : 0;
    if (!json_is_object(rs)) return kreq_wrong_type(e, "reasoning", "an object", rs);
    if ((ef = kreq_field(rs, "effort"))) {
        r->chat.effort_given = 1;
        if (!json_is_string(ef) || memchr(json_string_value(ef), 0, json_string_length(ef)) || kreq_effort(json_string_value(ef), &r->chat))
            return kreq_refuse(e, "reasoning.effort", "%s", "must be none, minimal, low, medium, high or xhigh");
    }
    sum = kreq_field(rs, "summary");
    if (!sum) sum = kreq_field(rs, "generate_summary");
    if (sum && !kreq_str_is(sum, "auto") && !kreq_str_is(sum, "concise") && !kreq_str_is(sum, "detailed"))
        return kreq_refuse(e, "reasoning.summary", "%s", "must be \"auto\", \"concise\" or \"detailed\"");
    /* K3 writes no summary: the reasoning itself is given (reasoning_text), the summary stays empty */
    return json_object_set_new(r->echo, "reasoning", json_pack("{sOsO}", "effort", ef ? ef : json_null(), "summary", sum ? sum : json_null()))
           ? OOM(e) : 0;
}

static int get_sampling(json_t *o, oresp_request *r, kreq_arena *a, oai_error *e)
{
    oai_sampling *s = &r->s;
    json_t *v;
    memset(s, 0, sizeof *s);
    s->temperature = 1;
    s->top_p = 1;
    s->max_tokens = -1;
    s->speculative = -1;
    s->repetition_penalty = 1;
    s->n = 1;
    if ((v = kreq_field(o, "model"))) {
        if (!json_is_string(v)) return kreq_wrong_type(e, "model", "a string", v);
        if (kreq_c_string(v, "model", e)) return -1;
        if (!(s->model = kreq_keep(a, strdup(json_string_value(v))))) return OOM(e);
    }
    if ((v = kreq_field(o, "max_output_tokens"))) {
        if (!json_is_integer(v)) return kreq_wrong_type(e, "max_output_tokens", "an integer", v);
        if (json_integer_value(v) < 1 || json_integer_value(v) > 0x7fffffff) return kreq_refuse(e, "max_output_tokens", "%s", "must be at least 1");
        s->max_tokens = (long)json_integer_value(v);
    }
    if (kreq_number(o, "temperature", 0, 2, &s->temperature, &s->has_temperature, e)) return -1;
    if (kreq_number(o, "top_p", 0, 1, &s->top_p, &s->has_top_p, e)) return -1;
    if ((v = kreq_field(o, "seed"))) {
        if (!json_is_integer(v)) return kreq_wrong_type(e, "seed", "an integer", v);
        s->seed = (int64_t)json_integer_value(v);
        s->has_seed = 1;
    }
    if (kreq_bool(o, "stream", &s->stream, e)) return -1;
    s->include_usage = 1;             /* the usage the response reports comes from the chat stream's last chunk */
    if ((v = kreq_field(o, "top_logprobs")) && !(json_is_integer(v) && json_integer_value(v) == 0))
        return kreq_refuse(e, "top_logprobs", "%s", "log-probabilities are not supported on /v1/responses (use /v1/chat/completions)");
    if ((v = kreq_field(o, "max_tool_calls")) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return kreq_refuse(e, "max_tool_calls", "%s", "only 1 is supported (one call at most; or leave it out)");
    if (v) r->chat.single_call = 1;
    if (json_object_set_new(r->echo, "max_output_tokens", s->max_tokens > 0 ? json_integer(s->max_tokens) : json_null()) ||
        json_object_set_new(r->echo, "temperature", json_real(s->temperature)) || json_object_set_new(r->echo, "top_p", json_real(s->top_p)))
        return OOM(e);
    return 0;
}

/* What krun cannot honour, and the settings the response only shows. */
static int get_rest(json_t *o, oresp_request *r, oai_error *e)
{
    static const char *const refused[] = {"background", "conversation", "prompt", "reasoning_summary_override"};
    json_t *v;
    for (size_t k = 0; k < sizeof refused / sizeof *refused; k++)
        if ((v = kreq_field(o, refused[k])) && !json_is_false(v))
            return kreq_refuse(e, refused[k], "%s", "is not supported by krun");
    if ((v = kreq_field(o, "truncation")) && !kreq_str_is(v, "disabled") && !kreq_str_is(v, "auto"))
        return kreq_refuse(e, "truncation", "%s", "must be \"disabled\" or \"auto\"");
    if ((v = kreq_field(o, "include"))) {
        if (!json_is_array(v) || json_array_size(v) > MAX_INCLUDE) return kreq_wrong_type(e, "include", "an array of strings", v);
        for (size_t k = 0; k < json_array_size(v); k++) {
            json_t *x = json_array_get(v, k);
            char p[32];
            snprintf(p, sizeof p, "include[%zu]", k);
            if (kreq_str_is(x, "reasoning.encrypted_content")) r->encrypted_reasoning = 1;
            else return kreq_refuse(e, p, "\"%.60s\" is not supported (reasoning.encrypted_content is)", json_is_string(x) ? json_string_value(x) : "?");
        }
    }
    r->store = 1;
    if (kreq_bool(o, "store", &r->store, e)) return -1;
    if ((v = kreq_field(o, "metadata")) && !json_is_object(v)) return kreq_wrong_type(e, "metadata", "an object", v);
    if ((v = kreq_field(o, "user")) && !json_is_string(v)) return kreq_wrong_type(e, "user", "a string", v);
    if (json_object_set_new(r->echo, "store", json_boolean(r->store)) ||
        json_object_set_new(r->echo, "metadata", kreq_field(o, "metadata") ? json_incref(kreq_field(o, "metadata")) : json_object()) ||
        json_object_set(r->echo, "user", kreq_field(o, "user") ? kreq_field(o, "user") : json_null()) ||
        json_object_set_new(r->echo, "truncation", json_string(kreq_str_is(kreq_field(o, "truncation"), "auto") ? "auto" : "disabled")))
        return OOM(e);
    return 0;
}

int oresp_parse_request(const char *body, size_t len, oresp_lookup lookup, void *ctx, oresp_request *req, oai_error *e)
{
    kreq_arena *a = calloc(1, sizeof *a);
    conv c = {0};
    json_t *o, *in, *prev, *ins, *prior = NULL;
    memset(req, 0, sizeof *req);
    if (!a) return OOM(e);
    if (!(a->root = kreq_body(body, len, e))) { kreq_arena_free(a); return -1; }
    o = a->root;
    c.a = a;
    c.e = e;
    kchat_options_default(&req->chat);
    if (!(req->echo = json_object())) { OOM(e); goto bad; }
    if (get_sampling(o, req, a, e) || get_reasoning(o, req, e) || get_tools(o, req, a, e) || get_text(o, req, a, e) || get_rest(o, req, e))
        goto bad;
    /* instructions: a system message first (not carried to the next response, as OpenAI has it) */
    if ((ins = kreq_field(o, "instructions"))) {
        kchat_message *m;
        if (!json_is_string(ins)) { kreq_wrong_type(e, "instructions", "a string", ins); goto bad; }
        if (!(m = push(&c, KCHAT_SYSTEM))) { OOM(e); goto bad; }
        m->content = json_string_value(ins);
        m->content_len = json_string_length(ins);
        c.open = 0;
    }
    if (json_object_set(req->echo, "instructions", ins ? ins : json_null())) { OOM(e); goto bad; }
    /* the conversation before: previous_response_id's */
    if ((prev = kreq_field(o, "previous_response_id"))) {
        if (!json_is_string(prev)) { kreq_wrong_type(e, "previous_response_id", "a string", prev); goto bad; }
        if (kreq_c_string(prev, "previous_response_id", e)) goto bad;
        if (!lookup || !(prior = lookup(ctx, json_string_value(prev)))) {
            oai_error_set(e, 404, "previous_response_id", "previous_response_not_found", "Previous response with id '%.100s' not found.",
                          json_string_value(prev));
            goto bad;
        }
        req->prior = prior;            /* the messages point into it */
        req->previous_response_id = json_string_value(prev);
        if (items(&c, prior, "previous_response_id")) goto bad;
    }
    if (json_object_set(req->echo, "previous_response_id", prev ? prev : json_null())) { OOM(e); goto bad; }
    /* this input */
    in = json_object_get(o, "input");
    if (!in) { kreq_missing(e, "input"); goto bad; }
    if (json_is_string(in)) req->input = json_pack("[{ss ss s[{ss sO}]}]", "type", "message", "role", "user", "content", "type", "input_text", "text", in);
    else if (json_is_array(in)) req->input = json_incref(in);
    else { kreq_wrong_type(e, "input", "a string or an array of items", in); goto bad; }
    if (!req->input) { OOM(e); goto bad; }
    if (items(&c, req->input, "input")) goto bad;
    if (!c.n) { kreq_refuse(e, "input", "%s", "the conversation is empty"); goto bad; }
    req->messages = kreq_keep(a, c.m);
    c.m = NULL;
    if (!req->messages) { OOM(e); goto bad; }
    req->n_messages = c.n;
    return kreq_end(a, &req->own, req, sizeof *req, 1);
bad:
    free(c.m);
    json_decref(prior);
    json_decref(req->echo);
    json_decref(req->input);
    return kreq_end(a, &req->own, req, sizeof *req, 0);
}

void oresp_request_free(oresp_request *req)
{
    if (!req) return;
    json_decref(req->echo);
    json_decref(req->input);
    json_decref(req->prior);
    kreq_end(req->own, &req->own, req, sizeof *req, 0);
}
