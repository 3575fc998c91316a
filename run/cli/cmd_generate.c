/* `krun MODEL.kpk`: the one-shot command (cmd_generate.h).  The prompt runs in
 * blocks of --chunk positions (prefill), then one token per decoding step
 * (decode), the text streaming to stdout; the statistics of every step go to
 * stderr and --json (report, generate_report.c).  The work is done through
 * the session API (session.h). */
#include "cmd_generate.h"

#include "generate.h"
#include "krun_cli.h"
#include "format/kio.h"
#include "format/release.h"
#include "format/kprogress.h"
#include "run/session/spec.h"
#include "run/session/statefile.h"
#include "run/text/utf8_hold.h"
#include "run/util/ablate.h"
#include "run/util/procmem.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Without --ctx, a prompt may be this many positions at most, so that a huge
 * prompt is refused instead of running for hours. */
#define KRUN_CTX_DEFAULT_MAX ((size_t)1 << 18)
/* A prompt file larger than this many bytes per position of the context is
 * refused before tokenizing: no tokenizer gets near 64 bytes per token. */
#define PROMPT_BYTES_PER_TOKEN 64

static const char usage[] =
    "usage: krun MODEL.kpk (--prompt TEXT | --prompt-file PATH | --ids 1,2,3) [options]\n"
    "       krun tokenize MODEL.kpk ...   text <-> token ids, chat rendering (krun tokenize --help)\n"
    "       krun chat MODEL.kpk ...       talk to the model in a terminal (krun chat --help)\n"
    "       krun serve MODEL.kpk ...      an OpenAI-compatible HTTP server (krun serve --help)\n"
    "       krun batch MODEL.kpk IN OUT   a file of OpenAI Batch requests (krun batch --help)\n"
    "       krun --version                the release, the KPK and state file versions it reads and writes\n"
    "\n"
    "Runs the exact Kimi K3 forward pass from a KPK file (made by kpack convert):\n"
    "the prompt is processed once, then one token per step with carried state;\n"
    "the generated text streams to stdout.\n"
    "\n"
    "Input:\n"
    "  --prompt TEXT         prompt text (special-token strings are honoured)\n"
    "  --prompt-file PATH    prompt read from a file (use this for non-ASCII text)\n"
    "  --ids LIST            prompt as comma-separated token ids\n"
    "Generation:\n"
    "  --gen N               tokens to generate (default 32); stops early at EOS /\n"
    "                        <|end_of_msg|> unless --ignore-eos\n"
    KRUN_CLI_USAGE_SAMPLING
    "  --spec N              speculative decoding: draft up to N tokens (1..64) from the text so far\n"
    "                        (where it repeats) and verify them in one forward block; the output is\n"
    "                        bit-identical to --spec 0 at every sampling setting and seed (default 0;\n"
    "                        8 with a drafter)\n"
    KRUN_CLI_USAGE_DRAFT
    "Prefix cache (off unless --cache-dir; shared with krun chat and krun serve; kept: the\n"
    "state at the end of the prompt and at the end of the run):\n"
    KRUN_CLI_USAGE_CACHE("")
    "Conversations:\n"
    "  --save-state FILE     after the run, save the conversation (KDA/ShortConv/MLA state,\n"
    "                        tokens, last logits; docs/STATE.md) to FILE\n"
    "  --load-state FILE     continue a saved conversation: the prompt follows it (and may\n"
    "                        be left out); the earlier turns are not run again.  Without\n"
    "                        --seed, sampling goes on with the saved seed, as one run would\n"
    "Execution:\n"
    KRUN_CLI_USAGE_EXECUTION
    "  --ctx N               positions to reserve (default: saved state + prompt + --gen; a\n"
    "                        prompt beyond 262144 positions needs an explicit --ctx)\n"
    KRUN_CLI_USAGE_MEMORY
    "  --plan                print the memory plan (and the minimum budget) and exit\n"
    "  --prompt-tokens P[,P2,...]  with --plan: what a prompt of P tokens will cost: the block\n"
    "                        chosen, the blocks, the bytes read (trunk, lm_head, experts, resuming\n"
    "                        decoding); the plan is made for the largest (--ctx defaults to it + --gen)\n"
    "  --disk-mbps X         with --prompt-tokens: the time those bytes take at X MB/s\n"
    "  --max-seqs N          sessions whose state the plan budgets (default 1; for --plan)\n"
    "  --state-dir DIR       with --plan: their states paged to disk, as krun batch --state-dir\n"
    "                        does (the window in RAM, the state bytes a sweep reads and writes)\n"
    "  --ranks N             with --plan: the cluster plan of N machines like this one (its budget,\n"
    "                        its disks each); under mpirun --plan gives the real cluster's\n"
    "  --net-mbps X          with --plan on a cluster: the network's Mbit/s (and --disk-mbps each\n"
    "                        drive's MB/s): seconds per token and tokens/hour\n"
    "  --recompute           recompute the whole sequence every step (testing; same result)\n"
    "Output:\n"
    "  --json FILE           prompt_ids, generated_ids, seconds_per_token, bytes_read, peak_rss_bytes, ...\n"
    "  --dump-logits FILE    float32 little-endian logits of the last prompt position\n"
    "  --dump-all-logits FILE  the same for every position run before generating, [positions][vocab]\n"
    "                        (with --load-state: a saved pending token, then the prompt)\n"
    "  --dump-gen-logits FILE  float32 logits each generated token was chosen from, [generated][vocab]\n"
    "  --print-ids           print generated ids instead of text\n"
    "  --quiet               no statistics on stderr\n"
    "\n"
    "Exit: 0 success; 1 the model file is damaged (the bad extent is named; no token\n"
    "computed from it is printed) or the logits are not finite; 2 cannot run: usage\n"
    "error, bad prompt (empty, token id out of range, longer than the context), not a\n"
    "KPK file, an I/O error, a state file that is damaged or from another model, an\n"
    "output file (--json, --trace, --dump-logits, --save-state) that cannot be written;\n"
    "3 out of memory.\n";

