/* The KPK file or set kpack will write: which member files, which extents
 * in which order, in which member file or the stripe space, holding which
 * source bytes (docs/FORMAT.md §2, §6, §7).  Computed entirely from the
 * input and the options, before a byte is written, so a rerun after a crash
 * computes the same plan and can resume (its plan_id must match).
 *
 * Offsets are NOT planned: they are assigned in extent order as each extent
 * is written (kp_place), because a compressed extent's stored size is known
 * only once it is complete; the journal records them (FORMAT.md §14). */
#ifndef KPACK_PLAN_H
#define KPACK_PLAN_H

#include "blocks.h"
#include "source.h"
#include "format/kpk.h"
#include "format/kpk_reader.h"

#define KP_DEFAULT_STRIPE_UNIT (4u << 20)

typedef struct kp_options {
    uint32_t align;                  /* extent alignment, 4096..2 MiB */
    int order;                       /* KPK_ORDER_* */
    const char *const *stripe_dirs;  /* one stripe member per directory (--stripe) */
    uint16_t n_stripe;
    uint32_t stripe_unit;            /* 0: the default (4 MiB, or the alignment if larger) */
    const char *trunk_dir;           /* --trunk-to: a plain member for the globals and trunks, or NULL */
    uint16_t machines;               /* --machines N: the --stripe directories are N machines' disks, in order (an
                                        equal number each), one PLAIN member per directory holding whole extents:
                                        the experts dealt over all of them, each trunk layer on a disk of the
                                        machine whose share of the layers it is in, the globals on machine 0's
                                        first (krun over several machines: docs/RUNTIME.md §10) */
    kp_codec_opts codec;             /* --compress and the codec's settings (blocks.h) */
} kp_options;

struct ka_archive;
struct kc_state;
struct kd_source;

/* What a conversion reads: a checked checkpoint directory, or a KPK file or set. */
typedef struct kp_input {
    const k3_source *src;            /* shards (NULL for a KPK source) */
    kpk_file *kpk;                   /* a KPK source (NULL for shards) */
    const k3_config *cfg;
    const k3_schema *schema;
    const struct ka_archive *arch;   /* what of the download is kept besides the model (NULL: nothing) */
    const struct kd_source *drafter; /* a drafter checkpoint (drafter.h; src is its one file; cfg, schema NULL), or NULL */
    int threads;                     /* encoder threads */
    struct kc_state *consume;        /* shards deleted as the conversion goes (consume.h), or NULL */
} kp_input;

/* Where one tensor's bytes come from. */
#define KP_FROM_EXTRA UINT32_MAX         /* shard: an embedded file of the source directory */
#define KP_FROM_KPK (UINT32_MAX - 1)     /* shard: an extent of the source KPK file */
#define KP_FROM_FILE (UINT32_MAX - 2)    /* shard: a kept file of the download (extra: its index in arch->files) */
typedef struct kp_source_ref {
    uint32_t shard;          /* index into src->shards, or KP_FROM_EXTRA / KP_FROM_KPK */
    uint32_t extra;          /* index into src->extras or arch->files, or the source KPK extent */
    uint64_t offset;         /* absolute offset in the shard or file, or the tensor's decoded offset in the source extent */
} kp_source_ref;

/* One output file: the entry (member 0), the trunk member, the stripe members. */
typedef struct kp_member {
    uint8_t role;            /* KPK_ROLE_* */
    uint16_t stripe_index;   /* 0..N-1 for a stripe member, KPK_NO_STRIPE otherwise */
    char *path;              /* where the finished file goes */
    char *partial;           /* path + ".partial" while it is written */
    char *rel;               /* the path the member table records: relative to the entry's directory */
    char *dir;               /* the directory that holds it (free space, fsync) */
} kp_member;

/* Per extent, for a KPK source: which source extent it is copied from and,
 * when its decoded bytes are laid out identically, the source's raw_xxh3 the
 * copy must reproduce (so a damaged source is caught while it is read). */
typedef struct kp_origin {
    uint32_t extent;         /* UINT32_MAX for shard sources */
    int identical;           /* same tensors at the same offsets: bytes copied whole, expect_xxh3 checked */
    uint64_t expect_xxh3;
} kp_origin;

