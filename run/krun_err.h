/* How krun reports a failure: a code that is also the process exit status, and
 * one line naming what failed (the file, tensor, extent, request) and what to
 * do next. */
#ifndef KRUN_ERR_H
#define KRUN_ERR_H

#include <stdio.h>

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

/* Set e's code and message, printf-style (checked by -Wformat through snprintf). */
#define krun_err_set(e, c, ...) ((void)((e)->code = (c)), (void)snprintf((e)->msg, sizeof (e)->msg, __VA_ARGS__))
/* The krun code of a format/ error code (enum kpk_errcode). */
int krun_code_of_kpk(int kpk_code);

#endif
