/* Where extent bytes come from while the model runs.  The store decides where
 * the bytes live, reads them through the member files of a set (one I/O
 * queue per member, store_io.c), decodes compressed blocks in the I/O
 * workers, and checks every extent's XXH3 (the first time it is read, or
 * every time) before a token computed from it can be used.
 *
 * Without a memory plan every extent is used in place: from a read-only
 * mapping of its member file, or, when it is striped over a set or stored as
 * compressed blocks, read and decoded once into memory.  With a plan
 * (krun --mem / --preset; the store is handed its layout):
 *   - held extents (the pinned trunk prefix, the globals but the embedding
 *     and, when it streams, lm_head) are read once into budgeted buffers:
 *     never touched through a file mapping, so a warm page cache cannot add
 *     to the resident set;
 *   - streamed extents (the other trunk layers, lm_head when it does not fit)
 *     go through a ring of K slots of one piece each (store_pieces.h): the
 *     ring reads the step's pieces in order, as far ahead as slots are free,
 *     and the forward pass takes each piece through the weights seam and
 *     gives it back as soon as its parts are used;
 *   - routed experts go through a cache of budgeted slots (LFU with an MRU
 *     tie-break by default, or LRU), the misses of one layer read
 *     concurrently, in file order on every disk;
 *   - --io pread|direct reads into the slots (O_DIRECT bypasses the page
 *     cache, and falls back to buffered reads on a file system that refuses
 *     it; buffered reads drop what they read from the cache), --io mmap uses
 *     the mapping and madvise instead for what lies contiguously in one
 *     member file, so the page cache is never an unbudgeted cache. */
#ifndef KRUN_STORE_H
#define KRUN_STORE_H

#include "store_pieces.h"
#include "format/kpk_reader.h"
#include "run/model/model.h"
#include "run/util/krun_err.h"
#include "run/util/stats.h"

#include <stdint.h>

enum kstore_verify { KSTORE_VERIFY_OFF = 0, KSTORE_VERIFY_FIRST = 1, KSTORE_VERIFY_ALWAYS = 2 };
enum kstore_io { KSTORE_IO_MMAP = 0, KSTORE_IO_PREAD = 1, KSTORE_IO_DIRECT = 2 };
enum kstore_policy { KSTORE_LFU = 0, KSTORE_LRU = 1 };

#define KSTORE_MAX_MEMBERS KRUN_MAX_MEMBERS

/* Where the extents live, as the memory planner decided it from a budget
 * (memplan.h: kmemplan_layout): plain data, so that the store does not know
 * how it was chosen. */
typedef struct kstore_layout {
    int pin;                  /* trunk layers [0, pin) are held; the others stream */
    int head_streamed;        /* lm_head streams through the ring (else it is held with the globals) */
    uint64_t piece_bytes;     /* the streamed pieces' target size (0: nothing streams) */
    uint32_t ring_pieces;     /* pieces per step, as the planner cut them */
    int ring_slots;           /* K ring slots (0: nothing streams) */
    uint64_t ring_slot_bytes; /* each one's size: the largest piece's slot */
    int expert_slots;
    uint64_t expert_slot_bytes;
    /* Two phases (a plan with a prefill layout; else pin_prefill == pin,
     * expert_slots_prefill == expert_slots): while decoding, layers
     * [pin_prefill, pin) are held and expert slots [expert_slots_prefill,
     * expert_slots) are in use, both in the caller's flex region
     * (kstore_opts.flex); in the prefill phase (kstore_phase) those layers
     * stream and those slots are empty, and the region is the caller's.  The
     * ring is cut for pin_prefill: ring_pieces_prefill pieces per step, of
     * which the decoding phase reads the last ring_pieces. */
    int pin_prefill;
    int expert_slots_prefill;
    uint32_t ring_pieces_prefill;
} kstore_layout;

typedef struct kstore_opts {
    int verify;               /* enum kstore_verify */
    int io;                   /* enum kstore_io (with a plan) */
    int policy;               /* enum kstore_policy */
    int io_threads;           /* concurrent reads (default 8; a set: per member, at least 2) */
    int trace;                /* record every read for kstore_trace_write */
    const kstore_layout *layout; /* NULL: everything in place */
    const k3_model *model;    /* which extent is what */
    uint8_t *flex;            /* kstore_lent_bytes of memory, page-aligned, for what the decoding
                                 phase lends (layout->pin_prefill < pin, or fewer prefill slots) */
    uint64_t flex_bytes;
} kstore_opts;

/* The store's counters: the one record the public API reports too (run/util/stats.h). */
typedef krun_stats kstore_stats;

typedef struct kstore kstore;

/* Hashing the part of the globals that is never held (the embedding) goes
 * through a window (counted in the process base of the plan); compressed
 * embeddings need a whole block of it, decoded. */
#define KSTORE_WINDOW_BYTES ((size_t)1 << 20)
uint64_t kstore_window_bytes(const k3_model *m);

/* I/O workers per member file for io_threads (0: the member holds nothing
 * krun reads); returns the total.  The planner counts each worker's decode
 * buffers (kiop_worker_bytes). */
int kstore_io_threads(const kpk_file *f, int io_threads, int *per_member);

/* Bytes of the flex region the decoding phase keeps its lent layers and expert
 * slots in (0 without a prefill layout): the store carves exactly this. */
uint64_t kstore_lent_bytes(const kpk_file *f, const k3_model *m, const kstore_layout *l, uint64_t stage_bytes);

