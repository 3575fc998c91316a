/* Reading a KPK file or set: open and validate, find extents and tensors,
 * read and verify extents through the member files and the stripe mapping,
 * decode compressed blocks.  Every offset and length in the file is checked
 * against the file sizes (with overflow checks) at open, so later lookups
 * cannot point outside a file; a bad file yields a kpk_err naming what is
 * wrong (docs/FORMAT.md §3-§8, §11, §12). */
#ifndef KPK_READER_H
#define KPK_READER_H

#include "kpk.h"

typedef struct kpk_file kpk_file;

/* Open and validate the entry file, its directory and every member file.
 * On failure returns -1, *out = NULL, and err says why (err->code: KPK_EIO,
 * KPK_ENOTKPK, KPK_EVERSION, KPK_EFORMAT, KPK_ECHECKSUM, KPK_ENOMEM,
 * KPK_EMEMBER; kpk_err_is_damage() tells exit 1 from exit 2). */
int kpk_open(const char *path, kpk_file **out, kpk_err *err);
/* The same, but with absent_ok a member file that does not exist is absent
 * rather than an error (a set spread over several machines: each opens the
 * members on its own disks; every other check is made on the ones present).
 * kpk_member_here tells which; reading through an absent one fails with
 * KPK_EMEMBER naming it. */
int kpk_open_here(const char *path, int absent_ok, kpk_file **out, kpk_err *err);
int kpk_member_here(const kpk_file *f, uint16_t m);
void kpk_close(kpk_file *f);

const char *kpk_path(const kpk_file *f);
int kpk_fd(const kpk_file *f);                 /* the entry file's */
uint64_t kpk_size(const kpk_file *f);          /* the entry file's */
uint64_t kpk_total_size(const kpk_file *f);    /* every member file's, added */
const kpk_superblock *kpk_super(const kpk_file *f);
/* Non-NULL when the file opened but something needs attention (e.g. a
 * primary superblock was damaged and the backup was used): damage that
 * `kpack verify` reports. */
const char *kpk_warning(const kpk_file *f);

/* ---- the files as they were opened (kpk_ident.c) ---- */
/* A file's identity: taken right after open, before anything is read from it. */
typedef struct kpk_ident {
    uint64_t dev, ino, size;
    int64_t mtime_s, mtime_ns, ctime_s, ctime_ns;
} kpk_ident;
int kpk_ident_take(int fd, kpk_ident *id);
/* 1 (why says how) if the file at fd is no longer as id recorded it; 0 if it is. */
int kpk_ident_differs(int fd, const kpk_ident *id, char *why, size_t len);
/* 0 if every member file is as it was when kpk_open opened it (nothing was
 * written to it, it was not truncated); else -1 with err (KPK_ECHANGED)
 * naming the file and what changed.  One fstat(2) per member file: cheap
 * enough to ask after every block of reads. */
int kpk_unchanged(const kpk_file *f, kpk_err *err);
/* fd is member m's file (the same device and inode; a file opened again by
 * its path, e.g. with O_DIRECT, may be another one by now). */
int kpk_member_same_file(const kpk_file *f, uint16_t m, int fd);

/* ---- member files (§7) ---- */
uint16_t kpk_member_count(const kpk_file *f);
int kpk_member_fd(const kpk_file *f, uint16_t m);            /* 0 = the entry file */
/* The path the member was opened by (the entry: as given to kpk_open; the
 * others: the entry's directory joined with the recorded path). */
const char *kpk_member_path(const kpk_file *f, uint16_t m);
/* The member record (role, size, stripe index); member 0 of a single file is
 * synthesized (role ENTRY).  The recorded, entry-relative path ("" for the entry). */
const kpk_member *kpk_member_at(const kpk_file *f, uint16_t m);
const char *kpk_member_name(const kpk_file *f, uint16_t m);

/* A contiguous physical run of an extent's stored bytes. */
typedef struct kpk_seg { uint16_t member; uint64_t off; uint64_t len; } kpk_seg;
/* Physical runs of stored bytes [pos, pos+len) of extent i, in order (one per
 * stripe unit crossed; one for a plain extent).  pos + len may reach the
 * extent's padded length (its zero padding to the alignment).  Writes at most
 * max; returns how many it wrote; *done receives how many bytes they cover,
 * so a caller can loop.  Returns 0 (and *done = 0) for a range outside the
 * extent's padded length. */
size_t kpk_extent_segments(const kpk_file *f, uint32_t i, uint64_t pos, uint64_t len,
                           kpk_seg *out, size_t max, uint64_t *done);
/* The same for stripe-space positions [pos, pos+len) (within stripe_len). */
size_t kpk_stripe_segments(const kpk_file *f, uint64_t pos, uint64_t len, kpk_seg *out, size_t max,
                           uint64_t *done);
/* Read bytes [off, off+len) of a target: a member file (0..count-1) or the
 * stripe space (KPK_STRIPED). */
int kpk_target_pread(const kpk_file *f, uint16_t target, void *buf, uint64_t len, uint64_t off, kpk_err *err);
/* Read stored bytes [pos, pos+len) of extent i through the member/stripe mapping. */
int kpk_extent_pread(const kpk_file *f, uint32_t i, void *buf, uint64_t len, uint64_t pos, kpk_err *err);

