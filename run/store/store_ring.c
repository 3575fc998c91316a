/* The ring: K slots through which the step's pieces stream (store_pieces.h).
 *
 * Pieces are read in the step's order into whichever slots are free, as far
 * ahead as the slots allow (wrapping round to the next step's first pieces);
 * they are handed out in the same order, each hashed as it is handed out, so
 * an extent's pieces are hashed in file order and its checksum is known when
 * its last piece is handed out; a slot is freed as soon as every part of its
 * piece has been used. */
#include "store_internal.h"

#include "format/kos.h"
#include "run/model/use_order.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static const kpiece *piece(const kstore *s, uint32_t q) { return &s->ring.piece[q]; }

/* The piece after q in the step's sequence of this phase; the last wraps round to the first
 * of the next step's (q_wrap: this phase's, or the next one's when kstore_phase_next said). */
static uint32_t after(const kstore *s, uint32_t q) { return q + 1 < s->ring.n ? q + 1 : s->q_wrap; }

static krange range_of(const kpiece *p)
{
    krange r;
    memset(&r, 0, sizeof r);
    r.r0 = p->r0;
    r.r1 = p->r1;
    r.a0 = p->a0;
    r.a1 = p->a1;
    r.b0 = p->b0;
    r.b1 = p->b1;
    r.read_bytes = p->read_bytes;
    r.buf_bytes = p->slot_bytes;
    return r;
}

/* --io mmap: a whole extent lying contiguously in one member's mapping is a
 * window of it.  Smaller pieces are read into their slots: the kernel maps
 * pages around each fault (64 KB) and reads ahead, so a window on a small
 * piece would bring its neighbours into the resident set too. */
static int piece_mapped(const kstore *s, const kpiece *p) { return p->first && p->last && kstore_mappable(s, p->extent); }

static void slot_free(kstore *s, struct rslot *r)
{
    if (r->piece < 0) return;
    if (r->mapped) {
        const kpiece *p = piece(s, (uint32_t)r->piece);
        const kpk_extent *x = kpk_extent_at(s->f, p->extent);
        uint64_t a = p->a0 > FAULT_AROUND ? p->a0 - FAULT_AROUND : 0, b = p->a1 + FAULT_AROUND;
        /* with the pages the kernel mapped around our faults: out of our
         * resident set and the page cache, so the next use reads the disk */
        if (b > kpk_extent_padded_len(s->f, x)) b = kpk_extent_padded_len(s->f, x);
        kstore_drop_mapped(s, x->member, x->offset + a, b - a);
    }
    s->slot_of_piece[r->piece] = -1;
    r->piece = -1;
}

/* Start reading piece q into free slot r. */
static int slot_load(kstore *s, struct rslot *r, uint32_t q, krun_err *err)
{
    const kpiece *p = piece(s, q);
    r->piece = q;
    r->consumed = 0;
    r->pending = 0;
    r->loading = 1;
    memset(&r->batch, 0, sizeof r->batch);
    s->slot_of_piece[q] = (int32_t)(r - s->rs);
    r->mapped = piece_mapped(s, p);
    if (r->mapped) {
        const kpk_extent *x = kpk_extent_at(s->f, p->extent);
        kos_map_willneed(s->map[x->member] + x->offset + p->a0, p->a1 - p->a0);
        r->data = s->map[x->member] + x->offset + p->r0;
        r->loading = 0;
        return 0;
    }
    r->data = r->buf + kpiece_data_offset(p);
    {
        krange rg = range_of(p);
        if (!kstore_submit(s, p->extent, &rg, r->buf, KIOP_AHEAD, p->slot == s->ring.n_slots - 1 ? 'H' : 'T', &r->batch, 0, err)) {
            kiop_wait(s->io, &r->batch); /* what was queued before the failure lands in the buffer first */
            r->loading = 0;
            slot_free(s, r);
            return -1;
        }
    }
    return 0;
}

/* Read ahead: the next pieces of the step (and of the next) into free slots. */
static int fill(kstore *s, krun_err *err)
{
    if (s->q_first >= s->ring.n) return 0; /* nothing streams in this phase */
    for (;;) {
        if (s->next_load >= s->ring.n) return 0;        /* the next step streams nothing (wrapped to a phase without pieces) */
        struct rslot *r = NULL;
        if (s->slot_of_piece[s->next_load] >= 0) return 0; /* the whole ring is ahead: this piece is still held */
        for (int k = 0; k < s->K && !r; k++)
            if (s->rs[k].piece < 0) r = &s->rs[k];
        if (!r) return 0;
        if (slot_load(s, r, s->next_load, err)) return -1;
        s->next_load = after(s, s->next_load);
    }
}

static void release(kstore *s, struct rslot *r)
{
    krun_err e;
    slot_free(s, r);
    fill(s, &e); /* a failure to queue shows when the piece is needed */
}

/* Drop everything read ahead (reads no disk has started are cancelled, the
 * rest waited for and counted as discarded) and start again at piece q_first. */
