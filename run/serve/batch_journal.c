/* krun batch's journal (batch.h): the output line of every finished request, durable before the
 * next is recorded, so that a job killed at any moment continues where it was, and no request
 * whose line was recorded runs again.  The journal is the only file written while the job runs;
 * OUT appears whole at the end (batch_job.c). */
#include "batch.h"

#include "format/kio.h"
#include "run/util/savefile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define KBJ_MAGIC "krun-batch-journal 1"
/* a journal is at most IN's outputs: generous, but bounded */
#define KBJ_MAX ((size_t)16 << 30)

static void drop_lines(kbatch_journal *j)
{
    for (size_t k = 0; j->lines && k < j->n_items; k++) free(j->lines[k]);
    free(j->lines);
    j->lines = NULL;
    j->n_recorded = 0;
}

/* The item of line `line` (items are in line order). */
static long item_of(const kbatch_input *in, size_t line)
{
    size_t lo = 0, hi = in->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (in->items[mid].line < line) lo = mid + 1;
        else hi = mid;
    }
    return lo < in->n && in->items[lo].line == line ? (long)lo : -1;
}

static uint64_t record_hash(const char *rec, size_t n) { return XXH3_64bits(rec, n); }

/* Read every valid record of text (after the header, at `at`) into j->lines; j->end: where the
 * valid records end.  A record that is torn, damaged, for a line not in IN, or a second one for
 * its line ends the valid part.  -1: out of memory. */
static int read_records(kbatch_journal *j, const kbatch_input *in, const char *text, size_t len, size_t at)
{
    j->end = at;
    while (at < len) {
        const char *nl = memchr(text + at, '\n', len - at), *p = text + at, *sp;
        unsigned long long line, h;
        char *e;
        long k;
        if (!nl) break;                                          /* torn: no newline */
        line = strtoull(p, &e, 10);
        if (e == p || *e != ' ' || e + 18 > nl || e[17] != ' ') break;
        sp = e;                                                  /* "LINE" ends here */
        h = strtoull(e + 1, &e, 16);
        if (e != sp + 17) break;
        /* the checksum covers "LINE OUTPUT": the line number and the output, not the checksum */
        {
            size_t n1 = (size_t)(sp - p), n2 = (size_t)(nl - (sp + 18));
            char *buf = malloc(n1 + 1 + n2 + 1);
            uint64_t want;
            if (!buf) return -1;
            memcpy(buf, p, n1);
            buf[n1] = ' ';
            memcpy(buf + n1 + 1, sp + 18, n2);
            want = record_hash(buf, n1 + 1 + n2);
            free(buf);
            if (want != h) break;
            k = item_of(in, (size_t)line);
            if (k < 0 || j->lines[k]) break;
            if (!(j->lines[k] = strndup(sp + 18, n2))) return -1;
        }
        j->n_recorded++;
        at = (size_t)(nl - text) + 1;
        j->end = at;
    }
    return 0;
}

static int write_header(kbatch_journal *j, krun_err *err)
{
    char h[160];
    int n = snprintf(h, sizeof h, KBJ_MAGIC " key=%016" PRIx64 " seed=%" PRIu64 " created=%lld\n", j->key, j->seed, j->created);
    if (ftruncate(j->fd, 0) || kio_pwrite_full(j->fd, h, (size_t)n, 0) || fdatasync(j->fd))
        return krun_err_set(err, KRUN_EINPUT, "cannot write %s: %s", j->path, strerror(errno));
    j->end = (uint64_t)n;
    return 0;
}

/* Temporary files of OUT's saves left by a job that was killed (OUT.tmp-PID-N, savefile.h): the
 * journal's lock is held, so no other job of this OUT is saving. */
