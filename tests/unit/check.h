/* Minimal test helpers: every check prints one TAP-like line that
 * tests/run_all.sh counts ("ok - ..." / "not ok - ...").  A test binary
 * returns check_exit(), non-zero if any check failed. */
#ifndef KPK_TEST_CHECK_H
#define KPK_TEST_CHECK_H
#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>

static int check_failures;

static inline int check_at(int ok, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    printf(ok ? "ok - " : "not ok - ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    if (!ok) { printf("  (%s:%d)", file, line); check_failures++; }
    printf("\n");
    fflush(stdout);
    return ok;
}
#define CHECK(cond, ...) check_at(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

static inline void check_skip(const char *fmt, ...)
{
    va_list ap;
    printf("skip - ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}
#define SKIP(...) check_skip(__VA_ARGS__)

static inline int check_exit(void) { return check_failures ? 1 : 0; }

/* A whole file into a malloc'd NUL-terminated buffer; NULL if it cannot be read. */
static inline char *check_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *p = NULL;
    size_t n = 0, cap = 0, got;
    if (!f) return NULL;
    for (;;) {
        if (cap - n < 65536) {
            char *q = realloc(p, cap = cap ? 2 * cap : 1 << 20);
            if (!q) { free(p); fclose(f); return NULL; }
            p = q;
        }
        got = fread(p + n, 1, cap - n - 1, f);
        n += got;
        if (!got) break;
    }
    fclose(f);
    p[n] = 0;
    *len = n;
    return p;
}

/* Where ../shared lives (set by tests/run_all.sh); NULL when absent. */
static inline const char *check_shared_dir(void)
{
    const char *d = getenv("K3_SHARED");
    return (d && *d) ? d : "../shared";
}
#endif
