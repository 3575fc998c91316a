/* `krun chat`: a conversation in a terminal (cmd_chat.h).
 *
 * The model's state is kept between turns: turn one feeds the rendered
 * conversation (K3's chat format, run/text/chat.h), every later turn feeds only
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

#include "chat_conv.h"
#include "krun_cli.h"
#include "format/kprogress.h"
#include "run/session/memplan.h"
#include "run/text/chat.h"
#include "run/text/jsontext.h"
#include "run/text/utf8_hold.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    "  --spec N              speculative decoding: verify up to N drafts (the drafter's, or the text's where\n"
    "                        it repeats) in one forward block; the replies are the same bits (default 8\n"
    "                        with a drafter, else 0)\n"
    KRUN_CLI_USAGE_DRAFT
    "  --json FILE           one JSON line per turn: ids fed and generated, seconds, bytes read\n"
    "Prefix cache (off unless --cache-dir; shared with krun and krun serve):\n"
    KRUN_CLI_USAGE_CACHE("")
    "                        the first turn starts from the longest kept state it begins with (a\n"
    "                        system prompt read by an earlier run is not read again); the end of\n"
    "                        the system part, of every turn's prompt and of the conversation are kept\n"
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
    long gen, spec;            /* spec: drafts per verification (-1: 8 with a drafter, else 0) */
    krun_cli c;
};

typedef struct {
    struct chat_opts o;
    krun_model *m;
    krun_session *s;
    krun_pcache *cache;          /* --cache-dir: the first turn starts from a kept state (the system prompt's) */
    ksampler_opts so;
    const ktok *tk;
    kconv conv;                  /* the messages, the chat options, the mode */
    int tty_in, tty_out, show, dim;
    FILE *json;
    long turn;
    /* the reply being written */
    kbuf content, reasoning;
    kutf8_hold text_pend;        /* plain continuation: a character cut between tokens */
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
    o->spec = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
#define OPT(name) krun_cli_value(argc, argv, &i, name, &v)
        if (krun_cli_option(&o->c, argc, argv, &i)) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(usage, stdout); exit(KRUN_OK); }
        else if (OPT("--system")) o->system = v;
        else if (!strcmp(a, "--think")) o->thinking = 1;
        else if (!strcmp(a, "--no-think")) o->thinking = 0;
        else if (OPT("--effort")) {
            o->effort = kchat_effort_parse(v);
            if (o->effort == KCHAT_EFFORT_INVALID) krun_cli_die("--effort: expected low, high or max, got %s", v);
        }
        else if (!strcmp(a, "--show-thinking")) o->show_thinking = 1;
        else if (!strcmp(a, "--hide-thinking")) o->hide_thinking = 1;
        else if (OPT("--gen")) o->gen = krun_cli_long(v, 1, 1L << 30, "--gen");
        else if (OPT("--spec")) o->spec = krun_cli_long(v, 0, 64, "--spec (0..64)");
        else if (OPT("--json")) o->json = v;
        else if (!strcmp(a, "--quiet")) o->quiet = 1;
        else if (a[0] == '-') krun_cli_die("unknown option %s (see krun chat --help)", a);
        else if (!o->model) o->model = a;
        else krun_cli_die("unexpected argument %s", a);
#undef OPT
    }
    if (!o->model) { fputs(usage, stderr); exit(KRUN_EINPUT); }
    if (o->show_thinking && o->hide_thinking) krun_cli_die("%s", "give --show-thinking or --hide-thinking, not both");
    krun_cli_check(&o->c, NULL);
    if (!o->c.ctx) o->c.ctx = CHAT_CTX_DEFAULT;
    if (o->spec < 0) {
        char buf[4096];
        o->spec = krun_cli_draft_file(&o->c, o->model, buf, sizeof buf) ? KRUN_DRAFT_SPEC : 0;
    }
}

/* ---- the conversation ---------------------------------------------------------------------- */

