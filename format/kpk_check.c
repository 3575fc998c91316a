/* The rules a reader checks on the directory (docs/FORMAT.md §4 extents,
 * §5 tensors and the string pool, §7.2-7.3 the member table and the stripe
 * geometry, §8.1 blocks).  Each failure names the record. */
#include "kpk_internal.h"

#include <stdlib.h>
#include <string.h>

#define V11 (f->sb.minor <= KPK_VERSION_MINOR) /* reserved fields known to be unused */

/* ---- values this reader does not know (§3 "Order of the checks") ------------ */

/* An enumerated value beyond the ones this version defines (a member role,
 * an extent kind or codec, a tensor dtype, a block method) means the file
 * needs a newer reader: "unsupported: newer format", whatever else looks
 * wrong, since a newer reader may give the rest another meaning.  So these
 * are checked, in every record, before any rule of the tables. */
int kpk_check_known_values(kpk_file *f, kpk_err *err)
{
    const kpk_superblock *sb = &f->sb;
    if (sb->member_count > 1)
        for (uint32_t m = 0; m < sb->member_count; m++)
            if (f->members[m].role > KPK_ROLE_STRIPE)
                return kpk_fail(err, KPK_EVERSION, f, "unsupported: newer format (member %u has role %u)", m, f->members[m].role);
    for (uint64_t i = 0; i < sb->extent_count; i++) {
        const kpk_extent *x = &f->extents[i];
        if (x->kind < KPK_KIND_META || x->kind > KPK_KIND_MAX)
            return kpk_extent_fail(err, KPK_EVERSION, f, (uint32_t)i, "unsupported: newer format (unknown kind %u)", x->kind);
        if (x->codec > KPK_CODEC_BLOCKS)
            return kpk_extent_fail(err, KPK_EVERSION, f, (uint32_t)i, "unsupported: newer format (unknown codec %u)", x->codec);
    }
    for (uint64_t i = 0; i < sb->tensor_count; i++) {
        kpk_tensor t;
        uint32_t name_off;
        kpk_tensor_decode(f->tensor_records + i * KPK_TENSOR_RECORD_SIZE, &t, &name_off);
        if (!kpk_dtype_size(t.dtype))
            return kpk_fail(err, KPK_EVERSION, f, "tensor %llu: unsupported: newer format (unknown dtype %u)",
                            (unsigned long long)i, t.dtype);
    }
    for (uint64_t b = 0; b < sb->block_count; b++)
        if (f->blocks[b].method > KPK_METHOD_SPLIT2)
            return kpk_fail(err, KPK_EVERSION, f, "block record %llu: unsupported: newer format (unknown method %u)",
                            (unsigned long long)b, f->blocks[b].method);
    return 0;
}

/* ---- member table and stripe geometry (§7.2, §7.3) ------------------------- */

