/* Writing the KPK directory (extent table, tensor table, string pool,
 * manifest) and the two superblocks of a fully written plan. */
#ifndef DIRECTORY_H
#define DIRECTORY_H

#include "plan.h"

/* Writes the four sections at their planned offsets. */
int kp_write_directory(int fd, const kp_plan *p);
/* Fills the superblock for the plan (hashes computed from the plan). */
void kp_superblock_for(const kp_plan *p, kpk_superblock *sb);
/* Backup copy at the end, fdatasync, then the primary at offset 0: a file
 * with a valid primary superblock is complete. */
int kp_write_superblocks(int fd, const kp_plan *p);

#endif
