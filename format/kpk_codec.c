/* Little-endian encoding of the KPK records (docs/FORMAT.md §3-§5, §7.2,
 * §8.1).  Byte offsets here are the normative ones; keep them in step with
 * the document. */
#include "kpk.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

uint64_t kpk_xxh3(const void *p, size_t n) { return XXH3_64bits(p, n); }

void kpk_err_set(kpk_err *e, int code, const char *fmt, ...)
{
    va_list ap;
    if (!e) return;
    e->code = code;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
}

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

/* Non-zero bytes in [a, b) of a record. */
static int nonzero(const uint8_t *p, size_t a, size_t b)
{
    int n = 0;
    for (size_t i = a; i < b; i++) n += p[i] != 0;
    return n;
}

/* ---- superblock ---------------------------------------------------------- */

/* Reserved byte ranges of the superblock at minor 1 (§3). */
static const struct { uint16_t a, b; } sb_reserved[] = {{52, 56}, {206, 208}, {216, KPK_SB_CHECKSUM_OFF}};
/* Fields a 1.0 file (minor 0) had as reserved: 160..216. */
#define SB_V11_FIELDS_START 160
#define SB_V11_FIELDS_END 216

void kpk_superblock_encode(const kpk_superblock *sb, uint8_t out[KPK_SUPERBLOCK_SIZE])
{
    memset(out, 0, KPK_SUPERBLOCK_SIZE);
    memcpy(out, KPK_MAGIC, KPK_MAGIC_LEN);
    put16(out + 8, sb->major);
    put16(out + 10, sb->minor);
    put32(out + 12, KPK_SUPERBLOCK_SIZE);
    put32(out + 16, sb->incompat);
    put32(out + 20, sb->compat);
    put32(out + 24, sb->align);
    put32(out + 28, sb->order);
    put64(out + 32, sb->file_size);
    put64(out + 40, sb->set_id);
    put16(out + 48, sb->member_index);
    put16(out + 50, sb->member_count);
    put64(out + 56, sb->extent_table_off);
    put64(out + 64, sb->extent_count);
    put64(out + 72, sb->extent_table_xxh3);
    put64(out + 80, sb->tensor_table_off);
    put64(out + 88, sb->tensor_count);
    put64(out + 96, sb->tensor_table_xxh3);
    put64(out + 104, sb->strings_off);
    put64(out + 112, sb->strings_len);
    put64(out + 120, sb->strings_xxh3);
    put64(out + 128, sb->manifest_off);
    put64(out + 136, sb->manifest_len);
    put64(out + 144, sb->manifest_xxh3);
    put64(out + 152, sb->data_bytes);
    put64(out + 160, sb->member_table_off);
    put64(out + 168, sb->member_table_xxh3);
    put64(out + 176, sb->block_table_off);
    put64(out + 184, sb->block_count);
    put64(out + 192, sb->block_table_xxh3);
    put32(out + 200, sb->stripe_unit);
    put16(out + 204, sb->stripe_count);
    put64(out + 208, sb->stripe_len);
    put64(out + KPK_SB_CHECKSUM_OFF, XXH3_64bits(out, KPK_SB_CHECKSUM_OFF));
}