int kpk_check_member_table(kpk_file *f, kpk_err *err)
{
    const kpk_superblock *sb = &f->sb;
    uint32_t n_stripe = 0;
    if (sb->member_count == 1) return 0; /* the synthesized record of a single file */
    if (f->member_reserved)
        return kpk_fail(err, KPK_EFORMAT, f, "member table record %u: reserved bytes are not zero", f->member_reserved - 1);
    f->stripe_member = malloc(sizeof *f->stripe_member * (sb->stripe_count ? sb->stripe_count : 1));
    if (!f->stripe_member) return kpk_fail(err, KPK_ENOMEM, f, "out of memory");
    for (uint32_t k = 0; k < sb->stripe_count; k++) f->stripe_member[k] = KPK_NO_STRIPE;
    for (uint32_t m = 0; m < sb->member_count; m++) {
        const kpk_member *r = &f->members[m];
        if (r->index != m) return kpk_fail(err, KPK_EFORMAT, f, "member table record %u has index %u", m, r->index);
        if ((m == 0) != (r->role == KPK_ROLE_ENTRY))
            return kpk_fail(err, KPK_EFORMAT, f, "member %u has role %s; the entry role belongs to member 0 only", m,
                            kpk_role_name(r->role));
        if (r->file_size % KPK_SUPERBLOCK_SIZE || r->file_size < (uint64_t)sb->align + KPK_SUPERBLOCK_SIZE)
            return kpk_fail(err, KPK_EFORMAT, f, "member %u: recorded size %llu is not a multiple of 4096 with room for "
                            "its superblocks", m, (unsigned long long)r->file_size);
        if (m == 0) {
            if (r->file_size != f->size || r->superblock_xxh3 != 0 || r->path_off != 0 || r->path_len != 0 ||
                r->stripe_index != KPK_NO_STRIPE)
                return kpk_fail(err, KPK_EFORMAT, f, "member table record 0 does not describe the entry file "
                                "(size %llu, the file has %llu)", (unsigned long long)r->file_size, (unsigned long long)f->size);
            continue;
        }
        if (r->role == KPK_ROLE_STRIPE) {
            if (r->stripe_index >= sb->stripe_count || f->stripe_member[r->stripe_index] != KPK_NO_STRIPE)
                return kpk_fail(err, KPK_EFORMAT, f, "member %u: stripe index %u is out of range (%u stripe members) or "
                                "taken twice", m, r->stripe_index, sb->stripe_count);
            f->stripe_member[r->stripe_index] = (uint16_t)m;
            n_stripe++;
        } else if (r->stripe_index != KPK_NO_STRIPE) {
            return kpk_fail(err, KPK_EFORMAT, f, "member %u is not a stripe member but has stripe index %u", m, r->stripe_index);
        }
    }
    if (n_stripe != sb->stripe_count)
        return kpk_fail(err, KPK_EFORMAT, f, "the superblock says %u stripe members, the member table has %u",
                        sb->stripe_count, n_stripe);
    if (sb->stripe_count) {
        uint64_t U = sb->stripe_unit, N = sb->stripe_count, L = sb->stripe_len;
        if (U & (U - 1) || U % sb->align || U > KPK_MAX_STRIPE_UNIT)
            return kpk_fail(err, KPK_EFORMAT, f, "stripe unit %llu is not a power of two, a multiple of the alignment %u "
                            "and at most 64 MiB", (unsigned long long)U, sb->align);
        if (L % (U * N))
            return kpk_fail(err, KPK_EFORMAT, f, "stripe length %llu is not a multiple of unit x members (%llu)",
                            (unsigned long long)L, (unsigned long long)(U * N));
        for (uint32_t k = 0; k < N; k++) {
            const kpk_member *r = &f->members[f->stripe_member[k]];
            if (r->file_size != sb->align + L / N + KPK_SUPERBLOCK_SIZE)
                return kpk_fail(err, KPK_EFORMAT, f, "stripe member %u: recorded size %llu, the stripe geometry implies %llu",
                                r->index, (unsigned long long)r->file_size,
                                (unsigned long long)(sb->align + L / N + KPK_SUPERBLOCK_SIZE));
        }
    }
    return 0;
}

/* ---- the string pool (§5): names in tensor order, then member paths ------- */

/* The string at off, len bytes plus its NUL, lies within the pool and holds no NUL. */
static int pool_string_ok(const kpk_file *f, uint64_t off, uint64_t len)
{
    return kpk_fits(off, len + 1, f->sb.strings_len) && f->strings[off + len] == 0 && !memchr(f->strings + off, 0, len);
}

/* A member path's components (between single '/') are neither empty nor ".";
 * ".." is allowed (a member on another mount point), and a backslash is an
 * ordinary byte of a name. */
static int member_path_canonical(const char *p)
{
    for (const char *c = p;;) {
        const char *e = strchr(c, '/');
        size_t n = e ? (size_t)(e - c) : strlen(c);
        if (n == 0 || (n == 1 && c[0] == '.')) return 0;
        if (!e) return 1;
        c = e + 1;
    }
}

