/* krun as a library: open a model once, run sequences ("sessions") on it.
 *
 *   krun_model_opts o;  krun_model *m;  krun_session *s;  krun_err e;
 *   krun_model_opts_init(&o);  o.path = "k3.kpk";  o.budget = 8ull << 30;  o.ctx = 4096;
 *   if (krun_model_open(&o, &m, &e)) { fprintf(stderr, "%s\n", e.msg); return e.code; }
 *   krun_session_new(m, &s, &e);
 *   krun_session_feed(s, prompt, n, NULL, &e);          // prefill, in blocks of o.chunk
 *   for (;;) { int32_t id = krun_session_sample(s); ...; krun_session_feed(s, &id, 1, NULL, &e); }
 *
 * Several sessions share one model, one store and one run state; up to
 * o.max_seqs of them are live at once (the plan budgets their state), and
 * krun_step_batch advances several of them by one token in ONE forward block:
 * the trunk is read once, the union of their experts once, and each session's
 * results are bit-identical to stepping it alone.
 *
 * Memory: everything is laid out when the model is prepared (the run state
 * for a block of max(chunk, max_seqs) positions, and max_seqs session slots);
 * feeding, stepping and sampling allocate nothing.
 *
 * Errors: every call that can fail fills a krun_err whose code is krun's exit
 * status (krun_err.h).  A session whose feed failed must be reset.
 *
 * This header is the runtime's public API: the commands and the server use
 * it (and the plan, memplan.h), never the engine, the store or the model
 * below it, so it exports what they need of those: the limits, the options'
 * values, the read statistics and the kernel path. */
#ifndef KRUN_SESSION_H
#define KRUN_SESSION_H

#include "memplan.h"
#include "sampler.h"
#include "format/k3_config.h"
#include "run/text/tokenizer.h"
#include "run/util/krun_err.h"
#include "run/util/savefile.h"
#include "run/util/stats.h"

#include <stddef.h>
#include <stdint.h>

typedef struct krun_model krun_model;
typedef struct krun_session krun_session;

#define KRUN_MAX_SEQS 256          /* sessions live at once, and sequences in one forward block, at most */
#define KRUN_MAX_RANKS 64          /* ranks of a cluster (mpirun -np), at most */

/* Values of krun_model_opts.verify, .io and .cache_policy. */
enum krun_verify { KRUN_VERIFY_OFF = 0, KRUN_VERIFY_FIRST = 1, KRUN_VERIFY_ALWAYS = 2 };
enum krun_io { KRUN_IO_MMAP = 0, KRUN_IO_PREAD = 1, KRUN_IO_DIRECT = 2 };
enum krun_cache { KRUN_CACHE_LFU = 0, KRUN_CACHE_LRU = 1 };

