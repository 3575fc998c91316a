#include "directory.h"

#include "kio.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

static uint8_t *encode_extents(const kp_plan *p, uint64_t *len)
{
    uint8_t *b = malloc((uint64_t)p->n_extents * KPK_EXTENT_RECORD_SIZE + 1);
    if (!b) return NULL;
    for (uint32_t i = 0; i < p->n_extents; i++) kpk_extent_encode(&p->extents[i], b + (uint64_t)i * KPK_EXTENT_RECORD_SIZE);
    *len = (uint64_t)p->n_extents * KPK_EXTENT_RECORD_SIZE;
    return b;
}

static uint8_t *encode_tensors(const kp_plan *p, uint64_t *len)
{
    uint8_t *b = malloc(p->n_tensors * KPK_TENSOR_RECORD_SIZE + 1);
    if (!b) return NULL;
    for (uint64_t i = 0; i < p->n_tensors; i++) kpk_tensor_encode(&p->tensors[i], p->name_off[i], b + i * KPK_TENSOR_RECORD_SIZE);
    *len = p->n_tensors * KPK_TENSOR_RECORD_SIZE;
    return b;
}

void kp_superblock_for(const kp_plan *p, kpk_superblock *sb)
{
    uint64_t len;
    uint8_t *b;
    memset(sb, 0, sizeof *sb);
    sb->major = KPK_VERSION_MAJOR;
    sb->minor = KPK_VERSION_MINOR;
    sb->incompat = 0;
    sb->compat = KPK_COMPAT_SPARSE;
    sb->align = p->opt.align;
    sb->order = (uint32_t)p->opt.order;
    sb->file_size = p->file_size;
    sb->member_index = 0;
    sb->member_count = 1;
    sb->extent_table_off = p->extent_table_off;
    sb->extent_count = p->n_extents;
    sb->tensor_table_off = p->tensor_table_off;
    sb->tensor_count = p->n_tensors;
    sb->strings_off = p->strings_off;
    sb->strings_len = p->names_len;
    sb->strings_xxh3 = XXH3_64bits(p->names, p->names_len);
    sb->manifest_off = p->manifest_off;
    sb->manifest_len = p->manifest_len;
    sb->manifest_xxh3 = XXH3_64bits(p->manifest, p->manifest_len);
    sb->data_bytes = p->data_bytes;
    if ((b = encode_extents(p, &len))) { sb->extent_table_xxh3 = XXH3_64bits(b, len); free(b); }
    if ((b = encode_tensors(p, &len))) { sb->tensor_table_xxh3 = XXH3_64bits(b, len); free(b); }
    /* The set id ties the members of a stripe set together; with one member it
     * is simply a fingerprint of the layout. */
    sb->set_id = sb->extent_table_xxh3 ^ sb->tensor_table_xxh3;
}

int kp_write_directory(int fd, const kp_plan *p)
{
    uint64_t len;
    uint8_t *b;
    int rc;
    if (!(b = encode_extents(p, &len))) { errno = ENOMEM; return -1; }
    rc = kio_pwrite_full(fd, b, len, p->extent_table_off);
    free(b);
    if (rc) return -1;
    if (!(b = encode_tensors(p, &len))) { errno = ENOMEM; return -1; }
    rc = kio_pwrite_full(fd, b, len, p->tensor_table_off);
    free(b);
    if (rc) return -1;
    if (kio_pwrite_full(fd, p->names, p->names_len, p->strings_off)) return -1;
    return kio_pwrite_full(fd, p->manifest, p->manifest_len, p->manifest_off);
}

int kp_write_superblocks(int fd, const kp_plan *p)
{
    kpk_superblock sb;
    uint8_t *blk = malloc(KPK_SUPERBLOCK_SIZE);
    int rc = -1;
    if (!blk) { errno = ENOMEM; return -1; }
    kp_superblock_for(p, &sb);
    if (!sb.extent_table_xxh3 && p->n_extents) { errno = ENOMEM; goto out; }
    kpk_superblock_encode(&sb, blk);
    if (kio_pwrite_full(fd, blk, KPK_SUPERBLOCK_SIZE, p->backup_off) || fdatasync(fd)) goto out;
    if (kio_pwrite_full(fd, blk, KPK_SUPERBLOCK_SIZE, 0) || fsync(fd)) goto out;
    rc = 0;
out:
    free(blk);
    return rc;
}
