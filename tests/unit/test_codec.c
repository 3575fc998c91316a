/* Codec 2 without a file (docs/FORMAT.md §8): the block encoder
 * (format/kpk_encode.c) against a plain reading of the format (planes split
 * by index, RAW copied, each zstd frame decoded by zstd itself), and the
 * block cutter (pack/blocks.c) against the §8.1 rules checked independently:
 * blocks tile the extent, never cross a tensor, end on rows, SPLIT2 blocks
 * are even.  Inputs are chosen so a plausible bug fails: planes that code
 * and planes that do not, odd sizes, tensors with gaps and rows that do not
 * divide the block size. */
#include "check.h"

#include "format/kpk_encode.h"
#include "format/kpk_reader.h"
#include "pack/blocks.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <xxhash.h>
#include <zstd.h>

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

/* BF16-like data: a few exponents (the high bytes code well), random mantissas. */
static void bf16ish(uint8_t *p, size_t n)
{
    for (size_t i = 0; i + 1 < n; i += 2) {
        uint64_t r = next();
        p[i] = (uint8_t)r;
        p[i + 1] = (uint8_t)(0x3C + (r >> 8) % 3) | (uint8_t)((r >> 16) & 0x80);
    }
}

/* The block's decoded bytes, read from the format's text: planes by index. */
static int reference_decode(const kpk_block *b, const uint8_t *s, uint8_t *out)
{
    if (b->method == KPK_METHOD_RAW) { memcpy(out, s, b->raw_len); return b->stored_len == b->raw_len ? 0 : -1; }
    if (b->method == KPK_METHOD_ZSTD) return ZSTD_decompress(out, b->raw_len, s, b->stored_len) == b->raw_len ? 0 : -1;
    {
        size_t h = b->raw_len / 2, len[2] = {b->plane0_len, b->stored_len - b->plane0_len};
        const uint8_t *src[2] = {s, s + b->plane0_len};
        uint8_t *pl[2] = {malloc(h + 1), malloc(h + 1)};
        int rc = 0;
        for (int q = 0; q < 2; q++) {
            if (b->planes & (1u << q)) rc |= ZSTD_decompress(pl[q], h, src[q], len[q]) == h ? 0 : -1;
            else if (len[q] == h) memcpy(pl[q], src[q], h);
            else rc = -1;
        }
        for (size_t j = 0; j < h; j++) { out[2 * j] = pl[0][j]; out[2 * j + 1] = pl[1][j]; }
        free(pl[0]);
        free(pl[1]);
        return rc;
    }
}

static void roundtrip(kpk_encoder *e, int recipe, const uint8_t *raw, size_t n, const char *what, int want_method, int want_planes)
{
    size_t cap = kpk_encode_bound(n);
    uint8_t *out = malloc(cap), *back = malloc(n + 1), *lib = malloc(n + 1);
    kpk_block b = {0};
    kpk_err err = {0};
    int rc = kpk_encode_block(e, recipe, raw, n, out, cap, &b);
    CHECK(rc == 0 && b.raw_len == n && b.raw_xxh3 == XXH3_64bits(raw, n), "%s: encoded, raw_len and raw_xxh3 recorded", what);
    CHECK(b.stored_len <= n, "%s: never stored larger than raw (%u <= %zu)", what, b.stored_len, n);
    CHECK(want_method < 0 || b.method == want_method, "%s: method %s (wanted %s)", what, kpk_method_name(b.method),
          want_method < 0 ? "any" : kpk_method_name(want_method));
    CHECK(want_planes < 0 || b.planes == want_planes, "%s: planes %u (wanted %d)", what, b.planes, want_planes);
    CHECK(reference_decode(&b, out, back) == 0 && memcmp(back, raw, n) == 0, "%s: the format's reading gives the raw bytes back", what);
    CHECK(kpk_block_decode_one(&b, out, lib, &err) == 0 && memcmp(lib, raw, n) == 0, "%s: the library's decoder too%s%s", what,
          err.msg[0] ? ": " : "", err.msg);
    free(out);
    free(back);
    free(lib);
}