int kpk_check_string_pool(kpk_file *f, kpk_err *err)
{
    const kpk_superblock *sb = &f->sb;
    uint64_t at = 0;
    for (uint64_t i = 0; i < sb->tensor_count; i++) {
        kpk_tensor t;
        uint32_t name_off;
        kpk_tensor_decode(f->tensor_records + i * KPK_TENSOR_RECORD_SIZE, &t, &name_off);
        if (t.name_len == 0 || t.name_len > KPK_MAX_NAME || !pool_string_ok(f, name_off, t.name_len))
            return kpk_fail(err, KPK_EFORMAT, f, "tensor %llu: its name (%u bytes at %u) is empty, longer than %u bytes, "
                            "or not a NUL-terminated string inside the string pool", (unsigned long long)i, t.name_len,
                            name_off, KPK_MAX_NAME);
        if (name_off != at)
            return kpk_fail(err, KPK_EFORMAT, f, "tensor %llu (%s): its name is at %u in the string pool, expected %llu "
                            "(the names follow one another in table order)", (unsigned long long)i, f->strings + name_off,
                            name_off, (unsigned long long)at);
        at += (uint64_t)t.name_len + 1;
    }
    for (uint32_t m = 1; m < sb->member_count; m++) {
        const kpk_member *r = &f->members[m];
        if (r->path_len == 0 || r->path_len > KPK_MAX_PATH || !pool_string_ok(f, r->path_off, r->path_len))
            return kpk_fail(err, KPK_EFORMAT, f, "member %u: its path (%u bytes at %u) is empty, longer than %u bytes, or "
                            "not a NUL-terminated string inside the string pool", m, r->path_len, r->path_off, KPK_MAX_PATH);
        if (r->path_off != at)
            return kpk_fail(err, KPK_EFORMAT, f, "member %u: its path is at %u in the string pool, expected %llu (the "
                            "member paths follow the names, in member order)", m, r->path_off, (unsigned long long)at);
        if (f->strings[r->path_off] == '/')
            return kpk_fail(err, KPK_EFORMAT, f, "member %u: path %s is absolute; member paths are relative to the entry "
                            "file's directory", m, f->strings + r->path_off);
        if (!member_path_canonical(f->strings + r->path_off))
            return kpk_fail(err, KPK_EFORMAT, f, "member %u: path %s has an empty or '.' component (a member path is "
                            "components joined by single '/', FORMAT.md §7.2)", m, f->strings + r->path_off);
        at += (uint64_t)r->path_len + 1;
    }
    if (at != sb->strings_len)
        return kpk_fail(err, KPK_EFORMAT, f, "the string pool has %llu bytes, its names and paths take %llu",
                        (unsigned long long)sb->strings_len, (unsigned long long)at);
    return 0;
}

/* ---- extents (§4) ------------------------------------------------------------ */

static int cmp_expert_key(const void *a, const void *b)
{
    const struct kpk_expert_key *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return (x->expert > y->expert) - (x->expert < y->expert);
}

/* The end of the data area of a target, and where its extents may start. */
static void target_area(const kpk_file *f, uint16_t member, uint64_t *lo, uint64_t *hi)
{
    if (member == KPK_STRIPED) { *lo = 0; *hi = f->sb.stripe_len; return; }
    *lo = f->sb.align;
    *hi = member == 0 ? f->sb.extent_table_off : f->members[member].file_size - KPK_SUPERBLOCK_SIZE;
}

