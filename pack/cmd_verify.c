/* kpack verify FILE.kpk: re-hash every extent and check that every byte
 * that is not checksummed is zero, so one flipped bit anywhere is found. */
#include "cli.h"
#include "kio.h"
#include "kprogress.h"
#include "kpk_reader.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: kpack verify FILE.kpk [--threads N] [--json] [--quiet]\n"
    "\n"
    "Checks the superblocks, the directory checksums, every extent's XXH3 and\n"
    "that every padding byte is zero. Names each bad extent, e.g.\n"
    "\"layer 17 expert 403: checksum mismatch\".\n"
    "\n"
    "  --threads N   extents checked at once (default: all cores)\n"
    "  --json        machine-readable report on stdout\n"
    "  --quiet       no progress line\n"
    "\n"
    "Exit: 0 intact, 1 corrupt (damaged or truncated), 2 unreadable or not a KPK file.\n";

#define SCRATCH ((size_t)8 << 20)

struct problem { uint64_t offset; char what[64]; char msg[600]; };

struct vjob {
    kpk_file *f;
    _Atomic uint32_t next;
    kprogress *prog;
    pthread_mutex_t mu;
    struct problem *probs;
    size_t n_probs, cap;
    int io_error;
};

static void add_problem(struct vjob *j, uint64_t off, const char *what, const char *msg)
{
    pthread_mutex_lock(&j->mu);
    if (j->n_probs == j->cap) {
        size_t cap = j->cap ? j->cap * 2 : 16;
        struct problem *p = realloc(j->probs, cap * sizeof *p);
        if (!p) { j->n_probs++; pthread_mutex_unlock(&j->mu); return; }
        j->probs = p;
        j->cap = cap;
    }
    j->probs[j->n_probs].offset = off;
    snprintf(j->probs[j->n_probs].what, sizeof j->probs[0].what, "%s", what);
    snprintf(j->probs[j->n_probs].msg, sizeof j->probs[0].msg, "%s", msg);
    j->n_probs++;
    pthread_mutex_unlock(&j->mu);
}

static void *worker(void *arg)
{
    struct vjob *j = arg;
    void *scratch = malloc(SCRATCH);
    if (!scratch) { add_problem(j, 0, "verify", "out of memory"); j->io_error = 1; return NULL; }
    for (;;) {
        uint32_t i = atomic_fetch_add(&j->next, 1);
        const kpk_extent *x;
        kpk_err e = {0};
        char d[64];
        if (i >= kpk_extent_count(j->f)) break;
        x = kpk_extent_at(j->f, i);
        if (kpk_extent_verify(j->f, i, scratch, SCRATCH, &e)) {
            /* the message is "<path>: <what> (...): <why>"; keep <why> */
            const char *why = strrchr(e.msg, ':');
            kpk_extent_describe(x, d, sizeof d);
            add_problem(j, x->offset, d, why ? why + 2 : e.msg);
            if (e.code == KPK_EIO) j->io_error = 1;
        }
        kprogress_add(j->prog, kpk_extent_padded_len(j->f, x));
    }
    free(scratch);
    return NULL;
}

/* Bytes in [a, b) must be zero. */
static void check_zero(struct vjob *j, uint64_t a, uint64_t b, const char *what)
{
    uint8_t *buf;
    if (a >= b) return;
    buf = malloc(SCRATCH);
    if (!buf) { add_problem(j, a, what, "out of memory"); return; }
    for (uint64_t pos = a; pos < b;) {
        size_t n = b - pos < SCRATCH ? (size_t)(b - pos) : SCRATCH;
        if (kio_pread_full(kpk_fd(j->f), buf, n, pos)) { add_problem(j, pos, what, strerror(errno)); j->io_error = 1; break; }
        if (!kio_is_zero(buf, n)) { add_problem(j, pos, what, "non-zero bytes where the format requires zero padding"); break; }
        pos += n;
    }
    free(buf);
}

