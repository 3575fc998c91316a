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

void kp_space_free(kp_space *s)
{
    free(s->fs);
    s->fs = NULL;
    s->n = 0;
}

/* The filesystem entry of dev, added (with its free space) if new. */
static kp_fs_space *fs_of(kp_space *s, dev_t dev, const char *dir)
{
    const char *fake = getenv("KPACK_TEST_FREE_BYTES");
    struct statvfs vfs;
    kp_fs_space *f;
    for (size_t i = 0; i < s->n; i++)
        if (s->fs[i].dev == dev) return &s->fs[i];
    f = &s->fs[s->n++];
    memset(f, 0, sizeof *f);
    f->dev = dev;
    f->dir = dir;
    f->peak_after = KP_RELEASE_FIRST;
    if (fake) { f->avail = strtoull(fake, NULL, 10); f->avail_known = 1; }
    else if (statvfs(dir, &vfs) == 0) { f->avail = (uint64_t)vfs.f_bavail * vfs.f_frsize; f->avail_known = 1; }
    /* else: cannot tell, the writes will say */
    return f;
}

/* What each filesystem holds beyond today once the extents before `upto`
 * (placed by cursor sc) are written, the consume log holds `staged` and the
 * releases so far gave back what they did: a new high is its peak. */
static void timeline_point(const kp_plan *p, kp_space *s, const uint64_t *sc, const uint64_t *kept, const uint32_t *fs_of_m,
                           double density, const uint64_t *staged, uint32_t after)
{
    for (size_t f = 0; f < s->n; f++) {
        uint64_t blocks = 0, bytes = 0;
        for (uint32_t m = 0; m < p->n_members; m++) {
            uint64_t end = kp_member_end(p, sc, (uint16_t)m), data = end > kept[m] ? end - kept[m] : 0;
            if (fs_of_m[m] != f) continue;
            blocks += (uint64_t)((double)data * density);
            bytes += data;
        }
        blocks += staged[f];
        bytes += staged[f];
        blocks = blocks > s->fs[f].freed ? blocks - s->fs[f].freed : 0;
        bytes = bytes > s->fs[f].freed_apparent ? bytes - s->fs[f].freed_apparent : 0;
        if (blocks > s->fs[f].peak) { s->fs[f].peak = blocks; s->fs[f].peak_after = after; }
        if (bytes > s->fs[f].peak_apparent) s->fs[f].peak_apparent = bytes;
    }
}

static void release(kp_space *s, const kp_release *r, uint32_t entry_fs, uint64_t *staged)
{
    staged[entry_fs] += r->staged;
    for (size_t f = 0; f < s->n; f++)
        if (s->fs[f].dev == r->dev) {
            s->fs[f].freed += r->freed;
            s->fs[f].freed_apparent += r->apparent;
        }
}

/* The journal still to be written (FORMAT.md §14: a 64-byte header, per
 * extent 56 bytes and 48 per block) and the lock file, next to the entry. */
static uint64_t journal_bytes(const kp_plan *p, uint32_t first)
{
    uint64_t n = first ? 0 : 64;
    for (uint32_t i = first; i < p->n_extents; i++) n += 56 + 48 * (uint64_t)kp_extent_nblocks(p, i);
    /* and the blocks a filesystem holds ahead of a growing file for a while
     * (ext4 counts a block or two past the end of each file being written) */
    return kpk_round_up(n, 4096) + 4096 + (uint64_t)p->n_members * 8192;
}

