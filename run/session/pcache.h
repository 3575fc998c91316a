/* The prefix cache: a request starts from the longest kept state whose history
 * is an exact prefix of its own ids, and runs only the rest (docs/RUNTIME.md §9).
 *
 * An entry is an exact state: the positions [0, pos) of some history, run,
 * the sequential state after them and, when they were computed, the logits of
 * position pos - 1.  KDA is recurrent, so a state exists only where one was
 * kept; three points are:
 *   (a) the end of a request's prompt (krun_pcache_keep: with its logits);
 *   (b) the end of its reply (krun_pcache_end: the state it ends with; the
 *       last token sampled was never run and is not part of it);
 *   (c) the end of a chat's system/tools preamble (the `preamble` given to
 *       krun_pcache_begin): a snapshot inside the block that runs it
 *       (krun_session_mark), so that requests that share the preamble -- an
 *       agent's tools and instructions -- share its state.
 * An entry serves a history ids[0..n) when its tokens are ids[0..pos) and
 * pos < n, or pos == n with its logits (the next token is sampled from them).
 *
 * Where entries are kept:
 *   - RAM: the model's idle session slots (a request's slot keeps its state
 *     when the request ends; (a) and (c) are copied into another idle slot),
 *     so the cache costs no memory of its own beyond one KDA layer's buffer
 *     (krun_model_opts.cache) -- least recently used out;
 *   - disk (opts.dir): every entry is also written, in the state file format
 *     (docs/STATE.md), to DIR/k3-<set_id>-<config hash>/<hash>-<pos>[-l].krs,
 *     the hash being the XXH3-64 of its tokens, through the safe writer
 *     (temporary name, fsync, rename), by a thread of its own or at once;
 *     the directory's entries of this model are kept within opts.max_bytes,
 *     least recently used out (a file's mtime is its last use).  Files are
 *     never changed in place: several processes share a directory safely (a
 *     file is whole or absent; an entry evicted by another is simply missed).
 * A file that is damaged, truncated, of another version or of another model
 * (its header, geometry or contents not what its name and this model say) is
 * never used: it is removed with one warning.
 *
 * A cache takes every session of the model: sessions come from
 * krun_pcache_begin and go back with krun_pcache_end, never through
 * krun_session_new / free.  begin, keep and end are one thread's (the engine's);
 * the stats may be read from any. */
#ifndef KRUN_PCACHE_H
#define KRUN_PCACHE_H

#include "session.h"

#include <stdint.h>
#include <stdio.h>

typedef struct krun_pcache krun_pcache;

#define KRUN_PCACHE_DEFAULT_BYTES ((uint64_t)32 << 30)   /* --cache-size when not given */

typedef struct krun_pcache_opts {
    const char *dir;           /* entries on disk too (created if missing); NULL: RAM only */
    uint64_t max_bytes;        /* this model's entries in dir, at most (0: KRUN_PCACHE_DEFAULT_BYTES) */
    int background;            /* 1: a thread writes entries to disk (the server); 0: each is written when made */
    FILE *log;                 /* warnings (a damaged entry removed, a write that failed); NULL: none */
    const char *prog;          /* their prefix, e.g. "krun serve" */
} krun_pcache_opts;

typedef struct krun_pcache_stats {
    uint64_t lookups;          /* sessions begun */
    uint64_t hits;             /* of them, started from an entry */
    uint64_t hits_disk;        /* of those, from an entry read from disk */
    uint64_t positions_reused; /* positions the entries used had run */
    uint64_t made;             /* entries made (a, b, c) */
    uint64_t entries_ram, bytes_ram;     /* entries in idle slots now, and their states' bytes (as files) */
    uint64_t entries_disk, bytes_disk;   /* this model's entry files at the last look, and their bytes */
    uint64_t written, write_failed;      /* files written by this process; writes that failed */
    uint64_t evicted;          /* files removed to stay within max_bytes */
    uint64_t damaged;          /* files found damaged or foreign, removed */
} krun_pcache_stats;

/* Over a prepared model with no live session. */
int  krun_pcache_open(krun_model *m, const krun_pcache_opts *o, krun_pcache **out, krun_err *err);
/* Waits for the writes in progress; the sessions' slots keep their states. */
void krun_pcache_close(krun_pcache *c);

/* A live session for a history ids[0..n): it holds the longest entry that
 * serves it (*reused: the positions it had run, 0 without one), else it is
 * empty.  preamble: where the history's system/tools part ends (0: none); a
 * snapshot is arranged there when no entry has it.  The caller sets the
 * sampler, then feeds ids[*reused..n) (nothing when *reused == n: the logits
 * are there).  Fails only when no session slot is free (KRUN_EINPUT). */
int  krun_pcache_begin(krun_pcache *c, const int32_t *ids, size_t n, size_t preamble, krun_session **out, size_t *reused,
                       krun_err *err);
/* s (from begin) has just run the last token of its prompt: keep its state
 * (a).  Also completes the preamble snapshot. */
void krun_pcache_keep(krun_pcache *c, krun_session *s);
/* s's request is over: its state stays as an entry (b) unless its last feed
 * failed, and its slot is free.  Pending tokens are dropped. */
void krun_pcache_end(krun_pcache *c, krun_session *s);

void krun_pcache_get_stats(krun_pcache *c, krun_pcache_stats *st);
/* The entries held in RAM (idle slots) as sessions whose histories a drafter
 * may read (krun_session_draft's others[]): up to max of them into out.  Not
 * live: only their tokens are to be read, in the engine's thread, until its
 * next begin, keep or end. */
size_t krun_pcache_ram_entries(krun_pcache *c, krun_session **out, size_t max);
/* The entries' directory (DIR/k3-...), or NULL. */
const char *krun_pcache_dir(const krun_pcache *c);

#endif
