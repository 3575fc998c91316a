/* KPK reader: open + validate (docs/FORMAT.md §7 lists every check). */
#include "kpk_reader.h"

#include "kio.h"

#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

struct kpk_file {
    int fd;
    char *path;
    uint64_t size;
    kpk_superblock sb;
    char warning[256];
    kpk_extent *extents;
    uint8_t *tensor_records;     /* tensor_count * 64 bytes, decoded on access */
    char *strings;               /* string pool, NUL-terminated names */
    char *manifest;              /* NUL-terminated */
    uint32_t n_layers, n_experts;
    int64_t meta, globals;
    int64_t *trunk;              /* [n_layers] */
    int64_t *expert;             /* [n_layers * n_experts] */
    uint32_t *name_hash;         /* open addressing: tensor index + 1, 0 = empty */
    uint64_t name_hash_mask;
};

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
int64_t kpk_find_trunk(const kpk_file *f, uint32_t L) { return L < f->n_layers ? f->trunk[L] : -1; }
int64_t kpk_find_expert(const kpk_file *f, uint32_t L, uint32_t e)
{
    if (L >= f->n_layers || e >= f->n_experts) return -1;
    return f->expert[(uint64_t)L * f->n_experts + e];
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

int kpk_tensor_at(const kpk_file *f, uint64_t i, kpk_tensor *t)
{
    uint32_t name_off;
    if (i >= f->sb.tensor_count) return -1;
    kpk_tensor_decode(f->tensor_records + i * KPK_TENSOR_RECORD_SIZE, t, &name_off);
    t->name = f->strings + name_off;
    return 0;
}

static uint64_t name_hash(const char *s, size_t n) { return XXH3_64bits(s, n); }

int64_t kpk_find_tensor(const kpk_file *f, const char *name, kpk_tensor *out)
{
    size_t n = strlen(name);
    uint64_t h = name_hash(name, n) & f->name_hash_mask;
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

/* ---- open ------------------------------------------------------------------ */

static int fail(kpk_err *err, int code, const kpk_file *f, const char *what)
{
    kpk_err_set(err, code, "%s: %s", f->path, what);
    return -1;
}

/* a + b <= limit without overflow */
static int fits(uint64_t a, uint64_t b, uint64_t limit) { return a <= limit && b <= limit - a; }

static int read_superblocks(kpk_file *f, kpk_err *err)
{
    uint8_t prim[KPK_SUPERBLOCK_SIZE], back[KPK_SUPERBLOCK_SIZE];
    kpk_err e1 = {0}, e2 = {0};
    int have_back = 0, ok1, ok2;
    char msg[400];

    if (f->size < 8) return fail(err, KPK_ENOTKPK, f, "not a KPK file (shorter than the magic number)");
    if (kio_pread_full(f->fd, prim, f->size < KPK_SUPERBLOCK_SIZE ? (size_t)f->size : KPK_SUPERBLOCK_SIZE, 0))
        return fail(err, KPK_EIO, f, strerror(errno));
    if (memcmp(prim, KPK_MAGIC, KPK_MAGIC_LEN) != 0)
        return fail(err, KPK_ENOTKPK, f, "not a KPK file (bad magic number)");
    if (f->size < 2 * KPK_SUPERBLOCK_SIZE || f->size % KPK_SUPERBLOCK_SIZE) {
        snprintf(msg, sizeof msg, "truncated or torn KPK file: %llu bytes is not a whole number of 4096-byte blocks "
                 "with a backup superblock at the end", (unsigned long long)f->size);
        return fail(err, KPK_EFORMAT, f, msg);
    }
    if (kio_pread_full(f->fd, back, KPK_SUPERBLOCK_SIZE, f->size - KPK_SUPERBLOCK_SIZE) == 0) have_back = 1;
    ok1 = kpk_superblock_decode(prim, &f->sb, &e1) == 0;
    /* A newer major version is reported as such, not as corruption. */
    if (!ok1 && e1.code == KPK_EVERSION) return fail(err, KPK_EVERSION, f, e1.msg);
    if (ok1) {
        if (f->sb.file_size != f->size) {
            snprintf(msg, sizeof msg, "truncated or extended KPK file: the superblock says %llu bytes, the file has %llu",
                     (unsigned long long)f->sb.file_size, (unsigned long long)f->size);
            return fail(err, KPK_EFORMAT, f, msg);
        }
        if (!have_back || memcmp(prim, back, KPK_SUPERBLOCK_SIZE) != 0)
            return fail(err, KPK_EFORMAT, f, "the backup superblock at the end of the file does not match the primary "
                        "(torn or truncated file)");
        return 0;
    }
    /* Primary damaged: fall back to the backup if it is intact and describes this file. */
    ok2 = have_back && kpk_superblock_decode(back, &f->sb, &e2) == 0 && f->sb.file_size == f->size;
    if (!ok2) {
        snprintf(msg, sizeof msg, "primary superblock: %s; backup superblock: %s", e1.msg,
                 have_back ? (e2.msg[0] ? e2.msg : "describes a different file size") : "unreadable");
        return fail(err, e1.code == KPK_ECHECKSUM ? KPK_ECHECKSUM : KPK_EFORMAT, f, msg);
    }
    snprintf(f->warning, sizeof f->warning, "primary superblock damaged (%s); opened with the backup copy", e1.msg);
    return 0;
}

/* Read a directory section after checking its bounds; verify its hash. */
static int read_section(kpk_file *f, uint64_t off, uint64_t len, uint64_t want, const char *what, void **out,
                        uint64_t dir_start, kpk_err *err)
{
    char msg[300];
    uint8_t *buf;
    *out = NULL;
    if (off % KPK_SECTION_ALIGN || off < dir_start || !fits(off, len, f->size - KPK_SUPERBLOCK_SIZE) ||
        len > ((uint64_t)1 << 34)) {
        snprintf(msg, sizeof msg, "%s (offset %llu, %llu bytes) lies outside the directory area", what,
                 (unsigned long long)off, (unsigned long long)len);
        return fail(err, KPK_EFORMAT, f, msg);
    }
    buf = malloc(len + 1);
    if (!buf) return fail(err, KPK_ENOMEM, f, "out of memory reading the directory");
    if (len && kio_pread_full(f->fd, buf, len, off)) {
        free(buf);
        return fail(err, KPK_EIO, f, strerror(errno));
    }
    buf[len] = 0;
    if (XXH3_64bits(buf, len) != want) {
        free(buf);
        snprintf(msg, sizeof msg, "%s checksum mismatch", what);
        return fail(err, KPK_ECHECKSUM, f, msg);
    }
    *out = buf;
    return 0;
}

static int check_extents(kpk_file *f, kpk_err *err)
{
    const kpk_superblock *sb = &f->sb;
    uint64_t prev_end = sb->align; /* [0, align) holds the superblock */
    uint64_t next_tensor = 0, data_bytes = 0;
    uint32_t max_layer = 0, max_expert = 0;
    int any_layer = 0, any_expert = 0;
    char msg[400], what[64];

    f->meta = f->globals = -1;
    for (uint64_t i = 0; i < sb->extent_count; i++) {
        const kpk_extent *x = &f->extents[i];
        kpk_extent_describe(x, what, sizeof what);
#define BAD(...) do { snprintf(msg, sizeof msg, __VA_ARGS__); return fail(err, KPK_EFORMAT, f, msg); } while (0)
        if (x->kind < KPK_KIND_META || x->kind > KPK_KIND_EXPERT) BAD("extent %llu has unknown kind %u", (unsigned long long)i, x->kind);
        if (x->codec > KPK_CODEC_ZSTD) BAD("extent %llu (%s) uses unknown codec %u", (unsigned long long)i, what, x->codec);
        if (x->codec != KPK_CODEC_NONE && !(sb->incompat & KPK_INCOMPAT_CODECS))
            BAD("extent %llu (%s) is compressed but the superblock does not declare codecs", (unsigned long long)i, what);
        if (x->member != 0) BAD("extent %llu (%s) is in member file %u; this file has one member", (unsigned long long)i, what, x->member);
        if (x->offset % sb->align) BAD("extent %llu (%s) offset %llu is not aligned to %u", (unsigned long long)i, what,
                                       (unsigned long long)x->offset, sb->align);
        if (x->offset < prev_end) BAD("extent %llu (%s) overlaps the previous extent or the superblock", (unsigned long long)i, what);
        if (!fits(x->offset, kpk_round_up(x->stored_len, sb->align), sb->extent_table_off) || x->stored_len > sb->file_size)
            BAD("extent %llu (%s) runs past the start of the directory (truncated file?)", (unsigned long long)i, what);
        if (x->codec == KPK_CODEC_NONE && (x->raw_len != x->stored_len || x->raw_xxh3 != x->stored_xxh3))
            BAD("extent %llu (%s): uncompressed but raw and stored sizes or hashes differ", (unsigned long long)i, what);
        if (x->raw_len > ((uint64_t)1 << 40)) BAD("extent %llu (%s): implausible decoded size", (unsigned long long)i, what);
        if (x->first_tensor != next_tensor || !fits(x->first_tensor, x->tensor_count, sb->tensor_count))
            BAD("extent %llu (%s): its tensor range does not follow the previous extent's", (unsigned long long)i, what);
        next_tensor += x->tensor_count;
        prev_end = x->offset + kpk_round_up(x->stored_len, sb->align);
        data_bytes += x->stored_len;
        switch (x->kind) {
        case KPK_KIND_META:
        case KPK_KIND_GLOBALS:
            if (x->layer != KPK_NONE || x->expert != KPK_NONE) BAD("extent %llu (%s) carries a layer/expert number", (unsigned long long)i, what);
            if ((x->kind == KPK_KIND_META ? f->meta : f->globals) >= 0) BAD("two %s extents", what);
            if (x->kind == KPK_KIND_META) f->meta = (int64_t)i; else f->globals = (int64_t)i;
            break;
        case KPK_KIND_TRUNK:
            if (x->layer >= KPK_MAX_LAYERS || x->expert != KPK_NONE) BAD("extent %llu: bad trunk layer number", (unsigned long long)i);
            break;
        case KPK_KIND_EXPERT:
            if (x->layer >= KPK_MAX_LAYERS || x->expert >= KPK_MAX_EXPERTS) BAD("extent %llu: bad expert numbers", (unsigned long long)i);
            if (x->expert + 1 > max_expert) max_expert = x->expert + 1;
            any_expert = 1;
            break;
        }
        if (x->kind == KPK_KIND_TRUNK || x->kind == KPK_KIND_EXPERT) {
            if (x->layer + 1 > max_layer) max_layer = x->layer + 1;
            any_layer = 1;
        }
    }
    if (next_tensor != sb->tensor_count) BAD("the extents cover %llu tensors, the table has %llu",
                                             (unsigned long long)next_tensor, (unsigned long long)sb->tensor_count);
    if (data_bytes != sb->data_bytes) BAD("extent sizes add up to %llu bytes, the superblock says %llu",
                                          (unsigned long long)data_bytes, (unsigned long long)sb->data_bytes);
    f->n_layers = any_layer ? max_layer : 0;
    f->n_experts = any_expert ? max_expert : 0;
    if ((uint64_t)f->n_layers * f->n_experts > ((uint64_t)1 << 24)) BAD("implausible expert numbering (%u layers x %u experts)", f->n_layers, f->n_experts);
    f->trunk = malloc(sizeof *f->trunk * (f->n_layers ? f->n_layers : 1));
    f->expert = malloc(sizeof *f->expert * ((uint64_t)f->n_layers * f->n_experts + 1));
    if (!f->trunk || !f->expert) return fail(err, KPK_ENOMEM, f, "out of memory");
    for (uint32_t L = 0; L < f->n_layers; L++) f->trunk[L] = -1;
    for (uint64_t j = 0; j < (uint64_t)f->n_layers * f->n_experts; j++) f->expert[j] = -1;
    for (uint64_t i = 0; i < sb->extent_count; i++) {
        const kpk_extent *x = &f->extents[i];
        int64_t *slot = x->kind == KPK_KIND_TRUNK ? &f->trunk[x->layer]
                      : x->kind == KPK_KIND_EXPERT ? &f->expert[(uint64_t)x->layer * f->n_experts + x->expert] : NULL;
        if (!slot) continue;
        kpk_extent_describe(x, what, sizeof what);
        if (*slot >= 0) BAD("%s appears twice in the extent table", what);
        *slot = (int64_t)i;
    }
#undef BAD
    return 0;
}

static int check_tensors(kpk_file *f, kpk_err *err)
{
    const kpk_superblock *sb = &f->sb;
    char msg[400];
    uint64_t nslots = 16;
    while (nslots < sb->tensor_count * 2) nslots <<= 1;
    f->name_hash = calloc(nslots, sizeof *f->name_hash);
    if (!f->name_hash) return fail(err, KPK_ENOMEM, f, "out of memory");
    f->name_hash_mask = nslots - 1;

    for (uint64_t e = 0; e < sb->extent_count; e++) {
        const kpk_extent *x = &f->extents[e];
        uint64_t end = 0;
        for (uint64_t i = x->first_tensor; i < (uint64_t)x->first_tensor + x->tensor_count; i++) {
            kpk_tensor t;
            uint32_t name_off;
            uint64_t n = 1, esz;
            kpk_tensor_decode(f->tensor_records + i * KPK_TENSOR_RECORD_SIZE, &t, &name_off);
#define BAD(...) do { snprintf(msg, sizeof msg, __VA_ARGS__); return fail(err, KPK_EFORMAT, f, msg); } while (0)
            if (!fits(name_off, (uint64_t)t.name_len + 1, sb->strings_len) || t.name_len == 0 ||
                f->strings[name_off + t.name_len] != 0 || memchr(f->strings + name_off, 0, t.name_len))
                BAD("tensor %llu: name outside the string pool", (unsigned long long)i);
            t.name = f->strings + name_off;
            if (t.extent != e) BAD("tensor %s: listed under extent %llu but claims extent %u", t.name, (unsigned long long)e, t.extent);
            esz = kpk_dtype_size(t.dtype);
            if (!esz) BAD("tensor %s: unknown dtype %u", t.name, t.dtype);
            if (t.ndim < 1 || t.ndim > 4) BAD("tensor %s: %u dimensions", t.name, t.ndim);
            for (int d = 0; d < 4; d++) {
                if (d >= t.ndim) {
                    if (t.shape[d]) BAD("tensor %s: unused dimension %d is not zero", t.name, d);
                    continue;
                }
                if (t.shape[d] && n > UINT64_MAX / t.shape[d]) BAD("tensor %s: shape overflows", t.name);
                n *= t.shape[d];
            }
            if (n > UINT64_MAX / esz || n * esz != t.nbytes) BAD("tensor %s: %llu bytes do not match its shape and dtype", t.name, (unsigned long long)t.nbytes);
            if (t.offset % KPK_TENSOR_ALIGN || t.offset < end || !fits(t.offset, t.nbytes, x->raw_len))
                BAD("tensor %s: offset %llu + %llu bytes is unaligned, overlapping or outside its extent", t.name,
                    (unsigned long long)t.offset, (unsigned long long)t.nbytes);
            end = t.offset + t.nbytes;
#undef BAD
            {
                uint64_t h = name_hash(t.name, t.name_len) & f->name_hash_mask;
                while (f->name_hash[h]) {
                    kpk_tensor o;
                    kpk_tensor_at(f, f->name_hash[h] - 1, &o);
                    if (o.name_len == t.name_len && memcmp(o.name, t.name, t.name_len) == 0) {
                        snprintf(msg, sizeof msg, "tensor %s appears twice", t.name);
                        return fail(err, KPK_EFORMAT, f, msg);
                    }
                    h = (h + 1) & f->name_hash_mask;
                }
                f->name_hash[h] = (uint32_t)(i + 1);
            }
        }
    }
    return 0;
}

int kpk_open(const char *path, kpk_file **out, kpk_err *err)
{
    kpk_file *f = calloc(1, sizeof *f);
    const kpk_superblock *sb;
    uint64_t dir_start;
    int64_t sz;
    char msg[300];
    void *p;

    *out = NULL;
    if (!f) { kpk_err_set(err, KPK_ENOMEM, "%s: out of memory", path); return -1; }
    f->fd = -1;
    f->path = strdup(path);
    if (!f->path) { kpk_err_set(err, KPK_ENOMEM, "%s: out of memory", path); goto bad; }
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0 || (sz = kio_file_size(f->fd)) < 0) {
        kpk_err_set(err, KPK_EIO, "%s: %s", path, strerror(errno));
        goto bad;
    }
    f->size = (uint64_t)sz;
    if (read_superblocks(f, err)) goto bad;
    sb = &f->sb;
    if (sb->member_count != 1 || sb->member_index != 0) {
        fail(err, KPK_EVERSION, f, "this is one member of a multi-file stripe set, which this reader does not support");
        goto bad;
    }
    /* The directory follows the last extent; its first section is the extent table. */
    dir_start = sb->extent_table_off;
    if (dir_start < sb->align || dir_start % KPK_SECTION_ALIGN) {
        fail(err, KPK_EFORMAT, f, "extent table offset is invalid");
        goto bad;
    }
    if (sb->extent_count > (1u << 24) || sb->tensor_count > (1u << 26)) {
        snprintf(msg, sizeof msg, "implausible table sizes (%llu extents, %llu tensors)",
                 (unsigned long long)sb->extent_count, (unsigned long long)sb->tensor_count);
        fail(err, KPK_EFORMAT, f, msg);
        goto bad;
    }
    if (read_section(f, sb->extent_table_off, sb->extent_count * KPK_EXTENT_RECORD_SIZE, sb->extent_table_xxh3,
                     "extent table", &p, dir_start, err)) goto bad;
    f->extents = malloc(sizeof *f->extents * (sb->extent_count ? sb->extent_count : 1));
    if (!f->extents) { free(p); fail(err, KPK_ENOMEM, f, "out of memory"); goto bad; }
    for (uint64_t i = 0; i < sb->extent_count; i++)
        kpk_extent_decode((uint8_t *)p + i * KPK_EXTENT_RECORD_SIZE, &f->extents[i]);
    free(p);
    if (read_section(f, sb->tensor_table_off, sb->tensor_count * KPK_TENSOR_RECORD_SIZE, sb->tensor_table_xxh3,
                     "tensor table", &p, dir_start, err)) goto bad;
    f->tensor_records = p;
    if (read_section(f, sb->strings_off, sb->strings_len, sb->strings_xxh3, "string pool", &p, dir_start, err)) goto bad;
    f->strings = p;
    if (read_section(f, sb->manifest_off, sb->manifest_len, sb->manifest_xxh3, "manifest", &p, dir_start, err)) goto bad;
    f->manifest = p;
    /* sections are in order and do not overlap */
    if (sb->tensor_table_off < sb->extent_table_off + sb->extent_count * KPK_EXTENT_RECORD_SIZE ||
        sb->strings_off < sb->tensor_table_off + sb->tensor_count * KPK_TENSOR_RECORD_SIZE ||
        sb->manifest_off < sb->strings_off + sb->strings_len) {
        fail(err, KPK_EFORMAT, f, "directory sections overlap or are out of order");
        goto bad;
    }
    if (check_extents(f, err) || check_tensors(f, err)) goto bad;
    *out = f;
    return 0;
bad:
    kpk_close(f);
    return -1;
}

void kpk_close(kpk_file *f)
{
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    free(f->path);
    free(f->extents);
    free(f->tensor_records);
    free(f->strings);
    free(f->manifest);
    free(f->trunk);
    free(f->expert);
    free(f->name_hash);
    free(f);
}

/* ---- extents --------------------------------------------------------------- */

static int extent_err(kpk_err *err, int code, const kpk_file *f, uint32_t i, const char *what)
{
    char d[64];
    kpk_extent_describe(&f->extents[i], d, sizeof d);
    kpk_err_set(err, code, "%s: %s (extent %u at offset %llu): %s", f->path, d, i,
                (unsigned long long)f->extents[i].offset, what);
    return -1;
}

int kpk_extent_check(const kpk_file *f, uint32_t i, const void *stored, kpk_err *err)
{
    const kpk_extent *x = &f->extents[i];
    if (XXH3_64bits(stored, x->stored_len) != x->stored_xxh3)
        return extent_err(err, KPK_ECHECKSUM, f, i, "checksum mismatch");
    return 0;
}

int kpk_extent_decode_into(const kpk_file *f, uint32_t i, const void *stored, void *raw, kpk_err *err)
{
    const kpk_extent *x = &f->extents[i];
    if (x->codec == KPK_CODEC_NONE) {
        if (raw != stored) memcpy(raw, stored, x->stored_len);
        return 0;
    }
    {
        size_t r = ZSTD_decompress(raw, x->raw_len, stored, x->stored_len);
        if (ZSTD_isError(r)) return extent_err(err, KPK_ECHECKSUM, f, i, ZSTD_getErrorName(r));
        if (r != x->raw_len) return extent_err(err, KPK_EFORMAT, f, i, "decoded size differs from the table");
        if (XXH3_64bits(raw, x->raw_len) != x->raw_xxh3) return extent_err(err, KPK_ECHECKSUM, f, i, "decoded checksum mismatch");
    }
    return 0;
}

int kpk_extent_read(const kpk_file *f, uint32_t i, void *buf, int verify, kpk_err *err)
{
    const kpk_extent *x;
    void *stored;
    int rc;
    if (i >= f->sb.extent_count) { kpk_err_set(err, KPK_EINVAL, "%s: no extent %u", f->path, i); return -1; }
    x = &f->extents[i];
    stored = x->codec == KPK_CODEC_NONE ? buf : malloc(x->stored_len ? x->stored_len : 1);
    if (!stored) return extent_err(err, KPK_ENOMEM, f, i, "out of memory");
    if (kio_pread_full(f->fd, stored, x->stored_len, x->offset)) {
        rc = extent_err(err, KPK_EIO, f, i, strerror(errno));
    } else if (verify && kpk_extent_check(f, i, stored, err)) {
        rc = -1;
    } else {
        rc = kpk_extent_decode_into(f, i, stored, buf, err);
    }
    if (stored != buf) free(stored);
    return rc;
}

/* XXH3 of n zero bytes, remembered per length: a sparse file (all-zero
 * extents left as holes) repeats a few lengths many thousand times. */
static pthread_mutex_t zero_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { uint64_t len, hash; } zero_memo[16];
static size_t zero_n;

static int zero_hash(uint64_t n, void *scratch, size_t scratch_len, uint64_t *out)
{
    XXH3_state_t *st;
    pthread_mutex_lock(&zero_mu);
    for (size_t k = 0; k < zero_n; k++)
        if (zero_memo[k].len == n) { *out = zero_memo[k].hash; pthread_mutex_unlock(&zero_mu); return 0; }
    pthread_mutex_unlock(&zero_mu);
    if (!(st = XXH3_createState())) return -1;
    XXH3_64bits_reset(st);
    memset(scratch, 0, scratch_len);
    for (uint64_t pos = 0; pos < n; pos += scratch_len)
        XXH3_64bits_update(st, scratch, n - pos < scratch_len ? (size_t)(n - pos) : scratch_len);
    *out = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    pthread_mutex_lock(&zero_mu);
    if (zero_n < sizeof zero_memo / sizeof zero_memo[0]) { zero_memo[zero_n].len = n; zero_memo[zero_n].hash = *out; zero_n++; }
    pthread_mutex_unlock(&zero_mu);
    return 0;
}

int kpk_extent_verify(const kpk_file *f, uint32_t i, void *scratch, size_t scratch_len, kpk_err *err)
{
    const kpk_extent *x;
    XXH3_state_t *st;
    uint64_t pos, end, padded;
    int rc = 0;
    if (i >= f->sb.extent_count) { kpk_err_set(err, KPK_EINVAL, "%s: no extent %u", f->path, i); return -1; }
    x = &f->extents[i];
    padded = kpk_round_up(x->stored_len, f->sb.align);
    if (x->codec != KPK_CODEC_NONE) {
        /* compressed extents are small enough to decode whole */
        void *raw = malloc(x->raw_len ? x->raw_len : 1);
        if (!raw) return extent_err(err, KPK_ENOMEM, f, i, "out of memory");
        rc = kpk_extent_read(f, i, raw, 1, err);
        free(raw);
        if (rc) return rc;
    }
    end = x->offset + padded;
    {
        /* an extent that is one hole (data and padding) reads as zeros: its
         * hash depends on its length only */
        off_t d = lseek(f->fd, (off_t)x->offset, SEEK_DATA);
        if (x->codec == KPK_CODEC_NONE && ((d < 0 && errno == ENXIO) || (d >= 0 && (uint64_t)d >= end))) {
            uint64_t h;
            if (zero_hash(x->stored_len, scratch, scratch_len, &h)) return extent_err(err, KPK_ENOMEM, f, i, "out of memory");
            return h == x->stored_xxh3 ? 0 : extent_err(err, KPK_ECHECKSUM, f, i, "checksum mismatch");
        }
    }
    st = XXH3_createState();
    if (!st) return extent_err(err, KPK_ENOMEM, f, i, "out of memory");
    XXH3_64bits_reset(st);
    for (pos = x->offset; pos < end;) {
        size_t n = scratch_len < end - pos ? scratch_len : (size_t)(end - pos);
        uint64_t data_end = x->offset + x->stored_len;
        if (kio_pread_full(f->fd, scratch, n, pos)) { rc = extent_err(err, KPK_EIO, f, i, strerror(errno)); break; }
        /* a check reads each byte once: keep the page cache for what is used again */
        posix_fadvise(f->fd, (off_t)pos, (off_t)n, POSIX_FADV_DONTNEED);
        if (pos < data_end) {
            size_t d = data_end - pos < n ? (size_t)(data_end - pos) : n;
            XXH3_64bits_update(st, scratch, d);
            if (d < n && !kio_is_zero((uint8_t *)scratch + d, n - d)) { rc = extent_err(err, KPK_ECHECKSUM, f, i, "non-zero padding after the extent"); break; }
        } else if (!kio_is_zero(scratch, n)) {
            rc = extent_err(err, KPK_ECHECKSUM, f, i, "non-zero padding after the extent");
            break;
        }
        pos += n;
    }
    if (!rc && XXH3_64bits_digest(st) != x->stored_xxh3) rc = extent_err(err, KPK_ECHECKSUM, f, i, "checksum mismatch");
    XXH3_freeState(st);
    return rc;
}

int kpk_meta_file(const kpk_file *f, const char *name, char **out, size_t *len, kpk_err *err)
{
    char full[256];
    kpk_tensor t;
    char *buf;
    snprintf(full, sizeof full, KPK_META_PREFIX "%s", name);
    *out = NULL;
    if (kpk_find_tensor(f, full, &t) < 0 || f->extents[t.extent].kind != KPK_KIND_META) {
        kpk_err_set(err, KPK_EINVAL, "%s: no embedded file %s", f->path, name);
        return -1;
    }
    {
        const kpk_extent *x = &f->extents[t.extent];
        uint8_t *raw = malloc(x->raw_len + 1);
        if (!raw) { kpk_err_set(err, KPK_ENOMEM, "%s: out of memory", f->path); return -1; }
        if (kpk_extent_read(f, t.extent, raw, 1, err)) { free(raw); return -1; }
        buf = malloc(t.nbytes + 1);
        if (!buf) { free(raw); kpk_err_set(err, KPK_ENOMEM, "%s: out of memory", f->path); return -1; }
        memcpy(buf, raw + t.offset, t.nbytes);
        buf[t.nbytes] = 0;
        free(raw);
    }
    *out = buf;
    *len = t.nbytes;
    return 0;
}