static void reset(kstore *s, uint32_t q_first)
{
    for (int k = 0; k < s->K; k++) {
        struct rslot *r = &s->rs[k];
        if (r->loading) {
            kiop_cancel(s->io, &r->batch);
            kiop_wait(s->io, &r->batch);
            s->st.bytes_discarded += r->batch.bytes;
        }
        r->loading = 0;
        slot_free(s, r);
    }
    s->q_first = s->q_wrap = q_first;
    s->next_load = s->next_consume = q_first;
    s->cur_slot = -1;
}

int kstore_ring_restart(kstore *s, uint32_t q_first, krun_err *err)
{
    if (!s->have_ring) return 0;
    /* the read-ahead already follows the new sequence (kstore_phase_next said so): kept */
    if (s->cur_slot < 0 && s->next_consume == q_first) {
        s->q_first = s->q_wrap = q_first;
        return fill(s, err);
    }
    reset(s, q_first);
    return fill(s, err);
}

int kstore_ring_open(kstore *s, krun_err *err)
{
    const kstore_layout *p = s->opt.layout;
    int need_buf = 0;
    if (!p->ring_slots) return 0;
    /* cut for the prefill phase's pin: the superset of the layers either phase streams */
    if (kring_build(&s->ring, s->opt.model, p->piece_bytes, p->pin_prefill, p->head_streamed, s->stage_bytes, err)) return -1;
    s->have_ring = 1;
    /* the decoding phase's sequence starts after the lent layers' pieces */
    for (int t = p->pin_prefill; t < p->pin && t < s->ring.n_slots - 1; t++) s->q_first_decode += s->ring.slot_npieces[t];
    s->q_first = s->q_wrap = s->q_first_decode;
    s->next_load = s->next_consume = s->q_first;
    /* the plan was made from the same cut: anything else is a bug */
    if (s->ring.slot_bytes != p->ring_slot_bytes || s->ring.min_slots > p->ring_slots || s->ring.n != p->ring_pieces_prefill ||
        s->ring.n - s->q_first_decode != p->ring_pieces) {
        krun_err_set(err, KRUN_EDATA, "internal: the ring (%u pieces, %u while decoding, slots of %llu bytes, at least %d) differs "
                     "from the plan (%u, %u, %llu, %d)", s->ring.n, s->ring.n - s->q_first_decode,
                     (unsigned long long)s->ring.slot_bytes, s->ring.min_slots, p->ring_pieces_prefill, p->ring_pieces,
                     (unsigned long long)p->ring_slot_bytes, p->ring_slots);
        return -1;
    }
    s->K = p->ring_slots;
    s->rs = calloc((size_t)s->K, sizeof *s->rs);
    s->slot_of_piece = malloc((size_t)s->ring.n * sizeof *s->slot_of_piece);
    s->ring_xxh = XXH3_createState();
    if (!s->rs || !s->slot_of_piece || !s->ring_xxh) goto oom;
    for (uint32_t q = 0; q < s->ring.n; q++) {
        s->slot_of_piece[q] = -1;
        need_buf |= !piece_mapped(s, piece(s, q));
    }
    for (int k = 0; k < s->K; k++) {
        void *b = NULL;
        s->rs[k].piece = -1;
        if (need_buf && posix_memalign(&b, KPIECE_ALIGN, p->ring_slot_bytes)) goto oom;
        s->rs[k].buf = b;
    }
    s->cur_slot = -1;
    return 0;   /* the first block's kstore_ring_step starts the reads, in the phase it runs in */
oom:
    krun_err_set(err, KRUN_ENOMEM, "out of memory: %d ring slots of %llu bytes", s->K, (unsigned long long)p->ring_slot_bytes);
    return -1;
}

void kstore_ring_close(kstore *s)
{
    if (s->rs) {
        for (int k = 0; k < s->K; k++)
            if (s->rs[k].loading) kiop_wait(s->io, &s->rs[k].batch);
        for (int k = 0; k < s->K; k++) free(s->rs[k].buf);
    }
    free(s->rs);
    free(s->slot_of_piece);
    if (s->ring_xxh) XXH3_freeState(s->ring_xxh);
    if (s->have_ring) kring_free(&s->ring);
}

const kring *kstore_ring(const kstore *s) { return s && s->have_ring ? &s->ring : NULL; }

void kstore_phase_next(kstore *s, int prefill)
{
    const kstore_layout *p = s->opt.layout;
    if (!s->have_ring || !p || p->pin_prefill >= p->pin) return;
    s->q_wrap = prefill ? 0 : s->q_first_decode;
}

int kstore_streams(const kstore *s, int slot)
{
    return s && s->have_ring && s->ring.slot_npieces[slot] && (slot == s->ring.n_slots - 1 || slot >= s->pin_now);
}

int kstore_ring_step(kstore *s, krun_err *err)
{
    if (!s->have_ring) return 0;
    if (s->next_consume != s->q_first || s->cur_slot >= 0) reset(s, s->q_first); /* the last block stopped half way */
    return fill(s, err);
}

