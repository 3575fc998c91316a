/* JSON Schema `pattern` and `format` compiled to byte automata (kdfa.h), for constrained decoding.
 *
 * Patterns are ECMAScript regular expressions (ECMA-262 with the u flag, as JSON Schema and ajv
 * read them), matched anywhere in the string unless anchored.  Supported: literals, `.`, classes
 * (`[a-z]`, `[^...]`, \d \D \w \W \s \S inside and outside), escapes (\t \n \v \f \r \0 \cX \xHH
 * \uHHHH \u{H...}, surrogate pairs, identity escapes), groups (capturing, `(?:...)`, named),
 * alternation, quantifiers (* + ? {n} {n,} {n,m}, greedy or lazy: the same set of strings), and
 * the anchors ^ and $.  Refused with a message naming them: backreferences (\1, \k<name>),
 * lookahead and lookbehind, word boundaries (\b \B), Unicode property escapes (\p{...}), and a
 * pattern whose automaton would exceed KDFA_MAX_STATES states.
 *
 * Formats (docs/SERVE.md has the grammar of each): date-time, date, time, duration, email,
 * hostname, ipv4, ipv6, uri, uuid; each accepts a subset of what ajv-formats' full mode accepts
 * (tests/node checks both directions on chosen strings). */
#ifndef KRUN_KREGEX_H
#define KRUN_KREGEX_H

#include "kdfa.h"

#include <stddef.h>

enum { KREGEX_ICASE = 1 };        /* ASCII letters match either case (the formats' /i) */

/* The strings (UTF-8, len bytes, not NUL-terminated) that contain a match of re, with lo..hi
 * characters, as an automaton over enc (KDFA_JSON, KDFA_RAW).  NULL with msg when refused (*oom 0)
 * or out of memory (*oom 1); *empty: no string of lo..hi characters matches (NULL, msg set). */
kdfa *kregex_compile(const char *re, size_t len, int flags, int enc, int32_t lo, int32_t hi, int *empty, int *oom,
                     char *msg, size_t mlen);
/* The automaton of re before it is minimized: the subset construction's full byte table as
 * kdfa_from_table takes it (*n states, *next [*n * 256], *fl per state), for the tests that check
 * the minimization against a reference.  0 (the caller frees *next and *fl), or -1 with msg as
 * kregex_compile (refused; *oom: out of memory). */
int kregex_table(const char *re, size_t len, int flags, int enc, uint32_t *n, uint32_t **next, uint8_t **fl, int *oom, char *msg, size_t mlen);
/* A format's strings, as kregex_compile; NULL with *known = 0 for a format krun has no grammar for. */
kdfa *kregex_format(const char *name, int enc, int32_t lo, int32_t hi, int *known, int *empty, int *oom, char *msg, size_t mlen);
/* The formats krun knows, NULL-terminated (for messages and tests). */
extern const char *const kregex_format_names[];

#endif