struct opts {
    const char *model, *prompt, *prompt_file, *ids, *json, *dump_logits, *dump_all, *dump_gen;
    const char *save_state, *load_state;
    long gen, spec;
    size_t prompt_tokens[16]; /* --plan --prompt-tokens P[,P2,...] */
    size_t n_prompt_tokens;
    double disk_mbps, net_mbps;
    long ranks;               /* --plan --ranks N */
    int plan_only;
    const char *state_dir;    /* --plan --state-dir */
    int recompute, print_ids, quiet, ignore_eos;
    krun_cli c;               /* memory, execution and sampling: shared with krun chat and krun serve */
};

/* The release, the KPK versions read, and the state file's (--save-state, --load-state and the
 * prefix cache's files). */
static void print_version(void)
{
    kpk_release_print(stdout, "krun", 0);
    printf("state files: writes %d.%d; reads %d.0 to %d.%d, and a later %d.x (its additions ignored)\n", KRUN_STATE_MAJOR,
           KRUN_STATE_MINOR, KRUN_STATE_MAJOR, KRUN_STATE_MAJOR, KRUN_STATE_MINOR, KRUN_STATE_MAJOR);
}

static void parse_args(int argc, char **argv, struct opts *o)
{
    memset(o, 0, sizeof *o);
    krun_cli_init(&o->c);
    o->gen = 32;
    o->spec = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
#define OPT(name) krun_cli_value(argc, argv, &i, name, &v)
        if (krun_cli_option(&o->c, argc, argv, &i)) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(usage, stdout); exit(KRUN_OK); }
        else if (!strcmp(a, "--version")) { print_version(); exit(KRUN_OK); }
#ifdef KRUN_ABLATIONS
        else if (!strcmp(a, "--list-ablations")) {
            for (int k = 1; k < ABL_COUNT; k++) printf("%s\n", krun_ablation_name(k));
            exit(KRUN_OK);
        }
