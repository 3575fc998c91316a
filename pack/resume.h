/* Where a rerun of an interrupted conversion starts (docs/FORMAT.md §14):
 * the journal's longest valid prefix that agrees with the plan, the newest
 * journaled extent re-hashed from the partial files, stepping back past any
 * that fail.  When nothing can be resumed, the note says why (a kill before
 * the journal was written is not "other options"). */
#ifndef KPACK_RESUME_H
#define KPACK_RESUME_H

#include "journal.h"
#include "plan.h"

/* On return 0: *first extents are complete (their offsets and hashes are
 * restored into p, cursor holds where each target continues; the journal jr
 * is open and truncated after them), or *first = 0 and jr is closed (start
 * over).  -1 (err set): the journal cannot be read; starting over would
 * throw away what may be hours of verified work. */
int kp_resume_point(kp_plan *p, const char *journal, kjournal *jr, uint64_t *cursor, uint32_t *first, int quiet,
                    char *err, size_t errlen);

#endif
