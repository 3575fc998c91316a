/* Cutting extents into codec-2 blocks (blocks.h). */
#include "blocks.h"

#include "format/k3_schema.h"
#include "format/kpk_encode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kp_codec_defaults(kp_codec_opts *o)
{
    o->compress = KP_COMPRESS_NONE;
    o->block_size = KP_BLOCK_SIZE_DEFAULT;
    o->level = KP_LEVEL_DEFAULT;
    o->literal_level = KP_LITERAL_LEVEL_DEFAULT;
    o->min_saving = KP_MIN_SAVING_DEFAULT;
}

kpk_encoder *kp_encoder_new(const kp_codec_opts *o) { return kpk_encoder_new(o->level, o->literal_level, o->min_saving); }

static const char *const compress_names[] = {"none", "trunk", "all"};

const char *kp_compress_name(int c) { return c >= 0 && c <= KP_COMPRESS_ALL ? compress_names[c] : "?"; }

int kp_compress_parse(const char *s)
{
    for (int c = 0; c <= KP_COMPRESS_ALL; c++)
        if (strcmp(s, compress_names[c]) == 0) return c;
    return -1;
}

const char *kp_class_name(int cls)
{
    static const char *const n[KP_BC_COUNT] = {"embedding rows", "BF16 planes", "MXFP4 codes", "MXFP4 scales", "other"};
    return cls >= 0 && cls < KP_BC_COUNT ? n[cls] : "?";
}

int kp_class_recipe(int cls)
{
    switch (cls) {
    case KP_BC_ROWS: return KPK_ENC_RAW;
    case KP_BC_PLANES: return KPK_ENC_PLANES;
    case KP_BC_CODES: case KP_BC_SCALES: return KPK_ENC_LITERALS;
    default: return KPK_ENC_BYTES;
    }
}

int kp_kind_compressed(const kp_codec_opts *o, int kind)
{
    if (o->compress == KP_COMPRESS_ALL) return 1;
    if (o->compress == KP_COMPRESS_TRUNK) return kind == KPK_KIND_GLOBALS || kind == KPK_KIND_TRUNK;
    return 0;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int tensor_class(const kpk_tensor *t)
{
    if (strcmp(t->name, k3_role_suffix(K3T_EMBED)) == 0) return KP_BC_ROWS;
    if (t->dtype == KPK_DT_BF16 || t->dtype == KPK_DT_F16) return KP_BC_PLANES;
    if (t->dtype == KPK_DT_U8 && ends_with(t->name, ".weight_packed")) return KP_BC_CODES;
    if (t->dtype == KPK_DT_U8 && ends_with(t->name, ".weight_scale")) return KP_BC_SCALES;
    return KP_BC_OTHER;
}

int kp_cut_blocks(const kp_codec_opts *o, const kpk_tensor *t, uint64_t n, uint64_t raw_len, kp_cut **cuts,
                  uint32_t *n_cuts, char *err, size_t errlen)
{
    kp_cut *c = NULL;
    uint64_t cap = 0, k = 0;
    *cuts = NULL;
    *n_cuts = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t rows, row, nb;
        /* this tensor's blocks run to the next non-empty tensor, or to the end */
        uint64_t end = raw_len;
        if (!t[i].nbytes) continue;
        for (uint64_t j = i + 1; j < n; j++)
            if (t[j].nbytes) { end = t[j].offset; break; }
        rows = t[i].ndim > 1 ? t[i].shape[0] : t[i].nbytes / kpk_dtype_size(t[i].dtype);
        if (!rows) rows = 1;
        row = t[i].nbytes / rows;
        if (row > KPK_MAX_BLOCK_RAW / 2) {
            snprintf(err, errlen, "tensor %s: a row of %llu bytes is longer than a block may be", t[i].name,
                     (unsigned long long)row);
            free(c);
            return -1;
        }
        nb = (t[i].nbytes + o->block_size - 1) / o->block_size;
        if (nb > rows) nb = rows;
        if (k + nb > cap) {
            kp_cut *g;
            cap = (k + nb) * 2 + 16;
            if (!(g = realloc(c, sizeof *c * cap))) { snprintf(err, errlen, "out of memory"); free(c); return -1; }
            c = g;
        }
        /* nb blocks of equal rows (the first ones one row longer); the first
         * one also takes the bytes before the tensor when it is the first */
        for (uint64_t b = 0; b < nb; b++) {
            uint64_t r0 = rows * b / nb, r1 = rows * (b + 1) / nb;
            uint64_t a = k == 0 ? 0 : t[i].offset + r0 * row;
            uint64_t z = b + 1 == nb ? end : t[i].offset + r1 * row;
            c[k].raw_off = a;
            c[k].raw_len = (uint32_t)(z - a);
            c[k].cls = (uint8_t)tensor_class(&t[i]);
            k++;
        }
    }
    *cuts = c;
    *n_cuts = (uint32_t)k;
    return 0;
}
