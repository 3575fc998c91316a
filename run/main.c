/* krun: run Kimi K3 from a KPK file.  Text (or token ids) in, text out. */
#include "ablate.h"
#include "forward.h"
#include "kio.h"
#include "kprogress.h"
#include "sampler.h"
#include "tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
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
    "prompt (empty, token id out of range, longer than the context), not a KPK file.\n";

struct opts {
    const char *model, *prompt, *prompt_file, *ids, *json, *dump_logits, *dump_all;
    long gen, top_k, threads, ctx, chunk;
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
    if (!!o->prompt + !!o->prompt_file + !!o->ids != 1) die_usage("%s", "give exactly one of --prompt, --prompt-file, --ids");
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

static uint64_t peak_rss(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (uint64_t)ru.ru_maxrss * 1024 : 0;
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
    double *spt = NULL, t_prefill = 0;
    char err[1024];
    int rc = KR_USAGE, have_model = 0, have_run = 0;
    struct text_out tout = {{0}, 0};
    kstore_opts sopt;

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
    if (k3_model_open(f, &m, err, sizeof err)) { fprintf(stderr, "krun: %s\n", err); rc = KR_DATA; goto out; }
    have_model = 1;
    V = (size_t)m.cfg.vocab;
    tk = load_tokenizer(&m, err, sizeof err);
    if (!tk && m.tokenizer_rank_file) { fprintf(stderr, "krun: tokenizer: %s\n", err); rc = KR_DATA; goto out; }

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

    sopt.verify = o.verify;
    if (kstore_open(f, &sopt, &store, &e)) { fprintf(stderr, "krun: %s\n", e.msg); rc = KR_DATA; goto out; }
    pool = kpool_create(o.threads ? (int)o.threads : kpool_ncpu());
    if (!pool) { fprintf(stderr, "krun: cannot start threads\n"); rc = KR_DATA; goto out; }
    if (k3_run_init(&run, &m, store, pool, (size_t)o.ctx, err, sizeof err)) { fprintf(stderr, "krun: %s\n", err); rc = KR_DATA; goto out; }
    have_run = 1;
    ksampler_init(&sampler, (float)o.temp, (int)o.top_k, (float)o.top_p, (float)o.min_p, o.seed);

    logits = malloc(V * sizeof *logits);
    seq = malloc((n_prompt + (size_t)o.gen + 1) * sizeof *seq);
    spt = malloc(((size_t)o.gen + 1) * sizeof *spt);
    if (o.dump_all) all = malloc(n_prompt * V * sizeof *all);
    if (!logits || !seq || !spt || (o.dump_all && !all)) { fprintf(stderr, "krun: out of memory\n"); rc = KR_DATA; goto out_run; }
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

    for (long g = 0; g < o.gen; g++) {
        double t0 = know();
        int32_t next = ksampler_pick(&sampler, logits, V);
        int stop = 0;
        if (next < 0) { fprintf(stderr, "krun: out of memory\n"); rc = KR_DATA; goto out_run; }
        seq[n_seq++] = next;
        for (int s = 0; s < 3; s++) stop |= stop_ids[s] >= 0 && next == stop_ids[s];
        if (o.print_ids || !tk) { printf("%s%d", g ? " " : "", next); fflush(stdout); }
        else if (!stop) {
            size_t len = 0;
            const uint8_t *b = ktok_id_bytes(tk, next, &len);
            if (b) emit_bytes(&tout, b, len, 0);
        }
        if (stop || g + 1 == o.gen) { spt[g] = know() - t0; if (stop) { o.gen = g + 1; } break; }
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
        spt[g] = know() - t0;
    }
    emit_bytes(&tout, NULL, 0, 1);
    if (o.print_ids || !tk || o.gen) printf("\n");
    fflush(stdout);
    {
        kstore_stats st;
        size_t n_gen = n_seq - n_prompt;
        double total = 0;
        kstore_stats_get(store, &st);
        for (size_t g = 0; g < n_gen; g++) total += spt[g];
        if (!o.quiet)
            fprintf(stderr, "krun: prompt %zu tokens in %.3f s; %zu generated, %.1f ms/token; %llu extents verified; peak RSS %.1f MB; simd %s, %d threads\n",
                    n_prompt, t_prefill, n_gen, n_gen ? total / (double)n_gen * 1e3 : 0.0, (unsigned long long)st.extents_verified,
                    (double)peak_rss() / 1e6, kern_simd_name(kern_simd_get()), kpool_threads(pool));
        if (o.json) {
            json_t *j = json_object(), *pi = json_array(), *gi = json_array(), *sp = json_array();
            for (size_t i = 0; i < n_prompt; i++) json_array_append_new(pi, json_integer(prompt[i]));
            for (size_t i = n_prompt; i < n_seq; i++) json_array_append_new(gi, json_integer(seq[i]));
            for (size_t g = 0; g < n_gen; g++) json_array_append_new(sp, json_real(spt[g]));
            json_object_set_new(j, "prompt_ids", pi);
            json_object_set_new(j, "generated_ids", gi);
            json_object_set_new(j, "seconds_per_token", sp);
            json_object_set_new(j, "prefill_seconds", json_real(t_prefill));
            json_object_set_new(j, "bytes_read", json_integer((json_int_t)st.bytes_read));
            json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)peak_rss()));
            json_object_set_new(j, "simd", json_string(kern_simd_name(kern_simd_get())));
            json_object_set_new(j, "threads", json_integer(kpool_threads(pool)));
            if (json_dump_file(j, o.json, JSON_INDENT(1)) != 0) {
                fprintf(stderr, "krun: cannot write %s\n", o.json);
                json_decref(j);
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
    free(prompt); free(seq); free(logits); free(all); free(spt);
    return rc;
}
