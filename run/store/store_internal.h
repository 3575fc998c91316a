/* The store's parts (store.c: held extents, experts, rows; store_ring.c: the
 * ring of pieces; store_io.c: member files and read requests; store_check.c:
 * what they all use; store_ident.c: the file as it was opened) share this. */
#ifndef KRUN_STORE_INTERNAL_H
#define KRUN_STORE_INTERNAL_H

#include "iopool.h"
#include "store.h"

#include <xxhash.h>

#define READ_CHUNK ((uint64_t)8 << 20)    /* one request at most: large, several in flight per disk */
#define FAULT_AROUND ((uint64_t)64 << 10) /* the kernel maps up to this much around a faulting page */

/* ROLE_MAPPED: in place (no plan).  With a plan: ROLE_HELD is read once into
 * its own budgeted buffer (the globals: without the embedding, and without
 * lm_head when it streams), ROLE_RING streams in pieces, ROLE_EXPERT goes
 * through the expert slots. */
enum role { ROLE_MAPPED = 0, ROLE_RING = 1, ROLE_EXPERT = 2, ROLE_HELD = 3, ROLE_AWAY = 4 /* another rank's (run/cluster) */ };

/* An expert slot. */
struct slot {
    uint8_t *buf;          /* an aligned buffer of the slot size; NULL: a window of a member's mapping (--io mmap) */
    const uint8_t *data;   /* the extent's decoded byte 0 */
    int64_t extent;        /* -1: empty */
    int refs;
    int loading, fresh, mapped;
    int predicted;         /* read ahead on a prediction and not requested yet */
    int lent;              /* its buffer is in the flex region (not freed by the store) */
    uint64_t last_use;
    kiop_batch batch;
};

/* A ring slot: one piece. */
struct rslot {
    uint8_t *buf;
    const uint8_t *data;   /* the piece's decoded byte r0 */
    int64_t piece;         /* -1: free */
    int loading, consumed, mapped;
    uint32_t pending;      /* parts not used yet (counted when consumed) */
    kiop_batch batch;
};

struct kstore {
    kpk_file *f;
    kstore_opts opt;
    uint16_t nm;               /* member files */
    const uint8_t **map;       /* [nm]: each member's mapping (in place, --io mmap) */
    uint64_t *map_len;
    int *map_watch;            /* [nm]: its entry in store_ident.c's SIGBUS watch (-1: none) */
    kiop_member *io_m;          /* [nm]: how each member is read */
    uint64_t *sync_bytes;      /* [nm]: read outside the queues (the prefix, embedding rows) */
    uint64_t stage_bytes;      /* a decode request's largest read */
    char notice[1024];
    uint8_t *role;             /* per extent */
    uint8_t *verified;         /* per extent */
    uint8_t *reread;           /* per extent: a lent layer held again, to be checked again when read */
    uint8_t *touched;          /* per mapped extent: counted once as read */
    uint8_t **decoded;         /* in place: extents read whole into memory (striped, compressed) */
    /* held extents: decoded byte x at held_buf[i] + (x - held_base[i]), for x >= held_r0[i] */
    uint8_t **held_buf;
    uint64_t *held_base, *held_r0;
    uint8_t *held_loaded;
    int64_t globals;           /* the globals extent (planned) */
    uint64_t prefix_end;       /* its bytes [0, prefix_end) are never held: hashed through the window */
    uint64_t tail_from;        /* and the held part hashed from here (after the lm_head pieces when they stream) */
    uint8_t *window;           /* kstore_window_bytes: the prefix, embedding rows of a compressed file */
    size_t window_bytes;
    XXH3_state_t *xxh;         /* held extents, mapped extents */
    XXH3_state_t *prefix_xxh;  /* the globals' prefix, hashed once */
    int have_prefix;
    /* the ring */
    kring ring;
    int have_ring;
    struct rslot *rs;
    int K;
    uint32_t next_load, next_consume;
    uint32_t q_first;          /* the step's first piece in this phase (the decoding phase skips
                                  the lent layers' pieces, which come first) */
    uint32_t q_first_decode;
    uint32_t q_wrap;           /* where the read-ahead goes after the step's last piece (kstore_phase_next) */
    int32_t *slot_of_piece;    /* [ring.n]: ring slot, -1 */
    int cur_slot, bind;
    uint32_t slot_consumed;    /* pieces of cur_slot handed out */
    int ring_hashing;
    XXH3_state_t *ring_xxh;
    /* experts */
    struct slot *eslots;
    int n_eslots;              /* every slot of the decoding layout */
    int n_live;                /* the slots in use in this phase: [0, n_live) */
    int phase;                 /* 1: prefill (the flex region is the caller's) */
    int pin_now;               /* layers [0, pin_now) held in this phase */
    int32_t *slot_of;          /* per extent: expert slot, -1 */
    uint32_t *uses;            /* per extent: times requested (LFU history) */
    uint64_t tick;
    kiop_pool *io;
    struct kstore_sub *sub;    /* store_io.c's request builder */
    kstore_stats st;
};

