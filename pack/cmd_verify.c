/* kpack verify FILE.kpk: re-hash every extent of every member file, decode
 * every compressed block, check that every byte that is not checksummed is
 * zero (so one flipped bit anywhere is found), that the manifest is JSON and
 * that the file holds exactly the model its config describes (so "verify
 * OK" means krun will accept it). */
#include "cli.h"
#include "rebuild.h"
#include "repair.h"
#include "format/k3_check.h"
#include "format/k3_eagle.h"
#include "format/kargs.h"
#include "format/kio.h"
#include "format/kpk_reader.h"
#include "format/kprogress.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: kpack verify FILE.kpk [--shallow | --repair-from SOURCE_DIR] [--threads N] [--json] [--quiet]\n"
    "\n"
    "Checks the superblocks of every member file, the directory checksums, every\n"
    "extent's XXH3, every compressed block (decoded, with its checksum), that every\n"
    "padding byte, every gap between tensors and all unused stripe space is zero,\n"
    "that the manifest is JSON, that the file holds exactly the model its\n"
    "config.json describes (what krun checks before it runs a file), and that the\n"
    "archive's recipe names only paths inside a directory and rebuilds every file\n"
    "it lists (what export reads). Names each problem, e.g. \"layer 17 expert 403:\n"
    "checksum mismatch\" or \"layer 17 trunk: block 212: decoded checksum mismatch\".\n"
    "A set is verified through its entry file (member 0).\n"
    "\n"
    "  --shallow     compressed extents: check the stored bytes only (no decoding)\n"
    "  --repair-from SOURCE_DIR  remake the extents that fail from the download the\n"
    "                file was converted from, and check again. The source is checked\n"
    "                first (the shards the manifest lists, their sizes and recorded\n"
    "                SHA-256), and each extent made again must reproduce the checksums\n"
    "                of the table before anything is written: a source that does not\n"
    "                match is refused (named) and nothing is written\n"
    "  --threads N   extents checked at once (default: all cores)\n"
    "  --json        machine-readable report on stdout\n"
    "  --quiet       no progress line\n"
    "\n"
    "Exit: 0 intact, 1 damaged (corrupt or truncated), 2 unreadable, not a KPK file,\n"
    "a newer format, or a member file of a set missing or wrong.\n";

#define SCRATCH ((size_t)8 << 20)

struct problem { uint64_t order; char what[160]; char msg[600]; };

struct vjob {
    kpk_file *f;
    int flags;
    _Atomic uint32_t next;
    kprogress *prog;
    pthread_mutex_t mu;
    struct problem *probs;
    size_t n_probs, cap;
    int io_error;
};

static void add_problem(struct vjob *j, uint64_t order, const char *what, const char *msg)
{
    pthread_mutex_lock(&j->mu);
    if (j->n_probs == j->cap) {
        size_t cap = j->cap ? j->cap * 2 : 16;
        struct problem *p = realloc(j->probs, cap * sizeof *p);
        if (!p) { j->n_probs++; pthread_mutex_unlock(&j->mu); return; }
        j->probs = p;
        j->cap = cap;
    }
    j->probs[j->n_probs].order = order;
    snprintf(j->probs[j->n_probs].what, sizeof j->probs[0].what, "%s", what);
    snprintf(j->probs[j->n_probs].msg, sizeof j->probs[0].msg, "%s", msg);
    j->n_probs++;
    pthread_mutex_unlock(&j->mu);
}

/* An extent error reads "<path>: <what> (extent N): <why>"; keep <why>. */
static const char *extent_why(const char *msg)
{
    const char *p = strstr(msg, " (extent ");
    if (p && (p = strstr(p, "): "))) return p + 3;
    p = strrchr(msg, ':');
    return p ? p + 2 : msg;
}

/* Problems are listed: the file as a whole, zero regions, then extents in table order. */
#define ORDER_FILE 0
#define ORDER_REGION ((uint64_t)1 << 32)
#define ORDER_EXTENT ((uint64_t)2 << 32)