/* Start over: an empty state and the system message, if any. */
static int reset(chat *ch)
{
    krun_session_reset(ch->s);
    kconv_truncate(&ch->conv, 0);
    if (ch->o.system && ch->conv.template && kconv_add(&ch->conv, KCHAT_SYSTEM, ch->o.system, strlen(ch->o.system), NULL, 0)) return -1;
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
    const char *text;
    size_t ok;
    if (kutf8_hold_take(&ch->text_pend, b, len, flush, &text, &ok)) return;
    show(text, ok);
    kbuf_add(&ch->content, text, ok);
}

/* ---- one turn ------------------------------------------------------------------------------------ */

typedef struct {
    int32_t *fed;                /* what this turn ran before its reply */
    size_t n_fed;
    size_t cached;               /* of them, the positions a kept state held (--cache-dir) */
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
    json_object_set_new(j, "cached_positions", json_integer((json_int_t)t->cached));
    json_object_set_new(j, "reply_ids", ids_json((const int32_t *)(const void *)t->reply.p, t->n_reply));
    json_object_set_new(j, "finish", json_string(t->finish));
    json_object_set_new(j, "history_tokens", json_integer((json_int_t)hist));
    json_object_set_new(j, "prefill_seconds", json_real(t->t_prefill));
    json_object_set_new(j, "reply_seconds", json_real(t->t_reply));
    json_object_set_new(j, "prefill_bytes_read", json_integer((json_int_t)t->bytes_prefill));
    json_object_set_new(j, "reply_bytes_read", json_integer((json_int_t)t->bytes_reply));
    {
        /* speculation so far in the conversation: what was drafted (and by the drafter) and kept */
        krun_spec_stats sp;
        krun_session_spec_stats(ch->s, &sp);
        json_object_set_new(j, "spec", json_pack("{sIsIsIsIsIsI}", "sweeps", (json_int_t)sp.sweeps, "drafted", (json_int_t)sp.drafted,
                                                 "accepted", (json_int_t)sp.accepted, "drafter_verifications",
                                                 (json_int_t)sp.drafter_verifications, "drafter_drafted", (json_int_t)sp.drafter_drafted,
                                                 "drafter_accepted", (json_int_t)sp.drafter_accepted));
    }
    {
        krun_stats st;   /* the prefill layout's switches so far (--chunk auto: a long turn runs in large blocks) */
        krun_model_stats(ch->m, &st);
        json_object_set_new(j, "phase_switches", json_integer((json_int_t)st.phase_switches));
    }
    json_dumpf(j, ch->json, JSON_COMPACT);
    fputc('\n', ch->json);
    fflush(ch->json);
    json_decref(j);
}

static uint64_t bytes_read(chat *ch)
{
    krun_stats st;
    krun_model_stats(ch->m, &st);
    return st.bytes_read;
}

/* The ids this turn feeds: the whole conversation after a reset, else what
 * follows the state (the user's new message and the generation prompt).
 * *preamble: where the rendering's system part ends (0 in a continuation). */
static int turn_ids(chat *ch, const char *text, size_t len, int32_t **ids, size_t *n, size_t *preamble)
{
    krun_err err;
    size_t hist;
    krun_session_tokens(ch->s, &hist);
    if (!ch->conv.template) {
        if (ktok_encode(ch->tk, text, len, 1, ids, n)) { fprintf(stderr, "krun chat: cannot tokenize the message\n"); return -1; }
        return 0;
    }
    kchat_message *k = kconv_view(&ch->conv);
    kchat_rendering r;
    int rc;
    if (!k) { fprintf(stderr, "krun chat: out of memory\n"); return -1; }
    rc = hist == 0 ? kchat_render(ch->tk, k, ch->conv.n, &ch->conv.opts, &r, &err)
                   : kchat_render_continue(ch->tk, k, ch->conv.n, ch->conv.fed, &ch->conv.opts, &r, &err);
    free(k);
    if (rc) { fprintf(stderr, "krun chat: %s\n", err.msg); return -1; }
    free(r.text);
    *ids = r.ids;
    *n = r.n_ids;
    *preamble = r.n_preamble;
    return 0;
}