typedef struct kp_plan {
    kp_options opt;
    kp_member *members;
    uint16_t n_members, n_stripe;
    uint32_t stripe_unit;    /* 0 without stripe members */
    kpk_extent *extents;     /* in table order; member = target; offset and hashes set while writing */
    kp_origin *origin;       /* per extent */
    uint32_t n_extents;
    kpk_tensor *tensors;     /* in table order; names point into names */
    kp_source_ref *from;     /* parallel to tensors */
    uint64_t n_tensors;
    char *names;             /* the tensor names, NUL after each */
    uint64_t names_len;
    uint32_t *name_off;      /* offset of each tensor's name in names */
    char *manifest;          /* JSON */
    uint64_t manifest_len;
    uint64_t data_bytes;     /* sum of raw extent lengths */
    uint64_t largest_extent;
    uint32_t largest_extent_index;
    uint64_t plan_id;        /* XXH3 of everything that determines the output bytes */
    /* codec-2 extents: their blocks, cut at planning (extent i's are
     * cuts[first_block(i) ..]), the records filled in as they are written */
    kp_cut *cuts;
    kpk_block *blocks;
    uint64_t n_blocks;
    uint32_t max_cut;        /* the longest block's raw_len */
    /* stored/raw of each block class for the size estimate (1.0 until
     * kp_estimate_ratios sampled the source) */
    double est_ratio[KP_BC_COUNT];
} kp_plan;

/* The shape of the finished files, once every extent has its stored size
 * and offset (kp_layout_finish). */
typedef struct kp_layout {
    uint64_t extent_table_off, tensor_table_off, strings_off, manifest_off, member_table_off, block_table_off;
    uint64_t backup_off;     /* of the entry */
    uint64_t strings_len;    /* names, then member paths */
    uint64_t stripe_len;     /* L */
    uint64_t *member_size;   /* per member */
} kp_layout;

int kp_plan_build(const kp_input *in, const kp_options *opt, const char *out, const char *producer, kp_plan *plan,
                  char *err, size_t errlen);
void kp_plan_free(kp_plan *plan);
const char *kp_order_name(int order);

/* Targets: 0..n_members-1 are member files, n_members is the stripe space. */
static inline uint32_t kp_target(const kp_plan *p, uint16_t member) { return member == KPK_STRIPED ? p->n_members : member; }
/* Where each target's next extent starts: A in a member file, 0 in the stripe space. */
void kp_cursors_init(const kp_plan *p, uint64_t *cursor);
/* Give extent i (its stored_len known) the next offset of its target. */
void kp_place(kp_plan *p, uint64_t *cursor, uint32_t i);
/* The file sizes and the entry's directory, from the final cursors.
 * member_size is malloc'd (kp_layout_free). */
int kp_layout_finish(const kp_plan *p, const uint64_t *cursor, kp_layout *l);
void kp_layout_free(kp_layout *l);
/* The layout the plan will have: exact for uncompressed extents; a
 * compressed one counted at est_ratio of its blocks' raw bytes, plus
 * margin (a fraction), never more than raw (the dry run's sizes, the space
 * check). */
int kp_plan_estimate(const kp_plan *p, double margin, kp_layout *l);
/* Extent i's stored size as kp_plan_estimate counts it. */
uint64_t kp_extent_estimate(const kp_plan *p, uint32_t i, double margin);
/* Extent i's blocks: their cuts and records (n = its block count). */
static inline uint32_t kp_extent_nblocks(const kp_plan *p, uint32_t i)
{
    uint64_t next = i + 1 < p->n_extents ? p->extents[i + 1].first_block : p->n_blocks;
    return p->extents[i].codec == KPK_CODEC_BLOCKS ? (uint32_t)(next - p->extents[i].first_block) : 0;
}
/* Where stripe-space position pos lies: member index, offset in it, bytes left in its unit. */
void kp_stripe_locate(const kp_plan *p, uint64_t pos, uint16_t *member, uint64_t *off, uint64_t *left);
/* How many bytes of a member file the extents written so far cover (its
 * data end): for a stripe member, its share of the stripe space up to the
 * stripe cursor. */
uint64_t kp_member_end(const kp_plan *p, const uint64_t *cursor, uint16_t m);

#endif
