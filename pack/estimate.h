/* The size of a compressed conversion before it is written: `kpack convert
 * --dry-run` and the free-space check.  An estimate, and said to be one:
 * a few blocks of every class are read from the source and encoded with the
 * conversion's settings, and each class's stored/raw is applied to all of
 * its blocks (uncompressed extents are exact). */
#ifndef KPACK_ESTIMATE_H
#define KPACK_ESTIMATE_H

#include "plan.h"

#define KP_ESTIMATE_SAMPLES 8        /* blocks sampled per class, spread over the file */
#define KP_ESTIMATE_MARGIN 0.10      /* the free-space check adds this to an estimated size */

typedef struct kp_estimate_note {
    uint32_t sampled[KP_BC_COUNT];   /* blocks encoded, per class */
    uint64_t blocks[KP_BC_COUNT];    /* blocks planned, per class */
} kp_estimate_note;

/* Fill p->est_ratio from samples of the source (no-op without codec-2
 * extents).  0, or -1 with err (a source that cannot be read). */
int kp_estimate_ratios(const kp_input *in, kp_plan *p, kp_estimate_note *note, char *err, size_t errlen);

#endif
