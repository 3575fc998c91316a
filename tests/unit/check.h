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

/* Where ../shared lives (set by tests/run_all.sh); NULL when absent. */
static inline const char *check_shared_dir(void)
{
    const char *d = getenv("K3_SHARED");
    return (d && *d) ? d : "../shared";
}
#endif
