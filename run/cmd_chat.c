/* `krun chat`: a conversation in a terminal (cmd_chat.h).
 *
 * The model's state is kept between turns: turn one feeds the rendered
 * conversation (K3's chat format, run/chat.h), every later turn feeds only
 * what is new -- the reply's last token (generated, not yet run), the tokens
 * that close a reply cut short, and kchat_render_continue of the new user
 * message with the generation prompt.  The history so fed is, token for
 * token, the rendering of the whole conversation, so a turn's reply is
 * bit-identical to running the whole conversation again in one go.
 *
 * A model whose tokenizer lacks the chat markers (a synthetic test model) is
 * talked to in plain continuation: each message is appended to the text as
 * typed and the model continues it.
 *
 * Ctrl-C stops the reply being written (the conversation stays well-formed:
 * the reply is closed); during a prompt it stops before the reply starts.
 * SIGINT is taken by a thread of its own (sigwait), so no other thread sees
 * an interrupted system call. */
#include "cmd_chat.h"

#include "chat.h"
#include "jsontext.h"
#include "kio.h"
#include "kprogress.h"
#include "krun_cli.h"
#include "memplan.h"
#include "statefile.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define CHAT_CTX_DEFAULT 4096
/* Positions kept free at the end of the context for the tokens that close a
 * reply cut short (</argument></call></tools></message><|end_of_msg|> at most). */
#define CHAT_CLOSE_RESERVE 32
#define DIM "\033[2m"
#define UNDIM "\033[22m"

static const char usage[] =
    "usage: krun chat MODEL.kpk [options]\n"
    "\n"
    "Talk to the model in a terminal.  The model's state is kept between turns, so each turn\n"
    "runs only its new tokens, and every reply is bit-identical to running the whole\n"
    "conversation again.  Replies stream as they are generated.\n"
    "\n"
    "Typing: a line is a message.  A message of several lines: paste it (bracketed paste on a\n"
    "terminal), end lines with \\ to go on, or put it between two lines holding only \"\"\".\n"
    "Commands: /reset (start over), /save FILE (the state to FILE, the conversation to\n"
    "FILE.json), /load FILE (continue one saved), /help, /quit.  A message that starts with /\n"
    "is written //.  Ctrl-C stops the reply being written; Ctrl-D (end of input) exits.\n"
    "\n"
    "Conversation:\n"
    "  --system TEXT         a system message before the first turn\n"
    "  --think, --no-think   the thinking channel on (default) or off\n"
    "  --effort low|high|max thinking effort (default max)\n"
    "  --show-thinking       show the reasoning (default: dimmed on a terminal, hidden in a pipe)\n"
    "  --hide-thinking       hide it on a terminal too\n"
    "  --gen N               tokens per reply at most (default: until the reply ends)\n"
    "  --json FILE           one JSON line per turn: ids fed and generated, seconds, bytes read\n"
    "Sampling (greedy by default):\n"
    KRUN_CLI_USAGE_SAMPLING
    "Execution:\n"
    KRUN_CLI_USAGE_EXECUTION
    "  --ctx N               positions for the whole conversation (default 4096)\n"
    KRUN_CLI_USAGE_MEMORY
    "  --quiet               no plan and no statistics on stderr\n"
    "\n"
    "A model whose tokenizer has no chat markers is continued as plain text: each message is\n"
    "appended as typed.\n"
    "\n"
    "Exit: 0 at the end of input or /quit; 1 the model file is damaged (the extent is named)\n"
    "or the logits are not finite; 2 cannot run (usage, not a KPK file, no tokenizer); 3 out\n"
    "of memory.  A bad /load or /save is reported and the conversation goes on.\n";

struct chat_opts {
    const char *model, *system, *json;
    int thinking, show_thinking, hide_thinking, quiet;
    kchat_effort effort;
    long gen;
    krun_cli c;
};

typedef struct {
    kchat_role role;
    char *content, *reasoning;   /* malloc'd, NUL-terminated */
} turn_msg;

typedef struct {
    struct chat_opts o;
    krun_model *m;
    krun_session *s;
    const ktok *tk;
    int template;                /* the tokenizer has the chat markers */
    kchat_options copts;
    turn_msg *msgs;
    size_t n_msgs, cap_msgs;
    size_t fed_msgs;             /* messages whose tokens are in the state */
    int tty_in, tty_out, show, dim;
    FILE *json;
    long turn;
    /* the reply being written */
    kbuf content, reasoning, text_pend;
    int in_reasoning_shown;
} chat;

/* ---- Ctrl-C ------------------------------------------------------------------------------ */

static atomic_int interrupted;
static atomic_int at_prompt;
static sigset_t sigint_set;

