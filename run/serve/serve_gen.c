/* One request's output, token by token (serve_gen.h). */
#include "serve_gen.h"

#include "run/api/anth.h"
#include "run/text/chat.h"
#include "run/text/stopstr.h"
#include "run/text/utf8_hold.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sgen {
    const ktok *tk;
    sgen_opts o;
    size_t cached;             /* prompt tokens a prefix cache held (usage) */
    /* sgen_opts points into the request (its parsed body, the caller's stack), which is gone while
     * a streamed or abandoned request still runs: everything kept is copied (issue 25.1) */
    char *id, *model;          /* copies of meta's strings */
    int32_t *prompt;           /* copy, for return_token_ids */
    char **stops;              /* copies of the stop strings (kstop borrows these) */
    int32_t *end_ids;          /* copy */
    kchat_parser *parser;      /* chat */
    kstop stop;
    kutf8_hold pend;           /* completion: an incomplete UTF-8 sequence held back */
    kbuf ids;                  /* every generated id, as int32_t */
    kbuf lps;                  /* with logprobs: one sgen_lp per generated id */
    kbuf out;                  /* bytes ready to send */
    kbuf text, reasoning;      /* not streamed: the reply so far (chat content, or the completion's text) */
    kchat_call *calls;         /* not streamed: the tool calls */
    char **call_ids;
    size_t n_calls;            /* kept (not streamed) */
    size_t calls_made;         /* complete calls, streamed or not: finish_reason tool_calls */
    int stream_started, complete, failed, stopped, oom, status;
    int ablocks;               /* Anthropic stream: content blocks started */
    const char *akind;         /* ... the open one's type ("thinking", "text"), NULL: none open */
    int http_stream;           /* the stream was opened before any output (sgen_stream_opened) */
    size_t lp_sent;            /* streamed logprobs: entries of lps already in a chunk */
    size_t lp_off;             /* ... completions: the text_offset of the next entry */
    int echoed;                /* completions, echo: the prompt is in the output */
    const char *finish;
};

typedef struct {
    int32_t id;
    int32_t n;                 /* alternatives; -1: none known (echo: the prompt's first token) */
    double lp;                 /* NaN with n -1: null */
    int32_t top_ids[OAI_MAX_TOP_LOGPROBS];
    double top_lp[OAI_MAX_TOP_LOGPROBS];
} sgen_lp;

static char *dupstr(const char *s) { return s ? strdup(s) : NULL; }

void sgen_set_cached(sgen *g, size_t n) { g->cached = n; }

sgen *sgen_new(const ktok *tk, const sgen_opts *o)
{
    sgen *g = calloc(1, sizeof *g);
    int oom = 0;
    if (!g) return NULL;
    g->tk = tk;
    g->o = *o;
    g->status = 200;
    g->id = dupstr(o->meta.id);
    g->model = dupstr(o->meta.model);
    g->o.meta.id = g->id;
    g->o.meta.model = g->model;
    if (o->n_prompt && o->return_token_ids) {
        g->prompt = malloc(o->n_prompt * sizeof *g->prompt);
        if (g->prompt) memcpy(g->prompt, o->prompt_ids, o->n_prompt * sizeof *g->prompt);
    }
    g->o.prompt_ids = g->prompt;
    if (o->n_stop) g->stops = calloc(o->n_stop, sizeof *g->stops);
    for (size_t i = 0; g->stops && i < o->n_stop; i++)
        if (!(g->stops[i] = strdup(o->stop[i]))) oom = 1;
    g->o.stop = g->stops;
    if (o->n_end_ids) g->end_ids = malloc(o->n_end_ids * sizeof *g->end_ids);
    if (g->end_ids) memcpy(g->end_ids, o->end_ids, o->n_end_ids * sizeof *g->end_ids);
    g->o.end_ids = g->end_ids;
    kstop_init(&g->stop, g->stops, o->n_stop);
    if (o->chat) g->parser = kchat_parser_new(tk, o->thinking);
    if ((o->meta.id && !g->id) || (o->meta.model && !g->model) || (o->n_prompt && o->return_token_ids && !g->prompt) ||
        (o->n_stop && !g->stops) || oom || (o->n_end_ids && !g->end_ids) || (o->chat && !g->parser)) {
        sgen_free(g);
        return NULL;
    }
    return g;
}

