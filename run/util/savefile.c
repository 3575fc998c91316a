/* Saving a file without losing the one it replaces (savefile.h). */
#include "run/util/savefile.h"

#include "format/kio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

int ksave_target_ok(const char *path, int (*is_ours)(int fd), const char *what, krun_err *err)
{
    struct stat st, o;
    int fd, ours;
    if (lstat(path, &st)) {
        if (errno == ENOENT) return 0;
        krun_err_set(err, KRUN_EINPUT, "cannot save to %s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        krun_err_set(err, KRUN_EINPUT, "cannot save to %s: it is %s; a save replaces only a regular file (%s) or "
                     "makes a new one: give another name%s", path, kio_file_kind(&st), what,
                     S_ISLNK(st.st_mode) ? " (or the file the link points to)" : "");
        return -1;
    }
    if (!is_ours) return 0;
    /* never opened before it is known to be a regular file: a FIFO or a device is not touched */
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &o) || o.st_dev != st.st_dev || o.st_ino != st.st_ino) {
        krun_err_set(err, KRUN_EINPUT, "cannot save to %s: %s", path, fd < 0 ? strerror(errno) : "it changed while it was checked");
        if (fd >= 0) close(fd);
        return -1;
    }
    ours = is_ours(fd);
    close(fd);
    if (!ours) {
        krun_err_set(err, KRUN_EINPUT, "cannot save to %s: it exists and is not %s; a save replaces only an earlier "
                     "save: give another name", path, what);
        return -1;
    }
    return 0;
}

int ksave_begin(ksave *s, const char *path, krun_err *err) { return ksave_begin_at(s, AT_FDCWD, path, err); }

int ksave_begin_at(ksave *s, int dirfd, const char *path, krun_err *err)
{
    static _Atomic unsigned seq;
    memset(s, 0, sizeof *s);
    s->fd = -1;
    s->dirfd = dirfd;
    if (dirfd != AT_FDCWD && strchr(path, '/'))
        return krun_err_set(err, KRUN_EINPUT, "internal: a save beneath a directory takes a name, not the path %s", path);
    for (int attempt = 0; attempt < 100; attempt++) {
        free(s->tmp);
        s->tmp = NULL;
        if (asprintf(&s->tmp, "%s.tmp-%ld-%u", path, (long)getpid(), atomic_fetch_add(&seq, 1)) < 0) {
            s->tmp = NULL;
            break;
        }
        s->fd = openat(dirfd, s->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (s->fd >= 0 || errno != EEXIST) break;
    }
    if (!s->tmp || !(s->path = strdup(path))) {
        krun_err_set(err, KRUN_ENOMEM, "saving %s: out of memory", path);
        if (s->fd >= 0) { close(s->fd); unlinkat(dirfd, s->tmp, 0); }
        free(s->tmp);
        s->tmp = NULL;
        s->fd = -1;
        return -1;
    }
    if (s->fd < 0) {
        krun_err_set(err, KRUN_EINPUT, "cannot write %s: %s", s->tmp, strerror(errno));
        free(s->tmp);
        free(s->path);
        memset(s, 0, sizeof *s);
        s->fd = -1;
        s->dirfd = AT_FDCWD;
        return -1;
    }
    return 0;
}

void ksave_write(ksave *s, const void *p, size_t n)
{
    if (s->werr || !n) return;
    if (kio_pwrite_full(s->fd, p, n, s->off)) s->werr = errno ? errno : EIO;
    else s->off += n;
}

int ksave_finish(ksave *s, krun_err *err)
{
    int e = s->werr;
    const char *step = "writing";
    if (!e && fsync(s->fd)) { e = errno; step = "syncing"; }
    if (close(s->fd) && !e) { e = errno; step = "closing"; }
    s->fd = -1;
    if (e) {
        krun_err_set(err, KRUN_EINPUT, "cannot save %s: %s %s: %s; %s is unchanged", s->path, step, s->tmp, strerror(e),
                     s->path);
        ksave_abort(s);
        return -1;
    }
    return 0;
}

void ksave_abort(ksave *s)
{
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    if (s->tmp) unlinkat(s->dirfd, s->tmp, 0);
    free(s->tmp);
    free(s->path);
    s->tmp = s->path = NULL;
}

/* The directory of path ("." for a bare name), opened read-only. */
static int open_dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *d;
    int fd;
    if (!slash) return open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (!(d = strndup(path, slash == path ? 1 : (size_t)(slash - path)))) { errno = ENOMEM; return -1; }
    fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(d);
    return fd;
}

/* fsync of the directory holding `to` (dirfd, or opened for it) after a rename into it. */
static int sync_dir(const char *from, const char *to, int dirfd, krun_err *err)
{
    int fd = dirfd;
    if (fd < 0 && (fd = open_dir_of(to)) < 0) {
        krun_err_set(err, KRUN_EINPUT, "renamed %s to %s, but cannot open its directory to sync it: %s", from, to, strerror(errno));
        return -2;
    }
    if (fsync(fd)) {
        krun_err_set(err, KRUN_EINPUT, "renamed %s to %s, but syncing its directory failed: %s", from, to, strerror(errno));
        if (fd != dirfd) close(fd);
        return -2;
    }
    if (fd != dirfd) close(fd);
    return 0;
}

int ksave_rename(const char *from, const char *to, int dirfd, krun_err *err)
{
    if (rename(from, to)) {
        krun_err_set(err, KRUN_EINPUT, "cannot rename %s to %s: %s", from, to, strerror(errno));
        return -1;
    }
    return sync_dir(from, to, dirfd, err);
}

int ksave_rename_to(ksave *s, const char *to, int dirfd, krun_err *err)
{
    int rc;
    if (s->dirfd != AT_FDCWD) dirfd = s->dirfd;           /* begun beneath it: renamed and synced there */
    if (renameat(s->dirfd, s->tmp, s->dirfd, to)) {
        krun_err_set(err, KRUN_EINPUT, "cannot rename %s to %s: %s; %s is unchanged", s->tmp, to, strerror(errno), to);
        ksave_abort(s); /* nothing new is left behind */
        return -1;
    }
    rc = sync_dir(s->tmp, to, dirfd, err);
    free(s->tmp);
    free(s->path);
    s->tmp = s->path = NULL;
    return rc;
}

int ksave_commit(ksave *s, krun_err *err)
{
    char *to;
    int rc;
    if (ksave_finish(s, err)) return -1;
    if (!(to = strdup(s->path))) { krun_err_set(err, KRUN_ENOMEM, "saving %s: out of memory", s->path); ksave_abort(s); return -1; }
    rc = ksave_rename_to(s, to, -1, err);
    free(to);
    return rc;
}

int ksave_lock_dir(const char *path, krun_err *err)
{
    int fd = open_dir_of(path);
    if (fd < 0) { krun_err_set(err, KRUN_EINPUT, "cannot open the directory of %s: %s", path, strerror(errno)); return -1; }
    if (flock(fd, LOCK_EX)) {
        krun_err_set(err, KRUN_EINPUT, "cannot lock the directory of %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}