typedef struct krun_model_opts {
    const char *path;          /* the .kpk file */
    uint64_t budget;           /* memory budget in bytes; 0: in place from a mapping when the file fits in
                                  80% of the available memory, else a budget of 80% of it */
    const char *preset;        /* the budget's name, shown in the plan (NULL) */
    int pin;                   /* trunk layers kept resident; -1: the planner decides */
    int expert_slots;          /* experts cached; -1: the planner decides */
    uint64_t piece;            /* streamed pieces' target size in bytes; 0: the planner decides */
    int head;                  /* lm_head: 0 held, 1 streamed in pieces; -1: the planner decides */
    int io;                    /* enum krun_io, with a budget */
    int cache_policy;          /* enum krun_cache */
    int io_threads;            /* concurrent reads; 0: 8 */
    int verify;                /* enum krun_verify */
    int trace;                 /* record every read (krun_model_trace_write) */
    size_t ctx;                /* positions per session (default 4096) */
    size_t chunk;              /* positions per forward block of a prefill; 0 (the default): auto -- with a
                                  budget the planner chooses, per prompt, between blocks of 64 and a larger
                                  prefill block that borrows the decoding layout's memory (memplan.h);
                                  without one, 64.  A given chunk is one layout, blocks of that size */
    size_t prompt_tokens;      /* chunk auto: the prompt the caller expects (the planner's reference); 0: ctx */
    size_t max_seqs;           /* sessions live at once, whose state the plan budgets (default 1, at most 256) */
    uint64_t extra_bytes;      /* the caller's own buffers, counted in the plan (e.g. all-position logits) */
    size_t spec;               /* speculative decoding: drafts per verification block, at most (0: none, the
                                  default; at most KSPEC_MAX_DRAFT); the plan counts the journal it needs */
    int predict;               /* 1: read a layer's likely experts during its attention (run/engine/predict.h);
                                  0: off; -1 (the default): on for a split layout (the trunk in a member
                                  of its own) when the budget holds it */
    const char *state_dir;     /* the sessions' states paged to disk in this directory (docs/BATCH.md, "States
                                  on disk"): RAM holds 3 layers of them, the plan counts that window; NULL
                                  (the default): resident.  Not with spec or cache; a paged session cannot be
                                  copied, snapshot, saved or loaded (KRUN_EINPUT) */
    int cache;                 /* 1: the model serves a prefix cache (pcache.h): the plan counts the buffer
                                  of one KDA layer that snapshots written to a file go through */
    const char *draft;         /* the EAGLE drafter (docs/RUNTIME.md §11): a drafter KPK file (kpack convert of the drafter
                                  checkpoint), "auto" (MODEL.draft.kpk next to MODEL.kpk, when it exists and the plan
                                  predicts fewer bytes per generated token with it than with its memory given to the
                                  model), or NULL / "off": none.  Needs spec > 0 to draft (the verification's journal) */
    size_t draft_width;        /* drafts per verification from it: 0 (the default) chosen each pass by cost and
                                  acceptance (draft_width.c); N: always N (tests, measurements) */
    double draft_accept;       /* the acceptance per draft the plan assumes when it weighs the drafter (0: 0.85,
                                  the published figures'); at run time it is measured */
    int threads;               /* compute threads; 0: every core */
    int simd;                  /* -1: the best the CPU has; else a level of krun_simd_parse (process-wide) */
    int stages;                /* several machines (mpirun): 0, the default, trunk layers rank 0's budget does not
                                  hold pinned go to the other ranks' budgets (pipeline stages); -1 off, every
                                  layer on rank 0 (the others read and compute experts); 1: stage_layers[r]
                                  layers to rank r, in order (the placement given, as --pin overrides the plan) */
    int stage_layers[KRUN_MAX_RANKS];
} krun_model_opts;

void krun_model_opts_init(krun_model_opts *o);

/* Open in two steps: load reads the file's directory, config and tokenizer
 * (enough to tokenize a prompt and choose ctx); prepare makes the plan and
 * sets up the store, threads, run state and session slots.  open does both. */
int krun_model_load(const char *path, krun_model **out, krun_err *err);
int krun_model_prepare(krun_model *m, const krun_model_opts *o, krun_err *err);
int krun_model_open(const krun_model_opts *o, krun_model **out, krun_err *err);
void krun_model_close(krun_model *m);

/* Where --draft auto looks for a drafter: MODEL.kpk -> MODEL.draft.kpk. */
void krun_draft_auto_path(const char *model_path, char *out, size_t n);

/* The plan a budget would give (krun --plan), without preparing anything. */
int krun_model_make_plan(const krun_model *m, const krun_model_opts *o, kmemplan *plan, krun_err *err);

const k3_config *krun_model_config(const krun_model *m);
/* What a saved state must have been computed with: the file's set_id and the
 * XXH3-64 of its config.json, as "%016x-%016x" (docs/STATE.md). */
const char *krun_model_identity(const krun_model *m);
/* The same, and with a drafter its file's ("...-d%016x"): the prefix cache's directory, whose
 * state files carry the drafter's rows (docs/STATE.md 1.2). */
const char *krun_model_cache_identity(const krun_model *m);
/* Bytes of a state file of pos positions (no pending token) of this model, with its logits or
 * not: with a drafter, its section (docs/STATE.md 1.2) included. */
uint64_t krun_model_state_bytes(const krun_model *m, size_t pos, int logits);
const char *krun_model_path(const krun_model *m);
ktok *krun_model_tokenizer(const krun_model *m);            /* NULL: the file has none (ids only) */
/* Ids that end a generated message: eos_token_id, <|end_of_msg|>, [EOS]
 * (those that exist); returns how many were written to out[3]. */
