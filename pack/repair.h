/* kpack verify --repair-from SOURCE_DIR (issue 12): the extents that fail
 * their checks are made again from the original download and written back
 * in place.  The writer is deterministic, so a correct source reproduces the
 * exact stored bytes the tables record, compressed or not; that is what is
 * checked first:
 *
 *   1. the source is the one the file was converted from: every shard the
 *      manifest lists, with its size, and its SHA-256 where one was
 *      recorded; the kept files of the archive with their sizes and hashes;
 *   2. planned again with the file's options, it has the file's extents,
 *      tensors and block cuts;
 *   3. each damaged extent made again from it reproduces, in memory, the
 *      stored_xxh3, raw_xxh3 and block records of the table.
 *
 * Only then is anything written (each extent's stored bytes and its zero
 * padding, through the member files and the stripe mapping, then fsync). */
#ifndef KPACK_REPAIR_H
#define KPACK_REPAIR_H

#include "format/kpk_reader.h"

#include <stddef.h>
#include <stdint.h>

/* Repair extents bad[0..n) of f (opened by path) from src_dir.  Returns 0
 * when every one was rewritten; -1 with err (nothing written) when the
 * source does not match, naming the shard, file, extent or tensor; *damage
 * is then 1 for a mismatch (exit 1), 0 for a failure to run (exit 2). */
int kp_repair(kpk_file *f, const char *src_dir, const uint32_t *bad, size_t n, int threads, int quiet, int *damage,
              char *err, size_t errlen);

#endif
