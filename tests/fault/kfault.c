/* kfault: an LD_PRELOAD shim that makes chosen I/O calls fail, for the
 * fault-injection tests (tests/cli/test_faults.sh) and the soak campaign.
 *
 *   KFAULT_CALLS=pread,write   which calls: read pread (and preadv) write pwrite fsync
 *                              fdatasync open ftruncate fallocate sync (=
 *                              sync_file_range) rename (rename, renameat,
 *                              renameat2; the path is the source name) unlink
 *                              (unlink, unlinkat);
 *                              "io" = read,pread,write,pwrite
 *   KFAULT_NTH=N               the N-th matching call fails (1-based; default 1)
 *   KFAULT_COUNT=K             and the K-1 after it too (default 1; 0 = every one from N on)
 *   KFAULT_ERR=EIO|ENOSPC|EACCES|SHORT|KILL|FLIP   the errno, or SHORT: a read or write
 *                              moves half the bytes asked for and reports that,
 *                              or KILL: SIGKILL instead of making the call (a
 *                              crash just before it, e.g. between two renames),
 *                              or FLIP: a read succeeds with one bit of what it
 *                              read flipped (the middle byte's lowest), as a
 *                              disk that returns other bytes than it holds
 *   KFAULT_PATH=PATTERN        only calls on files whose path matches this
 *                              fnmatch(3) pattern (e.g. '*.kpk.partial'), so the
 *                              harness's own I/O is left alone
 *   KFAULT_KILL_AFTER_BYTES=N  SIGKILL the process once N bytes have been written
 *                              (write, pwrite) to matching files; the write that
 *                              crosses N is torn: its first part reaches the file
 *   KFAULT_LOG=FILE            one line appended per injected fault (a test checks
 *                              that its fault really fired)
 *   KFAULT_TRACE=FILE          one line appended per write, pwrite, ftruncate,
 *                              fsync, fdatasync, unlink and rename on a matching
 *                              file, in the order they happen, for tests that check
 *                              an order of I/O (kpack convert --consume deletes a
 *                              shard only after what it wrote is synced):
 *                              "pwrite PATH OFF LEN" (write: OFF -1) after the call,
 *                              "fdatasync PATH" before it and "fdatasync-done PATH"
 *                              after it (fsync alike), "ftruncate PATH LEN",
 *                              "unlink PATH" before it, "rename FROM TO" 
 *   KFAULT_TRUNCATE=PATH:SIZE  with KFAULT_CALLS=madvise: the N-th madvise(2)
 *                              call truncates PATH to SIZE bytes instead of
 *                              failing, as another process might while the file
 *                              is mapped (the next touch of a page past SIZE is
 *                              a SIGBUS)
 *
 * What it cannot reach: I/O glibc does internally (stdio buffers), and
 * memory-mapped reads (krun --io mmap), which touch pages without a call:
 * a read error or a shrunk file there is a SIGBUS, which KFAULT_TRUNCATE
 * provokes (docs/RELIABILITY.md).
 * The real calls are made with syscall(2), so the shim needs no dlsym. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <limits.h>
#include <unistd.h>

enum {
    C_READ = 1 << 0, C_PREAD = 1 << 1, C_WRITE = 1 << 2, C_PWRITE = 1 << 3, C_FSYNC = 1 << 4,
    C_FDATASYNC = 1 << 5, C_OPEN = 1 << 6, C_FTRUNCATE = 1 << 7, C_FALLOCATE = 1 << 8, C_SYNC = 1 << 9,
    C_MADVISE = 1 << 10, C_RENAME = 1 << 11, C_UNLINK = 1 << 12,
};
static const struct { const char *name; unsigned bits; } call_names[] = {
    {"read", C_READ}, {"pread", C_PREAD}, {"write", C_WRITE}, {"pwrite", C_PWRITE}, {"fsync", C_FSYNC},
    {"fdatasync", C_FDATASYNC}, {"open", C_OPEN}, {"ftruncate", C_FTRUNCATE}, {"fallocate", C_FALLOCATE},
    {"sync", C_SYNC}, {"madvise", C_MADVISE}, {"rename", C_RENAME}, {"unlink", C_UNLINK}, {"io", C_READ | C_PREAD | C_WRITE | C_PWRITE},
};

#define SHORT (-1)
#define KILL (-2)
#define FLIP (-3)
static unsigned k_calls;
static unsigned long k_nth = 1, k_count = 1;
static int k_err = EIO;
static char k_path[512];
static char k_trunc_path[512];
static long long k_trunc_size = -1;
static unsigned long long k_kill_after;
static int k_log = -1;
static int k_trace = -1;
static unsigned long k_seen;          /* matching calls so far */
static unsigned long long k_written;  /* bytes written to matching files */