size_t krun_model_stop_ids(const krun_model *m, int32_t out[3]);
const kmemplan *krun_model_plan(const krun_model *m);       /* NULL: in place, no plan */
/* The EAGLE drafter in use (its file), or NULL: none. */
const char *krun_model_draft(const krun_model *m);
/* The file the states are paged to (krun_model_opts.state_dir), or NULL: resident. */
const char *krun_model_state_file(const krun_model *m);
/* Bytes read from and written to it so far, and the seconds the forward
 * passes waited for it (0 when resident). */
void krun_model_state_io(const krun_model *m, uint64_t *read, uint64_t *written, double *wait_seconds);
uint64_t krun_model_auto_budget(const krun_model *m);       /* the budget chosen for a too-large file, or 0 */

/* Times each routed expert of MoE layer L was chosen so far, [n_experts]
 * (NULL for a dense layer): the routing's histogram. */
const uint64_t *krun_model_routing(const krun_model *m, int L);

/* What the model has read so far (run/util/stats.h: the store's counters). */
void krun_model_stats(const krun_model *m, krun_stats *st);
/* The model's member files (docs/FORMAT.md §7; one for a single file), whose reads
 * krun_stats counts apart: member k's path (as opened), role ("entry", "plain" -- kpack's
 * --trunk-to member --, "stripe"), stripe index (-1: none) and size.  0, or -1 when k is
 * out of range. */
typedef struct krun_member_info { const char *path, *role; int stripe; uint64_t size; } krun_member_info;
size_t krun_model_members(const krun_model *m);
int krun_model_member(const krun_model *m, size_t k, krun_member_info *out);
/* 0 while the model file is the one that was opened; -1 with err (KRUN_EDATA)
 * once it changed (written, truncated, replaced in place: store.h,
 * kstore_file_changed).  Every forward block asks it after its reads; a
 * server's health check may ask it from any thread. */
int krun_model_file_changed(const krun_model *m, krun_err *err);
/* The file's own warning, or NULL: damage kpk_open found and worked around
 * (a damaged primary superblock, the intact backup used: FORMAT.md §3 step 6).
 * Every command says it once (the file needs repair), and goes on. */
const char *krun_model_warning(const krun_model *m);
/* Something the user should be told once about how the file is read (e.g.
 * O_DIRECT refused by a file system, buffered reads used instead), or NULL. */
const char *krun_model_notice(const krun_model *m);
int krun_model_threads(const krun_model *m);
size_t krun_model_ctx(const krun_model *m);
size_t krun_model_chunk(const krun_model *m);               /* the decoding layout's prompt block */
size_t krun_model_max_seqs(const krun_model *m);            /* sessions live at once, at most */
size_t krun_model_block(const krun_model *m);               /* positions a decoding block holds: max(chunk, max_seqs) */
/* Positions the largest block holds: the prefill layout's (chunk auto), else krun_model_block. */
size_t krun_model_block_max(const krun_model *m);
/* How many positions the next block should hold when n positions of prompt
 * (and decoding tokens) are waiting: the cost model's choice between the
 * decoding block and the prefill block (kmemplan_prompt, from the phase the
 * model is in).  A block of more than krun_model_block positions runs in the
 * prefill layout: the model switches phase before it (and back before the
 * next block that fits the decoding layout). */
size_t krun_model_prompt_block(const krun_model *m, size_t n);
/* 1 while the model is in the prefill layout (its flex region holds a large block's activations). */
int krun_model_in_prefill(const krun_model *m);
/* Called after each layer of every forward block (layers done, of n):
 * progress inside a long block, from the thread that runs it.  NULL: none. */
typedef void (*krun_layer_fn)(void *ctx, int done, int n);
void krun_model_set_layer_hook(krun_model *m, krun_layer_fn fn, void *ctx);
/* Bytes of run state, session slots and the flex region: as planned (from
 * the same layout functions) and as allocated at prepare. */
void krun_model_memory(const krun_model *m, uint64_t *planned, uint64_t *allocated);
int krun_model_trace_write(krun_model *m, const char *path);

/* The compute kernels' path (process-wide, the same bits on each): a --simd
 * name ("scalar", "avx2", "avx512") as a level for krun_model_opts.simd, -1
 * if the name is unknown; the name of the path in use. */
int krun_simd_parse(const char *name);
const char *krun_simd_name(void);

/* Bytes of one session's slot for ctx positions (the plan's state = max_seqs x this). */
size_t krun_session_bytes(const k3_config *c, size_t ctx);

/* A new session at position 0 (greedy sampling).  Fails with KRUN_EINPUT
 * when max_seqs sessions are live. */
