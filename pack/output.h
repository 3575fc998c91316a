/* Writing the member files of a conversion in parallel: one writer thread
 * per member file, each writing its file front to back from its own queue.
 * A write to the stripe space is cut at unit boundaries into the queues of
 * the stripe members it spans (docs/FORMAT.md §7.3).  Writers leave all-zero
 * 4 KiB blocks as holes, start write-back as they go and drop written pages
 * from the page cache (a 1.5 TB conversion keeps a few chunks in memory). */
#ifndef KPACK_OUTPUT_H
#define KPACK_OUTPUT_H

#include "plan.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kp_out kp_out;

/* A buffer handed to kp_out_write is held once per piece queued (hold, in
 * the caller's thread, before the piece is queued) and released once per
 * piece by the writer thread when it is written (or skipped after an error).
 * The caller may reuse the buffer when its count is back to what it held. */
typedef void (*kp_out_ref_fn)(void *ctx, void *tag);

/* fds[m]: the open partial file of member m (kept open by the caller). */
int kp_out_start(kp_out **out, const kp_plan *p, const int *fds, kp_out_ref_fn hold, kp_out_ref_fn release, void *ctx,
                 char *err, size_t errlen);
/* Queue len bytes at buf for target position pos: a member file's offset,
 * or a stripe-space position (target = KPK_STRIPED, cut at unit boundaries
 * into the stripe members' queues). */
int kp_out_write(kp_out *o, uint16_t target, uint64_t pos, const uint8_t *buf, size_t len, void *tag);
/* Wait until every queued write is on disk (fdatasync of every member, in
 * parallel).  min_size (or NULL): each member file is first extended to at
 * least min_size[m] bytes, so that the padding of its last extent (never
 * written: it is zero) lies inside the file the journal describes. */
int kp_out_sync(kp_out *o, const uint64_t *min_size);
/* 0, or -1 with the first writer error in err (naming the file). */
int kp_out_failed(kp_out *o, char *err, size_t errlen);
/* Per member: bytes handed over so far (for the per-disk progress line). */
uint64_t kp_out_bytes(const kp_out *o, uint16_t m);
/* Per member: bytes actually written (all-zero blocks are left as holes). */
uint64_t kp_out_written(const kp_out *o, uint16_t m);
/* Stop the writers (after draining their queues); returns kp_out_failed. */
int kp_out_stop(kp_out *o, char *err, size_t errlen);

/* Read back len bytes at target position pos from the partial files
 * (resume re-verifies the newest journaled extent). */
int kp_read_target(const kp_plan *p, const int *fds, uint16_t target, uint64_t pos, uint8_t *buf, size_t len);

#endif
