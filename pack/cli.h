/* Shared pieces of the kpack command line: exit codes, messages, options. */
#ifndef KPACK_CLI_H
#define KPACK_CLI_H

#include "format/release.h"

#include <stdint.h>
#include <stdio.h>

#define KPACK_VERSION KPK_RELEASE   /* the manifest's producer: "kpack " KPACK_VERSION */

/* Exit codes (documented in README and `kpack --help`). */
enum {
    KX_OK = 0,      /* success; for checks: everything is intact */
    KX_BAD = 1,     /* the thing checked is bad: source problems, corrupt KPK file */
    KX_FAIL = 2,    /* cannot do the job: usage error, unreadable or not a KPK file,
                       output exists, not enough space, I/O error */
};

void kx_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void kx_note(int quiet, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The number of online CPUs. */
int kx_cpus(void);
/* 1 if path is a readable directory; otherwise prints why and returns 0. */
int kx_is_dir(const char *path);
/* fsync a directory (what a rename, creation or deletion in it changed): 0 or -1. */
int kx_fsync_dir(const char *dir);
/* Every command's option loop: is argv[*i] the flag `name`?  For flags
 * taking a value, *val gets it (from "--x=v" or the next argument; missing:
 * exits 2).  Sizes and integers: kargs_size, kargs_long (format/kargs.h). */
int kx_flag(int argc, char **argv, int *i, const char *name, const char **val);

int cmd_check_source(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_cat(int argc, char **argv);
int cmd_export(int argc, char **argv);

#endif
