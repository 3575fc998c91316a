/* The command-line options krun, krun chat and krun serve share (krun_cli.h). */
#include "krun_cli.h"

#include "format/kargs.h"
#include "format/kprogress.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void krun_cli_die(const char *fmt, const char *arg)
{
    fprintf(stderr, "krun: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    exit(KRUN_EINPUT);
}

int krun_cli_value(int argc, char **argv, int *i, const char *name, const char **val)
{
    int r = kargs_flag(argc, argv, i, name, val);
    if (r < 0) krun_cli_die("%s needs a value", name);
    return r;
}

long krun_cli_long(const char *s, long lo, long hi, const char *what)
{
    long v;
    if (kargs_long(s, lo, hi, &v)) krun_cli_die("bad value for %s", what);
    return v;
}

double krun_cli_double(const char *s, double lo, double hi, const char *what)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) krun_cli_die("bad value for %s", what);
    return v;
}

void krun_cli_init(krun_cli *c)
{
    memset(c, 0, sizeof *c);
    c->chunk = 0;             /* auto */
    c->top_p = 1.0;
    c->repetition_penalty = 1.0;
    c->verify = KRUN_VERIFY_FIRST;
    c->pin = -1;
    c->slots = -1;
    c->head = -1;
    c->max_seqs = 1;
    c->io = KRUN_IO_DIRECT;
    c->predict = -1;
    c->draft = "auto";
}

int krun_cli_option(krun_cli *c, int argc, char **argv, int *i)
{
    const char *v;
#define OPT(name) krun_cli_value(argc, argv, i, name, &v)
    if (OPT("--temp")) c->temp = krun_cli_double(v, 0, 100, "--temp");
    else if (OPT("--top-k")) c->top_k = krun_cli_long(v, 0, 1L << 30, "--top-k");
    else if (OPT("--top-p")) c->top_p = krun_cli_double(v, 0, 1, "--top-p");
    else if (OPT("--min-p")) c->min_p = krun_cli_double(v, 0, 1, "--min-p");
    else if (OPT("--repetition-penalty")) c->repetition_penalty = krun_cli_double(v, 0.01, 100, "--repetition-penalty (0.01..100)");
    else if (OPT("--presence-penalty")) c->presence_penalty = krun_cli_double(v, -2, 2, "--presence-penalty (-2..2)");
    else if (OPT("--frequency-penalty")) c->frequency_penalty = krun_cli_double(v, -2, 2, "--frequency-penalty (-2..2)");
    else if (OPT("--seed")) {
        c->seed = (unsigned long long)krun_cli_long(v, 0, 0x7fffffffffffffffL, "--seed");
        c->seed_given = 1;
    }
    else if (OPT("--threads")) c->threads = krun_cli_long(v, 1, 1024, "--threads");
    else if (OPT("--ctx")) c->ctx = krun_cli_long(v, 1, 1L << 40, "--ctx");
    else if (OPT("--chunk")) c->chunk = !strcmp(v, "auto") ? 0 : krun_cli_long(v, 1, 1L << 20, "--chunk (auto, or 1..1048576)");
    else if (OPT("--max-seqs")) c->max_seqs = krun_cli_long(v, 1, KRUN_MAX_SEQS, "--max-seqs");
    else if (OPT("--simd")) c->simd = v;
    else if (OPT("--verify")) {
        if (!strcmp(v, "first")) c->verify = KRUN_VERIFY_FIRST;
        else if (!strcmp(v, "always")) c->verify = KRUN_VERIFY_ALWAYS;
        else if (!strcmp(v, "off")) c->verify = KRUN_VERIFY_OFF;
        else krun_cli_die("--verify: expected first, always or off, got %s", v);
    }
    else if (OPT("--mem")) c->mem = v;
    else if (OPT("--preset")) c->preset = v;
    else if (OPT("--pin")) c->pin = krun_cli_long(v, 0, K3_MAX_LAYERS, "--pin");
    else if (OPT("--expert-slots")) c->slots = krun_cli_long(v, 1, 1L << 24, "--expert-slots");
    else if (OPT("--piece")) c->piece = v;
    else if (OPT("--head")) {
        if (!strcmp(v, "hold")) c->head = 0;
        else if (!strcmp(v, "stream")) c->head = 1;
        else krun_cli_die("--head: expected hold or stream, got %s", v);
    }
    else if (OPT("--predict")) {
        if (!strcmp(v, "on")) c->predict = 1;
        else if (!strcmp(v, "off")) c->predict = 0;
        else if (!strcmp(v, "auto")) c->predict = -1;
        else krun_cli_die("--predict: expected on, off or auto, got %s", v);
    }
    else if (OPT("--stages")) {
        if (!strcmp(v, "auto")) c->stages = 0;
        else if (!strcmp(v, "off")) c->stages = -1;
        else {
            /* the layers of each rank, in rank order: N,N,... */
            const char *p = v;
            int k = 0;
            memset(c->stage_layers, 0, sizeof c->stage_layers);
            while (*p && k < KRUN_MAX_RANKS) {
                char *end;
                long n = strtol(p, &end, 10);
                if (end == p || n < 0 || n > K3_MAX_LAYERS || (*end && *end != ',')) break;
                c->stage_layers[k++] = (int)n;
                p = *end ? end + 1 : end;
            }
            if (*p || !k) krun_cli_die("--stages: expected auto, off or the layers of each rank (N,N,...), got %s", v);
            c->stages = 1;
        }
    }
    else if (OPT("--draft")) c->draft = v;
    else if (OPT("--draft-width")) c->draft_width = krun_cli_long(v, 1, 64, "--draft-width (1..64)");
    else if (OPT("--draft-accept")) c->draft_accept = krun_cli_double(v, 0.001, 0.999, "--draft-accept (0.001..0.999)");
    else if (OPT("--io-threads")) c->io_threads = krun_cli_long(v, 1, 256, "--io-threads");
    else if (OPT("--trace")) c->trace = v;
    else if (OPT("--cache-dir")) c->cache_dir = v;
    else if (OPT("--cache-size")) c->cache_size = v;
    else if (!strcmp(argv[*i], "--no-cache")) c->no_cache = 1;
    else if (OPT("--cache")) {
        if (!strcmp(v, "lru")) c->policy = KRUN_CACHE_LRU;
        else if (!strcmp(v, "lfu")) c->policy = KRUN_CACHE_LFU;
        else krun_cli_die("--cache: expected lru or lfu, got %s", v);
    }
    else if (OPT("--io")) {
        c->io_given = 1;
        if (!strcmp(v, "mmap")) c->io = KRUN_IO_MMAP;
        else if (!strcmp(v, "pread")) c->io = KRUN_IO_PREAD;
        else if (!strcmp(v, "direct")) c->io = KRUN_IO_DIRECT;
        else krun_cli_die("--io: expected mmap, pread or direct, got %s", v);
    }
    else return 0;
#undef OPT
    return 1;
}