int krun_session_new(krun_model *m, krun_session **out, krun_err *err);
void krun_session_free(krun_session *s);
/* Back to position 0, empty history. */
void krun_session_reset(krun_session *s);

/* Run the pending tokens (krun_session_append), then ids[0..n), in blocks of
 * the model's chunk (chunk auto: as krun_model_prompt_block says).  all_logits: NULL, or room for the logits of every
 * position run, [pending + n][vocab].  The last position's logits are kept
 * (krun_session_logits).  Ids must be in the vocabulary and the history must
 * fit the context (KRUN_EINPUT, nothing run); logits that are not finite stop
 * it (KRUN_EDATA). */
int krun_session_feed(krun_session *s, const int32_t *ids, size_t n, float *all_logits, krun_err *err);
/* Add ids to the history without running them: the next feed runs them
 * first.  A generated token that was not fed back is recorded this way, so a
 * saved state continues exactly where the conversation is. */
int krun_session_append(krun_session *s, const int32_t *ids, size_t n, krun_err *err);
/* Logits [vocab] of the last position run; NULL before any. */
const float *krun_session_logits(const krun_session *s);
size_t krun_session_pos(const krun_session *s);              /* positions run */
size_t krun_session_ctx_of(const krun_session *s);           /* positions its context holds */
size_t krun_session_pending(const krun_session *s);          /* tokens appended, not yet run */
const int32_t *krun_session_tokens(const krun_session *s, size_t *n);  /* the history: run, then pending */

/* Sampling (sampler.h has the contract).  The token chosen at position p is a function of
 * the logits of position p - 1, the options, the history before p, the reply start and the
 * mask only (the random draw is keyed by the seed and p): sampling the same position twice
 * gives the same token, and a speculative verification picks exactly as plain decoding. */
void krun_session_set_sampler(krun_session *s, const ksampler_opts *o);
const ksampler_opts *krun_session_sampler(const krun_session *s);
/* The next token (at position krun_session_pos) from the last logits; -1 if there are none
 * or the mask allows no token. */
int32_t krun_session_sample(krun_session *s);
/* Where the reply begins: frequency and presence penalties count the tokens from history
 * index `at` on (repetition_penalty counts the whole history).  0 after new and reset; a
 * caller sets it after feeding the prompt (or to the prompt's length before).  Saved and
 * loaded with the state. */
void krun_session_set_reply_start(krun_session *s, size_t at);
size_t krun_session_reply_start(const krun_session *s);
/* Constrained decoding: before each pick the session calls fn(ctx, tokens, pos, allowed)
 * for the token at position pos, the history before it being tokens[0..pos); fn fills
 * allowed, a bitmap of vocab bits (token i is bit i % 64 of word i / 64; every word must be
 * written), and returns 0 to apply it, 1 for no constraint at this position, -1 for none
 * possible (the pick returns -1).  The mask applies before the temperature and the filters
 * (sampler.h).  During a speculative verification fn is called for consecutive positions
 * with the drafts in tokens[], and after a rejected draft the next call may name a position
 * before the last one called (the history it saw beyond is not the sequence's): a grammar
 * must derive its state from tokens[0..pos).  NULL: no mask (the default; new clears it). */
typedef int (*krun_mask_fn)(void *ctx, const int32_t *tokens, size_t pos, uint64_t *allowed);
void krun_session_set_mask(krun_session *s, krun_mask_fn fn, void *ctx);

/* Called after each forward block of a feed: positions done of total (and,
 * with a layer hook on the model, inside each block: krun_model_set_layer_hook). */
typedef void (*krun_progress_fn)(void *ctx, size_t done, size_t total);
void krun_session_set_progress(krun_session *s, krun_progress_fn fn, void *ctx);

/* Advance n distinct sessions by one token each (ids[k] for ss[k], after its
 * pending tokens) in one forward block.  Each session's logits are
 * bit-identical to feeding it alone. */
int krun_step_batch(krun_model *m, krun_session *const *ss, const int32_t *ids, size_t n, krun_err *err);
/* The next krun_step_batch(_verify) that runs s writes the logits of every position s runs in it
 * (its pending tokens, then its id: at most rows of them, and no drafts, else KRUN_EINPUT,
 * nothing run) to buf[positions][vocab], as krun_session_feed's all_logits does; the last row is
 * also the session's logits.  One step only: the buffer is the caller's again after it (NULL:
 * none).  Each row is bit-identical to what a plain step computes for that position. */
