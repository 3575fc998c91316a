/* KPK reader: opening (docs/FORMAT.md §3: superblocks; §2: the directory
 * sections) and the accessors.  The rules of the directory are checked in
 * kpk_check.c, the member files opened in kpk_members.c. */
#include "kpk_internal.h"

#include "kio.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

/* ---- small accessors ------------------------------------------------------ */

const char *kpk_path(const kpk_file *f) { return f->path; }
int kpk_fd(const kpk_file *f) { return f->fd; }
uint64_t kpk_size(const kpk_file *f) { return f->size; }
const kpk_superblock *kpk_super(const kpk_file *f) { return &f->sb; }
const char *kpk_warning(const kpk_file *f) { return f->warning[0] ? f->warning : NULL; }
uint32_t kpk_extent_count(const kpk_file *f) { return (uint32_t)f->sb.extent_count; }
const kpk_extent *kpk_extent_at(const kpk_file *f, uint32_t i)
{
    return i < f->sb.extent_count ? &f->extents[i] : NULL;
}
int64_t kpk_find_meta(const kpk_file *f) { return f->meta; }
int64_t kpk_find_globals(const kpk_file *f) { return f->globals; }
int64_t kpk_find_drafter(const kpk_file *f, uint32_t part) { return part < 2 ? f->drafter[part] : -1; }
int64_t kpk_find_trunk(const kpk_file *f, uint32_t L) { return L < f->n_layers ? f->trunk[L] : -1; }
int64_t kpk_find_expert(const kpk_file *f, uint32_t L, uint32_t e)
{
    uint32_t lo = 0, hi = f->n_expert_extents;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        const struct kpk_expert_key *k = &f->experts[mid];
        if (k->layer < L || (k->layer == L && k->expert < e)) lo = mid + 1;
        else hi = mid;
    }
    if (lo < f->n_expert_extents && f->experts[lo].layer == L && f->experts[lo].expert == e) return f->experts[lo].extent;
    return -1;
}
uint32_t kpk_layer_count(const kpk_file *f) { return f->n_layers; }
uint32_t kpk_expert_count(const kpk_file *f) { return f->n_experts; }
uint64_t kpk_extent_padded_len(const kpk_file *f, const kpk_extent *x) { return kpk_round_up(x->stored_len, f->sb.align); }
uint64_t kpk_tensor_count(const kpk_file *f) { return f->sb.tensor_count; }
const char *kpk_manifest(const kpk_file *f, size_t *len)
{
    if (len) *len = f->sb.manifest_len;
    return f->manifest;
}
uint16_t kpk_member_count(const kpk_file *f) { return f->sb.member_count; }
int kpk_member_fd(const kpk_file *f, uint16_t m) { return m < f->sb.member_count ? f->member_fd[m] : -1; }
int kpk_member_here(const kpk_file *f, uint16_t m) { return kpk_member_fd(f, m) >= 0; }
const char *kpk_member_path(const kpk_file *f, uint16_t m) { return m < f->sb.member_count ? f->member_path[m] : NULL; }
const kpk_member *kpk_member_at(const kpk_file *f, uint16_t m) { return m < f->sb.member_count ? &f->members[m] : NULL; }
const char *kpk_member_name(const kpk_file *f, uint16_t m)
{
    if (m >= f->sb.member_count) return NULL;
    return m == 0 ? "" : f->strings + f->members[m].path_off;
}
uint64_t kpk_total_size(const kpk_file *f)
{
    uint64_t s = 0;
    for (uint16_t m = 0; m < f->sb.member_count; m++) s += f->members[m].file_size;
    return s;
}

void kpk_extent_name(const kpk_file *f, uint32_t i, char *buf, size_t n)
{
    if (i < f->sb.extent_count) kpk_extent_describe(&f->extents[i], buf, n);
    else snprintf(buf, n, "extent %u", i);
}

int kpk_tensor_at(const kpk_file *f, uint64_t i, kpk_tensor *t)
{
    uint32_t name_off;
    if (i >= f->sb.tensor_count) return -1;
    kpk_tensor_decode(f->tensor_records + i * KPK_TENSOR_RECORD_SIZE, t, &name_off);
    t->name = f->strings + name_off;
    return 0;
}

uint64_t kpk_name_hash(const char *s, size_t n) { return XXH3_64bits(s, n); }