static void *worker(void *arg)
{
    struct vjob *j = arg;
    void *scratch = malloc(SCRATCH);
    if (!scratch) { add_problem(j, ORDER_FILE, "verify", "out of memory"); j->io_error = 1; return NULL; }
    for (;;) {
        uint32_t i = atomic_fetch_add(&j->next, 1);
        const kpk_extent *x;
        kpk_err e = {0};
        char d[64];
        if (i >= kpk_extent_count(j->f)) break;
        x = kpk_extent_at(j->f, i);
        if (kpk_extent_verify_ex(j->f, i, scratch, SCRATCH, j->flags, &e)) {
            kpk_extent_describe(x, d, sizeof d);
            add_problem(j, ORDER_EXTENT + i, d, extent_why(e.msg));
            if (e.code == KPK_EIO || e.code == KPK_ENOMEM) j->io_error = 1;
        }
        kprogress_add(j->prog, kpk_extent_padded_len(j->f, x));
    }
    free(scratch);
    return NULL;
}

/* Every region the format requires to be zero. */
static void check_regions(struct vjob *j)
{
    kpk_region *r;
    size_t n;
    kpk_err e = {0};
    uint8_t *buf;
    if (kpk_zero_regions(j->f, &r, &n, &e)) { add_problem(j, ORDER_FILE, "verify", e.msg); j->io_error = 1; return; }
    buf = malloc(SCRATCH);
    if (!buf) { free(r); add_problem(j, ORDER_FILE, "verify", "out of memory"); j->io_error = 1; return; }
    for (size_t k = 0; k < n; k++) {
        for (uint64_t pos = r[k].off; pos < r[k].off + r[k].len;) {
            size_t len = r[k].off + r[k].len - pos < SCRATCH ? (size_t)(r[k].off + r[k].len - pos) : SCRATCH;
            if (kpk_target_pread(j->f, r[k].target, buf, len, pos, &e)) {
                add_problem(j, ORDER_REGION + k, r[k].what, e.msg);
                j->io_error = 1;
                break;
            }
            if (!kio_is_zero(buf, len)) {
                add_problem(j, ORDER_REGION + k, r[k].what, "non-zero bytes where the format requires zero padding");
                break;
            }
            pos += len;
        }
    }
    free(buf);
    free(r);
}

/* The manifest is a JSON object; the model is the one the config describes. */
static void check_contents(struct vjob *j)
{
    size_t len;
    const char *m = kpk_manifest(j->f, &len);
    json_error_t je;
    json_t *root = json_loadb(m, len, 0, &je);
    k3_config cfg;
    char err[1200];
    if (!root || !json_is_object(root)) {
        char msg[300];
        snprintf(msg, sizeof msg, "not a JSON object%s%s", root ? "" : ": ", root ? "" : je.text);
        add_problem(j, ORDER_FILE, "manifest", msg);
    }
    json_decref(root);
    k3_eagle_config dcfg;
    /* a drafter file holds a drafter's roster (FORMAT.md §15), a model file its model */
    if (k3e_is_drafter_file(j->f) ? k3e_check_kpk(j->f, &dcfg, err, sizeof err) : k3_check_kpk(j->f, &cfg, err, sizeof err)) {
        const char *p = strncmp(err, kpk_path(j->f), strlen(kpk_path(j->f))) == 0 ? err + strlen(kpk_path(j->f)) + 2 : err;
        add_problem(j, ORDER_FILE, "model", p);
    }
    /* the archive's recipe, as export reads it: "verify OK" means export will work */
    {
        int damaged = 0;
        if (kr_check(j->f, &damaged, err, sizeof err)) {
            const char *p = strncmp(err, kpk_path(j->f), strlen(kpk_path(j->f))) == 0 ? err + strlen(kpk_path(j->f)) + 2 : err;
            add_problem(j, ORDER_FILE, "archive", p);
            if (!damaged) j->io_error = 1;
        }
    }
}