int kpk_superblock_decode(const uint8_t in[KPK_SUPERBLOCK_SIZE], kpk_superblock *sb, kpk_err *err)
{
    memset(sb, 0, sizeof *sb);
    if (memcmp(in, KPK_MAGIC, KPK_MAGIC_LEN) != 0) {
        kpk_err_set(err, KPK_ENOTKPK, "not a KPK file (bad magic number)");
        return -1;
    }
    /* The version comes before the checksum: another major version may lay
     * out (and checksum) its superblock differently. */
    sb->major = get16(in + 8);
    sb->minor = get16(in + 10);
    if (sb->major != KPK_VERSION_MAJOR) {
        kpk_err_set(err, KPK_EVERSION, "KPK format version %u.%u is not supported by this reader (it reads %u.x)",
                    sb->major, sb->minor, KPK_VERSION_MAJOR);
        return -1;
    }
    sb->superblock_xxh3 = get64(in + KPK_SB_CHECKSUM_OFF);
    if (sb->superblock_xxh3 != XXH3_64bits(in, KPK_SB_CHECKSUM_OFF)) {
        kpk_err_set(err, KPK_ECHECKSUM, "superblock checksum mismatch");
        return -1;
    }
    /* an unknown feature first (§3 step 6): the rest may mean something else to a newer reader */
    sb->incompat = get32(in + 16);
    sb->compat = get32(in + 20);
    if (sb->incompat & ~(uint32_t)KPK_INCOMPAT_KNOWN) {
        kpk_err_set(err, KPK_EVERSION, "unsupported: newer format (the file uses features this reader does not know: "
                    "incompat flags 0x%x)", sb->incompat & ~(uint32_t)KPK_INCOMPAT_KNOWN);
        return -1;
    }
    if (get32(in + 12) != KPK_SUPERBLOCK_SIZE) {
        kpk_err_set(err, KPK_EFORMAT, "superblock size %u, expected %u", get32(in + 12), KPK_SUPERBLOCK_SIZE);
        return -1;
    }
    /* the 1.1 features need a 1.1 file: a minor-0 file that claims one is not what it says */
    if (sb->minor == 0 && (sb->incompat & KPK_INCOMPAT_SINCE_1_1)) {
        kpk_err_set(err, KPK_EFORMAT, "superblock: a version 1.0 file (minor 0) with 1.1 feature bits (incompat 0x%x)",
                    sb->incompat & KPK_INCOMPAT_SINCE_1_1);
        return -1;
    }
    if (sb->minor < 2 && (sb->incompat & KPK_INCOMPAT_SINCE_1_2)) {
        kpk_err_set(err, KPK_EFORMAT, "superblock: a version 1.%u file with the 1.2 DRAFTER feature bit (incompat 0x%x)", sb->minor,
                    sb->incompat & KPK_INCOMPAT_SINCE_1_2);
        return -1;
    }
    sb->align = get32(in + 24);
    sb->order = get32(in + 28);
    sb->file_size = get64(in + 32);
    sb->set_id = get64(in + 40);
    sb->member_index = get16(in + 48);
    sb->member_count = get16(in + 50);
    sb->extent_table_off = get64(in + 56);
    sb->extent_count = get64(in + 64);
    sb->extent_table_xxh3 = get64(in + 72);
    sb->tensor_table_off = get64(in + 80);
    sb->tensor_count = get64(in + 88);
    sb->tensor_table_xxh3 = get64(in + 96);
    sb->strings_off = get64(in + 104);
    sb->strings_len = get64(in + 112);
    sb->strings_xxh3 = get64(in + 120);
    sb->manifest_off = get64(in + 128);
    sb->manifest_len = get64(in + 136);
    sb->manifest_xxh3 = get64(in + 144);
    sb->data_bytes = get64(in + 152);
    /* Reserved fields are known to be unused at or below our minor version
     * (a 1.0 file's 160..216 included); a later minor may use them. */
    if (sb->minor <= KPK_VERSION_MINOR) {
        for (size_t k = 0; k < sizeof sb_reserved / sizeof sb_reserved[0]; k++)
            if (nonzero(in, sb_reserved[k].a, sb_reserved[k].b)) {
                kpk_err_set(err, KPK_EFORMAT, "superblock: reserved bytes %u..%u are not zero",
                            sb_reserved[k].a, sb_reserved[k].b - 1);
                return -1;
            }
        if (sb->minor == 0 && nonzero(in, SB_V11_FIELDS_START, SB_V11_FIELDS_END)) {
            kpk_err_set(err, KPK_EFORMAT, "superblock: a version 1.0 file has non-zero bytes in its reserved area 160..215");
            return -1;
        }
    }
    if (sb->minor >= 1) {
        sb->member_table_off = get64(in + 160);
        sb->member_table_xxh3 = get64(in + 168);
        sb->block_table_off = get64(in + 176);
        sb->block_count = get64(in + 184);
        sb->block_table_xxh3 = get64(in + 192);
        sb->stripe_unit = get32(in + 200);
        sb->stripe_count = get16(in + 204);
        sb->stripe_len = get64(in + 208);
    }
    if (sb->align < KPK_ALIGN_MIN || sb->align > KPK_ALIGN_MAX || (sb->align & (sb->align - 1))) {
        kpk_err_set(err, KPK_EFORMAT, "superblock: alignment %u is not a power of two in 4096..2 MiB", sb->align);
        return -1;
    }
    if (sb->order > KPK_ORDER_TRUNK_FIRST) {
        kpk_err_set(err, KPK_EFORMAT, "superblock: unknown extent order %u", sb->order);
        return -1;
    }
    if (sb->member_count == 0 || sb->member_index >= sb->member_count || sb->member_count > KPK_MAX_MEMBERS) {
        kpk_err_set(err, KPK_EFORMAT, "superblock: member %u of %u (at most %u members)", sb->member_index,
                    sb->member_count, KPK_MAX_MEMBERS);
        return -1;
    }
    if ((sb->member_count > 1) != !!(sb->incompat & KPK_INCOMPAT_MEMBERS)) {
        kpk_err_set(err, KPK_EFORMAT, "superblock: %u member files but the MEMBERS feature bit is %s",
                    sb->member_count, sb->incompat & KPK_INCOMPAT_MEMBERS ? "set" : "not set");
        return -1;
    }
    {
        int nz = (sb->stripe_unit != 0) + (sb->stripe_count != 0) + (sb->stripe_len != 0);
        if (nz != 0 && nz != 3) {
            kpk_err_set(err, KPK_EFORMAT, "superblock: stripe unit %u, count %u and length %llu must be all zero or all set",
                        sb->stripe_unit, sb->stripe_count, (unsigned long long)sb->stripe_len);
            return -1;
        }
        if (nz && !(sb->incompat & KPK_INCOMPAT_MEMBERS)) {
            kpk_err_set(err, KPK_EFORMAT, "superblock: a stripe space without the MEMBERS feature bit");
            return -1;
        }
    }
    return 0;
}

