/* `krun batch`: the options, the model, the progress line and the summary.  The job itself is
 * run/serve/batch_job.c, on the server's engine; docs/BATCH.md describes it. */
#include "cmd_batch.h"

#include "krun_cli.h"
#include "format/kprogress.h"
#include "run/serve/batch.h"
#include "run/session/memplan.h"
#include "run/session/sweep_model.h"
#include "run/util/procmem.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BATCH_CTX_DEFAULT 4096
/* --max-seqs auto with the file used in place (no budget: nothing streams, the sweep's cost is
 * compute): at most this many */
#define BATCH_SEQS_IN_PLACE 16
/* requests handed to the engine at once, per sequence: a sequence that frees up takes a queued
 * request at once */
#define BATCH_WINDOW_PER_SEQ 4
#define BATCH_WINDOW_MIN 16
/* stopped by SIGINT or SIGTERM (128 + SIGINT, as a shell reports it) */
#define BATCH_EXIT_INTERRUPTED 130

static const char usage[] =
    "usage: krun batch MODEL.kpk IN.jsonl OUT.jsonl [options]\n"
    "\n"
    "Run a file of OpenAI Batch requests, one a line:\n"
    "  {\"custom_id\": \"...\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\" | \"/v1/completions\",\n"
    "   \"body\": {... any body krun serve takes ...}}\n"
    "many sequences to a forward sweep (one read of the weights serves them all), and write one\n"
    "line per request to OUT.jsonl in vLLM run-batch's shape, in the order of IN:\n"
    "  {\"id\", \"custom_id\", \"response\": {\"status_code\", \"request_id\", \"body\"}, \"error\": null}\n"
    "A request the API refuses gets its 4xx status and error body; a line that is not a request gets\n"
    "\"response\": null and \"error\": {\"code\": \"invalid_batch_line\", \"message\", \"line\", \"field\"}.\n"
    "Two lines with one custom_id are refused before anything runs.  Each response is bit-identical\n"
    "to krun serve's for the same body (ids and \"created\" aside: see --created).\n"
    "\n"
    "Crash-safe: every finished request is recorded in OUT.jsonl.krun-journal (fsynced); killed at\n"
    "any moment, the same command continues without running them again, and OUT.jsonl appears whole\n"
    "at the end (a rename), byte-identical to an uninterrupted run's.  Budget, threads and --max-seqs\n"
    "may change between runs; the input, the model, --ctx, --model-name, --seed and --created may not.\n"
    "\n"
    "Batch:\n"
    "  --force               replace an existing OUT.jsonl; start over from another job's journal\n"
    "  --seed N              sampled requests without a \"seed\" get one from N and their line\n"
    "                        (default: random, kept in the journal)\n"
    "  --created T           \"created\" of every response, Unix seconds (default: the job's start,\n"
    "                        kept in the journal); give it to compare outputs of separate jobs\n"
    "  --model-name NAME     the model's id in the API (default: the file name without .kpk)\n"
    "  --max-seqs N|auto     sequences per sweep (default auto: the number with the fewest bytes read\n"
    "                        per generated token within the budget, by the union model; at most the\n"
    "                        requests; 16 at most when the file is used in place, without a budget)\n"
    "  --ctx N               positions per sequence: prompt + max_tokens (default 4096)\n"
    "  --state-dir DIR       keep the sequences' states in a file in DIR, RAM holding 3 layers of them\n"
    "                        (default: only when the states of --max-seqs sequences do not fit the\n"
    "                        budget, in OUT.jsonl.krun-states/; docs/BATCH.md, \"States on disk\")\n"
    "  --json                a summary on stdout at the end (requests, tokens, sweeps, bytes, seconds)\n"
    "  --quiet               no progress line and no summary on stderr\n"
    "Speculative decoding (the output is the same bits with and without):\n"
    "  --spec N              a sequence verifies up to N drafts in a sweep: the drafter's, or its own\n"
    "                        text's where it repeats (default 8 with a drafter, else 0; a request's\n"
    "                        \"speculative\" lowers it)\n"
    KRUN_CLI_USAGE_DRAFT
    "Execution:\n"
    KRUN_CLI_USAGE_EXECUTION
    KRUN_CLI_USAGE_MEMORY
    "\n"
    "Progress (on a terminal only): requests done / total, tokens/s, bytes read per generated token,\n"
    "ETA.\n"
    "\n"
    "Exit: 0 OUT.jsonl written (error lines included: see \"failed\" in --json); 1 the model file is\n"
    "damaged, or the states' file (OUT.jsonl not written; the journal keeps what was done: repair the\n"
    "file or the disk, run the same command); 2 cannot run: usage, IN unreadable, duplicate custom_ids, OUT.jsonl exists (--force),\n"
    "another krun batch is writing OUT.jsonl, a journal of another job, I/O error; 3 out of memory;\n"
    "130 stopped by SIGINT or SIGTERM (the journal keeps what was done: the same command continues).\n";