static int cmp_prob(const void *a, const void *b)
{
    const struct problem *x = a, *y = b;
    return (x->order > y->order) - (x->order < y->order);
}

static int report_open_error(const char *path, const kpk_err *e, int json)
{
    int damage = kpk_err_is_damage(e->code);
    if (json) {
        json_t *j = json_object();
        json_object_set_new(j, "file", json_string(path));
        json_object_set_new(j, "ok", json_false());
        json_object_set_new(j, "readable", json_boolean(damage));
        json_object_set_new(j, "member_error", json_boolean(e->code == KPK_EMEMBER));
        json_object_set_new(j, "error", json_string(e->msg));
        json_dumpf(j, stdout, JSON_INDENT(1) | JSON_SORT_KEYS);
        fputc('\n', stdout);
        json_decref(j);
    }
    kx_error("%s", e->msg);
    return damage ? KX_BAD : KX_FAIL;
}

/* The meta extent's files against their copies in the archive (archive/files/NAME: the download's
 * own, FORMAT.md §9): a runtime file removed from the meta extent, renamed, or changed, and the
 * file re-sealed, disagrees with the download's copy (issue 34.11).  A file without an archive, or
 * one whose archive did not keep the file, has nothing to compare with. */
static void check_meta_files(struct vjob *j)
{
    static const char *const names[] = {"config.json", "tiktoken.model", "tokenizer_config.json"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        char full[96], msg[400], *meta = NULL, *kept;
        size_t mlen = 0;
        kpk_tensor a;
        kpk_err e;
        snprintf(full, sizeof full, "archive/files/%s", names[k]);
        if (kpk_find_tensor(j->f, full, &a) < 0 || kpk_extent_at(j->f, a.extent)->kind != KPK_KIND_ARCHIVE) continue;
        if (kpk_meta_file(j->f, names[k], &meta, &mlen, &e)) {
            if (e.code != KPK_EINVAL) continue;                  /* unreadable: the extent's own check says so */
            snprintf(msg, sizeof msg, "%s is in the archive (%s) but not in the meta extent: the file was edited after conversion",
                     names[k], full);
            add_problem(j, ORDER_FILE, "meta", msg);
            continue;
        }
        if (!(kept = malloc(a.nbytes ? a.nbytes : 1))) { free(meta); continue; }
        if (!kpk_extent_read_raw(j->f, a.extent, kept, a.nbytes, a.offset, &e) && (a.nbytes != mlen || memcmp(kept, meta, mlen))) {
            snprintf(msg, sizeof msg, "meta/%s differs from the download's copy in the archive (%s): the file was edited after "
                     "conversion", names[k], full);
            add_problem(j, ORDER_FILE, "meta", msg);
        }
        free(kept);
        free(meta);
    }
}

/* One full check of an open file; the problems are in job (sorted). */
static double verify_once(kpk_file *f, struct vjob *job, int threads, int progress)
{
    pthread_t *tid;
    int started = 0;
    uint64_t total = 0;
    double secs;
    job->f = f;
    atomic_store(&job->next, 0);
    if (kpk_warning(f)) add_problem(job, ORDER_FILE, "superblock", kpk_warning(f));
    for (uint32_t i = 0; i < kpk_extent_count(f); i++) total += kpk_extent_padded_len(f, kpk_extent_at(f, i));
    job->prog = kprogress_start("verify", total, progress);
    check_contents(job);
    check_meta_files(job);
    check_regions(job);
    tid = calloc((size_t)threads, sizeof *tid);
    for (int i = 1; tid && i < threads; i++)
        if (pthread_create(&tid[i], NULL, worker, job) == 0) started++;
        else break;
    worker(job);
    for (int i = 1; i <= started; i++) pthread_join(tid[i], NULL);
    free(tid);
    secs = kprogress_finish(job->prog);
    if (job->probs) qsort(job->probs, job->n_probs < job->cap ? job->n_probs : job->cap, sizeof *job->probs, cmp_prob);
    return secs;
}