/* store_check.c */
/* err = "FILE: layer 3 trunk (extent 7): what" */
void kstore_err_extent(const kstore *s, uint32_t i, krun_err *err, int code, const char *what);
/* 1 if extent i's checksum is to be checked when it is read now (--verify). */
int kstore_need_verify(const kstore *s, uint32_t i);
/* kpk_extent_check, kpk_extent_read, kpk_extent_pread and kpk_block_decode
 * (kpk_reader.h) of the store's file, failing with a krun_err. */
int kstore_extent_check(const kstore *s, uint32_t i, const uint8_t *stored, krun_err *err);
int kstore_extent_read(const kstore *s, uint32_t i, uint8_t *buf, int verify, krun_err *err);
int kstore_extent_pread(const kstore *s, uint32_t i, void *buf, uint64_t len, uint64_t pos, krun_err *err);
int kstore_block_decode(const kstore *s, uint32_t i, uint32_t b, const uint8_t *stored, uint8_t *raw, krun_err *err);

/* store_io.c */
/* Open every member file for reading (O_DIRECT with its fallback, or
 * buffered with drop-behind), map them for --io mmap, and start the queues. */
int kstore_io_open(kstore *s, krun_err *err);
size_t kstore_sub_size(void);
void kstore_io_close(kstore *s);
/* Map every member file read-only (in place; --io mmap). */
int kstore_map_members(kstore *s, krun_err *err);
/* 1 if a whole decoded range [r0, r1) of extent i can be a window of a member's mapping. */
int kstore_mappable(const kstore *s, uint32_t i);
/* Queue the reads that put extent i's decoded bytes [r.r0, r.r1) at
 * dst + (x - r.a0) for each byte x (codec 0: stored [a0, a1) as is; codec 2:
 * whole blocks decoded by the workers).  count: only count the requests. */
size_t kstore_submit(kstore *s, uint32_t i, const krange *r, uint8_t *dst, int prio, char kind, kiop_batch *b, int count,
                     krun_err *err);
/* Wait for a batch; a failure names the extent, and the member and offset
 * read, or the block that failed to decode. */
int kstore_wait(kstore *s, uint32_t i, kiop_batch *b, krun_err *err);
/* Stored bytes [pos, pos + len) of extent i into buf, now (pos and len aligned for O_DIRECT). */
int kstore_read_stored(kstore *s, uint32_t i, uint64_t pos, uint64_t len, uint8_t *buf, krun_err *err);
/* Count stored bytes [pos, pos + len) of extent i as read from their members (outside the queues). */
void kstore_count_sync(kstore *s, uint32_t i, uint64_t pos, uint64_t len);
/* Drop the pages of [off, off+len) of member m's mapping from our resident set and the page cache. */
void kstore_drop_mapped(kstore *s, uint16_t m, uint64_t off, uint64_t len);

/* store_ring.c */
int kstore_ring_open(kstore *s, krun_err *err);
void kstore_ring_close(kstore *s);
/* Take the read-ahead back (unstarted reads cancelled, the rest waited for)
 * and start the step's sequence at piece q_first. */
int kstore_ring_restart(kstore *s, uint32_t q_first, krun_err *err);

/* store_ident.c: a member's mapping watched for reads past the file's end (SIGBUS); its entry,
 * or -1 when none is free. */
int  kstore_ident_watch(const void *p, size_t len);
void kstore_ident_unwatch(int w);

#endif