#endif
        else if (OPT("--prompt")) o->prompt = v;
        else if (OPT("--prompt-file")) o->prompt_file = v;
        else if (OPT("--ids")) o->ids = v;
        else if (OPT("--gen")) o->gen = krun_cli_long(v, 0, 1L << 30, "--gen");
        else if (!strcmp(a, "--recompute")) o->recompute = 1;
        else if (!strcmp(a, "--plan")) o->plan_only = 1;
        else if (OPT("--state-dir")) o->state_dir = v;
        else if (OPT("--prompt-tokens")) {
            char buf[256], *save = NULL;
            snprintf(buf, sizeof buf, "%s", v);
            o->n_prompt_tokens = 0;
            for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (o->n_prompt_tokens == 16) krun_cli_die("%s", "--prompt-tokens: at most 16 sizes");
                o->prompt_tokens[o->n_prompt_tokens++] = (size_t)krun_cli_long(t, 1, 1L << 30, "--prompt-tokens");
            }
            if (!o->n_prompt_tokens) krun_cli_die("%s", "--prompt-tokens: expected a token count, or several separated by commas");
        }
        else if (OPT("--disk-mbps")) o->disk_mbps = krun_cli_double(v, 0.001, 1e9, "--disk-mbps");
        else if (OPT("--net-mbps")) o->net_mbps = krun_cli_double(v, 0.001, 1e9, "--net-mbps");
        else if (OPT("--ranks")) o->ranks = krun_cli_long(v, 1, KRUN_MAX_RANKS, "--ranks (1..64)");
        else if (OPT("--json")) o->json = v;
        else if (OPT("--dump-logits")) o->dump_logits = v;
        else if (OPT("--dump-all-logits")) o->dump_all = v;
        else if (OPT("--save-state")) o->save_state = v;
        else if (OPT("--load-state")) o->load_state = v;
        else if (OPT("--dump-gen-logits")) o->dump_gen = v;
        else if (OPT("--spec")) o->spec = krun_cli_long(v, 0, KSPEC_MAX_DRAFT, "--spec (0..64)");
        else if (!strcmp(a, "--print-ids")) o->print_ids = 1;
        else if (!strcmp(a, "--ignore-eos")) o->ignore_eos = 1;
        else if (!strcmp(a, "--quiet")) o->quiet = 1;
        else if (a[0] == '-') krun_cli_die("unknown option %s (see --help)", a);
        else if (!o->model) o->model = a;
        else krun_cli_die("unexpected argument %s", a);
#undef OPT
    }
    if (!o->model) { fputs(usage, stderr); exit(KRUN_EINPUT); }
    krun_cli_check(&o->c, o->plan_only ? "--plan" : NULL);
    if (o->recompute && o->spec < 0) o->c.draft = "off";
    if (o->spec < 0) {
        /* speculative decoding on when a drafter is at hand (it drafts nothing without it) */
        char buf[4096];
        o->spec = krun_cli_draft_file(&o->c, o->model, buf, sizeof buf) ? KRUN_DRAFT_SPEC : 0;
    }
    if ((o->n_prompt_tokens || o->disk_mbps > 0) && !o->plan_only) krun_cli_die("%s", "--prompt-tokens and --disk-mbps go with --plan");
    if (o->state_dir && !o->plan_only) krun_cli_die("%s", "--state-dir goes with --plan here (states on disk are krun batch's)");
    if ((o->ranks || o->net_mbps > 0) && !o->plan_only) krun_cli_die("%s", "--ranks and --net-mbps go with --plan");
    if (o->disk_mbps > 0 && !o->n_prompt_tokens && !o->ranks && krun_cluster_size() == 1)
        krun_cli_die("%s", "--disk-mbps needs --prompt-tokens P (the prompt whose reads it times), or a cluster's plan (--ranks N)");
    if (!o->plan_only && !!o->prompt + !!o->prompt_file + !!o->ids > 1)
        krun_cli_die("%s", "give only one of --prompt, --prompt-file, --ids");
    if (!o->plan_only && !o->load_state && !!o->prompt + !!o->prompt_file + !!o->ids != 1)
        krun_cli_die("%s", "give exactly one of --prompt, --prompt-file, --ids (or --load-state to continue a conversation)");
    if (o->spec && o->recompute) krun_cli_die("%s", "--spec and --recompute exclude each other (--recompute reruns every position)");
    if (o->c.cache_dir && (o->load_state || o->dump_all || o->recompute))
        krun_cli_die("%s", "--cache-dir starts the prompt from a kept state: it cannot be combined with --load-state (which "
                     "gives one), --dump-all-logits (the kept positions are not run) or --recompute");
}

static int parse_ids(const char *s, int32_t **out, size_t *n)
{
    size_t cap = 16;
    int32_t *v = malloc(cap * sizeof *v);
    *n = 0;
    if (!v) return -1;
    while (*s) {
        char *end;
        long x;
        errno = 0;
        x = strtol(s, &end, 10);
        if (errno || end == s || x < 0 || x > 0x7fffffff) { free(v); return -1; }
        if (*n == cap) {
            int32_t *p = realloc(v, (cap *= 2) * sizeof *v);
            if (!p) { free(v); return -1; }
            v = p;
        }
        v[(*n)++] = (int32_t)x;
        s = end;
        if (*s == ',') s++;
        else if (*s) { free(v); return -1; }
    }
    *out = v;
    return 0;
}

static int write_floats(const char *path, const float *x, size_t n)
{
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(x, sizeof *x, n, f) == n;
    if (f && fclose(f)) ok = 0;
    return ok ? 0 : -1;
}

/* The prompt as token ids.  A prompt file too large for the context is
 * refused before it is read, and a text before it is tokenized. */