static void test_encoder(void)
{
    const size_t N = 1 << 20;
    uint8_t *a = malloc(N), *o1, *o2;
    kpk_encoder *e = kpk_encoder_new(KP_LEVEL_DEFAULT, KP_LITERAL_LEVEL_DEFAULT, KP_MIN_SAVING_DEFAULT), *e2 = kpk_encoder_new(KP_LEVEL_DEFAULT, KP_LITERAL_LEVEL_DEFAULT, KP_MIN_SAVING_DEFAULT);
    kpk_block b1, b2;
    bf16ish(a, N);
    roundtrip(e, KPK_ENC_PLANES, a, N, "BF16-like planes", KPK_METHOD_SPLIT2, KPK_PLANE1_ZSTD);
    roundtrip(e, KPK_ENC_RAW, a, N, "RAW recipe", KPK_METHOD_RAW, 0);
    for (size_t i = 0; i < N; i++) a[i] = (uint8_t)next();
    roundtrip(e, KPK_ENC_PLANES, a, N, "random bytes as planes: neither plane pays, stored RAW", KPK_METHOD_RAW, 0);
    roundtrip(e, KPK_ENC_BYTES, a, N, "random bytes: RAW", KPK_METHOD_RAW, 0);
    for (size_t i = 0; i < N; i++) a[i] = (uint8_t)(i % 7 == 0 ? next() : 0);
    roundtrip(e, KPK_ENC_BYTES, a, N, "mostly zeros: ZSTD", KPK_METHOD_ZSTD, 0);
    for (size_t i = 0; i < N; i++) { uint64_t r = next(); a[i] = (uint8_t)(122 + (r & 1) + ((r >> 1) & 1) + ((r >> 2) & 1)); }
    roundtrip(e, KPK_ENC_LITERALS, a, N, "scale-like bytes as literals: ZSTD", KPK_METHOD_ZSTD, 0);
    for (size_t i = 0; i < N; i += 2) { a[i] = 0; a[i + 1] = (uint8_t)next(); }
    roundtrip(e, KPK_ENC_PLANES, a, N, "low plane zero, high plane random: only plane 0 coded", KPK_METHOD_SPLIT2, KPK_PLANE0_ZSTD);
    memset(a, 0, N);
    roundtrip(e, KPK_ENC_PLANES, a, N, "all zeros: both planes coded", KPK_METHOD_SPLIT2, KPK_PLANE0_ZSTD | KPK_PLANE1_ZSTD);
    roundtrip(e, KPK_ENC_BYTES, a, 1, "one byte", -1, -1);
    roundtrip(e, KPK_ENC_PLANES, a, 2, "one 16-bit value", -1, -1);
    bf16ish(a, 4098);
    roundtrip(e, KPK_ENC_PLANES, a, 4098, "an odd number of pairs (the vector tail)", -1, -1);
    roundtrip(e, KPK_ENC_BYTES, a, 4097, "an odd length", -1, -1);
    {
        uint8_t small[8192];
        CHECK(kpk_encode_block(e, KPK_ENC_PLANES, a, 3, small, sizeof small, &b1) == -1, "an odd length as planes is refused");
    }
    /* min_saving: a block that codes to 0.96 of its size is stored raw at 5 %, coded at 0 % */
    {
        kpk_encoder *z = kpk_encoder_new(KP_LEVEL_DEFAULT, KP_LITERAL_LEVEL_DEFAULT, 0.0);
        uint8_t *o = malloc(kpk_encode_bound(N));
        for (size_t i = 0; i < N; i++) a[i] = next() % 100 < 8 ? 0 : (uint8_t)next(); /* ~7.7 bits a byte */
        kpk_encode_block(e, KPK_ENC_BYTES, a, N, o, kpk_encode_bound(N), &b1);
        kpk_encode_block(z, KPK_ENC_BYTES, a, N, o, kpk_encode_bound(N), &b2);
        CHECK(b1.method == KPK_METHOD_RAW && b2.method == KPK_METHOD_ZSTD && b2.stored_len > N * 0.95,
              "a block saving %.1f %% is RAW below the %.0f %% threshold and ZSTD without one",
              100.0 * (1.0 - (double)b2.stored_len / (double)N), KP_MIN_SAVING_DEFAULT * 100);
        kpk_encoder_free(z);
        free(o);
    }
    /* the same bytes from two encoders (and the second time from the same one) */
    bf16ish(a, N);
    o1 = malloc(kpk_encode_bound(N));
    o2 = malloc(kpk_encode_bound(N));
    kpk_encode_block(e, KPK_ENC_PLANES, a, N, o1, kpk_encode_bound(N), &b1);
    kpk_encode_block(e2, KPK_ENC_BYTES, a, N, o2, kpk_encode_bound(N), &b2); /* e2 used otherwise first */
    kpk_encode_block(e2, KPK_ENC_PLANES, a, N, o2, kpk_encode_bound(N), &b2);
    CHECK(b1.stored_len == b2.stored_len && memcmp(o1, o2, b1.stored_len) == 0, "two encoders give the same stored bytes");
    /* damage is caught by the decoder, never by a crash */
    {
        kpk_err err = {0};
        uint8_t *raw = malloc(N);
        kpk_block bad = b1;
        o1[b1.plane0_len + 1] ^= 0xFF; /* inside plane 1's frame header */
        CHECK(kpk_block_decode_one(&b1, o1, raw, &err) == -1 && err.code == KPK_ECHECKSUM, "a damaged frame: %s", err.msg);
        o1[b1.plane0_len + 1] ^= 0xFF;
        bad.plane0_len = b1.plane0_len - 1;
        CHECK(kpk_block_decode_one(&bad, o1, raw, &err) == -1, "a raw plane of the wrong length: %s", err.msg);
        bad = b1;
        bad.method = 7;
        CHECK(kpk_block_decode_one(&bad, o1, raw, &err) == -1 && err.code == KPK_EVERSION, "an unknown method: %s", err.msg);
        o1[7] ^= 1; /* plane 0 is raw: a flipped mantissa bit decodes, the checksum catches it */
        CHECK(kpk_block_decode_one(&b1, o1, raw, &err) == -1 && strstr(err.msg, "decoded checksum mismatch"), "a flipped bit in a raw plane: %s", err.msg);
        free(raw);
    }
    kpk_encoder_free(e);
    kpk_encoder_free(e2);
    free(o1);
    free(o2);
    free(a);
}

