/* K3 chat format: reading the model's reply (see chat.h, spec K3_CHAT.md §5).
 *
 * The reply is a stream of markers and text.  A small state machine keeps the stack of open
 * tags: text inside think goes to the reasoning, inside response to the content, inside an
 * argument to that argument's value, inside a json block to the call's raw arguments.  Tag
 * headers (between <|open|> or <|close|> and <|sep|>) are collected and never emitted.  What the
 * format does not allow (a stray <|sep|>, a close without its open, text between channels) is
 * counted as malformed and dropped; parsing goes on. */
#include "chat_seg.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH   16          /* message > tools > call > argument needs 4 */
#define MAX_HEADER  4096        /* bytes of one tag header kept; a longer one is malformed */

typedef enum { TAG_MESSAGE, TAG_THINK, TAG_RESPONSE, TAG_TOOLS, TAG_CALL, TAG_ARGUMENT, TAG_JSON, TAG_OTHER } tagkind;
static const char *const TAG_NAME[] = {"message", "think", "response", "tools", "call", "argument", "json", NULL};

enum { MODE_BODY, MODE_OPEN_HEADER, MODE_CLOSE_HEADER };

struct kchat_parser {
    const ktok *tk;
    int32_t mk[MK_COUNT];
    tagkind stack[MAX_DEPTH];
    char *other[MAX_DEPTH];  /* names of unknown tags (TAG_OTHER), for closing them */
    int depth;
    int mode;
    kbuf header;
    size_t header_drop;      /* header bytes beyond MAX_HEADER */
    kbuf pend;               /* channel bytes held back: an incomplete UTF-8 sequence */
    int pend_kind;           /* the channel they belong to (KCHAT_EV_REASONING / _CONTENT) */
    kbuf tpend;              /* text feeding: a tail that may begin a marker */
    int seen_response, message_closed, ended;
    size_t malformed;
    /* the call being read */
    int in_call;
    size_t n_calls;
    kbuf call_name, call_raw, arg_key, arg_type, arg_val;
    int call_raw_used;
    json_t *call_args;
    int oom;
};

static tagkind tag_kind(const char *name, size_t n)
{
    for (int k = 0; TAG_NAME[k]; k++)
        if (strlen(TAG_NAME[k]) == n && !memcmp(TAG_NAME[k], name, n)) return (tagkind)k;
    return TAG_OTHER;
}

kchat_parser *kchat_parser_new(const ktok *tk, int thinking)
{
    kchat_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    krun_err err;
    if (kseg_markers(tk, p->mk, &err)) { free(p); return NULL; }
    p->tk = tk;
    /* the generation prompt opened <message> and the first channel */
    p->stack[p->depth++] = TAG_MESSAGE;
    p->stack[p->depth++] = thinking ? TAG_THINK : TAG_RESPONSE;
    p->seen_response = !thinking;
    p->mode = MODE_BODY;
    return p;
}

static void call_reset(kchat_parser *p)
{
    p->in_call = 0;
    p->call_name.n = p->call_raw.n = 0;
    p->call_raw_used = 0;
    json_decref(p->call_args);
    p->call_args = NULL;
}

void kchat_parser_free(kchat_parser *p)
{
    if (!p) return;
    for (int i = 0; i < MAX_DEPTH; i++) free(p->other[i]);
    kbuf_free(&p->header);
    kbuf_free(&p->pend);
    kbuf_free(&p->tpend);
    kbuf_free(&p->call_name);
    kbuf_free(&p->call_raw);
    kbuf_free(&p->arg_key);
    kbuf_free(&p->arg_type);
    kbuf_free(&p->arg_val);
    json_decref(p->call_args);
    free(p);
}

kchat_where kchat_parser_where(const kchat_parser *p)
{
    if (p->ended) return KCHAT_AT_END;
    for (int i = p->depth - 1; i >= 0; i--) {
        switch (p->stack[i]) {
        case TAG_THINK: return KCHAT_AT_THINK;
        case TAG_RESPONSE: return KCHAT_AT_RESPONSE;
        case TAG_TOOLS: case TAG_CALL: case TAG_ARGUMENT: case TAG_JSON: return KCHAT_AT_TOOLS;
        case TAG_MESSAGE: return KCHAT_AT_MESSAGE;
        case TAG_OTHER: break;
        }
    }
    return KCHAT_AT_CLOSED;
}

