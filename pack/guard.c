/* The conversion lock and the check before publishing (guard.h). */
#include "guard.h"

#include "journal.h"
#include "format/kio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* The pid recorded in a lock file, or 0 if it has none (yet). */
static long lock_owner(int fd)
{
    char buf[32] = "";
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = 0;
    return strtol(buf, NULL, 10);
}

int kp_lock_take(kp_lock *lk, const char *out, char *err, size_t errlen)
{
    lk->fd = -1;
    err[0] = 0;
    if (asprintf(&lk->path, "%s.lock", out) < 0) {
        lk->path = NULL;
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* The owner removes the file before it lets go, so a lock taken on a file
     * that is no longer at the path is worthless: open it again. */
    for (int attempt = 0; attempt < 100; attempt++) {
        struct stat held, named;
        char pid[32];
        int fd = open(lk->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            snprintf(err, errlen, "cannot create %s: %s", lk->path, strerror(errno));
            break;
        }
        if (flock(fd, LOCK_EX | LOCK_NB)) {
            if (errno == EWOULDBLOCK) {
                long owner = lock_owner(fd);
                char who[48] = "pid unknown";
                if (owner > 0) snprintf(who, sizeof who, "pid %ld", owner);
                snprintf(err, errlen, "%s is being converted by another kpack (%s, lock %s); wait for it to finish, "
                         "or stop it and rerun this command to resume", out, who, lk->path);
            } else {
                snprintf(err, errlen, "cannot lock %s: %s", lk->path, strerror(errno));
            }
            close(fd);
            break;
        }
        if (fstat(fd, &held) || stat(lk->path, &named) || held.st_dev != named.st_dev || held.st_ino != named.st_ino) {
            close(fd);
            continue;
        }
        snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
        if (ftruncate(fd, 0) || kio_pwrite_full(fd, pid, strlen(pid), 0)) {
            snprintf(err, errlen, "cannot write %s: %s", lk->path, strerror(errno));
            unlink(lk->path);
            close(fd);
            break;
        }
        lk->fd = fd;
        return 0;
    }
    if (!err[0]) snprintf(err, errlen, "cannot lock %s: it keeps being replaced", lk->path);
    free(lk->path);
    lk->path = NULL;
    return -1;
}

void kp_lock_release(kp_lock *lk)
{
    if (lk->fd >= 0) {
        unlink(lk->path); /* while still holding it: see kp_lock_take */
        close(lk->fd);
    }
    free(lk->path);
    lk->fd = -1;
    lk->path = NULL;
}

int kp_check_before_publish(const int *fds, const char *journal, const kp_plan *p, const kp_layout *l, char *err,
                            size_t errlen)
{
    kjournal j = {.fd = -1};
    kj_record *recs = NULL;
    uint64_t n = 0, read;
    int rc;
    for (uint32_t m = 0; m < p->n_members; m++) {
        struct stat mine, named;
        const char *partial = p->members[m].partial;
        if (fstat(fds[m], &mine) || stat(partial, &named) || mine.st_dev != named.st_dev || mine.st_ino != named.st_ino) {
            snprintf(err, errlen, "%s was removed or replaced by another process while this conversion wrote it", partial);
            return -1;
        }
        if ((uint64_t)mine.st_size != l->member_size[m]) {
            snprintf(err, errlen, "%s has %llu bytes, this conversion wrote %llu: another process changed it", partial,
                     (unsigned long long)mine.st_size, (unsigned long long)l->member_size[m]);
            return -1;
        }
    }
    rc = kj_open(&j, journal, p->plan_id, &recs, &n);
    if (rc == 0) kj_close(&j);
    if (rc < 0) {
        snprintf(err, errlen, "cannot read %s to check it: %s", journal, strerror(errno));
        return -1;
    }
    read = n;
    if (rc == 0 && n == p->n_extents)
        for (uint64_t i = 0; i < n; i++) {
            const kpk_extent *x = &p->extents[i];
            int same = recs[i].member == x->member && recs[i].offset == x->offset && recs[i].stored_len == x->stored_len &&
                       recs[i].stored_xxh3 == x->stored_xxh3 && recs[i].raw_xxh3 == x->raw_xxh3 &&
                       recs[i].n_blocks == kp_extent_nblocks(p, (uint32_t)i);
            for (uint32_t k = 0; same && k < recs[i].n_blocks; k++) {
                const kpk_block *a = &recs[i].blocks[k], *b = &p->blocks[x->first_block + k];
                same = a->raw_off == b->raw_off && a->stored_off == b->stored_off && a->raw_len == b->raw_len &&
                       a->stored_len == b->stored_len && a->method == b->method && a->planes == b->planes &&
                       a->plane0_len == b->plane0_len && a->raw_xxh3 == b->raw_xxh3;
            }
            if (!same) {
                n = i;
                break;
            }
        }
    kj_free_records(recs, read);
    if (rc != 0 || n != p->n_extents) {
        snprintf(err, errlen, "%s no longer records what this conversion wrote (%llu of %u extents agree): another "
                 "process rewrote it", journal, rc == 0 ? (unsigned long long)n : 0ULL, p->n_extents);
        return -1;
    }
    return 0;
}