/* ---- extents ---- */
uint32_t kpk_extent_count(const kpk_file *f);
const kpk_extent *kpk_extent_at(const kpk_file *f, uint32_t i);
/* Extent lookups; return the extent index, or -1 if there is none. */
int64_t kpk_find_meta(const kpk_file *f);
int64_t kpk_find_globals(const kpk_file *f);
/* 1.2: a drafter file's extent of part 0 (the weights) or 1 (the token embedding); -1. */
int64_t kpk_find_drafter(const kpk_file *f, uint32_t part);
int64_t kpk_find_trunk(const kpk_file *f, uint32_t layer);
int64_t kpk_find_expert(const kpk_file *f, uint32_t layer, uint32_t expert);
/* 1 + the largest layer / expert number present (0 if none). */
uint32_t kpk_layer_count(const kpk_file *f);
uint32_t kpk_expert_count(const kpk_file *f);
/* Bytes an extent occupies on disk including its zero padding. */
uint64_t kpk_extent_padded_len(const kpk_file *f, const kpk_extent *x);
/* "layer 17 trunk" etc. for extent i ("extent 5" when i is out of range). */
void kpk_extent_name(const kpk_file *f, uint32_t i, char *buf, size_t n);

/* ---- compressed blocks (codec 2, §8) ---- */
/* Blocks of a codec-2 extent (NULL/0 otherwise). */
uint32_t kpk_extent_block_count(const kpk_file *f, uint32_t i);
const kpk_block *kpk_extent_blocks(const kpk_file *f, uint32_t i);
/* Decode block b (0-based within extent i) from its stored bytes into its
 * raw_len bytes at raw, checking raw_xxh3; thread-safe (per-thread zstd
 * context); errors name the extent and block.  stored and raw must not overlap. */
int kpk_block_decode(const kpk_file *f, uint32_t i, uint32_t b, const void *stored, void *raw, kpk_err *err);
/* The same for a block record that is not (yet) in a file's table (the
 * writer's round trip, the bench): checks the record's own consistency
 * too; err->msg without a location. */
int kpk_block_decode_one(const kpk_block *b, const void *stored, void *raw, kpk_err *err);

/* ---- tensors ---- */
uint64_t kpk_tensor_count(const kpk_file *f);
int kpk_tensor_at(const kpk_file *f, uint64_t i, kpk_tensor *out);
/* Find by released name; returns the tensor index or -1. */
int64_t kpk_find_tensor(const kpk_file *f, const char *name, kpk_tensor *out);

/* The manifest (JSON text, NUL-terminated, manifest_len bytes). */
const char *kpk_manifest(const kpk_file *f, size_t *len);

/* ---- reading and checking extents ---- */
/* Read an extent's decoded bytes (raw_len) into buf, for every placement and
 * codec (codec 2 block by block straight into buf).  With verify, the stored
 * bytes are checked against stored_xxh3 (and the decoded ones against raw_xxh3). */
int kpk_extent_read(const kpk_file *f, uint32_t i, void *buf, int verify, kpk_err *err);
/* Decoded bytes [pos, pos+len) of extent i (codec 2: only the blocks that
 * overlap the range are read and decoded, each checked against its raw_xxh3). */
int kpk_extent_read_raw(const kpk_file *f, uint32_t i, void *dst, uint64_t len, uint64_t pos, kpk_err *err);
/* Drop from the page cache what holds decoded bytes [pos, pos+len) of
 * extent i (a reader that uses each byte once keeps the cache for others). */
void kpk_extent_drop_cache(const kpk_file *f, uint32_t i, uint64_t pos, uint64_t len);
/* Check stored bytes that the caller read itself (e.g. with O_DIRECT). */
int kpk_extent_check(const kpk_file *f, uint32_t i, const void *stored, kpk_err *err);
/* Decode stored bytes (stored_len, contiguous) into raw_len bytes (codec
 * NONE: copy; codec 2: block by block, each checked). */
int kpk_extent_decode_into(const kpk_file *f, uint32_t i, const void *stored, void *raw, kpk_err *err);

#define KPK_VERIFY_SHALLOW 0x1  /* codec 2: check stored bytes only, do not decode */
/* Full check of one extent as it is on disk: stored bytes hash, the zero
 * padding up to the alignment, the zero gaps between its tensors, and (deep,
 * the default) every block decoded and checked, and the decoded hash.
 * Streams through scratch (any size >= 64 KiB; larger is faster). */
int kpk_extent_verify(const kpk_file *f, uint32_t i, void *scratch, size_t scratch_len, kpk_err *err);
int kpk_extent_verify_ex(const kpk_file *f, uint32_t i, void *scratch, size_t scratch_len, int flags, kpk_err *err);

/* Every byte range outside the extents' padded ranges that FORMAT.md §11
 * requires to be zero: [4096, A) of every member, gaps between extents,
 * unused stripe space, directory padding.  *out is malloc'd. */
typedef struct kpk_region {
    uint16_t target;       /* member index, or KPK_STRIPED for stripe-space positions */
    uint64_t off, len;
    char what[128];        /* "member 2 (k3.kpk.s1): padding before layer 3 trunk" */
} kpk_region;
int kpk_zero_regions(const kpk_file *f, kpk_region **out, size_t *n, kpk_err *err);

/* An embedded file of the meta extent ("config.json", "tiktoken.model", ...):
 * malloc'd, NUL-terminated.  Returns -1 with err if absent or unreadable. */
int kpk_meta_file(const kpk_file *f, const char *name, char **out, size_t *len, kpk_err *err);

#endif
