/* K3 chat format: rendering a conversation to token ids (see chat.h, spec K3_CHAT.md §1-§4). */
#include "chat.h"

#include "chat_seg.h"
#include "run/util/krun_err.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* The internal system messages' bodies, verbatim (spec §3, §4). */
static const char EFFORT_TEXT[] =
    "`thinking_effort` guides on how much to think in your thinking channel (not including the "
    "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort=%s`.";
static const char TOOLS_HEAD[] = "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n";
static const char TOOLS_TAIL[] = "\n```";
/* The internal system messages before the generation prompt (K3_CHAT.md §4: types tool-choice and
 * response-format), one row each.  The spec names the types but not their text: the none and
 * required rows are the text of encoding_k3.py as public reimplementations of it reproduce it; the
 * other three are stand-ins written here (docs/CHAT.md), until the release's text replaces them in
 * this table.  Whatever the model is told, the constraint (chat_constrain.c) makes the reply valid.
 * %s: the tool's name (twice), or the schema as compact JSON with sorted keys. */
static const struct { const char *type, *variant, *text; } DIRECTIVES[] = {
    {"tool-choice", "none", "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message."},
    {"tool-choice", "required", "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message."},
    {"tool-choice", "function",
     "The system is invoked with `tool_choice={\"type\": \"function\", \"function\": {\"name\": \"%s\"}}`.\n"
     "You MUST call the tool `%s` in the next message, and no other tool."},
    {"response-format", "json_object",
     "The system is invoked with `response_format=json_object`.\n"
     "Your response MUST be a single JSON object, with nothing before or after it."},
    {"response-format", "json_schema",
     "The system is invoked with `response_format=json_schema`.\n"
     "Your response MUST be a single JSON value, with nothing before or after it, that is valid against this JSON Schema:\n"
     "```json\n%s\n```"},
};

static const char *directive(const char *type, const char *variant)
{
    for (size_t i = 0; i < sizeof DIRECTIVES / sizeof *DIRECTIVES; i++)
        if (!strcmp(DIRECTIVES[i].type, type) && !strcmp(DIRECTIVES[i].variant, variant)) return DIRECTIVES[i].text;
    return "";
}

kchat_effort kchat_effort_parse(const char *s)
{
    if (!s) return KCHAT_EFFORT_INVALID;
    if (!strcmp(s, "low")) return KCHAT_EFFORT_LOW;
    if (!strcmp(s, "high")) return KCHAT_EFFORT_HIGH;
    if (!strcmp(s, "max")) return KCHAT_EFFORT_MAX;
    return KCHAT_EFFORT_INVALID;
}

const char *kchat_effort_name(kchat_effort e)
{
    switch (e) {
    case KCHAT_EFFORT_NONE: return "none";
    case KCHAT_EFFORT_LOW: return "low";
    case KCHAT_EFFORT_HIGH: return "high";
    case KCHAT_EFFORT_MAX: return "max";
    default: return "invalid";
    }
}

const char *kchat_role_name(kchat_role r)
{
    switch (r) {
    case KCHAT_SYSTEM: return "system";
    case KCHAT_USER: return "user";
    case KCHAT_ASSISTANT: return "assistant";
    case KCHAT_TOOL: return "tool";
    }
    return "?";
}

void kchat_options_default(kchat_options *o)
{
    memset(o, 0, sizeof *o);
    o->thinking = 1;
    o->effort = KCHAT_EFFORT_MAX;
    o->tool_choice = KCHAT_TOOL_CHOICE_AUTO;
    o->add_generation_prompt = 1;
}

void kchat_rendering_free(kchat_rendering *r)
{
    if (!r) return;
    free(r->ids);
    free(r->text);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------------------------------------ */

static void system_message(kseg *r, const char *type, const char *body, size_t len)
{
    const char *attrs[] = {"role", "system", "type", type, NULL};
    kseg_open(r, "message", attrs);
    kseg_text(r, body, len);
    kseg_close(r, "message");
    kseg_marker(r, MK_EOM);
}

/* ------------------------------------------------------------------------------------------ */

static const char *arg_type(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_STRING: return "string";
    case JSON_INTEGER: case JSON_REAL: return "number";
    case JSON_TRUE: case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    case JSON_OBJECT: return "object";
    default: return "array";
    }
}

