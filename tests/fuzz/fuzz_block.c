/* One codec-2 block (docs/FORMAT.md §8.1) from arbitrary bytes:
 * kpk_block_decode_one on a record built from the input's first 16 bytes
 *
 *   [0] method  [1] planes  [2..4] raw_len  [5..7] plane0_len  [8..15] raw_xxh3
 *
 * (little-endian; raw_len at most 1 MiB, taken modulo that) and stored bytes
 * = the rest.  Checked against a reference decoder written here from §8.1
 * (RAW copy; one zstd frame, exactly the stored bytes, no dictionary, its
 * content size if given = the decoded size; SPLIT2 planes raw or zstd, merged
 * byte by byte):
 *  - decode succeeds exactly when the reference does and the decoded XXH3 is
 *    the record's; then it wrote exactly the reference's raw_len bytes;
 *  - a failure has a known code and a message;
 *  - re-sealed: where the reference decodes, the record with raw_xxh3 of its
 *    output must decode to that output (so mutations reach the checks behind
 *    the hash);
 *  - the writer's round trip: the stored bytes, taken as raw bytes, encoded by
 *    kpk_encode_block (recipe: method & 3, pack's default levels) decode back
 *    to themselves with a method the recipe allows; then one byte of the
 *    encoded form is changed (at plane0_len modulo the stored length, xor
 *    planes, or 0x80) and that decodes as the reference says, as given and
 *    re-sealed.
 * Buffers are exactly as long as the record says, so ASan sees any read or
 * write outside them. */
#include "fuzz.h"

#include "format/kpk_encode.h"
#include "format/kpk_reader.h"
#include "pack/blocks.h"

#include <string.h>
#include <xxhash.h>
#include <zstd.h>

#define HDR 16
#define RAW_MAX ((uint32_t)1 << 20)

static kpk_encoder *enc;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    kp_codec_opts o;
    (void)argc;
    (void)argv;
    kp_codec_defaults(&o);
    if (!(enc = kp_encoder_new(&o))) {
        fprintf(stderr, "fuzz_block: out of memory\n");
        exit(2);
    }
    return 0;
}

static uint32_t get24(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16; }
static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

/* ---- the reference (§8.1) ---- */

/* one zstd frame of exactly src_len bytes whose content is exactly dst_len bytes */
static int ref_frame(uint8_t *dst, size_t dst_len, const uint8_t *src, size_t src_len)
{
    unsigned long long content;
    if (src_len < 4 || (get24(src) | (uint32_t)src[3] << 24) != ZSTD_MAGICNUMBER) return -1; /* not a skippable frame */
    content = ZSTD_getFrameContentSize(src, src_len);
    if (content == ZSTD_CONTENTSIZE_ERROR || (content != ZSTD_CONTENTSIZE_UNKNOWN && content != dst_len)) return -1;
    if (ZSTD_getDictID_fromFrame(src, src_len) != 0 || ZSTD_findFrameCompressedSize(src, src_len) != src_len) return -1;
    return ZSTD_decompress(dst, dst_len, src, src_len) == dst_len ? 0 : -1;
}

/* 0 and out[raw_len] decoded, or -1 */
static int ref_decode(const kpk_block *k, const uint8_t *s, uint8_t *out)
{
    switch (k->method) {
    case KPK_METHOD_RAW:
        if (k->stored_len != k->raw_len) return -1;
        memcpy(out, s, k->raw_len);
        return 0;
    case KPK_METHOD_ZSTD:
        return ref_frame(out, k->raw_len, s, k->stored_len);
    case KPK_METHOD_SPLIT2: {
        size_t h = k->raw_len / 2, len[2];
        const uint8_t *src[2];
        uint8_t *plane[2];
        int rc = 0;
        if (k->raw_len % 2 || k->planes > 3 || k->plane0_len > k->stored_len) return -1;
        len[0] = k->plane0_len;
        len[1] = k->stored_len - k->plane0_len;
        src[0] = s;
        src[1] = s + k->plane0_len;
        plane[0] = malloc(h + 1);
        plane[1] = malloc(h + 1);
        FUZZ_CHECK(plane[0] && plane[1]);
        for (int p = 0; p < 2 && !rc; p++) {
            if (k->planes >> p & 1) rc = ref_frame(plane[p], h, src[p], len[p]);
            else if (len[p] != h) rc = -1;
            else memcpy(plane[p], src[p], h);
        }
        for (size_t j = 0; j < h && !rc; j++) {
            out[2 * j] = plane[0][j];
            out[2 * j + 1] = plane[1][j];
        }
        free(plane[0]);
        free(plane[1]);
        return rc;
    }
    default:
        return -1;
    }
}

