/* The command line as both tools read it (kpack and krun): matching an
 * option, with its value as "--name=VALUE" or as the next argument, and
 * reading sizes and integers.  One parser each, so that the two tools accept
 * the same spellings. */
#ifndef KPK_KARGS_H
#define KPK_KARGS_H

#include <stdint.h>

/* Is argv[*i] the option `name`?  One without a value (val NULL) matches
 * only as it is; one with a value takes it from "--name=VALUE" or from the
 * next argument (and *i moves past it).  Returns 1 (matched), 0 (another
 * option), or -1 (matched, but the value is missing: the last argument). */
int kargs_flag(int argc, char **argv, int *i, const char *name, const char **val);

/* A size in bytes: digits, an optional fraction, an optional unit K, M, G or
 * T (binary: 1024^n; either case), then optionally "i" and/or "B" ("4096",
 * "64K", "1.5G", "2TiB", "512MB").  A fraction of a byte is dropped.  -1 if
 * it is anything else or more than 2^62. */
int64_t kargs_size(const char *s);

/* A decimal integer in [lo, hi] into *out: 0, or -1 if it is not one. */
int kargs_long(const char *s, long lo, long hi, long *out);

#endif
