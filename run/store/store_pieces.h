/* Streaming extents in pieces: how one decoding step's streamed bytes are cut
 * into pieces that ring slots hold, and the proof that K slots are enough.
 *
 * A streamed range (a trunk extent not pinned, or lm_head when it is not
 * resident) is cut in FILE order into pieces of about `piece_bytes` decoded
 * bytes: runs of whole tensors, and row blocks of a tensor larger than a
 * piece (codec-2 extents: runs of whole blocks, whose boundaries inside a
 * tensor fall on rows, docs/FORMAT.md §8.1).  Only a tensor the forward pass
 * multiplies once per block (K3U_ONCE) is ever cut; a vector or a matrix read
 * many times (MLA's kv_b) stays in one piece, so the seam can hand it out as
 * one array.  The pieces of every streamed range, in the order one step uses
 * them (layer by layer, lm_head last), form the step's sequence; the ring
 * reads them in that order, K slots ahead, and frees each piece when every
 * part of it has been used.
 *
 * The same functions size what the planner counts and what the store
 * allocates and reads: one source of truth for slot sizes and bytes per step. */
#ifndef KRUN_STORE_PIECES_H
#define KRUN_STORE_PIECES_H

#include "run/model/model.h"

#include <stdint.h>

#define KPIECE_ALIGN 4096u       /* reads start and end on this (O_DIRECT) */

/* One piece: decoded bytes [r0, r1) of an extent. */
typedef struct kpiece {
    uint32_t extent;
    int32_t slot;                /* layer, or n_layers for lm_head (the globals) */
    uint64_t r0, r1;
    uint64_t a0, a1;             /* codec 0: stored bytes read, [r0, r1) widened to KPIECE_ALIGN */
    uint32_t b0, b1;             /* codec 2: its blocks */
    uint64_t read_bytes;         /* read from disk for it */
    uint64_t slot_bytes;         /* the slot it needs (kpiece_data_offset + its bytes, aligned) */
    uint32_t part0, nparts;      /* its tensor parts: part[part0 .. part0 + nparts) */
    uint8_t first, last;         /* the first / last piece of its range */
} kpiece;

/* The rows [row0, row1) of tensor `role` that piece `piece` holds. */
typedef struct kpart {
    uint32_t piece;
    uint8_t role, use;           /* use: enum k3_use (use_order.h) */
    uint64_t row0, row1;
} kpart;

typedef struct kring {
    uint64_t piece_bytes;        /* the target the cut aimed at */
    int n_slots;                 /* n_layers + 1: layers, then the globals */
    uint32_t n;                  /* pieces per step */
    kpiece *piece;
    uint32_t nparts;
    kpart *part;
    uint32_t *slot_piece0;       /* [n_slots]: first piece of slot s (its pieces are consecutive) */
    uint32_t *slot_npieces;      /* [n_slots]: 0 = not streamed */
    uint32_t *tpart0;            /* [n_slots * K3T_COUNT]: first part of (slot, role) */
    uint16_t *tnparts;           /* [n_slots * K3T_COUNT]: 0 = not streamed */
    uint64_t slot_bytes;         /* the largest piece's slot */
    uint64_t trunk_bytes;        /* read per step for the streamed trunk extents */
    uint64_t head_bytes;         /* read per step for lm_head */
    int min_slots;               /* the fewest slots one step can run with (>= 2) */
} kring;

/* Cut the step's streamed ranges: trunk extents of layers >= pin (pin >
 * n_layers: none) and, with head, lm_head.  stage_bytes: the largest read of
 * one decode request (kiop_stage_bytes).  Returns -1 with err when a range
 * cannot be streamed (lm_head not right after the embedding, a block
 * boundary inside a row: KRUN_EINPUT) or memory runs out. */
int kring_build(kring *r, const k3_model *m, uint64_t piece_bytes, int pin, int head, uint64_t stage_bytes, krun_err *err);
void kring_free(kring *r);
/* 1 if lm_head can stream: it follows the embedding (never held) and comes
 * before the global vectors (held). */
int kring_head_streamable(const k3_model *m);
/* Slot of layer L (K3_GLOBALS: the globals). */
int kring_slot(const kring *r, int L);
/* The fewest ring slots with which slot s's uses, in the forward pass's
 * order with vectors bound on first use (the most demanding pass), never
 * wait for a piece that cannot be read: held pieces (parts not yet used)
 * plus the pieces a use needs at once. */
int kring_slot_min_slots(const kring *r, const k3_model *m, int s);

/* Where a piece's decoded byte r0 sits in its slot buffer: codec 0 reads
 * from a0 (r0 widened down to the alignment); codec 2 decodes at the same
 * offset modulo the alignment, so tensors keep their 64-byte alignment. */
static inline uint64_t kpiece_data_offset(const kpiece *p) { return p->r0 % KPIECE_ALIGN; }

/* Decode requests for blocks [b0, b1) of codec-2 extent i: runs of whole
 * blocks whose aligned stored span is at most stage_bytes and which do not
 * cross a stripe unit (unless one block does), so each request reads one
 * disk.  fn(ctx, g0, g1, span_start, span_len) per request; returns the
 * bytes read in all (the sum of the spans). */
typedef void (*kgroup_fn)(void *ctx, uint32_t g0, uint32_t g1, uint64_t span0, uint64_t span_len);
uint64_t kring_groups(const kpk_file *f, uint32_t i, uint32_t b0, uint32_t b1, uint64_t stage_bytes, kgroup_fn fn, void *ctx);

/* Decoded bytes [r0, r1) of extent i as a held range (a whole expert, a
 * pinned layer, the resident part of the globals): where reading starts
 * (a0: aligned), the blocks, the bytes read and the buffer it needs. */
typedef struct krange {
    uint64_t r0, r1, a0, a1;
    uint32_t b0, b1;
    uint64_t read_bytes, buf_bytes;
} krange;
void kring_range(const kpk_file *f, uint32_t i, uint64_t r0, uint64_t r1, uint64_t stage_bytes, krange *out);

#endif