static void *sigint_thread(void *arg)
{
    (void)arg;
    for (;;) {
        int sig;
        if (sigwait(&sigint_set, &sig)) continue;
        if (atomic_load(&at_prompt)) {
            /* the terminal dropped the line typed so far: show a fresh prompt */
            static const char p[] = "\n> ";
            ssize_t w = write(1, p, sizeof p - 1);
            (void)w;
        } else {
            atomic_store(&interrupted, 1);
        }
    }
    return NULL;
}

/* ---- options ------------------------------------------------------------------------------- */

static void parse_args(int argc, char **argv, struct chat_opts *o)
{
    memset(o, 0, sizeof *o);
    krun_cli_init(&o->c);
    o->thinking = 1;
    o->effort = KCHAT_EFFORT_MAX;
    o->gen = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (krun_cli_option(&o->c, argc, argv, &i)) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(usage, stdout); exit(KRUN_OK); }
        else if (!strcmp(a, "--system")) o->system = krun_cli_need(argc, argv, &i);
        else if (!strcmp(a, "--think")) o->thinking = 1;
        else if (!strcmp(a, "--no-think")) o->thinking = 0;
        else if (!strcmp(a, "--effort")) {
            const char *v = krun_cli_need(argc, argv, &i);
            o->effort = kchat_effort_parse(v);
            if (o->effort == KCHAT_EFFORT_INVALID) krun_cli_die("--effort: expected low, high or max, got %s", v);
        }
        else if (!strcmp(a, "--show-thinking")) o->show_thinking = 1;
        else if (!strcmp(a, "--hide-thinking")) o->hide_thinking = 1;
        else if (!strcmp(a, "--gen")) o->gen = krun_cli_long(krun_cli_need(argc, argv, &i), 1, 1L << 30, "--gen");
        else if (!strcmp(a, "--json")) o->json = krun_cli_need(argc, argv, &i);
        else if (!strcmp(a, "--quiet")) o->quiet = 1;
        else if (a[0] == '-') krun_cli_die("unknown option %s (see krun chat --help)", a);
        else if (!o->model) o->model = a;
        else krun_cli_die("unexpected argument %s", a);
    }
    if (!o->model) { fputs(usage, stderr); exit(KRUN_EINPUT); }
    if (o->show_thinking && o->hide_thinking) krun_cli_die("%s", "give --show-thinking or --hide-thinking, not both");
    krun_cli_check(&o->c, NULL);
    if (!o->c.ctx) o->c.ctx = CHAT_CTX_DEFAULT;
}

/* ---- the conversation ---------------------------------------------------------------------- */

static int add_msg(chat *ch, kchat_role role, const char *content, size_t len, const char *reasoning, size_t rlen)
{
    turn_msg *m;
    if (ch->n_msgs == ch->cap_msgs) {
        size_t c = ch->cap_msgs ? 2 * ch->cap_msgs : 16;
        turn_msg *p = realloc(ch->msgs, c * sizeof *p);
        if (!p) return -1;
        ch->msgs = p;
        ch->cap_msgs = c;
    }
    m = &ch->msgs[ch->n_msgs];
    m->role = role;
    m->content = strndup(content ? content : "", content ? len : 0);
    m->reasoning = reasoning ? strndup(reasoning, rlen) : NULL;
    if (!m->content || (reasoning && !m->reasoning)) { free(m->content); free(m->reasoning); return -1; }
    ch->n_msgs++;
    return 0;
}

static void clear_msgs(chat *ch)
{
    for (size_t i = 0; i < ch->n_msgs; i++) { free(ch->msgs[i].content); free(ch->msgs[i].reasoning); }
    ch->n_msgs = ch->fed_msgs = 0;
}

/* The conversation as kchat_messages (pointing into ch->msgs). */
static kchat_message *as_kchat(const chat *ch)
{
    kchat_message *k = calloc(ch->n_msgs ? ch->n_msgs : 1, sizeof *k);
    if (!k) return NULL;
    for (size_t i = 0; i < ch->n_msgs; i++) {
        k[i].role = ch->msgs[i].role;
        k[i].content = ch->msgs[i].content;
        k[i].content_len = strlen(ch->msgs[i].content);
        k[i].reasoning = ch->msgs[i].reasoning;
        k[i].reasoning_len = ch->msgs[i].reasoning ? strlen(ch->msgs[i].reasoning) : 0;
    }
    return k;
}

/* Start over: an empty state and the system message, if any. */
static int reset(chat *ch)
{
    krun_session_reset(ch->s);
    clear_msgs(ch);
    if (ch->o.system && ch->template && add_msg(ch, KCHAT_SYSTEM, ch->o.system, strlen(ch->o.system), NULL, 0)) return -1;
    return 0;
}

/* ---- reading a message ------------------------------------------------------------------------ */