int kp_space_measure(const kp_plan *p, const kp_input *in, uint32_t first, const uint64_t *cursor, const kp_release *rel,
                     size_t n_rel, kp_space *s, char *err, size_t errlen)
{
    kp_layout est;
    double density = input_density(in);
    uint64_t *kept = calloc(p->n_members, sizeof *kept), *sc = malloc(sizeof *sc * ((size_t)p->n_members + 1));
    uint64_t *staged = calloc(p->n_members, sizeof *staged);
    uint32_t *fs_m = calloc(p->n_members, sizeof *fs_m);
    int rc = -1;
    memset(s, 0, sizeof *s);
    s->sparse = density < 1.0;
    s->fs = calloc(p->n_members, sizeof *s->fs);
    if (!kept || !sc || !staged || !fs_m || !s->fs || kp_plan_estimate(p, p->n_blocks ? KP_ESTIMATE_MARGIN : 0.0, &est)) {
        snprintf(err, errlen, "out of memory");
        goto out_nolayout;
    }
    for (uint32_t m = 0; m < p->n_members; m++) {
        struct stat st;
        kp_fs_space *f;
        int fresh = cursor[kp_target(p, p->members[m].role == KPK_ROLE_STRIPE ? KPK_STRIPED : (uint16_t)m)] ==
                    (p->members[m].role == KPK_ROLE_STRIPE ? 0 : p->opt.align);
        uint64_t fixed = m == 0 ? est.member_size[0] - est.extent_table_off : KPK_SUPERBLOCK_SIZE, reuse, data;
        kept[m] = kp_member_end(p, cursor, (uint16_t)m);
        data = est.member_size[m] - fixed > kept[m] ? est.member_size[m] - fixed - kept[m] : 0;
        if (fresh) fixed += KPK_SUPERBLOCK_SIZE; /* the primary, written last */
        if (stat(p->members[m].dir, &st) != 0) { snprintf(err, errlen, "%s: %s", p->members[m].dir, strerror(errno)); goto out; }
        f = fs_of(s, st.st_dev, p->members[m].dir);
        fs_m[m] = (uint32_t)(f - s->fs);
        if (m == 0) fixed += journal_bytes(p, first);
        f->need += (uint64_t)((double)data * density) + fixed;
        f->need_apparent += data + fixed;
        /* nothing kept: the file is created anew, every block it holds comes back */
        reuse = partial_reusable(p->members[m].partial, fresh ? 0 : kept[m]);
        f->held += reuse;
        if (reuse) { f->holders++; f->holder = p->members[m].partial; }
        snprintf(f->members + strlen(f->members), sizeof f->members - strlen(f->members), "%s%s", f->members[0] ? ", " : "",
                 p->members[m].path);
    }
    /* the walk: extents in order, each release after its extent (the
     * journal and the lock counted whole from the start) */
    memcpy(sc, cursor, sizeof *sc * ((size_t)p->n_members + 1));
    staged[fs_m[0]] = journal_bytes(p, first);
    for (size_t k = 0; k < n_rel; k++)
        if (rel[k].after == KP_RELEASE_FIRST) {
            timeline_point(p, s, sc, kept, fs_m, density, staged, KP_RELEASE_FIRST);
            release(s, &rel[k], fs_m[0], staged);
        }
    for (uint32_t i = first, k = 0; i < p->n_extents && n_rel; i++) {
        sc[kp_target(p, p->extents[i].member)] += kpk_round_up(kp_extent_estimate(p, i, p->n_blocks ? KP_ESTIMATE_MARGIN : 0.0), p->opt.align);
        for (; k < n_rel && (rel[k].after == KP_RELEASE_FIRST || rel[k].after <= i); k++) {
            if (rel[k].after != i) continue;
            staged[fs_m[0]] += rel[k].staged; /* the record is written before the shard goes */
            timeline_point(p, s, sc, kept, fs_m, density, staged, i);
            staged[fs_m[0]] -= rel[k].staged;
            release(s, &rel[k], fs_m[0], staged);
        }
    }
    /* the end: the whole output and the log, less everything released */
    staged[fs_m[0]] -= journal_bytes(p, first); /* counted in need */
    for (size_t f = 0; f < s->n; f++) {
        kp_fs_space *x = &s->fs[f];
        uint64_t end = x->need + staged[f], end_app = x->need_apparent + staged[f];
        end = end > x->freed ? end - x->freed : 0;
        end_app = end_app > x->freed_apparent ? end_app - x->freed_apparent : 0;
        if (end >= x->peak) { x->peak = end; x->peak_after = KP_RELEASE_FIRST; }
        if (end_app > x->peak_apparent) x->peak_apparent = end_app;
    }
    rc = 0;
out:
    kp_layout_free(&est);
out_nolayout:
    free(kept);
    free(sc);
    free(staged);
    free(fs_m);
    if (rc) kp_space_free(s);
    return rc;
}