/* The first turn with --cache-dir: the session starts over from the cache,
 * holding the longest kept state the conversation begins with (a system
 * prompt read by an earlier run), with the conversation's sampler: its draw
 * depends on the seed, the stream and the position only (sampler.h), so there
 * is no random state to carry over; the reply start is set by reply(). */
static int from_cache(chat *ch, turn_log *t, size_t preamble, krun_err *err)
{
    krun_pcache_end(ch->cache, ch->s);
    ch->s = NULL;
    if (krun_pcache_begin(ch->cache, t->fed, t->n_fed, preamble, &ch->s, &t->cached, err)) return -1;
    krun_session_set_sampler(ch->s, &ch->so);
    return 0;
}

/* One token of the reply: recorded, parsed, shown.  1 when the reply ends with it (its finish
 * in t), 0 when it goes on, -1 out of memory.  ran: the token has run already (a draft the
 * model accepted): the context check counts it, and Ctrl-C waits for the next token sampled
 * (the accepted tokens after it have run too: they are the reply's). */
static int reply_token(chat *ch, turn_log *t, kchat_parser *p, int32_t id, const int32_t *stop, size_t n_stop, size_t ctx, int ran,
                       krun_err *err)
{
    int end = 0;
    size_t hist;
    kbuf_add(&t->reply, &id, sizeof id);
    if (t->reply.oom) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    t->n_reply++;
    if (p) end = kchat_parser_feed_id(p, id, on_event, ch) == 1;
    for (size_t k = 0; k < n_stop; k++) end |= id == stop[k];
    if (!p && !end) {
        size_t len;
        const uint8_t *b = ktok_id_bytes(ch->tk, id, &len);
        if (b) show_bytes(ch, b, len, 0);
    }
    krun_session_tokens(ch->s, &hist);
    if (ran && hist) hist--;
    if (end) t->finish = "stop";
    else if (!ran && atomic_load(&interrupted)) { t->finish = "interrupted"; end = 1; }
    else if (ch->o.gen > 0 && (long)t->n_reply >= ch->o.gen) end = 1;
    else if (hist + 1 + CHAT_CLOSE_RESERVE >= ctx) { t->finish = "context full"; end = 1; }
    return end;
}

/* Generate the reply, streaming it.  Every generated token but the last is
 * run; the last joins the history as pending, followed by the tokens that
 * close the reply if it was cut short, so the state always ends at a whole
 * message.  Returns 0, or -1 with err (the model failed). */
