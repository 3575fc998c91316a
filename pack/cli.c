#include "cli.h"

#include "format/kargs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void kx_error(const char *fmt, ...)
{
    va_list ap;
    fputs("kpack: error: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void kx_note(int quiet, const char *fmt, ...)
{
    va_list ap;
    if (quiet) return;
    fputs("kpack: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int kx_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 256 ? 256 : (int)n;
}

int kx_is_dir(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) { kx_error("%s: %s", path, strerror(errno)); return 0; }
    if (!S_ISDIR(st.st_mode)) { kx_error("%s: not a directory", path); return 0; }
    return 1;
}

int kx_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = -1;
    if (fd >= 0) { rc = fsync(fd); close(fd); }
    return rc;
}

int kx_flag(int argc, char **argv, int *i, const char *name, const char **val)
{
    int r = kargs_flag(argc, argv, i, name, val);
    if (r < 0) { kx_error("%s needs a value", name); exit(KX_FAIL); }
    return r;
}
