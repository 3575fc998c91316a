/* Writing files beneath one directory and nowhere else (beneath.h). */
#include "beneath.h"

#include "format/kio.h"
#include "format/kos.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int kb_open_root(const char *dir, char *err, size_t errlen)
{
    int fd;
    if (mkdir(dir, 0755) && errno != EEXIST) { snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno)); return -1; }
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) snprintf(err, errlen, "cannot open %s: %s", dir, strerror(errno));
    return fd;
}

/* Open the directory component comp (n bytes) of parent, creating it if asked. */
static int open_component(int parent, const char *comp, size_t n, int create, const char *dir, const char *name, char *err,
                          size_t errlen)
{
    char c[256 + 1];
    struct stat st;
    int fd;
    if (n >= sizeof c) { snprintf(err, errlen, "%s/%s: a path component is longer than 256 bytes", dir, name); return -1; }
    memcpy(c, comp, n);
    c[n] = 0;
    if (create && mkdirat(parent, c, 0755) && errno != EEXIST) {
        snprintf(err, errlen, "cannot create the directory %s/%.*s: %s", dir, (int)(comp + n - name), name, strerror(errno));
        return -1;
    }
    fd = openat(parent, c, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) return fd;
    if (errno == ENOENT && !create) return -2;
    if ((errno == ELOOP || errno == ENOTDIR) && fstatat(parent, c, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        snprintf(err, errlen, "%s/%.*s is %s, not a directory: kpack export writes only inside %s, through real "
                 "directories; remove it (or export into another directory)", dir, (int)(comp + n - name), name,
                 kio_file_kind(&st), dir);
        return -1;
    }
    snprintf(err, errlen, "cannot open the directory %s/%.*s: %s", dir, (int)(comp + n - name), name, strerror(errno));
    return -1;
}

int kb_parent(int root, const char *dir, const char *name, int create, const char **base, char *err, size_t errlen)
{
    int fd = dup(root);
    const char *c = name;
    if (fd < 0) { snprintf(err, errlen, "%s: %s", dir, strerror(errno)); return -1; }
    for (const char *e; (e = strchr(c, '/')); c = e + 1) {
        int next = open_component(fd, c, (size_t)(e - c), create, dir, name, err, errlen);
        close(fd);
        if (next < 0) return next;
        fd = next;
    }
    *base = c;
    return fd;
}

int kb_stat(int root, const char *dir, const char *name, struct stat *st, char *err, size_t errlen)
{
    const char *base;
    int pfd = kb_parent(root, dir, name, 0, &base, err, errlen), rc;
    if (pfd == -2) return KB_ABSENT;
    if (pfd < 0) return -1;
    if (fstatat(pfd, base, st, AT_SYMLINK_NOFOLLOW) == 0) rc = KB_PRESENT;
    else if (errno == ENOENT) rc = KB_ABSENT;
    else { snprintf(err, errlen, "%s/%s: %s", dir, name, strerror(errno)); rc = -1; }
    close(pfd);
    return rc;
}

int kb_create(int pfd, const char *shown, const char *base, char *err, size_t errlen)
{
    struct stat st;
    int fd;
    for (int attempt = 0; attempt < 2; attempt++) {
        fd = openat(pfd, base, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd >= 0) return fd;
        if (errno != EEXIST) break;
        /* something is there: a file an interrupted run left is replaced, not written through */
        if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW)) {
            if (errno == ENOENT) continue; /* gone meanwhile */
            break;
        }
        if (!S_ISREG(st.st_mode)) {
            snprintf(err, errlen, "%s is %s: kpack export does not write through or remove it; remove it yourself (or "
                     "export into another directory)", shown, kio_file_kind(&st));
            return -1;
        }
        if (unlinkat(pfd, base, 0) && errno != ENOENT) break;
    }
    snprintf(err, errlen, "cannot create %s: %s", shown, strerror(errno));
    return -1;
}

int kb_open_rw(int pfd, const char *shown, const char *base, char *err, size_t errlen)
{
    struct stat before, st;
    int fd, exists = fstatat(pfd, base, &before, AT_SYMLINK_NOFOLLOW) == 0;
    if (!exists && errno != ENOENT) { snprintf(err, errlen, "%s: %s", shown, strerror(errno)); return -1; }
    if (exists && (!S_ISREG(before.st_mode) || before.st_nlink != 1)) {
        snprintf(err, errlen, "%s is %s: kpack export writes its journal only into a file of its own; remove it (or "
                 "export into another directory)", shown, kio_file_kind(&before));
        return -1;
    }
    /* checked before opening (a FIFO or device is never opened), and again on what was opened */
    fd = openat(pfd, base, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0) {
        if (errno == ELOOP) snprintf(err, errlen, "%s is a symbolic link: kpack export does not write through it; remove it", shown);
        else snprintf(err, errlen, "cannot create %s: %s", shown, strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_nlink != 1 ||
        (exists && (st.st_dev != before.st_dev || st.st_ino != before.st_ino))) {
        snprintf(err, errlen, "%s changed while it was opened (it is %s now); remove it and rerun", shown, kio_file_kind(&st));
        close(fd);
        return -1;
    }
    if (fcntl(fd, F_SETFL, 0)) { snprintf(err, errlen, "%s: %s", shown, strerror(errno)); close(fd); return -1; }
    return fd;
}

int kb_publish(int pfd, const char *from, const char *to)
{
    if (kos_rename_noreplace(pfd, from, to) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) return -1;
    /* a filesystem without RENAME_NOREPLACE: a hard link fails on an existing name too */
    if (linkat(pfd, from, pfd, to, 0)) return -1;
    if (unlinkat(pfd, from, 0)) return -1;
    return 0;
}
