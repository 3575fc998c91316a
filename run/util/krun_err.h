/* How krun reports a failure: a code that is also the process exit status, and
 * one line naming what failed (the file, tensor, extent, request) and what to
 * do next.  One type for the whole runtime, from the store to the commands:
 *
 *   if (bad) return krun_err_set(err, KRUN_EINPUT, "%s: ...", path);  set it and fail
 *   if (kpk_x(f, ..., &ke)) return krun_err_kpk(err, &ke);            wrap a format/ error
 *   if (step(..., err)) return krun_err_prefix(err, "layer %d: ", L);  pass it on, saying where
 *
 * (zstd's RETURN_ERROR_IF and FORWARD_IF_ERROR, as functions: every return
 * stays visible at the call.)  The format library below keeps its own kpk_err:
 * krun_err_kpk is the one place its codes become exit statuses. */
#ifndef KRUN_ERR_H
#define KRUN_ERR_H

#include "format/kpk.h"

enum krun_code {
    KRUN_OK = 0,
    KRUN_EDATA = 1,    /* the model file is damaged (checksum, structure), or the logits are not finite */
    KRUN_EINPUT = 2,   /* cannot run: usage, bad prompt, bad or foreign state file, unreadable or
                          unwritable file, I/O error, not a KPK file */
    KRUN_ENOMEM = 3,   /* out of memory: the budget or the machine is too small */
};

typedef struct krun_err {
    int code;          /* enum krun_code */
    char msg[1024];
} krun_err;

/* Set e's code and message (printf-style); returns -1, so that a failing
 * function can end with `return krun_err_set(...)`. */
int krun_err_set(krun_err *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* e from a format/ error: its message, and the krun code of its code
 * (krun_code_of_kpk).  Returns -1. */
int krun_err_kpk(krun_err *e, const kpk_err *k);
/* Put the formatted text in front of e's message ("layer 3: " + message);
 * the code stays.  Returns -1. */
int krun_err_prefix(krun_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The krun code of a format/ error code (enum kpk_errcode): damage (a bad
 * structure or checksum, and a bad argument, which only a damaged file can
 * make the runtime pass) is KRUN_EDATA, out of memory KRUN_ENOMEM, the rest
 * (I/O, not KPK, a newer version, a member of a set) KRUN_EINPUT. */
int krun_code_of_kpk(int kpk_code);

#endif
