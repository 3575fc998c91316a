/* Where extent bytes come from while the model runs.  The forward pass asks
 * for an extent, uses it, and gives it back; the store decides where the bytes
 * live and checks each extent's XXH3 (the first time it is read, or every
 * time) before handing it out.
 *
 * Without a memory plan every extent is used in place from a read-only
 * mapping of the file.  With a plan (krun --mem / --preset):
 *   - resident extents (the pinned trunk prefix, the globals but the
 *     embedding) are read once into budgeted buffers: never touched through
 *     a file mapping, so a warm page cache cannot add to the resident set;
 *   - streamed trunk extents go through a ring of two budgeted slots; while
 *     one layer computes, the next streamed layer is read into the other;
 *   - routed experts go through a cache of budgeted slots (LFU with an MRU
 *     tie-break by default, or LRU), the
 *     misses of one layer read concurrently, in file order;
 *   - --io pread|direct reads into the slots (O_DIRECT bypasses the page
 *     cache; pread drops what it read from it), --io mmap uses the mapping
 *     and madvise instead, so the page cache is never an unbudgeted cache. */
#ifndef KRUN_STORE_H
#define KRUN_STORE_H

#include "kpk_reader.h"
#include "memplan.h"

#include <stdint.h>

enum kstore_verify { KSTORE_VERIFY_OFF = 0, KSTORE_VERIFY_FIRST = 1, KSTORE_VERIFY_ALWAYS = 2 };
enum kstore_io { KSTORE_IO_MMAP = 0, KSTORE_IO_PREAD = 1, KSTORE_IO_DIRECT = 2 };
enum kstore_policy { KSTORE_LFU = 0, KSTORE_LRU = 1 };

typedef struct kstore_opts {
    int verify;               /* enum kstore_verify */
    int io;                   /* enum kstore_io (with a plan) */
    int policy;               /* enum kstore_policy */
    int io_threads;           /* concurrent reads (default 8) */
    int trace;                /* record every read for kstore_trace_write */
    const kmemplan *plan;     /* NULL: everything in place from the mapping */
    const k3_model *model;    /* needed with a plan: which extent is what */
} kstore_opts;

typedef struct kstore_stats {
    uint64_t bytes_read;      /* all bytes read or faulted in for use */
    uint64_t bytes_trunk;     /* streamed trunk extents */
    uint64_t bytes_experts;   /* routed experts that missed the cache */
    uint64_t bytes_globals;   /* embedding rows */
    uint64_t bytes_resident;  /* resident extents, read once */
    uint64_t expert_hits;     /* experts already resident when asked for */
    uint64_t expert_misses;
    uint64_t extents_verified;
    double io_wait_seconds;   /* compute blocked on reads */
} kstore_stats;

typedef struct kstore kstore;

/* Hashing the part of the globals that is never held (the embedding) goes
 * through a window this large (counted in the process base of the plan). */
#define KSTORE_WINDOW_BYTES ((size_t)1 << 20)

int kstore_open(kpk_file *f, const kstore_opts *opt, kstore **out, kpk_err *err);
void kstore_close(kstore *s);
/* The decoded bytes of extent i, valid until kstore_put(s, i).  NULL with
 * err set when it cannot be read or fails its checksum.  The result points at
 * extent byte *first: 0, except for the globals with a plan, which are held
 * without the embedding (pass first = NULL to insist on the whole extent). */
const uint8_t *kstore_get(kstore *s, uint32_t i, uint64_t *first, kpk_err *err);
void kstore_put(kstore *s, uint32_t i);
/* Several experts of one layer at once; out[k] receives extent ids[k]'s
 * bytes.  At most kstore_expert_capacity() at a time. */
int kstore_get_many(kstore *s, const uint32_t *ids, size_t n, const uint8_t **out, kpk_err *err);
size_t kstore_expert_capacity(const kstore *s);
/* A small read inside an extent (an embedding row), not cached. */
int kstore_read(kstore *s, uint32_t i, uint64_t off, size_t len, void *dst, kpk_err *err);
void kstore_stats_get(const kstore *s, kstore_stats *st);
int kstore_trace_write(kstore *s, const char *path);

#endif