void sgen_free(sgen *g)
{
    if (!g) return;
    kchat_parser_free(g->parser);
    kstop_free(&g->stop);
    for (size_t i = 0; i < g->n_calls; i++) {
        free(g->calls[i].name);
        free(g->calls[i].arguments);
        free(g->call_ids[i]);
    }
    free(g->calls);
    free(g->call_ids);
    kbuf_free(&g->out);
    kbuf_free(&g->text);
    kbuf_free(&g->reasoning);
    kbuf_free(&g->ids);
    kbuf_free(&g->lps);
    kutf8_hold_free(&g->pend);
    free(g->prompt);
    for (size_t i = 0; g->stops && i < g->o.n_stop; i++) free(g->stops[i]);   /* calloc'd: a failed copy is NULL */
    free(g->stops);
    free(g->end_ids);
    free(g->id);
    free(g->model);
    free(g);
}

/* A malloc'd SSE chunk (or JSON text) onto the output. */
static void put(sgen *g, char *s)
{
    if (!s) { g->oom = 1; return; }
    kbuf_puts(&g->out, s);
    free(s);
}

static void put_chunk_lp(sgen *g, char *sse, int with_lp);
#define put_chunk(g, sse) put_chunk_lp(g, sse, 1)

/* ---- what the reply says -------------------------------------------------------------- */

/* An Anthropic stream: close the open content block (if any); open one of kind (NULL: none). */
static void anth_block(sgen *g, const char *kind)
{
    if (g->akind && kind && !strcmp(g->akind, kind)) return;
    if (g->akind) put(g, anth_sse_block_stop(g->ablocks - 1));
    g->akind = kind;
    if (kind) put(g, anth_sse_block_start(g->ablocks++, kind, NULL, NULL));
}

/* Text of the reply proper (chat content, completion text), after the stop strings. */
static void emit_text(sgen *g, const char *text, size_t len)
{
    if (!len) return;
    if (!g->o.stream) { kbuf_add(&g->text, text, len); return; }
    if (g->o.anthropic) {
        anth_block(g, "text");
        put(g, anth_sse_delta(g->ablocks - 1, "text", text, len));
    } else if (g->o.chat) {
        kchat_event ev = {KCHAT_EV_CONTENT, text, len, 0, NULL};
        int none;
        char *s = oai_sse_chat_event(&g->o.meta, &ev, NULL, &none);
        if (!none) put_chunk(g, s);
    } else {
        put_chunk(g, oai_sse_completion(&g->o.meta, text, len, NULL));
    }
}

/* Reply text through the stop strings; returns 1 when one is complete.  The stop strings are
 * looked for in the text as the client reads it: ill-formed UTF-8 (a token may hold half a
 * character) as U+FFFD, as the JSON strings will show it.  text ends on a character boundary
 * (completion_bytes and the chat parser hold back an incomplete character), so replacing piece by
 * piece gives what replacing the whole text would. */
static int reply_text(sgen *g, const char *text, size_t len)
{
    kbuf clean = {0}, pass = {0};
    int hit;
    kutf8_sanitize(text, len, &clean);
    if (clean.oom) { g->oom = 1; kbuf_free(&clean); return 0; }
    hit = kstop_feed(&g->stop, clean.p ? clean.p : "", clean.n, &pass);
    if (pass.oom) g->oom = 1;
    emit_text(g, pass.p, pass.n);
    kbuf_free(&pass);
    kbuf_free(&clean);
    if (hit) g->stopped = 1;
    return hit;
}

/* What the stop strings held back, once no stop string can follow. */
static void flush_held(sgen *g)
{
    kbuf pass = {0};
    kstop_flush(&g->stop, &pass);
    if (pass.oom) g->oom = 1;
    emit_text(g, pass.p, pass.n);
    kbuf_free(&pass);
}

