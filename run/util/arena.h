/* Carving many buffers out of one allocation.
 *
 * A carve function calls karena_take once per buffer.  Run with a NULL base
 * it only measures (every pointer comes back NULL and `used` is the size);
 * run again over an allocation of that size it hands out the pointers.  The
 * planner and the allocator call the SAME carve function, so the bytes the
 * plan counts are the bytes that are allocated: one source of truth. */
#ifndef KRUN_ARENA_H
#define KRUN_ARENA_H

#include <stddef.h>
#include <stdint.h>

#define KARENA_ALIGN 64   /* a cache line: no false sharing between buffers */

typedef struct karena {
    uint8_t *base;        /* NULL: measure only */
    size_t used;
} karena;

static inline size_t karena_round(size_t n) { return (n + KARENA_ALIGN - 1) / KARENA_ALIGN * KARENA_ALIGN; }

static inline void *karena_take(karena *a, size_t count, size_t size)
{
    size_t off = karena_round(a->used);
    a->used = off + count * size;
    return a->base ? (void *)(a->base + off) : NULL;
}

/* p = room for n elements of *p. */
#define KTAKE(a, p, n) ((p) = karena_take((a), (n), sizeof *(p)))

#endif