int kstore_open(kpk_file *f, const kstore_opts *opt, kstore **out, krun_err *err);
/* Between forward blocks: the prefill phase (1) gives the flex region back to
 * the caller -- the lent layers stream from now on, the lent expert slots are
 * emptied (a read landing in one is waited for) -- or the decoding phase (0)
 * takes it again: the lent layers are held again, read on first use and
 * checked again (they come from the disk again), the slots back in the cache,
 * empty.  Either way the ring's read-ahead of the other phase's sequence is
 * taken back (unstarted reads cancelled, started ones waited for and counted
 * as bytes_discarded) and the ring starts the new sequence.  No-op without a
 * prefill layout or in that phase already. */
int kstore_phase(kstore *s, int prefill, krun_err *err);
int kstore_phase_now(const kstore *s);
/* The block after the one about to run is expected in this phase: the ring's
 * read-ahead past the step's end follows that phase's sequence, so a switch
 * as expected drops nothing it read.  (A wrong guess costs the read-ahead:
 * bytes_discarded.) */
void kstore_phase_next(kstore *s, int prefill);
void kstore_close(kstore *s);
/* 0 while every member file is the file that was opened; else -1 with err
 * (KRUN_EDATA) saying how it changed: written, truncated or replaced in place,
 * or a read from its mapping went past its end (a SIGBUS, caught: the page
 * read as zeros).  Whatever was computed from bytes read since must not be
 * used (store_ident.c).  One fstat per member file: ask after every block. */
int kstore_file_changed(const kstore *s, krun_err *err);
/* Something the user should know once (O_DIRECT refused by a file system):
 * NULL if nothing. */
const char *kstore_notice(const kstore *s);
/* The decoded bytes of extent i, valid until kstore_put(s, i).  NULL with
 * err set when it cannot be read or fails its checksum.  The result points at
 * extent byte *first: 0, except for the globals with a plan, which are held
 * without the embedding (pass first = NULL to insist on the whole extent).
 * Streamed trunk extents are not handed out whole: see the ring below. */
const uint8_t *kstore_get(kstore *s, uint32_t i, uint64_t *first, krun_err *err);
void kstore_put(kstore *s, uint32_t i);
/* Several experts of one layer at once; out[k] receives extent ids[k]'s
 * bytes.  At most kstore_expert_capacity() at a time. */
int kstore_get_many(kstore *s, const uint32_t *ids, size_t n, const uint8_t **out, krun_err *err);
/* The same in two halves, so that compute overlaps the reads: request takes
 * a slot for each of ids and starts reading the misses (file order on every
 * disk); wait hands out one requested extent as soon as its own read has
 * landed and been checked.  Every requested id is given back with
 * kstore_put, whether or not it was waited for (a failed request gives its
 * ids back itself). */
int kstore_experts_request(kstore *s, const uint32_t *ids, size_t n, krun_err *err);
const uint8_t *kstore_expert_wait(kstore *s, uint32_t i, krun_err *err);
size_t kstore_expert_capacity(const kstore *s);
/* Reading ahead on a prediction (krun --predict): experts the forward pass
 * expects the router to choose, read at the lower (read-ahead) priority into
 * cache slots nobody holds, so that the disks work while the layer's
 * attention is computed.  A prediction changes which bytes are read and
 * when, never what is computed: a predicted expert is handed out only when
 * the router requests it, through kstore_expert_wait and its checks, and a
 * wrong one is an ordinary cache entry.  ids: most likely first (the
 * router's order).  Returns how many reads started. */
size_t kstore_experts_predict(kstore *s, const uint32_t *ids, size_t n);
/* Raw bytes [off, off + len) of extent i into buf, read now from the disk
 * (the prediction's copy of a router that streams): codec 0 reads the
 * aligned range into buf and returns where byte off landed; codec 2 reads
 * the stored bytes of the blocks that hold the range into stage, decodes
 * them into buf and returns where byte off landed (blocks need not start or
 * end with the tensor).  kstore_tensor_read_bytes says how large buf and
 * stage must be (the planner's numbers). */
const uint8_t *kstore_tensor_read(kstore *s, uint32_t i, uint64_t off, uint64_t len, uint8_t *buf, uint8_t *stage, krun_err *err);
void kstore_tensor_read_bytes(const kpk_file *f, uint32_t i, uint64_t off, uint64_t len, uint64_t *buf, uint64_t *stage);
/* A small read inside an extent (an embedding row), not cached. */
int kstore_read(kstore *s, uint32_t i, uint64_t off, size_t len, void *dst, krun_err *err);
void kstore_stats_get(const kstore *s, kstore_stats *st);
int kstore_trace_write(kstore *s, const char *path);

/* ---- the ring: pieces of streamed extents (used by weights.c) ---- */
/* The step's pieces; NULL when nothing streams. */
const kring *kstore_ring(const kstore *s);
/* 1 if slot s (a layer, or the globals for lm_head) streams through the ring
 * in the phase the store is in. */
int kstore_streams(const kstore *s, int slot);
/* A forward block starts: the ring must be at the step's first piece (after
 * a block that failed half way, what it had read is dropped). */
int kstore_ring_step(kstore *s, krun_err *err);
/* Slot s (a layer, or the globals for lm_head) starts its pass; bind: its
 * vectors are being bound now, so their parts are given back explicitly. */
int kstore_ring_begin(kstore *s, int slot, int bind, krun_err *err);
/* Piece q, with every piece before it in the step read, checked and handed
 * out first: where its decoded byte r0 is.  NULL with err on a failed read,
 * block or checksum. */
const uint8_t *kstore_piece(kstore *s, uint32_t q, krun_err *err);
/* One part of piece q has been used; the last frees its slot. */
void kstore_piece_done(kstore *s, uint32_t q);
/* Slot s is done: its remaining pieces are read and the extent's checksum
 * checked; every slot it held is freed. */
int kstore_ring_end(kstore *s, int slot, krun_err *err);

#endif
