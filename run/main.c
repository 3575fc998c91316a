/* krun: run Kimi K3 from a KPK file.  Text (or token ids) in, text out. */
#include "ablate.h"
#include "forward.h"
#include "memplan.h"
#include "kio.h"
#include "kprogress.h"
#include "sampler.h"
#include "tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KRUN_VERSION "0.1.0"

enum { KR_OK = 0, KR_DATA = 1, KR_USAGE = 2 };

static const char usage[] =
    "usage: krun MODEL.kpk (--prompt TEXT | --prompt-file PATH | --ids 1,2,3) [options]\n"
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
    "  --temp T              temperature (default 0 = greedy argmax)\n"
    "  --top-k K  --top-p P  --min-p P   sampling filters (with --temp > 0)\n"
    "  --seed S              PRNG seed (xoshiro256**; same seed, same text)\n"
    "Execution:\n"
    "  --threads N           worker threads (default: all cores); results are identical for any N\n"
    "  --simd auto|scalar|avx2|avx512   kernel path (default auto); results are identical\n"
    "  --ctx N               positions to reserve (default: prompt + --gen)\n"
    "Memory (without --mem or --preset a file that fits in memory is used in place from a\n"
    "mapping; a larger one gets --mem 80% of the available memory):\n"
    "  --mem SIZE            memory budget, e.g. 8G, 512M (binary units); peak RSS stays below it\n"
    "  --preset NAME         laptop 8G, desktop 32G, workstation 64G, server 128G, max 224G\n"
    "  --plan                print the memory plan (and the minimum budget) and exit\n"
    "  --pin N               trunk layers kept resident (default: as many as fit)\n"
    "  --expert-slots N      experts cached (default: what the budget leaves)\n"
    "  --cache lfu|lru       expert cache policy (default lfu: least often used, ties to the most\n"
    "                        recently used; LRU evicts exactly what the next step needs)\n"
    "  --io mmap|pread|direct  how streamed extents are read (default direct, else pread)\n"
    "  --io-threads N        concurrent reads (default 8)\n"
    "  --trace FILE          every read: kind, offset, length, start, end (TSV)\n"
    "  --chunk N             prompt positions per forward block (default 64; results identical)\n"
    "  --verify first|always|off   check each extent's XXH3 on first use (default), every use, or never\n"
    "  --recompute           recompute the whole sequence every step (testing; same result)\n"
    "Output:\n"
    "  --json FILE           prompt_ids, generated_ids, seconds_per_token, bytes_read, peak_rss_bytes, ...\n"
    "  --dump-logits FILE    float32 little-endian logits of the last prompt position\n"
    "  --dump-all-logits FILE  the same for every prompt position, [positions][vocab]\n"
    "  --print-ids           print generated ids instead of text\n"
    "  --quiet               no statistics on stderr\n"
    "\n"
    "Exit: 0 success; 1 the model file is damaged or unreadable mid-run (the bad\n"
    "extent is named; no token computed from it is printed); 2 usage error, bad\n"
    "prompt (empty, token id out of range, longer than the context), not a KPK file,\n"
    "an output file (--json, --trace, --dump-logits) that cannot be written.\n";

struct opts {
    const char *model, *prompt, *prompt_file, *ids, *json, *dump_logits, *dump_all;
    const char *mem, *preset, *trace;
    long gen, top_k, threads, ctx, chunk, pin, slots, io_threads;
    int plan_only, io, policy, io_given;
    double temp, top_p, min_p;
    unsigned long long seed;
    int verify, recompute, print_ids, quiet, ignore_eos;
    const char *simd;
};

static void die_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "krun: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    exit(KR_USAGE);
}

static const char *need(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) die_usage("%s needs a value", argv[*i]);
    return argv[++*i];
}

static long parse_long(const char *s, long lo, long hi, const char *what)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) die_usage("bad value for %s", what);
    return v;
}

static double parse_double(const char *s, double lo, double hi, const char *what)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) die_usage("bad value for %s", what);
    return v;
}