size_t kchat_parser_malformed(const kchat_parser *p) { return p->malformed; }
size_t kchat_parser_n_calls(const kchat_parser *p) { return p->n_calls; }

/* ------------------------------------------------------------------------------------------ */
/* events                                                                                     */

static int emit(kchat_event_fn fn, void *ctx, kchat_event_kind kind, const char *text, size_t len, int index,
                const char *name)
{
    if (!fn) return 0;
    kchat_event ev = {kind, text ? text : "", len, index, name};
    return fn(ctx, &ev) ? -1 : 0;
}

/* Emit the held-back channel bytes: all of them (flush) or the complete UTF-8 prefix. */
static int drain(kchat_parser *p, kchat_event_fn fn, void *ctx, int flush)
{
    if (!p->pend.n) return 0;
    size_t k = flush ? p->pend.n : ktok_utf8_complete((const uint8_t *)p->pend.p, p->pend.n);
    if (!k) return 0;
    int rc = emit(fn, ctx, (kchat_event_kind)p->pend_kind, p->pend.p, k, 0, NULL);
    memmove(p->pend.p, p->pend.p + k, p->pend.n - k);
    p->pend.n -= k;
    p->pend.p[p->pend.n] = 0;
    return rc;
}

static int is_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r') return 0;
    return 1;
}

