/* What krun's commands (krun, krun chat, krun serve) share on the command
 * line: the model's memory and execution options, the sampling options, the
 * budget they make, and the prefill progress shown on a terminal.  One parser,
 * so that `krun chat` and `krun serve` take every memory option krun takes,
 * spelled and checked the same way. */
#ifndef KRUN_CLI_H
#define KRUN_CLI_H

#include "run/session/pcache.h"
#include "run/session/sampler.h"
#include "run/session/session.h"

#include <stddef.h>
#include <stdint.h>

typedef struct krun_cli {
    /* memory and execution */
    const char *mem, *preset, *trace, *simd, *piece;
    long threads, ctx, chunk, pin, slots, io_threads, max_seqs;   /* chunk 0: auto */
    long head;                /* --head: 0 hold, 1 stream, -1 the planner chooses */
    long predict;             /* --predict: 1 on, 0 off, -1 auto (the default: on for a split layout) */
    long stages;              /* --stages: 0 auto (several machines: trunk layers in the other ranks' budgets), -1 off,
                                 1 the layers per rank given (stage_layers) */
    int stage_layers[KRUN_MAX_RANKS];
    int io, policy, io_given, verify;
    int simd_level;           /* krun_simd_parse of --simd */
    /* the prefix cache (run/session/pcache.h) */
    const char *cache_dir, *cache_size;
    int no_cache;
    /* sampling */
    double temp, top_p, min_p;
    double repetition_penalty, presence_penalty, frequency_penalty;
    long top_k;
    unsigned long long seed;
    int seed_given;
    /* the EAGLE drafter (docs/RUNTIME.md §11) */
    const char *draft;        /* "auto" (the default), "off" or a drafter file */
    long draft_width;         /* 0: chosen each pass by cost */
    double draft_accept;      /* the acceptance a plan assumes (0: the published figures') */
} krun_cli;

/* Defaults: chunk auto, one session, top-p 1, --verify first, --io direct, greedy. */
void krun_cli_init(krun_cli *c);
/* If argv[*i] is one of the shared options, parse it and its value (advancing
 * *i) and return 1; otherwise return 0.  A bad value exits with status 2 and
 * a message naming the option. */
int krun_cli_option(krun_cli *c, int argc, char **argv, int *i);
/* Checks across options (--mem with --preset; options that need a budget;
 * --simd's value); needs_budget: the caller has its own option that needs one
 * (its name, or NULL).  Exits with status 2 on a conflict. */
void krun_cli_check(krun_cli *c, const char *needs_budget);
/* The drafter file the options name, or NULL: --draft off, or auto and no MODEL.draft.kpk
 * beside the model.  A named file that does not exist exits with status 2. */
const char *krun_cli_draft_file(const krun_cli *c, const char *model, char *buf, size_t n);
/* The budget of --mem / --preset in bytes (0: none given).  -1 with a message
 * on stderr when malformed. */
int krun_cli_budget(const krun_cli *c, uint64_t *budget);
void krun_cli_model_opts(const krun_cli *c, const char *path, uint64_t budget, krun_model_opts *mo);
void krun_cli_sampler(const krun_cli *c, ksampler_opts *so);
/* The prefix cache the options ask for (*out NULL when none): with
 * --cache-dir, entries on disk too; without it, in RAM only when ram (the
 * server's default), unless --no-cache.  background: a thread writes the
 * entries (the server).  -1 with err when the directory cannot be used. */
int krun_cli_pcache(const krun_cli *c, krun_model *m, const char *prog, int ram, int background, krun_pcache **out, krun_err *err);

/* The model's name in the API (krun serve, krun batch): the file's name without its directory and
 * .kpk. */
void krun_cli_model_name(const char *path, char *out, size_t len);
/* The file's warning (a damaged primary superblock, the backup used: FORMAT.md §3 step 6), said
 * once on stderr by every command whatever --quiet says: the file needs repair. */
void krun_cli_file_warning(const char *prog, const krun_model *m);

/* Argument helpers: print "krun: " + the message and exit with status 2. */
_Noreturn void krun_cli_die(const char *fmt, const char *arg);
/* Is argv[*i] the option `name`, which takes a value?  The value in *val:
 * "--name=VALUE" or the next argument (then *i moves past it); a missing
 * value exits.  The matching kpack does too (format/kargs.h). */
int krun_cli_value(int argc, char **argv, int *i, const char *name, const char **val);
long krun_cli_long(const char *s, long lo, long hi, const char *what);
double krun_cli_double(const char *s, double lo, double hi, const char *what);

/* Prefill progress on a terminal: positions done, inside a block the layer
 * it is at (a block of thousands of positions takes long at full scale),
 * positions/s, ETA; after the first block of a long prompt, how long the rest
 * will take (unless quiet).  The same figures krun serve's progress comments
 * and /health give. */
typedef struct krun_prefill_progress {
    int draw, quiet;
    double t0, last;
    krun_model *m;
    size_t done, total;       /* positions in finished blocks, of the prompt */
    size_t block;             /* the block running now */
    int layer, layers;        /* its layers done, of */
    int blocks;               /* blocks finished */
} krun_prefill_progress;
/* Before a feed of total positions: sets the session's progress callback
 * (krun_prefill_progress_fn) and the model's layer hook; _end clears both. */