int krun_session_all_logits(krun_session *s, float *buf, size_t rows);

/* Speculative decoding (docs/RUNTIME.md §7), exact at any sampling setting:
 * runs id (a token sampled from the session's logits, as krun_session_feed
 * would), preceded by any pending tokens, together with up to max_draft
 * tokens drafted from the session's own history, in one forward block, and
 * keeps the drafts the session's sampler itself picks at their positions
 * (sampler.h: a pick depends on its position's logits, the history and the
 * seed only, so these are the tokens plain decoding samples).  Those
 * accepted tokens (*n_accepted of them, never a stop id of the model) are
 * written to accepted[] and the logits each was chosen from to
 * accepted_logits[*n_accepted][vocab] (either may be NULL); they are part of
 * the history and have run, and the session's logits are those after the
 * last of them, so the caller samples its next token as after a feed.
 * Everything (ids, logits, the state and a saved state) is bit-identical to
 * feeding id and then each accepted token one at a time.  With no drafts
 * (nothing in the history predicts the next tokens, or the model was
 * prepared with spec 0) it is exactly krun_session_feed of id.
 * Not for sessions stepped with krun_step_batch in the same round: one
 * session verifies at a time. */
int krun_session_feed_spec(krun_session *s, int32_t id, size_t max_draft, int32_t *accepted, float *accepted_logits,
                           size_t *n_accepted, krun_err *err);
/* The same with the caller's drafts (another drafter: a small model, a
 * server's cache): id, then draft[0..k) (k at most the model's spec, and
 * within the context), verified in one block; the accepted prefix of the
 * drafts is kept exactly as by krun_session_feed_spec.  Bad ids, too many
 * drafts or no room: KRUN_EINPUT, nothing run. */
int krun_session_verify(krun_session *s, int32_t id, const int32_t *draft, size_t k, int32_t *accepted, float *accepted_logits,
                        size_t *n_accepted, krun_err *err);

typedef struct krun_spec_stats {
    uint64_t sweeps;           /* forward blocks krun_session_feed_spec ran (one per call), and batched
                                  steps in which the session verified drafts */
    uint64_t verifications;    /* of them, blocks that carried drafts */
    uint64_t drafted;          /* draft tokens verified */
    uint64_t accepted;         /* of them, accepted */
    uint64_t rollbacks;        /* verifications that rejected a draft: the state kept only a prefix of the block */
    /* of them, the EAGLE drafter's (the rest came from the text: prompt lookup) */
    uint64_t drafter_verifications, drafter_drafted, drafter_accepted;
} krun_spec_stats;
/* Counted since the session was created or reset. */
void krun_session_spec_stats(const krun_session *s, krun_spec_stats *st);
/* The drafter back to its start and the statistics to 0, the state kept: a
 * request that starts from a kept state (the prefix cache) drafts as one in
 * a new session would. */
void krun_session_spec_restart(krun_session *s);

/* ---- copies and snapshots ------------------------------------------------------
 *
 * A session's whole state -- the sequential state of the positions it ran (KDA
 * recurrent states and ShortConv histories, the MLA latent rows), its history
 * with its pending tokens, its last logits, its sampler (options -- the seed
 * and stream that key the draw -- and the reply start) and its drafter --
 * copied into another session, or into a snapshot kept outside the session
 * slots, and back.  The copy continues exactly as the original would: every
 * feed, sample and step gives the same bits (probe_session copy; the draw
 * depends on the position, so there is no generator state to carry).  What
 * is not copied: the progress callback and the mask (the caller's: the
 * target keeps its own) and the spec statistics (counted per session).
 *
 * One prefill, several continuations (n > 1 choices): feed the prompt once,
 * krun_session_copy it into n - 1 other sessions, give each its own sampler.
 * A copy costs the state of the positions run: at full scale 464.6 MB of KDA
 * state plus 55 KB per position (docs/STATE.md §1), a memcpy, no model read. */

/* dst (a live session of the same model, not src) becomes src.  Fails with
 * KRUN_EINPUT, dst unchanged, when src's last feed failed or its history does
 * not fit dst's context. */
int krun_session_copy(krun_session *dst, const krun_session *src, krun_err *err);

