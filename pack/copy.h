/* Copying the planned extents into the output's member files.  A reader
 * thread gathers each extent's tensors into 16 MiB chunk buffers (zero fill
 * between tensors; holes in sparse sources detected with SEEK_DATA and never
 * read, a chunk or extent of nothing but holes never even filled): from the
 * source shards and files, or from a KPK file or set (decoded; each source
 * extent's checksum checked as it is read).  The blocks of codec-2 extents
 * are encoded by in->threads encoder threads.  The calling thread hashes
 * each chunk in order, gives each extent the next offset of its member file
 * or of the stripe space when it starts, and queues the chunk's bytes (the
 * stored ones) to the member writers (output.h), which write every member
 * file in parallel, each front to back.  Source pages are dropped from the
 * page cache once read.  copy_pipe.h describes the pipeline. */
#ifndef KPACK_COPY_H
#define KPACK_COPY_H

#include "output.h"
#include "plan.h"
#include "format/kprogress.h"

/* Called in extent order when extent i is complete (queued to the writers,
 * not yet synced): its offset, stored_len and hashes are in p->extents[i].
 * A non-zero return stops the copy. */
typedef int (*kp_extent_done_fn)(void *ctx, uint32_t extent);

typedef struct kp_copy_stats {
    uint64_t bytes_in;       /* extent bytes produced (decoded) */
    uint64_t bytes_stored;   /* extent bytes stored (codec 2: coded) */
    uint64_t bytes_read;     /* bytes read from the source (holes skipped) */
    int source_damaged;      /* the copy stopped on a damaged source KPK file */
} kp_copy_stats;

/* Copy extents first.. of p; cursor: per target, where the next extent
 * starts (kp_cursors_init, or restored from the journal); advanced as
 * extents complete. */
int kp_copy_extents(const kp_input *in, kp_plan *p, kp_out *out, uint64_t *cursor, uint32_t first,
                    kp_extent_done_fn done, void *ctx, kprogress *prog, kp_copy_stats *stats, char *err, size_t errlen);

/* The chunk references the member writers hold (kp_out_start's hold and
 * release): a chunk buffer is reused once every write from it is done. */
void kp_chunk_hold(void *ctx, void *tag);
void kp_chunk_release(void *ctx, void *tag);

/* Hash extent i (offset and stored_len set) as it is in the partial files. */
int kp_hash_written_extent(const kp_plan *p, const int *fds, uint32_t i, uint64_t *xxh3);

#endif
