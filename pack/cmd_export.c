/* kpack export FILE.kpk DIR: write the original files of the download back,
 * byte-identical, from the model and the archive (docs/FORMAT.md §9).
 * kpack export FILE.kpk --check: rebuild every file in memory and compare
 * its SHA-256 with the one recorded at conversion: the verdict that tells
 * the user whether the download may be deleted. */
#include "beneath.h"
#include "cli.h"
#include "rebuild.h"
#include "source.h"
#include "format/kargs.h"
#include "format/kio.h"
#include "format/kprogress.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

static const char usage[] =
    "usage: kpack export FILE.kpk DIR [--only NAME,NAME,...] [--json] [--quiet]\n"
    "       kpack export FILE.kpk --check [--sha256 SUMS] [--only NAME,...] [--threads N] [--json] [--quiet]\n"
    "\n"
    "Gives back the files of the download FILE.kpk was converted from, each one\n"
    "byte-identical to the original: the shards rebuilt from the model and the\n"
    "archive (their headers, non-text tensors and any gap bytes), and every other\n"
    "file the conversion kept (kpack info lists them). A Hugging Face cache\n"
    "snapshot comes back as plain files. Files too large to keep (--keep-max when\n"
    "converting) are listed as not kept and cannot be given back.\n"
    "\n"
    "  DIR             where the files go (created if needed; subdirectories too).\n"
    "                  Existing files are never overwritten, and nothing is written\n"
    "                  outside DIR: a symbolic link, FIFO or device where a file or\n"
    "                  directory is to go is refused, naming it. Each file is written\n"
    "                  as NAME.partial and renamed when it is complete and its SHA-256\n"
    "                  matches the one recorded at conversion; an interrupted export\n"
    "                  resumes when rerun (DIR/.kpack-export.journal lists what is done)\n"
    "  --check         write nothing: rebuild every file in memory and compare its\n"
    "                  SHA-256 with the one recorded when converting (--sha256 or a\n"
    "                  Hugging Face cache's blob names). When it says so, you may delete\n"
    "                  the download: `kpack export` gives it back. Files with no recorded\n"
    "                  SHA-256 get theirs printed, to compare with the published list\n"
    "  --sha256 SUMS   (with --check) also compare with this list (sha256sum format)\n"
    "  --only NAMES    only these files (comma-separated, as `kpack info` names them)\n"
    "  --threads N     files hashed at once by --check (default: all cores)\n"
    "  --json          machine-readable report on stdout\n"
    "  --quiet         no progress line\n"
    "\n"
    "Exit: 0 done (for --check: no file differs; read the verdict for whether the\n"
    "download may be deleted), 1 a file does not rebuild as recorded or FILE.kpk is\n"
    "damaged (named), 2 cannot run (usage, unreadable, no archive in FILE.kpk, a\n"
    "file exists in DIR, a link or special file in the way, not enough space, I/O\n"
    "error).\n";

#define BUF ((size_t)8 << 20)
#define JOURNAL ".kpack-export.journal"

/* One file to give back, and what became of it. */
struct item {
    const kr_file *f;
    const char *listed;      /* --sha256: the list's hash for it, or NULL */
    char sha[65];            /* computed */
    int state;               /* 0 to do, 1 done now, 2 done before (journal), 3 done before but changed since: hash it
                                again, -1 failed */
    int have_ident;          /* the journal recorded the finished file's identity (journal version 2) */
    unsigned long long ino;  /* the finished file: its inode, times (export_one; the journal's "done" line) */
    long long mtime_s, ctime_s;
    long mtime_ns, ctime_ns;
    int damage;              /* the failure is damage (exit 1) */
    char msg[700];
    double secs_pieces;      /* bookkeeping: the recipe's pieces */
};

/* ---- SHA-256 sink --------------------------------------------------------------- */

struct sink {
    EVP_MD_CTX *md;
    int fd;                  /* export: the partial file; -1 for --check */
    uint64_t written;
};

static int sink_fn(void *ctx, const uint8_t *buf, size_t len, uint64_t off)
{
    struct sink *s = ctx;
    if (EVP_DigestUpdate(s->md, buf, len) != 1) { errno = ENOMEM; return -1; }
    if (s->fd < 0) return 0;
    /* zero 4 KiB blocks stay holes (the file is sized at the end): a sparse
     * download comes back sparse */
    for (size_t i = 0; i < len;) {
        size_t n = len - i < 4096 ? len - i : 4096, j;
        if (kio_is_zero(buf + i, n)) { i += n; continue; }
        for (j = i + n; j < len && !kio_is_zero(buf + j, len - j < 4096 ? len - j : 4096); j += 4096) {}
        if (j > len) j = len;
        if (kio_pwrite_full(s->fd, buf + i, j - i, off + i)) return -1;
        s->written += j - i;
        i = j;
    }
    return 0;
}

static int sha_hex(EVP_MD_CTX *md, char out[65])
{
    unsigned char d[32];
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(md, d, &n) != 1 || n != 32) return -1;
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
    return 0;
}

/* Rebuild one file through sink s (fd < 0: hash only).  0, or -1 with it->msg. */
static int rebuild(kpk_file *f, struct item *it, struct sink *s, uint8_t *buf, int verify_first, kprogress *prog)
{
    kr_piece *p = NULL;
    size_t n = 0;
    kpk_err e = {0};
    double t0 = know();
    int rc = -1;
    if (kr_pieces(f, it->f, &p, &n, &e)) goto fail;
    it->secs_pieces = know() - t0;
    /* nothing to compare the result with: check the extents it reads first */
    if (verify_first && kr_verify_extents(f, p, n, &e)) goto fail;
    if (!(s->md = EVP_MD_CTX_new()) || EVP_DigestInit_ex(s->md, EVP_sha256(), NULL) != 1) {
        kpk_err_set(&e, KPK_ENOMEM, "out of memory");
        goto fail;
    }
    if (kr_stream(f, p, n, buf, BUF, sink_fn, s, prog, &e)) {
        if (!e.msg[0]) kpk_err_set(&e, KPK_EIO, "%s", strerror(errno));
        goto fail;
    }
    if (sha_hex(s->md, it->sha)) { kpk_err_set(&e, KPK_ENOMEM, "hash failed"); goto fail; }
    rc = 0;
    goto out;
fail:
    it->damage = kpk_err_is_damage(e.code);
    snprintf(it->msg, sizeof it->msg, "%s", e.msg);
out:
    EVP_MD_CTX_free(s->md);
    s->md = NULL;
    free(p);
    return rc;
}

/* The recorded and listed hashes agree with what was rebuilt; else it->msg says which does not. */
static int compare(struct item *it)
{
    if (it->f->sha256 && strcmp(it->f->sha256, it->sha) != 0) {
        snprintf(it->msg, sizeof it->msg, "SHA-256 %.16s... differs from the %.16s... recorded when converting (%s)",
                 it->sha, it->f->sha256, it->f->sha_from ? it->f->sha_from : "checked then");
        return -1;
    }
    if (it->listed && strcmp(it->listed, it->sha) != 0) {
        snprintf(it->msg, sizeof it->msg, "SHA-256 %.16s... differs from the %.16s... of the --sha256 list", it->sha, it->listed);
        return -1;
    }
    return 0;
}

/* ---- --check: every file hashed, several at once ---------------------------------- */

struct cjob { kpk_file *f; struct item *items; size_t n; _Atomic size_t next; kprogress *prog; };

static void *check_worker(void *arg)
{
    struct cjob *j = arg;
    uint8_t *buf = malloc(BUF);
    for (;;) {
        size_t i = atomic_fetch_add(&j->next, 1);
        struct sink s = {NULL, -1, 0};
        if (i >= j->n) break;
        if (!buf) { j->items[i].state = -1; snprintf(j->items[i].msg, sizeof j->items[i].msg, "out of memory"); continue; }
        if (rebuild(j->f, &j->items[i], &s, buf, 0, j->prog)) { j->items[i].state = -1; continue; }
        if (compare(&j->items[i])) { j->items[i].state = -1; j->items[i].damage = 1; continue; }
        j->items[i].state = 1;
    }
    free(buf);
    return NULL;
}

/* ---- export: files written one at a time, front to back ---------------------------- */

/* The journal of an export into DIR: "kpack-export 2 SET_ID", then one line per finished file,
 * "done SIZE SHA256 INODE MTIME CTIME NAME" (the times as SECONDS.NANOSECONDS).  A rerun trusts a
 * finished file only while it is the file this export wrote: the same inode, size and times (a
 * write to it, or a byte changed and its times set back, moves its change time).  One that
 * differs is hashed again and must give the recorded SHA-256 (issue 34.12: a byte changed after
 * a kill -9 used to pass, exit 0).  A version 1 journal's lines ("done SIZE SHA256 NAME": no
 * identity) have their files hashed again; lines appended to it are version 2's.  Opened below root as a file of its own (never through a link); returns the open
 * fd (locked), or -1.  *done_lines: the finished files it records. */
#define JOURNAL_HEAD "kpack-export %d %016llx\n"

static int journal_open(int root, const char *dir, uint64_t set_id, struct item *items, size_t n, size_t *done_lines, char *err,
                        size_t errlen)
{
    char *path, head[64], old_head[64], *text = NULL, *line, *save = NULL;
    int64_t len;
    int fd;
    *done_lines = 0;
    if (asprintf(&path, "%s/" JOURNAL, dir) < 0) { snprintf(err, errlen, "out of memory"); return -1; }
    if ((fd = kb_open_rw(root, path, JOURNAL, err, errlen)) < 0) { free(path); return -1; }
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        snprintf(err, errlen, "another kpack export is writing into %s (%s is locked); wait for it", dir, path);
        goto bad;
    }
    snprintf(head, sizeof head, JOURNAL_HEAD, 2, (unsigned long long)set_id);
    snprintf(old_head, sizeof old_head, JOURNAL_HEAD, 1, (unsigned long long)set_id);
    if ((len = kio_file_size(fd)) < 0 || len > (1 << 30) || !(text = malloc((size_t)len + 1)) ||
        (len && kio_pread_full(fd, text, (size_t)len, 0))) {
        snprintf(err, errlen, "%s: %s", path, len > (1 << 30) ? "larger than any journal of kpack export" : strerror(errno));
        goto bad;
    }
    text[len] = 0;
    if (len && strncmp(text, head, strlen(head)) && strncmp(text, old_head, strlen(old_head))) {
        /* another KPK file's: with nothing finished (a refused or killed start), it is taken over; with files
         * finished, the way on is named (issue 34.12: "unfinished export of another KPK file", and no way out) */
        size_t theirs = 0;
        for (const char *p = strstr(text, "\ndone "); p; p = strstr(p + 1, "\ndone ")) theirs++;
        if (strncmp(text, "kpack-export ", 13)) {
            snprintf(err, errlen, "%s is not a journal of kpack export; remove it (or export into another directory)", path);
            goto bad;
        }
        if (theirs) {
            snprintf(err, errlen, "%s is the journal of an unfinished export of another KPK file, which finished %zu file%s "
                     "here: finish it (run that export again), or abandon it: remove %s (the files it finished stay, and this "
                     "export will not write over them), or export into another directory", path, theirs, theirs == 1 ? "" : "s",
                     path);
            goto bad;
        }
        len = 0;                  /* nothing finished: start it anew */
        if (ftruncate(fd, 0)) { snprintf(err, errlen, "%s: %s", path, strerror(errno)); goto bad; }
    }
    if (len == 0) {
        if (kio_pwrite_full(fd, head, strlen(head), 0) || fdatasync(fd)) { snprintf(err, errlen, "%s: %s", path, strerror(errno)); goto bad; }
    } else {
        /* finished files: whole lines only (a torn last line is ignored) */
        char *end = strrchr(text, '\n');
        if (end) end[1] = 0;
        for (line = strtok_r(text + strlen(head), "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            unsigned long long size, ino = 0;
            long long ms = 0, cs = 0;
            long mn = 0, cn = 0;
            char sha[65];
            int at = 0, ident = 0;
            /* a version 1 journal's lines (kpack before 2026-12) have no identity; lines appended to it have */
            if (sscanf(line, "done %llu %64s %llu %lld.%ld %lld.%ld %n", &size, sha, &ino, &ms, &mn, &cs, &cn, &at) == 7 && at) ident = 1;
            else if (sscanf(line, "done %llu %64s %n", &size, sha, &at) == 2 && at) ident = 0;
            else continue;
            (*done_lines)++;
            for (size_t i = 0; i < n; i++)
                if (strcmp(items[i].f->name, line + at) == 0 && items[i].f->size == size) {
                    memcpy(items[i].sha, sha, 65);
                    items[i].state = 2;
                    items[i].have_ident = ident;
                    items[i].ino = ino;
                    items[i].mtime_s = ms;
                    items[i].mtime_ns = mn;
                    items[i].ctime_s = cs;
                    items[i].ctime_ns = cn;
                }
        }
    }
    free(text);
    free(path);
    return fd;
bad:
    free(text);
    free(path);
    close(fd);
    return -1;
}

static int journal_append(int fd, const struct item *it)
{
    char *line;
    int64_t end = kio_file_size(fd);
    int rc;
    if (end < 0 || asprintf(&line, "done %llu %s %llu %lld.%09ld %lld.%09ld %s\n", (unsigned long long)it->f->size, it->sha, it->ino,
                            it->mtime_s, it->mtime_ns, it->ctime_s, it->ctime_ns, it->f->name) < 0)
        return -1;
    rc = kio_pwrite_full(fd, line, strlen(line), (uint64_t)end) || fdatasync(fd) ? -1 : 0;
    free(line);
    return rc;
}

static void take_ident(struct item *it, const struct stat *st)
{
    it->ino = (unsigned long long)st->st_ino;
    it->mtime_s = (long long)st->st_mtim.tv_sec;
    it->mtime_ns = st->st_mtim.tv_nsec;
    it->ctime_s = (long long)st->st_ctim.tv_sec;
    it->ctime_ns = st->st_ctim.tv_nsec;
}

static int same_ident(const struct item *it, const struct stat *st)
{
    return it->have_ident && it->ino == (unsigned long long)st->st_ino && it->mtime_s == (long long)st->st_mtim.tv_sec &&
           it->mtime_ns == st->st_mtim.tv_nsec && it->ctime_s == (long long)st->st_ctim.tv_sec && it->ctime_ns == st->st_ctim.tv_nsec;
}

/* A file an earlier run finished, changed since (or journaled without its identity): hashed again
 * from DIR/NAME; it stays only if it is still what was recorded.  0 (it->state 2, its identity
 * taken anew), or -1 with it->msg (damage: the file is not what the export wrote). */
static int recheck_one(int root, const char *dir, struct item *it, uint8_t *buf)
{
    const char *base;
    char want[65];
    struct stat st;
    EVP_MD_CTX *md = NULL;
    int pfd = kb_parent(root, dir, it->f->name, 0, &base, it->msg, sizeof it->msg), fd = -1, rc = -1;
    uint64_t off = 0;
    memcpy(want, it->sha, sizeof want);
    if (pfd < 0) goto out;
    if ((fd = openat(pfd, base, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) < 0 || fstat(fd, &st)) {
        snprintf(it->msg, sizeof it->msg, "%s/%s: %s", dir, it->f->name, strerror(errno));
        goto out;
    }
    if (!(md = EVP_MD_CTX_new()) || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) { snprintf(it->msg, sizeof it->msg, "out of memory"); goto out; }
    for (;;) {
        ssize_t got = pread(fd, buf, BUF, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) { snprintf(it->msg, sizeof it->msg, "reading %s/%s: %s", dir, it->f->name, strerror(errno)); goto out; }
        if (!got) break;
        if (EVP_DigestUpdate(md, buf, (size_t)got) != 1) { snprintf(it->msg, sizeof it->msg, "out of memory"); goto out; }
        off += (uint64_t)got;
    }
    if (sha_hex(md, it->sha)) { snprintf(it->msg, sizeof it->msg, "hash failed"); goto out; }
    if (off != it->f->size || strcmp(it->sha, want)) {
        it->damage = 1;
        snprintf(it->msg, sizeof it->msg, "%s/%s was changed after an earlier run of this export wrote it (SHA-256 %.16s..., "
                 "written as %.16s...); kpack export never overwrites a file: remove it, and run the export again to write it anew",
                 dir, it->f->name, it->sha, want);
        goto out;
    }
    take_ident(it, &st);
    rc = 0;
out:
    EVP_MD_CTX_free(md);
    if (fd >= 0) close(fd);
    if (pfd >= 0) close(pfd);
    return rc;
}

/* Write one file as DIR/NAME.partial, check it, rename it to DIR/NAME (which
 * must not exist).  Every directory on the way is opened below root, never
 * through a link.  0, or -1 with it->msg. */
static int export_one(kpk_file *f, int root, const char *dir, struct item *it, uint8_t *buf, kprogress *prog)
{
    char *path = NULL, *partial = NULL, *pbase = NULL;
    const char *base;
    struct sink s = {NULL, -1, 0};
    int rc = -1, pfd = -1;
    if (asprintf(&path, "%s/%s", dir, it->f->name) < 0 || asprintf(&partial, "%s/%s.partial", dir, it->f->name) < 0) {
        snprintf(it->msg, sizeof it->msg, "out of memory");
        goto out;
    }
    if ((pfd = kb_parent(root, dir, it->f->name, 1, &base, it->msg, sizeof it->msg)) < 0) goto out;
    if (asprintf(&pbase, "%s.partial", base) < 0) { snprintf(it->msg, sizeof it->msg, "out of memory"); goto out; }
    if ((s.fd = kb_create(pfd, partial, pbase, it->msg, sizeof it->msg)) < 0) goto out;
    if (rebuild(f, it, &s, buf, !it->f->sha256 && !it->listed, prog)) goto out;
    if (ftruncate(s.fd, (off_t)it->f->size) || fdatasync(s.fd)) {
        snprintf(it->msg, sizeof it->msg, "writing %s: %s", partial, strerror(errno));
        goto out;
    }
    if (compare(it)) {
        it->damage = 1;
        unlinkat(pfd, pbase, 0); /* never leave a wrong file where a right one is expected */
        goto out;
    }
    if (close(s.fd)) { s.fd = -1; snprintf(it->msg, sizeof it->msg, "closing %s: %s", partial, strerror(errno)); goto out; }
    s.fd = -1;
    if (kb_publish(pfd, pbase, base)) {
        snprintf(it->msg, sizeof it->msg, errno == EEXIST ? "%s appeared while it was written; kpack export never overwrites "
                 "a file (%s is complete: compare, then remove one)" : "renaming %s: %s", errno == EEXIST ? path : partial,
                 errno == EEXIST ? partial : strerror(errno));
        goto out;
    }
    if (fsync(pfd)) { snprintf(it->msg, sizeof it->msg, "syncing the directory of %s: %s", path, strerror(errno)); goto out; }
    {
        /* its identity, for the journal: a rerun trusts the file while it is this one, unchanged */
        struct stat st;
        if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW)) { snprintf(it->msg, sizeof it->msg, "%s: %s", path, strerror(errno)); goto out; }
        take_ident(it, &st);
    }
    rc = 0;