/* Remove every occurrence of the marker from b. */
static int strip(kbuf *b, const char *marker)
{
    size_t ml = strlen(marker);
    int found = 0;
    char *p;
    while (b->p && (p = memmem(b->p, b->n, marker, ml))) {
        memmove(p, p + ml, b->n - (size_t)(p - b->p) - ml);
        b->n -= ml;
        b->p[b->n] = 0;
        found = 1;
    }
    return found;
}

static void chomp(kbuf *b)
{
    while (b->n && (b->p[b->n - 1] == '\n' || b->p[b->n - 1] == '\r')) b->p[--b->n] = 0;
}

/* One message into out (without its final newline): a line; a paste
 * (ESC[200~ ... ESC[201~, however many lines); lines ending in \ joined; or
 * the lines between two lines holding only """.  Returns 1, or 0 at the end of
 * input. */
static int read_message(chat *ch, kbuf *out)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int block = 0, paste = 0, first = 1, lines = 0;
    out->n = 0;
    if (out->p) out->p[0] = 0;
    for (;;) {
        if (ch->tty_in && first) { fputs("> ", stdout); fflush(stdout); }
        atomic_store(&at_prompt, 1);
        n = getline(&line, &cap, stdin);
        atomic_store(&at_prompt, 0);
        if (n < 0) { free(line); return out->n || block || paste ? 1 : 0; }
        kbuf cur = {0};
        kbuf_add(&cur, line, (size_t)n);
        if (cur.oom) { free(line); return 0; }
        if (strip(&cur, "\033[200~")) paste = 1;
        if (paste && strip(&cur, "\033[201~")) paste = 2;
        chomp(&cur);
        if (!paste && !block && first && !strcmp(cur.p ? cur.p : "", "\"\"\"")) { block = 1; first = 0; kbuf_free(&cur); continue; }
        if (block && !strcmp(cur.p ? cur.p : "", "\"\"\"")) { kbuf_free(&cur); break; }
        if (lines++) kbuf_add(out, "\n", 1);
        first = 0;
        if (block || paste == 1) { kbuf_add(out, cur.p, cur.n); kbuf_free(&cur); continue; }
        if (paste == 2) { kbuf_add(out, cur.p, cur.n); kbuf_free(&cur); break; }
        if (cur.n && cur.p[cur.n - 1] == '\\') { kbuf_add(out, cur.p, cur.n - 1); kbuf_free(&cur); continue; }
        kbuf_add(out, cur.p, cur.n);
        kbuf_free(&cur);
        break;
    }
    free(line);
    if (!out->p) kbuf_add(out, "", 0);
    return out->oom ? 0 : 1;
}

/* ---- the reply, as it comes ------------------------------------------------------------------------ */

static void show(const char *s, size_t n)
{
    fwrite(s, 1, n, stdout);
    fflush(stdout);
}

static void end_reasoning(chat *ch)
{
    if (!ch->in_reasoning_shown) return;
    ch->in_reasoning_shown = 0;
    if (ch->dim) show(UNDIM "\n\n", strlen(UNDIM) + 2);
    else show("\n</think>\n", 10);
}

static int on_event(void *ctx, const kchat_event *ev)
{
    chat *ch = ctx;
    switch (ev->kind) {
    case KCHAT_EV_REASONING:
        kbuf_add(&ch->reasoning, ev->text, ev->len);
        if (!ch->show) break;
        if (!ch->in_reasoning_shown) {
            ch->in_reasoning_shown = 1;
            if (ch->dim) show(DIM, strlen(DIM));
            else show("<think>\n", 8);
        }
        show(ev->text, ev->len);
        break;
    case KCHAT_EV_CONTENT:
        end_reasoning(ch);
        kbuf_add(&ch->content, ev->text, ev->len);
        show(ev->text, ev->len);
        break;
    case KCHAT_EV_TOOL_CALL_BEGIN:
        break;
    case KCHAT_EV_TOOL_CALL:
        end_reasoning(ch);
        printf("[tool call %s %.*s]\n", ev->name ? ev->name : "", (int)ev->len, ev->text);
        fflush(stdout);
        break;
    }
    return 0;
}

/* Plain continuation: a token's bytes, whole UTF-8 characters at a time. */
static void show_bytes(chat *ch, const uint8_t *b, size_t len, int flush)
{
    size_t ok;
    kbuf_add(&ch->text_pend, b, len);
    if (ch->text_pend.oom) return;
    ok = flush ? ch->text_pend.n : ktok_utf8_complete((const uint8_t *)ch->text_pend.p, ch->text_pend.n);
    show(ch->text_pend.p, ok);
    kbuf_add(&ch->content, ch->text_pend.p, ok);
    memmove(ch->text_pend.p, ch->text_pend.p + ok, ch->text_pend.n - ok);
    ch->text_pend.n -= ok;
}

/* ---- one turn ------------------------------------------------------------------------------------ */

