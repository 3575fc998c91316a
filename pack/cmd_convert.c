/* kpack convert DIR OUT.kpk: check the source, plan the layout, copy the
 * extents into OUT.partial (resumable through OUT.journal), write the
 * directory and superblocks, fsync, rename. */
#include "cli.h"
#include "copy.h"
#include "directory.h"
#include "guard.h"
#include "journal.h"
#include "kprogress.h"
#include "plan.h"
#include "report.h"
#include "source.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <malloc.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

static const char usage[] =
    "usage: kpack convert DIR OUT.kpk [--align N] [--order layer-major|trunk-first]\n"
    "                     [--sha256 SUMS] [--threads N] [--force] [--dry-run] [--json] [--quiet]\n"
    "\n"
    "Repacks a checked Kimi K3 checkpoint into one KPK file. It writes\n"
    "OUT.kpk.partial and OUT.kpk.journal next to OUT; if it is interrupted (even\n"
    "by kill -9 or a power cut), rerunning the same command resumes from the last\n"
    "completed, verified extent and produces the same bytes as an uninterrupted run.\n"
    "The finished file is fsynced and renamed into place. One conversion per output:\n"
    "OUT.kpk.lock is held while it runs, and a second one stops naming the first's pid.\n"
    "\n"
    "  --align N       extent alignment: 4096 (default) up to 2M, a power of two\n"
    "  --order O       layer-major (default): globals, then each layer's trunk followed\n"
    "                  by its experts, so one decoding step reads the file front to back;\n"
    "                  trunk-first: every trunk layer before all experts\n"
    "  --sha256 SUMS   verify the shards' SHA-256 first (sha256sum format) and record it\n"
    "  --threads N     files hashed at once for --sha256 (default: all cores)\n"
    "  --force         replace OUT if it exists (the old file stays until the new one is complete)\n"
    "  --dry-run       print the plan (extents, output size, largest extent) and stop\n"
    "  --json          machine-readable summary on stdout\n"
    "  --quiet         no progress line or notes\n"
    "\n"
    "Exit: 0 converted, 1 the source has problems (see check-source),\n"
    "      2 cannot convert (usage, OUT exists, another kpack is converting to OUT,\n"
    "        not enough space, I/O error).\n";

struct run {
    const k3_source *src;
    kp_plan *plan;
    int fd;
    kjournal jr;
    kj_record *pending;
    uint64_t n_pending;
    uint64_t since_sync;
    uint64_t sync_bytes;
    uint32_t done_count;
    long kill_after;         /* test hook: SIGKILL ourselves after this many extents */
    long delay_ms;           /* test hook: slow down so a test can kill -9 us */
    const char *partial, *journal;
    char err[600];
};

static int flush_journal(struct run *r)
{
    if (!r->n_pending) return 0;
    if (fdatasync(r->fd)) { snprintf(r->err, sizeof r->err, "fdatasync of %s: %s", r->partial, strerror(errno)); return -1; }
    if (kj_append(&r->jr, r->pending, r->n_pending)) { snprintf(r->err, sizeof r->err, "writing the journal %s: %s", r->journal, strerror(errno)); return -1; }
    r->n_pending = 0;
    r->since_sync = 0;
    return 0;
}

