/* Numbers within exact bounds, for constrained decoding: a JSON number that a schema's minimum,
 * maximum, exclusiveMinimum, exclusiveMaximum and (for integers) multipleOf accept, as the grammar
 * walks it byte by byte (kgram.c: a KG_TEXT_NUMBER body).
 *
 * What is generated: -?(0|[1-9][0-9]*)(\.[0-9]+)?, no exponent, at most KNUM_DIGITS digits in all
 * (integer and fraction), so every such text is exactly a multiple of 10^-15 below 10^15 in
 * magnitude, and a JSON parser reads it as the double nearest to it.  The bounds are taken as the
 * shortest decimal that reads back as the schema's double (the text the schema was written with),
 * and a text is kept only if its exact value is within them: with at most 15 significant digits no
 * two such texts read as the same double, so the double a validator compares is within the bounds
 * exactly when the text's value is (exclusive bounds included).  A step is taken only if an accepted
 * number can still follow, so a walk never reaches a dead end. */
#ifndef KRUN_KNUM_H
#define KRUN_KNUM_H

#include <stdint.h>

#define KNUM_DIGITS 15

typedef struct knum {
    int integer;                  /* no fraction */
    __int128 lo, hi;              /* the values allowed, times 10^15 */
    __int128 step;                /* the values are multiples of it, times 10^15 (1: any; 10^15 * m: multipleOf m) */
} knum;

/* No bounds yet: integers (integer) or numbers; multipleOf m (0: none; a positive integer, which
 * makes the values integers). */
void knum_init(knum *n, int integer, uint64_t m);
/* A bound more: lower or upper, v, exclusive or not (the stricter of two of a side holds). */
void knum_bound(knum *n, int lower, double v, int excl);
/* Whether any number is left. */
int knum_possible(const knum *n);

/* The walk's state is 64 bits, 0 at the start. */
/* One byte: 1 taken (*state updated), 0 not allowed. */
int knum_byte(const knum *n, uint64_t *state, uint8_t b);
/* The text so far is an accepted number (it may end here). */
int knum_complete(const knum *n, uint64_t state);
/* The bytes that may come next (exactly those knum_byte takes), OR-ed into set. */
void knum_first(const knum *n, uint64_t state, uint8_t set[32]);

#endif