int kpk_check_extents(kpk_file *f, kpk_err *err)
{
    const kpk_superblock *sb = &f->sb;
    const uint64_t A = sb->align;
    uint64_t next_tensor = 0, next_block = 0, data_bytes = 0, *target_end;
    uint32_t max_layer = 0, max_expert = 0, n_expert = 0;
    int any_layer = 0, any_expert = 0, uses[4] = {0};
    const int drafter_file = (sb->incompat & KPK_INCOMPAT_DRAFTER) != 0;
    /* per target, the end of the previous extent: members, then the stripe space */
    target_end = malloc(sizeof *target_end * ((size_t)sb->member_count + 1));
    if (!target_end) return kpk_fail(err, KPK_ENOMEM, f, "out of memory");
    for (uint32_t m = 0; m <= sb->member_count; m++) target_end[m] = m < sb->member_count ? A : 0;

#define BAD(code, ...) do { kpk_extent_fail(err, code, f, (uint32_t)i, __VA_ARGS__); free(target_end); return -1; } while (0)
    for (uint64_t i = 0; i < sb->extent_count; i++) {
        const kpk_extent *x = &f->extents[i];
        uint64_t lo, hi, padded, *end;
        if (x->codec == KPK_CODEC_ZSTD && !(sb->incompat & KPK_INCOMPAT_CODECS)) BAD(KPK_EFORMAT, "codec 1 without the CODECS feature bit");
        if (x->codec == KPK_CODEC_BLOCKS && !(sb->incompat & KPK_INCOMPAT_BLOCKS)) BAD(KPK_EFORMAT, "codec 2 without the BLOCKS feature bit");
        if (x->kind == KPK_KIND_ARCHIVE && !(sb->incompat & KPK_INCOMPAT_ARCHIVE)) BAD(KPK_EFORMAT, "an archive extent without the ARCHIVE feature bit");
        if (x->codec == KPK_CODEC_ZSTD) uses[0] = 1;
        if (x->codec == KPK_CODEC_BLOCKS) uses[1] = 1;
        if (x->kind == KPK_KIND_ARCHIVE) uses[2] = 1;
        if (x->kind == KPK_KIND_DRAFTER) uses[3] = 1;
        /* 1.2: a drafter file holds a drafter and nothing of a target model (§15) */
        if (drafter_file && (x->kind == KPK_KIND_GLOBALS || x->kind == KPK_KIND_TRUNK || x->kind == KPK_KIND_EXPERT))
            BAD(KPK_EFORMAT, "a %s extent in a drafter file (DRAFTER feature bit)", kpk_kind_name(x->kind));
        if (x->kind == KPK_KIND_DRAFTER && !drafter_file) BAD(KPK_EFORMAT, "a drafter extent without the DRAFTER feature bit");
        /* where: a member holding extents, or the stripe space */
        if (x->member == KPK_STRIPED) {
            if (!sb->stripe_count) BAD(KPK_EFORMAT, "striped, but the file has no stripe members");
            end = &target_end[sb->member_count];
        } else {
            if (x->member >= sb->member_count) BAD(KPK_EFORMAT, "in member %u; the file has %u", x->member, sb->member_count);
            if (f->members[x->member].role == KPK_ROLE_STRIPE) BAD(KPK_EFORMAT, "placed in member %u, a stripe member", x->member);
            end = &target_end[x->member];
        }
        target_area(f, x->member, &lo, &hi);
        padded = kpk_round_up(x->stored_len, A);
        if (x->stored_len > hi) BAD(KPK_EFORMAT, "stored length %llu does not fit its file", (unsigned long long)x->stored_len);
        if (x->offset % A) BAD(KPK_EFORMAT, "offset %llu is not aligned to %llu", (unsigned long long)x->offset, (unsigned long long)A);
        if (x->offset < *end)
            BAD(KPK_EFORMAT, "offset %llu overlaps the previous extent of its %s (which ends at %llu) or the superblock",
                (unsigned long long)x->offset, x->member == KPK_STRIPED ? "stripe space" : "member file", (unsigned long long)*end);
        if (!kpk_fits(x->offset, padded, hi))
            BAD(KPK_EFORMAT, "offset %llu + %llu bytes runs past the end of the data area of its %s (%llu; truncated file?)",
                (unsigned long long)x->offset, (unsigned long long)padded,
                x->member == KPK_STRIPED ? "stripe space" : "member file", (unsigned long long)hi);
        *end = x->offset + padded;
        if (x->raw_len > KPK_MAX_EXTENT_RAW) BAD(KPK_EFORMAT, "implausible decoded size %llu", (unsigned long long)x->raw_len);
        if (x->codec == KPK_CODEC_NONE && (x->raw_len != x->stored_len || x->raw_xxh3 != x->stored_xxh3))
            BAD(KPK_EFORMAT, "uncompressed, but its raw and stored lengths or checksums differ");
        if (x->first_tensor != next_tensor || !kpk_fits(x->first_tensor, x->tensor_count, sb->tensor_count))
            BAD(KPK_EFORMAT, "its tensor range (%u + %u) does not follow the previous extent's (%llu) within the table",
                x->first_tensor, x->tensor_count, (unsigned long long)next_tensor);
        next_tensor += x->tensor_count;
        /* first_block: the running sum of block counts; only codec 2 has blocks */
        {
            uint64_t nb = i + 1 < sb->extent_count ? (uint64_t)f->extents[i + 1].first_block : sb->block_count;
            if (x->first_block != next_block || nb < x->first_block)
                BAD(KPK_EFORMAT, "first block %u does not follow the previous extent's blocks (%llu)", x->first_block,
                    (unsigned long long)next_block);
            if (nb != x->first_block && x->codec != KPK_CODEC_BLOCKS) BAD(KPK_EFORMAT, "codec %u but %llu block records",
                                                                        x->codec, (unsigned long long)(nb - x->first_block));
            next_block = nb;
        }
        if (data_bytes > UINT64_MAX - x->stored_len) BAD(KPK_EFORMAT, "extent sizes overflow");
        data_bytes += x->stored_len;
        switch (x->kind) {
        case KPK_KIND_META:
        case KPK_KIND_GLOBALS:
        case KPK_KIND_ARCHIVE:
            if (x->layer != KPK_NONE || x->expert != KPK_NONE) BAD(KPK_EFORMAT, "carries a layer or expert number");
            if (x->kind == KPK_KIND_META) {
                if (f->meta >= 0) BAD(KPK_EFORMAT, "a second meta extent (the first is extent %lld)", (long long)f->meta);
                f->meta = (int64_t)i;
            } else if (x->kind == KPK_KIND_GLOBALS) {
                if (f->globals >= 0) BAD(KPK_EFORMAT, "a second globals extent (the first is extent %lld)", (long long)f->globals);
                f->globals = (int64_t)i;
            }
            break;
        case KPK_KIND_TRUNK:
            if (x->layer >= KPK_MAX_LAYERS || x->expert != KPK_NONE) BAD(KPK_EFORMAT, "bad trunk layer number %u", x->layer);
            break;
        case KPK_KIND_DRAFTER:
            if (x->layer > 1 || x->expert != KPK_NONE) BAD(KPK_EFORMAT, "bad drafter part %u (0 weights, 1 embedding; no expert)", x->layer);
            if (f->drafter[x->layer] >= 0)
                BAD(KPK_EFORMAT, "a second drafter %s extent (the first is extent %lld)", x->layer ? "embedding" : "weights",
                    (long long)f->drafter[x->layer]);
            f->drafter[x->layer] = (int64_t)i;
            break;
        case KPK_KIND_EXPERT:
            if (x->layer >= KPK_MAX_LAYERS || x->expert >= KPK_MAX_EXPERTS)
                BAD(KPK_EFORMAT, "bad expert numbers (layer %u, expert %u; limits %u, %u)", x->layer, x->expert,
                    KPK_MAX_LAYERS, KPK_MAX_EXPERTS);
            if (x->expert + 1 > max_expert) max_expert = x->expert + 1;
            any_expert = 1;
            n_expert++;
            break;
        }
        if (x->kind == KPK_KIND_TRUNK || x->kind == KPK_KIND_EXPERT) {
            if (x->layer + 1 > max_layer) max_layer = x->layer + 1;
            any_layer = 1;
        }
    }
#undef BAD
    free(target_end);
    if (next_tensor != sb->tensor_count)
        return kpk_fail(err, KPK_EFORMAT, f, "the extents cover %llu tensors, the table has %llu",
                        (unsigned long long)next_tensor, (unsigned long long)sb->tensor_count);
    if (sb->extent_count == 0 && sb->block_count)
        return kpk_fail(err, KPK_EFORMAT, f, "block records without extents");
    if (data_bytes != sb->data_bytes)
        return kpk_fail(err, KPK_EFORMAT, f, "extent sizes add up to %llu bytes, the superblock says %llu",
                        (unsigned long long)data_bytes, (unsigned long long)sb->data_bytes);
    if (f->meta < 0) return kpk_fail(err, KPK_EFORMAT, f, "no meta extent (a KPK file has exactly one)");
    if (f->globals < 0 && !drafter_file) return kpk_fail(err, KPK_EFORMAT, f, "no globals extent (a KPK file has exactly one)");
    if (drafter_file && (f->drafter[0] < 0 || f->drafter[1] < 0))
        return kpk_fail(err, KPK_EFORMAT, f, "a drafter file without its drafter %s extent", f->drafter[0] < 0 ? "weights" : "embedding");
    {
        static const struct { uint32_t bit; const char *name, *what; } feat[4] = {
            {KPK_INCOMPAT_CODECS, "CODECS", "codec 1"}, {KPK_INCOMPAT_BLOCKS, "BLOCKS", "codec 2"},
            {KPK_INCOMPAT_ARCHIVE, "ARCHIVE", "archive"}, {KPK_INCOMPAT_DRAFTER, "DRAFTER", "a drafter extent"}};
        for (int k = 0; k < 4; k++)
            if (!!(sb->incompat & feat[k].bit) != uses[k])
                return kpk_fail(err, KPK_EFORMAT, f, "the %s feature bit is set but no extent uses %s", feat[k].name, feat[k].what);
    }
    f->n_layers = any_layer ? max_layer : 0;
    f->n_experts = any_expert ? max_expert : 0;
    f->trunk = malloc(sizeof *f->trunk * (f->n_layers ? f->n_layers : 1));
    f->experts = malloc(sizeof *f->experts * (n_expert ? n_expert : 1));
    if (!f->trunk || !f->experts) return kpk_fail(err, KPK_ENOMEM, f, "out of memory");
    for (uint32_t L = 0; L < f->n_layers; L++) f->trunk[L] = -1;
    for (uint64_t i = 0; i < sb->extent_count; i++) {
        const kpk_extent *x = &f->extents[i];
        if (x->kind == KPK_KIND_TRUNK) {
            if (f->trunk[x->layer] >= 0)
                return kpk_extent_fail(err, KPK_EFORMAT, f, (uint32_t)i, "a second trunk extent for layer %u (the first is extent %lld)",
                                       x->layer, (long long)f->trunk[x->layer]);
            f->trunk[x->layer] = (int64_t)i;
        } else if (x->kind == KPK_KIND_EXPERT) {
            struct kpk_expert_key k = {x->layer, x->expert, (uint32_t)i};
            f->experts[f->n_expert_extents++] = k;
        }
    }
    qsort(f->experts, f->n_expert_extents, sizeof *f->experts, cmp_expert_key);
    for (uint32_t k = 1; k < f->n_expert_extents; k++)
        if (f->experts[k].layer == f->experts[k - 1].layer && f->experts[k].expert == f->experts[k - 1].expert)
            return kpk_extent_fail(err, KPK_EFORMAT, f, f->experts[k].extent, "appears twice in the extent table (also extent %u)",
                                   f->experts[k - 1].extent);
    return 0;
}

