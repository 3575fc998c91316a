/* kpack on a drafter checkpoint (drafter.h). */
#include "drafter.h"

#include "archive.h"
#include "cli.h"
#include "format/kio.h"
#include "format/kprogress.h"

#include <errno.h>
#include <openssl/sha.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define KD_CONFIG_MAX ((size_t)1 << 20)

static char *join(const char *dir, const char *name)
{
    char *p;
    return asprintf(&p, "%s/%s", dir, name) < 0 ? NULL : p;
}

int kd_is_drafter_dir(const char *dir)
{
    char *p = join(dir, "config.json"), *text = NULL;
    size_t len;
    json_t *root, *tc, *arch;
    int yes = 0;
    if (!p) { errno = ENOMEM; return -1; }
    if (kio_read_file(p, KD_CONFIG_MAX, &text, &len) != 0) {
        /* none, or too large for a drafter's: a model's problem to name; anything else is the
         * disk's, said here (a second read might succeed and hide it) */
        int e = errno;
        free(p);
        if (e == ENOENT || e == EFBIG || e == ENOTDIR) return 0;
        errno = e;
        return -1;
    }
    if ((root = json_loadb(text, len, 0, NULL))) {
        tc = json_object_get(root, "text_config");
        arch = json_object_get(root, "architectures");
        yes = json_object_get(root, "eagle_config") || (json_is_object(tc) && json_object_get(tc, "eagle_config"));
        if (json_is_array(arch) && json_is_string(json_array_get(arch, 0)) && strstr(json_string_value(json_array_get(arch, 0)), "Eagle"))
            yes = 1;
        json_decref(root);
    }
    free(text);
    free(p);
    return yes;
}

/* A problem of the weights file (shard 0) or of the directory (general). */
static void problem(kd_source *d, int general, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void problem(kd_source *d, int general, const char *fmt, ...)
{
    char **list = general ? d->src.general : d->src.shards[0].problems;
    size_t *n = general ? &d->src.n_general : &d->src.shards[0].n_problems;
    va_list ap;
    char *msg = NULL;
    va_start(ap, fmt);
    if (vasprintf(&msg, fmt, ap) < 0) msg = NULL;
    va_end(ap);
    if (*n < KS_MAX_PROBLEMS) list[*n] = msg;
    else free(msg);
    (*n)++;
}

static void hex(const unsigned char *md, char out[65])
{
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
}

/* The header against the roster: every name in it, nothing else, BF16, the config's shape. */
static void check_roster(kd_source *d)
{
    const st_file *st = &d->src.shards[0].st;
    const int n = k3e_count(&d->cfg);
    for (int i = 0; i < n; i++) d->loc[i] = UINT32_MAX;
    for (size_t k = 0; k < st->n; k++) {
        const st_tensor *t = &st->t[k];
        int i = k3e_find(&d->cfg, t->name);
        k3e_spec s;
        char got[80], want[80];
        if (i < 0) {
            problem(d, 0, "tensor %s is not in the K3 EAGLE-3.1 drafter's roster (K3_EAGLE.md §1.3: another drafter design, or "
                    "a draft vocabulary map)", t->name);
            continue;
        }
        k3e_at(&d->cfg, i, &s);
        d->loc[i] = (uint32_t)k;
        k3e_shape_str(t->ndim > 4 ? 4 : t->ndim, t->shape, got, sizeof got);
        k3e_shape_str(s.ndim, s.shape, want, sizeof want);
        if (t->dtype != K3E_DTYPE || t->ndim != s.ndim || memcmp(t->shape, s.shape, sizeof(uint64_t) * (size_t)s.ndim))
            problem(d, 0, "tensor %s is %s %s; the config implies BF16 %s", t->name, t->st_dtype, got, want);
    }
    for (int i = 0; i < n; i++)
        if (d->loc[i] == UINT32_MAX) {
            k3e_spec s;
            k3e_at(&d->cfg, i, &s);
            problem(d, 0, "tensor %s is missing", s.name);
        }
    d->src.shards[0].n_tensors = st->n;
}

static int read_config(kd_source *d, char *err, size_t errlen)
{
    char *p = join(d->src.dir, "config.json"), cerr[700];
    ks_extra *x = &d->src.extras[0];
    unsigned char md[32];
    if (!p) { snprintf(err, errlen, "out of memory"); return -1; }
    if (kio_read_file(p, KD_CONFIG_MAX, &x->data, &x->len)) {
        if (ks_is_io_errno(errno)) d->src.io_errno = errno;
        snprintf(err, errlen, "%s: %s", p, strerror(errno));
        free(p);
        return -1;
    }
    free(p);
    x->name = "config.json";
    d->src.n_extras = 1;
    SHA256((const unsigned char *)x->data, x->len, md);
    hex(md, d->config_sha);
    if (k3e_config_parse(x->data, x->len, &d->cfg, cerr, sizeof cerr)) problem(d, 1, "config.json: %s", cerr);
    else d->src.have_cfg = 1;
    return 0;
}

/* The pinned digests (K3_EAGLE §1.2); a test may stand its own files in for the release's
 * (KPACK_TEST_PINNED=CONFIG_SHA:WEIGHTS_SHA), which nobody else can produce. */
static void pinned_digests(char cfg[65], char weights[65])
{
    const char *t = getenv("KPACK_TEST_PINNED");
    if (t && strlen(t) == 129 && t[64] == ':') {
        memcpy(cfg, t, 64);
        memcpy(weights, t + 65, 64);
        cfg[64] = weights[64] = 0;
        return;
    }
    memcpy(cfg, K3E_RELEASE_CONFIG_SHA256, 65);
    memcpy(weights, K3E_RELEASE_WEIGHTS_SHA256, 65);
}

/* The expected SHA-256 of a file: from --sha256, or an HF blob's name. */
static const char *expected(const ks_sum *sums, size_t n, const char *name, const char *path, char out[65], const char **from)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(sums[i].name, name) == 0) { memcpy(out, sums[i].sha, 65); *from = "--sha256"; return out; }
    if (ks_hf_blob_sha(path, out)) { *from = "hf-blob"; return out; }
    out[0] = 0;
    return NULL;
}