struct batch_opts {
    const char *model, *in, *out, *model_name;
    const char *state_dir;     /* --state-dir: states paged there always; NULL: paged beside OUT when they do not fit */
    char state_default[4096];
    int force, json, quiet, seed_given, created_given, auto_seqs;
    long spec;                 /* --spec; -1: 8 with a drafter, else 0 */
    unsigned long long seed;
    long long created;
    krun_cli c;
};

static void parse_args(int argc, char **argv, struct batch_opts *o)
{
    memset(o, 0, sizeof *o);
    krun_cli_init(&o->c);
    o->auto_seqs = 1;
    o->spec = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
#define OPT(name) krun_cli_value(argc, argv, &i, name, &v)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(usage, stdout); exit(KRUN_OK); }
        else if (OPT("--seed")) { o->seed = (unsigned long long)krun_cli_double(v, 0, 9.2e18, "--seed"); o->seed_given = 1; }
        else if (OPT("--created")) { o->created = (long long)krun_cli_double(v, 0, 1e12, "--created"); o->created_given = 1; }
        else if (OPT("--model-name")) o->model_name = v;
        else if (OPT("--state-dir")) o->state_dir = v;
        else if (OPT("--max-seqs")) {
            o->auto_seqs = !strcmp(v, "auto");
            if (!o->auto_seqs) o->c.max_seqs = krun_cli_long(v, 1, KRUN_MAX_SEQS, "--max-seqs");
        }
        else if (OPT("--spec")) o->spec = krun_cli_long(v, 0, 64, "--spec (0..64)");
        else if (!strcmp(a, "--force")) o->force = 1;
        else if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--quiet")) o->quiet = 1;
        else if (krun_cli_option(&o->c, argc, argv, &i)) continue;
        else if (a[0] == '-') krun_cli_die("unknown option %s (see krun batch --help)", a);
        else if (!o->model) o->model = a;
        else if (!o->in) o->in = a;
        else if (!o->out) o->out = a;
        else krun_cli_die("unexpected argument %s", a);
#undef OPT
    }
    if (!o->out) { fputs(usage, stderr); exit(KRUN_EINPUT); }
    krun_cli_check(&o->c, NULL);
    if (o->c.temp != 0 || o->c.top_k || o->c.top_p != 1 || o->c.min_p != 0 || o->c.repetition_penalty != 1 ||
        o->c.presence_penalty != 0 || o->c.frequency_penalty != 0)
        krun_cli_die("%s", "krun batch takes sampling from each request's body (temperature, top_p, top_k, min_p, seed)");
    if (!o->c.ctx) o->c.ctx = BATCH_CTX_DEFAULT;
    if (o->spec < 0) {
        char buf[4096];
        o->spec = krun_cli_draft_file(&o->c, o->model, buf, sizeof buf) ? KRUN_DRAFT_SPEC : 0;
    }
    if (!strcmp(o->in, o->out)) krun_cli_die("%s: IN and OUT are the same file", o->in);
    if ((size_t)snprintf(o->state_default, sizeof o->state_default, "%s.krun-states", o->out) >= sizeof o->state_default)
        krun_cli_die("%s: the path is too long", o->out);
}

typedef struct { int draw; } view;

static volatile sig_atomic_t interrupted;
static volatile int stop_job;
static void on_signal(int sig)
{
    interrupted = sig;
    stop_job = 1;
}

