/* Which extents kpack stores as codec-2 blocks, and how it cuts them
 * (docs/FORMAT.md §8; the measurements behind every number are in
 * docs/PERFORMANCE.md, "Compressed blocks").
 *
 * A block never crosses a tensor boundary: each tensor is cut into blocks
 * of whole rows of about the block size, and the zero gap after a tensor
 * belongs to its last block (so a boundary falls on a tensor's start or on
 * one of its rows: the §8.1 row rule).  Each block gets a class from what
 * its tensor holds, and the class gives the encoder's recipe. */
#ifndef KPACK_BLOCKS_H
#define KPACK_BLOCKS_H

#include "format/kpk.h"

#include <stdint.h>

/* --compress */
enum kp_compress { KP_COMPRESS_NONE = 0, KP_COMPRESS_TRUNK = 1, KP_COMPRESS_ALL = 2 };

/* The codec's settings: one source of truth for the writer, the estimate and the bench. */
#define KP_BLOCK_SIZE_DEFAULT ((uint32_t)2 << 20)  /* raw bytes per block */
#define KP_LEVEL_DEFAULT 3                         /* zstd level of text, headers, F32 vectors */
#define KP_LITERAL_LEVEL_DEFAULT (-131072)         /* of byte planes and MXFP4 bytes: zstd's fastest, literals only */
#define KP_MIN_SAVING_DEFAULT 0.10                 /* a coded block or plane saves at least 10 %, or is stored raw */

typedef struct kp_codec_opts {
    int compress;            /* KP_COMPRESS_* */
    uint32_t block_size;     /* target raw bytes per block (a row is never split) */
    int level;               /* zstd level of KPK_ENC_BYTES blocks */
    int literal_level;       /* of planes and KPK_ENC_LITERALS blocks (kpk_encode.h) */
    double min_saving;       /* see kpk_encode.h */
} kp_codec_opts;

void kp_codec_defaults(kp_codec_opts *o);
/* An encoder with these settings (one per thread); NULL when out of memory. */
struct kpk_encoder *kp_encoder_new(const kp_codec_opts *o);
const char *kp_compress_name(int compress);   /* "none", "trunk", "all" */
int kp_compress_parse(const char *s);         /* -1 if unknown */

/* Block classes: what a block holds (the recipe, and the rows of `kpack
 * convert --dry-run`'s estimate and of the bench). */
enum kp_block_class {
    KP_BC_ROWS = 0,          /* the embedding: RAW, read one row at a time */
    KP_BC_PLANES,            /* BF16 / F16: SPLIT2 */
    KP_BC_CODES,             /* MXFP4 packed nibbles: ZSTD where it pays */
    KP_BC_SCALES,            /* MXFP4 E8M0 scales: ZSTD where it pays */
    KP_BC_OTHER,             /* F32, files, headers, ...: ZSTD where it pays */
    KP_BC_COUNT
};
const char *kp_class_name(int cls);
int kp_class_recipe(int cls);                 /* KPK_ENC_* */

/* 1 if extents of this kind are stored as blocks under o: trunk = the
 * globals and every trunk layer (read on every token), all = every extent. */
int kp_kind_compressed(const kp_codec_opts *o, int kind);

/* One planned block: its decoded range and class. */
typedef struct kp_cut { uint64_t raw_off; uint32_t raw_len; uint8_t cls; } kp_cut;

/* Cut an extent (its n tensors in offset order, its raw_len) into blocks.
 * *cuts is malloc'd (NULL and 0 for an empty extent).  Returns 0, or -1
 * (out of memory, or a row longer than a block may be: err says which). */
int kp_cut_blocks(const kp_codec_opts *o, const kpk_tensor *t, uint64_t n, uint64_t raw_len, kp_cut **cuts,
                  uint32_t *n_cuts, char *err, size_t errlen);

#endif
