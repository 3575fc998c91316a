/* k3synth: write a synthetic Kimi K3 checkpoint in the exact released format.
 * See tests/synth/README.md and `k3synth --help`. */
#include "synth.h"

#include "format/kio.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char USAGE[] =
    "usage: k3synth OUTDIR [options]\n"
    "Writes a synthetic Kimi K3 checkpoint in the released format: config.json, safetensors\n"
    "shards model-NNNNN-of-0000MM.safetensors + model.safetensors.index.json, tiktoken.model\n"
    "and tokenizer_config.json.\n"
    "\n"
    "  --geometry tiny|slice|micro  tiny: the 13-layer oracle geometry (hidden 128, vocab 256, 8 experts,\n"
    "                         top-2; default).  slice: full K3 widths (hidden 7168, 96x128 KDA,\n"
    "                         96-head MLA, 3072-wide MXFP4 experts) with 2 layers, 64 experts,\n"
    "                         top-4 and vocab 32768 unless overridden (about 5 GB).  micro: the\n"
    "                         smallest that exercises every tensor kind (hidden 32, 2 layers,\n"
    "                         2 experts; about 50 kB): seeds for the fuzzers\n"
    "  --seed N               weights seed (default 1); same options -> identical bytes\n"
    "  --shards N             number of shard files (default: one per layer plus one for the\n"
    "                         globals, as released; layers are never split across shards)\n"
    "  --layers N             layer count (MLA layers then default to the K3 pattern: every\n"
    "                         4th, 1-based, plus the last)\n"
    "  --experts N            routed experts per MoE layer\n"
    "  --topk K               experts per token\n"
    "  --full-attn 4,8,..     MLA layers, 1-based (the rest are KDA)\n"
    "  --attn-res-block N     AttnRes block size\n"
    "  --first-dense N        leading dense-FFN layers (first_k_dense_replace)\n"
    "  --vocab N              vocabulary size (>= 256; specials at the top ids from 272 up)\n"
    "  --tokenizer FILE       copy this real tiktoken.model and add the 256 K3 specials\n"
    "                         (vocab becomes ranks + 256 = 163840 for the real file)\n"
    "  --flat-config          config.json in the flat fixture shape instead of the nested one\n"
    "  --single-file          one model.safetensors, no index\n"
    "  --fixture-dtypes       the oracle fixture's dtypes (norms, AttnRes vectors, router gate\n"
    "                         and bias, latent norm as F32) instead of the release dtypes\n"
    "  --virtual              the full released checkpoint as sparse files: 96 shards with the\n"
    "                         released sizes (1.56 TB apparent, almost no disk), real headers\n"
    "  --vision               add a few non-text tensors (vision_tower.*, mm_projector.*: BF16\n"
    "                         and F32) in one more shard of their own, as released\n"
    "  --mxfp4 uniform|quantized  MXFP4 experts: codes uniform over the 16 nibbles (default),\n"
    "                         or heavy-tailed weights quantised as a real MXFP4 checkpoint is\n"
    "                         (its code and scale statistics; for compression measurements)\n"
    "  --logit-gain G         lm_head's weights G times larger (1..64; default 1: logits of std ~3):\n"
    "                         a peaked next-token distribution, as a trained model's, so sampled\n"
    "                         text repeats (speculative decoding at a temperature)\n"
    "  --end-weight W         replies that end: every embedding holds 8 in channel 0, which lm_head's\n"
    "                         <|end_of_msg|> row reads with weight W (1..64): a chat reply ends after\n"
    "                         a few tokens (the agent CLIs' tests; a random model otherwise never ends)\n"
    "  --routing skewed|flat  router correction bias uniform in +-0.3 (default: a large pool's\n"
    "                         choices concentrate on a few hundred experts), or none: every\n"
    "                         expert chosen about equally often, as the release's balanced\n"
    "                         routing (for prompt-block and batch measurements)\n"
    "  --threads N            generator threads (default: online CPUs; output is identical)\n"
    "\n"
    "A drafter (Kimi K3's EAGLE-3.1 MLA drafter, ../shared/spec/K3_EAGLE.md) instead of a model:\n"
    "  --drafter              write config.json + model.safetensors of a drafter in the released\n"
    "                         layout, for the target given by --target DIR (its config.json: hidden\n"
    "                         size, vocabulary, layers) or by --geometry tiny|slice|release (release:\n"
    "                         the full-size drafter, 20 tensors, 6,031,253,592 bytes); its embedding\n"
    "                         is the target's with the same --seed, as the release's is\n"
    "  --heads N --q-lora N --kv-lora N --nope N --rope N --v-head N --inter N\n"
    "                         its widths (default: the release's at hidden 7168, else 3, 48, 40, 16,\n"
    "                         8, 24, 160)\n"
    "  --taps 2,46,90         the target layers it reads, one-based completed-layer ids as exported\n"
    "                         (default: [2,46,90] for 93 layers, else vLLM's (2, N/2, N-3))\n"
    "  --rope-theta X --yarn-factor X --yarn-orig N   its rope (default 50000, 32, 32768; factor 0:\n"
    "                         plain RoPE, no rope_scaling)\n"
    "  --force                write into a non-empty OUTDIR (replacing earlier k3synth files)\n"
    "  --quiet                no progress and no summary\n"
    "  --help                 this text\n";

