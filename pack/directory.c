#include "directory.h"

#include "format/kio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

struct dir_bytes { uint8_t *extents, *tensors, *strings, *members, *blocks; uint64_t n_ext, n_ten, n_str, n_mem, n_blk; };

static void dir_free(struct dir_bytes *d) { free(d->extents); free(d->tensors); free(d->strings); free(d->members); free(d->blocks); }

/* The shared part of every superblock of the set (§3). */
static void shared_fields(const kp_plan *p, const kp_layout *l, uint64_t set_id, kpk_superblock *sb)
{
    memset(sb, 0, sizeof *sb);
    sb->major = KPK_VERSION_MAJOR;
    sb->incompat = p->n_members > 1 ? KPK_INCOMPAT_MEMBERS : 0;
    for (uint32_t i = 0; i < p->n_extents; i++) {
        if (p->extents[i].kind == KPK_KIND_ARCHIVE) sb->incompat |= KPK_INCOMPAT_ARCHIVE;
        if (p->extents[i].kind == KPK_KIND_DRAFTER) sb->incompat |= KPK_INCOMPAT_DRAFTER;
        if (p->extents[i].codec == KPK_CODEC_BLOCKS) sb->incompat |= KPK_INCOMPAT_BLOCKS;
    }
    sb->minor = kpk_minor_for(sb->incompat);
    sb->compat = KPK_COMPAT_SPARSE;
    sb->align = p->opt.align;
    sb->order = (uint32_t)p->opt.order;
    sb->set_id = set_id;
    sb->member_count = p->n_members;
    if (p->n_stripe) {
        sb->stripe_unit = p->stripe_unit;
        sb->stripe_count = p->n_stripe;
        sb->stripe_len = l->stripe_len;
    }
}

/* Write a superblock copy; what names the file in errors. */
static int put_block(int fd, const uint8_t *blk, uint64_t off, const char *what, char *err, size_t errlen)
{
    if (kio_pwrite_full(fd, blk, KPK_SUPERBLOCK_SIZE, off)) {
        snprintf(err, errlen, "writing the superblock of %s: %s", what, strerror(errno));
        return -1;
    }
    return 0;
}

