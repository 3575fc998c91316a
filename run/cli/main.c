/* krun: run Kimi K3 from a KPK file.  The commands, each in its own file:
 *
 *   krun MODEL.kpk --prompt ...   generate: cmd_generate.c
 *   krun tokenize MODEL.kpk ...   text <-> token ids, chat rendering: cmd_tokenize.c
 *   krun chat MODEL.kpk ...       a conversation in a terminal: cmd_chat.c
 *   krun serve MODEL.kpk ...      an OpenAI-compatible HTTP server: cmd_serve.c
 *   krun batch MODEL.kpk IN OUT   a file of OpenAI Batch requests: cmd_batch.c
 *
 * Under `mpirun -np N` (several machines, docs/RUNTIME.md §10) rank 0 runs the
 * command and every other rank serves it: cmd_follow.c.
 *
 * Every command reaches the model through the session API (session.h). */
#include "cmd_batch.h"
#include "cmd_chat.h"
#include "cmd_follow.h"
#include "cmd_generate.h"
#include "cmd_serve.h"
#include "cmd_tokenize.h"
#include "run/session/session.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    static const struct { const char *name; int (*fn)(int, char **); } cmds[] = {
        {"tokenize", krun_tokenize_main}, {"chat", krun_chat_main}, {"serve", krun_serve_main},
        {"batch", krun_batch_main},
    };
    krun_err e;
    int rank = krun_cluster_start(&argc, &argv, &e);
    if (rank < 0) { fprintf(stderr, "krun: %s\n", e.msg); return e.code; }
    if (rank > 0) return krun_follow_main(argc, argv);
    for (size_t i = 0; argc > 1 && i < sizeof cmds / sizeof cmds[0]; i++)
        if (strcmp(argv[1], cmds[i].name) == 0) return cmds[i].fn(argc - 1, argv + 1);
    return krun_generate_main(argc, argv);   /* krun MODEL.kpk ...: usage, --help and --version are its */
}