typedef struct opts {
    const char *outdir;
    int geometry;           /* 0 tiny, 1 slice, 2 micro */
    int geometry_set;
    uint64_t seed;
    int shards;             /* 0 = default */
    int layers, experts, topk, block, first_dense, vocab; /* -1 = default */
    const char *full_attn;
    const char *tokenizer;
    int flat, single, fixture, virt, vision, force, quiet, threads;
    int mxfp4;              /* SYNTH_MXFP4_* */
    int routing;            /* SYNTH_ROUTING_* */
    int logit_gain;         /* --logit-gain */
    int end_weight;         /* --end-weight */
    /* --drafter */
    int drafter, release;
    const char *target, *taps;
    int d_heads, d_qlora, d_kvlora, d_nope, d_rope, d_vhead, d_inter;   /* 0: default */
    double rope_theta, yarn_factor;   /* -1: default */
    int yarn_orig;
} opts;

static void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die_usage(const char *fmt, ...)
{
    va_list ap;
    fputs("k3synth: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs(" (see k3synth --help)\n", stderr);
    exit(2);
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    fputs("k3synth: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static long long parse_ll(const char *opt, const char *s, long long lo, long long hi)
{
    char *end;
    long long v;
    errno = 0;
    if (!s || !*s) die_usage("%s needs a value", opt);
    v = strtoll(s, &end, 10);
    if (errno || *end || end == s) die_usage("%s: '%s' is not an integer", opt, s);
    if (v < lo || v > hi) die_usage("%s must be between %lld and %lld (got %lld)", opt, lo, hi, v);
    return v;
}

static void parse_args(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    o->seed = 1;
    o->layers = o->experts = o->topk = o->block = o->first_dense = o->vocab = -1;
    o->rope_theta = o->yarn_factor = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        char name[64];
        const char *eq;
        if (a[0] != '-' || a[1] == 0) {
            if (o->outdir) die_usage("more than one OUTDIR ('%s' and '%s')", o->outdir, a);
            o->outdir = a;
            continue;
        }
        /* --opt=value or --opt value */
        eq = strchr(a, '=');
        if (eq && (size_t)(eq - a) < sizeof name) {
            memcpy(name, a, (size_t)(eq - a));
            name[eq - a] = 0;
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", a);
        }
#define FLAG(s, field) if (strcmp(name, s) == 0) { if (val) die_usage("%s takes no value", s); o->field = 1; continue; }
#define VALUE() (val ? val : (i + 1 < argc ? argv[++i] : (die_usage("%s needs a value", name), "")))
        if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) { fputs(USAGE, stdout); exit(0); }
        FLAG("--flat-config", flat)
        FLAG("--single-file", single)
        FLAG("--fixture-dtypes", fixture)
        FLAG("--virtual", virt)
        FLAG("--vision", vision)
        FLAG("--force", force)
        FLAG("--quiet", quiet)
        FLAG("--drafter", drafter)
        if (strcmp(name, "--geometry") == 0) {
            const char *g = VALUE();
            if (strcmp(g, "tiny") == 0) o->geometry = 0;
            else if (strcmp(g, "slice") == 0) o->geometry = 1;
            else if (strcmp(g, "micro") == 0) o->geometry = 2;
            else if (strcmp(g, "release") == 0) o->release = 1;
            else die_usage("--geometry must be tiny, slice or micro (or release, for --drafter; got '%s')", g);
            o->geometry_set = 1;
        } else if (strcmp(name, "--seed") == 0) {
            const char *s = VALUE();
            char *end;
            errno = 0;
            if (!*s || *s == '-') die_usage("--seed: '%s' is not a non-negative integer", s);
            o->seed = strtoull(s, &end, 10);
            if (errno || *end) die_usage("--seed: '%s' is not a non-negative integer", s);
        } else if (strcmp(name, "--shards") == 0) {
            o->shards = (int)parse_ll(name, VALUE(), 1, 65535);
        } else if (strcmp(name, "--layers") == 0) {
            o->layers = (int)parse_ll(name, VALUE(), 1, K3_MAX_LAYERS);
        } else if (strcmp(name, "--experts") == 0) {
            o->experts = (int)parse_ll(name, VALUE(), 1, 1 << 16);
        } else if (strcmp(name, "--topk") == 0) {
            o->topk = (int)parse_ll(name, VALUE(), 1, 64);
        } else if (strcmp(name, "--attn-res-block") == 0) {
            o->block = (int)parse_ll(name, VALUE(), 1, K3_MAX_LAYERS);
        } else if (strcmp(name, "--first-dense") == 0) {
            o->first_dense = (int)parse_ll(name, VALUE(), 0, K3_MAX_LAYERS);
        } else if (strcmp(name, "--vocab") == 0) {
            o->vocab = (int)parse_ll(name, VALUE(), 256, 1 << 20);
        } else if (strcmp(name, "--threads") == 0) {
            o->threads = (int)parse_ll(name, VALUE(), 1, 64);
        } else if (strcmp(name, "--full-attn") == 0) {
            o->full_attn = VALUE();
        } else if (strcmp(name, "--tokenizer") == 0) {
            o->tokenizer = VALUE();
        } else if (strcmp(name, "--mxfp4") == 0) {
            const char *m = VALUE();
            if (strcmp(m, "uniform") == 0) o->mxfp4 = SYNTH_MXFP4_UNIFORM;
            else if (strcmp(m, "quantized") == 0) o->mxfp4 = SYNTH_MXFP4_QUANTIZED;
            else die_usage("--mxfp4 must be uniform or quantized (got '%s')", m);
        } else if (strcmp(name, "--logit-gain") == 0) {
            o->logit_gain = (int)parse_ll(name, VALUE(), 1, 64);
        } else if (strcmp(name, "--end-weight") == 0) {
            o->end_weight = (int)parse_ll(name, VALUE(), 1, 64);
        } else if (strcmp(name, "--target") == 0) {
            o->target = VALUE();
        } else if (strcmp(name, "--taps") == 0) {
            o->taps = VALUE();
        } else if (strcmp(name, "--heads") == 0) {
            o->d_heads = (int)parse_ll(name, VALUE(), 1, 1024);
        } else if (strcmp(name, "--q-lora") == 0) {
            o->d_qlora = (int)parse_ll(name, VALUE(), 1, 65536);
        } else if (strcmp(name, "--kv-lora") == 0) {
            o->d_kvlora = (int)parse_ll(name, VALUE(), 1, 65536);
        } else if (strcmp(name, "--nope") == 0) {
            o->d_nope = (int)parse_ll(name, VALUE(), 1, 1024);
        } else if (strcmp(name, "--rope") == 0) {
            o->d_rope = (int)parse_ll(name, VALUE(), 2, 1024);
        } else if (strcmp(name, "--v-head") == 0) {
            o->d_vhead = (int)parse_ll(name, VALUE(), 1, 1024);
        } else if (strcmp(name, "--inter") == 0) {
            o->d_inter = (int)parse_ll(name, VALUE(), 1, 1 << 20);
        } else if (strcmp(name, "--rope-theta") == 0) {
            o->rope_theta = (double)parse_ll(name, VALUE(), 2, 1000000000);
        } else if (strcmp(name, "--yarn-factor") == 0) {
            o->yarn_factor = (double)parse_ll(name, VALUE(), 0, 1 << 20);
        } else if (strcmp(name, "--yarn-orig") == 0) {
            o->yarn_orig = (int)parse_ll(name, VALUE(), 1, 1 << 30);
        } else if (strcmp(name, "--routing") == 0) {
            const char *m = VALUE();
            if (strcmp(m, "skewed") == 0) o->routing = SYNTH_ROUTING_SKEWED;
            else if (strcmp(m, "flat") == 0) o->routing = SYNTH_ROUTING_FLAT;
            else die_usage("--routing must be skewed or flat (got '%s')", m);
        } else {
            die_usage("unknown option '%s'", a);
        }
#undef FLAG
#undef VALUE
    }
    if (!o->outdir) die_usage("missing OUTDIR");
    if (!o->drafter && (o->target || o->taps || o->release || o->d_heads || o->d_inter || o->rope_theta >= 0 || o->yarn_factor >= 0))
        die_usage("--target, --taps, --geometry release and the drafter's widths go with --drafter");
    if (o->drafter && o->target && (o->geometry_set || o->release))
        die_usage("--drafter takes its target from --target DIR or --geometry, not both");
    if (o->virt && !o->drafter) {
        const char *bad = o->geometry_set ? "--geometry" : o->layers >= 0 ? "--layers" : o->experts >= 0 ? "--experts"
                        : o->topk >= 0 ? "--topk" : o->block >= 0 ? "--attn-res-block"
                        : o->first_dense >= 0 ? "--first-dense" : o->vocab >= 0 ? "--vocab"
                        : o->full_attn ? "--full-attn" : o->shards ? "--shards" : o->single ? "--single-file"
                        : o->fixture ? "--fixture-dtypes" : o->vision ? "--vision (it has its own vision shards)" : NULL;
        if (bad) die_usage("--virtual writes the released geometry and layout; it cannot be combined with %s", bad);
    }
    if (o->single && o->shards > 1) die_usage("--single-file and --shards %d contradict each other", o->shards);
}

/* ---- geometry ------------------------------------------------------------- */

static void k3_pattern(synth_geom *g)
{
    g->n_full = 0;
    for (int L = 4; L < g->layers; L += 4) g->full_attn[g->n_full++] = L;
    g->full_attn[g->n_full++] = g->layers;
}

static void build_geometry(const opts *o, synth_geom *g)
{
    memset(g, 0, sizeof *g);
    g->eps = 1e-5; g->lb = -5.0; g->beta1 = 4.0; g->beta2 = 25.0; g->rscale = 1.0;
    g->conv = 4; g->first_dense = 1;
    if (o->virt || o->geometry == 1) { /* full K3 widths */
        g->hidden = 7168; g->kda_heads = 96; g->kda_dim = 128;
        g->mla_heads = 96; g->q_lora = 1536; g->kv_lora = 512; g->nope = 128; g->rope = 64; g->vdim = 128;
        g->shared = 2; g->latent = 3584; g->moe_inter = 3072; g->dense_inter = 33792; g->block = 12;
        if (o->virt) { g->layers = 93; g->experts = 896; g->topk = 16; g->vocab = 163840; }
        else { g->layers = 2; g->experts = 64; g->topk = 4; g->vocab = 32768; }
    } else if (o->geometry == 2) { /* micro: every role, smallest widths (fuzz seeds) */
        g->hidden = 32; g->layers = 2; g->vocab = 256; g->kda_heads = 2; g->kda_dim = 8;
        g->mla_heads = 2; g->q_lora = 16; g->kv_lora = 8; g->nope = 8; g->rope = 4; g->vdim = 8;
        g->experts = 2; g->topk = 1; g->shared = 1; g->latent = 32; g->moe_inter = 32; g->dense_inter = 32;
        g->block = 1;
    } else { /* the oracle geometry (spec §7, moe_intermediate 64) */
        g->hidden = 128; g->layers = 13; g->vocab = 256; g->kda_heads = 4; g->kda_dim = 16;
        g->mla_heads = 4; g->q_lora = 64; g->kv_lora = 32; g->nope = 24; g->rope = 8; g->vdim = 16;
        g->experts = 8; g->topk = 2; g->shared = 2; g->latent = 64; g->moe_inter = 64; g->dense_inter = 96;
        g->block = 3;
    }
    if (o->layers > 0) g->layers = o->layers;
    if (o->experts > 0) g->experts = o->experts;
    if (o->topk > 0) g->topk = o->topk;
    if (o->block > 0) g->block = o->block;
    if (o->first_dense >= 0) g->first_dense = o->first_dense;
    if (o->vocab > 0) g->vocab = o->vocab;
    if (o->full_attn) {
        const char *p = o->full_attn;
        while (*p) {
            char *end;
            long v;
            errno = 0;
            v = strtol(p, &end, 10);
            if (end == p || errno || v < 1 || v > K3_MAX_LAYERS || (*end && *end != ','))
                die_usage("--full-attn '%s': expected a comma-separated list of 1-based layer numbers", o->full_attn);
            if (g->n_full >= K3_MAX_LAYERS) die_usage("--full-attn: too many layers");
            g->full_attn[g->n_full++] = (int)v;
            p = *end ? end + 1 : end;
        }
        if (g->n_full == 0) die_usage("--full-attn must list at least one layer");
    } else {
        k3_pattern(g);
    }
}

/* ---- output directory ----------------------------------------------------- */

static const char *const OURS[] = {
    "config.json", "tiktoken.model", "tokenizer_config.json", "model.safetensors", "model.safetensors.index.json",
    "model-*-of-*.safetensors",
};

static int is_ours(const char *name)
{
    for (size_t i = 0; i < sizeof OURS / sizeof OURS[0]; i++)
        if (fnmatch(OURS[i], name, 0) == 0) return 1;
    return 0;
}

static void mkdir_p(const char *path)
{
    char tmp[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof tmp) die("OUTDIR '%s': bad path", path);
    memcpy(tmp, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (tmp[i] == '/' || tmp[i] == 0) {
            char c = tmp[i];
            tmp[i] = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST) die("cannot create %s: %s", tmp, strerror(errno));
            tmp[i] = c;
        }
    }
}