static int reply(chat *ch, turn_log *t, krun_err *err)
{
    kchat_parser *p = ch->conv.template ? kchat_parser_new(ch->tk, ch->conv.opts.thinking) : NULL;
    int32_t stop[3];
    size_t n_stop = krun_model_stop_ids(ch->m, stop), ctx = krun_model_ctx(ch->m);
    double t0 = know();
    uint64_t b0 = bytes_read(ch);
    int rc = 0;
    if (ch->conv.template && !p) { krun_err_set(err, KRUN_ENOMEM, "out of memory"); return -1; }
    {
        /* the reply begins here: the sampler's frequency and presence penalties count from it */
        size_t hist;
        krun_session_tokens(ch->s, &hist);
        krun_session_set_reply_start(ch->s, hist);
    }
    ch->content.n = ch->reasoning.n = 0;
    kutf8_hold_reset(&ch->text_pend);
    ch->in_reasoning_shown = 0;
    t->finish = "length";
    for (;;) {
        int32_t id, acc[65];
        int end;
        size_t n_acc = 0, room;
        if (atomic_load(&interrupted) && !t->n_reply) { t->finish = "interrupted"; break; }   /* Ctrl-C during the prompt */
        id = krun_session_sample(ch->s);
        if (id < 0) { krun_err_set(err, KRUN_EINPUT, "no logits to sample from"); rc = -1; break; }
        if ((end = reply_token(ch, t, p, id, stop, n_stop, ctx, 0, err)) < 0) { rc = -1; break; }
        if (end) {
            /* the last token is not run: it joins the history as pending */
            if (krun_session_append(ch->s, &id, 1, err)) rc = -1;
            break;
        }
        /* speculative decoding (--spec; the drafter's or the text's drafts): the drafts the
         * model agrees with are the reply's next tokens, run; never past --gen or the context */
        room = ch->o.gen > 0 ? (size_t)ch->o.gen - t->n_reply - 1 : SIZE_MAX;
        {
            /* and the closing tokens' reserve stays free */
            size_t hist;
            krun_session_tokens(ch->s, &hist);
            if (hist + 2 + CHAT_CLOSE_RESERVE >= ctx) room = 0;
            else if (room > ctx - hist - 2 - CHAT_CLOSE_RESERVE) room = ctx - hist - 2 - CHAT_CLOSE_RESERVE;
        }
        if (ch->o.spec && room) {
            if (krun_session_feed_spec(ch->s, id, room < (size_t)ch->o.spec ? room : (size_t)ch->o.spec, acc, NULL, &n_acc, err)) {
                rc = -1;
                break;
            }
        } else if (krun_session_feed(ch->s, &id, 1, NULL, err)) {
            rc = -1;
            break;
        }
        for (size_t k = 0; k < n_acc && !end; k++)
            if ((end = reply_token(ch, t, p, acc[k], stop, n_stop, ctx, 1, err)) < 0) rc = -1;
        if (rc || end) break;
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
    if (ch->content.n || ch->reasoning.n || ch->conv.template) show("\n", 1);
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
    size_t hist, ctx = krun_model_ctx(ch->m), before = ch->conv.n, preamble = 0;
    int rc;
    memset(&t, 0, sizeof t);
    if (kconv_add(&ch->conv, KCHAT_USER, text, len, NULL, 0)) { krun_err_set(err, KRUN_ENOMEM, "out of memory"); return -1; }
    if (turn_ids(ch, text, len, &t.fed, &t.n_fed, &preamble)) goto refuse;
    krun_session_tokens(ch->s, &hist);
    if (hist + t.n_fed + 1 + CHAT_CLOSE_RESERVE > ctx) {
        fprintf(stderr, "krun chat: the conversation holds %zu positions and this message needs %zu more, with room for a reply; "
                "the context is %zu: /save it and restart with a larger --ctx, or /reset\n", hist, t.n_fed, ctx);
        goto refuse;
    }
    if (hist == 0 && ch->cache && from_cache(ch, &t, preamble, err)) { free(t.fed); return -1; }
    {
        /* the pending tokens (the last reply's end) run first, then this turn (less what a kept state held) */
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
        if (!ch->o.quiet) krun_announce_prompt(ch->m, t.n_fed - t.cached);
        if (!ch->o.quiet && t.cached)
            fprintf(stderr, "krun chat: %zu of the %zu positions of this turn were kept from an earlier run (--cache-dir)\n", t.cached,
                    t.n_fed);
        krun_prefill_progress_start(&pp, ch->m, ch->s, t.n_fed - t.cached, ch->o.quiet);
        rc = krun_session_feed(ch->s, t.fed + pending + t.cached, t.n_fed - pending - t.cached, NULL, err);
        krun_prefill_progress_end(&pp, ch->s);
        t.t_prefill = know() - pp.t0;
        t.bytes_prefill = bytes_read(ch) - b0;
        if (rc) { free(t.fed); return -1; }
        if (ch->cache && t.cached < t.n_fed) krun_pcache_keep(ch->cache, ch->s);   /* the end of the prompt: kept */
    }
    ch->conv.fed = ch->conv.n;
    ch->turn++;
    /* (a Ctrl-C while the prompt ran gives an empty reply, closed like any other) */
    rc = reply(ch, &t, err);
    atomic_store(&interrupted, 0);
    if (!rc) {
        if (kconv_add(&ch->conv, KCHAT_ASSISTANT, ch->content.p, ch->content.n, ch->reasoning.n ? ch->reasoning.p : NULL, ch->reasoning.n)) {
            krun_err_set(err, KRUN_ENOMEM, "out of memory");
            rc = -1;
        }
        ch->conv.fed = ch->conv.n;
        log_turn(ch, &t);
    }
    free(t.fed);
    kbuf_free(&t.reply);
    return rc;
refuse:
    kconv_truncate(&ch->conv, before);
    free(t.fed);
    return 1;
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
    if (!strncmp(line, "/save ", 6) && arg && *arg) { kconv_save(&ch->conv, ch->s, ch->m, arg); return 1; }
    if (!strncmp(line, "/load ", 6) && arg && *arg) { kconv_load(&ch->conv, ch->s, arg); return 1; }
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
    krun_cli_file_warning("krun chat", ch.m);
    ch.tk = krun_model_tokenizer(ch.m);
    if (!ch.tk) { fprintf(stderr, "krun chat: %s has no tokenizer: krun chat needs one (krun --ids takes token ids)\n", ch.o.model); goto out; }
    ch.conv.template = ktok_find_special(ch.tk, KCHAT_OPEN) >= 0 && ktok_find_special(ch.tk, KCHAT_CLOSE) >= 0 &&
                  ktok_find_special(ch.tk, KCHAT_SEP) >= 0 && ktok_find_special(ch.tk, KCHAT_END_OF_MSG) >= 0;
    krun_cli_model_opts(&ch.o.c, ch.o.model, budget, &mo);
    mo.spec = (size_t)ch.o.spec;
    mo.max_seqs = 1;
    if (krun_model_prepare(ch.m, &mo, &e)) { fprintf(stderr, "krun chat: %s\n", e.msg); rc = e.code; goto out; }
    if (!ch.o.quiet && krun_model_plan(ch.m)) kmemplan_print(krun_model_plan(ch.m), stderr);
    if (krun_cli_pcache(&ch.o.c, ch.m, "krun chat", 0, 0, &ch.cache, &e)) { fprintf(stderr, "krun chat: %s\n", e.msg); rc = e.code; goto out; }
    if (ch.cache ? krun_pcache_begin(ch.cache, NULL, 0, 0, &ch.s, &(size_t){0}, &e) : krun_session_new(ch.m, &ch.s, &e)) {
        fprintf(stderr, "krun chat: %s\n", e.msg);
        rc = e.code;
        goto out;
    }
    krun_cli_sampler(&ch.o.c, &so);
    ch.so = so;
    krun_session_set_sampler(ch.s, &so);
    kchat_options_default(&ch.conv.opts);
    ch.conv.opts.thinking = ch.o.thinking;
    ch.conv.opts.effort = ch.o.thinking ? ch.o.effort : KCHAT_EFFORT_NONE;
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
                ch.conv.template ? (ch.conv.opts.thinking ? "thinking on" : "thinking off") : "plain-text continuation (no chat markers in this tokenizer)",
                krun_model_ctx(ch.m), ch.o.system && !ch.conv.template ? " (--system needs the chat format: ignored)" : "");
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
    kutf8_hold_free(&ch.text_pend);
    kconv_free(&ch.conv);
    if (ch.json) fclose(ch.json);
    if (ch.cache && ch.s) krun_pcache_end(ch.cache, ch.s);   /* where the conversation stopped: kept */
    else krun_session_free(ch.s);
    krun_pcache_close(ch.cache);
    krun_model_close(ch.m);
    return rc;
}
