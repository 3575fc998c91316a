/* Checked file I/O: every read and write either moves exactly the bytes asked
 * for or fails with errno set.  A read that hits end of file is an error
 * (errno = ENODATA): a reader never wants a silently short buffer. */
#ifndef KPK_KIO_H
#define KPK_KIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Read exactly len bytes at off.  Returns 0, or -1 with errno (ENODATA on EOF). */
int kio_pread_full(int fd, void *buf, size_t len, uint64_t off);
/* Write exactly len bytes at off.  Returns 0, or -1 with errno. */
int kio_pwrite_full(int fd, const void *buf, size_t len, uint64_t off);
/* Whole small file into a malloc'd NUL-terminated buffer (limit: max bytes). */
int kio_read_file(const char *path, size_t max, char **out, size_t *len);
/* Size of an open file, or -1. */
int64_t kio_file_size(int fd);
struct stat;
/* What a name is, for messages: "a symbolic link", "a FIFO", "a directory",
 * "a character device", ..., "a regular file" ("a hard link (...)" when it
 * has other names): the one wording of kpack export and krun's saves. */
const char *kio_file_kind(const struct stat *st);
/* 1 if every byte is zero. */
int kio_is_zero(const void *p, size_t n);

#endif