typedef struct krun_snapshot krun_snapshot;
/* Bytes of a snapshot with room for a history of cap tokens (the KDA state,
 * cap MLA rows, cap tokens, the logits): for a caller's budget. */
size_t krun_snapshot_bytes(const krun_model *m, size_t cap);
/* A snapshot buffer for histories of up to cap tokens (KRUN_ENOMEM). */
int krun_snapshot_new(krun_model *m, size_t cap, krun_snapshot **out, krun_err *err);
void krun_snapshot_free(krun_snapshot *snap);
/* snap becomes a copy of s (KRUN_EINPUT when s's last feed failed or its
 * history is longer than the snapshot's cap; snap unchanged). */
int krun_snapshot_take(krun_snapshot *snap, const krun_session *s, krun_err *err);
/* s (live, of the snapshot's model) becomes the snapshot's session, exactly
 * as it was taken (KRUN_EINPUT when the history does not fit s's context or
 * the snapshot is empty; s unchanged).  A snapshot may be restored any
 * number of times. */
int krun_snapshot_restore(krun_session *s, const krun_snapshot *snap, krun_err *err);
/* The snapshot's history (NULL and 0 before the first take) and positions run. */
const int32_t *krun_snapshot_tokens(const krun_snapshot *snap, size_t *n, size_t *pos);

/* ---- snapshots inside a block, and session slots (the prefix cache) -----------
 *
 * krun_session_mark arranges for a copy of the state after the first `at`
 * tokens of s's history to be taken while a later krun_session_feed or
 * krun_step_batch runs position at - 1: in the same forward block, without a
 * pass of its own (each KDA layer copies its head states and ShortConv history
 * as the recurrence passes that position; the MLA rows up to it are kept by
 * the block).  The prefix cache takes one at the end of a chat's system/tools
 * preamble, which seldom ends a block (docs/RUNTIME.md §9).  The copy has the
 * history's first `at` tokens, all run, and the logits of position at - 1 when
 * the block computed them (the position ended its segment).  A block that
 * runs past the position without taking it (a verification block), a failed
 * block, and a reset or free of s drop the mark. */
enum { KRUN_MARK_NONE = 0, KRUN_MARK_PENDING = 1, KRUN_MARK_TAKEN = 2, KRUN_MARK_DROPPED = 3 };
/* Into dst: another session slot of the model, idle (not live), which cannot
 * be claimed until the mark is taken or dropped; its state is replaced. */
int krun_session_mark(krun_session *s, size_t at, krun_session *dst, krun_err *err);
/* Into a state file at path (docs/STATE.md, written through the safe writer:
 * each layer as the block is done with it, then renamed into place), without
 * the logits.  Needs a model prepared with o.cache; one such mark at a time
 * per model. */
int krun_session_mark_save(krun_session *s, size_t at, const char *path, krun_err *err);
/* The same beneath the open directory dirfd (name: a name in it), never through its path
 * (savefile.h, ksave_begin_at). */
int krun_session_mark_save_at(krun_session *s, size_t at, int dirfd, const char *name, krun_err *err);
/* KRUN_MARK_*: pending, taken, dropped (*why: the reason), or none. */
int krun_session_mark_status(const krun_session *s, const char **why);
void krun_session_unmark(krun_session *s);

/* The session slots: max_seqs of them.  A freed session keeps its state in
 * its slot until the slot is taken again: krun_session_claim makes an idle
 * slot live again exactly as it was (its history, state and logits; its
 * sampler and reply start must be set, its mask is cleared), where
 * krun_session_new resets the slot it takes. */
size_t krun_model_slots(const krun_model *m);
krun_session *krun_model_slot(krun_model *m, size_t k);
int krun_session_live(const krun_session *s);
int krun_session_claim(krun_session *s, krun_err *err);
/* Forget the pending tokens (appended, not run): the history ends at the
 * positions run. */
void krun_session_drop_pending(krun_session *s);