__attribute__((constructor)) static void kfault_init(void)
{
    const char *v;
    if ((v = getenv("KFAULT_CALLS"))) {
        char buf[256], *save = NULL;
        snprintf(buf, sizeof buf, "%s", v);
        for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            size_t i;
            for (i = 0; i < sizeof call_names / sizeof call_names[0]; i++)
                if (strcmp(t, call_names[i].name) == 0) { k_calls |= call_names[i].bits; break; }
            if (i == sizeof call_names / sizeof call_names[0]) {
                fprintf(stderr, "kfault: unknown call '%s' in KFAULT_CALLS\n", t);
                _exit(99);
            }
        }
    }
    if ((v = getenv("KFAULT_NTH"))) k_nth = strtoul(v, NULL, 10);
    if ((v = getenv("KFAULT_COUNT"))) k_count = strtoul(v, NULL, 10);
    if ((v = getenv("KFAULT_ERR"))) {
        if (strcmp(v, "EIO") == 0) k_err = EIO;
        else if (strcmp(v, "ENOSPC") == 0) k_err = ENOSPC;
        else if (strcmp(v, "EACCES") == 0) k_err = EACCES;
        else if (strcmp(v, "SHORT") == 0) k_err = SHORT;
        else if (strcmp(v, "KILL") == 0) k_err = KILL;
        else if (strcmp(v, "FLIP") == 0) k_err = FLIP;
        else { fprintf(stderr, "kfault: unknown KFAULT_ERR '%s'\n", v); _exit(99); }
    }
    if ((v = getenv("KFAULT_PATH"))) snprintf(k_path, sizeof k_path, "%s", v);
    if ((v = getenv("KFAULT_KILL_AFTER_BYTES"))) k_kill_after = strtoull(v, NULL, 10);
    if ((v = getenv("KFAULT_TRUNCATE"))) {
        const char *colon = strrchr(v, ':');
        if (!colon) { fprintf(stderr, "kfault: KFAULT_TRUNCATE wants PATH:SIZE\n"); _exit(99); }
        snprintf(k_trunc_path, sizeof k_trunc_path, "%.*s", (int)(colon - v), v);
        k_trunc_size = strtoll(colon + 1, NULL, 10);
    }
    if ((v = getenv("KFAULT_LOG"))) k_log = (int)syscall(SYS_openat, AT_FDCWD, v, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if ((v = getenv("KFAULT_TRACE"))) k_trace = (int)syscall(SYS_openat, AT_FDCWD, v, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

static int path_matches(const char *path)
{
    return !k_path[0] || (path && fnmatch(k_path, path, 0) == 0);
}

/* The path behind fd (from /proc), or "" when it cannot be read. */
static void fd_path(int fd, char *path, size_t len)
{
    char link[64];
    ssize_t n;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = syscall(SYS_readlinkat, AT_FDCWD, link, path, len - 1);
    path[n > 0 ? n : 0] = 0;
}

static int fd_matches(int fd)
{
    char path[4096];
    if (!k_path[0]) return 1;
    fd_path(fd, path, sizeof path);
    return path[0] && path_matches(path);
}

static void log_fault(const char *call, unsigned long k, const char *what, const char *how)
{
    char line[700];
    int n;
    if (k_log < 0) return;
    n = snprintf(line, sizeof line, "kfault: %s #%lu on %s: %s\n", call, k, what, how);
    if (n > 0) syscall(SYS_write, k_log, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* One trace line (KFAULT_TRACE), for a call on a matching file: path, or fd's. */
static void trace(const char *call, int fd, const char *path, long long a, long long b, const char *to)
{
    char fdp[4096], line[9000];
    int n;
    if (k_trace < 0) return;
    if (!path) {
        fd_path(fd, fdp, sizeof fdp);
        path = fdp;
    }
    if (!path[0] || !path_matches(path)) return;
    if (to) n = snprintf(line, sizeof line, "%s %s %s\n", call, path, to);
    else if (a == -2) n = snprintf(line, sizeof line, "%s %s\n", call, path);
    else if (b == -2) n = snprintf(line, sizeof line, "%s %s %lld\n", call, path, a);
    else n = snprintf(line, sizeof line, "%s %s %lld %lld\n", call, path, a, b);
    if (n > 0) syscall(SYS_write, k_trace, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

static const char *err_name(void)
{
    return k_err == SHORT ? "short count" : k_err == KILL ? "SIGKILL" : k_err == FLIP ? "a bit flipped" : k_err == ENOSPC ? "ENOSPC" : k_err == EACCES ? "EACCES" : "EIO";
}

/* 1 if this call is to fail: it is of a chosen kind, on a matching file, and
 * its number among such calls is in [nth, nth + count). */
static int should_fail_how(unsigned bit, const char *call, int fd, const char *path, const char *how)
{
    char fdp[4096];
    unsigned long k;
    if (!(k_calls & bit)) return 0;
    if (!path) {
        fd_path(fd, fdp, sizeof fdp);
        path = fdp;
    }
    if (!path_matches(path)) return 0;
    k = __atomic_add_fetch(&k_seen, 1, __ATOMIC_SEQ_CST);
    if (k < k_nth || (k_count && k >= k_nth + k_count)) return 0;
    log_fault(call, k, path, how ? how : err_name());
    if (k_err == KILL && !how) kill(getpid(), SIGKILL); /* a crash where the call would have run */
    return 1;
}

static int should_fail(unsigned bit, const char *call, int fd, const char *path)
{
    return should_fail_how(bit, call, fd, path, NULL);
}

/* Count bytes about to be written; kill once the limit is crossed (after
 * writing the part below it, as a crash in the middle of a write would). */
static size_t kill_check(int fd, size_t n, int *kill_now)
{
    unsigned long long before;
    *kill_now = 0;
    if (!k_kill_after || !fd_matches(fd)) return n;
    before = __atomic_fetch_add(&k_written, n, __ATOMIC_SEQ_CST);
    if (before + n < k_kill_after) return n;
    *kill_now = 1;
    return before >= k_kill_after ? 0 : (size_t)(k_kill_after - before);
}

static void die_now(void)
{
    log_fault("write", 0, "the byte limit", "SIGKILL");
    kill(getpid(), SIGKILL);
}

/* A short count as the kernel gives one: about half.  An O_DIRECT transfer
 * ends on a block boundary (except at end of file), so on such a file it is
 * whole 4 KiB blocks, and a single block is not cut. */
static size_t short_count(int fd, size_t n)
{
    long fl = syscall(SYS_fcntl, fd, F_GETFL);
    if (fl >= 0 && (fl & O_DIRECT)) return n >= 8192 ? n / 2 / 4096 * 4096 : n;
    return n > 1 ? n / 2 : n;
}

static ssize_t do_read(unsigned bit, const char *call, int fd, void *buf, size_t n, off_t off, int positional)
{
    int flip = 0;
    ssize_t r;
    if (should_fail(bit, call, fd, NULL)) {
        if (k_err == FLIP) flip = 1;
        else if (k_err != SHORT) { errno = k_err; return -1; }
        else n = short_count(fd, n);
    }
    r = positional ? syscall(SYS_pread64, fd, buf, n, off) : syscall(SYS_read, fd, buf, n);
    if (flip && r > 0) ((unsigned char *)buf)[r / 2] ^= 1;
    return r;
}

static ssize_t do_write(unsigned bit, const char *call, int fd, const void *buf, size_t n, off_t off, int positional)
{
    int kill_now;
    ssize_t r;
    if (should_fail(bit, call, fd, NULL)) {
        if (k_err != SHORT) { errno = k_err; return -1; }
        n = short_count(fd, n);
    }
    {
        size_t m = kill_check(fd, n, &kill_now);
        if (kill_now) {
            if (m) {
                if (positional) syscall(SYS_pwrite64, fd, buf, m, off);
                else syscall(SYS_write, fd, buf, m);
            }
            die_now();
        }
    }
    r = positional ? syscall(SYS_pwrite64, fd, buf, n, off) : syscall(SYS_write, fd, buf, n);
    if (r > 0 && fd != k_trace && fd != k_log) trace(positional ? "pwrite" : "write", fd, NULL, positional ? (long long)off : -1, r, NULL);
    return r;
}

/* preadv (krun's I/O workers read a request's pieces in one call) counts as
 * "pread": a short count cuts the vector at about half its bytes. */
static ssize_t do_readv(int fd, const struct iovec *iov, int cnt, off_t off)
{
    struct iovec cut[IOV_MAX];
    if (cnt < 0 || cnt > IOV_MAX) { errno = EINVAL; return -1; }
    if (should_fail(C_PREAD, "pread", fd, NULL)) {
        size_t total = 0, want;
        int k = 0;
        if (k_err != SHORT) { errno = k_err; return -1; }
        for (int i = 0; i < cnt; i++) total += iov[i].iov_len;
        want = short_count(fd, total);
        for (; k < cnt && want; k++) {
            cut[k] = iov[k];
            if (cut[k].iov_len > want) cut[k].iov_len = want;
            want -= cut[k].iov_len;
        }
        return syscall(SYS_preadv, fd, cut, k, (long)off, 0L);
    }
    return syscall(SYS_preadv, fd, iov, cnt, (long)off, 0L);
}
ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off) { return do_readv(fd, iov, cnt, off); }
ssize_t preadv64(int fd, const struct iovec *iov, int cnt, off_t off) { return do_readv(fd, iov, cnt, off); }

ssize_t read(int fd, void *buf, size_t n) { return do_read(C_READ, "read", fd, buf, n, 0, 0); }
ssize_t pread(int fd, void *buf, size_t n, off_t off) { return do_read(C_PREAD, "pread", fd, buf, n, off, 1); }
ssize_t pread64(int fd, void *buf, size_t n, off_t off) { return do_read(C_PREAD, "pread", fd, buf, n, off, 1); }
ssize_t write(int fd, const void *buf, size_t n) { return do_write(C_WRITE, "write", fd, buf, n, 0, 0); }
ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) { return do_write(C_PWRITE, "pwrite", fd, buf, n, off, 1); }
ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) { return do_write(C_PWRITE, "pwrite", fd, buf, n, off, 1); }

static int fail_errno(void) { errno = k_err < 0 ? EIO : k_err; return -1; }

static int do_sync(unsigned bit, const char *call, const char *done, long nr, int fd)
{
    int r;
    if (should_fail(bit, call, fd, NULL)) return fail_errno();
    trace(call, fd, NULL, -2, -2, NULL);
    r = (int)syscall(nr, fd);
    if (r == 0) trace(done, fd, NULL, -2, -2, NULL);
    return r;
}
int fsync(int fd) { return do_sync(C_FSYNC, "fsync", "fsync-done", SYS_fsync, fd); }
int fdatasync(int fd) { return do_sync(C_FDATASYNC, "fdatasync", "fdatasync-done", SYS_fdatasync, fd); }
int ftruncate(int fd, off_t len)
{
    if (should_fail(C_FTRUNCATE, "ftruncate", fd, NULL)) return fail_errno();
    trace("ftruncate", fd, NULL, (long long)len, -2, NULL);
    return (int)syscall(SYS_ftruncate, fd, len);
}
int ftruncate64(int fd, off_t len) { return ftruncate(fd, len); }
int fallocate(int fd, int mode, off_t off, off_t len)
{
    return should_fail(C_FALLOCATE, "fallocate", fd, NULL) ? fail_errno() : (int)syscall(SYS_fallocate, fd, mode, off, len);
}
int fallocate64(int fd, int mode, off_t off, off_t len) { return fallocate(fd, mode, off, len); }
int sync_file_range(int fd, off_t off, off_t len, unsigned int flags)
{
    return should_fail(C_SYNC, "sync_file_range", fd, NULL) ? fail_errno() : (int)syscall(SYS_sync_file_range, fd, off, len, flags);
}

/* Not a failure of madvise itself (it never fails for a mapped range):
 * the moment a mapped file is shrunk under the mapping. */
int madvise(void *addr, size_t len, int advice)
{
    if (k_trunc_size >= 0 && should_fail_how(C_MADVISE, "madvise", -1, k_trunc_path, "file truncated under the mapping"))
        syscall(SYS_truncate, k_trunc_path, k_trunc_size);
    return (int)syscall(SYS_madvise, addr, len, advice);
}

static int do_open(int dirfd, const char *path, int flags, mode_t mode)
{
    if (should_fail(C_OPEN, "open", -1, path ? path : "")) return fail_errno();
    return (int)syscall(SYS_openat, dirfd, path, flags, mode);
}

/* The mode argument exists only with O_CREAT or O_TMPFILE. */
#define OPEN_MODE(flags, last) \
    mode_t mode = 0; \
    if ((flags) & (O_CREAT | __O_TMPFILE)) { va_list ap; va_start(ap, last); mode = (mode_t)va_arg(ap, int); va_end(ap); }

int open(const char *path, int flags, ...) { OPEN_MODE(flags, flags); return do_open(AT_FDCWD, path, flags, mode); }
int open64(const char *path, int flags, ...) { OPEN_MODE(flags, flags); return do_open(AT_FDCWD, path, flags, mode); }
int openat(int dirfd, const char *path, int flags, ...) { OPEN_MODE(flags, flags); return do_open(dirfd, path, flags, mode); }
int openat64(int dirfd, const char *path, int flags, ...) { OPEN_MODE(flags, flags); return do_open(dirfd, path, flags, mode); }

/* The source path names the call (KFAULT_PATH matches it). */
static int do_rename(int olddir, const char *from, int newdir, const char *to, unsigned flags)
{
    if (should_fail(C_RENAME, "rename", -1, from ? from : "")) return fail_errno();
    trace("rename", -1, from ? from : "", -2, -2, to ? to : "");
    return (int)syscall(SYS_renameat2, olddir, from, newdir, to, flags);
}
int rename(const char *from, const char *to) { return do_rename(AT_FDCWD, from, AT_FDCWD, to, 0); }
int renameat(int od, const char *from, int nd, const char *to) { return do_rename(od, from, nd, to, 0); }
int renameat2(int od, const char *from, int nd, const char *to, unsigned flags) { return do_rename(od, from, nd, to, flags); }

/* The path names the call (KFAULT_PATH matches it), as given. */
static int do_unlink(int dirfd, const char *path, int flags)
{
    if (should_fail(C_UNLINK, "unlink", -1, path ? path : "")) return fail_errno();
    trace("unlink", -1, path ? path : "", -2, -2, NULL);
    return (int)syscall(SYS_unlinkat, dirfd, path, flags);
}
int unlink(const char *path) { return do_unlink(AT_FDCWD, path, 0); }
int unlinkat(int dirfd, const char *path, int flags) { return do_unlink(dirfd, path, flags); }