out:
    if (s.fd >= 0) close(s.fd);
    if (pfd >= 0) close(pfd);
    free(path);
    free(partial);
    free(pbase);
    return rc;
}

/* Before anything is written: every file still to write has a free name in DIR, and
 * nothing on the way to it is a link or a non-directory; its NAME.partial, if any, is
 * a regular file (an interrupted export's).  Every problem is named.  0, or -1. */
static int preflight(int root, const char *dir, struct item *items, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        char err[900], *partial;
        int r = kb_stat(root, dir, items[i].f->name, &st, err, sizeof err);
        if (r < 0) { kx_error("%s", err); bad = 1; continue; }
        if (items[i].state == 2 && (r != KB_PRESENT || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != items[i].f->size))
            items[i].state = r == KB_PRESENT ? 3 : 0; /* gone: write it again; changed: hash it again (export never overwrites it) */
        else if (items[i].state == 2 && !same_ident(&items[i], &st))
            items[i].state = 3;   /* the file is not as this export left it: hashed again before it is counted done */
        if (items[i].state == 0 && r == KB_PRESENT) {
            kx_error("%s/%s already exists; kpack export never overwrites a file (it is %s: remove it, or export into "
                     "another directory)", dir, items[i].f->name, kio_file_kind(&st));
            bad = 1;
        }
        if (items[i].state != 0 || asprintf(&partial, "%s.partial", items[i].f->name) < 0) continue;
        if (kb_stat(root, dir, partial, &st, err, sizeof err) == KB_PRESENT && !S_ISREG(st.st_mode)) {
            kx_error("%s/%s is %s: kpack export writes the file there, and does not write through or remove it; remove it "
                     "(or export into another directory)", dir, partial, kio_file_kind(&st));
            bad = 1;
        }
        free(partial);
    }
    return bad ? -1 : 0;
}

/* ---- the command ------------------------------------------------------------------ */

static int has_name(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *c = list; c && *c;) {
        const char *e = strchr(c, ',');
        size_t len = e ? (size_t)(e - c) : strlen(c);
        if (len == n && strncmp(c, name, n) == 0) return 1;
        c = e ? e + 1 : NULL;
    }
    return 0;
}

/* Every name of --only must be a file of the recipe (or say why it is not). */
static int check_only(const kr_recipe *r, const char *only)
{
    char *dup = strdup(only), *save = NULL;
    int bad = 0;
    for (char *c = strtok_r(dup, ",", &save); c; c = strtok_r(NULL, ",", &save)) {
        size_t i;
        json_t *it;
        if (kr_find(r, c)) continue;
        bad = 1;
        json_array_foreach(r->not_kept, i, it)
            if (strcmp(json_string_value(json_object_get(it, "name")) ? json_string_value(json_object_get(it, "name")) : "", c) == 0) {
                kx_error("--only %s: that file was not kept when converting (%s); it cannot be given back", c,
                         json_string_value(json_object_get(it, "reason")) ? json_string_value(json_object_get(it, "reason")) : "no reason recorded");
                break;
            }
        if (i == json_array_size(r->not_kept)) kx_error("--only %s: no such file in the archive (kpack info lists them)", c);
    }
    free(dup);
    return bad ? -1 : 0;
}

/* Bytes the files still to write will take: their sizes, as dense as FILE.kpk is. */
static uint64_t space_needed(kpk_file *f, const struct item *items, size_t n)
{
    uint64_t size = 0, alloc = 0, need = 0;
    for (uint16_t m = 0; m < kpk_member_count(f); m++) {
        struct stat st;
        if (fstat(kpk_member_fd(f, m), &st) == 0) { size += (uint64_t)st.st_size; alloc += (uint64_t)st.st_blocks * 512; }
    }
    for (size_t i = 0; i < n; i++)
        if (items[i].state == 0) need += items[i].f->size;
    return size && alloc < size ? (uint64_t)((double)need * (double)alloc / (double)size) : need;
}

