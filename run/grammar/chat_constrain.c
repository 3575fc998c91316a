/* The grammar of a constrained K3 reply (chat_constrain.h: kchat_constraint; docs/SERVE.md, "Structured
 * output").  From the token after the generation prompt:
 *
 *   [thinking]  FREE <|close|>think<|sep|><|open|>response<|sep|>
 *   then one of
 *     response_format:   WS VALUE WS <|close|>response<|sep|> END
 *     a named tool:      <|close|>response<|sep|> TOOLS(that tool, once)
 *     strict tools:      FREE <|close|>response<|sep|> [TOOLS(any, at least once)] END
 *   (response_format with tools that may be called: the VALUE, or an empty response and TOOLS)
 *
 *   TOOLS  = <|open|>tools<|sep|> CALL... <|close|>tools<|sep|> END
 *   CALL   = <|open|>call tool="NAME" index="I"<|sep|> ARGUMENTS <|close|>call<|sep|>
 *   END    = <|close|>message<|sep|><|end_of_msg|>
 *
 * FREE is any text (no marker); ARGUMENTS follow the tool's parameters when it is strict or named
 * (kschema_k3_args), else any arguments.  So reasoning is never constrained, and what follows it
 * always parses: the reply parser reads exactly one JSON value as the content, or the calls. */
#include "chat_constrain.h"

#include "kgram.h"
#include "kschema.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    json_t *params;           /* NULL: none declared */
    int strict;
} tool;

typedef struct {
    kgram *g;
    tool *tools;
    size_t n_tools;
    char *param, *msg;
    size_t plen, mlen;
} cons;

static int refuse(cons *c, const char *param, const char *fmt, const char *detail)
{
    snprintf(c->param, c->plen, "%s", param);
    snprintf(c->msg, c->mlen, fmt, detail);
    return -1;
}

static uint32_t lit(kgram *g, const char *s, uint32_t next) { return kg_lit(g, s, strlen(s), next); }
/* <|close|>TAG<|sep|> then next */
static uint32_t close_tag(kgram *g, const char *tag, uint32_t next) { return kg_sym(g, KG_SYM_CLOSE, lit(g, tag, kg_sym(g, KG_SYM_SEP, next))); }
static uint32_t open_tag(kgram *g, const char *tag, uint32_t next) { return kg_sym(g, KG_SYM_OPEN, lit(g, tag, kg_sym(g, KG_SYM_SEP, next))); }

/* A schema error as the request's field. */
static int schema_refused(cons *c, const char *where, const kschema_err *e)
{
    char p[400];
    snprintf(p, sizeof p, "%s%s%s", where, e->path[0] ? "." : "", e->path);
    snprintf(c->param, c->plen, "%s", p);
    snprintf(c->msg, c->mlen, "%s%s%s", p, ": ", e->msg);
    return -1;
}

/* <|open|>call tool="NAME" index="I"<|sep|> ARGUMENTS <|close|>call<|sep|> then next */
static int call(cons *c, size_t k, int constrained, uint32_t next, uint32_t *start)
{
    kgram *g = c->g;
    const tool *t = &c->tools[k];
    kschema_ctx *sc = kschema_new(g, t->params);
    kschema_err e;
    uint32_t args, head;
    char *name = kschema_attr_escape(t->name), *h;
    size_t n;
    int rc;
    if (!sc || !name) { kschema_free(sc); free(name); return refuse(c, "", "%s", "out of memory"); }
    if (constrained) {
        rc = kschema_k3_args(sc, t->params, close_tag(g, "call", next), &args, &e);
    } else {
        /* any arguments: the schema {} */
        json_t *any = json_object();
        rc = any ? kschema_k3_args(sc, any, close_tag(g, "call", next), &args, &e) : -1;
        json_decref(any);
    }
    kschema_free(sc);
    if (rc) {
        char where[96];
        free(name);
        snprintf(where, sizeof where, "tools[%zu].function.parameters", k);
        return schema_refused(c, where, &e);
    }
    n = strlen(name) + 32;
    h = malloc(n);
    if (!h) { free(name); return refuse(c, "", "%s", "out of memory"); }
    snprintf(h, n, "call tool=\"%s\" index=\"", name);
    /* the index: 1 to 3 digits (the parser does not read it) */
    head = kg_range(g, '0', '9', kg_split(g, lit(g, "\"", kg_sym(g, KG_SYM_SEP, args)),
                                          kg_range(g, '0', '9', kg_split(g, lit(g, "\"", kg_sym(g, KG_SYM_SEP, args)),
                                                                         kg_range(g, '0', '9', lit(g, "\"", kg_sym(g, KG_SYM_SEP, args)))))));
    *start = kg_sym(g, KG_SYM_OPEN, lit(g, h, head));
    free(h);
    free(name);
    return 0;
}

/* <|open|>tools<|sep|> then calls (one of `only`, or one or more of any tool) <|close|>tools<|sep|> then next */
static int tools(cons *c, const char *only, uint32_t next, uint32_t *start)
{
    kgram *g = c->g;
    uint32_t end = close_tag(g, "tools", next);
    if (only) {
        uint32_t one = 0;
        for (size_t k = 0; k < c->n_tools; k++)
            if (!strcmp(c->tools[k].name, only) && call(c, k, 1, end, &one)) return -1;
        *start = open_tag(g, "tools", one);
        return 0;
    }
    {
        /* one or more calls: loop = a call, then the end or another call */
        uint32_t loop = kg_node_new(g, KG_SPLIT, 0, 0, 0, 0), any = kg_fail(g);
        for (size_t k = c->n_tools; k-- > 0;) {
            uint32_t one;
            if (call(c, k, c->tools[k].strict, loop, &one)) return -1;
            any = kg_split(g, one, any);
        }
        kg_set_next(g, loop, end, any);
        *start = open_tag(g, "tools", any);
        return 0;
    }
}

