/* The process's memory as the kernel counts it: what the memory budget is
 * checked against (krun --json peak_rss_bytes, the tests' RSS bounds), and
 * what a budget defaults to when none is given. */
#ifndef KRUN_PROCMEM_H
#define KRUN_PROCMEM_H

#include <stdint.h>

/* Current resident set size of this process (VmRSS), and its peak (VmHWM);
 * 0 if unknown.  Allocates nothing (read every decoding step). */
uint64_t kmem_rss(void);
uint64_t kmem_peak_rss(void);
/* MemAvailable of /proc/meminfo, 0 if unknown. */
uint64_t kmem_available(void);

#endif