static void remove_stale_saves(const char *out)
{
    char *dir = strdup(out), *slash;
    const char *base, *d;
    size_t bn;
    DIR *dp;
    struct dirent *de;
    if (!dir) return;
    slash = strrchr(dir, '/');
    base = slash ? out + (slash - dir) + 1 : out;
    if (!slash) d = ".";
    else if (slash == dir) d = "/";
    else { *slash = 0; d = dir; }
    bn = strlen(base);
    if ((dp = opendir(d))) {
        while ((de = readdir(dp))) {
            const char *t = de->d_name + bn;
            if (strncmp(de->d_name, base, bn) || strncmp(t, ".tmp-", 5)) continue;
            t += 5;
            if (strspn(t, "0123456789") == 0) continue;
            t += strspn(t, "0123456789");
            if (*t != '-' || strspn(t + 1, "0123456789") != strlen(t + 1) || !t[1]) continue;
            unlinkat(dirfd(dp), de->d_name, 0);
        }
        closedir(dp);
    }
    free(dir);
}

int kbatch_journal_open(kbatch_journal *j, const char *out, const kbatch_input *in, uint64_t key, uint64_t *seed, int seed_given,
                        long long *created, int created_given, int force, krun_err *err)
{
    char *text = NULL;
    size_t len = 0;
    int64_t size;
    struct stat st;
    memset(j, 0, sizeof *j);
    j->fd = -1;
    j->key = key;
    j->n_items = in->n;
    if (asprintf(&j->path, "%s.krun-journal", out) < 0) { j->path = NULL; return krun_err_set(err, KRUN_ENOMEM, "out of memory"); }
    if (!(j->lines = calloc(in->n ? in->n : 1, sizeof *j->lines))) goto oom;
    if (!lstat(j->path, &st) && !S_ISREG(st.st_mode)) {
        krun_err_set(err, KRUN_EINPUT, "%s is %s, not a krun batch journal: move it away", j->path, kio_file_kind(&st));
        goto fail;
    }
    j->fd = open(j->path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (j->fd < 0) { krun_err_set(err, KRUN_EINPUT, "cannot open %s: %s", j->path, strerror(errno)); goto fail; }
    /* The trust boundary (issue 34.13; docs/BATCH.md, "The journal"): a record's checksum finds a
     * torn or damaged record, not a forged one -- whoever can write the journal can write records
     * with checksums that hold, and krun copies them into OUT as they are.  So the journal must be
     * writable by this user alone: made 0600, and one owned by another user or writable by its
     * group or others is refused, since anyone who could write it could put outputs into OUT that
     * this job never computed.  (A key held elsewhere would add nothing: whoever can write this
     * user's files can read that key too, and can write OUT itself.) */
    if (fstat(j->fd, &st) || st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH))) {
        krun_err_set(err, KRUN_EINPUT, "%s is %s: anyone who can write a job's journal can put outputs into OUT that the job "
                     "never computed; krun batch makes its journal writable by its owner alone: remove it (or chmod go-w it, if "
                     "it is yours) and run the command again", j->path,
                     st.st_uid != geteuid() ? "owned by another user" : "writable by its group or others");
        goto fail;
    }
    if (flock(j->fd, LOCK_EX | LOCK_NB)) {
        krun_err_set(err, KRUN_EINPUT, "%s is being written by another krun batch (its journal %s is locked): wait for it, or give "
                     "another OUT", out, j->path);
        goto fail;
    }
    remove_stale_saves(out);
    size = kio_file_size(j->fd);
    if (size < 0) { krun_err_set(err, KRUN_EINPUT, "cannot read %s: %s", j->path, strerror(errno)); goto fail; }
    if (size > 0) {
        /* a header cut short (the first write was interrupted) holds nothing: start afresh */
        char magic[64];
        unsigned long long k, sd;
        long long cr;
        int used = 0;
        if ((size_t)size > KBJ_MAX) { krun_err_set(err, KRUN_EINPUT, "%s is larger than a journal can be: remove it", j->path); goto fail; }
        if (!(text = malloc((size_t)size + 1))) goto oom;
        if (kio_pread_full(j->fd, text, (size_t)size, 0)) { krun_err_set(err, KRUN_EINPUT, "cannot read %s: %s", j->path, strerror(errno)); goto fail; }
        len = (size_t)size;
        text[len] = 0;
        if (!memchr(text, '\n', len)) goto fresh;
        if (sscanf(text, "%63[^=]=%16llx seed=%llu created=%lld\n%n", magic, &k, &sd, &cr, &used) == 4 && used > 0 &&
            !strcmp(magic, KBJ_MAGIC " key") && text[used - 1] == '\n' && k == key &&
            (!seed_given || sd == *seed) && (!created_given || cr == *created)) {
            j->seed = *seed = sd;
            j->created = *created = cr;
            if (read_records(j, in, text, len, (size_t)used)) goto oom;
            /* cut off a torn or damaged tail: the next record follows the last good one */
            if (j->end < len && (ftruncate(j->fd, (off_t)j->end) || fdatasync(j->fd))) {
                krun_err_set(err, KRUN_EINPUT, "cannot truncate %s: %s", j->path, strerror(errno));
                goto fail;
            }
            free(text);
            return 0;
        }
        if (!force) {
            krun_err_set(err, KRUN_EINPUT, "%s belongs to another job (another input, model, --ctx, --model-name, --seed or "
                         "--created): run that job's command to finish it, or --force to start this one over", j->path);
            free(text);
            text = NULL;
            close(j->fd);
            j->fd = -1;
            drop_lines(j);
            free(j->path);
            j->path = NULL;
            return 1;
        }
fresh:
        free(text);
        text = NULL;
    }
    j->seed = *seed;
    j->created = *created;
    if (write_header(j, err)) goto fail;
    {
        /* the journal's name durable in its directory */
        krun_err e2;
        int dfd = ksave_lock_dir(j->path, &e2);
        if (dfd >= 0) { fsync(dfd); close(dfd); }
    }
    return 0;
