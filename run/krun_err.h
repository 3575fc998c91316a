/* How krun reports a failure: a code that is also the process exit status, and
 * one line naming what failed (the file, tensor, extent, request) and what to
 * do next. */
#ifndef KRUN_ERR_H
#define KRUN_ERR_H

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

void krun_err_set(krun_err *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The krun code of a format/ error code (enum kpk_errcode). */
int krun_code_of_kpk(int kpk_code);

#endif
