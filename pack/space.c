#include "space.h"

#include "estimate.h"

#include "format/kprogress.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* Allocated over apparent size of the input (a sparse source makes a sparse output). */
static double input_density(const kp_input *in)
{
    uint64_t alloc = 0, size = 0;
    if (in->src) {
        for (size_t i = 0; i < in->src->n_shards; i++) { alloc += in->src->shards[i].alloc_bytes; size += in->src->shards[i].size; }
    } else {
        for (uint16_t m = 0; m < kpk_member_count(in->kpk); m++) {
            struct stat st;
            if (fstat(kpk_member_fd(in->kpk, m), &st) == 0) { alloc += (uint64_t)st.st_blocks * 512; size += (uint64_t)st.st_size; }
        }
    }
    return size && alloc < size ? (double)alloc / (double)size : 1.0;
}

/* Bytes an existing partial file holds at or past `from` (the run truncates
 * them before it writes): data ranges (SEEK_DATA) within its allocated total. */
static uint64_t partial_reusable(const char *partial, uint64_t from)
{
    int fd = open(partial, O_RDONLY | O_CLOEXEC);
    struct stat st;
    uint64_t n = 0, alloc;
    off_t d = (off_t)from, h;
    if (fd < 0) return 0;
    if (fstat(fd, &st) != 0) { close(fd); return 0; }
    alloc = (uint64_t)st.st_blocks * 512;
    if (from == 0) n = alloc;
    else
        while ((d = lseek(fd, d, SEEK_DATA)) >= 0 && (h = lseek(fd, d, SEEK_HOLE)) > d) {
            n += (uint64_t)(h - d);
            d = h;
        }
    close(fd);
    return n < alloc ? n : alloc;
}

int kp_space_check(const kp_plan *p, const kp_input *in, const uint64_t *cursor, char *err, size_t errlen)
{
    kp_layout est;
    double density = input_density(in);
    uint64_t *need = calloc(p->n_members, sizeof *need), *reuse = calloc(p->n_members, sizeof *reuse);
    dev_t *dev = calloc(p->n_members, sizeof *dev);
    const char *fake = getenv("KPACK_TEST_FREE_BYTES");
    int rc = -1;
    if (!need || !reuse || !dev || kp_plan_estimate(p, p->n_blocks ? KP_ESTIMATE_MARGIN : 0.0, &est)) { snprintf(err, errlen, "out of memory"); goto out_nolayout; }
    for (uint32_t m = 0; m < p->n_members; m++) {
        struct stat st;
        uint64_t kept = kp_member_end(p, cursor, (uint16_t)m);
        int fresh = cursor[kp_target(p, p->members[m].role == KPK_ROLE_STRIPE ? KPK_STRIPED : (uint16_t)m)] ==
                    (p->members[m].role == KPK_ROLE_STRIPE ? 0 : p->opt.align);
        uint64_t fixed = m == 0 ? est.member_size[0] - est.extent_table_off : KPK_SUPERBLOCK_SIZE;
        uint64_t data = est.member_size[m] - fixed > kept ? est.member_size[m] - fixed - kept : 0;
        need[m] = (uint64_t)((double)data * density) + fixed;
        /* nothing kept: the file is created anew, every block it holds comes back */
        reuse[m] = partial_reusable(p->members[m].partial, fresh ? 0 : kept);
        if (stat(p->members[m].dir, &st) != 0) { snprintf(err, errlen, "%s: %s", p->members[m].dir, strerror(errno)); goto out; }
        dev[m] = st.st_dev;
    }
    /* one check per filesystem, for every member on it */
    for (uint32_t m = 0; m < p->n_members; m++) {
        uint64_t total = 0, held = 0, avail;
        struct statvfs vfs;
        char names[600] = "", b1[32], b2[32], b3[32], also[300] = "", est_note[120] = "";
        const char *holder = NULL;
        int first = 1, holders = 0;
        for (uint32_t k = 0; k < m; k++)
            if (dev[k] == dev[m]) first = 0;
        if (!first) continue;
        for (uint32_t k = m; k < p->n_members; k++) {
            if (dev[k] != dev[m]) continue;
            total += need[k];
            held += reuse[k];
            if (reuse[k]) { holders++; holder = p->members[k].partial; }
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", names[0] ? ", " : "", p->members[k].path);
        }
        if (fake) avail = strtoull(fake, NULL, 10);
        else if (statvfs(p->members[m].dir, &vfs) == 0) avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
        else continue; /* cannot tell: the writes will say */
        if (avail + held >= total) continue;
        kfmt_bytes(total, b1, sizeof b1);
        kfmt_bytes(avail, b2, sizeof b2);
        kfmt_bytes(held, b3, sizeof b3);
        if (held) snprintf(also, sizeof also, " plus %s (%llu bytes) that %s hold%s and this run rewrites", b3,
                           (unsigned long long)held, holders == 1 ? holder : "the partial files", holders == 1 ? "s" : "");
        if (p->n_blocks)
            snprintf(est_note, sizeof est_note, "; an estimate: compressed extents at the stored/raw of sampled blocks, plus %.0f %%",
                     KP_ESTIMATE_MARGIN * 100);
        snprintf(err, errlen, "not enough free space for %s: need %s (%llu bytes%s), %s (%llu bytes) available%s, on the "
                 "filesystem of %s", names, b1, (unsigned long long)total, est_note, b2, (unsigned long long)avail, also,
                 p->members[m].dir);
        goto out;
    }
    rc = 0;
out:
    kp_layout_free(&est);
out_nolayout:
    free(need);
    free(reuse);
    free(dev);
    return rc;
}