static int read_prompt(const struct opts *o, krun_model *m, size_t max_tokens, int32_t **ids, size_t *n)
{
    const size_t max_bytes = max_tokens * PROMPT_BYTES_PER_TOKEN;
    ktok *tk = krun_model_tokenizer(m);
    char *text = NULL;
    size_t len = 0;
    *ids = NULL;
    *n = 0;
    if (o->ids) {
        if (parse_ids(o->ids, ids, n)) { fprintf(stderr, "krun: --ids: expected comma-separated token ids\n"); return -1; }
        return 0;
    }
    if (!o->prompt && !o->prompt_file) return 0;
    if (o->prompt_file) {
        struct stat sb;
        if (stat(o->prompt_file, &sb) == 0 && (uint64_t)sb.st_size > max_bytes) {
            fprintf(stderr, "krun: %s: %lld bytes is more than a context of %zu positions can take (at most %zu bytes are "
                    "read, %d per position); give a larger --ctx or a shorter prompt\n", o->prompt_file, (long long)sb.st_size,
                    max_tokens, max_bytes, PROMPT_BYTES_PER_TOKEN);
            return -1;
        }
        if (kio_read_file(o->prompt_file, max_bytes, &text, &len)) {
            fprintf(stderr, "krun: %s: %s\n", o->prompt_file, strerror(errno));
            return -1;
        }
    } else {
        len = strlen(o->prompt);
        if (len > max_bytes) {
            fprintf(stderr, "krun: --prompt: %zu bytes is more than a context of %zu positions can take; give a larger --ctx\n",
                    len, max_tokens);
            return -1;
        }
        text = strdup(o->prompt);
    }
    if (!tk) { free(text); fprintf(stderr, "krun: %s has no tokenizer; give the prompt with --ids\n", o->model); return -1; }
    if (!text || ktok_encode(tk, text, len, 1, ids, n)) { free(text); fprintf(stderr, "krun: cannot tokenize the prompt\n"); return -1; }
    free(text);
    return 0;
}

/* Several machines (under mpirun, or --ranks N like this one): who computes what, and a sweep's cost. */
static int cluster_plan(const struct opts *o, krun_model *m, const krun_model_opts *mo)
{
    krun_cluster_plan *p = malloc(sizeof *p);
    krun_err e;
    if (!p) { fprintf(stderr, "krun: out of memory\n"); return KRUN_ENOMEM; }
    if (krun_model_cluster_plan(m, mo, (int)o->ranks, o->disk_mbps, o->net_mbps, p, &e)) {
        fprintf(stderr, "krun: %s\n", e.msg);
        free(p);
        return e.code;
    }
    if (o->json) {
        json_t *j = krun_cluster_plan_json(p);
        int bad = json_dump_file(j, o->json, JSON_INDENT(1)) != 0;
        json_decref(j);
        if (bad) { fprintf(stderr, "krun: cannot write %s\n", o->json); free(p); return KRUN_EINPUT; }
    }
    krun_cluster_plan_print(p, stdout);
    free(p);
    return KRUN_OK;
}

static int plan_only(const struct opts *o, krun_model *m, uint64_t budget)
{
    krun_model_opts mo;
    kmemplan plan;
    krun_err e;
    size_t most = 0;
    for (size_t k = 0; k < o->n_prompt_tokens; k++) most = o->prompt_tokens[k] > most ? o->prompt_tokens[k] : most;
    krun_cli_model_opts(&o->c, o->model, budget, &mo);
    mo.spec = (size_t)o->spec;
    /* the plan alone: no prompt needed; for --prompt-tokens, what krun would reserve for the largest */
    mo.ctx = o->c.ctx ? (size_t)o->c.ctx : most ? most + (size_t)o->gen : 4096;
    mo.prompt_tokens = most;
    mo.state_dir = o->state_dir;       /* planned only: nothing is made there */
    if (most > mo.ctx) {
        fprintf(stderr, "krun: --prompt-tokens %zu does not fit --ctx %zu\n", most, mo.ctx);
        return KRUN_EINPUT;
    }
    if (o->ranks || krun_cluster_size() > 1) return cluster_plan(o, m, &mo);
    if (krun_model_make_plan(m, &mo, &plan, &e)) { fprintf(stderr, "krun: %s\n", e.msg); return e.code; }
    if (o->json) {
        json_t *j = kmemplan_json(&plan);
        int bad;
        if (o->n_prompt_tokens) {
            json_t *a = json_array();
            for (size_t k = 0; k < o->n_prompt_tokens; k++) json_array_append_new(a, kmemplan_prompt_json(&plan, o->prompt_tokens[k], o->disk_mbps));
            json_object_set_new(j, "prompts", a);
        }
        bad = json_dump_file(j, o->json, JSON_INDENT(1)) != 0;
        json_decref(j);
        if (bad) { fprintf(stderr, "krun: cannot write %s\n", o->json); return KRUN_EINPUT; }
    }
    kmemplan_print(&plan, stdout);
    for (size_t k = 0; k < o->n_prompt_tokens; k++) kmemplan_prompt_print(&plan, o->prompt_tokens[k], o->disk_mbps, stdout);
    return KRUN_OK;
}