int kd_open(const char *dir, const char *sums_path, int progress, kd_source *d, char *err, size_t errlen)
{
    ks_shard *sh;
    struct stat sb;
    char cerr[800], want_cfg[65];
    const char *cfg_from = NULL;
    ks_sum *sums = NULL;
    size_t n_sums = 0;
    memset(d, 0, sizeof *d);
    if (!(d->src.dir = strdup(dir)) || !(d->src.shards = calloc(1, sizeof *d->src.shards))) { snprintf(err, errlen, "out of memory"); return -1; }
    d->src.n_shards = 1;
    d->src.single_file = 1;
    sh = &d->src.shards[0];
    if (!(sh->name = strdup("model.safetensors")) || !(sh->path = join(dir, sh->name))) { snprintf(err, errlen, "out of memory"); return -1; }
    if (read_config(d, err, errlen)) return -1;
    if (sums_path && ks_sums_read(sums_path, &sums, &n_sums, err, errlen)) return -1;
    if (stat(sh->path, &sb)) {
        if (ks_is_io_errno(errno)) sh->io_errno = errno;
        problem(d, 0, "%s: %s (a drafter is one model.safetensors and its config.json)", sh->path, strerror(errno));
        ks_sums_free(sums, n_sums);
        return 0;
    }
    sh->present = 1;
    sh->size = (uint64_t)sb.st_size;
    sh->alloc_bytes = (uint64_t)sb.st_blocks * 512;
    sh->mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
    d->src.total_bytes = sh->size;
    if (st_open(sh->path, &sh->st, cerr, sizeof cerr)) {
        if (ks_is_io_errno(sh->st.io_errno)) sh->io_errno = sh->st.io_errno;
        problem(d, 0, "%s", cerr);
    } else {
        sh->parsed = 1;
        if (sh->st.expected_size > sh->size)
            problem(d, 0, "%llu bytes, but its header describes %llu: an unfinished download",
                    (unsigned long long)sh->size, (unsigned long long)sh->st.expected_size);
        if (d->src.have_cfg) check_roster(d);
    }
    /* SHA-256 of both, always: the pinned revision is recognised by them (K3_EAGLE §1.2) */
    expected(sums, n_sums, sh->name, sh->path, sh->expect_sha, &sh->sha_from);
    {
        char *cp = join(dir, "config.json");
        if (cp && expected(sums, n_sums, "config.json", cp, want_cfg, &cfg_from) && strcmp(want_cfg, d->config_sha))
            problem(d, 1, "config.json: SHA-256 %s, %s says %s", d->config_sha, cfg_from, want_cfg);
        free(cp);
    }
    ks_sums_free(sums, n_sums);
    if (sh->io_errno) return 0;
    {
        kprogress *prog = kprogress_start("sha256", sh->size, progress);
        double t0 = kprogress_elapsed(prog);
        int io = 0;
        if (ks_sha256_file(sh->path, sh->got_sha, prog, &io, cerr, sizeof cerr)) {
            sh->io_errno = io;
            problem(d, 0, "%s", cerr);
        }
        d->sha_seconds = kprogress_finish(prog) - t0;
    }
    if (sh->got_sha[0] && sh->expect_sha[0] && strcmp(sh->got_sha, sh->expect_sha))
        problem(d, 0, "SHA-256 %s, %s says %s", sh->got_sha, sh->sha_from, sh->expect_sha);
    {
        char pin_cfg[65], pin_w[65];
        int cfg_pin, w_pin;
        pinned_digests(pin_cfg, pin_w);
        cfg_pin = strcmp(d->config_sha, pin_cfg) == 0;
        w_pin = strcmp(sh->got_sha, pin_w) == 0;
        d->pinned = cfg_pin && w_pin;
        /* one file of the pinned revision and not the other: a damaged or mixed download */
        if (cfg_pin && !w_pin && sh->got_sha[0])
            problem(d, 0, "config.json is the pinned %s's, but model.safetensors is not (SHA-256 %s, pinned %s): a damaged or "
                    "mixed download", K3E_RELEASE_REPO, sh->got_sha, pin_w);
        if (w_pin && !cfg_pin)
            problem(d, 1, "model.safetensors is the pinned %s's, but config.json is not (SHA-256 %s, pinned %s)", K3E_RELEASE_REPO,
                    d->config_sha, pin_cfg);
        if (d->pinned && !sh->expect_sha[0]) {
            memcpy(sh->expect_sha, pin_w, 65);
            sh->sha_from = "pinned";
        }
    }
    return 0;
}