static void prepare_outdir(const opts *o)
{
    struct stat st;
    DIR *d;
    struct dirent *e;
    int nonempty = 0;
    if (stat(o->outdir, &st) != 0) {
        if (errno != ENOENT) die("OUTDIR %s: %s", o->outdir, strerror(errno));
        mkdir_p(o->outdir);
        return;
    }
    if (!S_ISDIR(st.st_mode)) die("OUTDIR %s exists and is not a directory", o->outdir);
    d = opendir(o->outdir);
    if (!d) die("OUTDIR %s: %s", o->outdir, strerror(errno));
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        nonempty = 1;
        if (o->force && is_ours(e->d_name)) {
            char p[PATH_MAX];
            if (snprintf(p, sizeof p, "%s/%s", o->outdir, e->d_name) >= (int)sizeof p) die("path too long");
            if (unlink(p) != 0) die("cannot remove %s: %s", p, strerror(errno));
        }
    }
    closedir(d);
    if (nonempty && !o->force) die("OUTDIR %s is not empty; use --force to write into it anyway", o->outdir);
}

/* ---- shards ---------------------------------------------------------------- */

static void spec_to_tensor(const k3_tensor_spec *s, int fixture, synth_tensor *t)
{
    memset(t, 0, sizeof *t);
    memcpy(t->name, s->name, sizeof t->name);
    t->role = (int)s->role;
    t->layer = s->layer;
    t->expert = s->expert;
    t->release_dtype = s->release_dtype;
    t->dtype = fixture ? synth_fixture_dtype(t->role, s->release_dtype) : s->release_dtype;
    t->ndim = s->ndim;
    t->nbytes = kpk_dtype_size(t->dtype);
    for (int i = 0; i < s->ndim; i++) {
        t->shape[i] = s->shape[i];
        t->nbytes *= s->shape[i];
    }
}