static int on_extent_done(void *ctx, uint32_t i, uint64_t h)
{
    struct run *r = ctx;
    kpk_extent *x = &r->plan->extents[i];
    x->stored_xxh3 = x->raw_xxh3 = h;
    r->pending[r->n_pending].extent = i;
    r->pending[r->n_pending].stored_xxh3 = h;
    r->pending[r->n_pending].stored_len = x->stored_len;
    r->n_pending++;
    r->since_sync += kpk_round_up(x->stored_len, r->plan->opt.align);
    r->done_count++;
    if (r->since_sync >= r->sync_bytes && flush_journal(r)) return -1;
    if (r->delay_ms > 0) {
        struct timespec ts = {r->delay_ms / 1000, (r->delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (r->kill_after > 0 && r->done_count >= (uint32_t)r->kill_after) raise(SIGKILL);
    return 0;
}

static long env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    long n;
    return v && kx_parse_int(v, 0, 1L << 40, &n) == 0 ? n : dflt;
}

static void print_plan(const k3_source *src, const kp_plan *p, const char *out, int json)
{
    uint32_t by_kind[5] = {0};
    uint64_t bytes_kind[5] = {0};
    char d[64], b1[32], b2[32], b3[32];
    for (uint32_t i = 0; i < p->n_extents; i++) {
        by_kind[p->extents[i].kind]++;
        bytes_kind[p->extents[i].kind] += p->extents[i].stored_len;
    }
    kpk_extent_describe(&p->extents[p->largest_extent_index], d, sizeof d);
    if (json) {
        json_t *j = json_object(), *k = json_object();
        json_object_set_new(j, "output", json_string(out));
        json_object_set_new(j, "order", json_string(kp_order_name(p->opt.order)));
        json_object_set_new(j, "align", json_integer(p->opt.align));
        json_object_set_new(j, "extents", json_integer(p->n_extents));
        json_object_set_new(j, "tensors", json_integer((json_int_t)p->n_tensors));
        json_object_set_new(j, "output_bytes", json_integer((json_int_t)p->file_size));
        json_object_set_new(j, "data_bytes", json_integer((json_int_t)p->data_bytes));
        json_object_set_new(j, "directory_bytes", json_integer((json_int_t)(p->backup_off - p->extent_table_off)));
        json_object_set_new(j, "largest_extent", json_string(d));
        json_object_set_new(j, "largest_extent_bytes", json_integer((json_int_t)p->largest_extent));
        for (int kind = KPK_KIND_META; kind <= KPK_KIND_EXPERT; kind++) {
            json_t *o = json_object();
            json_object_set_new(o, "count", json_integer(by_kind[kind]));
            json_object_set_new(o, "bytes", json_integer((json_int_t)bytes_kind[kind]));
            json_object_set_new(k, kpk_kind_name(kind), o);
        }
        json_object_set_new(j, "by_kind", k);
        json_object_set_new(j, "dropped_tensors", json_integer((json_int_t)src->n_dropped));
        json_dumpf(j, stdout, JSON_INDENT(1) | JSON_SORT_KEYS);
        fputc('\n', stdout);
        json_decref(j);
        return;
    }
    kfmt_bytes(p->file_size, b1, sizeof b1);
    kfmt_bytes(p->largest_extent, b2, sizeof b2);
    kfmt_bytes(p->backup_off - p->extent_table_off, b3, sizeof b3);
    printf("plan for %s:\n", out);
    printf("  order %s, extents aligned to %u bytes\n", kp_order_name(p->opt.order), p->opt.align);
    printf("  extents: %u (%u meta, %u globals, %u trunk, %u expert)\n", p->n_extents, by_kind[KPK_KIND_META],
           by_kind[KPK_KIND_GLOBALS], by_kind[KPK_KIND_TRUNK], by_kind[KPK_KIND_EXPERT]);
    printf("  tensors: %llu (%zu non-text tensors dropped)\n", (unsigned long long)p->n_tensors, src->n_dropped);
    printf("  output size: %s (%llu bytes; directory %s)\n", b1, (unsigned long long)p->file_size, b3);
    printf("  largest extent: %s, %s\n", d, b2);
}

/* Space the output will take: sparse sources (all-zero data) make a sparse output. */
static uint64_t space_needed(const k3_source *src, const kp_plan *p, uint64_t already)
{
    uint64_t alloc = 0, size = 0, need;
    for (size_t i = 0; i < src->n_shards; i++) { alloc += src->shards[i].alloc_bytes; size += src->shards[i].size; }
    need = p->file_size > already ? p->file_size - already : 0;
    if (size && alloc < size) need = (uint64_t)((double)need * ((double)alloc / (double)size)) + (p->file_size - p->data_end);
    return need;
}

/* Bytes of free space the run gets back from an earlier run's partial file
 * before it writes: its allocated blocks at or past `from` (clear_tail
 * punches them out; a fresh start, from = 0, truncates the whole file).
 * Data ranges (SEEK_DATA) within the file's allocated total: an overestimate
 * only costs a run that stops on ENOSPC and resumes. */
static uint64_t partial_reusable(const char *partial, uint64_t from)
{
    int fd = open(partial, O_RDONLY | O_CLOEXEC);
    struct stat st;
    uint64_t n = 0, alloc;
    if (fd < 0) return 0;
    if (fstat(fd, &st) != 0) { close(fd); return 0; }
    alloc = (uint64_t)st.st_blocks * 512;
    if (from == 0) {
        n = alloc;
    } else {
        off_t d = (off_t)from, h;
        while ((d = lseek(fd, d, SEEK_DATA)) >= 0 && (h = lseek(fd, d, SEEK_HOLE)) > d) {
            n += (uint64_t)(h - d);
            d = h;
        }
    }
    close(fd);
    return n < alloc ? n : alloc;
}

static int fsync_parent(const char *path)
{
    char *copy = strdup(path);
    int fd, rc = -1;
    if (!copy) return -1;
    fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) { rc = fsync(fd); close(fd); }
    free(copy);
    return rc;
}

/* Everything after the verified prefix is rewritten, but all-zero blocks are
 * skipped (left as holes) and padding is never written: make the tail read as
 * zeros again first, as in a fresh file, or a stale or damaged byte there
 * would survive into the finished file. */
static int clear_tail(int fd, uint64_t from, uint64_t size)
{
    if (from >= size) return 0;
    if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)from, (off_t)(size - from)) == 0) return 0;
    if (errno != EOPNOTSUPP && errno != ENOSYS && errno != EINVAL) return -1;
    /* no hole punching here: cut and re-extend (a crash in between only costs the resume) */
    return ftruncate(fd, (off_t)from) || ftruncate(fd, (off_t)size) ? -1 : 0;
}