void krun_cli_check(krun_cli *c, const char *needs_budget)
{
    if (c->mem && c->preset) krun_cli_die("%s", "give --mem or --preset, not both");
    if ((needs_budget || c->pin >= 0 || c->slots >= 0 || c->io_given || c->trace || c->piece || c->head >= 0 || c->predict > 0) &&
        !c->mem && !c->preset) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s%s--pin, --expert-slots, --head, --piece, --predict on, --io and --trace need a budget: --mem SIZE or --preset NAME",
                 needs_budget ? needs_budget : "", needs_budget ? ", " : "");
        krun_cli_die("%s", msg);
    }
    if (c->piece && kargs_size(c->piece) <= 0) krun_cli_die("--piece: expected a size like 64M, got %s", c->piece);
    if (c->no_cache && (c->cache_dir || c->cache_size)) krun_cli_die("%s", "--no-cache with --cache-dir or --cache-size: which one?");
    if (c->cache_size && !c->cache_dir) krun_cli_die("%s", "--cache-size bounds the states kept in --cache-dir DIR: give it too");
    if (c->cache_size && kargs_size(c->cache_size) <= 0) krun_cli_die("--cache-size: expected a size like 32G, got %s", c->cache_size);
    if (c->simd && strcmp(c->simd, "auto") != 0 && (c->simd_level = krun_simd_parse(c->simd)) < 0)
        krun_cli_die("--simd: expected auto, scalar, avx2, avx512 or neon, got %s", c->simd);
}

