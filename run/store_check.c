/* What every part of the store shares from below (store_internal.h): how a
 * failure names the extent, and whether an extent is still to be checked.
 * store.c, store_io.c and store_ring.c call these; nothing here calls them. */
#include "store_internal.h"

void kstore_err_extent(const kstore *s, uint32_t i, kpk_err *err, int code, const char *what)
{
    char d[64];
    kpk_extent_name(s->f, i, d, sizeof d);
    kpk_err_set(err, code, "%s: %s (extent %u): %s", kpk_path(s->f), d, i, what);
}

int kstore_need_verify(const kstore *s, uint32_t i)
{
    return s->opt.verify == KSTORE_VERIFY_ALWAYS || (s->opt.verify == KSTORE_VERIFY_FIRST && !s->verified[i]);
}
