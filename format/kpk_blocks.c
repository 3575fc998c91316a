/* Compressed blocks (docs/FORMAT.md §8): decoding one block of a codec-2
 * extent.  Thread-safe: each thread keeps its own zstd context and plane
 * buffer (freed when the thread exits). */
#include "kpk_internal.h"

#include "kpk_encode.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <zstd.h>

uint32_t kpk_extent_block_count(const kpk_file *f, uint32_t i)
{
    const kpk_extent *x;
    uint64_t next;
    if (i >= f->sb.extent_count) return 0;
    x = &f->extents[i];
    if (x->codec != KPK_CODEC_BLOCKS) return 0;
    next = i + 1 < f->sb.extent_count ? f->extents[i + 1].first_block : f->sb.block_count;
    return (uint32_t)(next - x->first_block);
}

const kpk_block *kpk_extent_blocks(const kpk_file *f, uint32_t i)
{
    return kpk_extent_block_count(f, i) ? f->blocks + f->extents[i].first_block : NULL;
}

/* SPLIT2 output merged and hashed in pieces of this many pairs (16 KiB of
 * output: stays in L1 between the merge and the hash). */
#define MERGE_PIECE ((size_t)8 << 10)

/* ---- per-thread decoding state ------------------------------------------------ */

struct tls { ZSTD_DCtx *dctx; XXH3_state_t *hash; uint8_t *buf; size_t cap; };
static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;

static void tls_free(void *p)
{
    struct tls *t = p;
    if (!t) return;
    ZSTD_freeDCtx(t->dctx);
    XXH3_freeState(t->hash);
    free(t->buf);
    free(t);
}

static void tls_init(void) { pthread_key_create(&tls_key, tls_free); }

/* The calling thread's state with a buffer of at least need bytes; NULL when out of memory. */
static struct tls *tls_get(size_t need)
{
    struct tls *t;
    pthread_once(&tls_once, tls_init);
    t = pthread_getspecific(tls_key);
    if (!t) {
        if (!(t = calloc(1, sizeof *t))) return NULL;
        if (!(t->dctx = ZSTD_createDCtx()) || !(t->hash = XXH3_createState()) || pthread_setspecific(tls_key, t)) {
            tls_free(t);
            return NULL;
        }
    }
    if (need > t->cap) {
        uint8_t *b = realloc(t->buf, need);
        if (!b) return NULL;
        t->buf = b;
        t->cap = need;
    }
    return t;
}

/* One zstd frame of exactly src_len bytes decoding to exactly dst_len
 * bytes (§8.1 ZSTD); what is "", "plane 0 " or "plane 1 " for messages. */
static int zstd_frame(ZSTD_DCtx *dctx, void *dst, size_t dst_len, const void *src, size_t src_len, char *why, size_t n,
                      const char *what)
{
    const uint8_t *b = src;
    unsigned long long content;
    size_t r;
    /* a zstd frame proper (RFC 8878 magic 0xFD2FB528), not a skippable frame */
    if (src_len < 4 || (b[0] | b[1] << 8 | b[2] << 16 | (uint32_t)b[3] << 24) != ZSTD_MAGICNUMBER) {
        snprintf(why, n, "%snot a zstd frame", what);
        return -1;
    }
    content = ZSTD_getFrameContentSize(src, src_len);
    if (content == ZSTD_CONTENTSIZE_ERROR) {
        snprintf(why, n, "%sbad zstd frame header", what);
        return -1;
    }
    if (content != ZSTD_CONTENTSIZE_UNKNOWN && content != dst_len) {
        snprintf(why, n, "%szstd frame says %llu decoded bytes, the block has %zu", what, content, dst_len);
        return -1;
    }
    if (ZSTD_getDictID_fromFrame(src, src_len) != 0) {
        snprintf(why, n, "%szstd frame needs a dictionary (KPK uses none)", what);
        return -1;
    }
    r = ZSTD_findFrameCompressedSize(src, src_len);
    if (ZSTD_isError(r) || r != src_len) {
        snprintf(why, n, "%s%s", what, ZSTD_isError(r) ? ZSTD_getErrorName(r) : "bytes after the end of the zstd frame");
        return -1;
    }
    r = ZSTD_decompressDCtx(dctx, dst, dst_len, src, src_len);
    if (ZSTD_isError(r)) {
        snprintf(why, n, "%szstd: %s", what, ZSTD_getErrorName(r));
        return -1;
    }
    if (r != dst_len) {
        snprintf(why, n, "%sdecoded to %zu bytes, not %zu", what, r, dst_len);
        return -1;
    }
    return 0;
}