int krun_cli_budget(const krun_cli *c, uint64_t *budget)
{
    int64_t b;
    *budget = 0;
    if (!c->mem && !c->preset) return 0;
    b = c->mem ? kargs_size(c->mem) : kmem_preset(c->preset);
    if (b <= 0) {
        fprintf(stderr, "krun: %s: expected a size like 8G or 512M, or a preset (laptop, desktop, workstation, server, max)\n",
                c->mem ? c->mem : c->preset);
        return -1;
    }
    *budget = (uint64_t)b;
    return 0;
}

void krun_cli_model_opts(const krun_cli *c, const char *path, uint64_t budget, krun_model_opts *mo)
{
    krun_model_opts_init(mo);
    mo->path = path;
    mo->budget = budget;
    mo->preset = c->preset;
    mo->pin = (int)c->pin;
    mo->expert_slots = (int)c->slots;
    mo->piece = c->piece ? (uint64_t)kargs_size(c->piece) : 0;
    mo->head = (int)c->head;
    mo->predict = (int)c->predict;
    mo->io = c->io;
    mo->cache_policy = c->policy;
    mo->io_threads = (int)c->io_threads;
    mo->verify = c->verify;
    mo->trace = c->trace != NULL;
    mo->ctx = (size_t)c->ctx;
    mo->chunk = (size_t)c->chunk;
    mo->max_seqs = (size_t)c->max_seqs;
    mo->threads = (int)c->threads;
    mo->cache = c->cache_dir != NULL && !c->no_cache;   /* snapshots to a file go through one KDA layer's buffer */
    mo->simd = c->simd && strcmp(c->simd, "auto") != 0 ? c->simd_level : -1;
    mo->stages = (int)c->stages;
    memcpy(mo->stage_layers, c->stage_layers, sizeof mo->stage_layers);
    mo->draft = c->draft;
    mo->draft_width = (size_t)c->draft_width;
    mo->draft_accept = c->draft_accept;
}

const char *krun_cli_draft_file(const krun_cli *c, const char *model, char *buf, size_t n)
{
    if (!c->draft || !strcmp(c->draft, "off")) return NULL;
    if (strcmp(c->draft, "auto")) {
        if (access(c->draft, R_OK)) {
            fprintf(stderr, "krun: --draft %s: %s (a drafter file: kpack convert DRAFTER_DIR OUT.kpk)\n", c->draft, strerror(errno));
            exit(KRUN_EINPUT);
        }
        return c->draft;
    }
    krun_draft_auto_path(model, buf, n);
    return access(buf, F_OK) == 0 ? buf : NULL;
}

void krun_cli_sampler(const krun_cli *c, ksampler_opts *so)
{
    ksampler_opts_init(so);
    so->temp = (float)c->temp;
    so->top_k = (int)c->top_k;
    so->top_p = (float)c->top_p;
    so->min_p = (float)c->min_p;
    so->seed = c->seed;
    so->repetition_penalty = (float)c->repetition_penalty;
    so->presence_penalty = (float)c->presence_penalty;
    so->frequency_penalty = (float)c->frequency_penalty;
}

int krun_cli_pcache(const krun_cli *c, krun_model *m, const char *prog, int ram, int background, krun_pcache **out, krun_err *err)
{
    krun_pcache_opts o = {c->cache_dir, c->cache_size ? (uint64_t)kargs_size(c->cache_size) : 0, background, stderr, prog};
    *out = NULL;
    if (c->no_cache || (!c->cache_dir && !ram)) return 0;
    return krun_pcache_open(m, &o, out, err);
}

/* ---- prefill progress --------------------------------------------------------------- */

/* The block the feed runs next: the same choice krun_session_feed makes. */
static size_t next_block(krun_prefill_progress *p)
{
    size_t left = p->total - p->done, b = krun_model_prompt_block(p->m, left);
    if (!krun_model_plan(p->m) || b == krun_model_block(p->m)) b = krun_model_chunk(p->m);
    return left < b ? left : b;
}