oom:
    krun_err_set(err, KRUN_ENOMEM, "out of memory");
fail:
    free(text);
    kbatch_journal_close(j);
    return -1;
}

int kbatch_journal_add(kbatch_journal *j, const kbatch_input *in, size_t k, const char *line, krun_err *err)
{
    char head[48];
    size_t ln = strlen(line);
    int hn = snprintf(head, sizeof head, "%zu ", in->items[k].line);
    char *rec = malloc((size_t)hn + 17 + ln + 1), *copy = strdup(line);
    uint64_t h;
    size_t n;
    if (!rec || !copy) { free(rec); free(copy); return krun_err_set(err, KRUN_ENOMEM, "out of memory"); }
    /* hashed: "LINE OUTPUT"; written: "LINE HEX16 OUTPUT\n" */
    memcpy(rec, head, (size_t)hn);
    memcpy(rec + hn, line, ln);
    h = record_hash(rec, (size_t)hn + ln);
    n = (size_t)snprintf(rec + hn, 18, "%016" PRIx64 " ", h) + (size_t)hn;
    memcpy(rec + n, line, ln);
    rec[n + ln] = '\n';
    n += ln + 1;
    if (kio_pwrite_full(j->fd, rec, n, j->end) || fdatasync(j->fd)) {
        int e = errno;
        if (ftruncate(j->fd, (off_t)j->end)) {}     /* a partial record is cut off again at the next open anyway */
        free(rec);
        free(copy);
        return krun_err_set(err, KRUN_EINPUT, "cannot write %s: %s", j->path, strerror(e));
    }
    free(rec);
    j->end += n;
    if (j->lines[k]) free(j->lines[k]);
    else j->n_recorded++;
    j->lines[k] = copy;
    return 0;
}

int kbatch_journal_remove(kbatch_journal *j, krun_err *err)
{
    int dfd;
    if (unlink(j->path)) return krun_err_set(err, KRUN_EINPUT, "cannot remove %s: %s", j->path, strerror(errno));
    dfd = ksave_lock_dir(j->path, err);
    if (dfd < 0) return -1;
    if (fsync(dfd)) { close(dfd); return krun_err_set(err, KRUN_EINPUT, "cannot sync the directory of %s: %s", j->path, strerror(errno)); }
    close(dfd);
    return 0;
}

void kbatch_journal_close(kbatch_journal *j)
{
    if (j->fd >= 0) close(j->fd);
    j->fd = -1;
    drop_lines(j);
    free(j->path);
    j->path = NULL;
}