int kp_finish_files(const kp_plan *p, const kp_layout *l, const int *fds, char *err, size_t errlen)
{
    struct dir_bytes d = {0};
    uint8_t (*blk)[KPK_SUPERBLOCK_SIZE] = calloc(p->n_members, KPK_SUPERBLOCK_SIZE);
    kpk_superblock sb;
    uint64_t set_id, data = 0, at;
    int rc = -1;

    d.n_ext = (uint64_t)p->n_extents * KPK_EXTENT_RECORD_SIZE;
    d.n_ten = p->n_tensors * KPK_TENSOR_RECORD_SIZE;
    d.n_str = l->strings_len;
    d.n_mem = p->n_members > 1 ? (uint64_t)p->n_members * KPK_MEMBER_RECORD_SIZE : 0;
    d.extents = malloc(d.n_ext + 1);
    d.tensors = malloc(d.n_ten + 1);
    d.strings = malloc(d.n_str + 1);
    d.members = calloc(1, d.n_mem + 1);
    d.n_blk = p->n_blocks * KPK_BLOCK_RECORD_SIZE;
    d.blocks = malloc(d.n_blk + 1);
    if (!blk || !d.extents || !d.tensors || !d.strings || !d.members || !d.blocks) { errno = ENOMEM; snprintf(err, errlen, "out of memory"); goto out; }
    for (uint64_t b = 0; b < p->n_blocks; b++) kpk_block_encode(&p->blocks[b], d.blocks + b * KPK_BLOCK_RECORD_SIZE);
    for (uint32_t i = 0; i < p->n_extents; i++) {
        kpk_extent_encode(&p->extents[i], d.extents + (uint64_t)i * KPK_EXTENT_RECORD_SIZE);
        data += p->extents[i].stored_len;
    }
    for (uint64_t i = 0; i < p->n_tensors; i++) kpk_tensor_encode(&p->tensors[i], p->name_off[i], d.tensors + i * KPK_TENSOR_RECORD_SIZE);
    /* the string pool: the names, then the member paths (§5, §7.2) */
    memcpy(d.strings, p->names, p->names_len);
    at = p->names_len;
    for (uint32_t m = 1; m < p->n_members; m++) {
        size_t n = strlen(p->members[m].rel) + 1;
        memcpy(d.strings + at, p->members[m].rel, n);
        at += n;
    }
    set_id = XXH3_64bits(d.extents, d.n_ext) ^ XXH3_64bits(d.tensors, d.n_ten);

    /* the other members' superblocks first: the member table records their checksums */
    at = p->names_len;
    for (uint32_t m = 0; m < p->n_members && p->n_members > 1; m++) {
        kpk_member r = {.index = (uint16_t)m, .role = p->members[m].role, .stripe_index = p->members[m].stripe_index,
                        .file_size = l->member_size[m]};
        if (m) {
            shared_fields(p, l, set_id, &sb);
            sb.file_size = l->member_size[m];
            sb.member_index = (uint16_t)m;
            kpk_superblock_encode(&sb, blk[m]);
            r.superblock_xxh3 = kpk_xxh3(blk[m], KPK_SB_CHECKSUM_OFF);
            r.path_off = (uint32_t)at;
            r.path_len = (uint32_t)strlen(p->members[m].rel);
            at += r.path_len + 1;
        }
        kpk_member_encode(&r, d.members + (uint64_t)m * KPK_MEMBER_RECORD_SIZE);
    }
    shared_fields(p, l, set_id, &sb);
    sb.file_size = l->member_size[0];
    sb.extent_table_off = l->extent_table_off;
    sb.extent_count = p->n_extents;
    sb.extent_table_xxh3 = XXH3_64bits(d.extents, d.n_ext);
    sb.tensor_table_off = l->tensor_table_off;
    sb.tensor_count = p->n_tensors;
    sb.tensor_table_xxh3 = XXH3_64bits(d.tensors, d.n_ten);
    sb.strings_off = l->strings_off;
    sb.strings_len = d.n_str;
    sb.strings_xxh3 = XXH3_64bits(d.strings, d.n_str);
    sb.manifest_off = l->manifest_off;
    sb.manifest_len = p->manifest_len;
    sb.manifest_xxh3 = XXH3_64bits(p->manifest, p->manifest_len);
    sb.data_bytes = data;
    if (p->n_members > 1) {
        sb.member_table_off = l->member_table_off;
        sb.member_table_xxh3 = XXH3_64bits(d.members, d.n_mem);
    }
    if (p->n_blocks) {
        sb.block_table_off = l->block_table_off;
        sb.block_count = p->n_blocks;
        sb.block_table_xxh3 = XXH3_64bits(d.blocks, d.n_blk);
    }
    kpk_superblock_encode(&sb, blk[0]);

    /* 1. every file at its size, with its directory (the entry) and its backup superblock */
    if (kio_pwrite_full(fds[0], d.extents, d.n_ext, l->extent_table_off) ||
        kio_pwrite_full(fds[0], d.tensors, d.n_ten, l->tensor_table_off) ||
        kio_pwrite_full(fds[0], d.strings, d.n_str, l->strings_off) ||
        kio_pwrite_full(fds[0], p->manifest, p->manifest_len, l->manifest_off) ||
        (d.n_mem && kio_pwrite_full(fds[0], d.members, d.n_mem, l->member_table_off)) ||
        (d.n_blk && kio_pwrite_full(fds[0], d.blocks, d.n_blk, l->block_table_off))) {
        snprintf(err, errlen, "writing the directory of %s: %s", p->members[0].partial, strerror(errno));
        goto out;
    }
    for (uint32_t m = 0; m < p->n_members; m++) {
        if (ftruncate(fds[m], (off_t)(l->member_size[m] - KPK_SUPERBLOCK_SIZE))) {
            snprintf(err, errlen, "sizing %s: %s", p->members[m].partial, strerror(errno));
            goto out;
        }
        if (put_block(fds[m], blk[m], l->member_size[m] - KPK_SUPERBLOCK_SIZE, p->members[m].partial, err, errlen)) goto out;
    }
    for (uint32_t m = 0; m < p->n_members; m++)
        if (fdatasync(fds[m])) { snprintf(err, errlen, "fdatasync %s: %s", p->members[m].partial, strerror(errno)); goto out; }
    /* 2. the primary superblocks: a member with a valid primary is complete */
    for (uint32_t m = 0; m < p->n_members; m++)
        if (put_block(fds[m], blk[m], 0, p->members[m].partial, err, errlen)) goto out;
    for (uint32_t m = 0; m < p->n_members; m++)
        if (fsync(fds[m])) { snprintf(err, errlen, "fsync %s: %s", p->members[m].partial, strerror(errno)); goto out; }
    rc = 0;
out:
    dir_free(&d);
    free(blk);
    return rc;
}
