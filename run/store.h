/* Where extent bytes come from while the model runs.  The forward pass asks
 * for an extent, uses it, and gives it back; the store decides whether the
 * bytes are resident, mapped or streamed into a budgeted buffer, and checks
 * each extent's XXH3 (the first time, or every time) before handing it out. */
#ifndef KRUN_STORE_H
#define KRUN_STORE_H

#include "kpk_reader.h"

#include <stdint.h>

enum kstore_verify { KSTORE_VERIFY_OFF = 0, KSTORE_VERIFY_FIRST = 1, KSTORE_VERIFY_ALWAYS = 2 };

typedef struct kstore_opts {
    int verify;               /* enum kstore_verify */
} kstore_opts;

typedef struct kstore_stats {
    uint64_t bytes_read;      /* bytes actually read or faulted in from the file */
    uint64_t extents_verified;
} kstore_stats;

typedef struct kstore kstore;

int kstore_open(kpk_file *f, const kstore_opts *opt, kstore **out, kpk_err *err);
void kstore_close(kstore *s);
/* The decoded bytes of extent i, valid until kstore_put(s, i).  NULL with
 * err set when it cannot be read or fails its checksum. */
const uint8_t *kstore_get(kstore *s, uint32_t i, kpk_err *err);
void kstore_put(kstore *s, uint32_t i);
/* Several extents at once (the experts of one layer): the store may read them
 * concurrently, in file order.  out[k] receives extent ids[k]'s bytes. */
int kstore_get_many(kstore *s, const uint32_t *ids, size_t n, const uint8_t **out, kpk_err *err);
void kstore_stats_get(const kstore *s, kstore_stats *st);

#endif
