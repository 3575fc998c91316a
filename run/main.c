/* krun: run Kimi K3 from a KPK file.  Text (or token ids) in, text out.
 * Argument parsing and output; the work is done through the session API
 * (session.h). */
#include "ablate.h"
#include "cmd_chat.h"
#include "cmd_serve.h"
#include "cmd_tokenize.h"
#include "krun_cli.h"
#include "kio.h"
#include "kprogress.h"
#include "session.h"
#include "spec.h"
#include "statefile.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KRUN_VERSION "0.2.0"
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
    "                        bit-identical to --spec 0 (greedy only: refused with --temp > 0)\n"
    "Conversations:\n"
    "  --save-state FILE     after the run, save the conversation (KDA/ShortConv/MLA state,\n"
    "                        tokens, last logits; docs/STATE.md) to FILE\n"
    "  --load-state FILE     continue a saved conversation: the prompt follows it (and may\n"
    "                        be left out); the earlier turns are not run again.  Without\n"
    "                        --seed, sampling continues the saved PRNG\n"
    "Execution:\n"
    KRUN_CLI_USAGE_EXECUTION
    "  --ctx N               positions to reserve (default: saved state + prompt + --gen; a\n"
    "                        prompt beyond 262144 positions needs an explicit --ctx)\n"
    KRUN_CLI_USAGE_MEMORY
    "  --plan                print the memory plan (and the minimum budget) and exit\n"
    "  --max-seqs N          sessions whose state the plan budgets (default 1; for --plan)\n"
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
    int plan_only;
    int recompute, print_ids, quiet, ignore_eos;
    krun_cli c;               /* memory, execution and sampling: shared with krun chat and krun serve */
};

static void parse_args(int argc, char **argv, struct opts *o)
{
    memset(o, 0, sizeof *o);
    krun_cli_init(&o->c);
    o->gen = 32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (krun_cli_option(&o->c, argc, argv, &i)) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(usage, stdout); exit(KRUN_OK); }
        else if (!strcmp(a, "--version")) { printf("krun %s\n", KRUN_VERSION); exit(KRUN_OK); }
#ifdef KRUN_ABLATIONS
        else if (!strcmp(a, "--list-ablations")) {
            for (int k = 1; k < ABL_COUNT; k++) printf("%s\n", krun_ablation_name(k));
            exit(KRUN_OK);
        }
#endif
        else if (!strcmp(a, "--prompt")) o->prompt = krun_cli_need(argc, argv, &i);
        else if (!strcmp(a, "--prompt-file")) o->prompt_file = krun_cli_need(argc, argv, &i);
        else if (!strcmp(a, "--ids")) o->ids = krun_cli_need(argc, argv, &i);
        else if (!strcmp(a, "--gen")) o->gen = krun_cli_long(krun_cli_need(argc, argv, &i), 0, 1L << 30, "--gen");
        else if (!strcmp(a, "--recompute")) o->recompute = 1;
        else if (!strcmp(a, "--plan")) o->plan_only = 1;
        else if (!strcmp(a, "--json")) o->json = krun_cli_need(argc, argv, &i);
        else if (!strcmp(a, "--dump-logits")) o->dump_logits = krun_cli_need(argc, argv, &i);
        else if (!strcmp(a, "--dump-all-logits")) o->dump_all = krun_cli_need(argc, argv, &i);
        else if (!strcmp(a, "--save-state")) o->save_state = krun_cli_need(argc, argv, &i);
        else if (!strcmp(a, "--load-state")) o->load_state = krun_cli_need(argc, argv, &i);
        else if (!strcmp(a, "--dump-gen-logits")) o->dump_gen = krun_cli_need(argc, argv, &i);
        else if (!strcmp(a, "--spec")) o->spec = krun_cli_long(krun_cli_need(argc, argv, &i), 0, KSPEC_MAX_DRAFT, "--spec (0..64)");
        else if (!strcmp(a, "--print-ids")) o->print_ids = 1;
        else if (!strcmp(a, "--ignore-eos")) o->ignore_eos = 1;
        else if (!strcmp(a, "--quiet")) o->quiet = 1;
        else if (a[0] == '-') krun_cli_die("unknown option %s (see --help)", a);
        else if (!o->model) o->model = a;
        else krun_cli_die("unexpected argument %s", a);
    }
    if (!o->model) { fputs(usage, stderr); exit(KRUN_EINPUT); }
    krun_cli_check(&o->c, o->plan_only ? "--plan" : NULL);
    if (!o->plan_only && !!o->prompt + !!o->prompt_file + !!o->ids > 1)
        krun_cli_die("%s", "give only one of --prompt, --prompt-file, --ids");
    if (!o->plan_only && !o->load_state && !!o->prompt + !!o->prompt_file + !!o->ids != 1)
        krun_cli_die("%s", "give exactly one of --prompt, --prompt-file, --ids (or --load-state to continue a conversation)");
    /* the drafts are checked against the greedy choice: with sampling the text
     * could not be --spec 0's (docs/RUNTIME.md §7) */
    if (o->spec && o->c.temp > 0)
        krun_cli_die("%s", "--spec is exact for greedy decoding only: drop --temp (or give --spec 0) to sample");
    if (o->spec && o->recompute) krun_cli_die("%s", "--spec and --recompute exclude each other (--recompute reruns every position)");
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

