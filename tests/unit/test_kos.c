/* The OS seam (format/kos.h): the page size is the system's (4, 16 or 64 KiB
 * on ARM; make test-arm64 runs this under qemu with 16 and 64 KiB pages too),
 * the mapping advice touches whole pages only (DONTNEED on exactly the pages
 * inside the range: an anonymous page it drops reads back as zeros), and the
 * memory figures are there; a no-replace rename refuses an existing name and
 * moves to a new one; a TCP socket's received bytes are counted. */
#include "check.h"
#include "format/kos.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

static int write_file(int dir, const char *name, const char *text)
{
    int fd = openat(dir, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    size_t n = strlen(text);
    int ok = fd >= 0 && write(fd, text, n) == (ssize_t)n;
    if (fd >= 0) close(fd);
    return ok ? 0 : -1;
}

static int file_is(int dir, const char *name, const char *text)
{
    char buf[64];
    int fd = openat(dir, name, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf);
    if (fd >= 0) close(fd);
    return n == (ssize_t)strlen(text) && !memcmp(buf, text, (size_t)n);
}

static void check_rename(void)
{
    char tmpl[] = "/tmp/test_kos.XXXXXX";
    const char *d = mkdtemp(tmpl);
    int dir = d ? open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (!CHECK(dir >= 0 && !write_file(dir, "a", "new") && !write_file(dir, "b", "old"), "a directory with a and b"))
        return;
    int rc = kos_rename_noreplace(dir, "a", "b"), e = errno;
    if (rc && (e == EINVAL || e == ENOSYS || e == EOPNOTSUPP))
        SKIP("kos_rename_noreplace: this file system cannot (%s); the caller falls back to link + unlink", strerror(e));
    else
        CHECK(rc == -1 && e == EEXIST && file_is(dir, "a", "new") && file_is(dir, "b", "old"),
              "kos_rename_noreplace onto an existing name: EEXIST, both files untouched (rc %d, %s)", rc, strerror(e));
    rc = kos_rename_noreplace(dir, "a", "c");
    if (!(rc && (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)))
        CHECK(rc == 0 && file_is(dir, "c", "new") && faccessat(dir, "a", F_OK, 0) != 0,
              "kos_rename_noreplace to a new name moves the file");
    unlinkat(dir, "a", 0), unlinkat(dir, "b", 0), unlinkat(dir, "c", 0);
    close(dir);
    rmdir(d);
}

static void check_tcp(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), c = -1, s = -1;
    if (l >= 0 && !bind(l, (struct sockaddr *)&a, sizeof a) && !listen(l, 1) && !getsockname(l, (struct sockaddr *)&a, &len)) {
        c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (c >= 0 && !connect(c, (struct sockaddr *)&a, sizeof a)) s = accept(l, NULL, NULL);
    }
    if (CHECK(s >= 0, "a TCP connection on the loopback")) {
        long long before = kos_tcp_bytes_received(s), after = -2;
        char buf[5];
        if (write(c, "hello", 5) == 5 && read(s, buf, 5) == 5) after = kos_tcp_bytes_received(s);
        if (before == -1 && getenv("KPK_EMULATED"))
            SKIP("kos_tcp_bytes_received: -1 under an emulator (qemu-user passes TCP options as an int, not struct tcp_info)");
        else
            CHECK(before == 0 && after == 5, "kos_tcp_bytes_received: 0 on a fresh connection, 5 after 5 bytes (%lld, %lld)", before, after);
        int p[2];
        if (CHECK(!pipe(p), "a pipe")) {
            CHECK(kos_tcp_bytes_received(p[0]) == -1, "kos_tcp_bytes_received on a pipe: -1 (cannot say)");
            close(p[0]), close(p[1]);
        }
    }
    if (s >= 0) close(s);
    if (c >= 0) close(c);
    if (l >= 0) close(l);
}

int main(void)
{
    const size_t page = kos_page_size();
    CHECK(page >= 4096 && (page & (page - 1)) == 0 && (long)page == sysconf(_SC_PAGESIZE),
          "kos_page_size() = %zu: the system's, a power of two >= 4096", page);

    /* five pages mapped so that four whole ones start on a page boundary */
    uint8_t *m = mmap(NULL, 5 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!CHECK(m != MAP_FAILED, "mmap 5 pages")) return check_exit();
    uint8_t *p = (uint8_t *)(((uintptr_t)m + page - 1) / page * page);
    memset(p, 0xab, 4 * page);
    /* [p + 1, p + 3 page - 1) holds one whole page, page 1 */
    kos_map_dontneed(p + 1, 3 * page - 2);
    int kept = 1, dropped = 1;
    for (size_t i = 0; i < 4 * page; i++) {
        if (i / page == 1) dropped &= p[i] == 0;
        else kept &= p[i] == 0xab;
    }
    CHECK(dropped && kept, "kos_map_dontneed drops exactly the whole pages inside the range (page 1 of [1 byte, 3 pages - 1 byte))");
    memset(p, 0xab, 4 * page);
    kos_map_dontneed(p + 1, page);
    kept = 1;
    for (size_t i = 0; i < 4 * page; i++) kept &= p[i] == 0xab;
    CHECK(kept, "kos_map_dontneed on a range without a whole page drops nothing");
    kos_map_willneed(p + 100, page); /* widened to pages 0 and 1: must not fail on an unaligned start */
    CHECK(p[100] == 0xab && p[page + 100] == 0xab, "kos_map_willneed on an unaligned range leaves the data alone");
    munmap(m, 5 * page);

    const uint64_t rss = kos_rss(), peak = kos_peak_rss(), avail = kos_mem_available();
    CHECK(rss > 0 && peak >= rss, "kos_rss %llu <= kos_peak_rss %llu", (unsigned long long)rss, (unsigned long long)peak);
    CHECK(avail > 0, "kos_mem_available %llu", (unsigned long long)avail);
    check_rename();
    check_tcp();
    return check_exit();
}