/* ---- extent and tensor records ------------------------------------------ */

void kpk_extent_encode(const kpk_extent *x, uint8_t out[KPK_EXTENT_RECORD_SIZE])
{
    memset(out, 0, KPK_EXTENT_RECORD_SIZE);
    out[0] = x->kind;
    out[1] = x->codec;
    put16(out + 2, x->member);
    put32(out + 4, x->layer);
    put32(out + 8, x->expert);
    put32(out + 12, x->first_block);
    put64(out + 16, x->offset);
    put64(out + 24, x->stored_len);
    put64(out + 32, x->raw_len);
    put64(out + 40, x->stored_xxh3);
    put64(out + 48, x->raw_xxh3);
    put32(out + 56, x->first_tensor);
    put32(out + 60, x->tensor_count);
}

int kpk_extent_decode(const uint8_t in[KPK_EXTENT_RECORD_SIZE], kpk_extent *x)
{
    x->kind = in[0];
    x->codec = in[1];
    x->member = get16(in + 2);
    x->layer = get32(in + 4);
    x->expert = get32(in + 8);
    x->first_block = get32(in + 12);
    x->offset = get64(in + 16);
    x->stored_len = get64(in + 24);
    x->raw_len = get64(in + 32);
    x->stored_xxh3 = get64(in + 40);
    x->raw_xxh3 = get64(in + 48);
    x->first_tensor = get32(in + 56);
    x->tensor_count = get32(in + 60);
    return 0; /* no reserved bytes at 1.1 */
}

void kpk_tensor_encode(const kpk_tensor *t, uint32_t name_off, uint8_t out[KPK_TENSOR_RECORD_SIZE])
{
    memset(out, 0, KPK_TENSOR_RECORD_SIZE);
    put32(out + 0, name_off);
    put32(out + 4, t->name_len);
    out[8] = t->dtype;
    out[9] = t->ndim;
    put32(out + 12, t->extent);
    put64(out + 16, t->offset);
    put64(out + 24, t->nbytes);
    for (int i = 0; i < 4; i++) put64(out + 32 + 8 * i, t->shape[i]);
}

int kpk_tensor_decode(const uint8_t in[KPK_TENSOR_RECORD_SIZE], kpk_tensor *t, uint32_t *name_off)
{
    *name_off = get32(in + 0);
    t->name = NULL;
    t->name_len = get32(in + 4);
    t->dtype = in[8];
    t->ndim = in[9];
    t->extent = get32(in + 12);
    t->offset = get64(in + 16);
    t->nbytes = get64(in + 24);
    for (int i = 0; i < 4; i++) t->shape[i] = get64(in + 32 + 8 * i);
    return nonzero(in, 10, 12);
}

/* ---- block and member records (1.1) ---------------------------------------- */

void kpk_block_encode(const kpk_block *b, uint8_t out[KPK_BLOCK_RECORD_SIZE])
{
    memset(out, 0, KPK_BLOCK_RECORD_SIZE);
    put64(out + 0, b->raw_off);
    put64(out + 8, b->stored_off);
    put32(out + 16, b->raw_len);
    put32(out + 20, b->stored_len);
    out[24] = b->method;
    out[25] = b->planes;
    put32(out + 28, b->plane0_len);
    put64(out + 32, b->raw_xxh3);
}