static int blank(const char *s)
{
    for (; s && *s; s++)
        if (*s != ' ' && *s != '\t' && *s != '\n' && *s != '\r') return 0;
    return 1;
}

/* One call: open(call, tool, index) + arguments + close(call). */
static int render_call(kseg *r, const kchat_tool_call *c, size_t index, size_t mi, krun_err *err)
{
    if (!c->name || !*c->name) { krun_err_set(err, KRUN_EINPUT, "messages[%zu].tool_calls[%zu]: the function has no name", mi, index - 1); return -1; }
    char idx[24];
    snprintf(idx, sizeof idx, "%zu", index);
    const char *attrs[] = {"tool", c->name, "index", idx, NULL};
    kseg_open(r, "call", attrs);
    if (!blank(c->arguments)) {
        json_error_t je;
        json_t *a = json_loads(c->arguments, JSON_ALLOW_NUL, &je);
        if (a && !json_is_object(a)) {
            json_decref(a);
            krun_err_set(err, KRUN_EINPUT, "messages[%zu].tool_calls[%zu]: arguments must be a JSON object", mi, index - 1);
            return -1;
        }
        if (!a) {
            /* not JSON: kept verbatim in one block, as the release's renderer does */
            const char *jattrs[] = {"type", "object", NULL};
            kseg_open(r, "json", jattrs);
            kseg_text(r, c->arguments, strlen(c->arguments));
            kseg_close(r, "json");
        } else {
            const char *key;
            json_t *v;
            json_object_foreach(a, key, v) {
                const char *aattrs[] = {"key", key, "type", arg_type(v), NULL};
                kseg_open(r, "argument", aattrs);
                if (json_is_string(v)) kseg_text(r, json_string_value(v), json_string_length(v));
                else {
                    kbuf b = {0};
                    kjson_py_dump(v, 0, 0, &b);
                    if (b.oom) r->fail = 1;
                    kseg_text(r, b.p, b.n);
                    kbuf_free(&b);
                }
                kseg_close(r, "argument");
            }
            json_decref(a);
        }
    }
    kseg_close(r, "call");
    return 0;
}

static int render_assistant(kseg *r, const kchat_message *m, int thinking, size_t mi, krun_err *err)
{
    const char *attrs[] = {"role", "assistant", NULL};
    kseg_open(r, "message", attrs);
    if (thinking) {
        kseg_open(r, "think", NULL);
        if (m->reasoning) kseg_text(r, m->reasoning, m->reasoning_len);
        kseg_close(r, "think");
    }
    kseg_open(r, "response", NULL);
    if (m->content) kseg_text(r, m->content, m->content_len);
    kseg_close(r, "response");
    if (m->n_tool_calls) {
        kseg_open(r, "tools", NULL);
        for (size_t k = 0; k < m->n_tool_calls; k++)
            if (render_call(r, &m->tool_calls[k], k + 1, mi, err)) return -1;
        kseg_close(r, "tools");
    }
    kseg_close(r, "message");
    kseg_marker(r, MK_EOM);
    return 0;
}

/* What a tool result needs from the conversation before it. */
typedef struct {
    const kchat_message *last_assistant;
    size_t tool_index;       /* tool results since the last assistant message */
} tool_state;

static void track(tool_state *s, const kchat_message *m)
{
    if (m->role == KCHAT_ASSISTANT) { s->last_assistant = m; s->tool_index = 0; }
    else if (m->role == KCHAT_TOOL) s->tool_index++;
}

static const char *tool_result_name(const tool_state *s, const kchat_message *m)
{
    if (m->tool_name && *m->tool_name) return m->tool_name;
    const kchat_message *a = s->last_assistant;
    if (!a) return NULL;
    if (m->tool_call_id)
        for (size_t k = 0; k < a->n_tool_calls; k++)
            if (a->tool_calls[k].id && !strcmp(a->tool_calls[k].id, m->tool_call_id)) return a->tool_calls[k].name;
    if (s->tool_index >= 1 && s->tool_index <= a->n_tool_calls) return a->tool_calls[s->tool_index - 1].name;
    return NULL;
}