static void report(const char *path, struct item *items, size_t n, const kr_recipe *r, int check, int only, int json,
                   double secs, double secs_pieces, uint64_t bytes, int *rc)
{
    size_t bad = 0, unconfirmed = 0, n_nk = only ? 0 : json_array_size(r->not_kept), done_before = 0;
    int permission;
    json_t *j = json ? json_object() : NULL, *a = json ? json_array() : NULL;
    for (size_t i = 0; i < n; i++) {
        struct item *it = &items[i];
        const char *how = it->f->sha256 ? "as recorded when converting" : it->listed ? "as the --sha256 list says" : NULL;
        if (it->state == 0) continue; /* not reached (an export stops at its first failure) */
        if (it->state < 0) bad++;
        else if (!it->f->sha256 && !it->listed) unconfirmed++;
        if (it->state == 2) done_before++;
        if (j) {
            json_t *o = json_object();
            json_object_set_new(o, "name", json_string(it->f->name));
            json_object_set_new(o, "size", json_integer((json_int_t)it->f->size));
            json_object_set_new(o, "sha256", it->state > 0 ? json_string(it->sha) : json_null());
            json_object_set_new(o, "recorded_sha256", it->f->sha256 ? json_string(it->f->sha256) : json_null());
            json_object_set_new(o, "ok", json_boolean(it->state > 0));
            json_object_set_new(o, "confirmed", json_boolean(it->state > 0 && how));
            if (it->state < 0) json_object_set_new(o, "error", json_string(it->msg));
            json_array_append_new(a, o);
        } else if (it->state < 0) {
            printf("FAILED  %s: %s\n", it->f->name, it->msg);
        } else {
            printf("%s  %s  %s (%s)\n", check ? (how ? "OK     " : "rebuilt") : it->state == 2 ? "had   " : "wrote ", it->sha, it->f->name,
                   how ? how : "no SHA-256 was recorded: compare it with the published list");
        }
    }
    permission = !bad && !unconfirmed && !n_nk && !only;
    if (j) {
        json_object_set_new(j, "file", json_string(path));
        json_object_set_new(j, "mode", json_string(check ? "check" : "export"));
        json_object_set_new(j, "files", a);
        json_object_set_new(j, "failed", json_integer((json_int_t)bad));
        json_object_set_new(j, "unconfirmed", json_integer((json_int_t)unconfirmed));
        json_object_set_new(j, "not_kept", only || !r->not_kept ? json_array() : json_incref(r->not_kept));
        json_object_set_new(j, "bytes", json_integer((json_int_t)bytes));
        json_object_set_new(j, "seconds", json_real(secs));
        json_object_set_new(j, "seconds_bookkeeping", json_real(secs_pieces));
        if (check) json_object_set_new(j, "permission_to_delete_download", json_boolean(permission));
        json_dumpf(j, stdout, JSON_INDENT(1) | JSON_SORT_KEYS);
        fputc('\n', stdout);
        json_decref(j);
    } else {
        char b[32];
        size_t i;
        json_t *it;
        json_array_foreach(only ? NULL : r->not_kept, i, it)
            printf("NOT KEPT  %s (%lld bytes): %s\n", json_string_value(json_object_get(it, "name")),
                   (long long)json_integer_value(json_object_get(it, "size")), json_string_value(json_object_get(it, "reason")));
        kfmt_bytes(bytes, b, sizeof b);
        printf("%s: %zu file%s, %s %s in %.2f s (%.0f MB/s; of which the recipe's bookkeeping %.3f s)\n", path, n,
               n == 1 ? "" : "s", b, check ? "rebuilt and hashed" : "written", secs, secs > 0 ? (double)bytes / secs / 1e6 : 0.0,
               secs_pieces);
        if (!check && done_before) printf("(%zu of them were already written by an earlier run of this export)\n", done_before);
        if (bad)
            printf("%s: %zu file%s did not rebuild as %s (named above)%s\n", check ? "NOT OK" : "FAILED", bad, bad == 1 ? "" : "s",
                   "downloaded", check ? ": do NOT delete the download" : "");
        else if (check && permission)
            printf("OK: every file of the download rebuilds bit for bit, its SHA-256 as recorded when converting. You may "
                   "delete the download: `kpack export %s DIR` gives it back.\n", path);
        else if (check) {
            printf("Every file checked rebuilds, but this is NOT yet permission to delete the download:\n");
            if (only) printf("  - only the files named by --only were checked\n");
            if (unconfirmed)
                printf("  - no SHA-256 was recorded for %zu file%s (the conversion had neither --sha256 nor a Hugging Face "
                       "cache's blob names): compare the SHA-256s above with the published list, or rerun with --sha256 SUMS\n",
                       unconfirmed, unconfirmed == 1 ? "" : "s");
            if (n_nk)
                printf("  - %zu file%s of the download %s not kept (listed above): deleting the download loses %s; keep %s\n",
                       n_nk, n_nk == 1 ? "" : "s", n_nk == 1 ? "was" : "were", n_nk == 1 ? "it" : "them", n_nk == 1 ? "it" : "them");
        }
    }
    for (size_t i = 0; i < n; i++)
        if (items[i].state < 0) *rc = items[i].damage || *rc == KX_BAD ? KX_BAD : KX_FAIL;
}