int64_t kpk_find_tensor(const kpk_file *f, const char *name, kpk_tensor *out)
{
    size_t n = strlen(name);
    uint64_t h = kpk_name_hash(name, n) & f->name_hash_mask;
    for (;;) {
        uint32_t slot = f->name_hash[h];
        kpk_tensor t;
        if (!slot) return -1;
        kpk_tensor_at(f, slot - 1, &t);
        if (t.name_len == n && memcmp(t.name, name, n) == 0) {
            if (out) *out = t;
            return (int64_t)slot - 1;
        }
        h = (h + 1) & f->name_hash_mask;
    }
}

/* ---- messages -------------------------------------------------------------- */

int kpk_fail(kpk_err *err, int code, const kpk_file *f, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kpk_err_set(err, code, "%s: %s", f->path, msg);
    return -1;
}

int kpk_extent_fail(kpk_err *err, int code, const kpk_file *f, uint32_t i, const char *fmt, ...)
{
    char msg[600], d[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kpk_extent_name(f, i, d, sizeof d);
    kpk_err_set(err, code, "%s: %s (extent %u): %s", f->path, d, i, msg);
    return -1;
}

void kpk_warn(kpk_file *f, const char *fmt, ...)
{
    size_t n = strlen(f->warning);
    va_list ap;
    if (n && n + 2 < sizeof f->warning) { memcpy(f->warning + n, "; ", 3); n += 2; }
    va_start(ap, fmt);
    vsnprintf(f->warning + n, sizeof f->warning - n, fmt, ap);
    va_end(ap);
}

/* ---- superblocks (§3) ------------------------------------------------------- */

int kpk_read_superblocks(int fd, uint64_t size, const char *what, kpk_superblock *sb, int *used_backup,
                         char *backup_why, size_t why_len, kpk_err *err)
{
    uint8_t prim[KPK_SUPERBLOCK_SIZE], back[KPK_SUPERBLOCK_SIZE];
    kpk_err e1 = {0}, e2 = {0};
    int have_back = 0, prim_magic, back_magic;
    size_t first = size < KPK_SUPERBLOCK_SIZE ? (size_t)size : KPK_SUPERBLOCK_SIZE;

    *used_backup = 0;
    /* 1. the first and the last block; neither with the magic: not a KPK file */
    memset(prim, 0, sizeof prim);
    if (first && kio_pread_full(fd, prim, first, 0)) {
        kpk_err_set(err, KPK_EIO, "%s: %s", what, strerror(errno));
        return -1;
    }
    if (size >= 2 * KPK_SUPERBLOCK_SIZE) {
        if (kio_pread_full(fd, back, KPK_SUPERBLOCK_SIZE, size - KPK_SUPERBLOCK_SIZE)) {
            kpk_err_set(err, KPK_EIO, "%s: %s", what, strerror(errno));
            return -1;
        }
        have_back = 1;
    }
    prim_magic = size >= KPK_MAGIC_LEN && memcmp(prim, KPK_MAGIC, KPK_MAGIC_LEN) == 0;
    back_magic = have_back && memcmp(back, KPK_MAGIC, KPK_MAGIC_LEN) == 0;
    if (!prim_magic && !back_magic) {
        kpk_err_set(err, KPK_ENOTKPK, "%s: not a KPK file (no KPK magic number at its start or end)", what);
        return -1;
    }
    /* the magic, then the end of the file before the version fields: a KPK
     * file cut there (the magic and nothing to read a version from) */
    if (size < KPK_VERSION_END) {
        kpk_err_set(err, KPK_EFORMAT, "%s: truncated KPK file: %llu bytes, the file ends before its version number",
                    what, (unsigned long long)size);
        return -1;
    }
    /* 2. the major version, before anything else: the primary's, unless an
     * intact backup proves the primary damaged (a flipped bit in the primary's
     * major field is damage, not a newer format) */
    {
        const uint8_t *b = prim_magic ? prim : back;
        unsigned major = (unsigned)(b[8] | b[9] << 8), minor = (unsigned)(b[10] | b[11] << 8);
        if (major != KPK_VERSION_MAJOR) {
            kpk_superblock bsb;
            if (prim_magic && back_magic && size % KPK_SUPERBLOCK_SIZE == 0 && kpk_superblock_decode(back, &bsb, &e2) == 0 &&
                bsb.file_size == size) {
                *sb = bsb;
                *used_backup = 1;
                snprintf(backup_why, why_len, "%s: primary superblock damaged (its major version reads %u; the intact "
                         "backup says %u); opened with the backup copy", what, major, bsb.major);
                return 0;
            }
            kpk_err_set(err, KPK_EVERSION, "%s: KPK format version %u.%u is not supported by this reader (it reads %u.x)",
                        what, major, minor, KPK_VERSION_MAJOR);
            return -1;
        }
    }
    /* 3. whole 4096-byte blocks, room for both copies */
    if (size < 2 * KPK_SUPERBLOCK_SIZE || size % KPK_SUPERBLOCK_SIZE) {
        kpk_err_set(err, KPK_EFORMAT, "%s: truncated or torn KPK file: %llu bytes is not a whole number of 4096-byte "
                    "blocks with a backup superblock at the end", what, (unsigned long long)size);
        return -1;
    }
    /* 4. an intact primary: the file has the size it records, the copies agree */
    if (kpk_superblock_decode(prim, sb, &e1) == 0) {
        if (sb->file_size != size) {
            kpk_err_set(err, KPK_EFORMAT, "%s: truncated or extended KPK file: the superblock says %llu bytes, the file has %llu",
                        what, (unsigned long long)sb->file_size, (unsigned long long)size);
            return -1;
        }
        if (memcmp(prim, back, KPK_SUPERBLOCK_SIZE) != 0) {
            kpk_err_set(err, KPK_EFORMAT, "%s: the backup superblock at the end of the file does not match the primary "
                        "(torn or unfinished file)", what);
            return -1;
        }
        return 0;
    }
    /* The primary's checksum matched but a field is invalid: the file is
     * wrong as written (or newer), not a damaged copy. */
    if (e1.code != KPK_ECHECKSUM && e1.code != KPK_ENOTKPK) {
        kpk_err_set(err, e1.code, "%s: %s", what, e1.msg);
        return -1;
    }
    /* 5. a damaged primary (checksum, or even its magic): proceed with an
     * intact backup that describes this file, and report the damage */
    if (back_magic && kpk_superblock_decode(back, sb, &e2) == 0 && sb->file_size == size) {
        *used_backup = 1;
        snprintf(backup_why, why_len, "%s: primary superblock damaged (%s); opened with the backup copy", what, e1.msg);
        return 0;
    }
    if (e2.code == KPK_EVERSION) {
        kpk_err_set(err, KPK_EVERSION, "%s: %s", what, e2.msg);
        return -1;
    }
    kpk_err_set(err, KPK_ECHECKSUM, "%s: primary superblock: %s; backup superblock: %s", what, e1.msg,
                !back_magic ? "no KPK magic number" : e2.msg[0] ? e2.msg : "describes a different file size");
    return -1;
}

/* ---- directory sections ------------------------------------------------------ */

struct section { const char *what; uint64_t off, len, xxh3; int present; };

/* Read one section after checking its bounds; verify its hash. */
static int read_section(kpk_file *f, const struct section *s, uint64_t lo, void **out, kpk_err *err)
{
    uint8_t *buf;
    *out = NULL;
    if (s->off % KPK_SECTION_ALIGN || s->off < lo || !kpk_fits(s->off, s->len, f->size - KPK_SUPERBLOCK_SIZE))
        return kpk_fail(err, KPK_EFORMAT, f, "%s (offset %llu, %llu bytes) lies outside the directory area or overlaps "
                        "the section before it", s->what, (unsigned long long)s->off, (unsigned long long)s->len);
    if (s->len > KPK_MAX_SECTION)
        return kpk_fail(err, KPK_EFORMAT, f, "%s: implausible size %llu bytes", s->what, (unsigned long long)s->len);
    buf = malloc(s->len + 1);
    if (!buf) return kpk_fail(err, KPK_ENOMEM, f, "out of memory reading the %s", s->what);
    if (s->len && kio_pread_full(f->fd, buf, s->len, s->off)) {
        free(buf);
        return kpk_fail(err, KPK_EIO, f, "reading the %s: %s", s->what, strerror(errno));
    }
    buf[s->len] = 0;
    if (XXH3_64bits(buf, s->len) != s->xxh3) {
        free(buf);
        return kpk_fail(err, KPK_ECHECKSUM, f, "%s checksum mismatch", s->what);
    }
    *out = buf;
    return 0;
}

static int read_directory(kpk_file *f, kpk_err *err)
{
    const kpk_superblock *sb = &f->sb;
    struct section s[6] = {
        {"extent table", sb->extent_table_off, sb->extent_count * KPK_EXTENT_RECORD_SIZE, sb->extent_table_xxh3, 1},
        {"tensor table", sb->tensor_table_off, sb->tensor_count * KPK_TENSOR_RECORD_SIZE, sb->tensor_table_xxh3, 1},
        {"string pool", sb->strings_off, sb->strings_len, sb->strings_xxh3, 1},
        {"manifest", sb->manifest_off, sb->manifest_len, sb->manifest_xxh3, 1},
        {"member table", sb->member_table_off, (uint64_t)sb->member_count * KPK_MEMBER_RECORD_SIZE, sb->member_table_xxh3,
         sb->member_count > 1},
        {"block table", sb->block_table_off, sb->block_count * KPK_BLOCK_RECORD_SIZE, sb->block_table_xxh3, sb->block_count > 0},
    };
    void *p[6] = {0};
    uint64_t lo;

    if (sb->extent_count > KPK_MAX_EXTENTS || sb->tensor_count > KPK_MAX_TENSORS || sb->block_count > KPK_MAX_BLOCKS)
        return kpk_fail(err, KPK_EFORMAT, f, "implausible table sizes (%llu extents, %llu tensors, %llu blocks; the limits "
                        "are %u, %u, %u)", (unsigned long long)sb->extent_count, (unsigned long long)sb->tensor_count,
                        (unsigned long long)sb->block_count, KPK_MAX_EXTENTS, KPK_MAX_TENSORS, KPK_MAX_BLOCKS);
    /* The directory follows the last extent of the entry file. */
    if (sb->extent_table_off < sb->align || sb->extent_table_off % KPK_SECTION_ALIGN)
        return kpk_fail(err, KPK_EFORMAT, f, "extent table offset %llu is invalid", (unsigned long long)sb->extent_table_off);
    if (!s[4].present && (sb->member_table_off || sb->member_table_xxh3))
        return kpk_fail(err, KPK_EFORMAT, f, "a single file with a member table offset or checksum");
    if (!s[5].present && (sb->block_table_off || sb->block_table_xxh3))
        return kpk_fail(err, KPK_EFORMAT, f, "no blocks but a block table offset or checksum");
    /* sections start on 4096-byte boundaries, in order, without overlapping */
    lo = sb->extent_table_off;
    for (int k = 0; k < 6; k++) {
        if (!s[k].present) continue;
        if (read_section(f, &s[k], lo, &p[k], err)) {
            for (int j = 0; j < k; j++) free(p[j]);
            return -1;
        }
        lo = s[k].off + s[k].len;
    }
    f->extents = malloc(sizeof *f->extents * (sb->extent_count ? sb->extent_count : 1));
    f->members = calloc(sb->member_count, sizeof *f->members);
    f->blocks = malloc(sizeof *f->blocks * (sb->block_count ? sb->block_count : 1));
    if (!f->extents || !f->members || !f->blocks) {
        for (int k = 0; k < 6; k++) free(p[k]);
        return kpk_fail(err, KPK_ENOMEM, f, "out of memory reading the directory");
    }
    for (uint64_t i = 0; i < sb->extent_count; i++)
        kpk_extent_decode((uint8_t *)p[0] + i * KPK_EXTENT_RECORD_SIZE, &f->extents[i]);
    free(p[0]);
    f->tensor_records = p[1];
    f->strings = p[2];
    f->manifest = p[3];
    /* reserved bytes of the records are a rule of the tables, checked after
     * the values this reader does not know (kpk_check_known_values) */
    if (s[4].present) {
        for (uint32_t m = 0; m < sb->member_count; m++)
            if (kpk_member_decode((uint8_t *)p[4] + (uint64_t)m * KPK_MEMBER_RECORD_SIZE, &f->members[m]) &&
                sb->minor <= KPK_VERSION_MINOR && !f->member_reserved)
                f->member_reserved = m + 1;
        free(p[4]);
    } else {
        /* a single file: its own record, as a set would have it */
        f->members[0].role = KPK_ROLE_ENTRY;
        f->members[0].stripe_index = KPK_NO_STRIPE;
        f->members[0].file_size = f->size;
    }
    for (uint64_t b = 0; b < sb->block_count; b++)
        if (kpk_block_decode_record((uint8_t *)p[5] + b * KPK_BLOCK_RECORD_SIZE, &f->blocks[b]) &&
            sb->minor <= KPK_VERSION_MINOR && !f->block_reserved)
            f->block_reserved = b + 1;
    free(p[5]);
    return 0;
}

/* The directory holding the entry file itself (symlinks resolved): member
 * paths are relative to it. */
static char *entry_dir(const char *path)
{
    char *real = realpath(path, NULL), *slash;
    if (!real) return NULL;
    slash = strrchr(real, '/');
    if (slash == real) slash[1] = 0;
    else if (slash) *slash = 0;
    return real;
}

int kpk_open(const char *path, kpk_file **out, kpk_err *err) { return kpk_open_here(path, 0, out, err); }

int kpk_open_here(const char *path, int absent_ok, kpk_file **out, kpk_err *err)
{
    kpk_file *f = calloc(1, sizeof *f);
    const kpk_superblock *sb;
    int64_t sz;
    int used_backup = 0;

    *out = NULL;
    if (!f) { kpk_err_set(err, KPK_ENOMEM, "%s: out of memory", path); return -1; }
    f->fd = -1;
    f->meta = f->globals = -1;
    f->absent_ok = absent_ok != 0;
    f->drafter[0] = f->drafter[1] = -1;
    f->path = strdup(path);
    if (!f->path) { kpk_err_set(err, KPK_ENOMEM, "%s: out of memory", path); goto bad; }
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    /* its identity first, before a byte is read (kpk_unchanged) */
    if (f->fd < 0 || kpk_ident_take(f->fd, &f->entry_ident) || (sz = kio_file_size(f->fd)) < 0) {
        kpk_err_set(err, KPK_EIO, "%s: %s", path, strerror(errno));
        goto bad;
    }
    f->size = (uint64_t)sz;
    if (kpk_read_superblocks(f->fd, f->size, path, &f->sb, &used_backup, f->warning, sizeof f->warning, err)) goto bad;
    sb = &f->sb;
    if (sb->member_index != 0) {
        kpk_fail(err, KPK_EMEMBER, f, "this is member %u of a set of %u files; open the set's entry file (member 0) instead",
                 sb->member_index, sb->member_count);
        goto bad;
    }
    if (sb->set_id != (sb->extent_table_xxh3 ^ sb->tensor_table_xxh3)) {
        kpk_fail(err, KPK_EFORMAT, f, "superblock: the set id is not the extent table checksum XOR the tensor table checksum");
        goto bad;
    }
    /* only a set needs it: a single file may sit behind a path realpath cannot
     * name again (a memfd's /proc/self/fd/N) */
    if (sb->member_count > 1 && !(f->dir = entry_dir(path))) {
        kpk_err_set(err, KPK_EIO, "%s: %s", path, strerror(errno));
        goto bad;
    }
    if (read_directory(f, err)) goto bad;
    if (kpk_check_known_values(f, err) || kpk_check_member_table(f, err) || kpk_check_string_pool(f, err) || kpk_check_extents(f, err) ||
        kpk_check_tensors(f, err) || kpk_check_blocks(f, err) || kpk_open_members(f, err))
        goto bad;
    *out = f;
    return 0;
bad:
    kpk_close(f);
    return -1;
}

void kpk_close(kpk_file *f)
{
    if (!f) return;
    if (f->member_fd)
        for (uint32_t m = 1; m < f->sb.member_count; m++)
            if (f->member_fd[m] >= 0) close(f->member_fd[m]);
    if (f->fd >= 0) close(f->fd);
    if (f->member_path)
        for (uint32_t m = 1; m < f->sb.member_count; m++) free(f->member_path[m]);
    free(f->member_fd);
    free(f->ident);
    free(f->member_path);
    free(f->path);
    free(f->dir);
    free(f->extents);
    free(f->tensor_records);
    free(f->strings);
    free(f->manifest);
    free(f->blocks);
    free(f->members);
    free(f->stripe_member);
    free(f->trunk);
    free(f->experts);
    free(f->name_hash);
    free(f);
}
