/* Finishing a conversion's files (docs/FORMAT.md §2, §3, §7.2, §14): the
 * entry's directory (extent table, tensor table, string pool with the
 * member paths, manifest, member table), every member's superblocks, in the
 * order that makes a crash at any point harmless: every backup superblock
 * and the directory, fdatasync, then the primary superblocks, fsync. */
#ifndef KPACK_DIRECTORY_H
#define KPACK_DIRECTORY_H

#include "plan.h"

/* fds[m]: the partial file of member m; every extent written and placed.
 * Returns 0, or -1 with errno (err names the file). */
int kp_finish_files(const kp_plan *p, const kp_layout *l, const int *fds, char *err, size_t errlen);

#endif