static void print_report(const char *path, kpk_file *f, const struct vjob *job, double secs, int json, json_t *repair)
{
    if (json) {
        json_t *j = json_object(), *a = json_array();
        for (size_t i = 0; i < job->n_probs && i < job->cap; i++) {
            json_t *o = json_object();
            json_object_set_new(o, "what", json_string(job->probs[i].what));
            json_object_set_new(o, "error", json_string(job->probs[i].msg));
            json_array_append_new(a, o);
        }
        json_object_set_new(j, "file", json_string(path));
        json_object_set_new(j, "ok", json_boolean(job->n_probs == 0));
        json_object_set_new(j, "readable", json_boolean(!job->io_error));
        json_object_set_new(j, "members", json_integer(kpk_member_count(f)));
        json_object_set_new(j, "extents", json_integer(kpk_extent_count(f)));
        json_object_set_new(j, "bytes", json_integer((json_int_t)kpk_total_size(f)));
        json_object_set_new(j, "deep", json_boolean(!(job->flags & KPK_VERIFY_SHALLOW)));
        json_object_set_new(j, "seconds", json_real(secs));
        json_object_set_new(j, "problems", a);
        if (repair) json_object_set(j, "repair", repair);
        json_dumpf(j, stdout, JSON_INDENT(1) | JSON_SORT_KEYS);
        fputc('\n', stdout);
        json_decref(j);
    } else {
        char b[32], mem[48] = "";
        for (size_t i = 0; i < job->n_probs && i < job->cap; i++) printf("%s: %s\n", job->probs[i].what, job->probs[i].msg);
        kfmt_bytes(kpk_total_size(f), b, sizeof b);
        if (kpk_member_count(f) > 1) snprintf(mem, sizeof mem, " in %u member files", kpk_member_count(f));
        printf("%s: %u extents, %s%s checked in %.2f s (%.0f MB/s): %s\n", path, kpk_extent_count(f), b, mem, secs,
               secs > 0 ? (double)kpk_total_size(f) / secs / 1e6 : 0.0, job->io_error ? "UNREADABLE (I/O error: nothing is known of what could not be read)" : job->n_probs ? "CORRUPT" : "OK");
    }
}

static void job_reset(struct vjob *job)
{
    free(job->probs);
    job->probs = NULL;
    job->n_probs = job->cap = 0;
    job->io_error = 0;
}

/* --repair-from: the extents that failed are made again from the download;
 * anything else that failed (the directory, a superblock, padding between
 * extents) cannot be, and is said so. */
static int repair(const char *path, kpk_file **fp, struct vjob *job, const char *src, int threads, int quiet, int json,
                  json_t **report)
{
    uint32_t *bad = calloc(job->n_probs + 1, sizeof *bad);
    size_t n = 0, other = 0;
    int damage = 0, rc;
    char err[1500];
    json_t *list = json_array();
    if (!bad) { kx_error("out of memory"); json_decref(list); return KX_FAIL; }
    for (size_t i = 0; i < job->n_probs && i < job->cap; i++) {
        if (job->probs[i].order >= ORDER_EXTENT) {
            bad[n++] = (uint32_t)(job->probs[i].order - ORDER_EXTENT);
            json_array_append_new(list, json_string(job->probs[i].what));
        } else {
            other++;
        }
    }
    *report = json_object();
    json_object_set_new(*report, "extents", list);
    if (other) {
        kx_error("%zu of the problems above are not in an extent (the directory, a superblock, padding between extents): "
                 "--repair-from remakes extents only; convert the download again", other);
        free(bad);
        return KX_BAD;
    }
    if (!quiet && !json) kx_note(0, "remaking %zu extent%s from %s", n, n == 1 ? "" : "s", src);
    rc = kp_repair(*fp, src, bad, n, threads, quiet || json, &damage, err, sizeof err);
    free(bad);
    json_object_set_new(*report, "done", json_boolean(rc == 0));
    if (rc) {
        kx_error("cannot repair %s from %s: %s; nothing was written", path, src, err);
        json_object_set_new(*report, "error", json_string(err));
        return damage ? KX_BAD : KX_FAIL;
    }
    {   /* opened again: the tables say what the extents hold, the bytes are new */
        kpk_err e = {0};
        kpk_close(*fp);
        *fp = NULL;
        if (kpk_open(path, fp, &e)) { kx_error("%s", e.msg); return KX_FAIL; }
    }
    if (!quiet && !json) kx_note(0, "rewrote %zu extent%s; checking the whole file again", n, n == 1 ? "" : "s");
    return KX_OK;
}