typedef struct {
    int32_t *fed;                /* what this turn ran before its reply */
    size_t n_fed;
    kbuf reply;                  /* the ids generated, as int32_t */
    size_t n_reply;
    const char *finish;
    double t_prefill, t_reply;
    uint64_t bytes_prefill, bytes_reply;
} turn_log;

static json_t *ids_json(const int32_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static void log_turn(chat *ch, const turn_log *t)
{
    json_t *j;
    size_t hist;
    if (!ch->json) return;
    krun_session_tokens(ch->s, &hist);
    j = json_object();
    json_object_set_new(j, "turn", json_integer(ch->turn));
    json_object_set_new(j, "fed_ids", ids_json(t->fed, t->n_fed));
    json_object_set_new(j, "reply_ids", ids_json((const int32_t *)(const void *)t->reply.p, t->n_reply));
    json_object_set_new(j, "finish", json_string(t->finish));
    json_object_set_new(j, "history_tokens", json_integer((json_int_t)hist));
    json_object_set_new(j, "prefill_seconds", json_real(t->t_prefill));
    json_object_set_new(j, "reply_seconds", json_real(t->t_reply));
    json_object_set_new(j, "prefill_bytes_read", json_integer((json_int_t)t->bytes_prefill));
    json_object_set_new(j, "reply_bytes_read", json_integer((json_int_t)t->bytes_reply));
    json_dumpf(j, ch->json, JSON_COMPACT);
    fputc('\n', ch->json);
    fflush(ch->json);
    json_decref(j);
}

static uint64_t bytes_read(chat *ch)
{
    kstore_stats st;
    krun_model_stats(ch->m, &st);
    return st.bytes_read;
}

/* The ids this turn feeds: the whole conversation after a reset, else what
 * follows the state (the user's new message and the generation prompt). */
static int turn_ids(chat *ch, const char *text, size_t len, int32_t **ids, size_t *n)
{
    char err[512];
    size_t hist;
    krun_session_tokens(ch->s, &hist);
    if (!ch->template) {
        if (ktok_encode(ch->tk, text, len, 1, ids, n)) { fprintf(stderr, "krun chat: cannot tokenize the message\n"); return -1; }
        return 0;
    }
    kchat_message *k = as_kchat(ch);
    kchat_rendering r;
    int rc;
    if (!k) { fprintf(stderr, "krun chat: out of memory\n"); return -1; }
    rc = hist == 0 ? kchat_render(ch->tk, k, ch->n_msgs, &ch->copts, &r, err, sizeof err)
                   : kchat_render_continue(ch->tk, k, ch->n_msgs, ch->fed_msgs, &ch->copts, &r, err, sizeof err);
    free(k);
    if (rc) { fprintf(stderr, "krun chat: %s\n", err); return -1; }
    free(r.text);
    *ids = r.ids;
    *n = r.n_ids;
    return 0;
}

/* Generate the reply, streaming it.  Every generated token but the last is
 * run; the last joins the history as pending, followed by the tokens that
 * close the reply if it was cut short, so the state always ends at a whole
 * message.  Returns 0, or -1 with err (the model failed). */
static int reply(chat *ch, turn_log *t, krun_err *err)
{
    kchat_parser *p = ch->template ? kchat_parser_new(ch->tk, ch->copts.thinking) : NULL;
    int32_t stop[3];
    size_t n_stop = krun_model_stop_ids(ch->m, stop), ctx = krun_model_ctx(ch->m);
    double t0 = know();
    uint64_t b0 = bytes_read(ch);
    int rc = 0;
    if (ch->template && !p) { krun_err_set(err, KRUN_ENOMEM, "out of memory"); return -1; }
    ch->content.n = ch->reasoning.n = ch->text_pend.n = 0;
    ch->in_reasoning_shown = 0;
    t->finish = "length";
    for (;;) {
        int32_t id;
        int end = 0;
        size_t hist;
        if (atomic_load(&interrupted) && !t->n_reply) { t->finish = "interrupted"; break; }   /* Ctrl-C during the prompt */
        id = krun_session_sample(ch->s);
        if (id < 0) { krun_err_set(err, KRUN_EINPUT, "no logits to sample from"); rc = -1; break; }
        kbuf_add(&t->reply, &id, sizeof id);
        if (t->reply.oom) { krun_err_set(err, KRUN_ENOMEM, "out of memory"); rc = -1; break; }
        t->n_reply++;
        if (p) end = kchat_parser_feed_id(p, id, on_event, ch) == 1;
        for (size_t k = 0; k < n_stop; k++) end |= id == stop[k];
        if (!p && !end) {
            size_t len;
            const uint8_t *b = ktok_id_bytes(ch->tk, id, &len);
            if (b) show_bytes(ch, b, len, 0);
        }
        krun_session_tokens(ch->s, &hist);
        if (end) t->finish = "stop";
        else if (atomic_load(&interrupted)) { t->finish = "interrupted"; end = 1; }
        else if (ch->o.gen > 0 && (long)t->n_reply >= ch->o.gen) end = 1;
        else if (hist + 1 + CHAT_CLOSE_RESERVE >= ctx) { t->finish = "context full"; end = 1; }
        if (end) {
            /* the last token is not run: it joins the history as pending */
            if (krun_session_append(ch->s, &id, 1, err)) rc = -1;
            break;
        }
        if (krun_session_feed(ch->s, &id, 1, NULL, err)) { rc = -1; break; }
    }
    if (p) {
        int32_t *close = NULL;
        size_t n_close = 0;
        kchat_parser_finish(p, on_event, ch);
        /* a reply cut short is closed, so the next turn's rendering follows a whole message */
        if (!rc && kchat_parser_where(p) != KCHAT_AT_END) {
            if (kchat_parser_closing(p, ch->tk, &close, &n_close) || krun_session_append(ch->s, close, n_close, err)) {
                if (!err->msg[0]) krun_err_set(err, KRUN_ENOMEM, "out of memory");
                rc = -1;
            }
            free(close);
        }
        kchat_parser_free(p);
    } else {
        show_bytes(ch, NULL, 0, 1);
    }
    end_reasoning(ch);
    if (ch->content.n || ch->reasoning.n || ch->template) show("\n", 1);
    if (strcmp(t->finish, "stop") && !ch->o.quiet) fprintf(stderr, "[%s after %zu tokens]\n", t->finish, t->n_reply);
    t->t_reply = know() - t0;
    t->bytes_reply = bytes_read(ch) - b0;
    return rc;
}

/* One turn: the user's message in, the reply out.  Returns 0, 1 when the turn
 * was refused (the conversation is unchanged), or -1 when the model failed. */
static int run_turn(chat *ch, const char *text, size_t len, krun_err *err)
{
    turn_log t;
    size_t hist, ctx = krun_model_ctx(ch->m), before = ch->n_msgs;
    int rc;
    memset(&t, 0, sizeof t);
    if (add_msg(ch, KCHAT_USER, text, len, NULL, 0)) { krun_err_set(err, KRUN_ENOMEM, "out of memory"); return -1; }
    if (turn_ids(ch, text, len, &t.fed, &t.n_fed)) goto refuse;
    krun_session_tokens(ch->s, &hist);
    if (hist + t.n_fed + 1 + CHAT_CLOSE_RESERVE > ctx) {
        fprintf(stderr, "krun chat: the conversation holds %zu positions and this message needs %zu more, with room for a reply; "
                "the context is %zu: /save it and restart with a larger --ctx, or /reset\n", hist, t.n_fed, ctx);
        goto refuse;
    }
    {
        /* the pending tokens (the last reply's end) run first, then this turn */
        size_t pending = krun_session_pending(ch->s);
        int32_t *all = malloc((pending + t.n_fed) * sizeof *all);
        const int32_t *h = krun_session_tokens(ch->s, &hist);
        krun_prefill_progress pp;
        uint64_t b0 = bytes_read(ch);
        if (!all) { krun_err_set(err, KRUN_ENOMEM, "out of memory"); free(t.fed); return -1; }
        memcpy(all, h + hist - pending, pending * sizeof *all);
        memcpy(all + pending, t.fed, t.n_fed * sizeof *all);
        free(t.fed);
        t.fed = all;
        t.n_fed += pending;
        krun_prefill_progress_start(&pp, ch->m, ch->o.quiet);
        if (!ch->o.quiet) krun_announce_prompt(ch->m, t.n_fed);
        krun_session_set_progress(ch->s, krun_prefill_progress_fn, &pp);
        rc = krun_session_feed(ch->s, t.fed + pending, t.n_fed - pending, NULL, err);
        krun_session_set_progress(ch->s, NULL, NULL);
        t.t_prefill = know() - pp.t0;
        t.bytes_prefill = bytes_read(ch) - b0;
        if (rc) { free(t.fed); return -1; }
    }
    ch->fed_msgs = ch->n_msgs;
    ch->turn++;
    /* (a Ctrl-C while the prompt ran gives an empty reply, closed like any other) */
    rc = reply(ch, &t, err);
    atomic_store(&interrupted, 0);
    if (!rc) {
        if (add_msg(ch, KCHAT_ASSISTANT, ch->content.p, ch->content.n, ch->reasoning.n ? ch->reasoning.p : NULL, ch->reasoning.n)) {
            krun_err_set(err, KRUN_ENOMEM, "out of memory");
            rc = -1;
        }
        ch->fed_msgs = ch->n_msgs;
        log_turn(ch, &t);
    }
    free(t.fed);
    kbuf_free(&t.reply);
    return rc;
refuse:
    free(ch->msgs[before].content);
    free(ch->msgs[before].reasoning);
    ch->n_msgs = before;
    free(t.fed);
    return 1;
}

/* ---- /save and /load ----------------------------------------------------------------------------- */

static char *json_path(const char *path)
{
    size_t n = strlen(path);
    char *p = malloc(n + 6);
    if (p) { memcpy(p, path, n); memcpy(p + n, ".json", 6); }
    return p;
}

/* XXH3 of a token history, as 32-bit little-endian ids (the state file's layout). */
static uint64_t tokens_hash(const int32_t *ids, size_t n) { return XXH3_64bits(ids, n * sizeof *ids); }

/* A JSON string of text that may not be valid UTF-8 (a reply cut inside a character). */
static json_t *text_json(const char *s)
{
    kbuf b = {0};
    json_t *j;
    kutf8_sanitize(s, strlen(s), &b);
    j = b.oom ? NULL : json_stringn(b.p ? b.p : "", b.n);
    kbuf_free(&b);
    return j;
}

static void save(chat *ch, const char *path)
{
    krun_err e;
    size_t n;
    const int32_t *ids = krun_session_tokens(ch->s, &n);
    char *jp = json_path(path), hash[24];
    json_t *j = json_object(), *msgs = json_array();
    if (!jp || !j || !msgs) { fprintf(stderr, "krun chat: out of memory\n"); free(jp); json_decref(j); json_decref(msgs); return; }
    if (krun_session_save(ch->s, path, &e)) { fprintf(stderr, "krun chat: %s\n", e.msg); free(jp); json_decref(j); json_decref(msgs); return; }
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)tokens_hash(ids, n));
    for (size_t i = 0; i < ch->n_msgs; i++) {
        json_t *m = json_object();
        json_object_set_new(m, "role", json_string(kchat_role_name(ch->msgs[i].role)));
        json_object_set_new(m, "content", text_json(ch->msgs[i].content));
        if (ch->msgs[i].reasoning) json_object_set_new(m, "reasoning_content", text_json(ch->msgs[i].reasoning));
        json_array_append_new(msgs, m);
    }
    json_object_set_new(j, "format", json_string("krun chat 1"));
    json_object_set_new(j, "model", json_string(krun_model_path(ch->m)));
    json_object_set_new(j, "state", json_string(path));
    json_object_set_new(j, "template", json_boolean(ch->template));
    json_object_set_new(j, "thinking", json_boolean(ch->copts.thinking));
    json_object_set_new(j, "effort", ch->copts.effort == KCHAT_EFFORT_NONE ? json_null() : json_string(kchat_effort_name(ch->copts.effort)));
    json_object_set_new(j, "history_tokens", json_integer((json_int_t)n));
    json_object_set_new(j, "history_xxh3", json_string(hash));
    json_object_set_new(j, "messages", msgs);
    /* the conversation next to the state: the same "messages" an OpenAI request takes */
    if (json_dump_file(j, jp, JSON_INDENT(1) | JSON_ENSURE_ASCII) != 0) fprintf(stderr, "krun chat: cannot write %s\n", jp);
    else fprintf(stderr, "krun chat: saved %zu positions to %s and the conversation to %s\n", n, path, jp);
    json_decref(j);
    free(jp);
}

