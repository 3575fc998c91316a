/* The process's memory as the kernel counts it (procmem.h): the OS seam's
 * figures (format/kos.c: /proc on Linux; kos.h says what macOS would use). */
#include "procmem.h"

#include "format/kos.h"

uint64_t kmem_rss(void) { return kos_rss(); }
uint64_t kmem_peak_rss(void) { return kos_peak_rss(); }
uint64_t kmem_available(void) { return kos_mem_available(); }