/* ---- tensors (§5) ------------------------------------------------------------- */

static int starts(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

int kpk_meta_name_known(const char *file)
{
    static const char *const known[] = {"config.json", "tiktoken.model", "tokenizer_config.json"};
    for (size_t k = 0; k < sizeof known / sizeof *known; k++)
        if (!strcmp(file, known[k])) return 1;
    return 0;
}

/* "A name agrees with its extent" (§5). */
static int name_agrees(const kpk_extent *x, const char *name)
{
    char pre[96];
    switch (x->kind) {
    case KPK_KIND_META: return starts(name, KPK_META_PREFIX);
    case KPK_KIND_GLOBALS: return starts(name, "language_model.") && !strstr(name, ".layers.");
    case KPK_KIND_TRUNK:
        snprintf(pre, sizeof pre, "language_model.model.layers.%u.", x->layer);
        return starts(name, pre) && !strstr(name, ".experts.");
    case KPK_KIND_EXPERT:
        snprintf(pre, sizeof pre, "language_model.model.layers.%u.block_sparse_moe.experts.%u.", x->layer, x->expert);
        return starts(name, pre);
    case KPK_KIND_ARCHIVE: return !starts(name, KPK_META_PREFIX) && !starts(name, "language_model.model.layers.");
    case KPK_KIND_DRAFTER: return !starts(name, KPK_META_PREFIX) && !starts(name, "language_model.");
    default: return 0;
    }
}

int kpk_check_tensors(kpk_file *f, kpk_err *err)
{
    const kpk_superblock *sb = &f->sb;
    uint64_t nslots = 16;
    while (nslots < sb->tensor_count * 2) nslots <<= 1;
    f->name_hash = calloc(nslots, sizeof *f->name_hash);
    if (!f->name_hash) return kpk_fail(err, KPK_ENOMEM, f, "out of memory");
    f->name_hash_mask = nslots - 1;

    for (uint64_t e = 0; e < sb->extent_count; e++) {
        const kpk_extent *x = &f->extents[e];
        uint64_t end = 0;
        char d[64];
        kpk_extent_describe(x, d, sizeof d);
        for (uint64_t i = x->first_tensor; i < (uint64_t)x->first_tensor + x->tensor_count; i++) {
            kpk_tensor t;
            uint32_t name_off;
            uint64_t n = 1, esz;
            int reserved = kpk_tensor_decode(f->tensor_records + i * KPK_TENSOR_RECORD_SIZE, &t, &name_off);
            t.name = f->strings + name_off; /* checked by kpk_check_string_pool */
#define BAD(code, ...) return kpk_fail(err, code, f, __VA_ARGS__)
            if (reserved && V11) BAD(KPK_EFORMAT, "tensor %s: reserved bytes 10..11 of its record are not zero", t.name);
            if (t.extent != e) BAD(KPK_EFORMAT, "tensor %s: listed under extent %llu (%s) but claims extent %u", t.name,
                                   (unsigned long long)e, d, t.extent);
            if (!name_agrees(x, t.name)) BAD(KPK_EFORMAT, "tensor %s: its name does not belong in the %s extent", t.name, d);
            /* the meta extent holds the files the runtime reads, and no other (§4; issue 34.11: a re-sealed meta/evil.sh in
             * the place of meta/tokenizer_config.json passed, and krun read special tokens as text): a later minor may name
             * more, which this reader then ignores */
            if (x->kind == KPK_KIND_META && V11 && !kpk_meta_name_known(t.name + strlen(KPK_META_PREFIX)))
                BAD(KPK_EFORMAT, "tensor %s: the meta extent holds only meta/config.json, meta/tiktoken.model and "
                    "meta/tokenizer_config.json (FORMAT.md section 4)", t.name);
            esz = kpk_dtype_size(t.dtype); /* known: kpk_check_known_values */
            if (t.ndim < 1 || t.ndim > 4) BAD(KPK_EFORMAT, "tensor %s: %u dimensions", t.name, t.ndim);
            for (int k = 0; k < 4; k++) {
                if (k >= t.ndim) {
                    if (t.shape[k]) BAD(KPK_EFORMAT, "tensor %s: unused dimension %d is not zero", t.name, k);
                    continue;
                }
                if (t.shape[k] && n > UINT64_MAX / t.shape[k]) BAD(KPK_EFORMAT, "tensor %s: shape overflows", t.name);
                n *= t.shape[k];
            }
            if (n > UINT64_MAX / esz || n * esz != t.nbytes)
                BAD(KPK_EFORMAT, "tensor %s: %llu bytes do not match its shape and dtype", t.name, (unsigned long long)t.nbytes);
            if (t.offset % KPK_TENSOR_ALIGN || t.offset < end || !kpk_fits(t.offset, t.nbytes, x->raw_len))
                BAD(KPK_EFORMAT, "tensor %s: offset %llu + %llu bytes is unaligned, overlaps the previous tensor or lies "
                    "outside its extent (%llu bytes)", t.name, (unsigned long long)t.offset, (unsigned long long)t.nbytes,
                    (unsigned long long)x->raw_len);
            end = t.offset + t.nbytes;
            {
                uint64_t h = kpk_name_hash(t.name, t.name_len) & f->name_hash_mask;
                while (f->name_hash[h]) {
                    kpk_tensor o;
                    kpk_tensor_at(f, f->name_hash[h] - 1, &o);
                    if (o.name_len == t.name_len && memcmp(o.name, t.name, t.name_len) == 0)
                        BAD(KPK_EFORMAT, "tensor %s appears twice", t.name);
                    h = (h + 1) & f->name_hash_mask;
                }
                f->name_hash[h] = (uint32_t)(i + 1);
            }
        }
        /* the decoded bytes end with the last tensor: no length grown into padding */
        if (end != x->raw_len)
            return kpk_extent_fail(err, KPK_EFORMAT, f, (uint32_t)e, "%llu decoded bytes, but its tensors end at %llu",
                                   (unsigned long long)x->raw_len, (unsigned long long)end);
#undef BAD
    }
    return 0;
}

/* ---- blocks (§8.1) ---------------------------------------------------------------- */

int kpk_check_blocks(kpk_file *f, kpk_err *err)
{
    const kpk_superblock *sb = &f->sb;
    if (f->block_reserved)
        return kpk_fail(err, KPK_EFORMAT, f, "block record %llu: reserved bytes are not zero",
                        (unsigned long long)(f->block_reserved - 1));
    for (uint64_t e = 0; e < sb->extent_count; e++) {
        const kpk_extent *x = &f->extents[e];
        const kpk_block *bl = f->blocks + x->first_block;
        uint32_t n = kpk_extent_block_count(f, (uint32_t)e);
        uint64_t raw = 0, stored = 0, ti = x->first_tensor, tend = (uint64_t)x->first_tensor + x->tensor_count;
        if (x->codec != KPK_CODEC_BLOCKS) continue;
        if (x->raw_len > 0 && n == 0) return kpk_extent_fail(err, KPK_EFORMAT, f, (uint32_t)e, "codec 2 without blocks");
        for (uint32_t b = 0; b < n; b++) {
            const kpk_block *k = &bl[b];
#define BAD(code, ...) return kpk_extent_fail(err, code, f, (uint32_t)e, __VA_ARGS__)
            if (k->raw_off != raw || k->stored_off != stored)
                BAD(KPK_EFORMAT, "block %u starts at raw %llu / stored %llu, where the previous one ended at %llu / %llu", b,
                    (unsigned long long)k->raw_off, (unsigned long long)k->stored_off, (unsigned long long)raw,
                    (unsigned long long)stored);
            if (k->raw_len == 0 || k->raw_len > KPK_MAX_BLOCK_RAW)
                BAD(KPK_EFORMAT, "block %u: decoded length %u is not 1 .. 64 MiB", b, k->raw_len);
            if (k->stored_len > kpk_block_stored_max(k->raw_len))
                BAD(KPK_EFORMAT, "block %u: implausible stored length %u for %u decoded bytes", b, k->stored_len, k->raw_len);
            switch (k->method) {
            case KPK_METHOD_RAW:
                if (k->stored_len != k->raw_len) BAD(KPK_EFORMAT, "block %u: raw, but stored length %u != %u", b, k->stored_len, k->raw_len);
                /* fall through */
            case KPK_METHOD_ZSTD:
                if (k->planes || k->plane0_len) BAD(KPK_EFORMAT, "block %u: plane fields set for method %s", b, kpk_method_name(k->method));
                break;
            case KPK_METHOD_SPLIT2:
                if (k->raw_len % 2) BAD(KPK_EFORMAT, "block %u: split into byte planes but its length %u is odd", b, k->raw_len);
                if (k->planes & ~(KPK_PLANE0_ZSTD | KPK_PLANE1_ZSTD)) BAD(KPK_EFORMAT, "block %u: unknown plane bits 0x%x", b, k->planes);
                if (k->plane0_len > k->stored_len) BAD(KPK_EFORMAT, "block %u: plane 0 (%u bytes) is longer than the block", b, k->plane0_len);
                if ((!(k->planes & KPK_PLANE0_ZSTD) && k->plane0_len != k->raw_len / 2) ||
                    (!(k->planes & KPK_PLANE1_ZSTD) && k->stored_len - k->plane0_len != k->raw_len / 2))
                    BAD(KPK_EFORMAT, "block %u: a raw plane is not exactly half the block (%u bytes)", b, k->raw_len / 2);
                break;
            }
            raw += k->raw_len;
            stored += k->stored_len;
            /* a boundary strictly inside a tensor falls on one of its rows */
            if (b + 1 < n) {
                kpk_tensor t;
                while (ti < tend) {
                    kpk_tensor_at(f, ti, &t);
                    if (t.offset + t.nbytes > raw) break;
                    ti++;
                }
                if (ti < tend && t.offset < raw) {
                    uint64_t row = t.nbytes / t.shape[0];
                    if ((raw - t.offset) % row)
                        BAD(KPK_EFORMAT, "block %u ends at %llu, inside a row of tensor %s (rows of %llu bytes from %llu)", b,
                            (unsigned long long)raw, t.name, (unsigned long long)row, (unsigned long long)t.offset);
                }
            }
        }
        if (raw != x->raw_len || stored != x->stored_len)
            BAD(KPK_EFORMAT, "its blocks cover %llu decoded / %llu stored bytes, the extent has %llu / %llu",
                (unsigned long long)raw, (unsigned long long)stored, (unsigned long long)x->raw_len,
                (unsigned long long)x->stored_len);
#undef BAD
    }
    return 0;
}
