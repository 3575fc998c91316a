/* Is there room for the rest of a conversion?  Free space is checked per
 * filesystem (two member directories on one filesystem share its free
 * space); blocks an earlier run's partial files hold past what is kept are
 * counted as available, since the run truncates them before it writes (an
 * out-of-space run can be resumed once space is freed: issue 12.1). */
#ifndef KPACK_SPACE_H
#define KPACK_SPACE_H

#include "plan.h"

/* cursor: where each target continues (kp_resume_point).  0, or -1 with err
 * giving both figures and the filesystem. */
int kp_space_check(const kp_plan *p, const kp_input *in, const uint64_t *cursor, char *err, size_t errlen);

#endif
