/* The conversion journal, version 2 (OUT.journal; docs/FORMAT.md §14):
 * which extents of the partial member files are complete and durable, and
 * where they were placed.  A header names the plan; each record says
 * "extent i is in member m at offset o, stored_len bytes, these hashes, these
 * blocks".  Records are appended in extent order, only after the data they
 * describe has been fdatasync'ed, so a record never outlives its data.  A
 * torn last record fails its own checksum and is ignored. */
#ifndef KPACK_JOURNAL_H
#define KPACK_JOURNAL_H

#include "format/kpk.h"

#include <stdint.h>

#define KJ_HEADER_SIZE 64u
#define KJ_RECORD_FIXED 48u          /* a record without blocks, before its checksum */

typedef struct kjournal {
    int fd;
    uint64_t plan_id;
    uint64_t n_records;      /* valid, consecutive records 0..n-1 */
    uint64_t end;            /* file offset after the last valid record */
} kjournal;

typedef struct kj_record {
    uint32_t extent;
    uint16_t member;         /* a member file, or KPK_STRIPED */
    uint32_t n_blocks;
    uint64_t offset, stored_len, stored_xxh3, raw_xxh3;
    kpk_block *blocks;       /* n_blocks, or NULL */
} kj_record;

/* Create (truncate) a journal for plan_id. */
int kj_create(kjournal *j, const char *path, uint64_t plan_id, uint32_t n_extents, uint16_t n_members);
/* Open an existing journal: 0 if it belongs to plan_id (the longest valid
 * prefix of records is read into *recs, malloc'd, *n set; kj_free_records),
 * 1 if it is for another plan, too short or damaged in its header (the caller
 * starts over), -1 on I/O error (errno). */
int kj_open(kjournal *j, const char *path, uint64_t plan_id, kj_record **recs, uint64_t *n);
void kj_free_records(kj_record *recs, uint64_t n);
/* Drop records past n (after a failed re-verification); recs are the ones kj_open returned. */
int kj_truncate(kjournal *j, const kj_record *recs, uint64_t n);
/* Append records and make them durable. */
int kj_append(kjournal *j, const kj_record *recs, uint64_t n);
void kj_close(kjournal *j);

#endif
