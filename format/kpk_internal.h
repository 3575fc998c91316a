/* The reader's private state and the helpers its files share (kpk_reader.c
 * opens, kpk_check.c validates the directory, kpk_members.c opens the member
 * files and maps the stripe space, kpk_blocks.c decodes, kpk_extent.c reads
 * and verifies, kpk_layout.c lists the zero regions).  Not installed. */
#ifndef KPK_INTERNAL_H
#define KPK_INTERNAL_H

#include "kpk_reader.h"

#include <stdio.h>

struct kpk_expert_key { uint32_t layer, expert, extent; };

struct kpk_file {
    int fd;                      /* the entry file */
    char *path;                  /* as given */
    char *dir;                   /* directory of the entry's real path: member paths are relative to it */
    uint64_t size;
    kpk_superblock sb;
    char warning[1024];
    kpk_extent *extents;
    uint8_t *tensor_records;     /* tensor_count * 64 bytes, decoded on access */
    char *strings;               /* string pool, NUL-terminated names then member paths */
    char *manifest;              /* NUL-terminated */
    kpk_block *blocks;           /* block_count */
    kpk_member *members;         /* member_count; record 0 synthesized for a single file */
    kpk_ident entry_ident;       /* the entry file as it was opened, before a byte was read */
    kpk_ident *ident;            /* [member_count]: each file as it was opened (kpk_ident.c) */
    int *member_fd;              /* [0] = fd; -1: a member not on this machine (kpk_open_here) */
    int absent_ok;               /* kpk_open_here: a member file that does not exist is absent, not an error */
    char **member_path;          /* [0] = path */
    uint16_t *stripe_member;     /* stripe_index -> member index, stripe_count entries */
    uint32_t n_layers, n_experts;
    int64_t meta, globals;
    int64_t drafter[2];          /* 1.2: the drafter extents of a drafter file, by part; -1 */
    int64_t *trunk;              /* [n_layers] */
    struct kpk_expert_key *experts; /* sorted by (layer, expert) */
    uint32_t n_expert_extents;
    uint32_t member_reserved;    /* 1 + the first member record with non-zero reserved bytes, or 0 */
    uint64_t block_reserved;     /* 1 + the first such block record, or 0 */
    uint32_t *name_hash;         /* open addressing: tensor index + 1, 0 = empty */
    uint64_t name_hash_mask;
};

/* a + b <= limit without overflow */
static inline int kpk_fits(uint64_t a, uint64_t b, uint64_t limit) { return a <= limit && b <= limit - a; }

/* "PATH: " + message, with code. */
int kpk_fail(kpk_err *err, int code, const kpk_file *f, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* "PATH: layer 3 trunk (extent 7): " + message. */
int kpk_extent_fail(kpk_err *err, int code, const kpk_file *f, uint32_t i, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Append to the file's warning line. */
void kpk_warn(kpk_file *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
uint64_t kpk_name_hash(const char *s, size_t n);

/* §3: read and check the two superblocks of an open member file of size
 * bytes; what names it in messages ("k3.kpk", "member 2 (k3.kpk.s1)").
 * On success *used_backup says the primary was damaged and the backup used
 * (damage), with why in backup_why. */
int kpk_read_superblocks(int fd, uint64_t size, const char *what, kpk_superblock *sb, int *used_backup,
                         char *backup_why, size_t why_len, kpk_err *err);

/* kpk_check.c: the directory rules of §4, §5, §8 (extents need the member
 * table checked first: the placement rule uses its sizes). */
/* Unknown enumerated values first (they make the file "newer format", whatever else fails). */
int kpk_check_known_values(kpk_file *f, kpk_err *err);
int kpk_check_member_table(kpk_file *f, kpk_err *err);
int kpk_check_extents(kpk_file *f, kpk_err *err);
int kpk_check_tensors(kpk_file *f, kpk_err *err);
int kpk_check_blocks(kpk_file *f, kpk_err *err);
int kpk_check_string_pool(kpk_file *f, kpk_err *err);
/* kpk_members.c: §7.4 step 2-3, open every member file. */
int kpk_open_members(kpk_file *f, kpk_err *err);

#endif