/* The messages of FILE.json into a fresh list; NULL with a message on stderr. */
static json_t *read_conversation(const char *jp, uint64_t *hash, size_t *n_tokens, int *template)
{
    json_error_t je;
    json_t *j = json_load_file(jp, 0, &je), *msgs;
    const char *h;
    if (!j) { fprintf(stderr, "krun chat: %s: %s (line %d)\n", jp, je.text, je.line); return NULL; }
    msgs = json_object_get(j, "messages");
    h = json_string_value(json_object_get(j, "history_xxh3"));
    if (!json_is_array(msgs) || !h || !json_is_integer(json_object_get(j, "history_tokens")) ||
        strcmp(json_string_value(json_object_get(j, "format")) ? json_string_value(json_object_get(j, "format")) : "", "krun chat 1")) {
        fprintf(stderr, "krun chat: %s is not a conversation saved by krun chat (format \"krun chat 1\")\n", jp);
        json_decref(j);
        return NULL;
    }
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")) ||
            !json_is_string(json_object_get(m, "content"))) {
            fprintf(stderr, "krun chat: %s: messages[%zu] needs a role (system, user, assistant) and a content string\n", jp, i);
            json_decref(j);
            return NULL;
        }
    }
    *hash = strtoull(h, NULL, 16);
    *n_tokens = (size_t)json_integer_value(json_object_get(j, "history_tokens"));
    *template = json_is_true(json_object_get(j, "template"));
    return j;
}