static void parse_args(int argc, char **argv, struct opts *o)
{
    memset(o, 0, sizeof *o);
    o->gen = 32;
    o->threads = 0;
    o->chunk = 64;
    o->top_p = 1.0;
    o->verify = KSTORE_VERIFY_FIRST;
    o->pin = -1;
    o->slots = -1;
    o->io = KSTORE_IO_DIRECT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(usage, stdout); exit(KR_OK); }
        else if (!strcmp(a, "--version")) { printf("krun %s\n", KRUN_VERSION); exit(KR_OK); }
#ifdef KRUN_ABLATIONS
        else if (!strcmp(a, "--list-ablations")) {
            for (int k = 1; k < ABL_COUNT; k++) printf("%s\n", krun_ablation_name(k));
            exit(KR_OK);
        }
#endif
        else if (!strcmp(a, "--prompt")) o->prompt = need(argc, argv, &i);
        else if (!strcmp(a, "--prompt-file")) o->prompt_file = need(argc, argv, &i);
        else if (!strcmp(a, "--ids")) o->ids = need(argc, argv, &i);
        else if (!strcmp(a, "--gen")) o->gen = parse_long(need(argc, argv, &i), 0, 1L << 30, "--gen");
        else if (!strcmp(a, "--temp")) o->temp = parse_double(need(argc, argv, &i), 0, 100, "--temp");
        else if (!strcmp(a, "--top-k")) o->top_k = parse_long(need(argc, argv, &i), 0, 1L << 30, "--top-k");
        else if (!strcmp(a, "--top-p")) o->top_p = parse_double(need(argc, argv, &i), 0, 1, "--top-p");
        else if (!strcmp(a, "--min-p")) o->min_p = parse_double(need(argc, argv, &i), 0, 1, "--min-p");
        else if (!strcmp(a, "--seed")) o->seed = (unsigned long long)parse_long(need(argc, argv, &i), 0, 0x7fffffffffffffffL, "--seed");
        else if (!strcmp(a, "--threads")) o->threads = parse_long(need(argc, argv, &i), 1, 1024, "--threads");
        else if (!strcmp(a, "--ctx")) o->ctx = parse_long(need(argc, argv, &i), 1, 1L << 40, "--ctx");
        else if (!strcmp(a, "--chunk")) o->chunk = parse_long(need(argc, argv, &i), 1, 1L << 20, "--chunk");
        else if (!strcmp(a, "--simd")) o->simd = need(argc, argv, &i);
        else if (!strcmp(a, "--verify")) {
            const char *v = need(argc, argv, &i);
            if (!strcmp(v, "first")) o->verify = KSTORE_VERIFY_FIRST;
            else if (!strcmp(v, "always")) o->verify = KSTORE_VERIFY_ALWAYS;
            else if (!strcmp(v, "off")) o->verify = KSTORE_VERIFY_OFF;
            else die_usage("--verify: expected first, always or off, got %s", v);
        } else if (!strcmp(a, "--recompute")) o->recompute = 1;
        else if (!strcmp(a, "--mem")) o->mem = need(argc, argv, &i);
        else if (!strcmp(a, "--preset")) o->preset = need(argc, argv, &i);
        else if (!strcmp(a, "--plan")) o->plan_only = 1;
        else if (!strcmp(a, "--pin")) o->pin = parse_long(need(argc, argv, &i), 0, K3_MAX_LAYERS, "--pin");
        else if (!strcmp(a, "--expert-slots")) o->slots = parse_long(need(argc, argv, &i), 1, 1L << 24, "--expert-slots");
        else if (!strcmp(a, "--io-threads")) o->io_threads = parse_long(need(argc, argv, &i), 1, 256, "--io-threads");
        else if (!strcmp(a, "--trace")) o->trace = need(argc, argv, &i);
        else if (!strcmp(a, "--cache")) {
            const char *v = need(argc, argv, &i);
            if (!strcmp(v, "lru")) o->policy = KSTORE_LRU;
            else if (!strcmp(v, "lfu")) o->policy = KSTORE_LFU;
            else die_usage("--cache: expected lru or lfu, got %s", v);
        } else if (!strcmp(a, "--io")) {
            const char *v = need(argc, argv, &i);
            o->io_given = 1;
            if (!strcmp(v, "mmap")) o->io = KSTORE_IO_MMAP;
            else if (!strcmp(v, "pread")) o->io = KSTORE_IO_PREAD;
            else if (!strcmp(v, "direct")) o->io = KSTORE_IO_DIRECT;
            else die_usage("--io: expected mmap, pread or direct, got %s", v);
        }
        else if (!strcmp(a, "--json")) o->json = need(argc, argv, &i);
        else if (!strcmp(a, "--dump-logits")) o->dump_logits = need(argc, argv, &i);
        else if (!strcmp(a, "--dump-all-logits")) o->dump_all = need(argc, argv, &i);
        else if (!strcmp(a, "--print-ids")) o->print_ids = 1;
        else if (!strcmp(a, "--ignore-eos")) o->ignore_eos = 1;
        else if (!strcmp(a, "--quiet")) o->quiet = 1;
        else if (a[0] == '-') die_usage("unknown option %s (see --help)", a);
        else if (!o->model) o->model = a;
        else die_usage("unexpected argument %s", a);
    }
    if (!o->model) { fputs(usage, stderr); exit(KR_USAGE); }
    if (o->mem && o->preset) die_usage("%s", "give --mem or --preset, not both");
    if ((o->plan_only || o->pin >= 0 || o->slots >= 0 || o->io_given || o->trace) && !o->mem && !o->preset)
        die_usage("%s", "--plan, --pin, --expert-slots, --io and --trace need a budget: --mem SIZE or --preset NAME");
    if (!o->plan_only && !!o->prompt + !!o->prompt_file + !!o->ids != 1)
        die_usage("%s", "give exactly one of --prompt, --prompt-file, --ids");
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