/* Streams decoded bytes, holding back an incomplete UTF-8 sequence. */
struct text_out { uint8_t pend[64]; size_t n; };
static void emit_bytes(struct text_out *o, const uint8_t *b, size_t len, int flush)
{
    while (len) {
        size_t take = len < sizeof o->pend - o->n ? len : sizeof o->pend - o->n;
        memcpy(o->pend + o->n, b, take);
        o->n += take; b += take; len -= take;
        {
            size_t ok = ktok_utf8_complete(o->pend, o->n);
            fwrite(o->pend, 1, ok, stdout);
            memmove(o->pend, o->pend + ok, o->n - ok);
            o->n -= ok;
        }
    }
    if (flush && o->n) { fwrite(o->pend, 1, o->n, stdout); o->n = 0; }
    fflush(stdout);
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

/* One decoding sweep: a forward block that produced `tokens` generated
 * tokens (1, or with --spec the accepted drafts plus the model's next). */
struct step { double seconds; uint64_t trunk, head, experts, globals, hits, misses, rss, predicted, predicted_used, router, cancelled; uint64_t *member; size_t tokens, drafted; };

/* Bytes read and seconds of the decoding sweeps, per generated token after
 * the first (which comes from the prompt's logits). */
struct decode_totals { size_t sweeps, tokens; double seconds; uint64_t bytes; };

static struct decode_totals decode_totals(const struct step *steps, size_t n_steps)
{
    struct decode_totals d = {n_steps, 0, 0, 0};
    for (size_t k = 0; k < n_steps; k++) {
        d.tokens += steps[k].tokens;
        d.seconds += steps[k].seconds;
        d.bytes += steps[k].trunk + steps[k].head + steps[k].experts + steps[k].globals;
    }
    return d;
}

/* Bytes each member file gave in a step, and at what rate. */
static json_t *members_json(krun_model *m, const uint64_t *bytes, double seconds)
{
    kstore_stats st;
    json_t *a = json_array();
    krun_model_stats(m, &st);
    for (uint16_t k = 0; k < st.n_members; k++) {
        json_t *o = json_object();
        json_object_set_new(o, "member", json_integer(k));
        json_object_set_new(o, "bytes", json_integer((json_int_t)bytes[k]));
        json_object_set_new(o, "mb_per_s", seconds > 0 ? json_real((double)bytes[k] / seconds / 1e6) : json_null());
        json_array_append_new(a, o);
    }
    return a;
}

static int write_json(const struct opts *o, krun_model *m, const int32_t *prompt, size_t n_prompt, const int32_t *gen,
                      size_t n_gen, const struct step *steps, size_t n_steps, double t_prefill, const krun_spec_stats *spec)
{
    struct decode_totals d = decode_totals(steps, n_steps);
    kstore_stats st;
    json_t *j = json_object(), *pi = json_array(), *gi = json_array(), *sp = json_array(), *sa = json_array();
    int rc = 0;
    krun_model_stats(m, &st);
    for (size_t i = 0; i < n_prompt; i++) json_array_append_new(pi, json_integer(prompt[i]));
    for (size_t i = 0; i < n_gen; i++) json_array_append_new(gi, json_integer(gen[i]));
    /* the time until each generated token: the prompt pass for the first,
     * one decoding sweep for each of the others (a sweep that gave several
     * tokens, with --spec, shares its time among them) */
    if (n_gen) json_array_append_new(sp, json_real(t_prefill));
    for (size_t k = 0; k < n_steps; k++) {
        const struct step *x = &steps[k];
        json_t *o2 = json_object();
        for (size_t i = 0; i < x->tokens; i++) json_array_append_new(sp, json_real(x->seconds / (double)x->tokens));
        json_object_set_new(o2, "seconds", json_real(x->seconds));
        json_object_set_new(o2, "tokens", json_integer((json_int_t)x->tokens));
        json_object_set_new(o2, "drafted", json_integer((json_int_t)x->drafted));
        json_object_set_new(o2, "bytes_trunk", json_integer((json_int_t)x->trunk));
        json_object_set_new(o2, "bytes_head", json_integer((json_int_t)x->head));
        json_object_set_new(o2, "bytes_experts", json_integer((json_int_t)x->experts));
        json_object_set_new(o2, "bytes_globals", json_integer((json_int_t)x->globals));
        json_object_set_new(o2, "mb_per_s", json_real((double)(x->trunk + x->head + x->experts + x->globals) / x->seconds / 1e6));
        json_object_set_new(o2, "members", members_json(m, x->member, x->seconds));
        json_object_set_new(o2, "expert_hits", json_integer((json_int_t)x->hits));
        json_object_set_new(o2, "expert_misses", json_integer((json_int_t)x->misses));
        json_object_set_new(o2, "experts_predicted", json_integer((json_int_t)x->predicted));
        json_object_set_new(o2, "experts_predicted_used", json_integer((json_int_t)x->predicted_used));
        json_object_set_new(o2, "bytes_router", json_integer((json_int_t)x->router));
        json_object_set_new(o2, "bytes_cancelled", json_integer((json_int_t)x->cancelled));
        json_object_set_new(o2, "resident_hit_rate", x->hits + x->misses ? json_real((double)x->hits / (double)(x->hits + x->misses)) : json_null());
        json_object_set_new(o2, "rss_bytes", json_integer((json_int_t)x->rss));
        json_array_append_new(sa, o2);
    }
    json_object_set_new(j, "prompt_ids", pi);
    json_object_set_new(j, "generated_ids", gi);
    json_object_set_new(j, "seconds_per_token", sp);
    json_object_set_new(j, "steps", sa);
    json_object_set_new(j, "prefill_seconds", json_real(t_prefill));
    {
        json_t *dj = json_object();
        json_object_set_new(dj, "sweeps", json_integer((json_int_t)d.sweeps));
        json_object_set_new(dj, "tokens", json_integer((json_int_t)d.tokens));
        json_object_set_new(dj, "seconds", json_real(d.seconds));
        json_object_set_new(dj, "bytes", json_integer((json_int_t)d.bytes));
        json_object_set_new(dj, "seconds_per_token", d.tokens ? json_real(d.seconds / (double)d.tokens) : json_null());
        json_object_set_new(dj, "bytes_per_token", d.tokens ? json_real((double)d.bytes / (double)d.tokens) : json_null());
        json_object_set_new(j, "decode", dj);
    }
    if (spec) {
        json_t *xj = json_object(), *rounds = json_array();
        for (size_t k = 0; k < n_steps; k++)
            if (steps[k].drafted) {
                json_t *r = json_array();
                json_array_append_new(r, json_integer((json_int_t)steps[k].drafted));
                json_array_append_new(r, json_integer((json_int_t)(steps[k].tokens - 1)));
                json_array_append_new(rounds, r);
            }
        json_object_set_new(xj, "max_drafts", json_integer(o->spec));
        json_object_set_new(xj, "sweeps", json_integer((json_int_t)spec->sweeps));
        json_object_set_new(xj, "verifications", json_integer((json_int_t)spec->verifications));
        json_object_set_new(xj, "drafted", json_integer((json_int_t)spec->drafted));
        json_object_set_new(xj, "accepted", json_integer((json_int_t)spec->accepted));
        json_object_set_new(xj, "rollbacks", json_integer((json_int_t)spec->rollbacks));
        json_object_set_new(xj, "rounds", rounds);   /* [drafted, accepted] of each verification */
        json_object_set_new(j, "spec", xj);
    } else {
        json_object_set_new(j, "spec", json_null());
    }
    json_object_set_new(j, "bytes_read", json_integer((json_int_t)st.bytes_read));
    json_object_set_new(j, "bytes_trunk", json_integer((json_int_t)st.bytes_trunk));
    json_object_set_new(j, "bytes_head", json_integer((json_int_t)st.bytes_head));
    json_object_set_new(j, "member_bytes", members_json(m, st.member_bytes, 0));
    json_object_set_new(j, "notice", krun_model_notice(m) ? json_string(krun_model_notice(m)) : json_null());
    json_object_set_new(j, "bytes_experts", json_integer((json_int_t)st.bytes_experts));
    json_object_set_new(j, "bytes_globals", json_integer((json_int_t)st.bytes_globals));
    json_object_set_new(j, "bytes_resident", json_integer((json_int_t)st.bytes_resident));
    json_object_set_new(j, "expert_hits", json_integer((json_int_t)st.expert_hits));
    json_object_set_new(j, "expert_misses", json_integer((json_int_t)st.expert_misses));
    json_object_set_new(j, "experts_predicted", json_integer((json_int_t)st.experts_predicted));
    json_object_set_new(j, "experts_predicted_used", json_integer((json_int_t)st.experts_predicted_used));
    json_object_set_new(j, "bytes_predicted", json_integer((json_int_t)st.bytes_predicted));
    json_object_set_new(j, "bytes_router", json_integer((json_int_t)st.bytes_router));
    json_object_set_new(j, "bytes_cancelled", json_integer((json_int_t)st.bytes_cancelled));
    json_object_set_new(j, "io_wait_seconds", json_real(st.io_wait_seconds));
    json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)kmem_peak_rss()));
    json_object_set_new(j, "simd", json_string(kern_simd_name(kern_simd_get())));
    json_object_set_new(j, "threads", json_integer(krun_model_threads(m)));
    if (krun_model_plan(m)) json_object_set_new(j, "plan", kmemplan_json(krun_model_plan(m)));
    if (json_dump_file(j, o->json, JSON_INDENT(1)) != 0) {
        fprintf(stderr, "krun: cannot write %s\n", o->json);
        rc = -1;
    }
    json_decref(j);
    return rc;
}

