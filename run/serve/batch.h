/* krun batch: a file of OpenAI Batch requests run on the server's engine (serve.h), with their
 * outputs written in vLLM run-batch's shape, crash-safe and resumable.
 *
 *   batch_input.c    IN.jsonl read and checked: one request per line ({"custom_id", "method":
 *                    "POST", "url", "body"}); the output lines
 *   batch_journal.c  OUT.krun-journal: every output line made durable as its request ends
 *   batch_job.c      the job: requests into the engine, outputs into the journal, then OUT in
 *                    input order by an atomic rename
 *
 * docs/BATCH.md describes the files and the guarantees, and names the test of each. */
#ifndef KRUN_BATCH_H
#define KRUN_BATCH_H

#include "serve.h"

#include <stddef.h>
#include <stdint.h>

/* ---- the input (batch_input.c) ----------------------------------------------------------------- */

typedef struct {
    size_t line;               /* 1-based line of IN */
    char *custom_id;           /* NULL: absent or not a string */
    int chat;                  /* url /v1/chat/completions (else /v1/completions) */
    char *body;                /* the body as JSON text, for srv_prepare */
    size_t body_len;
    int bad;                   /* the line itself is bad (not JSON, no custom_id, a wrong method or url, no body) */
    char field[32];            /* bad: the field at fault ("" for the line itself) */
    char why[300];             /* bad: what is wrong */
} kbatch_item;

typedef struct {
    kbatch_item *items;        /* the non-blank lines, in order */
    size_t n;
    uint64_t hash, size;       /* XXH3-64 and bytes of IN: the job's identity */
} kbatch_input;

/* Read IN.  Bad lines become bad items (their output is an error line); blank lines are skipped.
 * Fails (KRUN_EINPUT, err naming the lines) when IN cannot be read or two lines have one
 * custom_id: the outputs could not be told apart. */
int  kbatch_read(const char *path, kbatch_input *in, krun_err *err);
void kbatch_input_free(kbatch_input *in);

/* The job's tag: 16 hex digits naming the input (the ids of its outputs carry it). */
void kbatch_tag(const kbatch_input *in, char tag[17]);
/* An output line, without its newline (malloc'd; NULL when out of memory):
 *  - a request that ran (or that the API refused: status 4xx, body its error object):
 *    {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}
 *  - a bad line: {"id", "custom_id" (or null), "response": null,
 *    "error": {"code": "invalid_batch_line", "message", "line", "field"}} */
char *kbatch_line_response(const char *tag, const kbatch_item *it, int status, const char *request_id, const char *body);
char *kbatch_line_bad(const char *tag, const kbatch_item *it);

/* ---- the journal (batch_journal.c) ------------------------------------------------------------- */

/* OUT.krun-journal: a header line naming the job, then one record per finished request:
 *   "krun-batch-journal 1 key=HEX16 seed=N created=N\n"
 *   "LINE HEX16 OUTPUT-LINE\n"  (HEX16: XXH3-64 of LINE, a space and OUTPUT-LINE)
 * appended with one write and made durable (fdatasync) before the next request's record; a torn
 * or damaged last record fails its checksum and is cut off when the journal is opened.  The open
 * journal is locked (flock): a second process on the same OUT is refused. */
typedef struct {
    int fd;
    char *path;
    uint64_t key, seed;
    long long created;
    uint64_t end;              /* bytes of valid journal */
    char **lines;              /* [n_items]: the output line of each item recorded, else NULL */
    size_t n_items, n_recorded;
} kbatch_journal;

/* Open (or create) the journal of OUT for a job.  key: the job's identity; *seed and *created:
 * the job's, taken from the journal when it exists and *_given is 0.  Returns 0; 1 when a journal
 * of another job is there (err says so; with force it is started over instead); -1 with err (the
 * journal is locked by another process, I/O). */
int  kbatch_journal_open(kbatch_journal *j, const char *out, const kbatch_input *in, uint64_t key, uint64_t *seed, int seed_given,
                         long long *created, int created_given, int force, krun_err *err);
/* Record item k's output line durably.  0, or -1 with err (the journal is left as it was). */
int  kbatch_journal_add(kbatch_journal *j, const kbatch_input *in, size_t k, const char *line, krun_err *err);
/* The job is over: the journal removed (after OUT was renamed into place). */
int  kbatch_journal_remove(kbatch_journal *j, krun_err *err);
void kbatch_journal_close(kbatch_journal *j);

/* ---- the job (batch_job.c) ------------------------------------------------------------------------ */

typedef struct {
    size_t total;              /* requests (lines) */
    size_t done;               /* with an output line */
    size_t resumed;            /* of which read back from the journal */
    size_t failed;             /* of which error lines (bad lines, 4xx) */
    size_t ran;                /* requests the engine ran to their end in this run */
    uint64_t prompt_tokens, generated;   /* this run's */
    uint64_t sweeps, bytes_read;         /* this run's */
    double seconds;            /* this run's */
    /* of this run's sweeps, those that only decoded (no prompt positions): what a generated token
     * costs, without the prompts' sweeps and the model's first reads */
    uint64_t decode_sweeps, decode_bytes_read, decode_generated;
    double decode_seconds;
    /* speculation (--spec): drafts verified and kept; of them, the EAGLE drafter's (--draft) */
    uint64_t drafted, accepted, drafter_drafted, drafter_accepted;
} kbatch_stats;

typedef struct {
    const char *out;           /* OUT.jsonl */
    const char *model_name;
    uint64_t seed;             /* sampled requests without a seed get one from it and their line */
    long long created;         /* "created" of every response */
    int seed_given, created_given;
    int force;                 /* replace a finished OUT; start over from another job's journal */
    size_t window;             /* requests handed to the engine at once (running and queued) */
    volatile int *stop;        /* when it becomes non-zero the job stops (kbatch_run returns -2) */
    /* called about four times a second, and once at the end */
    void (*progress)(void *ctx, const kbatch_stats *st);
    void *progress_ctx;
} kbatch_opts;

/* Run the job: 0 when OUT is written (error lines included); -2 when *stop became non-zero (the
 * journal keeps what was done); -1 with err: KRUN_EINPUT (OUT finished and no force, locked,
 * foreign journal, I/O), KRUN_EDATA (the model file is damaged: the journal keeps what was done),
 * KRUN_ENOMEM. */
int kbatch_run(krun_model *m, const kbatch_input *in, const kbatch_opts *o, kbatch_stats *st, krun_err *err);

/* The seed of a request without one: from the job's seed and its line. */
uint64_t kbatch_request_seed(uint64_t job_seed, size_t line);

#endif