static int code_known(int c) { return c > KPK_OK && c <= KPK_EINVAL; }

/* Decode k over stored (copied to a buffer of exactly stored_len bytes) and
 * check it against the reference.  Returns 1 if it decoded; with reseal, the
 * reference's output hash is put into the record first. */
static int check_block(kpk_block k, const uint8_t *stored, int reseal)
{
    uint8_t *s = malloc(k.stored_len ? k.stored_len : 1), *raw = malloc(k.raw_len ? k.raw_len : 1),
            *ref = malloc(k.raw_len ? k.raw_len : 1);
    kpk_err e = {0};
    int ref_ok, ok;
    FUZZ_CHECK(s && raw && ref);
    memcpy(s, stored, k.stored_len);
    ref_ok = ref_decode(&k, s, ref) == 0;
    if (reseal && ref_ok) k.raw_xxh3 = XXH3_64bits(ref, k.raw_len);
    if (ref_ok) ref_ok = XXH3_64bits(ref, k.raw_len) == k.raw_xxh3;
    ok = kpk_block_decode_one(&k, s, raw, &e) == 0;
    if (ok) {
        FUZZ_CHECK(ref_ok);
        FUZZ_CHECK(XXH3_64bits(raw, k.raw_len) == k.raw_xxh3);
        FUZZ_CHECK(k.raw_len == 0 || memcmp(raw, ref, k.raw_len) == 0);
    } else {
        FUZZ_CHECK(code_known(e.code) && e.msg[0]);
        FUZZ_CHECK(!ref_ok); /* the reference decodes it: the decoder must too */
    }
    free(s);
    free(raw);
    free(ref);
    return ok;
}

/* The writer's round trip on n raw bytes, then one changed byte. */
static void check_encode(const uint8_t *raw, size_t n, int recipe, uint32_t at, uint8_t x)
{
    size_t cap;
    uint8_t *out, *back;
    kpk_block k;
    kpk_err e = {0};
    if (recipe == KPK_ENC_PLANES) n &= ~(size_t)1;
    if (n == 0) return;
    cap = kpk_encode_bound(n);
    out = malloc(cap);
    back = malloc(n);
    FUZZ_CHECK(out && back);
    memset(&k, 0, sizeof k);
    FUZZ_CHECK(kpk_encode_block(enc, recipe, raw, n, out, cap, &k) == 0);
    FUZZ_CHECK(k.raw_len == n && k.stored_len <= cap && k.raw_xxh3 == XXH3_64bits(raw, n));
    switch (recipe) {
    case KPK_ENC_RAW: FUZZ_CHECK(k.method == KPK_METHOD_RAW); break;
    case KPK_ENC_PLANES: FUZZ_CHECK(k.method == KPK_METHOD_SPLIT2 || k.method == KPK_METHOD_RAW); break;
    default: FUZZ_CHECK(k.method == KPK_METHOD_ZSTD || k.method == KPK_METHOD_RAW); break;
    }
    FUZZ_CHECK(kpk_block_decode_one(&k, out, back, &e) == 0 && memcmp(back, raw, n) == 0);
    FUZZ_CHECK(check_block(k, out, 0));
    if (k.stored_len) {
        out[at % k.stored_len] ^= x ? x : 0x80;
        check_block(k, out, 0);
        check_block(k, out, 1);
    }
    free(out);
    free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kpk_block k;
    if (size < HDR) return 0;
    memset(&k, 0, sizeof k);
    k.method = data[0];
    k.planes = data[1];
    k.raw_len = get24(data + 2) % (RAW_MAX + 1);
    k.plane0_len = get24(data + 5);
    k.raw_xxh3 = get64(data + 8);
    k.stored_len = (uint32_t)(size - HDR);
    if (check_block(k, data + HDR, 0)) fuzz_accepted++; /* counted as given */
    check_block(k, data + HDR, 1);
    check_encode(data + HDR, size - HDR, data[0] & 3, k.plane0_len, data[1]);
    return 0;
}
