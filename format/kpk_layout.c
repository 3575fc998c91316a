/* The byte ranges of a KPK file or set that must be zero (docs/FORMAT.md
 * §11): everything outside the superblocks, the directory and the extents'
 * padded ranges.  The padding inside an extent's padded range is checked
 * with the extent (kpk_extent_verify). */
#include "kpk_internal.h"

#include <stdlib.h>
#include <string.h>

struct regions { kpk_region *r; size_t n, cap; const kpk_file *f; };

static int add(struct regions *g, uint16_t target, uint64_t a, uint64_t b, const char *fmt, const char *arg)
{
    kpk_region *r;
    char what[96];
    if (a >= b) return 0;
    if (g->n == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 64;
        kpk_region *p = realloc(g->r, cap * sizeof *p);
        if (!p) return -1;
        g->r = p;
        g->cap = cap;
    }
    r = &g->r[g->n++];
    r->target = target;
    r->off = a;
    r->len = b - a;
    snprintf(what, sizeof what, fmt, arg);
    if (target == KPK_STRIPED) snprintf(r->what, sizeof r->what, "stripe space: %s", what);
    else if (g->f->sb.member_count == 1) snprintf(r->what, sizeof r->what, "%s", what);
    else snprintf(r->what, sizeof r->what, "member %u (%s): %s", target, target ? kpk_member_name(g->f, target) : "entry", what);
    return 0;
}

int kpk_zero_regions(const kpk_file *f, kpk_region **out, size_t *n, kpk_err *err)
{
    const kpk_superblock *sb = &f->sb;
    const uint32_t M = sb->member_count;
    struct regions g = {NULL, 0, 0, f};
    uint64_t *end = malloc(sizeof *end * (M + 1)); /* per target: end of the last extent so far */
    char d[64];
    int bad = 0;

    *out = NULL;
    *n = 0;
    if (!end) return kpk_fail(err, KPK_ENOMEM, f, "out of memory");
    for (uint32_t m = 0; m < M; m++) {
        bad |= add(&g, (uint16_t)m, KPK_SUPERBLOCK_SIZE, sb->align, "%spadding after the superblock", "");
        end[m] = sb->align;
    }
    end[M] = 0;
    for (uint32_t i = 0; i < sb->extent_count; i++) {
        const kpk_extent *x = &f->extents[i];
        uint32_t t = x->member == KPK_STRIPED ? M : x->member;
        kpk_extent_describe(x, d, sizeof d);
        bad |= add(&g, x->member, end[t], x->offset, "padding before %s", d);
        end[t] = x->offset + kpk_round_up(x->stored_len, sb->align);
    }
    for (uint32_t m = 0; m < M; m++) {
        if (f->members[m].role == KPK_ROLE_STRIPE) continue;
        bad |= add(&g, (uint16_t)m, end[m], m ? f->members[m].file_size - KPK_SUPERBLOCK_SIZE : sb->extent_table_off,
                   m ? "%spadding after the last extent" : "%spadding before the directory", "");
    }
    if (sb->stripe_count) bad |= add(&g, KPK_STRIPED, end[M], sb->stripe_len, "%sunused space after the last extent", "");
    {   /* the directory's sections in order, then the backup superblock */
        const struct { uint64_t off, len; const char *name; } s[] = {
            {sb->extent_table_off, sb->extent_count * KPK_EXTENT_RECORD_SIZE, "extent table"},
            {sb->tensor_table_off, sb->tensor_count * KPK_TENSOR_RECORD_SIZE, "tensor table"},
            {sb->strings_off, sb->strings_len, "string pool"},
            {sb->manifest_off, sb->manifest_len, "manifest"},
            {sb->member_table_off, M > 1 ? (uint64_t)M * KPK_MEMBER_RECORD_SIZE : 0, "member table"},
            {sb->block_table_off, sb->block_count * KPK_BLOCK_RECORD_SIZE, "block table"},
        };
        uint64_t at = 0;
        const char *prev = NULL;
        for (size_t k = 0; k < sizeof s / sizeof s[0]; k++) {
            if (k >= 4 && !s[k].off) continue; /* absent optional section */
            if (prev) bad |= add(&g, 0, at, s[k].off, "directory padding after the %s", prev);
            at = s[k].off + s[k].len;
            prev = s[k].name;
        }
        bad |= add(&g, 0, at, f->size - KPK_SUPERBLOCK_SIZE, "directory padding after the %s", prev);
    }
    free(end);
    if (bad) { free(g.r); return kpk_fail(err, KPK_ENOMEM, f, "out of memory"); }
    *out = g.r;
    *n = g.n;
    return 0;
}