static void load(chat *ch, const char *path)
{
    char *jp = json_path(path), *buf = NULL;
    uint64_t hash, pos, nt, most;
    size_t n_tokens, len = 0;
    int template;
    json_t *j;
    krun_err e;
    krun_state_hdr h;
    if (!jp) { fprintf(stderr, "krun chat: out of memory\n"); return; }
    if (krun_state_peek(path, &pos, &nt, &e)) { fprintf(stderr, "krun chat: %s\n", e.msg); free(jp); return; }
    j = read_conversation(jp, &hash, &n_tokens, &template);
    if (!j) { free(jp); return; }
    if (template != ch->template) {
        fprintf(stderr, "krun chat: %s was a %s conversation; this model's is %s\n", jp, template ? "chat-format" : "plain-text",
                ch->template ? "in the chat format" : "plain text");
        goto out;
    }
    /* the state must be the conversation's: check its tokens before replacing anything */
    /* a state of this model at this context is smaller than a session's slot (its state, tokens, logits and more) */
    most = krun_session_bytes(krun_model_config(ch->m), krun_model_ctx(ch->m)) + (1u << 20);
    if (kio_read_file(path, (size_t)most, &buf, &len) || krun_state_parse(buf, len, &h, &e)) {
        fprintf(stderr, "krun chat: %s: %s\n", path, buf ? e.msg : strerror(errno));
        goto out;
    }
    if (h.n_tokens != n_tokens || XXH3_64bits(buf + h.tokens_at, (size_t)h.n_tokens * 4) != hash) {
        fprintf(stderr, "krun chat: %s does not hold the conversation of %s (another save?): nothing loaded\n", path, jp);
        goto out;
    }
    free(buf);                   /* (loading reads the file again: one copy at a time) */
    buf = NULL;
    if (krun_session_load(ch->s, path, &e)) { fprintf(stderr, "krun chat: %s\n", e.msg); goto out; }
    clear_msgs(ch);
    {
        json_t *msgs = json_object_get(j, "messages");
        for (size_t i = 0; i < json_array_size(msgs); i++) {
            json_t *m = json_array_get(msgs, i), *r = json_object_get(m, "reasoning_content");
            const char *role = json_string_value(json_object_get(m, "role"));
            json_t *c = json_object_get(m, "content");
            add_msg(ch, !strcmp(role, "system") ? KCHAT_SYSTEM : !strcmp(role, "user") ? KCHAT_USER : KCHAT_ASSISTANT,
                    json_string_value(c), json_string_length(c), json_string_value(r), json_string_length(r));
        }
        ch->fed_msgs = ch->n_msgs;
        /* the conversation goes on in the mode it was in */
        if (json_is_boolean(json_object_get(j, "thinking"))) ch->copts.thinking = json_is_true(json_object_get(j, "thinking"));
        ch->copts.effort = json_is_string(json_object_get(j, "effort")) ? kchat_effort_parse(json_string_value(json_object_get(j, "effort")))
                                                                        : KCHAT_EFFORT_NONE;
        if (ch->copts.effort == KCHAT_EFFORT_INVALID) ch->copts.effort = KCHAT_EFFORT_NONE;
    }
    fprintf(stderr, "krun chat: loaded %zu messages, %zu positions (thinking %s)\n", ch->n_msgs, n_tokens, ch->copts.thinking ? "on" : "off");
out:
    free(buf);
    json_decref(j);
    free(jp);
}

