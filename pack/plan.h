/* The layout of the KPK file kpack will write: which extents, in which order,
 * at which offsets, holding which source bytes.  Computed entirely from the
 * source index and the options, before a byte is written, so a rerun after a
 * crash computes the same plan and can resume (its plan_id must match). */
#ifndef PLAN_H
#define PLAN_H

#include "kpk.h"
#include "source.h"

typedef struct kp_options {
    uint32_t align;          /* extent alignment, 4096..2 MiB */
    int order;               /* KPK_ORDER_* */
} kp_options;

/* Where one tensor's bytes come from. */
typedef struct kp_source_ref {
    uint32_t shard;          /* index into src->shards, or UINT32_MAX for an embedded file */
    uint32_t extra;          /* index into src->extras when shard == UINT32_MAX */
    uint64_t offset;         /* absolute offset in the shard */
} kp_source_ref;

typedef struct kp_plan {
    kp_options opt;
    kpk_extent *extents;     /* in file order; hashes are filled in while writing */
    uint32_t n_extents;
    kpk_tensor *tensors;     /* in table order; names point into names */
    kp_source_ref *from;     /* parallel to tensors */
    uint64_t n_tensors;
    char *names;             /* the string pool, NUL after each name */
    uint64_t names_len;
    uint32_t *name_off;      /* offset of each tensor's name in the pool */
    char *manifest;          /* JSON */
    uint64_t manifest_len;
    uint64_t data_end;       /* end of the last padded extent */
    uint64_t extent_table_off, tensor_table_off, strings_off, manifest_off, backup_off, file_size;
    uint64_t data_bytes;     /* sum of extent lengths */
    uint64_t largest_extent;
    uint32_t largest_extent_index;
    uint64_t plan_id;        /* XXH3 of everything that determines the output bytes */
} kp_plan;

int kp_plan_build(const k3_source *src, const kp_options *opt, const char *producer, kp_plan *plan,
                  char *err, size_t errlen);
void kp_plan_free(kp_plan *plan);
const char *kp_order_name(int order);

#endif
