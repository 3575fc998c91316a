#include "safetensors.h"

#include "format/kio.h"
#include "format/kpk.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The released headers are ~0.8 MB; anything past this is not a header. */
#define ST_MAX_HEADER ((uint64_t)256 << 20)

static int cmp_begin(const void *a, const void *b)
{
    const st_tensor *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* Every dtype of the safetensors format (its Dtype enum), with its size in
 * bits; the four a KPK file stores as such carry their KPK dtype. */
static const struct { const char *name; unsigned bits; int kpk; } st_dtypes[] = {
    {"BOOL", 8, 0},     {"U8", 8, KPK_DT_U8}, {"I8", 8, 0},       {"F8_E5M2", 8, 0},      {"F8_E4M3", 8, 0},
    {"F8_E8M0", 8, 0},  {"F8_E4M3FNUZ", 8, 0}, {"F8_E5M2FNUZ", 8, 0}, {"F4", 4, 0},    {"F6_E2M3", 6, 0},
    {"F6_E3M2", 6, 0},  {"I16", 16, 0},       {"U16", 16, 0},    {"F16", 16, KPK_DT_F16}, {"BF16", 16, KPK_DT_BF16},
    {"I32", 32, 0},     {"U32", 32, 0},       {"F32", 32, KPK_DT_F32}, {"C64", 64, 0},  {"F64", 64, 0},
    {"I64", 64, 0},     {"U64", 64, 0},
};

unsigned st_dtype_bits(const char *name, int *kpk_dtype)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(name, st_dtypes[i].name) == 0) {
            if (kpk_dtype) *kpk_dtype = st_dtypes[i].kpk;
            return st_dtypes[i].bits;
        }
    return 0;
}

static const char *st_dtype_static(const char *name)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(name, st_dtypes[i].name) == 0) return st_dtypes[i].name;
    return NULL;
}

void st_free(st_file *f)
{
    if (!f) return;
    free(f->path);
    free(f->t);
    free(f->arena);
    memset(f, 0, sizeof *f);
}

/* The header's JSON (f->header_len bytes at hdr; f->path and f->data_start
 * set) into f's tensors, checked. */
static int parse_json(st_file *f, const char *hdr, char *err, size_t errlen)
{
    const char *path = f->path;
    json_t *root = NULL;
    json_error_t jerr;
    const char *key;
    json_t *val;
    size_t arena_len = 0, arena_at = 0, i;
    int rc = -1;

    root = json_loadb(hdr, f->header_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) { snprintf(err, errlen, "%s: malformed header JSON at byte %d: %s", path, jerr.position, jerr.text); goto out; }
    if (!json_is_object(root)) { snprintf(err, errlen, "%s: header is not a JSON object", path); goto out; }

    json_object_foreach(root, key, val) arena_len += strlen(key) + 1;
    f->t = calloc(json_object_size(root) + 1, sizeof *f->t);
    f->arena = malloc(arena_len + 1);
    if (!f->t || !f->arena) { snprintf(err, errlen, "%s: out of memory", path); goto out; }

    json_object_foreach(root, key, val) {
        st_tensor *t = &f->t[f->n];
        json_t *dt, *shape, *offs, *v;
        uint64_t numel = 1, a, b, nbytes;
        size_t j;
        if (strcmp(key, "__metadata__") == 0) {
            /* the format's metadata is a map of strings; anything else is not a safetensors header */
            const char *mk;
            json_t *mv;
            if (!json_is_object(val)) { snprintf(err, errlen, "%s: __metadata__ is not a JSON object (the safetensors format requires a map of strings)", path); goto out; }
            json_object_foreach(val, mk, mv)
                if (!json_is_string(mv)) { snprintf(err, errlen, "%s: __metadata__ entry %s is not a string (the safetensors format requires a map of strings)", path, mk); goto out; }
            continue;
        }
        if (!json_is_object(val)) { snprintf(err, errlen, "%s: tensor %s: entry is not an object", path, key); goto out; }
        dt = json_object_get(val, "dtype");
        shape = json_object_get(val, "shape");
        offs = json_object_get(val, "data_offsets");
        if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs) || json_array_size(offs) != 2) {
            snprintf(err, errlen, "%s: tensor %s: needs dtype, shape and data_offsets [begin, end]", path, key);
            goto out;
        }
        t->bits = st_dtype_bits(json_string_value(dt), &t->dtype);
        t->st_dtype = st_dtype_static(json_string_value(dt));
        if (!t->bits) {
            snprintf(err, errlen, "%s: tensor %s: dtype %.40s is not a safetensors dtype (BOOL, U8, I8, F8_E5M2, F8_E4M3, "
                     "F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, F4, F6_E2M3, F6_E3M2, I16, U16, F16, BF16, I32, U32, F32, C64, "
                     "F64, I64, U64); a newer safetensors writer? report it", path, key, json_string_value(dt));
            goto out;
        }
        if (json_array_size(shape) > 8) { snprintf(err, errlen, "%s: tensor %s: %zu dimensions", path, key, json_array_size(shape)); goto out; }
        t->ndim = (int)json_array_size(shape);
        json_array_foreach(shape, j, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0) { snprintf(err, errlen, "%s: tensor %s: bad shape", path, key); goto out; }
            t->shape[j] = (uint64_t)json_integer_value(v);
            if (t->shape[j] && numel > UINT64_MAX / t->shape[j]) { snprintf(err, errlen, "%s: tensor %s: shape overflows", path, key); goto out; }
            numel *= t->shape[j];
        }
        if (!json_is_integer(json_array_get(offs, 0)) || !json_is_integer(json_array_get(offs, 1)) ||
            json_integer_value(json_array_get(offs, 0)) < 0 || json_integer_value(json_array_get(offs, 1)) < 0) {
            snprintf(err, errlen, "%s: tensor %s: data_offsets must be two non-negative integers", path, key);
            goto out;
        }
        a = (uint64_t)json_integer_value(json_array_get(offs, 0));
        b = (uint64_t)json_integer_value(json_array_get(offs, 1));
        if (numel > UINT64_MAX / t->bits || (numel * t->bits) % 8) {
            snprintf(err, errlen, "%s: tensor %s: %llu elements of %s are not a whole number of bytes", path, key,
                     (unsigned long long)numel, t->st_dtype);
            goto out;
        }
        nbytes = numel * t->bits / 8;
        if (b < a || b - a != nbytes) {
            snprintf(err, errlen, "%s: tensor %s: data_offsets [%llu, %llu] do not hold %llu elements of %s", path, key,
                     (unsigned long long)a, (unsigned long long)b, (unsigned long long)numel, t->st_dtype);
            goto out;
        }
        if (b > UINT64_MAX - f->data_start - 1) { snprintf(err, errlen, "%s: tensor %s: data_offsets out of range", path, key); goto out; }
        t->begin = f->data_start + a;
        t->end = f->data_start + b;
        memcpy(f->arena + arena_at, key, strlen(key) + 1);
        t->name = f->arena + arena_at;
        arena_at += strlen(key) + 1;
        f->n++;
    }
    f->expected_size = f->data_start;
    qsort(f->t, f->n, sizeof *f->t, cmp_begin);
    {
        /* in begin order, each non-empty tensor starts at or after the end of
         * the last non-empty one (an empty tensor in between must not hide an
         * overlap: compare with the last that holds bytes, not the previous) */
        const st_tensor *last = NULL;
        for (i = 0; i < f->n; i++) {
            const st_tensor *t = &f->t[i];
            if (t->end > f->expected_size) f->expected_size = t->end;
            if (t->end == t->begin) continue;
            if (last && t->begin < last->end) {
                snprintf(err, errlen, "%s: tensors %s and %s overlap", path, last->name, t->name);
                goto out;
            }
            last = t;
        }
    }
    rc = 0;