/* The server's id for tool call `index` of the reply: OpenAI's "call_ID_K" (choice i > 0 of n:
 * "call_ID.i_K"), Anthropic's "toolu_" and the request id's letters and digits, then K. */
static char *call_id(const sgen *g, int index)
{
    char buf[200];
    const char *id = g->id ? g->id : "";
    if (g->o.anthropic) {
        size_t n = 0;
        n += (size_t)snprintf(buf, sizeof buf, "toolu_");
        for (const char *p = strchr(id, '-') ? strchr(id, '-') + 1 : id; *p && n < 150; p++)
            if ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')) buf[n++] = *p;
        snprintf(buf + n, sizeof buf - n, "%02d", index);
    } else if (g->o.index) {
        snprintf(buf, sizeof buf, "call_%s.%d_%d", id, g->o.index, index);
    } else {
        snprintf(buf, sizeof buf, "call_%s_%d", id, index);
    }
    return strdup(buf);
}

static int on_event(void *ctx, const kchat_event *ev)
{
    sgen *g = ctx;
    if (g->stopped) return 0;                 /* after a stop string nothing more is said */
    if (ev->kind == KCHAT_EV_CONTENT) { reply_text(g, ev->text, ev->len); return 0; }
    flush_held(g);                            /* content ended: what it held is content */
    if (ev->kind == KCHAT_EV_TOOL_CALL) g->calls_made++;
    if (ev->kind == KCHAT_EV_TOOL_CALL_BEGIN && !g->o.stream) return 0;
    if (ev->kind == KCHAT_EV_REASONING && !g->o.stream) { kbuf_add(&g->reasoning, ev->text, ev->len); return 0; }
    if (ev->kind == KCHAT_EV_TOOL_CALL && !g->o.stream) {
        kchat_call *c = realloc(g->calls, (g->n_calls + 1) * sizeof *c);
        char **ids = c ? realloc(g->call_ids, (g->n_calls + 1) * sizeof *ids) : NULL;
        if (c) g->calls = c;
        if (ids) g->call_ids = ids;
        if (!c || !ids) { g->oom = 1; return 0; }
        c[g->n_calls].name = dupstr(ev->name ? ev->name : "");
        c[g->n_calls].arguments = strndup(ev->text ? ev->text : "", ev->len);
        ids[g->n_calls] = call_id(g, ev->index);
        if (!c[g->n_calls].name || !c[g->n_calls].arguments || !ids[g->n_calls]) g->oom = 1;
        g->n_calls++;
        return 0;
    }
    /* streamed: reasoning, a call's header (with the server's id) or its arguments */
    if (g->o.anthropic) {
        if (ev->kind == KCHAT_EV_REASONING) {
            anth_block(g, "thinking");
            put(g, anth_sse_delta(g->ablocks - 1, "thinking", ev->text, ev->len));
        } else if (ev->kind == KCHAT_EV_TOOL_CALL) {
            char *cid = call_id(g, ev->index);
            int b = g->ablocks;
            anth_block(g, NULL);
            if (!cid) { g->oom = 1; return 0; }
            put(g, anth_sse_block_start(g->ablocks++, "tool_use", cid, ev->name ? ev->name : ""));
            put(g, anth_sse_delta(b, "json", ev->text ? ev->text : "{}", ev->text ? ev->len : 2));
            put(g, anth_sse_block_stop(b));
            free(cid);
        }
        return 0;
    }
    {
        char *cid = ev->kind == KCHAT_EV_TOOL_CALL_BEGIN ? call_id(g, ev->index) : NULL;
        int none;
        char *s = oai_sse_chat_event(&g->o.meta, ev, cid, &none);
        free(cid);
        if (!none) put_chunk(g, s);
    }
    return 0;
}

/* A completion's token bytes, whole UTF-8 characters at a time (flush: the
 * end, when an incomplete character is passed on as it is). */
