/* A rank other than 0 of `mpirun -np N krun ...`: it serves rank 0 (session.h,
 * krun_cluster_follow), whatever the command.  From its own command line it
 * takes only what is its own -- the memory budget (--mem / --preset), threads,
 * I/O threads and SIMD path, each option as krun takes it (krun_cli.h) --
 * so that mpirun's per-host argument lists (`mpirun -np 1 krun ... --mem 8G :
 * -np 1 krun ... --mem 32G`) give each machine its own budget; the file and
 * everything all ranks must share come from rank 0. */
#include "cmd_follow.h"

#include "krun_cli.h"

#include <signal.h>
#include <stdio.h>

int krun_follow_main(int argc, char **argv)
{
    krun_cli c;
    krun_model_opts o;
    krun_err e = {0, {0}};
    uint64_t budget = 0;
    /* mpirun passes a Ctrl-C or SIGTERM to every rank: rank 0 decides what happens (krun serve
     * finishes its requests) and then stops the others */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    krun_cli_init(&c);
    for (int i = 1; i < argc; i++) krun_cli_option(&c, argc, argv, &i);   /* the others are rank 0's */
    if (c.simd && (c.simd_level = krun_simd_parse(c.simd)) < 0) c.simd = NULL;
    if (krun_cli_budget(&c, &budget)) budget = 0;
    krun_cli_model_opts(&c, "", budget, &o);
    if (krun_cluster_follow(&o, &e)) {
        /* said here; rank 0 says it too, and stops the job */
        fprintf(stderr, "krun (rank %d): %s\n", krun_cluster_rank(), e.msg);
        krun_cluster_linger();
    }
    return 0;
}
