/* Compressed blocks (docs/FORMAT.md §8): decoding one block of a codec-2
 * extent.  Thread-safe: each thread keeps its own zstd context and plane
 * buffer (freed when the thread exits). */
#include "kpk_internal.h"

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

/* ---- per-thread decoding state ------------------------------------------------ */

struct tls { ZSTD_DCtx *dctx; uint8_t *buf; size_t cap; };
static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;

static void tls_free(void *p)
{
    struct tls *t = p;
    if (!t) return;
    ZSTD_freeDCtx(t->dctx);
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
        if (!(t->dctx = ZSTD_createDCtx()) || pthread_setspecific(tls_key, t)) { tls_free(t); return NULL; }
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

int kpk_block_decode(const kpk_file *f, uint32_t i, uint32_t b, const void *stored, void *raw, kpk_err *err)
{
    const kpk_block *k;
    const uint8_t *s = stored;
    uint8_t *r = raw;
    char why[200] = "";
    struct tls *t;
    if (b >= kpk_extent_block_count(f, i)) return kpk_extent_fail(err, KPK_EINVAL, f, i, "no block %u", b);
    k = kpk_extent_blocks(f, i) + b;
    switch (k->method) {
    case KPK_METHOD_RAW:
        memcpy(r, s, k->raw_len);
        break;
    case KPK_METHOD_ZSTD:
        if (!(t = tls_get(0))) return kpk_extent_fail(err, KPK_ENOMEM, f, i, "block %u: out of memory", b);
        if (zstd_frame(t->dctx, r, k->raw_len, s, k->stored_len, why, sizeof why, ""))
            return kpk_extent_fail(err, KPK_ECHECKSUM, f, i, "block %u: %s", b, why);
        break;
    case KPK_METHOD_SPLIT2: {
        const size_t h = k->raw_len / 2;
        const uint8_t *plane[2] = {s, s + k->plane0_len};
        const size_t len[2] = {k->plane0_len, k->stored_len - k->plane0_len};
        if (!(t = tls_get(k->planes ? k->raw_len : 0))) return kpk_extent_fail(err, KPK_ENOMEM, f, i, "block %u: out of memory", b);
        for (int p = 0; p < 2; p++) {
            if (!(k->planes & (1u << p))) continue; /* stored raw: exactly h bytes (checked at open) */
            if (zstd_frame(t->dctx, t->buf + p * h, h, plane[p], len[p], why, sizeof why, p ? "plane 1: " : "plane 0: "))
                return kpk_extent_fail(err, KPK_ECHECKSUM, f, i, "block %u: %s", b, why);
            plane[p] = t->buf + p * h;
        }
        for (size_t j = 0; j < h; j++) {
            r[2 * j] = plane[0][j];
            r[2 * j + 1] = plane[1][j];
        }
        break;
    }
    default:
        return kpk_extent_fail(err, KPK_EVERSION, f, i, "block %u: unsupported method %u", b, k->method);
    }
    if (XXH3_64bits(r, k->raw_len) != k->raw_xxh3)
        return kpk_extent_fail(err, KPK_ECHECKSUM, f, i, "block %u: decoded checksum mismatch", b);
    return 0;
}
