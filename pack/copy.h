/* Copying the planned extents from the source shards into the output file.
 * A reader thread gathers each extent's tensors into 16 MiB chunk buffers
 * (zero fill between tensors; holes in sparse sources detected with
 * SEEK_DATA and never read, a chunk or extent of nothing but holes never
 * even filled); the calling thread hashes each chunk and writes its non-zero
 * 4 KiB blocks, leaving all-zero blocks as holes in the pre-sized output.
 * Source pages are dropped from the page cache once read and output pages
 * once written back (sync_file_range write-behind), so a 1.5 TB conversion
 * keeps a few chunks in the page cache instead of all of memory. */
#ifndef COPY_H
#define COPY_H

#include "kprogress.h"
#include "plan.h"

/* Called after extent i has been written completely (not yet synced). A
 * non-zero return stops the copy. */
typedef int (*kp_extent_done_fn)(void *ctx, uint32_t extent, uint64_t stored_xxh3);

typedef struct kp_copy_stats {
    uint64_t bytes_in;       /* extent bytes produced */
    uint64_t bytes_written;  /* bytes actually written (zero blocks skipped) */
    uint64_t bytes_read;     /* bytes read from the shards (holes skipped) */
} kp_copy_stats;

int kp_copy_extents(const k3_source *src, const kp_plan *p, int out_fd, uint32_t first,
                    kp_extent_done_fn done, void *ctx, kprogress *prog, kp_copy_stats *stats,
                    char *err, size_t errlen);

/* Hash extent i as it is in out_fd (for re-verifying a resumed file). */
int kp_hash_written_extent(int out_fd, const kp_plan *p, uint32_t i, uint64_t *xxh3);

#endif
