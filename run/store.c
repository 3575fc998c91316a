/* The mmap store: the whole file is mapped read-only; an extent's pages are
 * faulted in on first use and checked against its XXH3 then (or on every use
 * with --verify always).  Compressed extents are decoded into a private copy. */
#include "store.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct kstore {
    kpk_file *f;
    kstore_opts opt;
    const uint8_t *map;
    uint64_t map_len;
    uint8_t *verified;        /* per extent: 1 once its checksum matched */
    uint8_t **decoded;        /* per extent: private decoded copy (compressed extents) */
    kstore_stats st;
};

int kstore_open(kpk_file *f, const kstore_opts *opt, kstore **out, kpk_err *err)
{
    kstore *s = calloc(1, sizeof *s);
    uint32_t n = kpk_extent_count(f);
    *out = NULL;
    if (!s) { kpk_err_set(err, KPK_ENOMEM, "out of memory"); return -1; }
    s->f = f;
    s->opt = *opt;
    s->map_len = kpk_size(f);
    s->verified = calloc(n + 1, 1);
    s->decoded = calloc(n + 1, sizeof *s->decoded);
    if (!s->verified || !s->decoded) { kstore_close(s); kpk_err_set(err, KPK_ENOMEM, "out of memory"); return -1; }
    s->map = mmap(NULL, s->map_len, PROT_READ, MAP_SHARED, kpk_fd(f), 0);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        kpk_err_set(err, KPK_EIO, "%s: mmap: %s", kpk_path(f), strerror(errno));
        kstore_close(s);
        return -1;
    }
    *out = s;
    return 0;
}

void kstore_close(kstore *s)
{
    if (!s) return;
    if (s->map) munmap((void *)s->map, s->map_len);
    if (s->decoded)
        for (uint32_t i = 0; i < kpk_extent_count(s->f); i++) free(s->decoded[i]);
    free(s->decoded);
    free(s->verified);
    free(s);
}

const uint8_t *kstore_get(kstore *s, uint32_t i, kpk_err *err)
{
    const kpk_extent *x = kpk_extent_at(s->f, i);
    const uint8_t *stored;
    if (!x) { kpk_err_set(err, KPK_EINVAL, "no extent %u", i); return NULL; }
    stored = s->map + x->offset;
    if (s->opt.verify == KSTORE_VERIFY_ALWAYS || (s->opt.verify == KSTORE_VERIFY_FIRST && !s->verified[i])) {
        if (kpk_extent_check(s->f, i, stored, err)) return NULL;
        if (!s->verified[i]) s->st.bytes_read += x->stored_len;
        s->verified[i] = 1;
        s->st.extents_verified++;
    }
    if (x->codec == KPK_CODEC_NONE) return stored;
    if (!s->decoded[i]) {
        s->decoded[i] = malloc(x->raw_len ? x->raw_len : 1);
        if (!s->decoded[i]) { kpk_err_set(err, KPK_ENOMEM, "out of memory"); return NULL; }
        if (kpk_extent_decode_into(s->f, i, stored, s->decoded[i], err)) {
            free(s->decoded[i]);
            s->decoded[i] = NULL;
            return NULL;
        }
    }
    return s->decoded[i];
}

void kstore_put(kstore *s, uint32_t i) { (void)s; (void)i; }

int kstore_get_many(kstore *s, const uint32_t *ids, size_t n, const uint8_t **out, kpk_err *err)
{
    for (size_t k = 0; k < n; k++)
        if (!(out[k] = kstore_get(s, ids[k], err))) return -1;
    return 0;
}

void kstore_stats_get(const kstore *s, kstore_stats *st) { *st = s->st; }