/* Speculation inside a batched step (krun serve's sweeps).  krun_session_draft
 * proposes up to max drafts for the tokens after id (the token the caller
 * sampled and will step): from the session's own history (its prompt
 * included) with its adaptive drafter (spec.h), else from the histories of
 * others[] (other live sessions, or the prefix cache's entries
 * (krun_pcache_ram_entries): the longest continuation any of them offers, by
 * the same evidence rule); 0 when nothing is evidence.
 * krun_step_batch_verify is krun_step_batch where session k's id is followed
 * by its drafts[k][0..nd[k]) (nd[k] = 0: a plain step; a session with drafts
 * must have no pending tokens): one forward block in which the verification
 * positions join the others, each session keeping the drafts its sampler
 * picks (*n_accepted[k] of them, now the last tokens of its history, run)
 * exactly as krun_session_verify would.  The block's verification positions
 * (drafts + 1 per verifying session) share the journal: at most `rows`
 * positions in at most `seqs` sessions (krun_model_journal; rows = the
 * model's spec + 1, seqs = rows / 2), and every position counts against the
 * block (krun_model_block).  Beyond them: KRUN_EINPUT, nothing run. */
void krun_model_journal(const krun_model *m, size_t *rows, size_t *seqs);
/* krun_session_draft for n sessions of one sweep at once (ss[k] will step ids[k], up to max[k]
 * drafts into out[k], nd[k] of them): from each one's text, else another's; where no text has
 * evidence, from the model's EAGLE drafter (krun_model_opts.draft), the chains of every such
 * session run in lockstep (its weights read once per step for all of them), each as wide as
 * its acceptance so far and the sweep's costs say pays (n sequences share the trunk's bytes).
 * -1 with err when the drafter cannot read an embedding row (the model file). */
int krun_sessions_draft(krun_model *m, krun_session *const *ss, const int32_t *ids, const size_t *max, size_t n,
                        krun_session *const *others, size_t n_others, int32_t *const *out, size_t *nd, krun_err *err);
size_t krun_session_draft(krun_session *s, int32_t id, size_t max, krun_session *const *others, size_t n_others, int32_t *out);
int krun_step_batch_verify(krun_model *m, krun_session *const *ss, const int32_t *ids, const int32_t *const *drafts,
                           const size_t *nd, size_t n, size_t *n_accepted, krun_err *err);

/* ---- several machines (docs/RUNTIME.md §10) -------------------------------------
 *
 * `mpirun -np N krun ...` starts N processes (ranks), one per machine.  Rank 0
 * runs the command as one process would (the tokenizer, sampling, HTTP, the
 * journal); its model is computed by the cluster: the other ranks read and
 * compute the experts on their own disks, and trunk layers in their own
 * budgets (pipeline stages).  Every id and logit is bit-identical to one
 * process. */

/* First thing in main(): under mpirun with several ranks, join them (-1 with
 * err when this build has no MPI: the message says what to install).
 * Returns this process's rank: 0 runs the command, any other
 * krun_cluster_follow.  One process: 0, nothing done. */
int krun_cluster_start(int *argc, char ***argv, krun_err *err);
int krun_cluster_rank(void);
int krun_cluster_size(void);
/* A rank other than 0: open the file rank 0 names and compute its part, with
 * this rank's own budget, threads, I/O threads and SIMD path (own: from its
 * own command line; everything the ranks must share comes from rank 0),
 * until rank 0 stops.  Returns the exit status (0 after rank 0's stop, also
 * when this rank failed and told rank 0 why). */
int krun_cluster_follow(const krun_model_opts *own, krun_err *err);
/* After krun_cluster_follow failed: fall silent and wait for rank 0's stop
 * (rank 0 notices within KRUN_CLUSTER_TIMEOUT and says which rank was lost). */
void krun_cluster_linger(void);
/* What each rank of the model's cluster did so far (rank 0 first): its
 * host, the trunk layers it computes, its reads, the experts it computed for
 * other ranks, the bytes it sent and received.  Returns how many ranks were
 * written (at most max); 0 in one process; -1 with err. */
typedef struct krun_rank_info {
    char who[96];
    int layers;
    krun_stats st;
    uint64_t experts_served, experts_predicted, bytes_sent, bytes_received;
} krun_rank_info;
int krun_model_ranks(krun_model *m, krun_rank_info *out, int max, krun_err *err);
/* 1 when the model's cluster can compute nothing more (a rank, or the
 * network to it, was lost; a block failed half way on the ranks), with why;
 * 0 in one process. */
int krun_model_cluster_lost(const krun_model *m, krun_err *why);

