/* What a conversion keeps of the download besides the model, so that every
 * file can be rebuilt exactly (docs/FORMAT.md §9; issue 13): the shards'
 * headers, gap bytes and non-text tensors (planned in plan.c from the parsed
 * headers), and every other regular file under --keep-max found in the
 * source directory (listed here).  Files not kept are listed with a reason,
 * so a rebuild can say what it cannot give back. */
#ifndef KPACK_ARCHIVE_H
#define KPACK_ARCHIVE_H

#include "source.h"

#include <stdint.h>

#define KA_KEEP_MAX_DEFAULT ((uint64_t)64 << 20)

/* A small file of the download, kept whole (manifest kind "file"). */
typedef struct ka_file {
    char *name;              /* relative to the download directory, '/'-separated */
    char *path;              /* where it is read from */
    uint64_t size;
    int64_t mtime_ns;
    char expect_sha[65];     /* "" if unknown */
    const char *sha_from;    /* "--sha256" or "hf-blob" */
    char got_sha[65];        /* computed, when expected */
} ka_file;

typedef struct ka_skip { char *name; uint64_t size; char *reason; } ka_skip;

typedef struct ka_archive {
    uint64_t keep_max;
    ka_file *files;          /* sorted by name (bytewise) */
    size_t n_files;
    ka_skip *not_kept;       /* sorted by name */
    size_t n_not_kept;
    uint64_t kept_bytes;     /* of the files */
    int io_errno;            /* ka_check_sha256 could not read a file */
} ka_archive;

/* List the source directory (recursively; symbolic links to regular files
 * followed, to directories not) against src's shards: every regular file
 * that is not a shard is kept if it has at most keep_max bytes, else listed
 * in not_kept.  Files of this conversion's own output (OUT and what is named
 * after it, when OUT lies in the directory) are skipped.  Expected SHA-256:
 * from sums (may be NULL) or Hugging Face blob names.  0, or -1 with err. */
int ka_scan(const k3_source *src, const char *out, uint64_t keep_max, const char *sums, ka_archive *a, char *err,
            size_t errlen);
/* Hash every kept file with an expected SHA-256; a mismatch is an error
 * naming the file (the download is damaged: nothing is converted). */
int ka_check_sha256(ka_archive *a, char *err, size_t errlen);
void ka_free(ka_archive *a);

#endif