/* Tensors of one unit: layer L (trunk then experts), or the globals (L == -1). */
static size_t unit_tensors(const k3_config *cfg, int L, int fixture, synth_tensor *out)
{
    k3_tensor_spec s;
    size_t n = 0;
    if (L < 0) {
        for (int r = K3T_EMBED; r <= K3T_OUT_RES_PROJ; r++)
            if (k3_schema_spec(cfg, (k3_role)r, -1, -1, &s) == 0) spec_to_tensor(&s, fixture, &out[n++]);
        return n;
    }
    {
        k3_role roles[K3T_COUNT];
        int nr = k3_schema_layer_roles(cfg, L, roles);
        for (int i = 0; i < nr; i++)
            if (k3_schema_spec(cfg, roles[i], L, -1, &s) == 0) spec_to_tensor(&s, fixture, &out[n++]);
    }
    if (k3_layer_is_moe(cfg, L))
        for (int e = 0; e < cfg->n_experts; e++)
            for (int r = K3T_EXP_W1_PACKED; r <= K3T_EXP_W3_SCALE; r++)
                if (k3_schema_spec(cfg, (k3_role)r, L, e, &s) == 0) spec_to_tensor(&s, fixture, &out[n++]);
    return n;
}

static size_t unit_count_max(const k3_config *cfg) { return (size_t)K3T_COUNT + (size_t)cfg->n_experts * 6; }

