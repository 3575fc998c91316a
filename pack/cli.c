#include "cli.h"

#include <errno.h>
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

int64_t kx_parse_size(const char *s)
{
    char *end;
    unsigned long long v;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s) return -1;
    switch (*end) {
    case 0: break;
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    case 'g': case 'G': v <<= 30; end++; break;
    default: return -1;
    }
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (*end || v > (1ULL << 62)) return -1;
    return (int64_t)v;
}

int kx_parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
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

int kx_flag(int argc, char **argv, int *i, const char *name, const char **val)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return 0;
    if (!val) return a[n] == 0;
    if (a[n] == '=') { *val = a + n + 1; return 1; }
    if (a[n] != 0) return 0;
    if (*i + 1 >= argc) { kx_error("%s needs a value", name); exit(KX_FAIL); }
    *val = argv[++*i];
    return 1;
}
