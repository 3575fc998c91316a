/* Saving a file so that no failure loses the copy it replaces (docs/STATE.md
 * §4): the new bytes go to a temporary file next to it (created with O_EXCL |
 * O_NOFOLLOW, never through whatever is at a name), are fsynced, and are
 * renamed over the old file, whose directory is then fsynced.  A save only
 * replaces a regular file that is one of its own kind (or a new name): a
 * symbolic link, a FIFO, a device node, a directory, or a file of another
 * kind at the name is refused, named, and left alone.  `krun --save-state`
 * and `krun chat`'s /save (the state and FILE.json) write through this one
 * writer. */
#ifndef KRUN_SAVEFILE_H
#define KRUN_SAVEFILE_H

#include "run/util/krun_err.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ksave {
    int dirfd;         /* AT_FDCWD, or the directory path and tmp are names in (ksave_begin_at) */
    char *path;        /* the file it replaces */
    char *tmp;         /* path.tmp-PID-N: the new bytes until they are complete */
    int fd;            /* the temporary file, -1 when closed */
    uint64_t off;      /* bytes written */
    int werr;          /* errno of the first write that failed (later writes are skipped) */
} ksave;

/* May a save replace path?  0 when nothing is there, or a regular file that
 * is_ours (given a descriptor opened read-only on it) accepts; -1 with err
 * naming what is there otherwise.  what: "a krun state file", ... */
int ksave_target_ok(const char *path, int (*is_ours)(int fd), const char *what, krun_err *err);

/* Create the temporary file next to path.  0, or -1 with err. */
int ksave_begin(ksave *s, const char *path, krun_err *err);
/* The same beneath the open directory dirfd: name is a name in it (no '/'), and every step --
 * the temporary file, the rename, the sync -- goes through dirfd, never through a path, so that
 * whatever the directory's path names meanwhile (a symbolic link put in its place, another
 * directory) gets nothing (krun serve's prefix cache, issue 34.10). */
int ksave_begin_at(ksave *s, int dirfd, const char *name, krun_err *err);
/* Append n bytes (a failure is kept and reported by ksave_finish). */
void ksave_write(ksave *s, const void *p, size_t n);
/* Every write done, the temporary file fsynced and closed: 0, or -1 with err
 * (the temporary file is removed). */
int ksave_finish(ksave *s, krun_err *err);
/* Remove the temporary file (after a failure, or when the save is abandoned). */
void ksave_abort(ksave *s);
/* ksave_finish, then the temporary file renamed over path and the directory
 * fsynced: path holds the new bytes, or (-1 with err) still the old ones. */
int ksave_commit(ksave *s, krun_err *err);

/* After ksave_finish: the temporary file renamed to `to` (path itself, or
 * another name of the caller's protocol) and the directory (dirfd, or opened
 * from to) fsynced; the save is released either way.  0; -1 with err: not
 * renamed (the temporary file is removed, `to` is unchanged); -2 with err:
 * renamed, but the directory could not be synced. */
int ksave_rename_to(ksave *s, const char *to, int dirfd, krun_err *err);
/* rename(from, to), then fsync of their directory (dirfd, or opened from to);
 * 0, -1 (not renamed) or -2 (renamed, not synced), as ksave_rename_to. */
int ksave_rename(const char *from, const char *to, int dirfd, krun_err *err);
/* The directory holding path, opened and locked (flock LOCK_EX): the renames of
 * one save are not interleaved with another's.  -1 with err. */
int ksave_lock_dir(const char *path, krun_err *err);

#endif
