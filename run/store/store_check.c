/* What every part of the store shares from below (store_internal.h): how a
 * failure names the extent, whether an extent is still to be checked, and the
 * format library's reads and checks with their errors made the runtime's.
 * store.c, store_io.c and store_ring.c call these; nothing here calls them. */
#include "store_internal.h"

void kstore_err_extent(const kstore *s, uint32_t i, krun_err *err, int code, const char *what)
{
    char d[64];
    kpk_extent_name(s->f, i, d, sizeof d);
    krun_err_set(err, code, "%s: %s (extent %u): %s", kpk_path(s->f), d, i, what);
}

int kstore_need_verify(const kstore *s, uint32_t i)
{
    return s->opt.verify == KSTORE_VERIFY_ALWAYS || (s->opt.verify == KSTORE_VERIFY_FIRST && !s->verified[i]);
}

int kstore_extent_check(const kstore *s, uint32_t i, const uint8_t *stored, krun_err *err)
{
    kpk_err e = {0};
    return kpk_extent_check(s->f, i, stored, &e) ? krun_err_kpk(err, &e) : 0;
}

int kstore_extent_read(const kstore *s, uint32_t i, uint8_t *buf, int verify, krun_err *err)
{
    kpk_err e = {0};
    return kpk_extent_read(s->f, i, buf, verify, &e) ? krun_err_kpk(err, &e) : 0;
}

int kstore_extent_pread(const kstore *s, uint32_t i, void *buf, uint64_t len, uint64_t pos, krun_err *err)
{
    kpk_err e = {0};
    return kpk_extent_pread(s->f, i, buf, len, pos, &e) ? krun_err_kpk(err, &e) : 0;
}

int kstore_block_decode(const kstore *s, uint32_t i, uint32_t b, const uint8_t *stored, uint8_t *raw, krun_err *err)
{
    kpk_err e = {0};
    return kpk_block_decode(s->f, i, b, stored, raw, &e) ? krun_err_kpk(err, &e) : 0;
}
