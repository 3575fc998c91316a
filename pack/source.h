/* A downloaded Kimi K3 checkpoint directory, indexed and checked (the
 * `check-source` logic, which `convert` runs first).  Opening never stops at
 * the first problem: every shard gets a verdict and a list of problems, so
 * the user sees everything that is wrong in one run. */
#ifndef KPACK_SOURCE_H
#define KPACK_SOURCE_H

#include "safetensors.h"
#include "format/k3_config.h"
#include "format/k3_schema.h"
#include "format/kprogress.h"

#include <stdint.h>

#define KS_MAX_PROBLEMS 12   /* listed per shard; the rest are counted */

typedef struct ks_shard {
    char *name;              /* file name as the index gives it */
    char *path;              /* DIR/name */
    int present;             /* the file exists */
    int parsed;              /* its header parsed */
    st_file st;
    uint64_t size;           /* on disk */
    uint64_t alloc_bytes;    /* blocks actually allocated (sparse files use less) */
    int64_t mtime_ns;
    uint64_t n_tensors;      /* text tensors it holds */
    char expect_sha[65];     /* "" if unknown */
    const char *sha_from;    /* "--sha256" or "hf-blob" */
    int hf_blob;             /* a symlink to blobs/<sha256> of a Hugging Face cache */
    char got_sha[65];        /* "" if not computed */
    char *problems[KS_MAX_PROBLEMS];
    size_t n_problems;       /* may exceed KS_MAX_PROBLEMS */
    int io_errno;            /* the file could not be read (EIO, EACCES...): 0 if it could */
    int gone;                /* deleted by `convert --consume`: identity and header from its record */
    int recorded;            /* present, with a consume record (not yet deleted, or put back): its
                                identity is the record's */
} ks_shard;

/* A shard `kpack convert --consume` deleted, as its consume record keeps it
 * (consume_log.h): a conversion resumed after it is gone takes it as present
 * with this identity and this header. */
typedef struct ks_gone {
    const char *name;
    uint64_t size, alloc_bytes;
    int64_t mtime_ns;
    const char *expect_sha, *got_sha, *sha_from; /* "" when not known */
    /* its first 8 + N bytes, malloc'd into *head: 0, or -1 with errno */
    int (*read_header)(const void *ctx, uint8_t **head, uint64_t *len);
    const void *ctx;
} ks_gone;

/* A small file copied verbatim into the KPK meta extent. */
typedef struct ks_extra {
    const char *name;        /* "config.json", "tiktoken.model", "tokenizer_config.json" */
    char *data;
    size_t len;
} ks_extra;

typedef struct k3_source {
    char *dir;
    int hf_snapshot;         /* shards are symlinks into an HF cache blobs/ dir */
    int single_file;         /* model.safetensors without an index */
    k3_config cfg;
    int have_cfg;
    k3_schema schema;
    ks_shard *shards;
    size_t n_shards;
    ks_extra extras[3];
    size_t n_extras;
    /* For each canonical tensor index: which shard and which st_tensor. */
    uint32_t *loc_shard, *loc_tensor;
    uint64_t n_found, n_missing;
    const char **dropped;    /* non-text tensors (vision), not carried over */
    size_t n_dropped;
    uint64_t dropped_bytes;
    char *general[KS_MAX_PROBLEMS]; /* problems not tied to one shard */
    size_t n_general;
    uint64_t total_bytes;    /* sum of shard sizes */
    int io_errno;            /* config.json, the index or another small file could not be read */
    const ks_gone *gone;     /* while opening: the consumed shards (ks_open_gone) */
    size_t n_gone;
} k3_source;

/* Index the directory: config, index/shards, every header, coverage.
 * sums_path (sha256sum format) may be NULL.  Returns 0 when the directory
 * could be indexed at all (check ks_ok() for the verdict), -1 with err when
 * it cannot be read as a checkpoint (no config, no index, ...). */
int ks_open(const char *dir, const char *sums_path, k3_source *src, char *err, size_t errlen);
/* The same, for a directory some of whose shards `convert --consume`
 * deleted: a shard named in gone that is absent is taken from its record
 * (gone = 1); one that is present must have the recorded size and takes the
 * recorded identity (recorded = 1: the kill came between the record and the
 * deletion, or the file was put back). */
int ks_open_gone(const char *dir, const char *sums_path, const ks_gone *gone, size_t n_gone, k3_source *src, char *err,
                 size_t errlen);
void ks_free(k3_source *src);
/* 1 if no problem was found anywhere. */
int ks_ok(const k3_source *src);
/* An errno if some source file could not be read at all (an I/O error or a
 * permission, not missing or damaged content), else 0: the command then
 * "cannot run" (exit 2) rather than "the source is bad" (exit 1). */
int ks_io_errno(const k3_source *src);
/* errno values that mean "could not read", not "absent" or "bad content". */
int ks_is_io_errno(int e);
int ks_shard_ok(const ks_shard *s);
/* Bytes of tensor data with a known expected SHA-256. */
uint64_t ks_sha_bytes(const k3_source *src);
/* Compute SHA-256 of every shard with an expected hash, with `threads`
 * workers and a progress line; mismatches become shard problems. */
int ks_check_sha256(k3_source *src, int threads, int progress);
/* A sha256sum-format list: names (a leading "./" dropped) and hashes. */
typedef struct ks_sum { char *name; char sha[65]; } ks_sum;
int ks_sums_read(const char *path, ks_sum **out, size_t *n, char *err, size_t errlen);
void ks_sums_free(ks_sum *v, size_t n);
/* 1 if path is a symlink into a Hugging Face cache's blobs/<sha256>: sha gets it. */
int ks_hf_blob_sha(const char *path, char sha[65]);
/* SHA-256 of a file (hex), with progress; -1 with err (and *io_errno set
 * when the file could not be read; io_errno may be NULL). */
int ks_sha256_file(const char *path, char out[65], kprogress *prog, int *io_errno, char *err, size_t errlen);

/* Where a canonical tensor lives (NULL if missing). */
const st_tensor *ks_tensor(const k3_source *src, uint64_t canon, const ks_shard **shard);

#endif
