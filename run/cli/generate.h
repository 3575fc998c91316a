/* What one run of `krun MODEL.kpk` did, for its report: cmd_generate.c
 * records it, generate_report.c prints the per-step lines and the summary
 * on stderr and writes --json. */
#ifndef KRUN_GENERATE_H
#define KRUN_GENERATE_H

#include "run/session/session.h"

#include <stddef.h>
#include <stdint.h>

/* One decoding sweep: a forward block that produced `tokens` generated
 * tokens (1, or with --spec the accepted drafts plus the model's next). */
typedef struct gen_step {
    double seconds;
    uint64_t trunk, head, experts, globals, hits, misses, rss, predicted, predicted_used, router, cancelled;
    uint64_t *member;          /* [KRUN_MAX_MEMBERS]: bytes per member file */
    size_t tokens, drafted;
} gen_step;

/* The run: its prompt, what it generated and each decoding sweep. */
typedef struct gen_record {
    const int32_t *prompt;
    size_t n_prompt;
    const int32_t *gen;
    size_t n_gen;
    const gen_step *steps;
    size_t n_steps;
    double t_prefill;          /* seconds of the prompt's forward blocks */
    long spec;                 /* --spec N, 0: none */
    int cache;                 /* --cache-dir: a prefix cache was looked in */
    size_t cached;             /* the prompt positions an entry of it held (not run) */
} gen_record;

/* A step's counters: the model's statistics after it less those before it. */
void gen_step_measure(gen_step *st, const krun_stats *before, const krun_stats *after);
/* "krun: step N: ..." on stderr (with a plan): seconds, bytes, hits, RSS, and
 * per member file when the model is a set; n_acc drafts were accepted. */
void gen_report_step(const gen_step *st, size_t n, size_t n_acc, uint16_t n_members);
/* The summary lines on stderr at the end (and, with --spec, the drafts'). */
void gen_report_summary(krun_model *m, const krun_session *s, const gen_record *r);
/* --json: ids, per-step and total statistics, the plan.  -1 with a message
 * on stderr when it cannot be written. */
int gen_report_json(const char *path, krun_model *m, const krun_session *s, const gen_record *r);

#endif
