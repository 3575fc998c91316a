/* Guarding a conversion against every other writer of the same output.
 *
 * The lock: OUT.lock next to OUT, flock(2)ed for the whole conversion and
 * holding its owner's pid, so a second `kpack convert` of the same output
 * stops (exit 2) naming who is writing it, instead of truncating what the
 * first one wrote.  The kernel drops the lock when its owner dies, even by
 * kill -9; the file itself is removed by its owner on the way out.
 *
 * The check before publishing: a writer that does not take the lock (an
 * older kpack, a user's cp) can still replace a partial file or rewrite the
 * journal.  Before the renames, every partial member file must still be the
 * file this run wrote (same inode, its final size) and the journal must still
 * record every extent exactly as this run appended it; otherwise nothing is
 * published. */
#ifndef KPACK_GUARD_H
#define KPACK_GUARD_H

#include "plan.h"

#include <stddef.h>

typedef struct kp_lock {
    int fd;
    char *path;
} kp_lock;

#define KP_LOCK_INIT {-1, NULL}

/* Take the lock on OUT's conversion.  Returns 0, or -1 with err: "OUT is
 * being converted by another kpack (pid N, lock OUT.lock); ..." */
int kp_lock_take(kp_lock *lk, const char *out, char *err, size_t errlen);
/* Remove the lock file and drop the lock (a no-op if not taken). */
void kp_lock_release(kp_lock *lk);

/* 0 if every partial member file (open as fds[m]) and the journal still
 * hold what this run wrote according to p and l; -1 with err naming what
 * changed. */
int kp_check_before_publish(const int *fds, const char *journal, const kp_plan *p, const kp_layout *l, char *err,
                            size_t errlen);

#endif