int kstore_ring_begin(kstore *s, int slot, int bind, krun_err *err)
{
    if (!kstore_streams(s, slot)) return 0;
    if (s->next_consume != s->ring.slot_piece0[slot]) {
        krun_err_set(err, KRUN_EDATA, "internal: the ring is at piece %u, layer slot %d starts at piece %u", s->next_consume, slot,
                     s->ring.slot_piece0[slot]);
        return -1;
    }
    s->cur_slot = slot;
    s->slot_consumed = 0;
    s->bind = bind;
    return 0;
}

/* Hand out the next piece in order: wait for it, count it, hash it. */
static int consume(kstore *s, krun_err *err)
{
    const uint32_t q = s->next_consume;
    const kpiece *p = piece(s, q);
    const kpk_extent *x = kpk_extent_at(s->f, p->extent);
    struct rslot *r;
    if (s->slot_of_piece[q] < 0 && fill(s, err)) return -1;
    if (s->slot_of_piece[q] < 0) {
        kstore_err_extent(s, p->extent, err, KRUN_EDATA, "internal: no free ring slot for its next piece (the plan's slots "
                          "are fewer than the forward pass holds)");
        return -1;
    }
    r = &s->rs[s->slot_of_piece[q]];
    if (r->loading) {
        int rc = kstore_wait(s, p->extent, &r->batch, err);
        r->loading = 0;
        if (rc) return -1;
    }
    if (p->slot == s->ring.n_slots - 1) s->st.bytes_head += p->read_bytes;
    else s->st.bytes_trunk += p->read_bytes;
    s->st.bytes_read += p->read_bytes;
    if (p->first) {
        /* codec 2: every block was checked as it was decoded */
        s->ring_hashing = x->codec == KPK_CODEC_NONE && kstore_need_verify(s, p->extent);
        if (s->ring_hashing) {
            if ((int64_t)p->extent == s->globals) XXH3_copyState(s->ring_xxh, s->prefix_xxh); /* the embedding, hashed once */
            else XXH3_64bits_reset(s->ring_xxh);
        }
    }
    if (s->ring_hashing) XXH3_64bits_update(s->ring_xxh, r->data, p->r1 - p->r0);
    if (p->last) {
        if (s->ring_hashing) {
            if ((int64_t)p->extent == s->globals) /* the held vectors after lm_head */
                XXH3_64bits_update(s->ring_xxh, s->held_buf[p->extent] + (s->tail_from - s->held_base[p->extent]),
                                   x->stored_len - s->tail_from);
            if (XXH3_64bits_digest(s->ring_xxh) != x->stored_xxh3) {
                kstore_err_extent(s, p->extent, err, KRUN_EDATA, "checksum mismatch");
                return -1;
            }
        }
        if (!s->verified[p->extent]) s->st.extents_verified += s->ring_hashing || x->codec == KPK_CODEC_BLOCKS;
        s->verified[p->extent] = 1;
    }
    for (uint32_t k = 0; k < p->nparts; k++) {
        uint8_t use = s->ring.part[p->part0 + k].use;
        r->pending += use == K3U_ONCE || use == K3U_MULTI || (use == K3U_VEC && s->bind);
    }
    r->consumed = 1;
    s->next_consume = after(s, q);
    s->slot_consumed++;
    if (!r->pending) release(s, r);
    return 0;
}

const uint8_t *kstore_piece(kstore *s, uint32_t q, krun_err *err)
{
    const kpiece *p = piece(s, q);
    uint32_t local;
    int32_t k;
    if ((int)p->slot != s->cur_slot) {
        kstore_err_extent(s, p->extent, err, KRUN_EDATA, "internal: a piece of another layer was asked for");
        return NULL;
    }
    local = q - s->ring.slot_piece0[s->cur_slot];
    while (s->slot_consumed <= local)
        if (consume(s, err)) return NULL;
    k = s->slot_of_piece[q];
    if (k < 0 || !s->rs[k].consumed) {
        kstore_err_extent(s, p->extent, err, KRUN_EDATA, "internal: a piece was asked for again after it was given back");
        return NULL;
    }
    return s->rs[k].data;
}

void kstore_piece_done(kstore *s, uint32_t q)
{
    int32_t k = s->slot_of_piece[q];
    struct rslot *r;
    if (k < 0) return;
    r = &s->rs[k];
    if (r->pending && --r->pending == 0 && r->consumed) release(s, r);
}

int kstore_ring_end(kstore *s, int slot, krun_err *err)
{
    if (!kstore_streams(s, slot)) return 0;
    const uint32_t a = s->ring.slot_piece0[slot], n = s->ring.slot_npieces[slot];
    /* the rest of the layer's pieces: read, hashed, the checksum compared */
    while (s->slot_consumed < n)
        if (consume(s, err)) return -1;
    for (uint32_t q = a; q < a + n; q++) {
        int32_t k = s->slot_of_piece[q];
        if (k >= 0 && s->rs[k].consumed) release(s, &s->rs[k]);
    }
    s->cur_slot = -1;
    return 0;
}