static int cmp_prob(const void *a, const void *b)
{
    const struct problem *x = a, *y = b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

int cmd_verify(int argc, char **argv)
{
    const char *path = NULL, *v;
    int json = 0, quiet = 0, threads = kx_cpus();
    kpk_file *f;
    kpk_err e = {0};
    struct vjob job;
    pthread_t *tid;
    int started = 0;
    uint64_t total = 0;
    double secs;
    long n;

    for (int i = 1; i < argc; i++) {
        if (kx_flag(argc, argv, &i, "--help", NULL) || kx_flag(argc, argv, &i, "-h", NULL)) { fputs(usage, stdout); return KX_OK; }
        else if (kx_flag(argc, argv, &i, "--threads", &v)) {
            if (kx_parse_int(v, 1, 256, &n)) { kx_error("--threads: expected 1..256, got %s", v); return KX_FAIL; }
            threads = (int)n;
        } else if (kx_flag(argc, argv, &i, "--json", NULL)) json = 1;
        else if (kx_flag(argc, argv, &i, "--quiet", NULL)) quiet = 1;
        else if (argv[i][0] == '-') { kx_error("verify: unknown option %s", argv[i]); fputs(usage, stderr); return KX_FAIL; }
        else if (!path) path = argv[i];
        else { kx_error("verify: unexpected argument %s", argv[i]); return KX_FAIL; }
    }
    if (!path) { fputs(usage, stderr); return KX_FAIL; }

    if (kpk_open(path, &f, &e)) {
        int corrupt = e.code == KPK_EFORMAT || e.code == KPK_ECHECKSUM;
        if (json) {
            json_t *j = json_object();
            json_object_set_new(j, "file", json_string(path));
            json_object_set_new(j, "ok", json_false());
            json_object_set_new(j, "readable", json_boolean(corrupt));
            json_object_set_new(j, "error", json_string(e.msg));
            json_dumpf(j, stdout, JSON_INDENT(1) | JSON_SORT_KEYS);
            fputc('\n', stdout);
            json_decref(j);
        }
        kx_error("%s", e.msg);
        return corrupt ? KX_BAD : KX_FAIL;
    }
    memset(&job, 0, sizeof job);
    job.f = f;
    pthread_mutex_init(&job.mu, NULL);
    if (kpk_warning(f)) add_problem(&job, 0, "superblock", kpk_warning(f));
    for (uint32_t i = 0; i < kpk_extent_count(f); i++) total += kpk_extent_padded_len(f, kpk_extent_at(f, i));
    job.prog = kprogress_start("verify", total, !quiet && !json);

    {   /* the gaps: after the superblock, between extents, between sections */
        const kpk_superblock *sb = kpk_super(f);
        uint64_t at = KPK_SUPERBLOCK_SIZE;
        for (uint32_t i = 0; i < kpk_extent_count(f); i++) {
            const kpk_extent *x = kpk_extent_at(f, i);
            check_zero(&job, at, x->offset, "padding before an extent");
            at = x->offset + kpk_extent_padded_len(f, x);
        }
        check_zero(&job, at, sb->extent_table_off, "padding before the directory");
        check_zero(&job, sb->extent_table_off + sb->extent_count * KPK_EXTENT_RECORD_SIZE, sb->tensor_table_off, "directory padding");
        check_zero(&job, sb->tensor_table_off + sb->tensor_count * KPK_TENSOR_RECORD_SIZE, sb->strings_off, "directory padding");
        check_zero(&job, sb->strings_off + sb->strings_len, sb->manifest_off, "directory padding");
        check_zero(&job, sb->manifest_off + sb->manifest_len, kpk_size(f) - KPK_SUPERBLOCK_SIZE, "directory padding");
    }
    tid = calloc((size_t)threads, sizeof *tid);
    if (!tid) { kx_error("out of memory"); kpk_close(f); return KX_FAIL; }
    for (int i = 1; i < threads; i++)
        if (pthread_create(&tid[i], NULL, worker, &job) == 0) started++;
        else break;
    worker(&job);
    for (int i = 1; i <= started; i++) pthread_join(tid[i], NULL);
    free(tid);
    secs = kprogress_finish(job.prog);
    if (job.probs) qsort(job.probs, job.n_probs < job.cap ? job.n_probs : job.cap, sizeof *job.probs, cmp_prob);

    if (json) {
        json_t *j = json_object(), *a = json_array();
        for (size_t i = 0; i < job.n_probs && i < job.cap; i++) {
            json_t *o = json_object();
            json_object_set_new(o, "what", json_string(job.probs[i].what));
            json_object_set_new(o, "offset", json_integer((json_int_t)job.probs[i].offset));
            json_object_set_new(o, "error", json_string(job.probs[i].msg));
            json_array_append_new(a, o);
        }
        json_object_set_new(j, "file", json_string(path));
        json_object_set_new(j, "ok", json_boolean(job.n_probs == 0));
        json_object_set_new(j, "readable", json_true());
        json_object_set_new(j, "extents", json_integer(kpk_extent_count(f)));
        json_object_set_new(j, "bytes", json_integer((json_int_t)kpk_size(f)));
        json_object_set_new(j, "seconds", json_real(secs));
        json_object_set_new(j, "problems", a);
        json_dumpf(j, stdout, JSON_INDENT(1) | JSON_SORT_KEYS);
        fputc('\n', stdout);
        json_decref(j);
    } else {
        char b[32];
        for (size_t i = 0; i < job.n_probs && i < job.cap; i++) printf("%s: %s\n", job.probs[i].what, job.probs[i].msg);
        kfmt_bytes(kpk_size(f), b, sizeof b);
        printf("%s: %u extents, %s checked in %.2f s (%.0f MB/s): %s\n", path, kpk_extent_count(f), b, secs,
               secs > 0 ? (double)kpk_size(f) / secs / 1e6 : 0.0,
               job.io_error ? "UNREADABLE (I/O error: nothing is known of what could not be read)" : job.n_probs ? "CORRUPT" : "OK");
    }
    {
        int rc = job.io_error ? KX_FAIL : job.n_probs ? KX_BAD : KX_OK;
        free(job.probs);
        pthread_mutex_destroy(&job.mu);
        kpk_close(f);
        return rc;
    }
}