int kpk_block_decode_record(const uint8_t in[KPK_BLOCK_RECORD_SIZE], kpk_block *b)
{
    b->raw_off = get64(in + 0);
    b->stored_off = get64(in + 8);
    b->raw_len = get32(in + 16);
    b->stored_len = get32(in + 20);
    b->method = in[24];
    b->planes = in[25];
    b->plane0_len = get32(in + 28);
    b->raw_xxh3 = get64(in + 32);
    return nonzero(in, 26, 28) + nonzero(in, 40, 48);
}

void kpk_member_encode(const kpk_member *m, uint8_t out[KPK_MEMBER_RECORD_SIZE])
{
    memset(out, 0, KPK_MEMBER_RECORD_SIZE);
    put16(out + 0, m->index);
    out[2] = m->role;
    put16(out + 4, m->stripe_index);
    put64(out + 8, m->file_size);
    put64(out + 16, m->superblock_xxh3);
    put32(out + 24, m->path_off);
    put32(out + 28, m->path_len);
}

int kpk_member_decode(const uint8_t in[KPK_MEMBER_RECORD_SIZE], kpk_member *m)
{
    m->index = get16(in + 0);
    m->role = in[2];
    m->stripe_index = get16(in + 4);
    m->file_size = get64(in + 8);
    m->superblock_xxh3 = get64(in + 16);
    m->path_off = get32(in + 24);
    m->path_len = get32(in + 28);
    return nonzero(in, 3, 4) + nonzero(in, 6, 8) + nonzero(in, 32, 64);
}

/* ---- names ---------------------------------------------------------------- */

/* names[v], or "?" for a value without a name */
static const char *name_of(const char *const *names, size_t n, int v)
{
    return v >= 0 && (size_t)v < n && names[v] ? names[v] : "?";
}
#define NAME_OF(table, v) name_of(table, sizeof table / sizeof table[0], v)

static const char *const dtype_names[] = {[KPK_DT_F32] = "F32", [KPK_DT_BF16] = "BF16", [KPK_DT_F16] = "F16",
                                          [KPK_DT_U8] = "U8", [KPK_DT_BYTES] = "BYTES"};
static const char *const kind_names[] = {[KPK_KIND_META] = "meta", [KPK_KIND_GLOBALS] = "globals", [KPK_KIND_TRUNK] = "trunk",
                                         [KPK_KIND_EXPERT] = "expert", [KPK_KIND_ARCHIVE] = "archive", [KPK_KIND_DRAFTER] = "drafter"};
static const char *const codec_names[] = {[KPK_CODEC_NONE] = "none", [KPK_CODEC_ZSTD] = "zstd", [KPK_CODEC_BLOCKS] = "blocks"};
static const char *const method_names[] = {[KPK_METHOD_RAW] = "raw", [KPK_METHOD_ZSTD] = "zstd", [KPK_METHOD_SPLIT2] = "split2"};
static const char *const role_names[] = {[KPK_ROLE_ENTRY] = "entry", [KPK_ROLE_PLAIN] = "plain", [KPK_ROLE_STRIPE] = "stripe"};

const char *kpk_dtype_name(int dt) { return NAME_OF(dtype_names, dt); }
const char *kpk_kind_name(int kind) { return NAME_OF(kind_names, kind); }
const char *kpk_codec_name(int codec) { return NAME_OF(codec_names, codec); }
const char *kpk_method_name(int method) { return NAME_OF(method_names, method); }
const char *kpk_role_name(int role) { return NAME_OF(role_names, role); }

uint64_t kpk_dtype_size(int dt)
{
    switch (dt) {
    case KPK_DT_F32: return 4;
    case KPK_DT_BF16: case KPK_DT_F16: return 2;
    case KPK_DT_U8: case KPK_DT_BYTES: return 1;
    default: return 0;
    }
}

void kpk_extent_describe(const kpk_extent *x, char *buf, size_t n)
{
    switch (x->kind) {
    case KPK_KIND_TRUNK: snprintf(buf, n, "layer %u trunk", x->layer); break;
    case KPK_KIND_EXPERT: snprintf(buf, n, "layer %u expert %u", x->layer, x->expert); break;
    case KPK_KIND_META: case KPK_KIND_GLOBALS: case KPK_KIND_ARCHIVE: snprintf(buf, n, "%s", kpk_kind_name(x->kind)); break;
    case KPK_KIND_DRAFTER: snprintf(buf, n, "drafter %s", x->layer == 0 ? "weights" : x->layer == 1 ? "embedding" : "part ?"); break;
    default: snprintf(buf, n, "extent of kind %u", x->kind); break;
    }
}