/* The progress line's detail: tokens/s, bytes per generated token, ETA. */
static void on_progress(void *ctx, const kbatch_stats *st)
{
    view *v = ctx;
    char bpt[32] = "-", eta[32] = "-";
    if (!v->draw) return;
    if (st->generated) kfmt_bytes(st->bytes_read / st->generated, bpt, sizeof bpt);
    /* from the requests run so far (a resumed job's recorded ones and bad lines take no time) */
    if (st->ran && st->seconds > 0) kfmt_duration(st->seconds / (double)st->ran * (double)(st->total - st->done), eta, sizeof eta);
    fprintf(stderr, "\r\033[Kkrun batch: %zu/%zu requests, %llu tokens, %.1f tokens/s, %s/token, ETA %s", st->done, st->total,
            (unsigned long long)st->generated, st->seconds > 0 ? (double)st->generated / st->seconds : 0.0, bpt, eta);
    fflush(stderr);
}

/* The plan for mo->max_seqs sequences: their states resident when they fit (or paged when forced:
 * --state-dir), else paged to disk.  Sets mo->state_dir.  0, or -1: no plan holds them. */
static int plan_seqs(krun_model *m, krun_model_opts *mo, const struct batch_opts *o, kmemplan *p, krun_err *e)
{
    mo->state_dir = o->state_dir;                 /* forced, or resident first */
    if (krun_model_make_plan(m, mo, p, e) == 0) return 0;
    if (o->state_dir) return -1;
    mo->state_dir = o->state_default;             /* they do not fit: paged */
    return krun_model_make_plan(m, mo, p, e);
}

/* --max-seqs auto: the number of sequences whose sweep reads the fewest bytes per generated token
 * (sweep_model.h; paged states' reads and writes counted) among the plans the budget holds, at
 * most `runnable`.  Says what it chose. */
static void choose_seqs(krun_model *m, krun_model_opts *mo, const struct batch_opts *o, size_t runnable, int quiet)
{
    const k3_config *c = krun_model_config(m);
    size_t best = 1, top = runnable < KRUN_MAX_SEQS ? runnable : KRUN_MAX_SEQS;
    double best_cost = 0, one = 0, best_sweep = 0;
    const char *best_dir = NULL;
    if (!top) top = 1;
    if (!mo->budget) {
        mo->state_dir = o->state_dir;
        mo->max_seqs = top < BATCH_SEQS_IN_PLACE ? top : BATCH_SEQS_IN_PLACE;
        if (!quiet)
            fprintf(stderr, "krun batch: %zu sequences per sweep (--max-seqs auto; no budget: the file is used in place if it fits)\n",
                    mo->max_seqs);
        return;
    }
    for (size_t B = 1; B <= top; B++) {
        kmemplan p;
        krun_err e;
        double sweep, cost, tokens;
        size_t w;
        mo->max_seqs = B;
        if (plan_seqs(m, mo, o, &p, &e)) break;                  /* B sequences' state no longer fits, even paged */
        /* with a drafter, each sequence's rows and tokens at the width the union model prefers */
        cost = ksweep_draft(&p, c, B, mo->spec, mo->draft_width, (double)(p.page_read_bytes + p.page_write_bytes), &w, &tokens, &sweep);
        if (B == 1) one = cost;
        if (B == 1 || cost <= best_cost) { best = B; best_cost = cost; best_sweep = sweep; best_dir = mo->state_dir; }
    }
    mo->max_seqs = best;
    mo->state_dir = best_dir;
    if (!quiet) {
        char a[32], b[32], d[32];
        kfmt_bytes((uint64_t)best_sweep, a, sizeof a);
        kfmt_bytes((uint64_t)best_cost, b, sizeof b);
        kfmt_bytes((uint64_t)one, d, sizeof d);
        fprintf(stderr, "krun batch: %zu sequences per sweep (--max-seqs auto, the fewest bytes per generated token within the "
                "budget): a decoding sweep reads ~%s, %s per generated token (one at a time: %s; union model%s, docs/BATCH.md)\n",
                best, a, b, d, best_dir ? ", with the states' paging at full context" : "");
    }
}

/* Does a request of the input ask for echo with logprobs (a completion scoring its prompt)?  Then
 * the plan counts the engine's buffer for its prompt's logits (serve.h, srv_echo_bytes); the
 * other jobs keep that memory for sequences.  A body that does not parse asks for nothing. */