static int render_message(kseg *r, const kchat_message *m, tool_state *s, const kchat_options *o, size_t mi,
                          krun_err *err)
{
    track(s, m);
    switch (m->role) {
    case KCHAT_SYSTEM:
    case KCHAT_USER: {
        const char *attrs[] = {"role", kchat_role_name(m->role), NULL, NULL, NULL};
        if (m->name && *m->name) { attrs[2] = "name"; attrs[3] = m->name; }
        kseg_open(r, "message", attrs);
        if (m->content) kseg_text(r, m->content, m->content_len);
        kseg_close(r, "message");
        kseg_marker(r, MK_EOM);
        return 0;
    }
    case KCHAT_ASSISTANT:
        return render_assistant(r, m, o->thinking, mi, err);
    case KCHAT_TOOL: {
        const char *name = tool_result_name(s, m);
        if (!name) {
            krun_err_set(err, KRUN_EINPUT, "messages[%zu]: a tool result whose tool is unknown: give a tool_call_id of the "
                         "preceding assistant message's tool_calls, or a name", mi);
            return -1;
        }
        char idx[24];
        snprintf(idx, sizeof idx, "%zu", s->tool_index);
        const char *attrs[] = {"role", "tool", "tool", name, "index", idx, NULL};
        kseg_open(r, "message", attrs);
        if (m->content) kseg_text(r, m->content, m->content_len);
        kseg_close(r, "message");
        kseg_marker(r, MK_EOM);
        return 0;
    }
    }
    krun_err_set(err, KRUN_EINPUT, "messages[%zu]: unknown role", mi);
    return -1;
}

/* The tool declaration: the tools as compact JSON with keys sorted recursively.  *declared: the
 * list is not empty (an empty list declares nothing); emit: write it (not in a continuation). */
static int render_tools(kseg *r, const char *tools_json, int emit, int *declared, krun_err *err)
{
    json_error_t je;
    json_t *t = json_loads(tools_json, JSON_ALLOW_NUL, &je);
    if (!t || !json_is_array(t)) {
        json_decref(t);
        krun_err_set(err, KRUN_EINPUT, "tools: expected a JSON array%s%s", t ? "" : ": ", t ? "" : je.text);
        return -1;
    }
    *declared = json_array_size(t) > 0;
    if (*declared && emit) {
        kbuf b = {0};
        kbuf_puts(&b, TOOLS_HEAD);
        kjson_py_dump(t, 1, 1, &b);
        kbuf_puts(&b, TOOLS_TAIL);
        if (b.oom) r->fail = 1;
        system_message(r, "tool-declare", b.p, b.n);
        kbuf_free(&b);
    }
    json_decref(t);
    return 0;
}

/* The tool-choice message (with tools declared). */
static int render_directives(kseg *r, const kchat_options *o, krun_err *err)
{
    kbuf b = {0};
    if (o->tool_choice == KCHAT_TOOL_CHOICE_NAMED) {
        if (!o->tool_name || !*o->tool_name) return krun_err_set(err, KRUN_EINPUT, "tool_choice names no tool");
        kbuf_printf(&b, directive("tool-choice", "function"), o->tool_name, o->tool_name);
    } else {
        kbuf_puts(&b, directive("tool-choice", o->tool_choice == KCHAT_TOOL_CHOICE_NONE ? "none" : "required"));
    }
    if (b.oom) r->fail = 1;
    else system_message(r, "tool-choice", b.p, b.n);
    kbuf_free(&b);
    return 0;
}

/* The response-format message: json_object, or json_schema with the schema (compact, keys sorted). */
static int render_format(kseg *r, const kchat_options *o, krun_err *err)
{
    kbuf b = {0};
    if (o->format == KCHAT_FORMAT_JSON_SCHEMA) {
        json_error_t je;
        json_t *s = o->format_schema ? json_loads(o->format_schema, JSON_ALLOW_NUL | JSON_DECODE_ANY, &je) : NULL;
        kbuf js = {0};
        if (!s) return krun_err_set(err, KRUN_EINPUT, "response_format: the schema is not JSON");
        kjson_py_dump(s, 1, 1, &js);
        json_decref(s);
        kbuf_printf(&b, directive("response-format", "json_schema"), js.p ? js.p : "");
        if (js.oom) b.oom = 1;
        kbuf_free(&js);
    } else {
        kbuf_puts(&b, directive("response-format", "json_object"));
    }
    if (b.oom) r->fail = 1;
    else system_message(r, "response-format", b.p, b.n);
    kbuf_free(&b);
    return 0;
}

