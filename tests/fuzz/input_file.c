/* fuzz_as_file (fuzz.h): the input behind a path, in memory (memfd). */
#include "fuzz.h"

#include "format/kio.h"

#include <sys/mman.h>
#include <unistd.h>

unsigned long fuzz_accepted;

int fuzz_as_file(const uint8_t *data, size_t size, char *path)
{
    static int fd = -1;
    if (fd < 0 && (fd = memfd_create("fuzz-input", MFD_CLOEXEC)) < 0) return -1;
    /* resize, then overwrite: the pages of the previous input are reused */
    if (ftruncate(fd, (off_t)size) || (size && kio_pwrite_full(fd, data, size, 0))) return -1;
    snprintf(path, 64, "/proc/self/fd/%d", fd);
    return 0;
}