static int wants_echo_logits(const kbatch_input *in)
{
    for (size_t k = 0; k < in->n; k++) {
        const kbatch_item *it = &in->items[k];
        json_t *o, *lp;
        int yes;
        if (it->bad || it->chat) continue;
        o = json_loadb(it->body, it->body_len, 0, NULL);
        lp = json_object_get(o, "logprobs");
        yes = json_is_true(json_object_get(o, "echo")) && lp && !json_is_false(lp) && !json_is_null(lp);
        json_decref(o);
        if (yes) return 1;
    }
    return 0;
}

static void summary_json(const struct batch_opts *o, const kbatch_stats *st, const krun_model *m, int ok)
{
    uint64_t sr, sw;
    double swait;
    json_t *j;
    krun_model_state_io(m, &sr, &sw, &swait);
    j = json_pack("{s:s, s:s, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:I, s:I, s:f, s:I}", "in", o->in, "out", o->out, "ok", ok,
                          "requests", (json_int_t)st->total, "done", (json_int_t)st->done, "resumed", (json_int_t)st->resumed,
                          "failed", (json_int_t)st->failed, "prompt_tokens", (json_int_t)st->prompt_tokens, "generated_tokens",
                          (json_int_t)st->generated, "sweeps", (json_int_t)st->sweeps, "bytes_read", (json_int_t)st->bytes_read,
                          "seconds", st->seconds, "tokens_per_second", st->seconds > 0 ? (double)st->generated / st->seconds : 0.0,
                          "bytes_per_generated_token_all", st->generated ? (double)st->bytes_read / (double)st->generated : 0.0,
                          "state_bytes_read", (json_int_t)sr, "state_bytes_written", (json_int_t)sw,
                          "state_wait_seconds", swait,
                          "peak_rss_bytes", (json_int_t)kmem_peak_rss());
    /* speculation: drafts verified and kept, and the EAGLE drafter's part (null without one) */
    if (j)
        json_object_set_new(j, "spec", json_pack("{s:I, s:I, s:o}", "drafted", (json_int_t)st->drafted, "accepted", (json_int_t)st->accepted,
                                                 "drafter", krun_model_draft(m) ? json_pack("{s:s, s:I, s:I}", "file", krun_model_draft(m),
                                                                                            "drafted", (json_int_t)st->drafter_drafted,
                                                                                            "accepted", (json_int_t)st->drafter_accepted)
                                                                                : json_null()));
    if (j)
        json_object_set_new(j, "tokens_per_sweep", st->decode_sweeps ? json_real((double)st->decode_generated / (double)st->decode_sweeps)
                                                                      : json_null());
    /* what a generated token costs: the decoding-only sweeps (the prompts' sweeps and the model's first
     * reads apart); null when none ran */
    if (j && !json_object_set_new(j, "decode", json_pack("{s:I, s:I, s:I, s:f}", "sweeps", (json_int_t)st->decode_sweeps, "bytes_read",
                                                         (json_int_t)st->decode_bytes_read, "generated_tokens",
                                                         (json_int_t)st->decode_generated, "seconds", st->decode_seconds)))
        json_object_set_new(j, "bytes_per_generated_token", st->decode_generated ? json_real((double)st->decode_bytes_read /
                                                                                             (double)st->decode_generated) : json_null());
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (s) printf("%s\n", s);
    free(s);
    json_decref(j);
}

