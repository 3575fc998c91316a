/* Is there room for the rest of a conversion?  Free space is checked per
 * filesystem (two member directories on one filesystem share its free
 * space); blocks an earlier run's partial files hold past what is kept are
 * counted as available, since the run truncates them before it writes (an
 * out-of-space run can be resumed once space is freed: issue 12.1).
 *
 * With `--consume` the source shards are deleted as the conversion goes
 * (consume.h), so what a filesystem must hold is not the whole output but
 * its peak: the output written so far, plus the consume log, minus the
 * shards deleted so far, at its highest (just before a shard is deleted, or
 * at the end).  kp_space_measure walks the plan in extent order with the
 * releases to find it (issue 36). */
#ifndef KPACK_SPACE_H
#define KPACK_SPACE_H

#include "plan.h"

#include <jansson.h>
#include <stdio.h>
#include <sys/types.h>

#define KP_RELEASE_FIRST UINT32_MAX  /* a release before the first write (a resumed run's catch-up) */

/* What --consume gives back: once extent `after` is durable, `staged`
 * bytes go to the consume log (next to the entry) and then the deleted
 * shard frees `freed` blocks (`apparent` bytes) on filesystem `dev`.
 * Sorted by `after` (KP_RELEASE_FIRST ones anywhere). */
typedef struct kp_release {
    uint32_t after;
    dev_t dev;
    uint64_t freed, apparent, staged;
} kp_release;

/* One filesystem that holds member files. */
typedef struct kp_fs_space {
    dev_t dev;
    const char *dir;          /* the first member directory on it */
    char members[600];        /* the member paths on it, for messages */
    uint64_t need;            /* new blocks the output takes on it, nothing released */
    uint64_t peak;            /* the most it holds at once beyond today, with the releases */
    uint64_t need_apparent, peak_apparent; /* the same in bytes (a sparse source makes a sparse output) */
    uint32_t peak_after;      /* the extent after which the peak comes (KP_RELEASE_FIRST: at the end) */
    uint64_t freed, freed_apparent; /* released on it in all */
    uint64_t avail, held;     /* free now; blocks partial files hold that the run rewrites */
    int avail_known;
    const char *holder;       /* the partial file that holds them, when one does */
    int holders;
} kp_fs_space;

typedef struct kp_space { kp_fs_space *fs; size_t n; int sparse; } kp_space;

/* Measure every member filesystem for the rest of the conversion: first
 * extents are complete, cursor says where each target continues
 * (kp_resume_point); rel (n_rel, may be 0) what --consume releases.  0, or -1
 * with err. */
int kp_space_measure(const kp_plan *p, const kp_input *in, uint32_t first, const uint64_t *cursor, const kp_release *rel,
                     size_t n_rel, kp_space *s, char *err, size_t errlen);
/* 0 if every filesystem has room for its peak (consume) or its need; else -1
 * with err giving both figures and the filesystem. */
int kp_space_verdict(const kp_plan *p, const kp_space *s, int consume, char *err, size_t errlen);
void kp_space_free(kp_space *s);
/* For --dry-run: each filesystem's free space and needs, without and (when
 * with is set: the space was measured with releases) with --consume. */
void kp_space_print(const kp_plan *p, const kp_space *s, int with, FILE *out);
json_t *kp_space_json(const kp_plan *p, const kp_space *s, int with);

#endif
