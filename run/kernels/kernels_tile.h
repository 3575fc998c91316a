/* The tile protocol of the SIMD kernel files (kernels_avx2.c,
 * kernels_avx512.c, kernels_neon.c): what one call of a tile function gets.
 * Internal to those files and their templates (kernels_entry.h,
 * kernels_blocking.h).
 *
 * One pass of a tile of R rows x P positions over columns [i0, i1).
 * Accumulators start at zero on the first pass, otherwise come from acc
 * (lanes 0..15 of row r, position p at acc + r*accr + p*16); they go back
 * there after a pass that is not the last, and the last pass reduces them,
 * adds the tail and writes y[p*ldy + r]. */
#ifndef KRUN_KERNELS_TILE_H
#define KRUN_KERNELS_TILE_H
#include <stddef.h>
#include <stdint.h>

enum { WT_F32 = 0, WT_BF16 = 1, WT_F16 = 2 }; /* wide weight types; 3 is MXFP4 */

#define MAXR 4 /* rows and positions of the largest tile */
#define MAXP 4

typedef struct {
    const char *w;      /* the tile's first row: values (wide) or packed bytes (MXFP4) */
    size_t ws;          /* bytes between rows */
    const uint8_t *s;   /* MXFP4: the first row's scales */
    size_t ss;          /* MXFP4: bytes between scale rows */
    const float *x;     /* the first position */
    size_t ldx;
    size_t i0, i1, n;   /* i0, i1: multiples of 16 (wide) or 32 (MXFP4), <= n - n%16 */
    float *acc;
    size_t accr;
    int first, last;
    size_t pf;          /* if not 0: prefetch the rows this many bytes ahead */
    float *y;
    size_t ldy;
} tile_args;

typedef void (*tile_fn)(const tile_args *);

#endif