int cmd_verify(int argc, char **argv)
{
    const char *path = NULL, *v, *repair_from = NULL;
    int json = 0, quiet = 0, threads = kx_cpus(), rc;
    kpk_file *f;
    kpk_err e = {0};
    struct vjob job;
    json_t *rep = NULL;
    double secs;
    long n;

    memset(&job, 0, sizeof job);
    for (int i = 1; i < argc; i++) {
        if (kx_flag(argc, argv, &i, "--help", NULL) || kx_flag(argc, argv, &i, "-h", NULL)) { fputs(usage, stdout); return KX_OK; }
        else if (kx_flag(argc, argv, &i, "--threads", &v)) {
            if (kargs_long(v, 1, 256, &n)) { kx_error("--threads: expected 1..256, got %s", v); return KX_FAIL; }
            threads = (int)n;
        } else if (kx_flag(argc, argv, &i, "--shallow", NULL)) job.flags |= KPK_VERIFY_SHALLOW;
        else if (kx_flag(argc, argv, &i, "--deep", NULL)) job.flags &= ~KPK_VERIFY_SHALLOW;
        else if (kx_flag(argc, argv, &i, "--repair-from", &v)) repair_from = v;
        else if (kx_flag(argc, argv, &i, "--json", NULL)) json = 1;
        else if (kx_flag(argc, argv, &i, "--quiet", NULL)) quiet = 1;
        else if (argv[i][0] == '-') { kx_error("verify: unknown option %s", argv[i]); fputs(usage, stderr); return KX_FAIL; }
        else if (!path) path = argv[i];
        else { kx_error("verify: unexpected argument %s", argv[i]); return KX_FAIL; }
    }
    if (!path) { fputs(usage, stderr); return KX_FAIL; }
    if (repair_from && (job.flags & KPK_VERIFY_SHALLOW)) { kx_error("--repair-from checks deep (every block decoded): drop --shallow"); return KX_FAIL; }
    if (repair_from && !kx_is_dir(repair_from)) return KX_FAIL;

    if (kpk_open(path, &f, &e)) return report_open_error(path, &e, json);
    pthread_mutex_init(&job.mu, NULL);
    secs = verify_once(f, &job, threads, !quiet && !json);
    if (repair_from && job.n_probs && !job.io_error) {
        if (!json) print_report(path, f, &job, secs, 0, NULL);
        rc = repair(path, &f, &job, repair_from, threads, quiet, json, &rep);
        if (rc != KX_OK) {
            if (json) print_report(path, f, &job, secs, 1, rep);
            goto out;
        }
        job_reset(&job);
        secs = verify_once(f, &job, threads, !quiet && !json);
    }
    print_report(path, f, &job, secs, json, rep);
    if (repair_from && !json) {
        if (rep && !job.n_probs) printf("repaired from %s: every extent checks again\n", repair_from);
        else if (!rep && !job.n_probs) printf("nothing to repair\n");
    }
    rc = job.io_error ? KX_FAIL : job.n_probs ? KX_BAD : KX_OK;
out:
    json_decref(rep);
    free(job.probs);
    pthread_mutex_destroy(&job.mu);
    kpk_close(f);
    return rc;
}