/* One run: what the command holds from the options to the report. */
typedef struct gen {
    struct opts o;
    krun_model *m;
    krun_session *s;
    krun_pcache *cache;        /* --cache-dir, or NULL */
    size_t cached;             /* prompt positions a kept state held */
    ktok *tk;                  /* NULL: the file has none (ids in, ids out) */
    size_t V;
    int32_t *prompt;           /* [n_prompt] */
    size_t n_prompt;
    size_t state_tokens, pending; /* --load-state: the saved history, and its tokens not run yet */
    int32_t stop_ids[3];
    size_t n_stop;
    int32_t *gen_ids;          /* [gen + 1] */
    size_t n_gen;
    int32_t *hist;             /* --recompute: [ctx + 1] */
    int32_t *accepted;         /* --spec: [spec + 1] */
    float *all;                /* --dump-all-logits: [pending + n_prompt][V] */
    float *gen_logits;         /* --dump-gen-logits: [gen + 1][V] */
    gen_step *steps;           /* [gen + 1] */
    size_t n_steps;
    uint64_t *step_members;    /* [gen + 1][KRUN_MAX_MEMBERS] */
    double t_prefill;
    kutf8_hold tout;           /* the text on stdout: a character cut between tokens held back */
} gen;

/* The prompt, bounded by the context, and the context (--ctx, or what the
 * saved state, the prompt and --gen need). */
static int size_context(gen *g)
{
    struct opts *o = &g->o;
    krun_err e;
    size_t max_prompt;
    /* a saved conversation first: its length counts toward the context */
    if (o->load_state) {
        uint64_t pos, nt;
        if (krun_state_peek(o->load_state, &pos, &nt, &e)) { fprintf(stderr, "krun: %s\n", e.msg); return e.code; }
        g->state_tokens = (size_t)nt;
        g->pending = (size_t)(nt - pos);
    }
    /* the prompt, bounded by the context before it is read or tokenized */
    max_prompt = o->c.ctx ? ((size_t)o->c.ctx > g->state_tokens ? (size_t)o->c.ctx - g->state_tokens : 0) : KRUN_CTX_DEFAULT_MAX;
    if (read_prompt(o, g->m, max_prompt, &g->prompt, &g->n_prompt)) return KRUN_EINPUT;
    if (g->n_prompt == 0 && !o->load_state) { fprintf(stderr, "krun: the prompt is empty\n"); return KRUN_EINPUT; }
    for (size_t i = 0; i < g->n_prompt; i++)
        if (g->prompt[i] < 0 || (size_t)g->prompt[i] >= g->V) {
            fprintf(stderr, "krun: token id %d at prompt position %zu is outside the vocabulary (0..%zu)\n", g->prompt[i], i,
                    g->V - 1);
            return KRUN_EINPUT;
        }
    if (!o->c.ctx && g->n_prompt > KRUN_CTX_DEFAULT_MAX) {
        fprintf(stderr, "krun: the prompt is %zu tokens, more than %zu without --ctx; give --ctx %zu or more to run it\n",
                g->n_prompt, KRUN_CTX_DEFAULT_MAX, g->n_prompt + g->state_tokens + (size_t)o->gen);
        return KRUN_EINPUT;
    }
    /* the last generated token is never fed back, so history + prompt + gen - 1 positions are used */
    if (!o->c.ctx) o->c.ctx = (long)(g->state_tokens + g->n_prompt + (size_t)o->gen);
    if ((size_t)o->c.ctx < g->state_tokens + g->n_prompt + (o->gen > 0 ? (size_t)o->gen - 1 : 0)) {
        fprintf(stderr, "krun: the prompt (%zu tokens%s) and --gen %ld do not fit the context of %ld positions\n", g->n_prompt,
                g->state_tokens ? " after the saved conversation's" : "", o->gen, o->c.ctx);
        return KRUN_EINPUT;
    }
    if (o->c.ctx < 1) o->c.ctx = 1;
    return KRUN_OK;
}