static void completion_bytes(sgen *g, const uint8_t *b, size_t len, int flush)
{
    const char *text;
    size_t ok;
    if (kutf8_hold_take(&g->pend, b, len, flush, &text, &ok)) { g->oom = 1; return; }
    reply_text(g, text, ok);
}

/* ---- the end ---------------------------------------------------------------------------- */

/* The non-streamed body with prompt_token_ids and choices[0].token_ids added. */
static char *with_token_ids(const sgen *g, char *body)
{
    json_t *o = body ? json_loads(body, JSON_ALLOW_NUL, NULL) : NULL, *p = json_array(), *t = json_array();   /* the text may hold U+0000 */
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    char *s = NULL;
    int bad = !o || !p || !t || !ch;
    for (size_t i = 0; !bad && i < g->o.n_prompt; i++) bad |= json_array_append_new(p, json_integer(g->prompt[i]));
    for (size_t i = 0; !bad && i < sgen_n_tokens(g); i++) bad |= json_array_append_new(t, json_integer(sgen_tokens(g)[i]));
    if (!bad) bad |= json_object_set(o, "prompt_token_ids", p) | json_object_set(ch, "token_ids", t);
    if (!bad) s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    json_decref(p);
    json_decref(t);
    free(body);
    return s;
}

int sgen_logprob(sgen *g, int32_t id, double lp, const int32_t *top_ids, const double *top_lp, size_t n)
{
    sgen_lp x;
    memset(&x, 0, sizeof x);
    x.id = id;
    x.lp = lp;
    x.n = (int32_t)(n > OAI_MAX_TOP_LOGPROBS ? OAI_MAX_TOP_LOGPROBS : n);
    for (int32_t k = 0; k < x.n; k++) { x.top_ids[k] = top_ids[k]; x.top_lp[k] = top_lp[k]; }
    kbuf_add(&g->lps, &x, sizeof x);
    return g->lps.oom ? -1 : 0;
}

int sgen_logprob_null(sgen *g, int32_t id)
{
    sgen_lp x;
    memset(&x, 0, sizeof x);
    x.id = id;
    x.n = -1;
    x.lp = NAN;
    kbuf_add(&g->lps, &x, sizeof x);
    return g->lps.oom ? -1 : 0;
}

int sgen_copy_logprobs(sgen *dst, const sgen *src, size_t n)
{
    if (dst->lps.n || src->lps.n < n * sizeof(sgen_lp)) return -1;
    kbuf_add(&dst->lps, src->lps.p, n * sizeof(sgen_lp));
    return dst->lps.oom ? -1 : 0;
}

int sgen_echo(sgen *g, const int32_t *ids, size_t n)
{
    uint8_t *text = NULL;
    size_t len = 0;
    if (g->echoed || g->complete || g->failed) return 0;
    g->echoed = 1;
    if (ktok_decode(g->tk, ids, n, &text, &len) < 0) return -1;
    if (!g->o.stream) {
        kbuf_add(&g->text, text, len);
    } else {
        put_chunk(g, oai_sse_completion(&g->o.meta, (const char *)text, len, NULL));
        g->stream_started = 1;
    }
    free(text);
    return g->text.oom || g->oom ? -1 : 0;
}

/* A token as text (its bytes; ill-formed UTF-8 as U+FFFD) and as its bytes. */
static json_t *token_text(const sgen *g, int32_t id, json_t **bytes)
{
    size_t len = 0;
    const uint8_t *b = ktok_id_bytes(g->tk, id, &len);
    kbuf clean = {0};
    json_t *t;
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; *bytes && i < len; i++) json_array_append_new(*bytes, json_integer(b[i]));
    }
    kutf8_sanitize((const char *)(b ? b : (const uint8_t *)""), len, &clean);
    t = json_stringn(clean.p ? clean.p : "", clean.n);
    kbuf_free(&clean);
    return t;
}

/* A logprobs object for entries [from, to) of lps: chat {"content": [{token, logprob, bytes,
 * top_logprobs: [...]}]}, completions {tokens, token_logprobs, top_logprobs: [{token: lp}],
 * text_offset} with *off the text_offset of entry `from` (advanced past `to`).  An entry whose
 * log-probability is unknown (echo: the prompt's first token) has null for it and its
 * alternatives, as OpenAI and vLLM show it.  Every generated token is listed (reasoning and
 * markers too: docs/SERVE.md).  NULL on allocation failure. */
