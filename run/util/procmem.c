/* The process's memory as the kernel counts it (procmem.h). */
#include "procmem.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* "KEY:   123 kB" of /proc/self/status.  open + read into the stack, not
 * stdio: this runs every decoding step, which allocates nothing. */
static uint64_t read_status(const char *key)
{
    char buf[4096];
    size_t n = strlen(key), len = 0;
    ssize_t got;
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    while (len < sizeof buf - 1 && (got = read(fd, buf + len, sizeof buf - 1 - len)) > 0) len += (size_t)got;
    close(fd);
    buf[len] = 0;
    for (char *l = buf; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (strncmp(l, key, n) == 0 && l[n] == ':') return strtoull(l + n + 1, NULL, 10) * 1024;
    return 0;
}

uint64_t kmem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    uint64_t kb = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "MemAvailable:", 13) == 0) { kb = strtoull(line + 13, NULL, 10); break; }
    fclose(f);
    return kb * 1024;
}

uint64_t kmem_rss(void) { return read_status("VmRSS"); }
uint64_t kmem_peak_rss(void) { return read_status("VmHWM"); }
