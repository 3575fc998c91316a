/* `kpack convert SRC OUT --consume` (issue 36): each source shard is deleted
 * as soon as everything OUT needs of it is durable, so the conversion needs
 * about one shard of headroom instead of a second copy of the download.
 *
 * A shard F is released right after the last extent that reads it from
 * its file (its release point: in layer-major order the shard's last layer
 * extent, since the release has one layer per shard; the globals' shard
 * right after the globals).  Its archive extent comes at the end of OUT, so
 * the part of it that is F's own bytes (its header, any gaps and non-text
 * tensors: "the staged pieces") goes to the consume log first and is copied
 * from there when the archive extent is written.  The release, in the
 * dispatcher thread, once the journal is synced through the release point:
 *
 *   1. the staged pieces read from F;
 *   2. F verified from what is durable: rebuilt from the partial files (and
 *      the staged pieces) and compared with its SHA-256 when one was checked
 *      before the conversion began; otherwise every extent that holds its
 *      bytes read back from the device and compared with the checksums
 *      computed while F was read (each compressed block decoded too);
 *   3. its record (identity, header, staged pieces) appended to the consume
 *      log, synced and read back; the directories of the output synced;
 *   4. F deleted (a Hugging Face blob with its link), its directory synced.
 *
 * A kill at any moment leaves a state the same command resumes: a record
 * whose shard is still there is finished (deleted); a shard with no record
 * is still there.  A resumed run plans from the records (consume_log.h,
 * ks_open_gone) and never reads a deleted shard: if the journal no longer
 * covers a deleted shard's extents, it stops before writing and says what to
 * put back.  The safety rails (consume_check.c) run before anything. */
#ifndef KPACK_CONSUME_H
#define KPACK_CONSUME_H

#include "plan.h"
#include "space.h"
#include "format/kprogress.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kc_state kc_state;

/* Before the source is opened: OUT's consume log (OUT.consumed), if there
 * is one.  *c is always set (an empty state when there is no log); -1 with
 * err when the log cannot be read. */
int kc_load(kc_state **c, const char *out, char *err, size_t errlen);
void kc_free(kc_state *c);
/* The consumed shards the log records, for ks_open_gone (valid while c is). */
const ks_gone *kc_gone(const kc_state *c, size_t *n);
/* Shards the log records (deleted, or about to be). */
size_t kc_recorded(const kc_state *c);

/* After planning: where each shard is released, from the plan (which keeps
 * pointers to p and src).  consume: this run deletes shards. */
int kc_bind(kc_state *c, const kp_plan *p, const k3_source *src, int consume, char *err, size_t errlen);
/* The log is another plan's (other options, another source) while shards it
 * deleted are needed: -1 with err saying so and what to do. */
int kc_check_plan(const kc_state *c, char *err, size_t errlen);
/* A resume from extent `first` (kp_resume_point) never reads a deleted
 * shard: 0, or -1 with err naming the shards and what to do. */
int kc_check_resume(const kc_state *c, uint32_t first, char *err, size_t errlen);
/* The releases this run will make (for kp_space_measure), malloc'd, sorted;
 * consume_all: as if consuming (a plain run's "with --consume" figure). */
int kc_releases(const kc_state *c, uint32_t first, int consume_all, kp_release **rel, size_t *n);
/* The largest shard still to be released (0 if none) and its name. */
uint64_t kc_largest(const kc_state *c, const char **name);

/* The safety rails, before anything is written (consume_check.c): every
 * shard still here can be deleted and deleting it frees its space (a
 * regular file with one name, on a writable filesystem, not immutable; a
 * Hugging Face snapshot only with blobs, and then no other snapshot uses
 * them); no output file is a source file.  -1 with err naming the file. */
int kc_check_rails(kc_state *c, int blobs, char *err, size_t errlen);
/* Two conversions of one source, one of them consuming it, would fail
 * halfway: a consuming run holds SRC's directory exclusively, any other
 * conversion of it shared (flock).  *fd: the lock (-1 where the filesystem
 * has no locks); -1 with err when another kpack holds it. */
int kc_lock_source(const char *dir, int exclusive, int *fd, char *err, size_t errlen);
/* Source and output on different filesystems (nothing gained where OUT is
 * written): the note to print, or NULL. */
const char *kc_other_fs_note(const kc_state *c);
/* Ask on the terminal (stdin and stderr both terminals) before deleting
 * anything: 1 yes, 0 no (or no answer).  what: the summary line. */
int kc_confirm(const char *what);

/* Writing begins: the log opened (resumed) or created for the plan (command:
 * this command line); then every shard whose release point is already
 * durable (first extents journaled) and that is still here is released.
 * fds: the open partial member files.  0; -1 with err; 1 with err when an
 * extent before first does not read back as written: *redo is the first
 * extent to write again (the caller rolls the journal back to it, checks
 * kc_check_resume and calls kc_begin again). */
int kc_begin(kc_state *c, const char *command, uint32_t first, const int *fds, kprogress *prog, uint32_t *redo, char *err,
             size_t errlen);
/* 1 if extent i is the release point of a shard this run deletes. */
int kc_releases_at(const kc_state *c, uint32_t i);
/* The extents before `done` are durable (the journal is synced through
 * them; done > i): release each shard whose release point is i. */
int kc_release(kc_state *c, uint32_t i, uint32_t done, const int *fds, kprogress *prog, char *err, size_t errlen);
/* The conversion is published: the log goes. */
void kc_finish(kc_state *c);
/* OUT exists: if a run with --consume published it and was stopped before
 * it removed its log (OUT.consumed there, no OUT.partial), the note to
 * print with the refusal (what is left and what to do), else 0. */
int kc_finished_note(const char *out, char *note, size_t n);

/* For the reader thread (copy_read.c).  The shard whose bytes for extent e
 * come from the log once it is released, and must wait for that (UINT32_MAX:
 * none); whether shard s is released; its bytes [src_off + off, +len) from
 * the log (s released, src_off a staged piece's). */
uint32_t kc_waits_for(const kc_state *c, uint32_t e);
int kc_released(kc_state *c, uint32_t s);
int kc_read(kc_state *c, uint32_t s, uint64_t src_off, uint64_t off, void *dst, uint64_t len);
/* Extent e reads a shard deleted by an earlier run (its bytes are in the
 * partial files only: the size estimate samples other extents). */
int kc_extent_consumed(kc_state *c, uint32_t e);
/* The last extent that reads shard s from its file in this run (the reader
 * closes it there), or UINT32_MAX when the reader keeps it as usual. */
uint32_t kc_file_last_use(const kc_state *c, uint32_t s);

/* For the progress line and --json: space given back so far (by this run
 * and, for the totals, every run of this conversion). */
typedef struct kc_stats {
    uint32_t shards, released, released_now; /* shards in all; released in all; by this run */
    uint64_t freed_now, freed;               /* blocks given back by this run; in all (recorded sizes) */
    const char *doing;                       /* what a release is doing now, or NULL */
} kc_stats;
void kc_get_stats(kc_state *c, kc_stats *st);

#endif
