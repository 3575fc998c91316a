/* Encoding one codec-2 block (kpk_encode.h). */
#include "kpk_encode.h"

/* ZSTD_c_literalCompressionMode is an experimental parameter (zstd >= 1.5.1) */
#define ZSTD_STATIC_LINKING_ONLY

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <zstd.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

struct kpk_encoder {
    ZSTD_CCtx *cctx;
    int level, literal_level;
    double min_saving;
    uint8_t *plane;          /* KPK_MAX_BLOCK_RAW: both planes of one block */
};

kpk_encoder *kpk_encoder_new(int level, int literal_level, double min_saving)
{
    kpk_encoder *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->level = level;
    e->literal_level = literal_level;
    e->min_saving = min_saving;
    e->cctx = ZSTD_createCCtx();
    e->plane = malloc(KPK_MAX_BLOCK_RAW);
    /* Fixed frame parameters: the content size is written (the reader checks
     * it), no checksum (the block record has raw_xxh3), no dictionary, one
     * thread: the same bytes from any number of encoders. */
    if (!e->cctx || !e->plane || ZSTD_isError(ZSTD_CCtx_setParameter(e->cctx, ZSTD_c_compressionLevel, level)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(e->cctx, ZSTD_c_contentSizeFlag, 1)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(e->cctx, ZSTD_c_checksumFlag, 0)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(e->cctx, ZSTD_c_dictIDFlag, 0)) ||
        /* literals are always Huffman-coded, at negative levels too: byte
         * planes are nearly all literals, and their entropy is the gain */
        ZSTD_isError(ZSTD_CCtx_setParameter(e->cctx, ZSTD_c_literalCompressionMode, ZSTD_ps_enable))) {
        kpk_encoder_free(e);
        return NULL;
    }
    return e;
}

void kpk_encoder_free(kpk_encoder *e)
{
    if (!e) return;
    ZSTD_freeCCtx(e->cctx);
    free(e->plane);
    free(e);
}

size_t kpk_encode_bound(size_t raw_len)
{
    /* two frames (one per plane) cost at most two frame overheads */
    return ZSTD_compressBound(raw_len) + 2 * ZSTD_compressBound(0) + 64;
}

void kpk_planes_split(const uint8_t *raw, size_t n, uint8_t *lo, uint8_t *hi)
{
    size_t j = 0;
#if defined(__SSE2__)
    const __m128i mask = _mm_set1_epi16(0x00FF);
    for (; j + 16 <= n; j += 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(raw + 2 * j));
        __m128i b = _mm_loadu_si128((const __m128i *)(raw + 2 * j + 16));
        _mm_storeu_si128((__m128i *)(lo + j), _mm_packus_epi16(_mm_and_si128(a, mask), _mm_and_si128(b, mask)));
        _mm_storeu_si128((__m128i *)(hi + j), _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8)));
    }
#endif
    for (; j < n; j++) {
        lo[j] = raw[2 * j];
        hi[j] = raw[2 * j + 1];
    }
}

void kpk_planes_merge(const uint8_t *lo, const uint8_t *hi, size_t n, uint8_t *raw)
{
    size_t j = 0;
#if defined(__SSE2__)
    for (; j + 16 <= n; j += 16) {
        __m128i l = _mm_loadu_si128((const __m128i *)(lo + j)), h = _mm_loadu_si128((const __m128i *)(hi + j));
        _mm_storeu_si128((__m128i *)(raw + 2 * j), _mm_unpacklo_epi8(l, h));
        _mm_storeu_si128((__m128i *)(raw + 2 * j + 16), _mm_unpackhi_epi8(l, h));
    }
#endif
    for (; j < n; j++) {
        raw[2 * j] = lo[j];
        raw[2 * j + 1] = hi[j];
    }
}

/* src coded into dst as one frame at level if that saves at least
 * min_saving, else copied; returns the stored length, *coded says which, 0
 * on a zstd error. */
static size_t code_or_copy(kpk_encoder *e, int level, const uint8_t *src, size_t n, uint8_t *dst, size_t cap, int *coded)
{
    size_t r;
    if (ZSTD_isError(ZSTD_CCtx_setParameter(e->cctx, ZSTD_c_compressionLevel, level))) return 0;
    r = ZSTD_compress2(e->cctx, dst, cap, src, n);
    if (ZSTD_isError(r)) return 0;
    *coded = (double)r <= (double)n * (1.0 - e->min_saving) && r < n;
    if (!*coded) memcpy(dst, src, n);
    return *coded ? r : n;
}

int kpk_encode_block(kpk_encoder *e, int recipe, const void *raw, size_t raw_len, void *out, size_t cap, kpk_block *rec)
{
    uint8_t *o = out;
    int coded = 0;
    if (raw_len == 0 || raw_len > KPK_MAX_BLOCK_RAW || cap < kpk_encode_bound(raw_len)) return -1;
    rec->raw_len = (uint32_t)raw_len;
    rec->raw_xxh3 = XXH3_64bits(raw, raw_len);
    rec->planes = 0;
    rec->plane0_len = 0;
    switch (recipe) {
    case KPK_ENC_PLANES: {
        const size_t h = raw_len / 2;
        size_t n0, n1;
        int c0 = 0, c1 = 0;
        if (raw_len % 2) return -1;
        kpk_planes_split(raw, h, e->plane, e->plane + h);
        if (!(n0 = code_or_copy(e, e->literal_level, e->plane, h, o, cap, &c0))) return -1;
        if (!(n1 = code_or_copy(e, e->literal_level, e->plane + h, h, o + n0, cap - n0, &c1))) return -1;
        if (c0 || c1) {
            rec->method = KPK_METHOD_SPLIT2;
            rec->planes = (uint8_t)((c0 ? KPK_PLANE0_ZSTD : 0) | (c1 ? KPK_PLANE1_ZSTD : 0));
            rec->plane0_len = (uint32_t)n0;
            rec->stored_len = (uint32_t)(n0 + n1);
            return 0;
        }
        break; /* neither plane pays: RAW reads without a merge */
    }
    case KPK_ENC_LITERALS:
    case KPK_ENC_BYTES: {
        size_t n = code_or_copy(e, recipe == KPK_ENC_LITERALS ? e->literal_level : e->level, raw, raw_len, o, cap, &coded);
        if (!n) return -1;
        if (coded) {
            rec->method = KPK_METHOD_ZSTD;
            rec->stored_len = (uint32_t)n;
            return 0;
        }
        break;
    }
    case KPK_ENC_RAW:
        break;
    default:
        return -1;
    }
    memcpy(o, raw, raw_len);
    rec->method = KPK_METHOD_RAW;
    rec->stored_len = (uint32_t)raw_len;
    return 0;
}