/* The plan holds everything the copy needs (names, offsets, sizes): the
 * parsed headers (~80 MB for the 497,220 tensors of K3) can go before the
 * hours of copying. */
static void drop_headers(k3_source *src)
{
    for (size_t i = 0; i < src->n_shards; i++) st_free(&src->shards[i].st);
    free(src->loc_shard);
    free(src->loc_tensor);
    free(src->dropped); /* its names pointed into the headers; the manifest has them */
    src->loc_shard = src->loc_tensor = NULL;
    src->dropped = NULL;
    src->n_dropped = 0;
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

/* Why an earlier run's files cannot be resumed, for the "starting over"
 * note: a kill can land before the partial file is sized or the journal is
 * written, and that is not a change of source or options. */
static void stale_reason(int jrc, const char *partial, const char *journal, const struct stat *st, int have_st,
                         uint64_t want, char *buf, size_t len)
{
    struct stat js;
    if (jrc == 0 && !have_st)
        snprintf(buf, len, "its journal is there but %s is not", partial);
    else if (jrc == 0)
        snprintf(buf, len, "%s has %llu bytes, this conversion writes %llu: it was truncated or replaced since", partial,
                 (unsigned long long)st->st_size, (unsigned long long)want);
    else if (stat(journal, &js) != 0)
        snprintf(buf, len, "the run that wrote %s was stopped before its journal was written: nothing to resume", partial);
    else if ((uint64_t)js.st_size < KJ_HEADER_SIZE)
        snprintf(buf, len, "the run that wrote %s was stopped while creating its journal: nothing to resume", partial);
    else
        snprintf(buf, len, "%s was written from another source or with other options (or its journal %s is damaged)",
                 partial, journal);
}

/* Decide where to start: *first = 0 for a fresh run, or the number of
 * leading extents a previous run completed and that still verify.  -1 (with
 * the error printed) if the journal cannot be read: starting over would
 * throw away what may be hours of verified work. */
static int resume_point(struct run *r, const char *partial, const char *journal, int quiet, uint32_t *first)
{
    kj_record *recs = NULL;
    uint64_t n = 0;
    struct stat st;
    kp_plan *p = r->plan;
    int rc = kj_open(&r->jr, journal, p->plan_id, &recs, &n);
    int have_st = stat(partial, &st) == 0;
    *first = 0;
    if (rc < 0) {
        kx_error("cannot read %s: %s; fix the cause, or remove it and %s to start over", journal, strerror(errno), partial);
        return -1;
    }
    if (rc != 0 || !have_st || (uint64_t)st.st_size != p->file_size) {
        char why[700];
        if (rc == 0) kj_close(&r->jr);
        if (rc == 0 || have_st) {
            stale_reason(rc, partial, journal, &st, have_st, p->file_size, why, sizeof why);
            kx_note(quiet, "not resuming: %s; starting over", why);
        }
        free(recs);
        return 0;
    }
    if (n > p->n_extents) n = 0;
    for (uint64_t i = 0; i < n; i++)
        if (recs[i].stored_len != p->extents[i].stored_len) { n = i; break; }
    /* The journal's records were appended after their data was synced; re-hash
     * the newest one from disk anyway, and step back past any that fail. */
    while (n > 0) {
        int fd = open(partial, O_RDONLY | O_CLOEXEC);
        uint64_t h = 0;
        int ok = fd >= 0 && kp_hash_written_extent(fd, p, (uint32_t)(n - 1), &h) == 0 && h == recs[n - 1].stored_xxh3;
        if (fd >= 0) close(fd);
        if (ok) break;
        n--;
    }
    for (uint64_t i = 0; i < n; i++) p->extents[i].stored_xxh3 = p->extents[i].raw_xxh3 = recs[i].stored_xxh3;
    free(recs);
    if (kj_truncate(&r->jr, n)) { kj_close(&r->jr); return 0; }
    *first = (uint32_t)n;
    return 0;
}

int cmd_convert(int argc, char **argv)
{
    const char *dir = NULL, *out = NULL, *sums = NULL, *v;
    kp_options opt = {.align = 4096, .order = KPK_ORDER_LAYER_MAJOR};
    int json = 0, quiet = 0, force = 0, dry = 0, threads = kx_cpus();
    k3_source src;
    kp_plan plan;
    struct run r;
    char err[1500], *partial = NULL, *journal = NULL;
    uint32_t first = 0;
    int rc = KX_FAIL, have_src = 0, have_plan = 0;
    kprogress *prog = NULL;
    kp_copy_stats stats = {0};
    double t0 = know(), t_copy;
    struct stat st;
    long n;
    kp_lock lock = KP_LOCK_INIT;

    memset(&r, 0, sizeof r);
    r.fd = -1;
    r.jr.fd = -1;
    for (int i = 1; i < argc; i++) {
        if (kx_flag(argc, argv, &i, "--help", NULL) || kx_flag(argc, argv, &i, "-h", NULL)) { fputs(usage, stdout); return KX_OK; }
        else if (kx_flag(argc, argv, &i, "--align", &v)) {
            int64_t a = kx_parse_size(v);
            if (a < 4096 || a > (2 << 20) || (a & (a - 1))) { kx_error("--align: expected a power of two from 4096 to 2M, got %s", v); return KX_FAIL; }
            opt.align = (uint32_t)a;
        } else if (kx_flag(argc, argv, &i, "--order", &v)) {
            if (strcmp(v, "layer-major") == 0) opt.order = KPK_ORDER_LAYER_MAJOR;
            else if (strcmp(v, "trunk-first") == 0) opt.order = KPK_ORDER_TRUNK_FIRST;
            else { kx_error("--order: expected layer-major or trunk-first, got %s", v); return KX_FAIL; }
        } else if (kx_flag(argc, argv, &i, "--sha256", &v)) sums = v;
        else if (kx_flag(argc, argv, &i, "--threads", &v)) {
            if (kx_parse_int(v, 1, 256, &n)) { kx_error("--threads: expected 1..256, got %s", v); return KX_FAIL; }
            threads = (int)n;
        } else if (kx_flag(argc, argv, &i, "--force", NULL)) force = 1;
        else if (kx_flag(argc, argv, &i, "--dry-run", NULL)) dry = 1;
        else if (kx_flag(argc, argv, &i, "--json", NULL)) json = 1;
        else if (kx_flag(argc, argv, &i, "--quiet", NULL)) quiet = 1;
        else if (argv[i][0] == '-') { kx_error("convert: unknown option %s", argv[i]); fputs(usage, stderr); return KX_FAIL; }
        else if (!dir) dir = argv[i];
        else if (!out) out = argv[i];
        else { kx_error("convert: unexpected argument %s", argv[i]); return KX_FAIL; }
    }
    if (!dir || !out) { fputs(usage, stderr); return KX_FAIL; }
    if (json) quiet = 1;

    if (!kx_is_dir(dir)) return KX_FAIL;
    if (!dry) {
        /* From here on, this process is the only kpack writing OUT's files
         * (taken before the source check, which may hash for hours). */
        if (kp_lock_take(&lock, out, err, sizeof err)) { kx_error("%s", err); return KX_FAIL; }
        if (!force && lstat(out, &st) == 0) {
            kx_error("%s already exists; use --force to replace it", out);
            kp_lock_release(&lock);
            return KX_FAIL;
        }
    }
    if (ks_open(dir, sums, &src, err, sizeof err)) {
        kx_error("%s; nothing was written", err);
        ks_free(&src);
        kp_lock_release(&lock);
        return KX_BAD;
    }
    have_src = 1;
    if (sums) ks_check_sha256(&src, threads, !quiet);
    if (!ks_ok(&src)) {
        kx_error("%s is not a complete, intact Kimi K3 checkpoint; nothing was written:", dir);
        kr_source_problems(&src, stderr);
        rc = KX_BAD;
        goto out;
    }
    if (kp_plan_build(&src, &opt, "kpack " KPACK_VERSION, &plan, err, sizeof err)) { kx_error("%s", err); goto out; }
    have_plan = 1;
    if (dry) {
        print_plan(&src, &plan, out, json);
        rc = KX_OK;
        goto out;
    }
    if (asprintf(&partial, "%s.partial", out) < 0 || asprintf(&journal, "%s.journal", out) < 0) {
        partial = journal = NULL;
        kx_error("out of memory");
        goto out;
    }

    r.src = &src;
    r.plan = &plan;
    r.partial = partial;
    r.journal = journal;
    r.sync_bytes = (uint64_t)env_long("KPACK_SYNC_BYTES", 1L << 30);
    r.kill_after = env_long("KPACK_TEST_KILL_AFTER", 0);
    r.delay_ms = env_long("KPACK_TEST_DELAY_MS", 0);
    r.pending = malloc(sizeof *r.pending * (plan.n_extents + 1));
    if (!r.pending) { kx_error("out of memory"); goto out; }

    if (resume_point(&r, partial, journal, quiet, &first)) goto out;
    {
        uint64_t done_bytes = first ? plan.extents[first - 1].offset + kpk_round_up(plan.extents[first - 1].stored_len, opt.align) : 0;
        uint64_t need = space_needed(&src, &plan, done_bytes);
        uint64_t reuse = partial_reusable(partial, done_bytes); /* an out-of-space run left them behind */
        struct statvfs vfs;
        char *copy = strdup(out);
        int sv = copy ? statvfs(dirname(copy), &vfs) : -1;
        uint64_t avail = sv == 0 ? (uint64_t)vfs.f_bavail * vfs.f_frsize : 0;
        long fake = env_long("KPACK_TEST_FREE_BYTES", -1);
        free(copy);
        if (fake >= 0) avail = (uint64_t)fake, sv = 0;
        if (sv == 0 && avail + reuse < need) {
            char b1[32], b2[32], b3[32], also[200] = "";
            kfmt_bytes(need, b1, sizeof b1);
            kfmt_bytes(avail, b2, sizeof b2);
            kfmt_bytes(reuse, b3, sizeof b3);
            if (reuse) snprintf(also, sizeof also, " plus %s (%llu bytes) that %s holds and this run rewrites", b3,
                                (unsigned long long)reuse, partial);
            kx_error("not enough free space for %s: need %s (%llu bytes), %s (%llu bytes) available%s", out, b1,
                     (unsigned long long)need, b2, (unsigned long long)avail, also);
            goto out;
        }
    }
    if (first == 0) {
        kj_close(&r.jr);
        r.fd = open(partial, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (r.fd < 0) { kx_error("cannot create %s: %s", partial, strerror(errno)); goto out; }
        if (ftruncate(r.fd, (off_t)plan.file_size)) { kx_error("cannot size %s to %llu bytes: %s", partial, (unsigned long long)plan.file_size, strerror(errno)); goto out; }
        if (kj_create(&r.jr, journal, plan.plan_id, plan.n_extents, plan.file_size)) { kx_error("cannot create %s: %s", journal, strerror(errno)); goto out; }
    } else {
        char b[32];
        r.fd = open(partial, O_RDWR | O_CLOEXEC);
        if (r.fd < 0) { kx_error("cannot open %s: %s", partial, strerror(errno)); goto out; }
        kfmt_bytes(plan.extents[first - 1].offset, b, sizeof b);
        if (clear_tail(r.fd, plan.extents[first - 1].offset + kpk_round_up(plan.extents[first - 1].stored_len, opt.align), plan.file_size)) {
            kx_error("cannot clear the unfinished part of %s: %s", partial, strerror(errno));
            goto out;
        }
        kx_note(quiet, "resuming %s: %u of %u extents (%s) already written and verified", partial, first, plan.n_extents, b);
    }
    drop_headers(&src);

    prog = kprogress_start("convert", plan.data_bytes, !quiet);
    {
        uint64_t done_data = 0;
        for (uint32_t i = 0; i < first; i++) done_data += plan.extents[i].stored_len;
        kprogress_set_done(prog, done_data);
    }
    if (kp_copy_extents(&src, &plan, r.fd, first, on_extent_done, &r, prog, &stats, err, sizeof err)) {
        kprogress_finish(prog);
        prog = NULL;
        kx_error("%s%s%s", err, r.err[0] ? ": " : "", r.err);
        kx_error("%s and %s are kept; rerun the same command to resume", partial, journal);
        goto out;
    }
    t_copy = kprogress_finish(prog);
    prog = NULL;
    if (flush_journal(&r)) {
        kx_error("%s", r.err);
        kx_error("%s and %s are kept; rerun the same command to resume", partial, journal);
        goto out;
    }
    if (kp_write_directory(r.fd, &plan) || kp_write_superblocks(r.fd, &plan)) {
        kx_error("writing the directory of %s: %s", partial, strerror(errno));
        goto out;
    }
    if (kp_check_before_publish(r.fd, partial, journal, &plan, err, sizeof err)) {
        kx_error("%s; nothing was published. Rerun the same command: it resumes from what still verifies", err);
        goto out;
    }
    if (close(r.fd)) { r.fd = -1; kx_error("closing %s: %s", partial, strerror(errno)); goto out; }
    r.fd = -1;
    if (rename(partial, out)) { kx_error("renaming %s to %s: %s", partial, out, strerror(errno)); goto out; }
    fsync_parent(out);
    kj_close(&r.jr);
    unlink(journal);
    fsync_parent(journal);
    {
        double secs = know() - t0;
        double mbps = t_copy > 0 ? (double)stats.bytes_in / t_copy / 1e6 : 0;
        if (json) {
            json_t *j = json_object();
            json_object_set_new(j, "output", json_string(out));
            json_object_set_new(j, "output_bytes", json_integer((json_int_t)plan.file_size));
            json_object_set_new(j, "extents", json_integer(plan.n_extents));
            json_object_set_new(j, "tensors", json_integer((json_int_t)plan.n_tensors));
            json_object_set_new(j, "resumed_at_extent", json_integer(first));
            json_object_set_new(j, "bytes_copied", json_integer((json_int_t)stats.bytes_in));
            json_object_set_new(j, "bytes_read", json_integer((json_int_t)stats.bytes_read));
            json_object_set_new(j, "bytes_written", json_integer((json_int_t)stats.bytes_written));
            json_object_set_new(j, "copy_seconds", json_real(t_copy));
            json_object_set_new(j, "seconds", json_real(secs));
            json_object_set_new(j, "mb_per_s", json_real(mbps));
            json_dumpf(j, stdout, JSON_INDENT(1) | JSON_SORT_KEYS);
            fputc('\n', stdout);
            json_decref(j);
        } else if (!quiet) {
            char b1[32], b2[32];
            kfmt_bytes(plan.file_size, b1, sizeof b1);
            kfmt_bytes(stats.bytes_in, b2, sizeof b2);
            fprintf(stderr, "kpack: wrote %s (%s, %u extents, %llu tensors); copied %s in %.1f s (%.0f MB/s)\n", out, b1,
                    plan.n_extents, (unsigned long long)plan.n_tensors, b2, t_copy, mbps);
        }
    }
    rc = KX_OK;
out:
    if (prog) kprogress_finish(prog);
    if (r.fd >= 0) close(r.fd);
    kj_close(&r.jr);
    kp_lock_release(&lock);
    free(r.pending);
    free(partial);
    free(journal);
    if (have_plan) kp_plan_free(&plan);
    if (have_src) ks_free(&src);
    return rc;
}