static json_t *lp_json(const sgen *g, size_t from, size_t to, size_t *off)
{
    const sgen_lp *x = (const sgen_lp *)(const void *)g->lps.p;
    json_t *lp = json_object();
    int bad = !lp;
    if (!bad && g->o.chat) {
        json_t *content = json_array();
        for (size_t i = from; content && i < to; i++) {
            json_t *bytes, *tok = token_text(g, x[i].id, &bytes), *top = json_array();
            for (int32_t k = 0; top && k < x[i].n; k++) {
                json_t *tb, *tt = token_text(g, x[i].top_ids[k], &tb);
                if (json_array_append_new(top, json_pack("{soso*so*}", "token", tt, "logprob", json_real(x[i].top_lp[k]), "bytes", tb)))
                    bad = 1;
            }
            if (json_array_append_new(content, json_pack("{soso*so*so*}", "token", tok, "logprob", json_real(x[i].lp), "bytes", bytes,
                                                         "top_logprobs", top)))
                bad = 1;
        }
        bad |= !content || json_object_set_new(lp, "content", content);
    } else if (!bad) {
        json_t *toks = json_array(), *tlp = json_array(), *top = json_array(), *offs = json_array();
        for (size_t i = from; toks && tlp && top && offs && i < to; i++) {
            size_t len = 0;
            json_t *alt = x[i].n < 0 ? json_null() : json_object();
            ktok_id_bytes(g->tk, x[i].id, &len);
            bad |= json_array_append_new(toks, token_text(g, x[i].id, NULL));
            bad |= json_array_append_new(tlp, x[i].n < 0 ? json_null() : json_real(x[i].lp));
            for (int32_t k = 0; alt && k < x[i].n; k++) {
                json_t *tt = token_text(g, x[i].top_ids[k], NULL);
                if (!tt || json_object_set_new(alt, json_string_value(tt), json_real(x[i].top_lp[k]))) bad = 1;
                json_decref(tt);
            }
            bad |= json_array_append_new(top, alt);
            bad |= json_array_append_new(offs, json_integer((json_int_t)*off));
            *off += len;
        }
        bad |= !toks || !tlp || !top || !offs;
        if (!bad) bad = json_object_set(lp, "tokens", toks) | json_object_set(lp, "token_logprobs", tlp) |
                        json_object_set(lp, "top_logprobs", top) | json_object_set(lp, "text_offset", offs);
        json_decref(toks); json_decref(tlp); json_decref(top); json_decref(offs);
    }
    if (bad) { json_decref(lp); return NULL; }
    return lp;
}

static size_t n_lps(const sgen *g) { return g->lps.n / sizeof(sgen_lp); }

/* The non-streamed body with choices[0].logprobs (every entry). */
static char *with_logprobs(const sgen *g, char *body)
{
    json_t *o = body ? json_loads(body, JSON_ALLOW_NUL, NULL) : NULL, *ch = json_array_get(json_object_get(o, "choices"), 0);
    size_t off = 0;
    json_t *lp = lp_json(g, 0, n_lps(g), &off);
    char *s = NULL;
    int bad = !o || !ch || !lp;
    if (!bad) bad = json_object_set(ch, "logprobs", lp);
    if (!bad) s = json_dumps(o, JSON_COMPACT);
    json_decref(lp);
    json_decref(o);
    free(body);
    return s;
}

/* A streamed OpenAI chunk ("data: {...}\n\n", malloc'd) onto the output: as it is, or -- with
 * streamed logprobs (with_lp; not the role chunk), or as choice o.index of n -- with
 * choices[0].logprobs holding the entries not yet sent (the tokens that made this chunk's text,
 * and any before them that made none) and choices[0].index.  Chunks without a choice (usage) are put as they are. */