out:
    json_decref(root);
    return rc;
}

int st_open(const char *path, st_file *f, char *err, size_t errlen)
{
    int fd;
    int64_t sz;
    uint8_t len8[8];
    char *hdr = NULL;
    size_t i;
    int rc = -1, io = 0;

    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) { snprintf(err, errlen, "%s: out of memory", path); return -1; }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { io = errno; snprintf(err, errlen, "%s: %s", path, strerror(errno)); goto out_nofd; }
    sz = kio_file_size(fd);
    if (sz < 0) { io = errno; snprintf(err, errlen, "%s: %s", path, strerror(errno)); goto out; }
    f->file_size = (uint64_t)sz;
    if (f->file_size < 8) { snprintf(err, errlen, "%s: truncated: %llu bytes, too short for a safetensors header", path, (unsigned long long)f->file_size); goto out; }
    if (kio_pread_full(fd, len8, 8, 0)) { io = errno; snprintf(err, errlen, "%s: %s", path, strerror(errno)); goto out; }
    for (i = 0; i < 8; i++) f->header_len |= (uint64_t)len8[i] << (8 * i);
    if (f->header_len < 2 || f->header_len > ST_MAX_HEADER) {
        snprintf(err, errlen, "%s: header length %llu is not plausible (not a safetensors file?)", path, (unsigned long long)f->header_len);
        goto out;
    }
    if (8 + f->header_len > f->file_size) {
        snprintf(err, errlen, "%s: truncated: header length %llu runs past the end of the %llu-byte file", path,
                 (unsigned long long)f->header_len, (unsigned long long)f->file_size);
        goto out;
    }
    f->data_start = 8 + f->header_len;
    hdr = malloc(f->header_len);
    if (!hdr) { snprintf(err, errlen, "%s: out of memory", path); goto out; }
    if (kio_pread_full(fd, hdr, f->header_len, 8)) { io = errno; snprintf(err, errlen, "%s: %s", path, strerror(errno)); goto out; }
    if (parse_json(f, hdr, err, errlen)) goto out;
    rc = 0;
out:
    close(fd);
out_nofd:
    free(hdr);
    if (rc) {
        st_free(f);
        f->io_errno = io; /* ENODATA among them: the file shrank while it was read */
    }
    return rc;
}

int st_parse(const char *path, const uint8_t *head, uint64_t len, uint64_t file_size, st_file *f, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    if (!(f->path = strdup(path))) { snprintf(err, errlen, "%s: out of memory", path); return -1; }
    f->file_size = file_size;
    for (int i = 0; len >= 8 && i < 8; i++) f->header_len |= (uint64_t)head[i] << (8 * i);
    if (len < 8 || f->header_len < 2 || f->header_len > ST_MAX_HEADER || len != 8 + f->header_len || len > file_size) {
        snprintf(err, errlen, "%s: %llu header bytes that are not a safetensors header", path, (unsigned long long)len);
        st_free(f);
        return -1;
    }
    f->data_start = len;
    if (parse_json(f, (const char *)head + 8, err, errlen)) { st_free(f); return -1; }
    return 0;
}