static int plan_only(const struct opts *o, krun_model *m, uint64_t budget)
{
    krun_model_opts mo;
    kmemplan plan;
    krun_err e;
    krun_cli_model_opts(&o->c, o->model, budget, &mo);
    mo.spec = (size_t)o->spec;
    mo.ctx = o->c.ctx ? (size_t)o->c.ctx : 4096; /* the plan alone: no prompt needed */
    if (krun_model_make_plan(m, &mo, &plan, &e)) { fprintf(stderr, "krun: %s\n", e.msg); return e.code; }
    if (o->json) {
        json_t *j = kmemplan_json(&plan);
        int bad = json_dump_file(j, o->json, JSON_INDENT(1)) != 0;
        json_decref(j);
        if (bad) { fprintf(stderr, "krun: cannot write %s\n", o->json); return KRUN_EINPUT; }
    }
    kmemplan_print(&plan, stdout);
    return KRUN_OK;
}

int main(int argc, char **argv)
{
    struct opts o;
    krun_model *m = NULL;
    krun_session *s = NULL;
    krun_err e = {0, {0}};
    krun_model_opts mo;
    ktok *tk;
    int32_t *prompt = NULL, *gen_ids = NULL, *hist = NULL, *accepted = NULL, stop_ids[3];
    size_t n_prompt = 0, n_gen = 0, V, n_stop, n_steps = 0, state_tokens = 0, pending = 0, max_prompt;
    float *all = NULL, *gen_logits = NULL;
    struct step *steps = NULL;
    uint64_t *step_members = NULL;
    double t_prefill = 0;
    uint64_t budget;
    int rc = KRUN_EINPUT;
    struct text_out tout = {{0}, 0};
    ksampler_opts so;

    /* subcommands that need no model runtime */
    if (argc > 1 && !strcmp(argv[1], "tokenize")) return krun_tokenize_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "chat")) return krun_chat_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "serve")) return krun_serve_main(argc - 1, argv + 1);
    parse_args(argc, argv, &o);
    if (krun_ablation_from_env()) return KRUN_EINPUT;
    if (krun_cli_budget(&o.c, &budget)) return KRUN_EINPUT;
    if (krun_model_load(o.model, &m, &e)) { fprintf(stderr, "krun: %s\n", e.msg); return e.code; }
    if (o.plan_only) { rc = plan_only(&o, m, budget); goto out; }
    V = (size_t)krun_model_config(m)->vocab;
    tk = krun_model_tokenizer(m);

    /* a saved conversation first: its length counts toward the context */
    if (o.load_state) {
        uint64_t pos, nt;
        if (krun_state_peek(o.load_state, &pos, &nt, &e)) { fprintf(stderr, "krun: %s\n", e.msg); rc = e.code; goto out; }
        state_tokens = (size_t)nt;
        pending = (size_t)(nt - pos);
    }
    /* the prompt, bounded by the context before it is read or tokenized */
    max_prompt = o.c.ctx ? ((size_t)o.c.ctx > state_tokens ? (size_t)o.c.ctx - state_tokens : 0) : KRUN_CTX_DEFAULT_MAX;
    if (read_prompt(&o, m, max_prompt, &prompt, &n_prompt)) goto out;
    if (n_prompt == 0 && !o.load_state) { fprintf(stderr, "krun: the prompt is empty\n"); goto out; }
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || (size_t)prompt[i] >= V) {
            fprintf(stderr, "krun: token id %d at prompt position %zu is outside the vocabulary (0..%zu)\n", prompt[i], i, V - 1);
            goto out;
        }
    if (!o.c.ctx && n_prompt > KRUN_CTX_DEFAULT_MAX) {
        fprintf(stderr, "krun: the prompt is %zu tokens, more than %zu without --ctx; give --ctx %zu or more to run it\n",
                n_prompt, KRUN_CTX_DEFAULT_MAX, n_prompt + state_tokens + (size_t)o.gen);
        goto out;
    }
    /* the last generated token is never fed back, so history + prompt + gen - 1 positions are used */
    if (!o.c.ctx) o.c.ctx = (long)(state_tokens + n_prompt + (size_t)o.gen);
    if ((size_t)o.c.ctx < state_tokens + n_prompt + (o.gen > 0 ? (size_t)o.gen - 1 : 0)) {
        fprintf(stderr, "krun: the prompt (%zu tokens%s) and --gen %ld do not fit the context of %ld positions\n", n_prompt,
                state_tokens ? " after the saved conversation's" : "", o.gen, o.c.ctx);
        goto out;
    }
    if (o.c.ctx < 1) o.c.ctx = 1;

    krun_cli_model_opts(&o.c, o.model, budget, &mo);
    mo.spec = (size_t)o.spec;
    if (o.dump_all) mo.extra_bytes += (uint64_t)(pending + n_prompt) * V * sizeof(float);
    if (o.dump_gen) mo.extra_bytes += (uint64_t)o.gen * V * sizeof(float);
    if (krun_model_prepare(m, &mo, &e)) { fprintf(stderr, "krun: %s\n", e.msg); rc = e.code; goto out; }
    if (!o.quiet && krun_model_auto_budget(m))
        fprintf(stderr, "krun: the model file is larger than 80%% of available memory: using --mem %llu\n",
                (unsigned long long)krun_model_auto_budget(m));
    if (!o.quiet && krun_model_plan(m)) kmemplan_print(krun_model_plan(m), stderr);
    if (!o.quiet && krun_model_notice(m)) fprintf(stderr, "krun: %s\n", krun_model_notice(m));
    n_stop = o.ignore_eos ? 0 : krun_model_stop_ids(m, stop_ids);

    if (krun_session_new(m, &s, &e)) { fprintf(stderr, "krun: %s\n", e.msg); rc = e.code; goto out; }
    krun_cli_sampler(&o.c, &so);
    /* a loaded state brings its PRNG: set the sampler first unless --seed says otherwise */
    if (!o.c.seed_given) krun_session_set_sampler(s, &so);
    if (o.load_state && krun_session_load(s, o.load_state, &e)) { fprintf(stderr, "krun: %s\n", e.msg); rc = e.code; goto out; }
    if (o.c.seed_given) krun_session_set_sampler(s, &so);

    gen_ids = malloc(((size_t)o.gen + 1) * sizeof *gen_ids);
    steps = calloc((size_t)o.gen + 1, sizeof *steps);
    step_members = calloc(((size_t)o.gen + 1) * KSTORE_MAX_MEMBERS, sizeof *step_members);
    if (o.recompute) hist = malloc(((size_t)o.c.ctx + 1) * sizeof *hist);
    if (o.dump_all) all = malloc((pending + n_prompt) * V * sizeof *all);
    if (o.dump_gen) gen_logits = malloc(((size_t)o.gen + 1) * V * sizeof *gen_logits);
    if (o.spec) accepted = malloc(((size_t)o.spec + 1) * sizeof *accepted);
    if (!gen_ids || !steps || !step_members || (o.recompute && !hist) || (o.dump_all && !all) || (o.dump_gen && !gen_logits) ||
        (o.spec && !accepted)) {
        fprintf(stderr, "krun: out of memory\n");
        rc = KRUN_ENOMEM;
        goto out;
    }

    /* prefill, in blocks of --chunk positions (the result does not depend on it) */
    if (pending + n_prompt > 0) {
        krun_prefill_progress pp;
        krun_prefill_progress_start(&pp, m, o.quiet);
        if (!o.quiet) krun_announce_prompt(m, pending + n_prompt);
        krun_session_set_progress(s, krun_prefill_progress_fn, &pp);
        if (krun_session_feed(s, prompt, n_prompt, all, &e)) { fprintf(stderr, "\nkrun: %s\n", e.msg); rc = e.code; goto out; }
        krun_session_set_progress(s, NULL, NULL);
        t_prefill = know() - pp.t0;
    } else if (!krun_session_logits(s) && o.gen > 0) {
        fprintf(stderr, "krun: %s holds no logits to generate from; give a prompt\n", o.load_state);
        goto out;
    }
    if (o.dump_logits && krun_session_logits(s) && write_floats(o.dump_logits, krun_session_logits(s), V)) {
        fprintf(stderr, "krun: writing %s: %s\n", o.dump_logits, strerror(errno));
        goto out;
    }
    if (o.dump_all && write_floats(o.dump_all, all, (pending + n_prompt) * V)) {
        fprintf(stderr, "krun: writing %s: %s\n", o.dump_all, strerror(errno));
        goto out;
    }

    /* decoding: one forward pass per generated token (the last one needs none;
     * it joins the history as pending, for --save-state).  With --spec a
     * pass may also verify drafted tokens: those the model agrees with are
     * generated tokens too, without a pass of their own. */
    while (n_gen < (size_t)o.gen) {
        int32_t next = krun_session_sample(s);
        size_t n_acc = 0;
        int stop = 0;
        kstore_stats a, b;
        krun_spec_stats sa, sb;
        struct step *st;
        double t0;
        if (next < 0) { fprintf(stderr, "krun: no logits to sample from\n"); rc = KRUN_EINPUT; goto out; }
        if (gen_logits) memcpy(gen_logits + n_gen * V, krun_session_logits(s), V * sizeof *gen_logits);
        gen_ids[n_gen++] = next;
        for (size_t k = 0; k < n_stop; k++) stop |= next == stop_ids[k];
        if (o.print_ids || !tk) { printf("%s%d", n_gen > 1 ? " " : "", next); fflush(stdout); }
        else if (!stop) {
            size_t len = 0;
            const uint8_t *bytes = ktok_id_bytes(tk, next, &len);
            if (bytes) emit_bytes(&tout, bytes, len, 0);
        }
        if (stop || n_gen == (size_t)o.gen) {
            if (krun_session_append(s, &next, 1, &e)) { fprintf(stderr, "krun: %s\n", e.msg); rc = e.code; goto out; }
            break;
        }
        krun_model_stats(m, &a);
        krun_session_spec_stats(s, &sa);
        t0 = know();
        if (o.recompute) {
            /* the whole history again from position 0: must equal incremental decoding */
            size_t n = 0;
            const int32_t *h = krun_session_tokens(s, &n);
            memcpy(hist, h, n * sizeof *hist);
            hist[n] = next;
            krun_session_reset(s);
            if (krun_session_feed(s, hist, n + 1, NULL, &e)) { fprintf(stderr, "krun: %s\n", e.msg); rc = e.code; goto out; }
        } else if (o.spec) {
            /* drafts may fill the generation but one: the model's own token comes last */
            if (krun_session_feed_spec(s, next, (size_t)o.gen - n_gen - 1, accepted, gen_logits ? gen_logits + n_gen * V : NULL,
                                       &n_acc, &e)) {
                fprintf(stderr, "krun: %s\n", e.msg);
                rc = e.code;
                goto out;
            }
        } else if (krun_session_feed(s, &next, 1, NULL, &e)) {
            fprintf(stderr, "krun: %s\n", e.msg);
            rc = e.code;
            goto out;
        }
        krun_model_stats(m, &b);
        krun_session_spec_stats(s, &sb);
        st = &steps[n_steps++];
        st->seconds = know() - t0;
        st->trunk = b.bytes_trunk - a.bytes_trunk;
        st->head = b.bytes_head - a.bytes_head;
        st->member = step_members + (n_steps - 1) * KSTORE_MAX_MEMBERS;
        for (uint16_t k = 0; k < b.n_members; k++) st->member[k] = b.member_bytes[k] - a.member_bytes[k];
        st->experts = b.bytes_experts - a.bytes_experts;
        st->globals = b.bytes_globals - a.bytes_globals;
        st->hits = b.expert_hits - a.expert_hits;
        st->misses = b.expert_misses - a.expert_misses;
        st->predicted = b.experts_predicted - a.experts_predicted;
        st->predicted_used = b.experts_predicted_used - a.experts_predicted_used;
        st->router = b.bytes_router - a.bytes_router;
        st->cancelled = b.bytes_cancelled - a.bytes_cancelled;
        st->rss = kmem_rss();
        st->tokens = n_acc + 1;
        st->drafted = (size_t)(sb.drafted - sa.drafted);
        /* the accepted drafts are generated tokens (never stop ids: drafts stop before one) */
        for (size_t k = 0; k < n_acc; k++) {
            gen_ids[n_gen++] = accepted[k];
            if (o.print_ids || !tk) { printf(" %d", accepted[k]); fflush(stdout); }
            else {
                size_t len = 0;
                const uint8_t *bytes = ktok_id_bytes(tk, accepted[k], &len);
                if (bytes) emit_bytes(&tout, bytes, len, 0);
            }
        }
        if (krun_model_plan(m) && !o.quiet) {
            char t1[32], t2[32];
            kfmt_bytes(st->trunk + st->head, t1, sizeof t1);
            kfmt_bytes(st->experts, t2, sizeof t2);
            fprintf(stderr, "\nkrun: step %zu: %.3f s, read trunk %s + experts %s (%.0f MB/s), resident hits %llu/%llu, RSS %.1f MB",
                    n_steps, st->seconds, t1, t2, (double)(st->trunk + st->head + st->experts + st->globals) / st->seconds / 1e6,
                    (unsigned long long)st->hits, (unsigned long long)(st->hits + st->misses), (double)st->rss / 1e6);
            if (st->predicted) fprintf(stderr, "; %llu of %llu predicted experts used", (unsigned long long)st->predicted_used,
                                       (unsigned long long)st->predicted);
            if (st->drafted) fprintf(stderr, "; %zu of %zu drafts accepted", n_acc, st->drafted);
            fputc('\n', stderr);
            if (b.n_members > 1) {
                fprintf(stderr, "krun: step %zu per member:", n_steps);
                for (uint16_t k = 0; k < b.n_members; k++) {
                    kfmt_bytes(st->member[k], t1, sizeof t1);
                    fprintf(stderr, " %u: %s %.0f MB/s;", k, t1, (double)st->member[k] / st->seconds / 1e6);
                }
                fputc('\n', stderr);
            }
        }
    }
    emit_bytes(&tout, NULL, 0, 1);
    if (o.print_ids || !tk || o.gen) printf("\n");
    fflush(stdout);
    if (o.save_state && krun_session_save(s, o.save_state, &e)) { fprintf(stderr, "krun: %s\n", e.msg); rc = e.code; goto out; }
    if (o.dump_gen && write_floats(o.dump_gen, gen_logits, n_gen * V)) {
        fprintf(stderr, "krun: writing %s: %s\n", o.dump_gen, strerror(errno));
        goto out;
    }
    {
        kstore_stats st;
        double total = 0;
        krun_model_stats(m, &st);
        for (size_t k = 0; k < n_steps; k++) total += steps[k].seconds;
        if (o.c.trace && krun_model_trace_write(m, o.c.trace)) {
            fprintf(stderr, "krun: cannot write %s: %s\n", o.c.trace, strerror(errno));
            goto out;
        }
        if (!o.quiet)
            fprintf(stderr, "krun: prompt %zu tokens in %.3f s; %zu generated, %.1f ms per decoding step; read %.3g GB; "
                    "%llu extents verified; peak RSS %.1f MB; simd %s, %d threads\n",
                    n_prompt, t_prefill, n_gen, n_steps ? total / (double)n_steps * 1e3 : 0.0, (double)st.bytes_read / 1e9,
                    (unsigned long long)st.extents_verified, (double)kmem_peak_rss() / 1e6, kern_simd_name(kern_simd_get()),
                    krun_model_threads(m));
        if (o.spec && !o.quiet) {
            struct decode_totals d = decode_totals(steps, n_steps);
            krun_spec_stats sp;
            char b1[32];
            krun_session_spec_stats(s, &sp);
            kfmt_bytes(d.tokens ? d.bytes / d.tokens : 0, b1, sizeof b1);
            fprintf(stderr, "krun: --spec %ld: %llu drafted, %llu accepted (%.0f%%), %llu rolled back; %zu sweeps for %zu tokens "
                    "(%.2f per sweep); %s and %.1f ms per generated token\n", o.spec, (unsigned long long)sp.drafted,
                    (unsigned long long)sp.accepted, sp.drafted ? 100.0 * (double)sp.accepted / (double)sp.drafted : 0.0,
                    (unsigned long long)sp.rollbacks, d.sweeps, d.tokens, d.sweeps ? (double)d.tokens / (double)d.sweeps : 0.0, b1,
                    d.tokens ? d.seconds / (double)d.tokens * 1e3 : 0.0);
        }
        if (o.json) {
            krun_spec_stats sp;
            krun_session_spec_stats(s, &sp);
            if (write_json(&o, m, prompt, n_prompt, gen_ids, n_gen, steps, n_steps, t_prefill, o.spec ? &sp : NULL)) goto out;
        }
    }
    rc = KRUN_OK;
out:
    krun_session_free(s);
    krun_model_close(m);
    free(prompt); free(gen_ids); free(hist); free(all); free(steps); free(step_members); free(gen_logits); free(accepted);
    return rc;
}