int kp_space_verdict(const kp_plan *p, const kp_space *s, int consume, char *err, size_t errlen)
{
    for (size_t f = 0; f < s->n; f++) {
        const kp_fs_space *x = &s->fs[f];
        uint64_t want = consume ? x->peak : x->need;
        char b1[32], b2[32], b3[32], also[300] = "", est_note[120] = "", when[160] = "";
        if (!x->avail_known || x->avail + x->held >= want) continue;
        kfmt_bytes(want, b1, sizeof b1);
        kfmt_bytes(x->avail, b2, sizeof b2);
        kfmt_bytes(x->held, b3, sizeof b3);
        if (x->held) snprintf(also, sizeof also, " plus %s (%llu bytes) that %s hold%s and this run rewrites", b3,
                              (unsigned long long)x->held, x->holders == 1 ? x->holder : "the partial files", x->holders == 1 ? "s" : "");
        if (p->n_blocks)
            snprintf(est_note, sizeof est_note, "; an estimate: compressed extents at the stored/raw of sampled blocks, plus %.0f %%",
                     KP_ESTIMATE_MARGIN * 100);
        if (consume) {
            char d[64];
            if (x->peak_after == KP_RELEASE_FIRST) snprintf(when, sizeof when, " with --consume (at its peak, when it ends)");
            else {
                kpk_extent_describe(&p->extents[x->peak_after], d, sizeof d);
                snprintf(when, sizeof when, " with --consume (at its peak: %s written, its shard not yet deleted)", d);
            }
        }
        snprintf(err, errlen, "not enough free space for %s%s: need %s (%llu bytes%s), %s (%llu bytes) available%s, on the "
                 "filesystem of %s", x->members, when, b1, (unsigned long long)want, est_note, b2, (unsigned long long)x->avail,
                 also, x->dir);
        return -1;
    }
    return 0;
}

/* "4.26 MB", and the bytes when a sparse source makes a sparse output. */
static void fmt_need(const kp_space *s, uint64_t blocks, uint64_t bytes, char *buf, size_t n)
{
    char a[32], b[32];
    kfmt_bytes(blocks, a, sizeof a);
    kfmt_bytes(bytes, b, sizeof b);
    if (!s->sparse) snprintf(buf, n, "%s", a);
    else snprintf(buf, n, "%s allocated (%s in all: the source is sparse)", a, b);
}

static void peak_where(const kp_plan *p, const kp_fs_space *x, char *buf, size_t n)
{
    char d[64];
    if (x->peak_after == KP_RELEASE_FIRST) { snprintf(buf, n, "when it ends"); return; }
    kpk_extent_describe(&p->extents[x->peak_after], d, sizeof d);
    snprintf(buf, n, "once the %s is written, before its shard is deleted", d);
}

void kp_space_print(const kp_plan *p, const kp_space *s, int with, FILE *out)
{
    for (size_t f = 0; f < s->n; f++) {
        const kp_fs_space *x = &s->fs[f];
        char a[32], need[96], peak[96], where[120];
        kfmt_bytes(x->avail, a, sizeof a);
        fmt_need(s, x->need, x->need_apparent, need, sizeof need);
        fprintf(out, "  space on the filesystem of %s (%s): %s free\n", x->dir, x->members, x->avail_known ? a : "unknown");
        fprintf(out, "    without --consume: %s\n", need);
        if (!with) continue;
        fmt_need(s, x->peak, x->peak_apparent, peak, sizeof peak);
        peak_where(p, x, where, sizeof where);
        fprintf(out, "    with --consume:    %s at its peak, %s\n", peak, where);
    }
}

json_t *kp_space_json(const kp_plan *p, const kp_space *s, int with)
{
    json_t *a = json_array();
    for (size_t f = 0; f < s->n; f++) {
        const kp_fs_space *x = &s->fs[f];
        json_t *o = json_object();
        char where[120];
        json_object_set_new(o, "dir", json_string(x->dir));
        json_object_set_new(o, "members", json_string(x->members));
        json_object_set_new(o, "available_bytes", x->avail_known ? json_integer((json_int_t)x->avail) : json_null());
        json_object_set_new(o, "need_bytes", json_integer((json_int_t)x->need));
        json_object_set_new(o, "need_apparent_bytes", json_integer((json_int_t)x->need_apparent));
        if (with) {
            peak_where(p, x, where, sizeof where);
            json_object_set_new(o, "consume_peak_bytes", json_integer((json_int_t)x->peak));
            json_object_set_new(o, "consume_peak_apparent_bytes", json_integer((json_int_t)x->peak_apparent));
            json_object_set_new(o, "consume_peak_when", json_string(where));
            json_object_set_new(o, "consume_freed_bytes", json_integer((json_int_t)x->freed));
        }
        json_array_append_new(a, o);
    }
    return a;
}