int kpk_block_decode_one(const kpk_block *k, const void *stored, void *raw, kpk_err *err)
{
    const uint8_t *s = stored;
    uint8_t *r = raw;
    char why[200] = "";
    struct tls *t;
    switch (k->method) {
    case KPK_METHOD_RAW:
        if (k->stored_len != k->raw_len) {
            kpk_err_set(err, KPK_ECHECKSUM, "a RAW block of %u stored bytes for %u decoded ones", k->stored_len, k->raw_len);
            return -1;
        }
        memcpy(r, s, k->raw_len);
        break;
    case KPK_METHOD_ZSTD:
        if (!(t = tls_get(0))) { kpk_err_set(err, KPK_ENOMEM, "out of memory"); return -1; }
        if (zstd_frame(t->dctx, r, k->raw_len, s, k->stored_len, why, sizeof why, "")) {
            kpk_err_set(err, KPK_ECHECKSUM, "%s", why);
            return -1;
        }
        break;
    case KPK_METHOD_SPLIT2: {
        const size_t h = k->raw_len / 2;
        const uint8_t *plane[2] = {s, s + k->plane0_len};
        const size_t len[2] = {k->plane0_len, k->stored_len - k->plane0_len};
        if (k->raw_len % 2 || k->plane0_len > k->stored_len || (k->planes & ~3u) ||
            (!(k->planes & KPK_PLANE0_ZSTD) && len[0] != h) || (!(k->planes & KPK_PLANE1_ZSTD) && len[1] != h)) {
            kpk_err_set(err, KPK_ECHECKSUM, "SPLIT2 plane lengths %zu + %zu do not fit %u decoded bytes", len[0], len[1],
                        k->raw_len);
            return -1;
        }
        if (!(t = tls_get(k->planes ? k->raw_len : 0))) { kpk_err_set(err, KPK_ENOMEM, "out of memory"); return -1; }
        for (int p = 0; p < 2; p++) {
            if (!(k->planes & (1u << p))) continue; /* stored raw: exactly h bytes */
            if (zstd_frame(t->dctx, t->buf + p * h, h, plane[p], len[p], why, sizeof why, p ? "plane 1: " : "plane 0: ")) {
                kpk_err_set(err, KPK_ECHECKSUM, "%s", why);
                return -1;
            }
            plane[p] = t->buf + p * h;
        }
        /* merged and hashed a piece at a time, while the piece is in L1:
         * one pass over the block's output instead of two */
        XXH3_64bits_reset(t->hash);
        for (size_t at = 0; at < h; at += MERGE_PIECE) {
            size_t n = h - at < MERGE_PIECE ? h - at : MERGE_PIECE;
            kpk_planes_merge(plane[0] + at, plane[1] + at, n, r + 2 * at);
            XXH3_64bits_update(t->hash, r + 2 * at, 2 * n);
        }
        if (XXH3_64bits_digest(t->hash) != k->raw_xxh3) goto mismatch;
        return 0;
    }
    default:
        kpk_err_set(err, KPK_EVERSION, "unsupported method %u", k->method);
        return -1;
    }
    if (XXH3_64bits(r, k->raw_len) == k->raw_xxh3) return 0;
mismatch:
    kpk_err_set(err, KPK_ECHECKSUM, "decoded checksum mismatch");
    return -1;
}

int kpk_block_decode(const kpk_file *f, uint32_t i, uint32_t b, const void *stored, void *raw, kpk_err *err)
{
    kpk_err e = {0};
    if (b >= kpk_extent_block_count(f, i)) return kpk_extent_fail(err, KPK_EINVAL, f, i, "no block %u", b);
    if (kpk_block_decode_one(kpk_extent_blocks(f, i) + b, stored, raw, &e) == 0) return 0;
    return kpk_extent_fail(err, e.code, f, i, "block %u: %s", b, e.msg);
}