/* Text in the body of the innermost open tag. */
static int body_text(kchat_parser *p, const char *s, size_t n, kchat_event_fn fn, void *ctx)
{
    tagkind top = p->depth ? p->stack[p->depth - 1] : TAG_OTHER;
    if (top == TAG_THINK || top == TAG_RESPONSE) {
        int kind = top == TAG_THINK ? KCHAT_EV_REASONING : KCHAT_EV_CONTENT;
        if (p->pend.n && p->pend_kind != kind && drain(p, fn, ctx, 1)) return -1;
        p->pend_kind = kind;
        kbuf_add(&p->pend, s, n);
        return drain(p, fn, ctx, 0);
    }
    if (top == TAG_ARGUMENT) { kbuf_add(&p->arg_val, s, n); return 0; }
    if (top == TAG_JSON) { kbuf_add(&p->call_raw, s, n); p->call_raw_used = 1; return 0; }
    if (!is_blank(s, n)) p->malformed++;   /* text between channels: not part of any answer */
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* tool calls                                                                                 */

/* The attribute value of key in a header (`tag k="v" ...`), unescaped, appended to out;
 * returns 1 if present. */
static int header_attr(const char *h, size_t n, const char *key, kbuf *out)
{
    size_t kl = strlen(key);
    size_t i = 0;
    while (i < n && h[i] != ' ') i++;                  /* the tag name */
    while (i < n) {
        while (i < n && h[i] == ' ') i++;
        size_t ks = i;
        while (i < n && h[i] != '=' && h[i] != ' ') i++;
        size_t ke = i;
        if (i + 1 >= n || h[i] != '=' || h[i + 1] != '"') return 0;
        i += 2;
        size_t vs = i;
        while (i < n && h[i] != '"') i++;
        size_t ve = i;
        if (i < n) i++;
        if (ke - ks == kl && !memcmp(h + ks, key, kl)) {
            for (size_t j = vs; j < ve;) {
                if (ve - j >= 6 && !memcmp(h + j, "&quot;", 6)) { kbuf_add(out, "\"", 1); j += 6; }
                else if (ve - j >= 5 && !memcmp(h + j, "&amp;", 5)) { kbuf_add(out, "&", 1); j += 5; }
                else { kbuf_add(out, h + j, 1); j++; }
            }
            return 1;
        }
    }
    return 0;
}

/* An argument's value as JSON: strings as they are, other types parsed (text that does not parse
 * as the declared type is kept as a string). */
static json_t *arg_value(kchat_parser *p)
{
    const char *t = p->arg_type.p ? p->arg_type.p : "string";
    const char *v = p->arg_val.p ? p->arg_val.p : "";
    size_t n = p->arg_val.n;
    if (strcmp(t, "string")) {
        json_error_t je;
        json_t *j = json_loadb(v, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        int ok = j && ((!strcmp(t, "number") && json_is_number(j)) || (!strcmp(t, "boolean") && json_is_boolean(j)) ||
                       (!strcmp(t, "null") && json_is_null(j)) || (!strcmp(t, "object") && json_is_object(j)) ||
                       (!strcmp(t, "array") && json_is_array(j)));
        if (ok) return j;
        json_decref(j);
        p->malformed++;
    }
    kbuf s = {0};
    kutf8_sanitize(v, n, &s);
    json_t *j = json_stringn(s.p ? s.p : "", s.n);
    kbuf_free(&s);
    return j;
}

static void call_begin(kchat_parser *p, const char *h, size_t n)
{
    call_reset(p);
    p->in_call = 1;
    kbuf name = {0};
    header_attr(h, n, "tool", &name);
    kutf8_sanitize(name.p ? name.p : "", name.n, &p->call_name);
    kbuf_free(&name);
    kbuf_add(&p->call_name, "", 0);
    p->call_args = json_object();
    if (!p->call_args) p->oom = 1;
}

static void argument_end(kchat_parser *p)
{
    if (!p->in_call || !p->call_args) { p->malformed++; return; }
    json_t *v = arg_value(p);
    kbuf key = {0};
    kutf8_sanitize(p->arg_key.p ? p->arg_key.p : "", p->arg_key.n, &key);
    kbuf_add(&key, "", 0);
    if (!v || key.oom || json_object_set_new(p->call_args, key.p, v)) p->oom = 1;
    kbuf_free(&key);
}

static int call_end(kchat_parser *p, kchat_event_fn fn, void *ctx)
{
    if (!p->in_call) { p->malformed++; return 0; }
    int rc;
    int index = (int)p->n_calls++;
    if (p->call_raw_used) {
        /* a <json> block: the raw arguments text */
        kbuf s = {0};
        kutf8_sanitize(p->call_raw.p ? p->call_raw.p : "", p->call_raw.n, &s);
        kbuf_add(&s, "", 0);
        if (s.oom) p->oom = 1;
        rc = emit(fn, ctx, KCHAT_EV_TOOL_CALL, s.p, s.n, index, p->call_name.p);
        kbuf_free(&s);
    } else {
        char *a = p->call_args ? json_dumps(p->call_args, JSON_COMPACT) : NULL;
        if (!a) p->oom = 1;
        rc = emit(fn, ctx, KCHAT_EV_TOOL_CALL, a ? a : "{}", a ? strlen(a) : 2, index, p->call_name.p);
        free(a);
    }
    call_reset(p);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* tags                                                                                       */

static int push_tag(kchat_parser *p, kchat_event_fn fn, void *ctx)
{
    const char *h = p->header.p ? p->header.p : "";
    size_t n = p->header.n, nl = 0;
    while (nl < n && h[nl] != ' ') nl++;
    tagkind k = tag_kind(h, nl);
    if (p->depth == MAX_DEPTH || p->message_closed) { p->malformed++; return 0; }
    if (k == TAG_MESSAGE || (k != TAG_OTHER && p->depth == 0)) p->malformed++;
    if (k == TAG_RESPONSE) p->seen_response = 1;
    if (k == TAG_OTHER) {
        free(p->other[p->depth]);
        p->other[p->depth] = strndup(h, nl);
        if (!p->other[p->depth]) p->oom = 1;
    }
    p->stack[p->depth++] = k;
    if (k == TAG_CALL) {
        if (p->in_call && call_end(p, fn, ctx)) return -1;   /* a call inside a call: close the first */
        call_begin(p, h, n);
        return emit(fn, ctx, KCHAT_EV_TOOL_CALL_BEGIN, NULL, 0, (int)p->n_calls, p->call_name.p);
    }
    if (k == TAG_ARGUMENT) {
        p->arg_key.n = p->arg_type.n = p->arg_val.n = 0;
        if (!header_attr(h, n, "key", &p->arg_key)) p->malformed++;
        if (!header_attr(h, n, "type", &p->arg_type)) kbuf_puts(&p->arg_type, "string");
        kbuf_add(&p->arg_key, "", 0);     /* NUL-terminated even when empty */
        kbuf_add(&p->arg_type, "", 0);
    }
    return 0;
}

/* What closing the innermost tag completes. */
static int pop_one(kchat_parser *p, kchat_event_fn fn, void *ctx)
{
    tagkind k = p->stack[--p->depth];
    if (k == TAG_ARGUMENT) argument_end(p);
    else if (k == TAG_CALL) return call_end(p, fn, ctx);
    else if (k == TAG_MESSAGE) p->message_closed = 1;
    return 0;
}

static int pop_tag(kchat_parser *p, kchat_event_fn fn, void *ctx)
{
    const char *h = p->header.p ? p->header.p : "";
    size_t n = p->header.n;
    tagkind k = tag_kind(h, n);
    int at = -1;
    for (int i = p->depth - 1; i >= 0 && at < 0; i--)
        if (p->stack[i] == k && (k != TAG_OTHER || (p->other[i] && strlen(p->other[i]) == n && !memcmp(p->other[i], h, n))))
            at = i;
    if (at < 0) { p->malformed++; return 0; }
    if (at != p->depth - 1) p->malformed++;       /* tags left open inside it */
    while (p->depth > at)
        if (pop_one(p, fn, ctx)) return -1;
    return 0;
}

static int on_marker(kchat_parser *p, int which, kchat_event_fn fn, void *ctx)
{
    if (p->ended) return 1;
    if (which != MK_SEP && drain(p, fn, ctx, 1)) return -1;
    switch (which) {
    case MK_OPEN:
    case MK_CLOSE:
        if (p->mode != MODE_BODY) p->malformed++;  /* a header that never ended */
        p->mode = which == MK_OPEN ? MODE_OPEN_HEADER : MODE_CLOSE_HEADER;
        p->header.n = 0;
        p->header_drop = 0;
        return 0;
    case MK_SEP: {
        int mode = p->mode;
        p->mode = MODE_BODY;
        if (mode == MODE_BODY) { p->malformed++; return 0; }
        if (p->header_drop) p->malformed++;
        kbuf_add(&p->header, "", 0);
        return mode == MODE_OPEN_HEADER ? push_tag(p, fn, ctx) : pop_tag(p, fn, ctx);
    }
    default:   /* <|end_of_msg|> */
        if (p->mode != MODE_BODY || p->depth) p->malformed++;
        /* a call still open is complete as far as it goes */
        while (p->depth)
            if (pop_one(p, fn, ctx)) return -1;
        p->ended = 1;
        return 1;
    }
}

static int on_text(kchat_parser *p, const char *s, size_t n, kchat_event_fn fn, void *ctx)
{
    if (p->ended || !n) return p->ended;
    if (p->mode == MODE_BODY) return body_text(p, s, n, fn, ctx);
    size_t room = p->header.n < MAX_HEADER ? MAX_HEADER - p->header.n : 0;
    kbuf_add(&p->header, s, n < room ? n : room);
    if (n > room) p->header_drop += n - room;
    return 0;
}

static int status(kchat_parser *p, int rc)
{
    if (p->oom || p->pend.oom || p->tpend.oom || p->header.oom || p->arg_key.oom || p->arg_type.oom || p->arg_val.oom ||
        p->call_raw.oom || p->call_name.oom)
        return -1;
    if (rc < 0) return -1;
    return p->ended;
}

int kchat_parser_feed_id(kchat_parser *p, int32_t id, kchat_event_fn fn, void *ctx)
{
    if (!p || !p->tk) return -1;
    if (p->ended) return 1;
    for (int k = 0; k < MK_COUNT; k++)
        if (id == p->mk[k]) return status(p, on_marker(p, k, fn, ctx));
    size_t len;
    const uint8_t *b = ktok_id_bytes(p->tk, id, &len);
    /* other special tokens ([EOS], reserved ids) are not text of the reply */
    if (!b || ktok_is_special(p->tk, id)) { p->malformed++; return status(p, 0); }
    return status(p, on_text(p, (const char *)b, len, fn, ctx));
}

/* The marker starting at s (n bytes available), or -1. */
static int marker_at(const char *s, size_t n)
{
    for (int k = 0; k < MK_COUNT; k++) {
        size_t l = strlen(kchat_marker_text[k]);
        if (n >= l && !memcmp(s, kchat_marker_text[k], l)) return k;
    }
    return -1;
}

/* Whether s[0..n) is a proper prefix of some marker. */
static int marker_prefix(const char *s, size_t n)
{
    for (int k = 0; k < MK_COUNT; k++) {
        size_t l = strlen(kchat_marker_text[k]);
        if (n < l && !memcmp(s, kchat_marker_text[k], n)) return 1;
    }
    return 0;
}

int kchat_parser_feed_text(kchat_parser *p, const char *text, size_t len, kchat_event_fn fn, void *ctx)
{
    if (!p || (!text && len)) return -1;
    if (p->ended) return 1;
    kbuf_add(&p->tpend, text, len);
    if (p->tpend.oom) return -1;
    const char *s = p->tpend.p ? p->tpend.p : "";
    size_t n = p->tpend.n, i = 0, run = 0;
    int rc = 0;
    while (i < n && rc == 0) {
        int k = s[i] == '<' ? marker_at(s + i, n - i) : -1;
        if (k < 0) { i++; continue; }
        if ((rc = on_text(p, s + run, i - run, fn, ctx)) != 0) break;
        rc = on_marker(p, k, fn, ctx);
        i += strlen(kchat_marker_text[k]);
        run = i;
    }
    if (rc == 0) {
        /* hold back a tail that may be the start of a marker */
        size_t keep = 0;
        for (size_t t = n > run + 13 ? n - 13 : run; t < n; t++)
            if (s[t] == '<' && marker_prefix(s + t, n - t)) { keep = n - t; break; }
        rc = on_text(p, s + run, n - keep - run, fn, ctx);
        run = n - keep;
    }
    if (rc != 0) run = n;            /* ended (later input is ignored) or failed */
    memmove(p->tpend.p, p->tpend.p + run, n - run);
    p->tpend.n = n - run;
    p->tpend.p[p->tpend.n] = 0;
    return status(p, rc);
}

int kchat_parser_finish(kchat_parser *p, kchat_event_fn fn, void *ctx)
{
    if (!p) return -1;
    int rc = 0;
    if (p->tpend.n && !p->ended) {
        rc = on_text(p, p->tpend.p, p->tpend.n, fn, ctx);
        p->tpend.n = 0;
    }
    if (rc >= 0 && !p->ended) rc = drain(p, fn, ctx, 1);
    if (rc >= 0 && p->in_call && !p->ended) {
        /* cut off inside a call: the arguments read so far */
        if (p->depth && p->stack[p->depth - 1] == TAG_ARGUMENT) argument_end(p);
        rc = call_end(p, fn, ctx);
    }
    return status(p, rc) < 0 ? -1 : 0;
}

int kchat_parser_closing(const kchat_parser *p, const ktok *tk, int32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    if (!p || !tk) return -1;
    if (p->ended) return 0;
    kseg r = {0};
    r.tk = tk;
    krun_err err;
    if (kseg_markers(tk, r.mk, &err)) return -1;
    int depth = p->depth, seen_response = p->seen_response;
    if (p->mode != MODE_BODY) kseg_marker(&r, MK_SEP);   /* finish the header that was cut */
    if (p->mode == MODE_OPEN_HEADER) {
        /* the cut header opened a tag: close it first */
        size_t nl = 0;
        while (nl < p->header.n && p->header.p[nl] != ' ') nl++;
        char *name = strndup(p->header.p ? p->header.p : "", nl);
        if (!name) return -1;
        if (nl) kseg_close(&r, name);
        free(name);
    } else if (p->mode == MODE_CLOSE_HEADER && p->header.n) {
        /* the cut header closed a tag: assume the innermost */
        depth--;
    }
    for (int i = depth - 1; i >= 0; i--) {
        tagkind k = p->stack[i];
        kseg_close(&r, k == TAG_OTHER ? (p->other[i] ? p->other[i] : "") : TAG_NAME[k]);
        if (k == TAG_THINK && i == 1 && !seen_response) {
            /* every assistant message has a response channel, even an empty one */
            kseg_open(&r, "response", NULL);
            kseg_close(&r, "response");
            seen_response = 1;
        }
    }
    kseg_marker(&r, MK_EOM);
    if (r.fail || r.text.oom) { kseg_free(&r); return -1; }
    *ids = r.ids;
    *n = r.n;
    kbuf_free(&r.text);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* whole replies                                                                              */

typedef struct {
    kbuf reasoning, content;
    kchat_call *calls;
    size_t n_calls, cap;
    int oom;
} collect;

static int collect_event(void *ctx, const kchat_event *ev)
{
    collect *c = ctx;
    switch (ev->kind) {
    case KCHAT_EV_REASONING: kbuf_add(&c->reasoning, ev->text, ev->len); break;
    case KCHAT_EV_CONTENT: kbuf_add(&c->content, ev->text, ev->len); break;
    case KCHAT_EV_TOOL_CALL_BEGIN: break;
    case KCHAT_EV_TOOL_CALL:
        if (c->n_calls == c->cap) {
            size_t nc = c->cap ? 2 * c->cap : 4;
            kchat_call *q = realloc(c->calls, nc * sizeof *q);
            if (!q) { c->oom = 1; return 1; }
            c->calls = q;
            c->cap = nc;
        }
        c->calls[c->n_calls].name = strdup(ev->name ? ev->name : "");
        c->calls[c->n_calls].arguments = strndup(ev->text, ev->len);
        c->n_calls++;
        if (!c->calls[c->n_calls - 1].name || !c->calls[c->n_calls - 1].arguments) { c->oom = 1; return 1; }
        break;
    }
    return 0;
}

void kchat_reply_free(kchat_reply *r)
{
    if (!r) return;
    free(r->reasoning);
    free(r->content);
    for (size_t i = 0; i < r->n_calls; i++) { free(r->calls[i].name); free(r->calls[i].arguments); }
    free(r->calls);
    memset(r, 0, sizeof *r);
}

static int finish_reply(kchat_parser *p, collect *c, int rc, kchat_reply *out)
{
    if (rc >= 0) rc = kchat_parser_finish(p, collect_event, c);
    if (rc >= 0 && !c->oom) {
        kbuf_add(&c->reasoning, "", 0);
        kbuf_add(&c->content, "", 0);
    }
    memset(out, 0, sizeof *out);
    out->reasoning = c->reasoning.p;
    out->reasoning_len = c->reasoning.n;
    out->content = c->content.p;
    out->content_len = c->content.n;
    out->calls = c->calls;
    out->n_calls = c->n_calls;
    out->where = kchat_parser_where(p);
    out->malformed = kchat_parser_malformed(p);
    kchat_parser_free(p);
    if (rc < 0 || c->oom || c->reasoning.oom || c->content.oom) { kchat_reply_free(out); return -1; }
    return 0;
}

int kchat_parse_ids(const ktok *tk, const int32_t *ids, size_t n, int thinking, kchat_reply *out)
{
    memset(out, 0, sizeof *out);
    kchat_parser *p = kchat_parser_new(tk, thinking);
    if (!p || (!ids && n)) { kchat_parser_free(p); return -1; }
    collect c = {0};
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) rc = kchat_parser_feed_id(p, ids[i], collect_event, &c);
    return finish_reply(p, &c, rc, out);
}

int kchat_parse_text(const char *text, size_t len, int thinking, kchat_reply *out)
{
    memset(out, 0, sizeof *out);
    kchat_parser *p = kchat_parser_new(NULL, thinking);
    if (!p) return -1;
    collect c = {0};
    int rc = kchat_parser_feed_text(p, text, len, collect_event, &c);
    return finish_reply(p, &c, rc, out);
}

const char *kchat_finish_reason(kchat_where where, size_t n_calls)
{
    if (where != KCHAT_AT_END && where != KCHAT_AT_CLOSED) return "length";
    return n_calls ? "tool_calls" : "stop";
}