static uint64_t unit_bytes(const k3_config *cfg, int L, int fixture, synth_tensor *scratch)
{
    size_t n = unit_tensors(cfg, L, fixture, scratch);
    uint64_t b = 0;
    for (size_t i = 0; i < n; i++) b += scratch[i].nbytes;
    return b;
}

/* Contiguous partition of units 0..U-1 into S non-empty groups of about equal bytes. */
static void partition(const uint64_t *b, int U, int S, int *group)
{
    uint64_t total = 0, cum = 0;
    int g = 0;
    for (int u = 0; u < U; u++) total += b[u];
    for (int u = 0; u < U; u++) {
        int rem_units = U - 1 - u, rem_groups = S - 1 - g;
        cum += b[u];
        group[u] = g;
        if (g < S - 1 && (rem_units == rem_groups || (rem_units > rem_groups && cum * (uint64_t)S >= total * (uint64_t)(g + 1))))
            g++;
    }
}

static char *dupf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *dupf(const char *fmt, ...)
{
    va_list ap;
    char buf[256];
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char *p = strdup(buf);
    if (!p) die("out of memory");
    return p;
}

/* --drafter: the target's widths and depth, the drafter's own widths, its taps. */
static int drafter_main(const opts *o)
{
    synth_drafter_geom d;
    int layers, threads = o->threads;
    memset(&d, 0, sizeof d);
    if (o->target) {
        char p[PATH_MAX], err[800], *text = NULL;
        size_t len;
        k3_config *c = calloc(1, sizeof *c);
        if (!c) die("out of memory");
        snprintf(p, sizeof p, "%s/config.json", o->target);
        if (kio_read_file(p, (size_t)1 << 20, &text, &len)) die("--target: %s: %s", p, strerror(errno));
        if (k3_config_parse(text, len, c, err, sizeof err)) die("--target: %s: %s", p, err);
        d.hidden = c->hidden; d.vocab = c->vocab; layers = c->n_layers;
        free(text);
        free(c);
    } else if (o->release) {
        d.hidden = 7168; d.vocab = 163840; layers = 93;
    } else if (o->geometry_set) {
        synth_geom *g = calloc(1, sizeof *g);
        if (!g) die("out of memory");
        build_geometry(o, g);
        d.hidden = g->hidden; d.vocab = g->vocab; layers = g->layers;
        free(g);
    } else {
        die_usage("--drafter needs its target: --target DIR or --geometry tiny|slice|release");
    }
    if (d.hidden == 7168) { d.heads = 64; d.q_lora = 1536; d.kv_lora = 512; d.nope = 128; d.rope = 64; d.vdim = 128; d.inter = 18432; }
    else { d.heads = 3; d.q_lora = 48; d.kv_lora = 40; d.nope = 16; d.rope = 8; d.vdim = 24; d.inter = 160; }
    if (o->d_heads) d.heads = o->d_heads;
    if (o->d_qlora) d.q_lora = o->d_qlora;
    if (o->d_kvlora) d.kv_lora = o->d_kvlora;
    if (o->d_nope) d.nope = o->d_nope;
    if (o->d_rope) d.rope = o->d_rope;
    if (o->d_vhead) d.vdim = o->d_vhead;
    if (o->d_inter) d.inter = o->d_inter;
    d.rope_theta = o->rope_theta >= 0 ? o->rope_theta : 50000.0;
    d.yarn_factor = o->yarn_factor >= 0 ? o->yarn_factor : 32.0;
    d.yarn_orig = o->yarn_orig ? o->yarn_orig : 32768;
    d.beta_fast = 32;
    d.beta_slow = 1;
    if (o->taps) {
        const char *p = o->taps;
        while (*p) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 1 || v > layers || (*end && *end != ',') || d.n_taps == 8 || (d.n_taps && v <= d.taps[d.n_taps - 1]))
                die_usage("--taps '%s': ascending one-based layer ids 1..%d, at most 8", o->taps, layers);
            d.taps[d.n_taps++] = (int)v;
            p = *end ? end + 1 : end;
        }
    } else {
        /* vLLM's default (2, N/2, N - 3) (K3_EAGLE §2.1), kept within 1..N and ascending */
        const int want[3] = {2, layers / 2, layers - 3};
        for (int i = 0; i < 3; i++) {
            int v = want[i] < 1 ? 1 : want[i] > layers ? layers : want[i];
            if (!d.n_taps || v > d.taps[d.n_taps - 1]) d.taps[d.n_taps++] = v;
        }
    }
    if (!threads) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        threads = nc < 1 ? 1 : (nc > 16 ? 16 : (int)nc);
    }
    prepare_outdir(o);
    return synth_drafter_write(o->outdir, &d, o->seed, o->virt, threads, !o->quiet && isatty(2), o->quiet) ? 1 : 0;
}

int main(int argc, char **argv)
{
    opts o;
    synth_geom *g = calloc(1, sizeof *g);
    k3_config *cfg = calloc(1, sizeof *cfg);
    synth_tok tok;
    synth_writer w;
    synth_index ix;
    char err[1024] = "", path[PATH_MAX];
    char *cjson = NULL;
    size_t clen = 0;
    int U, S, T;
    int *group = NULL;
    uint64_t *ubytes = NULL;
    synth_tensor *t = NULL;
    size_t tcap;
    const double t0 = synth_now();

    if (!g || !cfg) die("out of memory");
    parse_args(argc, argv, &o);
    if (o.drafter) {
        free(g);
        free(cfg);
        return drafter_main(&o);
    }
    build_geometry(&o, g);

    /* tokenizer decides the vocabulary when a real rank file is given */
    if (synth_tok_plan(g->vocab, o.tokenizer, &tok, err, sizeof err) != 0) die("%s", err);
    if (o.tokenizer) {
        int v = tok.n_ranks + tok.n_specials;
        if (o.vocab > 0 && o.vocab != v)
            die_usage("--vocab %d contradicts --tokenizer (%d ranks + 256 specials = %d)", o.vocab, tok.n_ranks, v);
        g->vocab = v;
    }

    /* the config we write is the config we generate from: parse it back */
    if (synth_config_json(g, &tok, o.flat, &cjson, &clen) != 0) die("cannot build config.json");
    if (k3_config_parse(cjson, clen, cfg, err, sizeof err) != 0) die_usage("invalid geometry: %s", err);

    U = cfg->n_layers + 1; /* units: the layers, then the globals */
    if (o.virt) S = 96;
    else if (o.single) S = 1;
    else S = o.shards ? o.shards : U;
    if (!o.virt && S > U)
        die_usage("--shards %d: this geometry has %d layers plus the globals, so at most %d shards", S,
                  cfg->n_layers, U);
    T = S + (o.vision && !o.single); /* files: the text shards, then the vision shard */

    prepare_outdir(&o);
    snprintf(path, sizeof path, "%s/config.json", o.outdir);
    if (synth_write_file(path, cjson, clen, err, sizeof err) != 0) die("%s", err);
    if (synth_tok_write(o.outdir, o.tokenizer, &tok, err, sizeof err) != 0) die("%s", err);

    memset(&w, 0, sizeof w);
    memset(&ix, 0, sizeof ix);
    w.cfg = cfg;
    w.seed = o.seed;
    w.virt = o.virt;
    w.draw.mxfp4 = o.mxfp4;
    w.draw.routing = o.routing;
    w.draw.logit_gain = o.logit_gain;
    w.draw.end_weight = o.end_weight;
    w.draw.end_id = tok.eos_id;
    if (o.end_weight && tok.eos_id < 0) die_usage("--end-weight needs a vocabulary with <|end_of_msg|> (%s)", "--vocab 272 or more");
    w.progress = !o.quiet && isatty(2);
    w.threads = o.threads;
    if (!w.threads) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        w.threads = nc < 1 ? 1 : (nc > 16 ? 16 : (int)nc);
    }
    w.t_start = t0;

    tcap = unit_count_max(cfg) * 2; /* one shard's tensors at a time; grown on demand */
    t = malloc(tcap * sizeof *t);
    group = malloc((size_t)U * sizeof *group);
    ubytes = malloc((size_t)U * sizeof *ubytes);
    if (!t || !group || !ubytes) die("out of memory");
    for (int u = 0; u < U; u++) {
        ubytes[u] = unit_bytes(cfg, u < cfg->n_layers ? u : -1, o.fixture, t);
        w.grand_total += ubytes[u];
    }
    if (o.virt) {
        for (int u = 0; u < U; u++) group[u] = u; /* released: shard k = layer k-1, then the globals */
    } else {
        partition(ubytes, U, S, group);
    }

    ix.n_shards = (size_t)T;
    ix.shard_names = calloc((size_t)T, sizeof *ix.shard_names);
    if (!ix.shard_names) die("out of memory");
    for (int s = 0; s < T; s++)
        ix.shard_names[s] = o.single ? dupf("model.safetensors") : dupf("model-%05d-of-%06d.safetensors", s + 1, T);

    for (int s = 0, u = 0; s < T; s++) {
        size_t n = 0;
        uint64_t data;
        if (o.virt && s >= U) { /* the two invented vision shards */
            static const uint64_t vsize[2] = {92289328ull, 802448352ull};
            synth_tensor *vt;
            if (synth_vision_shard(s - U, vsize[s - U], &vt, &n, &data, err, sizeof err) != 0) die("%s", err);
            snprintf(path, sizeof path, "%s/%s", o.outdir, ix.shard_names[s]);
            if (synth_write_safetensors(&w, path, vt, n, data, err, sizeof err) != 0) die("%s", err);
            for (size_t i = 0; i < n; i++) {
                if (synth_index_add(&ix, vt[i].name, (uint16_t)s) != 0) die("out of memory");
                ix.total_size += vt[i].nbytes;
            }
            free(vt);
            continue;
        }
        for (; u < U && group[u] == s; u++) {
            size_t need = n + unit_count_max(cfg);
            if (need > tcap) {
                synth_tensor *nt = realloc(t, need * 2 * sizeof *t);
                if (!nt) die("out of memory");
                t = nt;
                tcap = need * 2;
            }
            n += unit_tensors(cfg, u < cfg->n_layers ? u : -1, o.fixture, t + n);
        }
        if (o.vision && s == T - 1) {
            if (n + SYNTH_VISION_SMALL > tcap) {
                synth_tensor *nt = realloc(t, (n + SYNTH_VISION_SMALL) * sizeof *t);
                if (!nt) die("out of memory");
                t = nt;
                tcap = n + SYNTH_VISION_SMALL;
            }
            n += synth_vision_small(t + n);
        }
        data = synth_layout(t, n);
        snprintf(path, sizeof path, "%s/%s", o.outdir, ix.shard_names[s]);
        if (synth_write_safetensors(&w, path, t, n, data, err, sizeof err) != 0) die("%s", err);
        for (size_t i = 0; i < n; i++) {
            if (!o.single && synth_index_add(&ix, t[i].name, (uint16_t)s) != 0) die("out of memory");
            ix.total_size += t[i].nbytes;
        }
    }
    if (w.progress) fputc('\n', stderr);
    if (!o.single) {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", o.outdir);
        if (synth_index_write(&ix, path, err, sizeof err) != 0) die("%s", err);
    }
    if (!o.quiet) {
        double el = synth_now() - t0;
        uint64_t tensors = w.tensors_written;
        printf("k3synth: %s: %llu safetensors file%s, %llu tensors, %.3f GB %s in %.2f s",
               o.outdir, (unsigned long long)w.files_written, w.files_written == 1 ? "" : "s",
               (unsigned long long)tensors, (double)w.apparent_bytes / 1e9,
               o.virt ? "apparent (sparse)" : "written", el);
        if (!o.virt && el > 0) printf(" (%.0f MB/s)", (double)w.bytes_written / el / 1e6);
        printf("\n");
        if (fflush(stdout) != 0) die("stdout: %s", strerror(errno));
    }
    synth_index_free(&ix);
    free(t);
    free(group);
    free(ubytes);
    free(cjson);
    free(cfg);
    free(g);
    return 0;
}