static void put_chunk_lp(sgen *g, char *sse, int with_lp)
{
    json_t *o, *ch, *lp = NULL;
    char *s;
    size_t len;
    int bad;
    if (!sse) { g->oom = 1; return; }
    with_lp = with_lp && g->o.logprobs && g->lp_sent < n_lps(g);
    if (!g->o.index && !with_lp) { put(g, sse); return; }
    len = strlen(sse);
    o = len > 8 ? json_loadb(sse + 6, len - 8, JSON_ALLOW_NUL, NULL) : NULL;
    free(sse);
    ch = json_array_get(json_object_get(o, "choices"), 0);
    if (!ch) {                      /* the usage chunk: no choice */
        s = o ? json_dumps(o, JSON_COMPACT) : NULL;
        bad = !s;
    } else {
        bad = json_object_set_new(ch, "index", json_integer(g->o.index));
        if (!bad && with_lp) {
            lp = lp_json(g, g->lp_sent, n_lps(g), &g->lp_off);
            bad = !lp || json_object_set_new(ch, "logprobs", lp);
            g->lp_sent = n_lps(g);
        }
        s = bad ? NULL : json_dumps(o, JSON_COMPACT);
    }
    json_decref(o);
    if (!s) { g->oom = 1; return; }
    kbuf_puts(&g->out, "data: ");
    kbuf_puts(&g->out, s);
    kbuf_puts(&g->out, "\n\n");
    free(s);
}

static void finish_output(sgen *g, const char *reason)
{
    long pt = (long)g->o.n_prompt, ct = (long)sgen_n_tokens(g), cached = (long)g->cached;
    g->finish = reason;
    if (g->o.anthropic) {
        const char *sr = anth_stop_reason(reason, g->stopped), *sq = g->stopped && g->stops ? g->stops[g->stop.which] : NULL;
        if (g->o.stream) {
            if (!g->stream_started) put(g, anth_sse_message_start(&g->o.meta, pt));
            g->stream_started = 1;
            if (!g->ablocks) anth_block(g, "text");      /* a message has at least one block */
            anth_block(g, NULL);
            put(g, anth_sse_message_end(sr, sq, ct));
        } else {
            anth_result r = {g->o.thinking ? (g->reasoning.p ? g->reasoning.p : "") : NULL, g->reasoning.n, g->text.p, g->text.n,
                             g->calls, g->n_calls, (const char *const *)g->call_ids, sr, sq, pt, ct};
            put(g, anth_message_response(&g->o.meta, &r));
        }
        g->complete = 1;
        return;
    }
    if (g->o.stream) {
        if (!g->stream_started && g->o.chat) put_chunk_lp(g, oai_sse_chat_role(&g->o.meta), 0);
        g->stream_started = 1;
        put_chunk(g, g->o.chat ? oai_sse_chat_finish(&g->o.meta, reason) : oai_sse_completion(&g->o.meta, "", 0, reason));
        /* one of n choices: the usage (summed) and [DONE] are the stream's, once (serve_http.c) */
        if (!g->o.choice_of_n) {
            if (g->o.include_usage) put(g, oai_sse_usage(&g->o.meta, g->o.chat, pt, ct, cached));
            kbuf_puts(&g->out, OAI_SSE_DONE);
        }
    } else {
        char *body;
        if (g->o.chat) {
            oai_chat_result r = {g->text.p, g->text.n, g->o.thinking ? (g->reasoning.p ? g->reasoning.p : "") : NULL,
                                 g->reasoning.n, g->calls, g->n_calls, (const char *const *)g->call_ids, reason, pt, ct, cached};
            body = oai_chat_response(&g->o.meta, &r);
        } else {
            body = oai_completion_response(&g->o.meta, g->text.p, g->text.n, reason, pt, ct, cached);
        }
        if (body && g->o.return_token_ids) body = with_token_ids(g, body);
        if (body && g->o.logprobs) body = with_logprobs(g, body);
        put(g, body);
    }
    g->complete = 1;
}