void krun_prefill_progress_start(krun_prefill_progress *p, krun_model *m, krun_session *s, size_t total, int quiet);
void krun_prefill_progress_end(krun_prefill_progress *p, krun_session *s);
void krun_prefill_progress_fn(void *ctx, size_t done, size_t total);
/* Say up front what a prompt of n positions costs, when it takes several blocks
 * or the prefill layout: the blocks and the bytes the cost model expects. */
void krun_announce_prompt(krun_model *m, size_t n);

#define KRUN_CLI_USAGE_SAMPLING \
    "  --temp T              temperature (default 0 = greedy argmax)\n" \
    "  --top-k K  --top-p P  --min-p P   sampling filters (with --temp > 0)\n" \
    "  --seed S              the draws' seed (default 0): the draw for a position is Philox4x64-10\n" \
    "                        of (seed, position), so the same seed gives the same text, with or\n" \
    "                        without --spec, continued from a saved state or not\n" \
    "  --repetition-penalty R  vLLM's: a logit of a token already in the text (prompt or reply)\n" \
    "                        is divided by R when positive, multiplied when negative (default 1: off)\n" \
    "  --presence-penalty P  --frequency-penalty F   OpenAI's, over the reply: a token's logit\n" \
    "                        minus P once it occurs, minus F per occurrence (-2..2; default 0)\n"

#define KRUN_CLI_USAGE_CACHE(ram) \
    "  --cache-dir DIR       keep prompt states on disk in DIR, shared by krun, krun chat and krun\n" \
    "                        serve runs of the same model file: a prompt that begins with a kept\n" \
    "                        state runs only the rest; the output is the same bits (docs/RUNTIME.md §9)\n" \
    "  --cache-size SIZE     the kept states of this model in DIR, at most (default 32G; least\n" \
    "                        recently used out)\n" \
    "  --no-cache            keep nothing" ram "\n"

#define KRUN_DRAFT_SPEC 8      /* --spec with a drafter, unless given */

#define KRUN_CLI_USAGE_DRAFT \
    "  --draft auto|off|FILE  the EAGLE drafter (a drafter file made by kpack convert from its checkpoint):\n" \
    "                        it proposes the next tokens from the model's own hidden states and one\n" \
    "                        forward sweep verifies them; the output is the same bits as without it.\n" \
    "                        auto (the default): MODEL.draft.kpk beside MODEL.kpk, when the plan\n" \
    "                        predicts fewer bytes per generated token with it (--plan says)\n" \
    "  --draft-width N       drafts per verification (default: chosen each pass by cost and the\n" \
    "                        acceptance measured so far; at most --spec)\n" \
    "  --draft-accept A      the acceptance per draft --plan assumes (default 0.85, the published\n" \
    "                        figures'); at run time it is measured per request\n"

#define KRUN_CLI_USAGE_EXECUTION \
    "  --threads N           worker threads (default: all cores); results are identical for any N\n" \
    "  --simd auto|scalar|avx2|avx512|neon   kernel path (default auto); results are identical\n" \
    "  --stages auto|off|N,N,...  under mpirun (several machines, no flag needed): which ranks compute\n" \
    "                        the trunk layers -- auto: as the ranks' budgets hold them; off: rank 0\n" \
    "                        all, the others experts only; N,N,...: each rank's layer count, in\n" \
    "                        order.  Each rank's own --mem/--preset/--threads are its own; results\n" \
    "                        are identical for any rank count\n"

#define KRUN_CLI_USAGE_MEMORY \
    "Memory (without --mem or --preset a file that fits in memory is used in place from a\n" \
    "mapping; a larger one gets --mem 80% of the available memory):\n" \
    "  --mem SIZE            memory budget, e.g. 8G, 512M (binary units); peak RSS stays below it\n" \
    "  --preset NAME         laptop 8G, desktop 32G, workstation 64G, server 128G, max 224G\n" \
    "  --pin N               trunk layers kept resident (default: as many as fit)\n" \
    "  --expert-slots N      experts cached (default: what the budget leaves)\n" \
    "  --head hold|stream    lm_head held, or streamed in pieces every token (default: held\n" \
    "                        when it fits)\n" \
    "  --piece SIZE          streamed pieces' target size (default: the largest that fits; a\n" \
    "                        trunk layer or lm_head larger than a ring slot streams in pieces)\n" \
    "  --cache lfu|lru       expert cache policy (default lfu: least often used, ties to the most\n" \
    "                        recently used; LRU evicts exactly what the next step needs)\n" \
    "  --io mmap|pread|direct  how streamed extents are read (default direct; where a file\n" \
    "                        system refuses O_DIRECT, buffered reads, said once)\n" \
    "  --io-threads N        concurrent reads (default 8; a set: shared by its disks, at least\n" \
    "                        2 per disk)\n" \
    "  --predict on|off|auto while a layer's attention runs, read the experts its router is\n" \
    "                        likely to choose (default auto: on when the trunk is in a member\n" \
    "                        of its own, kpack --trunk-to; never changes the output)\n" \
    "  --trace FILE          every read: kind, member, offset, length, start, end (TSV)\n" \
    "  --chunk auto|N        prompt positions per forward block (default auto: with a budget the\n" \
    "                        planner picks, per prompt, blocks of 64 or a large block that borrows\n" \
    "                        the expert cache and pinned layers while it runs -- see --plan; N: that\n" \
    "                        size, one layout; results are identical)\n" \
    "  --verify first|always|off   check each extent's XXH3 on first use (default), every use, or never\n"

#endif