int cmd_export(int argc, char **argv)
{
    const char *path = NULL, *dir = NULL, *only = NULL, *sums = NULL, *v;
    int check = 0, json = 0, quiet = 0, threads = kx_cpus(), rc = KX_OK, damaged = 0, jfd = -1, root = -1;
    size_t journaled = 0;        /* finished files the journal records (an earlier run's and this one's) */
    kpk_file *f = NULL;
    kpk_err e = {0};
    kr_recipe r = {0};
    struct item *items = NULL;
    size_t n = 0;
    ks_sum *listed = NULL;
    size_t n_listed = 0;
    char err[1200];
    uint64_t total = 0;
    double t0, secs_pieces = 0;
    kprogress *prog;
    long k;

    for (int i = 1; i < argc; i++) {
        if (kx_flag(argc, argv, &i, "--help", NULL) || kx_flag(argc, argv, &i, "-h", NULL)) { fputs(usage, stdout); return KX_OK; }
        else if (kx_flag(argc, argv, &i, "--check", NULL)) check = 1;
        else if (kx_flag(argc, argv, &i, "--only", &v)) only = v;
        else if (kx_flag(argc, argv, &i, "--sha256", &v)) sums = v;
        else if (kx_flag(argc, argv, &i, "--threads", &v)) {
            if (kargs_long(v, 1, 256, &k)) { kx_error("--threads: expected 1..256, got %s", v); return KX_FAIL; }
            threads = (int)k;
        } else if (kx_flag(argc, argv, &i, "--json", NULL)) json = 1;
        else if (kx_flag(argc, argv, &i, "--quiet", NULL)) quiet = 1;
        else if (argv[i][0] == '-') { kx_error("export: unknown option %s", argv[i]); fputs(usage, stderr); return KX_FAIL; }
        else if (!path) path = argv[i];
        else if (!dir) dir = argv[i];
        else { kx_error("export: unexpected argument %s", argv[i]); return KX_FAIL; }
    }
    if (!path || (!check && !dir) || (check && dir)) {
        if (path) kx_error(check ? "export --check writes nothing: give no DIR" : "export: where to? give a DIR (or --check)");
        fputs(usage, stderr);
        return KX_FAIL;
    }
    if (sums && !check) { kx_error("--sha256 goes with --check (an export compares with the hashes recorded when converting)"); return KX_FAIL; }
    if (json) quiet = 1;

    if (kpk_open(path, &f, &e)) { kx_error("%s", e.msg); return kpk_err_is_damage(e.code) ? KX_BAD : KX_FAIL; }
    t0 = know();
    if (kr_recipe_load(f, &r, &damaged, err, sizeof err)) { kx_error("%s", err); rc = damaged ? KX_BAD : KX_FAIL; goto out; }
    /* every file's pieces, before a byte is written (what verify checks) */
    if (kr_check(f, &damaged, err, sizeof err)) { kx_error("%s", err); rc = damaged ? KX_BAD : KX_FAIL; goto out; }
    if (only && check_only(&r, only)) { rc = KX_FAIL; goto out; }
    if (sums && ks_sums_read(sums, &listed, &n_listed, err, sizeof err)) { kx_error("%s", err); rc = KX_FAIL; goto out; }
    if (!(items = calloc(r.n + 1, sizeof *items))) { kx_error("out of memory"); rc = KX_FAIL; goto out; }
    for (size_t i = 0; i < r.n; i++) {
        if (only && !has_name(only, r.files[i].name)) continue;
        items[n].f = &r.files[i];
        for (size_t l = 0; l < n_listed; l++) {
            const char *base = strrchr(listed[l].name, '/');
            if (strcmp(listed[l].name, r.files[i].name) == 0 ||
                (!strchr(r.files[i].name, '/') && base && strcmp(base + 1, r.files[i].name) == 0))
                items[n].listed = listed[l].sha;
        }
        n++;
    }
    secs_pieces = know() - t0;

    if (check) {
        struct cjob job = {.f = f, .items = items, .n = n};
        pthread_t *tid = calloc((size_t)threads, sizeof *tid);
        int started = 0;
        for (size_t i = 0; i < n; i++) total += items[i].f->size;
        job.prog = prog = kprogress_start("export --check", total, !quiet);
        t0 = know();
        for (int i = 1; tid && i < threads && (size_t)i < n; i++)
            if (pthread_create(&tid[i], NULL, check_worker, &job) == 0) started++;
        check_worker(&job);
        for (int i = 1; i <= started; i++) pthread_join(tid[i], NULL);
        free(tid);
        kprogress_finish(prog);
        for (size_t i = 0; i < n; i++) secs_pieces += items[i].secs_pieces;
        report(path, items, n, &r, 1, only != NULL, json, know() - t0, secs_pieces, total, &rc);
        goto out;
    }

    /* export into dir: nothing of the user's is overwritten, nothing is written outside
     * dir (beneath.h), there is room, one writer */
    if ((root = kb_open_root(dir, err, sizeof err)) < 0) { kx_error("%s", err); rc = KX_FAIL; goto out; }
    if ((jfd = journal_open(root, dir, kpk_super(f)->set_id, items, n, &journaled, err, sizeof err)) < 0) { kx_error("%s", err); rc = KX_FAIL; goto out; }
    if (preflight(root, dir, items, n)) { rc = KX_FAIL; goto out; }
    {
        struct statvfs vfs;
        uint64_t need = space_needed(f, items, n);
        if (fstatvfs(root, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < need) {
            char b1[32], b2[32];
            kfmt_bytes(need, b1, sizeof b1);
            kfmt_bytes((uint64_t)vfs.f_bavail * vfs.f_frsize, b2, sizeof b2);
            kx_error("not enough free space in %s: the files to write need %s (%llu bytes), %s available", dir, b1,
                     (unsigned long long)need, b2);
            rc = KX_FAIL;
            goto out;
        }
    }
    for (size_t i = 0; i < n; i++) total += items[i].state == 0 ? items[i].f->size : 0;
    prog = kprogress_start("export", total, !quiet);
    t0 = know();
    {
        uint8_t *buf = malloc(BUF);
        const char *kill_env = getenv("KPACK_TEST_EXPORT_KILL_AFTER"); /* test hook: SIGKILL after this many files */
        long kill_after = kill_env ? atol(kill_env) : 0, written = 0;
        for (size_t i = 0; i < n && buf; i++) {
            if (items[i].state == 3) {
                if (recheck_one(root, dir, &items[i], buf)) { items[i].state = -1; break; }
                items[i].state = 2;
                if (journal_append(jfd, &items[i])) {
                    kx_error("writing %s/" JOURNAL ": %s", dir, strerror(errno));
                    rc = KX_FAIL;
                    break;
                }
                journaled++;
                continue;
            }
            if (items[i].state == 2) continue;
            if (export_one(f, root, dir, &items[i], buf, prog)) { items[i].state = -1; break; } /* stop at the first failure */
            items[i].state = 1;
            if (journal_append(jfd, &items[i])) {
                kx_error("writing %s/" JOURNAL ": %s", dir, strerror(errno));
                rc = KX_FAIL;
                break;
            }
            journaled++;
            if (kill_after > 0 && ++written == kill_after) raise(SIGKILL);
        }
        if (!buf) { kx_error("out of memory"); rc = KX_FAIL; }
        free(buf);
    }
    kprogress_finish(prog);
    for (size_t i = 0; i < n; i++) secs_pieces += items[i].secs_pieces;
    report(path, items, n, &r, 0, only != NULL, json, know() - t0, secs_pieces, total, &rc);
    if (rc == KX_OK) { /* every file is there: the journal has done its job */
        unlinkat(root, JOURNAL, 0);
    } else {
        kx_error("files written so far are kept; rerun the same command to resume");
    }
out:
    /* a journal that records nothing finished holds nothing to resume: an export refused before
     * its first file (no space, a name taken) leaves no journal to stand in another's way */
    if (jfd >= 0 && rc != KX_OK && !journaled) unlinkat(root, JOURNAL, 0);
    if (jfd >= 0) close(jfd);
    if (root >= 0) close(root);
    ks_sums_free(listed, n_listed);
    free(items);
    kr_recipe_free(&r);
    kpk_close(f);
    return rc;
}
