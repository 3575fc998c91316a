/* The writer's half of codec 2 (docs/FORMAT.md §8): encoding one block.
 *
 * A block's raw bytes are coded by one of three recipes, chosen by the
 * caller from what the bytes are (pack/blocks.c decides):
 *
 *   KPK_ENC_RAW     stored as they are (method RAW): the embedding, which a
 *                   runtime reads one row at a time, or compression off;
 *   KPK_ENC_PLANES  16-bit values (BF16, F16): method SPLIT2, each byte plane
 *                   a zstd frame where that pays and raw where it does not
 *                   (method RAW when neither plane pays);
 *   KPK_ENC_LITERALS bytes whose order carries nothing, only their
 *                   statistics (MXFP4 codes and scales): one zstd frame
 *                   where that pays, else RAW;
 *   KPK_ENC_BYTES   anything else (text, headers, F32 vectors): the same.
 *
 * Planes and KPK_ENC_LITERALS blocks are coded at literal_level, a zstd
 * level so fast that almost no match is looked for: their bytes repeat no
 * strings, so all the gain is the Huffman coding of their literals, which
 * decodes faster and codes smaller without matches (docs/PERFORMANCE.md).
 * KPK_ENC_BYTES blocks are coded at level, where matches pay.
 *
 * "Pays": the coded form is smaller than the raw one by at least
 * min_saving (a fraction) — below that a reader would decode for almost
 * nothing.  The output is a pure function of (raw bytes, recipe, level,
 * min_saving): zstd runs single-threaded per block with fixed parameters,
 * so any number of encoder threads gives the same bytes. */
#ifndef KPK_ENCODE_H
#define KPK_ENCODE_H

#include "kpk.h"

#include <stddef.h>
#include <stdint.h>

enum kpk_enc_recipe { KPK_ENC_RAW = 0, KPK_ENC_PLANES = 1, KPK_ENC_LITERALS = 2, KPK_ENC_BYTES = 3 };

typedef struct kpk_encoder kpk_encoder;

/* One encoder per thread.  level, literal_level: zstd levels (negative
 * levels allowed); min_saving in [0, 1).  NULL when out of memory. */
kpk_encoder *kpk_encoder_new(int level, int literal_level, double min_saving);
void kpk_encoder_free(kpk_encoder *e);

/* Bytes a block of raw_len may take when stored (the caller's buffer size). */
size_t kpk_encode_bound(size_t raw_len);

/* Encode raw_len bytes (1 .. KPK_MAX_BLOCK_RAW; even for KPK_ENC_PLANES)
 * into out (cap >= kpk_encode_bound(raw_len)).  Fills rec's raw_len,
 * stored_len, method, planes, plane0_len and raw_xxh3 (raw_off and
 * stored_off are the caller's).  Returns 0, or -1 (a zstd error or a bad
 * argument: a bug, not data-dependent). */
int kpk_encode_block(kpk_encoder *e, int recipe, const void *raw, size_t raw_len, void *out, size_t cap, kpk_block *rec);

/* Byte planes of 16-bit little-endian values (n pairs): the writer's split
 * and the reader's merge, vectorised where the CPU allows. */
void kpk_planes_split(const uint8_t *raw, size_t n, uint8_t *lo, uint8_t *hi);
void kpk_planes_merge(const uint8_t *lo, const uint8_t *hi, size_t n, uint8_t *raw);

#endif