/* The model prepared for this run, its session (with a loaded state), and
 * the run's own buffers. */
static int prepare(gen *g, uint64_t budget)
{
    struct opts *o = &g->o;
    const size_t gen_n = (size_t)o->gen + 1, V = g->V;
    krun_model_opts mo;
    ksampler_opts so;
    krun_err e;
    krun_cli_model_opts(&o->c, o->model, budget, &mo);
    mo.spec = (size_t)o->spec;
    mo.prompt_tokens = g->pending + g->n_prompt;   /* the planner's reference prompt (--chunk auto) */
    if (o->dump_all) mo.extra_bytes += (uint64_t)(g->pending + g->n_prompt) * V * sizeof(float);
    if (o->dump_gen) mo.extra_bytes += (uint64_t)o->gen * V * sizeof(float);
    if (krun_model_prepare(g->m, &mo, &e)) { fprintf(stderr, "krun: %s\n", e.msg); return e.code; }
    if (!o->quiet && krun_model_auto_budget(g->m))
        fprintf(stderr, "krun: the model file is larger than 80%% of available memory: using --mem %llu\n",
                (unsigned long long)krun_model_auto_budget(g->m));
    if (!o->quiet && krun_model_plan(g->m)) kmemplan_print(krun_model_plan(g->m), stderr);
    if (!o->quiet && krun_model_notice(g->m)) fprintf(stderr, "krun: %s\n", krun_model_notice(g->m));
    g->n_stop = o->ignore_eos ? 0 : krun_model_stop_ids(g->m, g->stop_ids);

    if (krun_cli_pcache(&o->c, g->m, "krun", 0, 0, &g->cache, &e)) { fprintf(stderr, "krun: %s\n", e.msg); return e.code; }
    /* with --cache-dir the session starts from the longest kept state the prompt begins with */
    if (g->cache ? krun_pcache_begin(g->cache, g->prompt, g->n_prompt, 0, &g->s, &g->cached, &e) : krun_session_new(g->m, &g->s, &e)) {
        fprintf(stderr, "krun: %s\n", e.msg);
        return e.code;
    }
    krun_cli_sampler(&o->c, &so);
    /* a loaded state brings its PRNG: set the sampler first unless --seed says otherwise */
    if (!o->c.seed_given) krun_session_set_sampler(g->s, &so);
    if (o->load_state && krun_session_load(g->s, o->load_state, &e)) { fprintf(stderr, "krun: %s\n", e.msg); return e.code; }
    if (o->c.seed_given) krun_session_set_sampler(g->s, &so);
    /* the reply (what frequency and presence penalties count) begins after the prompt; a
     * loaded conversation continued without one goes on with its own reply */
    if (g->n_prompt || !o->load_state) krun_session_set_reply_start(g->s, g->state_tokens + g->n_prompt);

    g->gen_ids = malloc(gen_n * sizeof *g->gen_ids);
    g->steps = calloc(gen_n, sizeof *g->steps);
    g->step_members = calloc(gen_n * KRUN_MAX_MEMBERS, sizeof *g->step_members);
    if (o->recompute) g->hist = malloc(((size_t)o->c.ctx + 1) * sizeof *g->hist);
    if (o->dump_all) g->all = malloc((g->pending + g->n_prompt) * V * sizeof *g->all);
    if (o->dump_gen) g->gen_logits = malloc(gen_n * V * sizeof *g->gen_logits);
    if (o->spec) g->accepted = malloc(((size_t)o->spec + 1) * sizeof *g->accepted);
    if (!g->gen_ids || !g->steps || !g->step_members || (o->recompute && !g->hist) || (o->dump_all && !g->all) ||
        (o->dump_gen && !g->gen_logits) || (o->spec && !g->accepted)) {
        fprintf(stderr, "krun: out of memory\n");
        return KRUN_ENOMEM;
    }
    return KRUN_OK;
}

/* The prompt (after a loaded state's pending tokens), in blocks of --chunk
 * positions (auto: as the cost model chooses): the result does not depend on it.  Then --dump-logits and
 * --dump-all-logits. */