static void draw(krun_prefill_progress *p, double now)
{
    const double at = (double)p->done + (p->layers ? (double)p->block * p->layer / p->layers : 0);
    const double rate = at / (now - p->t0 + 1e-9);
    char eta[32], where[96] = "";
    p->last = now;
    kfmt_duration(p->done < p->total && rate > 0 ? ((double)p->total - at) / rate : 0, eta, sizeof eta);
    if (p->done < p->total && p->layers && p->block > 1)
        snprintf(where, sizeof where, " (a block of %zu: layer %d/%d)", p->block, p->layer, p->layers);
    fprintf(stderr, "\rprefill: %zu/%zu positions%s, %.1f positions/s, ETA %s   ", p->done, p->total, where, rate, eta);
    if (p->done == p->total) fprintf(stderr, "\r%*s\r", 100, "");
}

static void on_layer(void *ctx, int done, int n)
{
    krun_prefill_progress *p = ctx;
    double now;
    p->layer = done;
    p->layers = n;
    if (!p->draw || p->done >= p->total || (now = know()) - p->last < 0.25) return;
    draw(p, now);
}

void krun_prefill_progress_start(krun_prefill_progress *p, krun_model *m, krun_session *s, size_t total, int quiet)
{
    *p = (krun_prefill_progress){!quiet && isatty(2), quiet, know(), 0, m, 0, total, 0, 0, 0, 0};
    p->block = next_block(p);
    krun_session_set_progress(s, krun_prefill_progress_fn, p);
    krun_model_set_layer_hook(m, on_layer, p);
}

void krun_prefill_progress_end(krun_prefill_progress *p, krun_session *s)
{
    krun_session_set_progress(s, NULL, NULL);
    krun_model_set_layer_hook(p->m, NULL, NULL);
}

void krun_prefill_progress_fn(void *ctx, size_t done, size_t total)
{
    krun_prefill_progress *p = ctx;
    double now = know(), rate = done / (now - p->t0 + 1e-9);
    char eta[32];
    p->done = done;
    p->total = total;
    p->layer = 0;
    if (p->blocks++ == 0 && done < total && !p->quiet) {
        kfmt_duration((double)(total - done) / rate, eta, sizeof eta);
        fprintf(stderr, "%skrun: the first block took %.1f s: about %s for the rest of the prompt\n", p->draw ? "\r" : "",
                now - p->t0, eta);
    }
    if (done < total) p->block = next_block(p);
    if (!p->draw || (now - p->last < 0.25 && done < total)) return;
    draw(p, now);
}

void krun_announce_prompt(krun_model *m, size_t n)
{
    const kmemplan *p = krun_model_plan(m);
    size_t chunk = krun_model_chunk(m), blocks = (n + chunk - 1) / chunk;
    if (p) {
        kprompt k;
        char b1[32], b2[32], b3[32];
        kmemplan_prompt(p, n, krun_model_in_prefill(m), &k);
        if (k.blocks < 2 && !k.prefill) return;
        kfmt_bytes(k.total_bytes, b1, sizeof b1);
        kfmt_bytes(k.trunk_bytes + k.head_bytes, b2, sizeof b2);
        kfmt_bytes(k.expert_bytes, b3, sizeof b3);
        fprintf(stderr, "krun: the prompt is %zu tokens: %zu block%s of up to %zu positions (%s layout), reading about %s "
                "(trunk %s, experts %s: %.0f expected reads)%s\n", n, k.blocks, k.blocks == 1 ? "" : "s", k.block,
                k.prefill ? "the prefill" : "the decoding", b1, b2, b3, k.experts,
                k.switch_bytes ? ", and the lent layers again when decoding resumes" : "");
    } else if (blocks >= 2) {
        fprintf(stderr, "krun: the prompt is %zu tokens: %zu blocks of %zu positions\n", n, blocks, chunk);
    }
}

void krun_cli_file_warning(const char *prog, const krun_model *m)
{
    if (krun_model_warning(m))
        fprintf(stderr, "%s: warning: %s; the backup is intact and describes the same file, so krun goes on (FORMAT.md "
                "section 3), but the file needs repair: copy it again or convert it again (kpack verify reports it, exit 1)\n", prog,
                krun_model_warning(m));
}

/* The model's name in the API: the file's name without its directory and .kpk. */
void krun_cli_model_name(const char *path, char *out, size_t len)
{
    const char *b = strrchr(path, '/');
    size_t n;
    b = b ? b + 1 : path;
    n = strlen(b);
    if (n > 4 && !strcmp(b + n - 4, ".kpk")) n -= 4;
    snprintf(out, len, "%.*s", (int)n, b);
}