/* The tokenizer from the KPK file: ranks + specials from tokenizer_config.json,
 * every unnamed id after the ranks up to the vocabulary named reserved. */
static ktok *load_tokenizer(const k3_model *m, char *err, size_t errlen)
{
    ktok_special *sp = NULL;
    size_t nsp = 0, nranks = 0;
    ktok *tk;
    if (!m->tokenizer_rank_file) return NULL;
    for (size_t i = 0; i < m->tokenizer_rank_len; i++) nranks += m->tokenizer_rank_file[i] == '\n';
    if (m->tokenizer_config && ktok_specials_from_config(m->tokenizer_config, m->tokenizer_config_len, &sp, &nsp, err, errlen))
        return NULL;
    if ((size_t)m->cfg.vocab > nranks &&
        ktok_specials_fill_reserved(&sp, &nsp, (int32_t)nranks, (int32_t)((size_t)m->cfg.vocab - nranks))) {
        ktok_specials_free(sp, nsp);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    tk = ktok_load(m->tokenizer_rank_file, m->tokenizer_rank_len, sp, nsp, err, errlen);
    ktok_specials_free(sp, nsp);
    return tk;
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

/* The budget's plan.  extra: buffers only some runs need (--dump-all-logits). */
static int make_plan(const struct opts *o, const k3_model *m, uint64_t extra, kmemplan *plan)
{
    char err[600];
    int64_t budget = o->mem ? kmem_parse_size(o->mem) : kmem_preset(o->preset);
    if (budget <= 0) {
        fprintf(stderr, "krun: %s: expected a size like 8G or 512M, or a preset (laptop, desktop, workstation, server, max)\n",
                o->mem ? o->mem : o->preset);
        return -1;
    }
    if (kmemplan_make(m, (uint64_t)budget, (int)o->pin, (int)o->slots, (size_t)o->ctx, (size_t)o->chunk,
                      kmem_base_bytes(m) + extra, plan, err, sizeof err)) {
        fprintf(stderr, "krun: %s\n", err);
        return -1;
    }
    plan->preset = o->preset;
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o;
    kpk_file *f = NULL;
    kpk_err e = {0};
    k3_model m;
    kstore *store = NULL;
    kpool *pool = NULL;
    k3_run run;
    ktok *tk = NULL;
    ksampler sampler;
    int32_t *prompt = NULL, *seq = NULL, stop_ids[3] = {-1, -1, -1};
    size_t n_prompt = 0, n_seq = 0, V;
    float *logits = NULL, *all = NULL;
    struct step { double seconds; uint64_t trunk, experts, globals, hits, misses, rss; } *steps = NULL;
    size_t n_steps = 0;
    double t_prefill = 0;
    char err[1024];
    int rc = KR_USAGE, have_model = 0, have_run = 0;
    struct text_out tout = {{0}, 0};
    kstore_opts sopt;
    kmemplan plan;
    char auto_mem[32];

    parse_args(argc, argv, &o);
    if (krun_ablation_from_env()) return KR_USAGE;
    if (o.simd && strcmp(o.simd, "auto") != 0) {
        ksimd lv;
        if (kern_simd_parse(o.simd, &lv)) die_usage("--simd: expected auto, scalar, avx2 or avx512, got %s", o.simd);
        kern_simd_set(lv);
    }
    if (kpk_open(o.model, &f, &e)) {
        fprintf(stderr, "krun: %s\n", e.msg);
        return e.code == KPK_EFORMAT || e.code == KPK_ECHECKSUM ? KR_DATA : KR_USAGE;
    }
    if (kpk_member_count(f) > 1) {
        fprintf(stderr, "krun: %s is a set of %u member files; krun cannot read sets yet. Make a single file with "
                "`kpack convert %s SINGLE.kpk` and run that\n", o.model, kpk_member_count(f), o.model);
        kpk_close(f);
        return KR_USAGE;
    }
    if (k3_model_open(f, &m, err, sizeof err)) { fprintf(stderr, "krun: %s\n", err); rc = KR_DATA; goto out; }
    have_model = 1;
    V = (size_t)m.cfg.vocab;
    tk = load_tokenizer(&m, err, sizeof err);
    if (!tk && m.tokenizer_rank_file) { fprintf(stderr, "krun: tokenizer: %s\n", err); rc = KR_DATA; goto out; }

    if (o.plan_only) {
        /* the plan alone: no prompt needed; --ctx defaults to 4096 */
        if (!o.ctx) o.ctx = 4096;
        rc = make_plan(&o, &m, 0, &plan) ? KR_USAGE : KR_OK;
        if (rc == KR_OK) {
            if (o.json) {
                json_t *j = kmemplan_json(&plan);
                if (json_dump_file(j, o.json, JSON_INDENT(1))) { fprintf(stderr, "krun: cannot write %s\n", o.json); rc = KR_USAGE; }
                json_decref(j);
            }
            kmemplan_print(&plan, stdout);
        }
        goto out;
    }

    /* the prompt */
    if (o.ids) {
        if (parse_ids(o.ids, &prompt, &n_prompt)) { fprintf(stderr, "krun: --ids: expected comma-separated token ids\n"); goto out; }
    } else {
        char *text = NULL;
        size_t len = 0;
        if (o.prompt) { text = strdup(o.prompt); len = strlen(o.prompt); }
        else if (kio_read_file(o.prompt_file, (size_t)1 << 30, &text, &len)) {
            fprintf(stderr, "krun: %s: %s\n", o.prompt_file, strerror(errno));
            goto out;
        }
        if (!tk) { free(text); fprintf(stderr, "krun: %s has no tokenizer; give the prompt with --ids\n", o.model); goto out; }
        if (!text || ktok_encode(tk, text, len, 1, &prompt, &n_prompt)) { free(text); fprintf(stderr, "krun: cannot tokenize the prompt\n"); goto out; }
        free(text);
    }
    if (n_prompt == 0) { fprintf(stderr, "krun: the prompt is empty\n"); goto out; }
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || (size_t)prompt[i] >= V) {
            fprintf(stderr, "krun: token id %d at prompt position %zu is outside the vocabulary (0..%zu)\n", prompt[i], i, V - 1);
            goto out;
        }
    /* the last generated token is never fed back, so prompt + gen - 1 positions are used */
    if (!o.ctx) o.ctx = (long)(n_prompt + (size_t)o.gen);
    if ((size_t)o.ctx < n_prompt + (o.gen > 0 ? (size_t)o.gen - 1 : 0)) {
        fprintf(stderr, "krun: the prompt (%zu tokens) and --gen %ld do not fit the context of %ld positions\n", n_prompt, o.gen, o.ctx);
        goto out;
    }
    if (!o.ignore_eos) {
        stop_ids[0] = m.eos_id;
        if (tk) { stop_ids[1] = ktok_find_special(tk, "<|end_of_msg|>"); stop_ids[2] = ktok_find_special(tk, "[EOS]"); }
    }

    memset(&sopt, 0, sizeof sopt);
    sopt.verify = o.verify;
    sopt.model = &m;
    /* No budget given and the file does not fit comfortably: budget 80% of the
     * available memory rather than let a mapping of the whole file push
     * everything else out of RAM. */
    if (!o.mem && !o.preset && kmem_available() && kpk_size(f) > kmem_available() / 10 * 8) {
        snprintf(auto_mem, sizeof auto_mem, "%llu", (unsigned long long)(kmem_available() / 10 * 8));
        o.mem = auto_mem;
        if (!o.quiet) fprintf(stderr, "krun: the model file is larger than 80%% of available memory: using --mem %s\n", auto_mem);
    }
    if (o.mem || o.preset) {
        if (make_plan(&o, &m, o.dump_all ? n_prompt * V * sizeof(float) : 0, &plan)) goto out;
        if (!o.quiet) kmemplan_print(&plan, stderr);
        sopt.plan = &plan;
        sopt.io = o.io;
        sopt.policy = o.policy;
        sopt.io_threads = (int)o.io_threads;
        sopt.trace = o.trace != NULL;
    }
    if (kstore_open(f, &sopt, &store, &e)) {
        fprintf(stderr, "krun: %s\n", e.msg);
        rc = e.code == KPK_EIO && o.io == KSTORE_IO_DIRECT ? KR_USAGE : KR_DATA;
        goto out;
    }
    pool = kpool_create(o.threads ? (int)o.threads : kpool_ncpu());
    if (!pool) { fprintf(stderr, "krun: cannot start threads\n"); rc = KR_DATA; goto out; }
    if (k3_run_init(&run, &m, store, pool, (size_t)o.ctx, err, sizeof err)) { fprintf(stderr, "krun: %s\n", err); rc = KR_DATA; goto out; }
    have_run = 1;
    ksampler_init(&sampler, (float)o.temp, (int)o.top_k, (float)o.top_p, (float)o.min_p, o.seed);

    logits = malloc(V * sizeof *logits);
    seq = malloc((n_prompt + (size_t)o.gen + 1) * sizeof *seq);
    steps = calloc((size_t)o.gen + 1, sizeof *steps);
    if (o.dump_all) all = malloc(n_prompt * V * sizeof *all);
    if (!logits || !seq || !steps || (o.dump_all && !all)) { fprintf(stderr, "krun: out of memory\n"); rc = KR_DATA; goto out_run; }
    memcpy(seq, prompt, n_prompt * sizeof *seq);
    n_seq = n_prompt;

    /* prefill, in blocks of --chunk positions (the result does not depend on it) */
    {
        double t0 = know();
        for (size_t p = 0; p < n_prompt; p += (size_t)o.chunk) {
            size_t n = n_prompt - p < (size_t)o.chunk ? n_prompt - p : (size_t)o.chunk;
            if (k3_forward(&run, prompt + p, n, all != NULL, all ? all + p * V : logits, err, sizeof err)) {
                fprintf(stderr, "krun: %s\n", err);
                rc = KR_DATA;
                goto out_run;
            }
        }
        if (all) memcpy(logits, all + (n_prompt - 1) * V, V * sizeof *logits);
        t_prefill = know() - t0;
    }
    if (o.dump_logits && write_floats(o.dump_logits, logits, V)) { fprintf(stderr, "krun: writing %s: %s\n", o.dump_logits, strerror(errno)); goto out_run; }
    if (o.dump_all && write_floats(o.dump_all, all, n_prompt * V)) { fprintf(stderr, "krun: writing %s: %s\n", o.dump_all, strerror(errno)); goto out_run; }

    /* decoding: one forward pass per generated token (the last one needs none) */
    for (long g = 0; g < o.gen; g++) {
        int32_t next = ksampler_pick(&sampler, logits, V);
        int stop = 0;
        kstore_stats a, b;
        struct step *st;
        double t0;
        if (next < 0) { fprintf(stderr, "krun: out of memory\n"); rc = KR_DATA; goto out_run; }
        seq[n_seq++] = next;
        for (int k = 0; k < 3; k++) stop |= stop_ids[k] >= 0 && next == stop_ids[k];
        if (o.print_ids || !tk) { printf("%s%d", g ? " " : "", next); fflush(stdout); }
        else if (!stop) {
            size_t len = 0;
            const uint8_t *bytes = ktok_id_bytes(tk, next, &len);
            if (bytes) emit_bytes(&tout, bytes, len, 0);
        }
        if (stop || g + 1 == o.gen) break;
        kstore_stats_get(store, &a);
        t0 = know();
        if (o.recompute) {
            k3_state_reset(&run.state);
            for (size_t p = 0; p < n_seq; p += (size_t)o.chunk) {
                size_t n = n_seq - p < (size_t)o.chunk ? n_seq - p : (size_t)o.chunk;
                if (k3_forward(&run, seq + p, n, 0, logits, err, sizeof err)) { fprintf(stderr, "krun: %s\n", err); rc = KR_DATA; goto out_run; }
            }
        } else if (k3_forward(&run, &next, 1, 0, logits, err, sizeof err)) {
            fprintf(stderr, "krun: %s\n", err);
            rc = KR_DATA;
            goto out_run;
        }
        kstore_stats_get(store, &b);
        st = &steps[n_steps++];
        st->seconds = know() - t0;
        st->trunk = b.bytes_trunk - a.bytes_trunk;
        st->experts = b.bytes_experts - a.bytes_experts;
        st->globals = b.bytes_globals - a.bytes_globals;
        st->hits = b.expert_hits - a.expert_hits;
        st->misses = b.expert_misses - a.expert_misses;
        st->rss = kmem_rss();
        if (sopt.plan && !o.quiet) {
            char t1[32], t2[32];
            kfmt_bytes(st->trunk, t1, sizeof t1);
            kfmt_bytes(st->experts, t2, sizeof t2);
            fprintf(stderr, "\nkrun: step %zu: %.3f s, read trunk %s + experts %s (%.0f MB/s), resident hits %llu/%llu, RSS %.1f MB\n",
                    n_steps, st->seconds, t1, t2, (double)(st->trunk + st->experts + st->globals) / st->seconds / 1e6,
                    (unsigned long long)st->hits, (unsigned long long)(st->hits + st->misses), (double)st->rss / 1e6);
        }
    }
    emit_bytes(&tout, NULL, 0, 1);
    if (o.print_ids || !tk || o.gen) printf("\n");
    fflush(stdout);
    {
        kstore_stats st;
        size_t n_gen = n_seq - n_prompt;
        double total = 0;
        kstore_stats_get(store, &st);
        for (size_t k = 0; k < n_steps; k++) total += steps[k].seconds;
        if (o.trace && kstore_trace_write(store, o.trace)) {
            fprintf(stderr, "krun: cannot write %s: %s\n", o.trace, strerror(errno));
            rc = KR_USAGE;
            goto out_run;
        }
        if (!o.quiet)
            fprintf(stderr, "krun: prompt %zu tokens in %.3f s; %zu generated, %.1f ms per decoding step; read %.3g GB; "
                    "%llu extents verified; peak RSS %.1f MB; simd %s, %d threads\n",
                    n_prompt, t_prefill, n_gen, n_steps ? total / (double)n_steps * 1e3 : 0.0, (double)st.bytes_read / 1e9,
                    (unsigned long long)st.extents_verified, (double)kmem_peak_rss() / 1e6, kern_simd_name(kern_simd_get()),
                    kpool_threads(pool));
        if (o.json) {
            json_t *j = json_object(), *pi = json_array(), *gi = json_array(), *sp = json_array(), *sa = json_array();
            for (size_t i = 0; i < n_prompt; i++) json_array_append_new(pi, json_integer(prompt[i]));
            for (size_t i = n_prompt; i < n_seq; i++) json_array_append_new(gi, json_integer(seq[i]));
            /* the time until each generated token: the prompt pass for the first,
             * one decoding step for each of the others */
            if (n_gen) json_array_append_new(sp, json_real(t_prefill));
            for (size_t k = 0; k < n_steps; k++) {
                const struct step *x = &steps[k];
                json_t *o2 = json_object();
                json_array_append_new(sp, json_real(x->seconds));
                json_object_set_new(o2, "seconds", json_real(x->seconds));
                json_object_set_new(o2, "bytes_trunk", json_integer((json_int_t)x->trunk));
                json_object_set_new(o2, "bytes_experts", json_integer((json_int_t)x->experts));
                json_object_set_new(o2, "bytes_globals", json_integer((json_int_t)x->globals));
                json_object_set_new(o2, "mb_per_s", json_real((double)(x->trunk + x->experts + x->globals) / x->seconds / 1e6));
                json_object_set_new(o2, "expert_hits", json_integer((json_int_t)x->hits));
                json_object_set_new(o2, "expert_misses", json_integer((json_int_t)x->misses));
                json_object_set_new(o2, "resident_hit_rate", x->hits + x->misses ? json_real((double)x->hits / (double)(x->hits + x->misses)) : json_null());
                json_object_set_new(o2, "rss_bytes", json_integer((json_int_t)x->rss));
                json_array_append_new(sa, o2);
            }
            json_object_set_new(j, "prompt_ids", pi);
            json_object_set_new(j, "generated_ids", gi);
            json_object_set_new(j, "seconds_per_token", sp);
            json_object_set_new(j, "steps", sa);
            json_object_set_new(j, "prefill_seconds", json_real(t_prefill));
            json_object_set_new(j, "bytes_read", json_integer((json_int_t)st.bytes_read));
            json_object_set_new(j, "bytes_trunk", json_integer((json_int_t)st.bytes_trunk));
            json_object_set_new(j, "bytes_experts", json_integer((json_int_t)st.bytes_experts));
            json_object_set_new(j, "bytes_globals", json_integer((json_int_t)st.bytes_globals));
            json_object_set_new(j, "bytes_resident", json_integer((json_int_t)st.bytes_resident));
            json_object_set_new(j, "expert_hits", json_integer((json_int_t)st.expert_hits));
            json_object_set_new(j, "expert_misses", json_integer((json_int_t)st.expert_misses));
            json_object_set_new(j, "io_wait_seconds", json_real(st.io_wait_seconds));
            json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)kmem_peak_rss()));
            json_object_set_new(j, "simd", json_string(kern_simd_name(kern_simd_get())));
            json_object_set_new(j, "threads", json_integer(kpool_threads(pool)));
            if (sopt.plan) json_object_set_new(j, "plan", kmemplan_json(&plan));
            if (json_dump_file(j, o.json, JSON_INDENT(1)) != 0) {
                fprintf(stderr, "krun: cannot write %s\n", o.json);
                json_decref(j);
                rc = KR_USAGE;
                goto out_run;
            }
            json_decref(j);
        }
    }
    rc = KR_OK;
out_run:
    ksampler_free(&sampler);
out:
    if (have_run) k3_run_free(&run);
    kpool_destroy(pool);
    kstore_close(store);
    if (have_model) k3_model_close(&m);
    ktok_free(tk);
    kpk_close(f);
    free(prompt); free(seq); free(logits); free(all); free(steps);
    return rc;
}
