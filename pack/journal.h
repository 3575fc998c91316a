/* The conversion journal (OUT.journal): which extents of OUT.partial are
 * complete and durable.  A header names the plan; each record says "extent i
 * is written, its XXH3 is h".  Records are appended only after the extent
 * data has been fdatasync'ed, so a record never outlives its data.  A torn
 * last record fails its own checksum and is ignored.  docs/FORMAT.md §9. */
#ifndef JOURNAL_H
#define JOURNAL_H

#include <stdint.h>

#define KJ_HEADER_SIZE 64u
#define KJ_RECORD_SIZE 32u

typedef struct kjournal {
    int fd;
    uint64_t plan_id;
    uint64_t n_records;      /* valid, consecutive records 0..n-1 */
} kjournal;

typedef struct kj_record {
    uint32_t extent;
    uint64_t stored_xxh3;
    uint64_t stored_len;
} kj_record;

/* Create (truncate) a journal for plan_id. */
int kj_create(kjournal *j, const char *path, uint64_t plan_id, uint32_t n_extents, uint64_t file_size);
/* Open an existing journal: 0 if it belongs to plan_id (records are read
 * into *recs, malloc'd, *n set), 1 if it is for another plan or not a
 * journal (the caller starts over), -1 with errno when it cannot be read
 * (an I/O error: the caller must not throw the partial file away). */
int kj_open(kjournal *j, const char *path, uint64_t plan_id, kj_record **recs, uint64_t *n);
/* Drop records past n (after a failed re-verification). */
int kj_truncate(kjournal *j, uint64_t n);
/* Append records and make them durable. */
int kj_append(kjournal *j, const kj_record *recs, uint64_t n);
void kj_close(kjournal *j);

#endif
