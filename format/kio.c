#include "kio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int kio_pread_full(int fd, void *buf, size_t len, uint64_t off)
{
    uint8_t *p = buf;
    while (len) {
        size_t chunk = len > (1u << 30) ? (1u << 30) : len;
        ssize_t r = pread(fd, p, chunk, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) { errno = ENODATA; return -1; }
        p += r; off += (uint64_t)r; len -= (size_t)r;
    }
    return 0;
}

int kio_pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
    const uint8_t *p = buf;
    while (len) {
        size_t chunk = len > (1u << 30) ? (1u << 30) : len;
        ssize_t r = pwrite(fd, p, chunk, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) { errno = EIO; return -1; }
        p += r; off += (uint64_t)r; len -= (size_t)r;
    }
    return 0;
}

int64_t kio_file_size(int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0) return -1;
    return (int64_t)st.st_size;
}

int kio_read_file(const char *path, size_t max, char **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int64_t sz;
    char *buf;
    *out = NULL;
    if (fd < 0) return -1;
    sz = kio_file_size(fd);
    if (sz < 0 || (uint64_t)sz > max) {
        if (sz >= 0) errno = EFBIG;
        close(fd);
        return -1;
    }
    buf = malloc((size_t)sz + 1);
    if (!buf) { close(fd); errno = ENOMEM; return -1; }
    if (kio_pread_full(fd, buf, (size_t)sz, 0) != 0) {
        int e = errno;
        free(buf); close(fd); errno = e;
        return -1;
    }
    close(fd);
    buf[sz] = 0;
    *out = buf;
    *len = (size_t)sz;
    return 0;
}

int kio_is_zero(const void *p, size_t n)
{
    const uint8_t *b = p;
    /* word-at-a-time: memcmp against the first byte after checking it */
    if (n == 0) return 1;
    if (b[0]) return 0;
    return memcmp(b, b + 1, n - 1) == 0;
}

const char *kio_file_kind(const struct stat *st)
{
    switch (st->st_mode & S_IFMT) {
    case S_IFREG: return st->st_nlink > 1 ? "a hard link (a regular file with other names)" : "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFLNK: return "a symbolic link";
    case S_IFIFO: return "a FIFO";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    default: return "not a regular file";
    }
}