static int prefill(gen *g)
{
    const struct opts *o = &g->o;
    const size_t n = g->pending + g->n_prompt - g->cached;
    krun_err e;
    if (n > 0) {
        krun_prefill_progress pp;
        int rc;
        if (!o->quiet) krun_announce_prompt(g->m, n);
        krun_prefill_progress_start(&pp, g->m, g->s, n, o->quiet);
        rc = krun_session_feed(g->s, g->prompt + g->cached, g->n_prompt - g->cached, g->all, &e);
        krun_prefill_progress_end(&pp, g->s);
        if (rc) { fprintf(stderr, "\nkrun: %s\n", e.msg); return e.code; }
        g->t_prefill = know() - pp.t0;
        if (g->cache && g->cached < g->n_prompt) krun_pcache_keep(g->cache, g->s);   /* the end of the prompt: kept */
    } else if (!krun_session_logits(g->s) && o->gen > 0) {
        fprintf(stderr, "krun: %s holds no logits to generate from; give a prompt\n", o->load_state);
        return KRUN_EINPUT;
    }
    if (o->dump_logits && krun_session_logits(g->s) && write_floats(o->dump_logits, krun_session_logits(g->s), g->V)) {
        fprintf(stderr, "krun: writing %s: %s\n", o->dump_logits, strerror(errno));
        return KRUN_EINPUT;
    }
    if (o->dump_all && write_floats(o->dump_all, g->all, n * g->V)) {
        fprintf(stderr, "krun: writing %s: %s\n", o->dump_all, strerror(errno));
        return KRUN_EINPUT;
    }
    return KRUN_OK;
}

/* Text to stdout, whole UTF-8 characters at a time (flush: the rest). */
static int print_bytes(gen *g, const uint8_t *b, size_t len, int flush)
{
    const char *text;
    size_t n;
    if (kutf8_hold_take(&g->tout, b, len, flush, &text, &n)) { fprintf(stderr, "krun: out of memory\n"); return KRUN_ENOMEM; }
    fwrite(text, 1, n, stdout);
    fflush(stdout);
    return KRUN_OK;
}

/* A generated token to stdout: its text, or its id (--print-ids, or a file
 * without a tokenizer). */
static int print_token(gen *g, int32_t id, int first)
{
    size_t len = 0;
    const uint8_t *bytes;
    if (g->o.print_ids || !g->tk) {
        printf("%s%d", first ? "" : " ", id);
        fflush(stdout);
        return KRUN_OK;
    }
    bytes = ktok_id_bytes(g->tk, id, &len);
    return bytes ? print_bytes(g, bytes, len, 0) : KRUN_OK;
}

/* One decoding sweep after token `next`: a plain step, the whole history
 * again (--recompute) or a verification of drafts (--spec: *n_acc of them
 * accepted, in g->accepted).  Records its statistics in the next step. */
static int sweep(gen *g, int32_t next, size_t *n_acc, krun_err *e)
{
    const struct opts *o = &g->o;
    krun_stats a, b;
    krun_spec_stats sa, sb;
    gen_step *st;
    double t0;
    int rc;
    *n_acc = 0;
    krun_model_stats(g->m, &a);
    krun_session_spec_stats(g->s, &sa);
    t0 = know();
    if (o->recompute) {
        /* the whole history again from position 0: must equal incremental decoding */
        size_t n = 0, reply = krun_session_reply_start(g->s);
        const int32_t *h = krun_session_tokens(g->s, &n);
        memcpy(g->hist, h, n * sizeof *g->hist);
        g->hist[n] = next;
        krun_session_reset(g->s);
        krun_session_set_reply_start(g->s, reply);
        rc = krun_session_feed(g->s, g->hist, n + 1, NULL, e);
    } else if (o->spec) {
        /* drafts may fill the generation but one: the model's own token comes last */
        rc = krun_session_feed_spec(g->s, next, (size_t)o->gen - g->n_gen - 1, g->accepted,
                                    g->gen_logits ? g->gen_logits + g->n_gen * g->V : NULL, n_acc, e);
    } else {
        rc = krun_session_feed(g->s, &next, 1, NULL, e);
    }
    if (rc) return -1;
    krun_model_stats(g->m, &b);
    krun_session_spec_stats(g->s, &sb);
    st = &g->steps[g->n_steps++];
    st->seconds = know() - t0;
    st->member = g->step_members + (g->n_steps - 1) * KRUN_MAX_MEMBERS;
    gen_step_measure(st, &a, &b);
    st->rss = kmem_rss();
    st->tokens = *n_acc + 1;
    st->drafted = (size_t)(sb.drafted - sa.drafted);
    return 0;
}

/* One forward pass per generated token (the last one needs none; it joins
 * the history as pending, for --save-state).  With --spec a pass may also
 * verify drafted tokens: those the model agrees with are generated tokens
 * too, without a pass of their own. */