static int read_tools(cons *c, json_t *t)
{
    c->n_tools = json_array_size(t);
    c->tools = calloc(c->n_tools ? c->n_tools : 1, sizeof *c->tools);
    if (!c->tools) return refuse(c, "", "%s", "out of memory");
    for (size_t k = 0; k < c->n_tools; k++) {
        json_t *f = json_object_get(json_array_get(t, k), "function"), *p = json_object_get(f, "parameters");
        c->tools[k].name = json_string_value(json_object_get(f, "name"));
        c->tools[k].params = json_is_null(p) ? NULL : p;
        c->tools[k].strict = json_is_true(json_object_get(f, "strict"));
        if (!c->tools[k].name) c->tools[k].name = "";
    }
    return 0;
}

int kchat_constraint(const kchat_options *o, kgram **out, char *param, size_t plen, char *msg, size_t mlen)
{
    cons c = {0};
    json_t *tj = NULL, *schema = NULL;
    int strict = 0, calls, rc = -1;
    uint32_t end, resp, start;
    *out = NULL;
    c.param = param; c.plen = plen; c.msg = msg; c.mlen = mlen;
    if (plen) param[0] = 0;
    if (mlen) msg[0] = 0;
    if (o->tools_json) {
        tj = json_loads(o->tools_json, JSON_ALLOW_NUL, NULL);
        if (!json_is_array(tj)) { json_decref(tj); return refuse(&c, "tools", "%s", "tools must be an array"); }
        if (read_tools(&c, tj)) goto out;
        for (size_t k = 0; k < c.n_tools; k++) strict |= c.tools[k].strict;
    }
    calls = c.n_tools > 0 && o->tool_choice != KCHAT_TOOL_CHOICE_NONE;
    if (o->format == KCHAT_FORMAT_TEXT && o->tool_choice != KCHAT_TOOL_CHOICE_NAMED && !(strict && calls)) { rc = 0; goto out; }
    if (o->tool_choice == KCHAT_TOOL_CHOICE_NAMED) {
        size_t k = 0;
        while (k < c.n_tools && strcmp(c.tools[k].name, o->tool_name ? o->tool_name : "")) k++;
        if (k == c.n_tools) { refuse(&c, "tool_choice", "tool_choice names \"%.64s\", which is not in tools", o->tool_name ? o->tool_name : ""); goto out; }
    }
    if (!(c.g = kgram_new())) { refuse(&c, "", "%s", "out of memory"); goto out; }
    end = close_tag(c.g, "message", kg_sym(c.g, KG_SYM_EOM, kg_accept(c.g)));
    if (o->tool_choice == KCHAT_TOOL_CHOICE_NAMED) {
        uint32_t t;
        if (tools(&c, o->tool_name, end, &t)) goto out;
        resp = close_tag(c.g, "response", t);
    } else {
        uint32_t t = 0;
        if (calls && tools(&c, NULL, end, &t)) goto out;
        if (o->format != KCHAT_FORMAT_TEXT) {
            kschema_ctx *sc;
            kschema_err e;
            uint32_t doc;
            if (o->format == KCHAT_FORMAT_JSON_OBJECT) schema = json_pack("{ss}", "type", "object");
            else schema = o->format_schema ? json_loads(o->format_schema, JSON_ALLOW_NUL | JSON_DECODE_ANY, NULL) : NULL;
            if (!schema) { refuse(&c, "response_format.json_schema.schema", "%s", "the schema is missing or not JSON"); goto out; }
            sc = kschema_new(c.g, schema);
            if (!sc) { refuse(&c, "", "%s", "out of memory"); goto out; }
            if (kschema_json(sc, schema, kschema_ws(sc, close_tag(c.g, "response", end)), &doc, &e)) {
                kschema_free(sc);
                schema_refused(&c, "response_format.json_schema.schema", &e);
                goto out;
            }
            resp = kschema_ws(sc, doc);
            kschema_free(sc);
            /* tools that may be called instead: an empty response, then the calls */
            if (t) resp = kg_split(c.g, resp, close_tag(c.g, "response", t));
            if (o->tool_choice == KCHAT_TOOL_CHOICE_REQUIRED && t) resp = close_tag(c.g, "response", t);
        } else {
            /* strict tools: free content, then the calls (at least one when required) */
            uint32_t after = o->tool_choice == KCHAT_TOOL_CHOICE_REQUIRED ? t : kg_split(c.g, end, t);
            resp = kg_body(c.g, KG_TEXT_FREE, 0, KG_INF, close_tag(c.g, "response", after));
        }
    }
    start = o->thinking ? kg_body(c.g, KG_TEXT_FREE, 0, KG_INF, close_tag(c.g, "think", open_tag(c.g, "response", resp))) : resp;
    if (kgram_oom(c.g)) { refuse(&c, "", "%s", "out of memory (or the schema's grammar is too large)"); goto out; }
    if (kgram_finish(c.g, start)) {
        refuse(&c, o->format == KCHAT_FORMAT_JSON_SCHEMA ? "response_format.json_schema.schema" : "tools",
               "%s", "no reply can satisfy this: the schema admits no value (an empty enum, minItems above maxItems, a required "
               "property that cannot be, or nesting deeper than the 48 levels the constraint follows)");
        goto out;
    }
    *out = c.g;
    c.g = NULL;
    rc = 0;
out:
    kgram_free(c.g);
    json_decref(schema);
    json_decref(tj);
    free(c.tools);
    return rc;
}