void kd_free(kd_source *d) { ks_free(&d->src); }

void kd_archive_pins(const kd_source *d, ka_archive *a)
{
    char pin_cfg[65], pin_w[65];
    if (!d->pinned) return;
    pinned_digests(pin_cfg, pin_w);
    for (size_t i = 0; i < a->n_files; i++)
        if (!strcmp(a->files[i].name, "config.json") && !a->files[i].expect_sha[0]) {
            memcpy(a->files[i].expect_sha, pin_cfg, 65);
            a->files[i].sha_from = "pinned";
        }
}

static const char *sha_verdict(const ks_shard *s)
{
    return !s->got_sha[0] ? "sha256 not computed" : !s->expect_sha[0] ? "sha256 computed, nothing to compare it with"
         : strcmp(s->got_sha, s->expect_sha) == 0 ? "sha256 ok" : "sha256 MISMATCH";
}

void kd_print(const kd_source *d, FILE *out)
{
    const ks_shard *s = &d->src.shards[0];
    const k3_eagle_config *c = &d->cfg;
    char b[32];
    kfmt_bytes(s->size, b, sizeof b);
    fprintf(out, "source: %s (an EAGLE drafter: model.safetensors, %s)\n", d->src.dir, b);
    if (d->src.have_cfg) {
        fprintf(out, "config: %s; hidden %d, vocab %d, %d heads, MLP %d, rope theta %g", c->architecture[0] ? c->architecture : "?",
                c->hidden, c->vocab, c->heads, c->inter, c->rope_theta);
        if (c->yarn) fprintf(out, " with YaRN x%g", c->yarn_factor);
        fprintf(out, ", taps [");
        for (int i = 0; i < c->n_taps; i++) fprintf(out, "%s%d", i ? "," : "", c->tap_ids[i]);
        fprintf(out, "]\n");
    }
    fprintf(out, "revision: %s\n", d->pinned ? "the pinned " K3E_RELEASE_REPO " (both SHA-256 match K3_EAGLE.md §1.2)"
                                               : "not the pinned release (its SHA-256 differ): a synthetic, retrained or other drafter");
    fprintf(out, "  %-4s config.json  sha256 %s\n", d->src.n_general ? "BAD" : "OK", d->config_sha);
    fprintf(out, "  %-4s %s  %llu tensors  %s  %s%s%s\n", ks_shard_ok(s) ? "OK" : "BAD", s->name, (unsigned long long)s->n_tensors,
            s->present ? b : "-", sha_verdict(s), s->got_sha[0] ? " " : "", s->got_sha);
    for (size_t k = 0; k < s->n_problems && k < KS_MAX_PROBLEMS; k++) fprintf(out, "       - %s\n", s->problems[k]);
    for (size_t k = 0; k < d->src.n_general && k < KS_MAX_PROBLEMS; k++) fprintf(out, "       - %s\n", d->src.general[k]);
}