/* ---- the loop -------------------------------------------------------------------------------------- */

static const char help[] =
    "/reset        start over (the system message stays)\n"
    "/save FILE    the state to FILE and the conversation to FILE.json\n"
    "/load FILE    continue a saved conversation\n"
    "/quit         leave (so does Ctrl-D)\n"
    "A message of several lines: paste it, end lines with \\, or put it between lines holding only \"\"\".\n"
    "Ctrl-C stops the reply being written.\n";

/* A command line: 1 handled, 0 not a command, -1 quit. */
static int command(chat *ch, const char *line)
{
    const char *arg;
    if (line[0] != '/' || line[1] == '/') return 0;
    arg = strchr(line, ' ');
    while (arg && *arg == ' ') arg++;
    if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) return -1;
    if (!strcmp(line, "/help")) { fputs(help, stderr); return 1; }
    if (!strcmp(line, "/reset")) {
        if (reset(ch)) { fprintf(stderr, "krun chat: out of memory\n"); return -1; }
        fprintf(stderr, "krun chat: the conversation starts over\n");
        return 1;
    }
    if (!strncmp(line, "/save ", 6) && arg && *arg) { save(ch, arg); return 1; }
    if (!strncmp(line, "/load ", 6) && arg && *arg) { load(ch, arg); return 1; }
    fprintf(stderr, "krun chat: unknown command %s (/help lists them; start a message with // to send a /)\n", line);
    return 1;
}

