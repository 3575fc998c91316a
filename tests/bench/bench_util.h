/* Helpers the C benchmarks share: a monotonic clock, a comparison for
 * qsort of doubles (medians).  Random numbers: tests/unit/testrand.h. */
#ifndef KPK_BENCH_UTIL_H
#define KPK_BENCH_UTIL_H
#include <stdint.h>
#include <time.h>

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif
