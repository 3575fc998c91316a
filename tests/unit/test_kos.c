/* The OS seam (format/kos.h): the page size is the system's (4, 16 or 64 KiB
 * on ARM; make test-arm64 runs this under qemu with 16 and 64 KiB pages too),
 * the mapping advice touches whole pages only (DONTNEED on exactly the pages
 * inside the range: an anonymous page it drops reads back as zeros), and the
 * memory figures are there. */
#include "check.h"
#include "format/kos.h"

#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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
    return check_exit();
}