int krun_chat_main(int argc, char **argv)
{
    chat ch;
    krun_model_opts mo;
    krun_err e = {0, {0}};
    uint64_t budget;
    ksampler_opts so;
    pthread_t sig_thread;
    kbuf msg = {0};
    int rc = KRUN_EINPUT;

    memset(&ch, 0, sizeof ch);
    parse_args(argc, argv, &ch.o);
    if (krun_cli_budget(&ch.o.c, &budget)) return KRUN_EINPUT;
    /* Ctrl-C goes to one thread (every thread started later inherits the mask) */
    sigemptyset(&sigint_set);
    sigaddset(&sigint_set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigint_set, NULL);
    if (pthread_create(&sig_thread, NULL, sigint_thread, NULL)) { fprintf(stderr, "krun chat: cannot start a thread\n"); return KRUN_ENOMEM; }
    pthread_detach(sig_thread);

    if (krun_model_load(ch.o.model, &ch.m, &e)) { fprintf(stderr, "krun chat: %s\n", e.msg); return e.code; }
    ch.tk = krun_model_tokenizer(ch.m);
    if (!ch.tk) { fprintf(stderr, "krun chat: %s has no tokenizer: krun chat needs one (krun --ids takes token ids)\n", ch.o.model); goto out; }
    ch.template = ktok_find_special(ch.tk, KCHAT_OPEN) >= 0 && ktok_find_special(ch.tk, KCHAT_CLOSE) >= 0 &&
                  ktok_find_special(ch.tk, KCHAT_SEP) >= 0 && ktok_find_special(ch.tk, KCHAT_END_OF_MSG) >= 0;
    krun_cli_model_opts(&ch.o.c, ch.o.model, budget, &mo);
    mo.max_seqs = 1;
    if (krun_model_prepare(ch.m, &mo, &e)) { fprintf(stderr, "krun chat: %s\n", e.msg); rc = e.code; goto out; }
    if (!ch.o.quiet && krun_model_plan(ch.m)) kmemplan_print(krun_model_plan(ch.m), stderr);
    if (krun_session_new(ch.m, &ch.s, &e)) { fprintf(stderr, "krun chat: %s\n", e.msg); rc = e.code; goto out; }
    krun_cli_sampler(&ch.o.c, &so);
    krun_session_set_sampler(ch.s, &so);
    kchat_options_default(&ch.copts);
    ch.copts.thinking = ch.o.thinking;
    ch.copts.effort = ch.o.thinking ? ch.o.effort : KCHAT_EFFORT_NONE;
    ch.tty_in = isatty(0);
    ch.tty_out = isatty(1);
    ch.dim = ch.tty_out && !ch.o.show_thinking ? 1 : ch.tty_out;
    ch.show = ch.o.show_thinking || (ch.tty_out && !ch.o.hide_thinking);
    if (ch.o.json && !(ch.json = fopen(ch.o.json, "w"))) {
        fprintf(stderr, "krun chat: cannot write %s: %s\n", ch.o.json, strerror(errno));
        goto out;
    }
    if (reset(&ch)) { fprintf(stderr, "krun chat: out of memory\n"); rc = KRUN_ENOMEM; goto out; }
    if (!ch.o.quiet)
        fprintf(stderr, "krun chat: %s, %zu positions%s; /help for commands, Ctrl-D to leave\n",
                ch.template ? (ch.copts.thinking ? "thinking on" : "thinking off") : "plain-text continuation (no chat markers in this tokenizer)",
                krun_model_ctx(ch.m), ch.o.system && !ch.template ? " (--system needs the chat format: ignored)" : "");
    if (ch.tty_in && ch.tty_out) { fputs("\033[?2004h", stdout); fflush(stdout); }     /* bracketed paste */
    rc = KRUN_OK;
    while (read_message(&ch, &msg)) {
        int c = command(&ch, msg.p);
        if (c < 0) break;
        if (c > 0) continue;
        if (!msg.n) continue;
        atomic_store(&interrupted, 0);
        if (run_turn(&ch, msg.p[0] == '/' ? msg.p + 1 : msg.p, msg.p[0] == '/' ? msg.n - 1 : msg.n, &e) < 0) {
            fprintf(stderr, "\nkrun chat: %s\n", e.msg);
            rc = e.code ? e.code : KRUN_EINPUT;
            break;
        }
    }
    if (ch.tty_in && ch.tty_out) { fputs("\033[?2004l", stdout); fflush(stdout); }
    if (rc == KRUN_OK && ch.o.c.trace && krun_model_trace_write(ch.m, ch.o.c.trace)) {
        fprintf(stderr, "krun chat: cannot write %s: %s\n", ch.o.c.trace, strerror(errno));
        rc = KRUN_EINPUT;
    }
out:
    kbuf_free(&msg);
    kbuf_free(&ch.content);
    kbuf_free(&ch.reasoning);
    kbuf_free(&ch.text_pend);
    clear_msgs(&ch);
    free(ch.msgs);
    if (ch.json) fclose(ch.json);
    krun_session_free(ch.s);
    krun_model_close(ch.m);
    return rc;
}