static int render(const ktok *tk, const kchat_message *msgs, size_t n, size_t from, const kchat_options *o,
                  kchat_rendering *out, krun_err *err)
{
    memset(out, 0, sizeof *out);
    kseg r = {0};
    r.tk = tk;
    if (kseg_markers(tk, r.mk, err)) return -1;
    if (!msgs && n) { krun_err_set(err, KRUN_EINPUT, "messages: NULL list"); return -1; }
    if (from > n) { krun_err_set(err, KRUN_EINPUT, "continuation from message %zu of %zu", from, n); return -1; }
    if (o->thinking && (o->effort < KCHAT_EFFORT_NONE || o->effort > KCHAT_EFFORT_MAX)) {
        krun_err_set(err, KRUN_EINPUT, "unknown thinking effort (expected low, high or max)");
        return -1;
    }
    int declared = 0, rc = -1;
    /* the header (tool declaration, effort) belongs to the first turn only */
    if (o->tools_json && render_tools(&r, o->tools_json, from == 0, &declared, err)) goto out;
    if (from == 0 && o->thinking && o->effort != KCHAT_EFFORT_NONE) {
        char body[sizeof EFFORT_TEXT + 8];
        int l = snprintf(body, sizeof body, EFFORT_TEXT, kchat_effort_name(o->effort));
        system_message(&r, "thinking-effort", body, (size_t)l);
    }
    tool_state s = {0};
    /* the preamble: the header and the system messages that open the conversation */
    size_t preamble = from == 0 ? r.n : 0;
    int leading = from == 0;
    for (size_t i = 0; i < from; i++) track(&s, &msgs[i]);
    if (o->continue_final && (!n || msgs[n - 1].role != KCHAT_ASSISTANT || msgs[n - 1].n_tool_calls || from == n)) {
        krun_err_set(err, KRUN_EINPUT, "messages[%zu]: a reply to continue must be the last message, the assistant's, without tool calls",
                     n ? n - 1 : 0);
        goto out;
    }
    for (size_t i = from; i < n - (o->continue_final ? 1 : 0); i++) {
        if (render_message(&r, &msgs[i], &s, o, i, err)) goto out;
        leading &= msgs[i].role == KCHAT_SYSTEM;
        if (leading) preamble = r.n;
    }
    if (declared && o->tool_choice != KCHAT_TOOL_CHOICE_AUTO && render_directives(&r, o, err)) goto out;
    if (o->format != KCHAT_FORMAT_TEXT && render_format(&r, o, err)) goto out;
    if (o->continue_final) {
        /* the reply begun: its reasoning (thinking mode) closed, its content open */
        const kchat_message *m = &msgs[n - 1];
        const char *attrs[] = {"role", "assistant", NULL};
        kseg_open(&r, "message", attrs);
        if (o->thinking) {
            kseg_open(&r, "think", NULL);
            if (m->reasoning) kseg_text(&r, m->reasoning, m->reasoning_len);
            kseg_close(&r, "think");
        }
        kseg_open(&r, "response", NULL);
        if (m->content) kseg_text(&r, m->content, m->content_len);
    } else if (o->add_generation_prompt) {
        const char *attrs[] = {"role", "assistant", NULL};
        kseg_open(&r, "message", attrs);
        kseg_open(&r, o->thinking ? "think" : "response", NULL);
    }
    if (!r.text.p) kbuf_add(&r.text, "", 0);
    if (r.fail || r.text.oom) { krun_err_set(err, KRUN_ENOMEM, "out of memory (or the tokenizer failed)"); goto out; }
    rc = 0;
out:
    if (rc == 0) {
        out->ids = r.ids;
        out->n_ids = r.n;
        out->n_preamble = preamble;
        out->text = r.text.p;
        out->text_len = r.text.n;
    } else {
        kseg_free(&r);
    }
    return rc;
}

int kchat_render(const ktok *tk, const kchat_message *msgs, size_t n, const kchat_options *o,
                 kchat_rendering *out, krun_err *err)
{
    return render(tk, msgs, n, 0, o, out, err);
}

int kchat_render_continue(const ktok *tk, const kchat_message *msgs, size_t n, size_t from,
                          const kchat_options *o, kchat_rendering *out, krun_err *err)
{
    return render(tk, msgs, n, from, o, out, err);
}