/* The §8.1 rules and kpack's own, checked without blocks.c's logic. */
static int cuts_ok(const kpk_tensor *t, int n, uint64_t raw_len, const kp_cut *c, uint32_t nc, uint32_t bs, char *why, size_t wl)
{
    uint64_t at = 0;
    for (uint32_t k = 0; k < nc; k++) {
        uint64_t a = c[k].raw_off, z = a + c[k].raw_len, row_here = 0;
        if (a != at) { snprintf(why, wl, "block %u starts at %llu, not %llu", k, (unsigned long long)a, (unsigned long long)at); return 0; }
        for (int i = 0; i < n; i++) {
            if (!t[i].nbytes) continue;
            uint64_t row = t[i].nbytes / (t[i].ndim > 1 ? t[i].shape[0] : t[i].nbytes / kpk_dtype_size(t[i].dtype));
            uint64_t ts = t[i].offset, te = t[i].offset + t[i].nbytes;
            if (a > ts && a < te && (a - ts) % row) { snprintf(why, wl, "block %u starts inside a row of %s", k, t[i].name); return 0; }
            if (a < ts && z > ts && t[i].nbytes) { snprintf(why, wl, "block %u crosses into %s", k, t[i].name); return 0; }
            if (a >= ts && a < te && c[k].cls == KP_BC_PLANES && (c[k].raw_len % 2)) { snprintf(why, wl, "SPLIT2 block %u is odd", k); return 0; }
            if (a >= ts && a < te) row_here = row;
        }
        /* about the block size: at most one row and a gap more (a row is never split) */
        if (c[k].raw_len > bs + row_here + 64) { snprintf(why, wl, "block %u is %u bytes", k, c[k].raw_len); return 0; }
        at = z;
    }
    if (at != raw_len) { snprintf(why, wl, "blocks end at %llu, the extent at %llu", (unsigned long long)at, (unsigned long long)raw_len); return 0; }
    return 1;
}

