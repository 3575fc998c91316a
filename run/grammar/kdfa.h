/* Deterministic automata over the bytes of a string's text, for constrained decoding: what a
 * JSON Schema `pattern` or `format` leaves of a string (kregex.c compiles them), as the grammar
 * walks it (kgram.c: a KG_TEXT_DFA body).
 *
 * The automaton reads the text as the reply writes it: a JSON string's content with the escapes
 * krun writes (KDFA_JSON: `"` as \", `\` as \\, the control characters as \b \t \n \f \r or
 * \u00XX, everything else as its UTF-8 bytes; no other escape), or a K3 tool argument's raw
 * UTF-8 (KDFA_RAW).  So every state is either at a character boundary or inside one character's
 * bytes, and the characters are counted where they start: a string's minLength / maxLength are
 * part of the automaton (lo, hi), and a step is taken only if an accepted text of lo..hi
 * characters can still follow (the length tables below), so a walk never reaches a dead end.
 *
 * Built once per schema (immutable afterwards; any thread may step it). */
#ifndef KRUN_KDFA_H
#define KRUN_KDFA_H

#include <stddef.h>
#include <stdint.h>

#define KDFA_DEAD 0xffffffffu
#define KDFA_MAX_STATES 4096      /* beyond: the pattern is refused as too complex */
#define KDFA_LEN_CAP 4096         /* maxLength above this (or none): lengths followed up to lo + this */

enum { KDFA_JSON = 0, KDFA_RAW = 1 };
enum { KDFA_ACCEPT = 1, KDFA_BOUNDARY = 2 };

typedef struct kdfa {
    uint32_t n;                   /* states; 0 is the start */
    uint32_t n_classes;           /* byte classes */
    uint8_t cls[256];             /* byte -> class */
    uint32_t *next;               /* [n * n_classes]: the state after a byte, or KDFA_DEAD */
    uint8_t *flags;               /* KDFA_ACCEPT (at a boundary, the text may end), KDFA_BOUNDARY */
    uint8_t (*first)[32];         /* the bytes with a live transition, per state */
    uint8_t (*class_bytes)[32];   /* the bytes of each class */
    int enc;                      /* KDFA_JSON or KDFA_RAW */
    int32_t lo, hi;               /* characters, at least and at most (hi: KG_INF - 1 for none) */
    /* What lengths can still be: with a maxLength, for each state the counts c of characters that
     * can still start before an accepted end (0: it may end here), a bit set of 0..hi (hi at most
     * lo + KDFA_LEN_CAP: a larger maxLength is followed that far, a subset); without one, the most
     * such characters (KDFA_UNBOUNDED: as many as wanted), which only a minLength asks about. */
    uint64_t *lens;               /* [n * words], or NULL without a maxLength */
    size_t words;
    int32_t *most;                /* [n], or NULL with a maxLength */
} kdfa;
#define KDFA_UNBOUNDED 0x7fffffff

void kdfa_free(kdfa *d);

/* ---- building (kregex.c) --------------------------------------------------------------------- */

/* A DFA from a table: n states, state 0 the start; next[s * 256 + b] (KDFA_DEAD: none); flags per
 * state.  Minimized (states that cannot reach an accepting one are dropped), with the length tables
 * for lo..hi characters.  NULL when out of memory; *empty = 1 (and NULL) when no text of lo..hi
 * characters is accepted. */
kdfa *kdfa_from_table(uint32_t n, const uint32_t *next, const uint8_t *flags, int enc, int32_t lo, int32_t hi, int *empty);
/* The same from a table whose bytes share columns: next[s * w + col[b]] (w 1..256), as the
 * subset construction builds it (bytes no edge tells apart, one column); the result is exactly
 * kdfa_from_table's on the table spelled out byte by byte. */
kdfa *kdfa_from_columns(uint32_t n, uint32_t w, const uint8_t col[256], const uint32_t *next, const uint8_t *flags, int enc, int32_t lo, int32_t hi,
                        int *empty);
/* The texts both accept (same encoding), with lo..hi characters.  NULL as above, or when the product
 * has more than KDFA_MAX_STATES states (*too_big = 1). */
kdfa *kdfa_intersect(const kdfa *a, const kdfa *b, int32_t lo, int32_t hi, int *empty, int *too_big);

/* ---- walking --------------------------------------------------------------------------------- */

/* One byte from state *s with *chars characters so far: 1 (taken: *s, *chars updated), 2 (a JSON
 * text's closing quote: the text ends here, accepted), or 0 (not allowed). */
int kdfa_byte(const kdfa *d, uint32_t *s, int32_t *chars, uint8_t b);
/* The text may end at state s with chars characters (a raw text: what follows may begin). */
int kdfa_may_end(const kdfa *d, uint32_t s, int32_t chars);
/* The bytes that may come next (exactly those kdfa_byte takes), OR-ed into set. */
void kdfa_first(const kdfa *d, uint32_t s, int32_t chars, uint8_t set[32]);
/* Whether the length tables leave nothing to check: lo 0 and no maxLength (then a state alone says
 * what may follow, whatever the count). */
int kdfa_unbounded(const kdfa *d);

#endif