static json_t *problems_json(char *const *list, size_t n)
{
    json_t *a = json_array();
    for (size_t k = 0; k < n && k < KS_MAX_PROBLEMS; k++) json_array_append_new(a, json_string(list[k] ? list[k] : "?"));
    return a;
}

json_t *kd_manifest_json(const kd_source *d)
{
    const k3_eagle_config *c = &d->cfg;
    json_t *j = json_object(), *taps = json_array();
    for (int i = 0; i < c->n_taps; i++) json_array_append_new(taps, json_integer(c->tap_ids[i]));
    json_object_set_new(j, "architecture", json_string(c->architecture));
    json_object_set_new(j, "config_sha256", json_string(d->config_sha));
    json_object_set_new(j, "pinned", d->pinned ? json_string(K3E_RELEASE_REPO) : json_null());
    json_object_set_new(j, "tap_ids", taps);
    return j;
}

json_t *kd_json(const kd_source *d)
{
    const ks_shard *s = &d->src.shards[0];
    const k3_eagle_config *c = &d->cfg;
    json_t *j = json_object(), *f = json_object(), *cfg = json_object();
    json_object_set_new(j, "dir", json_string(d->src.dir));
    json_object_set_new(j, "kind", json_string("drafter"));
    json_object_set_new(j, "ok", json_boolean(ks_ok(&d->src)));
    json_object_set_new(j, "drafter", kd_manifest_json(d));
    if (d->src.have_cfg) {
        json_object_set_new(cfg, "hidden", json_integer(c->hidden));
        json_object_set_new(cfg, "vocab", json_integer(c->vocab));
        json_object_set_new(cfg, "heads", json_integer(c->heads));
        json_object_set_new(cfg, "intermediate", json_integer(c->inter));
        json_object_set_new(cfg, "yarn", json_boolean(c->yarn));
        json_object_set_new(cfg, "roster", json_integer(k3e_count(c)));
        json_object_set_new(j, "config", cfg);
    } else {
        json_decref(cfg);
    }
    json_object_set_new(f, "name", json_string(s->name));
    json_object_set_new(f, "ok", json_boolean(ks_shard_ok(s)));
    json_object_set_new(f, "size", json_integer((json_int_t)s->size));
    json_object_set_new(f, "tensors", json_integer((json_int_t)s->n_tensors));
    json_object_set_new(f, "header_bytes", json_integer((json_int_t)s->st.header_len));
    json_object_set_new(f, "sha256", s->got_sha[0] ? json_string(s->got_sha) : json_null());
    json_object_set_new(f, "sha256_expected", s->expect_sha[0] ? json_string(s->expect_sha) : json_null());
    json_object_set_new(f, "sha256_from", s->sha_from ? json_string(s->sha_from) : json_null());
    json_object_set_new(f, "problems", problems_json(s->problems, s->n_problems));
    json_object_set_new(j, "weights", f);
    json_object_set_new(j, "problems", problems_json(d->src.general, d->src.n_general));
    json_object_set_new(j, "sha256_seconds", json_real(d->sha_seconds));
    return j;
}

int kd_check_source(const char *dir, const char *sums, int json, int quiet)
{
    kd_source d;
    char err[1200];
    int ok, io;
    if (kd_open(dir, sums, !quiet && !json, &d, err, sizeof err)) {
        io = ks_io_errno(&d.src);
        kx_error("%s%s", err, io ? "; an I/O error, not a verdict on the download: fix the cause and rerun" : "");
        kd_free(&d);
        return io ? KX_FAIL : KX_BAD;
    }
    if (json) {
        json_t *j = kd_json(&d);
        json_dumpf(j, stdout, JSON_INDENT(1) | JSON_SORT_KEYS);
        fputc('\n', stdout);
        json_decref(j);
    } else {
        kd_print(&d, stdout);
        printf("verdict: %s\n", ks_ok(&d.src) ? "OK" : "BAD");
    }
    ok = ks_ok(&d.src);
    io = ks_io_errno(&d.src);
    if (io) kx_error("%s could not be read (%s): an I/O error, not a verdict on the download; fix the cause and rerun", dir, strerror(io));
    kd_free(&d);
    return io ? KX_FAIL : ok ? KX_OK : KX_BAD;
}
