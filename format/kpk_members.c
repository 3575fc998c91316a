/* Member files (docs/FORMAT.md §7): opening a set (§7.4) and mapping an
 * extent's stored bytes onto member files, through the stripe space (§7.3). */
#include "kpk_internal.h"

#include "kio.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* "member 2 (../d3/k3.kpk.s2)" */
static void member_label(const kpk_file *f, uint32_t m, char *buf, size_t n)
{
    snprintf(buf, n, "member %u (%s)", m, m ? f->strings + f->members[m].path_off : f->path);
}

static int member_fail(kpk_err *err, int code, const kpk_file *f, uint32_t m, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int member_fail(kpk_err *err, int code, const kpk_file *f, uint32_t m, const char *fmt, ...)
{
    char msg[500], label[KPK_MAX_PATH + 32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    member_label(f, m, label, sizeof label);
    kpk_err_set(err, code, "%s: %s: %s", f->path, label, msg);
    return -1;
}

/* The superblock fields every member shares with the entry (§3). */
static const char *shared_field_differs(const kpk_superblock *a, const kpk_superblock *e)
{
    if (a->minor != e->minor) return "minor version";
    if (a->incompat != e->incompat) return "incompat feature bits";
    if (a->compat != e->compat) return "compat feature bits";
    if (a->align != e->align) return "alignment";
    if (a->order != e->order) return "extent order";
    if (a->member_count != e->member_count) return "member count";
    if (a->stripe_unit != e->stripe_unit) return "stripe unit";
    if (a->stripe_count != e->stripe_count) return "stripe member count";
    if (a->stripe_len != e->stripe_len) return "stripe length";
    return NULL;
}

/* The entry-only fields, which are 0 in every other member. */
static int entry_fields_zero(const kpk_superblock *a)
{
    return !(a->extent_table_off | a->extent_count | a->extent_table_xxh3 | a->tensor_table_off | a->tensor_count |
             a->tensor_table_xxh3 | a->strings_off | a->strings_len | a->strings_xxh3 | a->manifest_off | a->manifest_len |
             a->manifest_xxh3 | a->data_bytes | a->member_table_off | a->member_table_xxh3 | a->block_table_off |
             a->block_count | a->block_table_xxh3);
}

static int open_member(kpk_file *f, uint32_t m, struct stat *ids, kpk_err *err)
{
    const kpk_member *r = &f->members[m];
    const char *rel = f->strings + r->path_off;
    struct stat st;
    kpk_superblock sb;
    kpk_err e = {0};
    char label[KPK_MAX_PATH + 32], why[600];
    int used_backup = 0;
    size_t n = strlen(f->dir) + strlen(rel) + 2;

    if (!(f->member_path[m] = malloc(n))) return member_fail(err, KPK_ENOMEM, f, m, "out of memory");
    snprintf(f->member_path[m], n, "%s/%s", f->dir, rel);
    f->member_fd[m] = open(f->member_path[m], O_RDONLY | O_CLOEXEC);
    if (f->member_fd[m] < 0 && errno == ENOENT && f->absent_ok) return 0;      /* on another machine */
    if (f->member_fd[m] < 0) return member_fail(err, KPK_EMEMBER, f, m, "%s (missing member file)", strerror(errno));
    if (kpk_ident_take(f->member_fd[m], &f->ident[m]) || fstat(f->member_fd[m], &st))
        return member_fail(err, KPK_EIO, f, m, "%s", strerror(errno));
    if (!S_ISREG(st.st_mode)) return member_fail(err, KPK_EMEMBER, f, m, "not a regular file (missing member file)");
    /* the same file as the entry or an earlier member (a symlink, a repeated path) */
    for (uint32_t k = 0; k < m; k++)
        if (ids[k].st_dev == st.st_dev && ids[k].st_ino == st.st_ino)
            return member_fail(err, KPK_EMEMBER, f, m, "duplicated: this is the same file as member %u (%s)", k,
                               k ? f->strings + f->members[k].path_off : f->path);
    ids[m] = st;
    if ((uint64_t)st.st_size != r->file_size)
        return member_fail(err, KPK_EMEMBER, f, m, "truncated or extended: the set records %llu bytes, the file has %llu",
                           (unsigned long long)r->file_size, (unsigned long long)st.st_size);
    member_label(f, m, label, sizeof label);
    if (kpk_read_superblocks(f->member_fd[m], (uint64_t)st.st_size, label, &sb, &used_backup, why, sizeof why, &e)) {
        kpk_err_set(err, e.code, "%s: %s", f->path, e.msg);
        return -1;
    }
    if (sb.set_id != f->sb.set_id)
        return member_fail(err, KPK_EMEMBER, f, m, "belongs to another set (set id %016llx, the entry's is %016llx): a "
                           "member of an earlier or different conversion", (unsigned long long)sb.set_id,
                           (unsigned long long)f->sb.set_id);
    if (sb.member_index != m)
        return member_fail(err, KPK_EMEMBER, f, m, "renamed or swapped: the file at this path is member %u of the set",
                           sb.member_index);
    {
        const char *d = shared_field_differs(&sb, &f->sb);
        if (d) return member_fail(err, KPK_EMEMBER, f, m, "does not match the set: its %s differs from the entry's", d);
    }
    if (!entry_fields_zero(&sb))
        return member_fail(err, KPK_EMEMBER, f, m, "does not match the set: it has directory fields only an entry file has");
    if (sb.superblock_xxh3 != r->superblock_xxh3)
        return member_fail(err, KPK_EMEMBER, f, m, "does not match the set: its superblock checksum %016llx differs from "
                           "the one the entry records (%016llx)", (unsigned long long)sb.superblock_xxh3,
                           (unsigned long long)r->superblock_xxh3);
    if (used_backup) kpk_warn(f, "%s", why);
    return 0;
}

int kpk_open_members(kpk_file *f, kpk_err *err)
{
    uint32_t n = f->sb.member_count;
    struct stat *ids;
    int rc = 0;
    f->member_fd = malloc(sizeof *f->member_fd * n);
    f->member_path = calloc(n, sizeof *f->member_path);
    f->ident = calloc(n, sizeof *f->ident);
    ids = calloc(n, sizeof *ids);
    if (!f->member_fd || !f->member_path || !f->ident || !ids) { free(ids); return kpk_fail(err, KPK_ENOMEM, f, "out of memory"); }
    f->ident[0] = f->entry_ident;
    f->member_fd[0] = f->fd;
    f->member_path[0] = f->path;
    for (uint32_t m = 1; m < n; m++) f->member_fd[m] = -1;
    if (fstat(f->fd, &ids[0])) { free(ids); return kpk_fail(err, KPK_EIO, f, "%s", strerror(errno)); }
    for (uint32_t m = 1; m < n && !rc; m++) rc = open_member(f, m, ids, err);
    free(ids);
    return rc;
}

/* ---- the stripe mapping (§7.3) -------------------------------------------------- */

static size_t push_seg(kpk_seg *out, size_t n, size_t max, uint16_t member, uint64_t off, uint64_t len, int *full)
{
    if (n && out[n - 1].member == member && out[n - 1].off + out[n - 1].len == off) { out[n - 1].len += len; return n; }
    if (n == max) { *full = 1; return n; }
    out[n].member = member;
    out[n].off = off;
    out[n].len = len;
    return n + 1;
}

size_t kpk_stripe_segments(const kpk_file *f, uint64_t pos, uint64_t len, kpk_seg *out, size_t max, uint64_t *done)
{
    const uint64_t U = f->sb.stripe_unit, N = f->sb.stripe_count, A = f->sb.align;
    size_t n = 0;
    int full = 0;
    *done = 0;
    if (!N || !kpk_fits(pos, len, f->sb.stripe_len)) return 0;
    while (*done < len) {
        uint32_t k;
        uint64_t off, l;
        kpk_stripe_locate(U, N, A, pos + *done, &k, &off, &l);
        if (l > len - *done) l = len - *done;
        n = push_seg(out, n, max, f->stripe_member[k], off, l, &full);
        if (full) break;
        *done += l;
    }
    return n;
}

size_t kpk_extent_segments(const kpk_file *f, uint32_t i, uint64_t pos, uint64_t len, kpk_seg *out, size_t max,
                           uint64_t *done)
{
    const kpk_extent *x;
    *done = 0;
    if (i >= f->sb.extent_count || !max) return 0;
    x = &f->extents[i];
    if (!kpk_fits(pos, len, kpk_round_up(x->stored_len, f->sb.align))) return 0;
    if (x->member == KPK_STRIPED) return kpk_stripe_segments(f, x->offset + pos, len, out, max, done);
    out[0].member = x->member;
    out[0].off = x->offset + pos;
    out[0].len = len;
    *done = len;
    return 1;
}

#define SEGS 64

/* Read [off, off+len) of a target into buf, segment by segment; the
 * segments come from map (stripe or extent). */
static int read_segments(const kpk_file *f, const kpk_seg *seg, size_t n, uint8_t *buf, const char *what, kpk_err *err)
{
    for (size_t s = 0; s < n; s++) {
        if (f->member_fd[seg[s].member] < 0) {
            char label[KPK_MAX_PATH + 32];
            member_label(f, seg[s].member, label, sizeof label);
            kpk_err_set(err, KPK_EMEMBER, "%s: %s: reading %s: the member file is not on this machine", f->path, label, what);
            return -1;
        }
        if (kio_pread_full(f->member_fd[seg[s].member], buf, seg[s].len, seg[s].off)) {
            int e = errno;
            char label[KPK_MAX_PATH + 32];
            member_label(f, seg[s].member, label, sizeof label);
            kpk_err_set(err, KPK_EIO, "%s: %s: reading %s at offset %llu: %s", f->path, label, what,
                        (unsigned long long)seg[s].off, e == ENODATA ? "unexpected end of file" : strerror(e));
            return -1;
        }
        buf += seg[s].len;
    }
    return 0;
}

int kpk_target_pread(const kpk_file *f, uint16_t target, void *buf, uint64_t len, uint64_t off, kpk_err *err)
{
    kpk_seg seg[SEGS];
    uint8_t *p = buf;
    if (target != KPK_STRIPED) {
        kpk_seg one = {target, off, len};
        if (target >= f->sb.member_count) { kpk_err_set(err, KPK_EINVAL, "%s: no member %u", f->path, target); return -1; }
        return read_segments(f, &one, 1, p, "data", err);
    }
    while (len) {
        uint64_t done;
        size_t n = kpk_stripe_segments(f, off, len, seg, SEGS, &done);
        if (!n) { kpk_err_set(err, KPK_EINVAL, "%s: stripe range %llu + %llu is outside the stripe space", f->path,
                              (unsigned long long)off, (unsigned long long)len); return -1; }
        if (read_segments(f, seg, n, p, "the stripe space", err)) return -1;
        p += done; off += done; len -= done;
    }
    return 0;
}

int kpk_extent_pread(const kpk_file *f, uint32_t i, void *buf, uint64_t len, uint64_t pos, kpk_err *err)
{
    kpk_seg seg[SEGS];
    uint8_t *p = buf;
    char d[64];
    kpk_extent_name(f, i, d, sizeof d);
    while (len) {
        uint64_t done;
        size_t n = kpk_extent_segments(f, i, pos, len, seg, SEGS, &done);
        if (!n) return kpk_extent_fail(err, KPK_EINVAL, f, i, "read of %llu + %llu is outside the extent",
                                       (unsigned long long)pos, (unsigned long long)len);
        if (read_segments(f, seg, n, p, d, err)) return -1;
        p += done; pos += done; len -= done;
    }
    return 0;
}
