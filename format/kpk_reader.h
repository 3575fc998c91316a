/* Reading a KPK file: open and validate, find extents and tensors, read and
 * verify extents.  Every offset and length in the file is checked against the
 * file size (with overflow checks) at open, so later lookups cannot point
 * outside the file; a bad file yields a kpk_err naming what is wrong. */
#ifndef KPK_READER_H
#define KPK_READER_H

#include "kpk.h"

typedef struct kpk_file kpk_file;

/* Open and validate.  On failure returns -1, *out = NULL, and err says why
 * (err->code: KPK_EIO, KPK_ENOTKPK, KPK_EVERSION, KPK_EFORMAT, KPK_ECHECKSUM, KPK_ENOMEM). */
int kpk_open(const char *path, kpk_file **out, kpk_err *err);
void kpk_close(kpk_file *f);

const char *kpk_path(const kpk_file *f);
int kpk_fd(const kpk_file *f);
uint64_t kpk_size(const kpk_file *f);
const kpk_superblock *kpk_super(const kpk_file *f);
/* Non-NULL when the file opened but something needs attention (e.g. the
 * primary superblock was damaged and the backup was used). */
const char *kpk_warning(const kpk_file *f);

uint32_t kpk_extent_count(const kpk_file *f);
const kpk_extent *kpk_extent_at(const kpk_file *f, uint32_t i);
/* Extent lookups; return the extent index, or -1 if there is none. */
int64_t kpk_find_meta(const kpk_file *f);
int64_t kpk_find_globals(const kpk_file *f);
int64_t kpk_find_trunk(const kpk_file *f, uint32_t layer);
int64_t kpk_find_expert(const kpk_file *f, uint32_t layer, uint32_t expert);
/* 1 + the largest layer / expert number present (0 if none). */
uint32_t kpk_layer_count(const kpk_file *f);
uint32_t kpk_expert_count(const kpk_file *f);
/* Bytes an extent occupies on disk including its zero padding. */
uint64_t kpk_extent_padded_len(const kpk_file *f, const kpk_extent *x);

uint64_t kpk_tensor_count(const kpk_file *f);
int kpk_tensor_at(const kpk_file *f, uint64_t i, kpk_tensor *out);
/* Find by released name; returns the tensor index or -1. */
int64_t kpk_find_tensor(const kpk_file *f, const char *name, kpk_tensor *out);

/* The manifest (JSON text, NUL-terminated, manifest_len bytes). */
const char *kpk_manifest(const kpk_file *f, size_t *len);

/* Read an extent's decoded bytes (raw_len) into buf.  With verify, the stored
 * bytes are checked against stored_xxh3 (and raw_xxh3 after decoding). */
int kpk_extent_read(const kpk_file *f, uint32_t i, void *buf, int verify, kpk_err *err);
/* Check stored bytes that the caller read itself (e.g. with O_DIRECT). */
int kpk_extent_check(const kpk_file *f, uint32_t i, const void *stored, kpk_err *err);
/* Decode stored bytes into raw_len bytes (codec NONE: copy). */
int kpk_extent_decode_into(const kpk_file *f, uint32_t i, const void *stored, void *raw, kpk_err *err);
/* Full check of one extent as it is on disk: stored bytes hash, the zero
 * padding up to the alignment, and for compressed extents the decoded hash.
 * Streams through scratch (any size >= 64 KiB; larger is faster). */
int kpk_extent_verify(const kpk_file *f, uint32_t i, void *scratch, size_t scratch_len, kpk_err *err);

/* An embedded file of the meta extent ("config.json", "tiktoken.model", ...):
 * malloc'd, NUL-terminated.  Returns -1 with err if absent or unreadable. */
int kpk_meta_file(const kpk_file *f, const char *name, char **out, size_t *len, kpk_err *err);

#endif
