/* The state of `convert --consume` (internal to consume*.c; consume.h is
 * the interface). */
#ifndef KPACK_CONSUME_STATE_H
#define KPACK_CONSUME_STATE_H

#include "consume.h"
#include "consume_log.h"

#include <stdatomic.h>
#include <sys/types.h>

#define KC_NONE UINT32_MAX

/* One source shard. */
struct kc_shard {
    uint32_t rp;             /* release point: the last extent that reads it from its file */
    uint32_t archive;        /* its archive extent (KC_NONE: no archive) */
    int staged;              /* archive > rp: its archive pieces go through the log */
    int present;             /* its file is in SRC (not deleted by an earlier run) */
    size_t rec;              /* 1 + its record's index in the log, 0: none */
    dev_t dev;               /* the filesystem its bytes are on (a blob's, for a link) */
    uint64_t freed;          /* blocks its deletion gives back */
    char *blob;              /* the Hugging Face blob deleted with it (--consume-blobs), or NULL */
    const uint64_t *t;       /* the plan's tensors read from it, by offset in the shard */
    size_t nt;
    /* for the reader: set before `released` */
    kc_piece *pieces;
    uint32_t n_pieces;
    _Atomic int released;
};

struct kc_state {
    char *out, *log_path;
    kc_log log;
    int have_log;            /* log holds a log (opened, or created by kc_begin) */
    ks_gone *gone;
    size_t n_gone;
    /* bound to the plan */
    const kp_plan *p;
    const k3_source *src;
    int consume, blobs;
    struct kc_shard *sh;
    size_t n;
    uint64_t *by_shard;      /* tensor indices grouped by shard, each group by offset */
    uint32_t *waits;         /* per extent: the shard whose staged pieces it reads (KC_NONE) */
    uint8_t *is_rp;          /* per extent: some shard present here is released after it */
    int dirs_synced;
    char other_fs[600];
    /* progress */
    _Atomic uint64_t freed_now;
    _Atomic uint32_t released_now;
    char doing[200];
    _Atomic int doing_on;
};

/* consume_verify.c: shard s's bytes as they are durable (extents before
 * `done` in the partial files fds, read back from the device; its staged
 * pieces from data, in piece order, or from the log when data is NULL):
 * its SHA-256 when one was checked, else every extent's checksums.  0, or
 * -1 with err saying what does not match and *bad the first extent to write
 * again (the one that does not read back as written; its shard's first when
 * every extent reads back but the rebuilt shard is not the one checked). */
int kc_verify_shard(struct kc_state *c, uint32_t s, uint32_t done, const int *fds, const kc_piece *pieces, uint32_t n_pieces,
                    const uint8_t *data, kprogress *prog, uint32_t *bad, char *err, size_t errlen);

#endif
