/* The command line as both tools read it (kargs.h). */
#include "kargs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int kargs_flag(int argc, char **argv, int *i, const char *name, const char **val)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return 0;
    if (!val) return a[n] == 0;
    if (a[n] == '=') { *val = a + n + 1; return 1; }
    if (a[n] != 0) return 0;
    if (*i + 1 >= argc) return -1;
    *val = argv[++*i];
    return 1;
}

#define SIZE_MAX_BYTES ((uint64_t)1 << 62)

int64_t kargs_size(const char *s)
{
    uint64_t whole = 0, mul = 1;
    double frac = 0, place = 0.1;
    const char *p = s;
    if (*p < '0' || *p > '9') return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (whole > (SIZE_MAX_BYTES - (uint64_t)(*p - '0')) / 10) return -1;
        whole = whole * 10 + (uint64_t)(*p - '0');
    }
    if (*p == '.') {
        if (p[1] < '0' || p[1] > '9') return -1;
        for (p++; *p >= '0' && *p <= '9'; p++, place /= 10) frac += (*p - '0') * place;
    }
    switch (*p) {
    case 'k': case 'K': mul = (uint64_t)1 << 10; p++; break;
    case 'm': case 'M': mul = (uint64_t)1 << 20; p++; break;
    case 'g': case 'G': mul = (uint64_t)1 << 30; p++; break;
    case 't': case 'T': mul = (uint64_t)1 << 40; p++; break;
    default: break;
    }
    if (mul > 1 && *p == 'i') p++;
    if (*p == 'B') p++;
    if (*p || whole > SIZE_MAX_BYTES / mul) return -1;
    whole *= mul;
    whole += (uint64_t)(frac * (double)mul);   /* < mul: the fraction of the unit, whole bytes */
    return whole > SIZE_MAX_BYTES ? -1 : (int64_t)whole;
}

int kargs_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}