static int decode(gen *g)
{
    const struct opts *o = &g->o;
    krun_err e;
    while (g->n_gen < (size_t)o->gen) {
        int32_t next = krun_session_sample(g->s);
        size_t n_acc = 0;
        int stop = 0;
        if (next < 0) { fprintf(stderr, "krun: no logits to sample from\n"); return KRUN_EINPUT; }
        if (g->gen_logits) memcpy(g->gen_logits + g->n_gen * g->V, krun_session_logits(g->s), g->V * sizeof *g->gen_logits);
        g->gen_ids[g->n_gen++] = next;
        for (size_t k = 0; k < g->n_stop; k++) stop |= next == g->stop_ids[k];
        if ((!stop || o->print_ids || !g->tk) && print_token(g, next, g->n_gen == 1)) return KRUN_ENOMEM;
        if (stop || g->n_gen == (size_t)o->gen) {
            if (krun_session_append(g->s, &next, 1, &e)) { fprintf(stderr, "krun: %s\n", e.msg); return e.code; }
            break;
        }
        if (sweep(g, next, &n_acc, &e)) { fprintf(stderr, "krun: %s\n", e.msg); return e.code; }
        /* the accepted drafts are generated tokens (never stop ids: drafts stop before one) */
        for (size_t k = 0; k < n_acc; k++) {
            g->gen_ids[g->n_gen++] = g->accepted[k];
            if (print_token(g, g->accepted[k], 0)) return KRUN_ENOMEM;
        }
        if (krun_model_plan(g->m) && !o->quiet) {
            krun_stats st;
            krun_model_stats(g->m, &st);
            gen_report_step(&g->steps[g->n_steps - 1], g->n_steps, n_acc, st.n_members);
        }
    }
    return KRUN_OK;
}

/* The end of the text, --save-state, --dump-gen-logits, --trace and the report. */
static int finish(gen *g)
{
    const struct opts *o = &g->o;
    const gen_record r = {g->prompt, g->n_prompt, g->gen_ids, g->n_gen, g->steps, g->n_steps, g->t_prefill, o->spec, g->cache != NULL,
                          g->cached};
    krun_err e;
    if (print_bytes(g, NULL, 0, 1)) return KRUN_ENOMEM;
    if (o->print_ids || !g->tk || o->gen) printf("\n");
    fflush(stdout);
    if (o->save_state && krun_session_save(g->s, o->save_state, &e)) { fprintf(stderr, "krun: %s\n", e.msg); return e.code; }
    if (o->dump_gen && write_floats(o->dump_gen, g->gen_logits, g->n_gen * g->V)) {
        fprintf(stderr, "krun: writing %s: %s\n", o->dump_gen, strerror(errno));
        return KRUN_EINPUT;
    }
    if (o->c.trace && krun_model_trace_write(g->m, o->c.trace)) {
        fprintf(stderr, "krun: cannot write %s: %s\n", o->c.trace, strerror(errno));
        return KRUN_EINPUT;
    }
    if (!o->quiet) gen_report_summary(g->m, g->s, &r);
    if (o->json && gen_report_json(o->json, g->m, g->s, &r)) return KRUN_EINPUT;
    if (g->cache) {
        krun_pcache_end(g->cache, g->s);       /* the end of the run: kept (written now) */
        g->s = NULL;
    }
    return KRUN_OK;
}

int krun_generate_main(int argc, char **argv)
{
    gen g;
    krun_err e = {0, {0}};
    uint64_t budget;
    int rc;

    memset(&g, 0, sizeof g);
    parse_args(argc, argv, &g.o);
    if (krun_ablation_from_env()) return KRUN_EINPUT;
    if (krun_cli_budget(&g.o.c, &budget)) return KRUN_EINPUT;
    if (krun_model_load(g.o.model, &g.m, &e)) { fprintf(stderr, "krun: %s\n", e.msg); return e.code; }
    krun_cli_file_warning("krun", g.m);
    if (g.o.plan_only) {
        rc = plan_only(&g.o, g.m, budget);
    } else {
        g.V = (size_t)krun_model_config(g.m)->vocab;
        g.tk = krun_model_tokenizer(g.m);
        rc = size_context(&g);
        if (rc == KRUN_OK) rc = prepare(&g, budget);
        if (rc == KRUN_OK) rc = prefill(&g);
        if (rc == KRUN_OK) rc = decode(&g);
        if (rc == KRUN_OK) rc = finish(&g);
    }
    krun_session_free(g.s);
    krun_pcache_close(g.cache);
    krun_model_close(g.m);
    free(g.prompt); free(g.gen_ids); free(g.hist); free(g.all); free(g.steps); free(g.step_members); free(g.gen_logits);
    free(g.accepted);
    kutf8_hold_free(&g.tout);
    return rc;
}
