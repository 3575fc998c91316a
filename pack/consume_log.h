/* The consume log, OUT.consumed (docs/FORMAT.md §14.1): what `kpack convert
 * --consume` keeps of each source shard it deletes, next to the journal.
 *
 * A record is appended, synced and read back before its shard is deleted, so
 * a record never describes a shard whose bytes are lost: it holds the shard's
 * identity (name, size, mtime, SHA-256s: what the plan and the manifest need
 * of it once it is gone), its header bytes (a resumed run parses the header
 * from here) and the pieces of its archive extent that are not in the
 * partial files yet (the archive extents come last; the shard goes long
 * before).  The header names the plan and the command that began the
 * conversion, for the messages of a resume that cannot go on.  Records are
 * variable length, each with its own checksum; a reader takes the longest
 * valid prefix (a torn last record is ignored: its shard was not deleted). */
#ifndef KPACK_CONSUME_LOG_H
#define KPACK_CONSUME_LOG_H

#include <stddef.h>
#include <stdint.h>

/* A byte range of the shard kept in the log: [src_off, src_off + len) of the
 * shard file, stored at log offset `at`. */
typedef struct kc_piece { uint64_t src_off, len, at; } kc_piece;

typedef struct kc_record {
    char *name;              /* the shard's name in SRC (as the index gives it) */
    char *blob;              /* a Hugging Face blob deleted with it (its path), or NULL */
    uint64_t size, alloc_bytes;
    int64_t mtime_ns;
    char expect_sha[65], got_sha[65]; /* "" when not known / not computed */
    char sha_from[16];       /* "--sha256", "hf-blob" or "" */
    kc_piece *pieces;        /* the header first (src_off 0), then by src_off */
    uint32_t n_pieces;
    uint64_t end;            /* log offset after the record */
} kc_record;

typedef struct kc_log {
    int fd;
    char *path;
    uint64_t plan_id;
    char *command;           /* the command line that created the log */
    kc_record *recs;         /* the valid prefix, in order */
    size_t n;
    uint64_t end;            /* where the next record goes */
} kc_log;

/* Open path (read-only when it may not be written; nothing is changed): 0
 * and *log filled (the valid prefix of its records), 1 if there is no log (or only a torn header: nothing was ever
 * deleted, so nothing depends on it), -1 on an I/O error or a log that is not
 * one (err says which). */
int kc_log_open(kc_log *log, const char *path, char *err, size_t errlen);
/* Before appending to an opened log: cut off a torn last record. */
int kc_log_trim(kc_log *log, char *err, size_t errlen);
/* Create (truncate) the log for plan_id and command, synced. */
int kc_log_create(kc_log *log, const char *path, uint64_t plan_id, const char *command, char *err, size_t errlen);
/* Append a record (rec's pieces' `at` are set from their order), with the
 * pieces' bytes in data (in piece order, concatenated); fdatasync it, drop
 * it from the page cache and read it back from the device: 0 only when the
 * record is durable and reads back intact. */
int kc_log_append(kc_log *log, const kc_record *rec, const uint8_t *data, char *err, size_t errlen);
/* The last record for shard name, or NULL. */
const kc_record *kc_log_find(const kc_log *log, const char *name);
/* Read len bytes of a piece at offset off into it. */
int kc_log_read(const kc_log *log, const kc_piece *pc, uint64_t off, void *dst, uint64_t len);
void kc_log_close(kc_log *log);

#endif
