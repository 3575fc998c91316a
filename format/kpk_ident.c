/* Is a KPK file still the file that was opened?  (kpk_reader.h, kpk_unchanged)
 *
 * A model file overwritten in place (`cp other.kpk live.kpk`), truncated or
 * repaired while a process reads it hands that process other bytes than the
 * ones it checked: an extent verified once (krun --verify first) and read
 * again later, a page of a mapping.  The kernel says so without reading a
 * byte: every write and truncation sets the file's modification and change
 * times (before the data changes: file_modified() comes first in the write
 * path), and a truncation its size.  So each member file's identity -- device,
 * inode, size, mtime, ctime -- is taken right after it is opened, before
 * anything is read from it, and compared with fstat(2) whenever a caller wants
 * to know that what it read since is the file's (krun: after every forward
 * block, before a token computed in it is used).  One fstat per member file:
 * about 0.3 us, against milliseconds (tiny models) to minutes (K3) of a block.
 *
 * The times are the kernel's coarse clock (a tick, 1-10 ms): a write in the
 * same tick as the last write before the identity was taken leaves them as
 * they were.  So an identity whose change time is within KPK_IDENT_SETTLE of
 * the clock is taken again after that long: a later write then falls in a
 * later tick (unless the clock is set back meanwhile).  What is compared is
 * conservative: a chmod or a touch changes ctime and counts as a change too. */
#include "kpk_internal.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* Longer than a tick of the coarse clock at any HZ Linux builds with (100..1000). */
#define KPK_IDENT_SETTLE_NS 20000000L

static void take(const struct stat *st, kpk_ident *id)
{
    id->dev = (uint64_t)st->st_dev;
    id->ino = (uint64_t)st->st_ino;
    id->size = (uint64_t)st->st_size;
    id->mtime_s = (int64_t)st->st_mtim.tv_sec;
    id->mtime_ns = (int64_t)st->st_mtim.tv_nsec;
    id->ctime_s = (int64_t)st->st_ctim.tv_sec;
    id->ctime_ns = (int64_t)st->st_ctim.tv_nsec;
}

int kpk_ident_take(int fd, kpk_ident *id)
{
    struct stat st;
    struct timespec now;
    if (fstat(fd, &st)) return -1;
    /* changed within the last ticks: wait until a further write would show (at most twice: a file
     * written all the time is caught by the writes that come later) */
    for (int k = 0; k < 2 && !clock_gettime(CLOCK_REALTIME, &now); k++) {
        int64_t age = ((int64_t)now.tv_sec - (int64_t)st.st_ctim.tv_sec) * 1000000000LL + (now.tv_nsec - st.st_ctim.tv_nsec);
        struct timespec pause = {0, KPK_IDENT_SETTLE_NS};
        if (age >= KPK_IDENT_SETTLE_NS) break;
        nanosleep(&pause, NULL);
        if (fstat(fd, &st)) return -1;
    }
    take(&st, id);
    return 0;
}

int kpk_ident_differs(int fd, const kpk_ident *id, char *why, size_t len)
{
    struct stat st;
    kpk_ident now;
    if (fstat(fd, &st)) {
        snprintf(why, len, "fstat: %s", strerror(errno));
        return 1;
    }
    take(&st, &now);
    if (now.dev != id->dev || now.ino != id->ino) snprintf(why, len, "it is another file now");
    else if (now.size != id->size)
        snprintf(why, len, "its size went from %llu to %llu bytes: truncated or rewritten", (unsigned long long)id->size,
                 (unsigned long long)now.size);
    else if (now.mtime_s != id->mtime_s || now.mtime_ns != id->mtime_ns) snprintf(why, len, "it was written: its modification time changed");
    else if (now.ctime_s != id->ctime_s || now.ctime_ns != id->ctime_ns)
        snprintf(why, len, "its change time moved: written (its modification time set back), or its attributes changed");
    else return 0;
    return 1;
}

int kpk_unchanged(const kpk_file *f, kpk_err *err)
{
    char why[200];
    for (uint32_t m = 0; m < f->sb.member_count; m++)
        if (f->member_fd[m] >= 0 &&                /* -1: a member on another machine (kpk_open_here) */
            kpk_ident_differs(f->member_fd[m], &f->ident[m], why, sizeof why)) {
            if (f->sb.member_count == 1)
                kpk_err_set(err, KPK_ECHANGED, "%s changed while it was in use (%s)", f->path, why);
            else
                kpk_err_set(err, KPK_ECHANGED, "%s: member %u (%s) changed while it was in use (%s)", f->path, m, f->member_path[m],
                            why);
            return -1;
        }
    return 0;
}

int kpk_member_same_file(const kpk_file *f, uint16_t m, int fd)
{
    struct stat st;
    return !fstat(fd, &st) && (uint64_t)st.st_dev == f->ident[m].dev && (uint64_t)st.st_ino == f->ident[m].ino;
}
