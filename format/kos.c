/* The OS seam on Linux (kos.h says what each call is for and what a port
 * would use instead). */
#include "kos.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

size_t kos_page_size(void)
{
    static size_t page; /* a benign race: every thread computes the same value */
    if (!page) {
        long p = sysconf(_SC_PAGESIZE);
        page = p > 0 ? (size_t)p : 4096;
    }
    return page;
}

int kos_open_uncached(const char *path) { return open(path, O_RDONLY | O_DIRECT | O_CLOEXEC); }

void kos_cache_drop(int fd, uint64_t off, uint64_t len) { posix_fadvise(fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED); }

void kos_cache_sequential(int fd) { posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL); }

int kos_writeback_start(int fd, uint64_t off, uint64_t len)
{
    return sync_file_range(fd, (off_t)off, (off_t)len, SYNC_FILE_RANGE_WRITE);
}

int kos_writeback_wait(int fd, uint64_t off, uint64_t len)
{
    return sync_file_range(fd, (off_t)off, (off_t)len,
                           SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
}

void kos_map_willneed(const void *p, size_t len)
{
    const uintptr_t page = kos_page_size(), a = (uintptr_t)p / page * page, b = (uintptr_t)p + len;
    if (len) madvise((void *)a, b - a, MADV_WILLNEED);
}

void kos_map_dontneed(const void *p, size_t len)
{
    const uintptr_t page = kos_page_size(), a = ((uintptr_t)p + page - 1) / page * page, b = ((uintptr_t)p + len) / page * page;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

int kos_rename_noreplace(int dirfd, const char *from, const char *to)
{
#ifdef RENAME_NOREPLACE
    return renameat2(dirfd, from, dirfd, to, RENAME_NOREPLACE);
#else
    (void)dirfd, (void)from, (void)to;
    errno = ENOSYS; /* a C library without renameat2's flag (glibc < 2.28): the caller falls back */
    return -1;
#endif
}

long long kos_tcp_bytes_received(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len)) return -1;
    if (len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received) return -1;
    return (long long)(ti.tcpi_bytes_received & 0x7fffffffffffffffull);
}

int kos_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;
    if (!d) return -1;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1;                 /* the directory's own descriptor */
}

/* "KEY:   123 kB" of /proc/self/status.  open + read into the stack, not
 * stdio: krun asks every decoding step, which allocates nothing. */
static uint64_t status_kb(const char *key)
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

uint64_t kos_rss(void) { return status_kb("VmRSS"); }

uint64_t kos_peak_rss(void) { return status_kb("VmHWM"); }

uint64_t kos_mem_available(void)
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
