/* The conversion pipeline's shared state (internal to copy*.c).
 *
 * A ring of chunks moves through three stages:
 *
 *   reader (copy_read.c)      FREE -> FILLED: an extent's raw bytes, gathered
 *                             from the source; a chunk of a codec-2 extent
 *                             holds whole blocks;
 *   encoders (copy_encode.c)  FILLED -> ENCODED: the blocks of a codec-2 chunk
 *                             coded in parallel, each into its slot of the
 *                             chunk's out buffer (plain chunks skip this);
 *   dispatcher (copy.c)       -> BUSY: in ring order, hashes, places the
 *                             extent, queues the bytes to the member writers;
 *                             FREE again when every write from it is done.
 *
 * One mutex and one condition variable guard every state change. */
#ifndef KPACK_COPY_PIPE_H
#define KPACK_COPY_PIPE_H

#include "copy.h"
#include "format/kpk_encode.h"

#include <pthread.h>
#include <stdatomic.h>

#define KP_CHUNK ((size_t)16 << 20)  /* large sequential reads and writes */
#define KP_NBUF_MAX 12

enum { SLOT_FREE, SLOT_FILLED, SLOT_ENCODED, SLOT_BUSY };

struct pipe;

struct chunk {
    struct pipe *pp;
    int state;
    _Atomic int refs;    /* writes not yet done, + 1 while the dispatcher works on it */
    uint32_t extent;
    uint64_t pos;        /* offset inside the extent's decoded bytes */
    uint64_t len;
    int all_zero;        /* nothing but holes and gaps: buf not filled (reads as zeros) */
    uint32_t n_holes;    /* > 0: stands for this many whole extents of nothing but holes */
    uint8_t *buf;        /* raw bytes, buf_cap */
    size_t buf_cap;
    /* codec-2 chunks: blocks cut0 .. cut0 + ncut - 1 of the plan */
    uint32_t cut0, ncut;
    uint32_t next_cut, cuts_done; /* encoders: the next block to take, blocks finished */
    size_t *slot;        /* per block: where its stored bytes are written in out */
    size_t slot_cap;
    uint8_t *out;        /* stored bytes (compacted by the dispatcher before writing) */
    size_t out_cap;
};

struct pipe {
    const kp_input *in;
    const kp_plan *p;
    kpk_block *blocks;       /* the plan's block records (filled by the encoders) */
    int *shard_fd;
    uint64_t *shard_size;
    int *file_fd;            /* kept small files of the download (archive), lazily opened */
    uint32_t *last_use;      /* per shard: the last extent that reads from it */
    uint8_t *ends_shard;     /* per extent: 1 if it is some shard's last use */
    uint32_t first;
    size_t chunk_bytes;      /* raw bytes per chunk (KP_CHUNK; KPACK_TEST_CHUNK_BYTES in tests) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct chunk ring[KP_NBUF_MAX];
    unsigned nbuf;
    unsigned head, tail;     /* produced, dispatched counters */
    int reader_done, stop, failed;
    int damaged;             /* the failure is a damaged source KPK file */
    int enc_stop;            /* the encoders may exit */
    char err[800];
    uint64_t bytes_read;
    /* encoders */
    const kp_codec_opts *codec;
    struct kp_zero_memo *zmemo;
};

/* copy_read.c: open the sources pp->in names (shards; kept files lazily),
 * close them; the raw bytes [pos, pos+len) of extent e into buf (*all_zero:
 * nothing but holes and gaps, buf not filled); -1 with pp->err. */
int kp_sources_open(struct pipe *pp, char *err, size_t errlen);
void kp_sources_close(struct pipe *pp);
int kp_fill_range(struct pipe *pp, uint32_t e, uint64_t pos, size_t len, uint8_t *buf, int *all_zero);
/* The reader thread (pp->first .. the last extent). */
void *kp_reader_main(void *arg);
/* 1 if extent e is nothing but holes in its source (never read). */
int kp_extent_is_hole(struct pipe *pp, uint32_t e);

/* copy_encode.c: encoder threads; start n of them, stop them (after
 * setting pp->enc_stop under pp->mu). */
int kp_encoders_start(struct pipe *pp, int n, pthread_t *tid, int *started);
void kp_encoders_stop(struct pipe *pp, pthread_t *tid, int started);
/* Where block k of chunk c is encoded, and how much room it has. */
size_t kp_slot_bound(const struct pipe *pp, uint32_t cut);

#endif