static void test_cuts(void)
{
    /* an extent of tensors of awkward sizes, 64-byte aligned with zero gaps */
    struct { const char *name; int dtype, ndim; uint64_t s0, s1; } spec[] = {
        {"language_model.model.layers.0.input_layernorm.weight", KPK_DT_BF16, 1, 7168, 0},
        {"language_model.model.layers.0.self_attn.q_proj.weight", KPK_DT_BF16, 2, 1000, 333},
        {"language_model.model.layers.0.mlp.gate.e_score_correction_bias", KPK_DT_F32, 1, 97, 0},
        {"language_model.model.layers.0.block_sparse_moe.experts.3.w1.weight_packed", KPK_DT_U8, 2, 3001, 1536},
        {"language_model.model.layers.0.block_sparse_moe.experts.3.w1.weight_scale", KPK_DT_U8, 2, 3001, 96},
        {"language_model.model.embed_tokens.weight", KPK_DT_BF16, 2, 4099, 7168},
        {"language_model.model.layers.0.empty", KPK_DT_BF16, 2, 0, 16},
        {"language_model.model.layers.0.mlp.down_proj.weight", KPK_DT_BF16, 2, 7, 300001},
    };
    enum { NT = sizeof spec / sizeof spec[0] };
    kpk_tensor t[NT];
    uint64_t raw = 0;
    uint32_t sizes[] = {64 << 10, 1 << 20, 2 << 20, 4 << 20};
    for (int i = 0; i < NT; i++) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].name = spec[i].name;
        t[i].dtype = (uint8_t)spec[i].dtype;
        t[i].ndim = (uint8_t)spec[i].ndim;
        t[i].shape[0] = spec[i].s0;
        t[i].shape[1] = spec[i].s1;
        t[i].nbytes = spec[i].s0 * (spec[i].ndim > 1 ? spec[i].s1 : 1) * kpk_dtype_size(spec[i].dtype);
        t[i].offset = (raw + 63) / 64 * 64;
        raw = t[i].offset + t[i].nbytes;
    }
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        kp_codec_opts o;
        kp_cut *c;
        uint32_t nc;
        char err[200] = "", why[200] = "";
        int classes[KP_BC_COUNT] = {0};
        kp_codec_defaults(&o);
        o.block_size = sizes[s];
        CHECK(kp_cut_blocks(&o, t, NT, raw, &c, &nc, err, sizeof err) == 0, "cut at %u KiB%s", sizes[s] >> 10, err);
        CHECK(cuts_ok(t, NT, raw, c, nc, sizes[s], why, sizeof why), "blocks of %u KiB: tile the extent, whole rows, no tensor crossed, SPLIT2 even%s%s",
              sizes[s] >> 10, why[0] ? ": " : "", why);
        for (uint32_t k = 0; k < nc; k++) classes[c[k].cls]++;
        CHECK(classes[KP_BC_ROWS] && classes[KP_BC_PLANES] && classes[KP_BC_CODES] && classes[KP_BC_SCALES] && classes[KP_BC_OTHER],
              "blocks of %u KiB: every class from its tensor (embedding rows, planes, codes, scales, other)", sizes[s] >> 10);
        free(c);
    }
    {   /* a row longer than a block may be is refused, named */
        kp_codec_opts o;
        kp_cut *c;
        uint32_t nc;
        char err[200] = "";
        kpk_tensor big = t[1];
        big.shape[0] = 1;
        big.shape[1] = (KPK_MAX_BLOCK_RAW / 2 + 2) / 2;
        big.nbytes = big.shape[1] * 2;
        big.offset = 0;
        kp_codec_defaults(&o);
        CHECK(kp_cut_blocks(&o, &big, 1, big.nbytes, &c, &nc, err, sizeof err) == -1 && strstr(err, "q_proj"),
              "a row longer than a block may be: %s", err);
    }
}

int main(void)
{
    test_encoder();
    test_cuts();
    return check_exit();
}