/* The cluster's plan (krun --plan under mpirun, or --ranks N: N machines
 * like this one): who computes which trunk layers, each rank's memory plan,
 * and what a decoding sweep of o->max_seqs sequences reads and sends,
 * costed at disk_mbps per drive (MB/s; a stripe reads at the sum of its
 * drives) and net_mbps (0: not costed): every rank's trunk streamed in turn,
 * each MoE layer's experts at the pace of the slowest disk they are given
 * to (the mean over random top-k choices, assigned as the runtime assigns
 * them), the hidden state's hops and the experts' rows and outputs over the
 * network.  Reading and sending only: compute is not counted. */
typedef struct krun_rank_plan {
    char who[96];
    uint64_t budget;                  /* 0: none (the file in place) */
    int layers, first, last;          /* the trunk layers it computes (first..last; 0 layers: first = last = -1) */
    int pinned;                       /* of them held */
    int expert_slots, drives;         /* its expert cache; the disks its trunk is read from */
    uint64_t total;                   /* its plan's bytes */
    double trunk_bytes, expert_bytes; /* read per sweep (lm_head's streamed pieces in rank 0's trunk) */
    double sent, received;            /* over the network, per sweep */
} krun_rank_plan;
typedef struct krun_cluster_plan {
    int nranks, hypothetical;
    size_t seqs;                      /* sequences per sweep */
    double disk_mbps, net_mbps;
    int hops;                         /* the hidden state's moves between ranks per sweep */
    krun_rank_plan rank[KRUN_MAX_RANKS];
    double trunk_bytes, expert_bytes, net_bytes;  /* per sweep */
    double s_trunk, s_experts, s_net, s_sweep;    /* seconds per sweep */
    double s_token, tokens_per_hour;
} krun_cluster_plan;
int krun_model_cluster_plan(krun_model *m, const krun_model_opts *o, int hypothetical, double disk_mbps, double net_mbps,
                            krun_cluster_plan *out, krun_err *err);
void krun_cluster_plan_print(const krun_cluster_plan *p, FILE *out);
json_t *krun_cluster_plan_json(const krun_cluster_plan *p);
/* The EAGLE drafter of a session, for tests and tools.  Its committed rows [*start, *n) (row q at
 * rows + q * *width: the normalised kv latent, then the rotated rope key) and the pending row's
 * fused taps (*pending [hidden], NULL when none); NULL when the model has no drafter. */
const float *krun_session_draft_rows(const krun_session *s, size_t *start, size_t *n, size_t *width, const float **pending);
/* The drafter's chain for the token id the session would run next (its pending tokens run,
 * nothing verified, its state unchanged): up to k drafts into out, every step's logits into
 * logits [k][vocab] (may be NULL).  Returns how many it drafted (0: it cannot: no drafter, or
 * no pending row), -1 with err. */
long krun_session_propose(krun_session *s, int32_t id, size_t k, int32_t *out, float *logits, krun_err *err);

/* The session's state (KDA, ShortConv, MLA latent cache, position, history
 * with pending tokens, last logits, the sampler's seed and stream, the reply start) to a file, in the format of
 * docs/STATE.md, through the one safe writer (savefile.h): path is new or an
 * earlier state file, which is replaced whole or not at all. */
int krun_session_save(const krun_session *s, const char *path, krun_err *err);
/* The same as a new file beneath the open directory dirfd (name: a name in it), never through its
 * path (the prefix cache: whatever the directory's path names later gets nothing). */
int krun_session_save_at(const krun_session *s, int dirfd, const char *name, krun_err *err);
/* The same bytes into a save the caller began and will commit (krun chat's
 * /save writes a pair of files, docs/CHAT.md). */
int krun_session_save_to(const krun_session *s, ksave *out, krun_err *err);
/* Replace the session's state by a saved one, read straight into the
 * session's buffers (no copy of the file: loading stays within the plan).
 * A file from another model file or geometry, truncated, or holding more
 * positions than the context is refused (KRUN_EINPUT) with the session left
 * as it was; one whose payload is damaged (its checksum, an id or a float,
 * found while it is read in) is refused with the session reset: what was
 * read is never used. */
int krun_session_load(krun_session *s, const char *path, krun_err *err);
/* The same from an open file (name: for messages). */
int krun_session_load_fd(krun_session *s, int fd, const char *name, krun_err *err);
/* The same from a state file's image in memory (name: for messages). */
int krun_session_load_mem(krun_session *s, const void *buf, size_t len, const char *name, krun_err *err);

#endif