int krun_batch_main(int argc, char **argv)
{
    struct batch_opts o;
    krun_model *m = NULL;
    krun_model_opts mo;
    krun_err e = {0, {0}};
    kbatch_input in;
    kbatch_opts bo;
    kbatch_stats st;
    uint64_t budget;
    struct stat sb;
    char name[256];
    view v = {0};
    struct sigaction sa;
    int rc;

    parse_args(argc, argv, &o);
    if (krun_cli_budget(&o.c, &budget)) return KRUN_EINPUT;
    if (o.model_name) snprintf(name, sizeof name, "%s", o.model_name);
    else krun_cli_model_name(o.model, name, sizeof name);
    signal(SIGPIPE, SIG_IGN);
    /* SIGINT, SIGTERM: stop after the requests' current sweep; what is recorded stays */
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    memset(&st, 0, sizeof st);

    if (kbatch_read(o.in, &in, &e)) { fprintf(stderr, "krun batch: %s\n", e.msg); return e.code; }
    if (stat(o.model, &sb)) { fprintf(stderr, "krun batch: %s: %s\n", o.model, strerror(errno)); kbatch_input_free(&in); return KRUN_EINPUT; }
    if (krun_model_load(o.model, &m, &e)) { fprintf(stderr, "krun batch: %s\n", e.msg); kbatch_input_free(&in); return e.code; }
    krun_cli_file_warning("krun batch", m);
    rc = KRUN_EINPUT;
    if (!krun_model_tokenizer(m)) {
        fprintf(stderr, "krun batch: %s has no tokenizer: a batch needs one to read requests and write text\n", o.model);
        goto out;
    }
    krun_cli_model_opts(&o.c, o.model, budget, &mo);
    mo.spec = (size_t)o.spec;
    if (wants_echo_logits(&in)) mo.extra_bytes += srv_echo_bytes(krun_model_config(m));   /* echo's prompt logits (serve.h) */
    if (o.auto_seqs) {
        size_t runnable = 0;
        for (size_t k = 0; k < in.n; k++) runnable += !in.items[k].bad;
        choose_seqs(m, &mo, &o, runnable, o.quiet);
    } else if (mo.budget) {
        kmemplan p;
        if (plan_seqs(m, &mo, &o, &p, &e)) { fprintf(stderr, "krun batch: %s\n", e.msg); rc = e.code; goto out; }
    } else {
        mo.state_dir = o.state_dir;
    }

    if (krun_model_prepare(m, &mo, &e)) { fprintf(stderr, "krun batch: %s\n", e.msg); rc = e.code; goto out; }
    if (!o.quiet && krun_model_plan(m)) kmemplan_print(krun_model_plan(m), stderr);
    if (!o.quiet && krun_model_state_file(m))
        fprintf(stderr, "krun batch: the states of %zu sequences are paged to %s (RAM holds the layers in flight; the file is removed at the end)\n",
                krun_model_max_seqs(m), krun_model_state_file(m));

    memset(&bo, 0, sizeof bo);
    bo.out = o.out;
    bo.model_name = name;
    bo.seed = o.seed_given ? o.seed : kbatch_request_seed((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32), (size_t)clock());
    bo.seed_given = o.seed_given;
    bo.created = o.created_given ? o.created : (long long)time(NULL);
    bo.created_given = o.created_given;
    bo.force = o.force;
    bo.window = krun_model_max_seqs(m) * BATCH_WINDOW_PER_SEQ;
    if (bo.window < BATCH_WINDOW_MIN) bo.window = BATCH_WINDOW_MIN;
    v.draw = !o.quiet && isatty(2);
    bo.stop = &stop_job;
    bo.progress = on_progress;
    bo.progress_ctx = &v;

    rc = kbatch_run(m, &in, &bo, &st, &e);
    if (rc == -2) {
        rc = BATCH_EXIT_INTERRUPTED;
        snprintf(e.msg, sizeof e.msg, "%s: interrupted", interrupted == SIGTERM ? "SIGTERM" : "SIGINT");
    } else if (rc) {
        rc = e.code;
    }
    if (v.draw) fputs("\r\033[K", stderr);
    if (rc) fprintf(stderr, "krun batch: %s\n", e.msg);
    if (!o.quiet) {
        char b[32] = "-";
        if (st.generated) kfmt_bytes(st.bytes_read / st.generated, b, sizeof b);
        fprintf(stderr, "krun batch: %s: %zu of %zu requests written (%zu from the journal, %zu error lines); this run: %llu prompt + "
                "%llu generated tokens in %llu sweeps, %.1f s, %s read per generated token%s\n", rc ? "stopped" : o.out, st.done, st.total,
                st.resumed, st.failed, (unsigned long long)st.prompt_tokens, (unsigned long long)st.generated,
                (unsigned long long)st.sweeps, st.seconds, b, rc ? "; the same command continues" : "");
    }
    if (o.json) summary_json(&o, &st, m, rc == 0);
out:
    krun_model_close(m);
    kbatch_input_free(&in);
    return rc;
}