/* The reply as generated is over: let the parser and the stop strings say what they held. */
static void drain(sgen *g)
{
    if (g->o.chat) {
        if (kchat_parser_finish(g->parser, on_event, g)) g->oom = 1;
    } else {
        completion_bytes(g, NULL, 0, 1);
    }
    if (!g->stopped) flush_held(g);
}

int sgen_token(sgen *g, int32_t id)
{
    int end = 0;
    if (g->complete || g->failed) return 1;
    if (g->o.stream && !g->stream_started) {
        if (g->o.anthropic) put(g, anth_sse_message_start(&g->o.meta, (long)g->o.n_prompt));
        else if (g->o.chat) put_chunk_lp(g, oai_sse_chat_role(&g->o.meta), 0);
        g->stream_started = 1;
    }
    kbuf_add(&g->ids, &id, sizeof id);
    if (g->ids.oom) return -1;
    for (size_t k = 0; k < g->o.n_end_ids; k++) end |= id == g->o.end_ids[k];
    if (g->o.chat) {
        /* <|end_of_msg|> completes the reply (the parser says so); the model's
         * other end ids ([EOS]) stop it too */
        int r = kchat_parser_feed_id(g->parser, id, on_event, g);
        if (r < 0) g->oom = 1;
        if (r == 1) end = 1;
    } else if (!end) {
        size_t len = 0;
        const uint8_t *b = ktok_id_bytes(g->tk, id, &len);
        if (b) completion_bytes(g, b, len, 0);
    }
    if (g->oom) return -1;
    if (end || g->stopped || (long)sgen_n_tokens(g) >= g->o.max_tokens) {
        const char *reason;
        if (!g->stopped) drain(g);
        reason = g->stopped || end ? "stop" : "length";
        if (g->o.chat && !g->stopped && end && g->calls_made) reason = "tool_calls";
        finish_output(g, reason);
        return g->oom ? -1 : 1;
    }
    return 0;
}

void sgen_end(sgen *g, const char *finish_reason)
{
    if (g->complete || g->failed) return;
    drain(g);
    finish_output(g, g->stopped ? "stop" : finish_reason);
}

void sgen_fail(sgen *g, const oai_error *e)
{
    char *body;
    if (g->complete || g->failed) return;
    g->failed = 1;
    if (g->o.anthropic) {
        int sse = g->stream_started || (g->o.stream && g->http_stream);
        body = sse ? anth_sse_error(e) : anth_error_json(e);
        if (!sse) { g->out.n = 0; g->status = e->status; }
        kbuf_puts(&g->out, body ? body : "{\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"out of memory\"}}");
        free(body);
        return;
    }
    body = oai_error_json(e);
    if (g->stream_started || (g->o.stream && g->http_stream)) {
        kbuf_puts(&g->out, "data: ");
        kbuf_puts(&g->out, body ? body : "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}");
        kbuf_puts(&g->out, g->o.choice_of_n ? "\n\n" : "\n\n" OAI_SSE_DONE);     /* n > 1: [DONE] is the stream's */
    } else {
        g->out.n = 0;
        g->status = e->status;
        kbuf_puts(&g->out, body ? body : "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}");
    }
    free(body);
}

void sgen_stream_opened(sgen *g) { g->http_stream = 1; }
int sgen_done(const sgen *g) { return g->complete || g->failed; }
int sgen_started(const sgen *g) { return g->stream_started; }
int sgen_status(const sgen *g) { return g->status; }
const sgen_opts *sgen_options(const sgen *g) { return &g->o; }
size_t sgen_cached(const sgen *g) { return g->cached; }
const char *sgen_finish_reason(const sgen *g) { return g->complete ? g->finish : NULL; }
size_t sgen_n_tokens(const sgen *g) { return g->ids.n / sizeof(int32_t); }
const int32_t *sgen_tokens(const sgen *g) { return (const int32_t *)(const void *)g->ids.p; }

void sgen_take(sgen *g, kbuf *out)
{
    if (g->out.oom) { out->oom = 1; return; }
    kbuf_add(out, g->out.p, g->out.n);
    g->out.n = 0;
}
