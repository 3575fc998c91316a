/* The OS seam: every call of format/, pack/ and run/ that is Linux's rather
 * than POSIX's, in one place, so that a port (macOS, a BSD) changes kos.c and
 * nothing else.  What each needs on Linux and would use on macOS:
 *
 *   kos_page_size        sysconf(_SC_PAGESIZE): 4 KiB on x86-64; 4, 16 (Apple
 *                        silicon, Asahi) or 64 KiB on ARM.  It bounds only what
 *                        madvise touches; O_DIRECT and the file format align to
 *                        4096 (the devices' logical blocks, FORMAT.md), not to it.
 *   kos_open_uncached    O_DIRECT.  macOS: open, then fcntl(F_NOCACHE, 1).
 *   kos_cache_drop       posix_fadvise(POSIX_FADV_DONTNEED).  macOS: none per
 *                        range (F_NOCACHE on the descriptor instead); a no-op.
 *   kos_cache_sequential posix_fadvise(POSIX_FADV_SEQUENTIAL).  macOS: F_RDAHEAD.
 *   kos_writeback_*      sync_file_range.  macOS: none; a no-op start and an
 *                        fsync of the whole file for the wait.
 *   kos_map_*            madvise WILLNEED / DONTNEED, rounded to pages.  macOS
 *                        has both; its DONTNEED does not drop the pages at once
 *                        (MADV_FREE_REUSABLE comes closest).
 *   kos_rename_noreplace renameat2(RENAME_NOREPLACE) (kpack export's publish).
 *                        macOS: renameatx_np(RENAME_EXCL).
 *   kos_tcp_bytes_received
 *                        getsockopt TCP_INFO tcpi_bytes_received (krun serve's
 *                        request deadline).  macOS: TCP_CONNECTION_INFO,
 *                        tcpi_rxbytes.
 *   kos_rss, kos_peak_rss, kos_mem_available
 *                        /proc/self/status VmRSS, VmHWM; /proc/meminfo
 *                        MemAvailable.  macOS: task_info(MACH_TASK_BASIC_INFO)
 *                        resident_size (and resident_size_max), host_statistics64
 *                        free + inactive pages.
 *
 * None of these may fail a run: the advice calls return nothing (a kernel
 * that ignores advice only costs page cache or read-ahead), the memory
 * queries return 0 when unknown. */
#ifndef KOS_H
#define KOS_H

#include <stddef.h>
#include <stdint.h>

size_t kos_page_size(void);

/* path read-only, bypassing the page cache (O_CLOEXEC).  -1 with errno;
 * EINVAL: the file system refuses (tmpfs before Linux 6.6, ramfs, some
 * network file systems).  Reads must be aligned to 4096 in offset, length and
 * memory. */
int kos_open_uncached(const char *path);

/* Advice on an open file's page cache: bytes [off, off + len) read for the
 * last time (len 0: to the end of the file); the whole file read front to
 * back. */
void kos_cache_drop(int fd, uint64_t off, uint64_t len);
void kos_cache_sequential(int fd);

/* Write-behind of a file being written: start writing [off, off + len) back
 * to the device without waiting; wait until [off, off + len) is on it.  0, or
 * -1 with errno (ENOSYS, EINVAL or EOPNOTSUPP from start: not supported here,
 * the caller falls back to plain write-back). */
int kos_writeback_start(int fd, uint64_t off, uint64_t len);
int kos_writeback_wait(int fd, uint64_t off, uint64_t len);

/* Advice on a file mapping: [p, p + len) will be read soon (widened to whole
 * pages); is not needed any more (only the whole pages inside it, so that
 * nothing next to it is dropped). */
void kos_map_willneed(const void *p, size_t len);
void kos_map_dontneed(const void *p, size_t len);

/* Rename from to to, both in the directory dirfd, failing with EEXIST if to
 * exists.  0, or -1 with errno; EINVAL, ENOSYS or EOPNOTSUPP: this system or
 * file system cannot (the caller falls back to link + unlink, which also
 * fails on an existing name). */
int kos_rename_noreplace(int dirfd, const char *from, const char *to);

/* Bytes the kernel has received on TCP socket fd so far; -1 if it cannot say
 * (not TCP, an old kernel). */
long long kos_tcp_bytes_received(int fd);

/* Descriptors this process has open now; -1 if it cannot say. */
int kos_open_fds(void);

/* This process's resident set and its peak; the memory the system could give
 * without swapping.  Bytes; 0 if unknown. */
uint64_t kos_rss(void);
uint64_t kos_peak_rss(void);
uint64_t kos_mem_available(void);

#endif
