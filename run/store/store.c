/* The extent store: in place, held extents, the expert cache, embedding rows.
 * (The ring of pieces is store_ring.c; reading through the member files is
 * store_io.c.) */
#include "store_internal.h"

#include "format/kio.h"
#include "format/kos.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HASH_WINDOW ((size_t)64 << 20) /* in-place mode: hash a mapped extent this much at a time */

static uint64_t up(uint64_t v) { return (v + KPIECE_ALIGN - 1) / KPIECE_ALIGN * KPIECE_ALIGN; }

/* The blocks of the globals extent the window may have to decode: those
 * before the held part (the embedding). */
static void prefix_blocks(const k3_model *m, uint64_t *max_raw, uint64_t *max_stored)
{
    const kpk_file *f = m->file;
    const kpk_block *b = kpk_extent_blocks(f, m->globals_extent);
    uint32_t n = kpk_extent_block_count(f, m->globals_extent);
    const uint64_t end = m->globals[K3T_LM_HEAD].offset;
    *max_raw = *max_stored = 0;
    for (uint32_t k = 0; k < n && b[k].raw_off < end; k++) {
        if (b[k].raw_len > *max_raw) *max_raw = b[k].raw_len;
        if (up(b[k].stored_off + b[k].stored_len) - b[k].stored_off / KPIECE_ALIGN * KPIECE_ALIGN > *max_stored)
            *max_stored = up(b[k].stored_off + b[k].stored_len) - b[k].stored_off / KPIECE_ALIGN * KPIECE_ALIGN;
    }
}

uint64_t kstore_window_bytes(const k3_model *m)
{
    uint64_t r, st;
    prefix_blocks(m, &r, &st);
    /* a decoded block and its stored bytes, side by side */
    return up(r) + st > KSTORE_WINDOW_BYTES ? up(r) + st : KSTORE_WINDOW_BYTES;
}

const char *kstore_notice(const kstore *s) { return s->notice[0] ? s->notice : NULL; }

/* ---- open / close ------------------------------------------------------------ */

static uint8_t *alloc_aligned(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, KPIECE_ALIGN, n ? n : KPIECE_ALIGN)) return NULL;
    return p;
}

/* A trunk layer the decoding phase holds in the flex region: [pin_prefill, pin). */
static int lent_layer(const kstore_layout *p, int L) { return L >= p->pin_prefill && L < p->pin; }

uint64_t kstore_lent_bytes(const kpk_file *f, const k3_model *m, const kstore_layout *l, uint64_t stage_bytes)
{
    uint64_t n = 0;
    krange r;
    for (int L = l->pin_prefill; L < l->pin && L < m->cfg.n_layers; L++) {
        if (!k3_here(m, L)) continue;
        kring_range(f, m->trunk_extent[L], 0, kpk_extent_at(f, m->trunk_extent[L])->raw_len, stage_bytes, &r);
        n += r.buf_bytes;
    }
    if (l->expert_slots > l->expert_slots_prefill) n += (uint64_t)(l->expert_slots - l->expert_slots_prefill) * l->expert_slot_bytes;
    return n;
}

/* The next bytes of the flex region (every size is a multiple of the page). */
static uint8_t *flex_take(kstore *s, uint64_t *used, uint64_t n)
{
    uint8_t *p = s->opt.flex && *used + n <= s->opt.flex_bytes ? s->opt.flex + *used : NULL;
    *used += n;
    return p;
}

/* With a plan: who is where; held extents get their buffers now (the lent
 * layers theirs in the flex region). */
static int plan_roles(kstore *s, uint64_t *flex_used, krun_err *err)
{
    const kstore_layout *p = s->opt.layout;
    const k3_model *m = s->opt.model;
    const uint32_t n = kpk_extent_count(s->f);
    s->held_buf = calloc(n + 1, sizeof *s->held_buf);
    s->held_base = calloc(n + 1, sizeof *s->held_base);
    s->held_r0 = calloc(n + 1, sizeof *s->held_r0);
    s->held_loaded = calloc(n + 1, 1);
    if (!s->held_buf || !s->held_base || !s->held_r0 || !s->held_loaded) goto oom;
    for (uint32_t i = 0; i < n; i++) {
        const kpk_extent *x = kpk_extent_at(s->f, i);
        uint64_t r0 = 0;
        krange r;
        if (x->kind == KPK_KIND_EXPERT) { s->role[i] = ROLE_EXPERT; continue; }
        /* another rank's trunk layer, or globals (run/cluster): never read here */
        if ((x->kind == KPK_KIND_TRUNK && !k3_here(m, (int)x->layer)) || (i == m->globals_extent && !k3_here(m, K3_GLOBALS))) {
            s->role[i] = ROLE_AWAY;
            continue;
        }
        if (x->kind == KPK_KIND_TRUNK && (int)x->layer >= p->pin) { s->role[i] = ROLE_RING; continue; }
        if (x->kind != KPK_KIND_TRUNK && i != m->globals_extent) continue;
        if (i == m->globals_extent) {
            const kt_loc *lm = &m->globals[K3T_LM_HEAD];
            r0 = p->head_streamed ? lm->offset + lm->nbytes : (uint64_t)k3_globals_first(m);
            s->globals = i;
            s->prefix_end = p->head_streamed ? lm->offset : r0;
            s->tail_from = r0;
        }
        kring_range(s->f, i, r0, x->raw_len, s->stage_bytes, &r);
        s->role[i] = ROLE_HELD;
        s->held_base[i] = r.a0;
        s->held_r0[i] = r0;
        /* codec 2: the blocks of the embedding (before lm_head) are the ones checked through the window */
        if (i == m->globals_extent && x->codec == KPK_CODEC_BLOCKS) s->prefix_end = m->globals[K3T_LM_HEAD].offset;
        if (x->kind == KPK_KIND_TRUNK && lent_layer(p, (int)x->layer)) {
            if (!(s->held_buf[i] = flex_take(s, flex_used, r.buf_bytes))) goto lent;
        } else if (!(s->held_buf[i] = alloc_aligned(r.buf_bytes))) {
            goto oom;
        }
    }
    return 0;
oom:
    krun_err_set(err, KRUN_ENOMEM, "out of memory for the held extents");
    return -1;
lent:
    krun_err_set(err, KRUN_EDATA, "internal: the flex region (%llu bytes) is smaller than what the plan lends",
                 (unsigned long long)s->opt.flex_bytes);
    return -1;
}

static int expert_slots(kstore *s, uint64_t *flex_used, krun_err *err)
{
    const kstore_layout *p = s->opt.layout;
    int need_buf = 0;
    for (uint32_t i = 0; i < kpk_extent_count(s->f); i++)
        if (s->role[i] == ROLE_EXPERT) need_buf |= !kstore_mappable(s, i);
    s->n_eslots = s->n_live = p->expert_slots;
    s->eslots = calloc((size_t)s->n_eslots + 1, sizeof *s->eslots);
    if (!s->eslots) goto oom;
    for (int k = 0; k < s->n_eslots; k++) {
        s->eslots[k].extent = -1;
        if (k >= p->expert_slots_prefill) {     /* lent: in the flex region, counted whether or not used */
            uint8_t *b = flex_take(s, flex_used, p->expert_slot_bytes);
            s->eslots[k].lent = 1;
            if (!b) {
                krun_err_set(err, KRUN_EDATA, "internal: the flex region (%llu bytes) is smaller than what the plan lends",
                             (unsigned long long)s->opt.flex_bytes);
                return -1;
            }
            if (need_buf) s->eslots[k].buf = b;
        } else if (need_buf && !(s->eslots[k].buf = alloc_aligned(p->expert_slot_bytes))) {
            goto oom;
        }
    }
    return 0;
oom:
    krun_err_set(err, KRUN_ENOMEM, "out of memory: %d expert slots of %llu bytes", p->expert_slots,
                 (unsigned long long)p->expert_slot_bytes);
    return -1;
}

/* Room in the queues for every read that can be in flight at once. */
static int reserve(kstore *s, krun_err *err)
{
    size_t most_piece = 0, most_expert = 0, most_held = 0;
    for (uint32_t q = 0; s->have_ring && q < s->ring.n; q++) {
        const kpiece *p = &s->ring.piece[q];
        krange r = {p->r0, p->r1, p->a0, p->a1, p->b0, p->b1, p->read_bytes, p->slot_bytes};
        size_t n = kstore_submit(s, p->extent, &r, s->window, 0, 0, NULL, 1, err); /* counted, not read */
        if (n > most_piece) most_piece = n;
    }
    for (uint32_t i = 0; i < kpk_extent_count(s->f); i++) {
        krange r;
        size_t n;
        if (s->role[i] != ROLE_EXPERT && s->role[i] != ROLE_HELD) continue;
        kring_range(s->f, i, s->role[i] == ROLE_HELD ? s->held_r0[i] : 0, kpk_extent_at(s->f, i)->raw_len, s->stage_bytes, &r);
        n = kstore_submit(s, i, &r, s->window, 0, 0, NULL, 1, err);
        if (s->role[i] == ROLE_EXPERT && n > most_expert) most_expert = n;
        if (s->role[i] == ROLE_HELD && n > most_held) most_held = n;
    }
    if (kiop_reserve(s->io, (size_t)s->K * most_piece + (size_t)s->n_eslots * most_expert + most_held + 64)) {
        krun_err_set(err, KRUN_ENOMEM, "out of memory setting up the read queues");
        return -1;
    }
    return 0;
}

int kstore_open(kpk_file *f, const kstore_opts *opt, kstore **out, krun_err *err)
{
    kstore *s = calloc(1, sizeof *s);
    uint32_t n = kpk_extent_count(f);
    const kstore_layout *p = opt->layout;
    *out = NULL;
    if (!s) { krun_err_set(err, KRUN_ENOMEM, "out of memory"); return -1; }
    s->f = f;
    s->opt = *opt;
    s->nm = kpk_member_count(f);
    s->globals = -1;
    s->cur_slot = -1;
    s->role = calloc(n + 1, 1);
    s->verified = calloc(n + 1, 1);
    s->reread = calloc(n + 1, 1);
    s->touched = calloc(n + 1, 1);
    s->decoded = calloc(n + 1, sizeof *s->decoded);
    s->slot_of = malloc((n + 1) * sizeof *s->slot_of);
    s->uses = calloc(n + 1, sizeof *s->uses);
    s->xxh = XXH3_createState();
    s->prefix_xxh = XXH3_createState();
    s->sub = malloc(kstore_sub_size());
    if (!s->role || !s->verified || !s->reread || !s->touched || !s->decoded || !s->slot_of || !s->uses || !s->xxh || !s->prefix_xxh || !s->sub)
        goto oom;
    for (uint32_t i = 0; i <= n; i++) s->slot_of[i] = -1;
    s->st.n_members = s->nm;
    if (!p) {
        if (kstore_map_members(s, err)) goto fail;
        *out = s;
        return 0;
    }
    s->stage_bytes = kiop_stage_bytes(f);
    s->window_bytes = kstore_window_bytes(opt->model);
    s->pin_now = p->pin;
    if (!(s->window = alloc_aligned(s->window_bytes))) goto oom;
    {
        uint64_t flex_used = 0;
        if (plan_roles(s, &flex_used, err) || kstore_io_open(s, err) || expert_slots(s, &flex_used, err) || kstore_ring_open(s, err) ||
            reserve(s, err))
            goto fail;
    }
    *out = s;
    return 0;
oom:
    krun_err_set(err, KRUN_ENOMEM, "out of memory setting up the store");
fail:
    kstore_close(s);
    return -1;
}

/* Free a per-extent table of buffers and the table. */
static void free_table(uint8_t **t, uint32_t n)
{
    if (t)
        for (uint32_t i = 0; i < n; i++) free(t[i]);
    free(t);
}

void kstore_close(kstore *s)
{
    if (!s) return;
    kstore_ring_close(s);
    if (s->eslots)
        for (int k = 0; k < s->n_eslots; k++)
            if (s->eslots[k].loading) kiop_wait(s->io, &s->eslots[k].batch);
    kstore_io_close(s);
    if (s->eslots)
        for (int k = 0; k < s->n_eslots; k++)
            if (!s->eslots[k].lent) free(s->eslots[k].buf);
    free(s->eslots);
    if (s->map)
        for (uint16_t m = 0; m < s->nm; m++)
            if (s->map[m]) {
                kstore_ident_unwatch(s->map_watch[m]);
                munmap((void *)s->map[m], s->map_len[m]);
            }
    free(s->map);
    free(s->map_watch);
    free(s->map_len);
    free_table(s->decoded, kpk_extent_count(s->f));
    free(s->role);
    free(s->verified);
    free(s->reread);
    free(s->touched);
    free(s->slot_of);
    free(s->uses);
    if (s->held_buf && s->opt.layout) /* the lent layers' buffers are the flex region's */
        for (uint32_t i = 0; i < kpk_extent_count(s->f); i++) {
            const kpk_extent *x = kpk_extent_at(s->f, i);
            if (x->kind == KPK_KIND_TRUNK && lent_layer(s->opt.layout, (int)x->layer)) s->held_buf[i] = NULL;
        }
    free_table(s->held_buf, kpk_extent_count(s->f));
    free(s->held_base);
    free(s->held_r0);
    free(s->held_loaded);
    free(s->window);
    free(s->sub);
    if (s->xxh) XXH3_freeState(s->xxh);
    if (s->prefix_xxh) XXH3_freeState(s->prefix_xxh);
    free(s);
}

/* ---- verification ---------------------------------------------------------- */

static void verified(kstore *s, uint32_t i)
{
    if (!s->verified[i]) s->st.extents_verified++;
    s->verified[i] = 1;
}

/* Hash a mapped extent window by window. */
static int verify_mapped(kstore *s, uint32_t i, const uint8_t *data, krun_err *err)
{
    const kpk_extent *x = kpk_extent_at(s->f, i);
    XXH3_64bits_reset(s->xxh);
    for (uint64_t pos = 0; pos < x->stored_len; pos += HASH_WINDOW)
        XXH3_64bits_update(s->xxh, data + pos, x->stored_len - pos < HASH_WINDOW ? x->stored_len - pos : HASH_WINDOW);
    if (XXH3_64bits_digest(s->xxh) != x->stored_xxh3) { kstore_err_extent(s, i, err, KRUN_EDATA, "checksum mismatch"); return -1; }
    verified(s, i);
    return 0;
}

/* ---- the expert cache ----------------------------------------------------------- */

static void slot_evict(kstore *s, struct slot *sl)
{
    if (sl->loading) {  /* a predicted read still in flight: it must land before the buffer is reused */
        kiop_wait(s->io, &sl->batch);
        sl->loading = 0;
    }
    sl->predicted = 0;
    sl->fresh = 0;
    if (sl->extent < 0) return;
    if (sl->mapped) {
        /* out of our resident set, and out of the page cache too: the next use
         * reads the disk again, as the budget says it must; with the pages the
         * kernel mapped around our faults (fault-around) */
        const kpk_extent *x = kpk_extent_at(s->f, (uint32_t)sl->extent);
        uint64_t off = x->offset, len = kpk_extent_padded_len(s->f, x);
        uint64_t a = off > FAULT_AROUND ? off - FAULT_AROUND : 0, b = off + len + FAULT_AROUND;
        kstore_drop_mapped(s, x->member, a, b - a);
    }
    if (s->slot_of[sl->extent] >= 0) s->slot_of[sl->extent] = -1;
    sl->extent = -1;
}

static int slot_load(kstore *s, struct slot *sl, uint32_t i, int prio, krun_err *err)
{
    const kpk_extent *x = kpk_extent_at(s->f, i);
    krange r;
    slot_evict(s, sl);
    sl->extent = i;
    sl->fresh = 1;
    sl->loading = 1;
    memset(&sl->batch, 0, sizeof sl->batch);
    sl->mapped = kstore_mappable(s, i);
    if (sl->mapped) {
        sl->data = s->map[x->member] + x->offset;
        kos_map_willneed(sl->data, kpk_extent_padded_len(s->f, x));
        sl->loading = 0;
        return 0;
    }
    kring_range(s->f, i, 0, x->raw_len, s->stage_bytes, &r);
    sl->data = sl->buf;
    if (!kstore_submit(s, i, &r, sl->buf, prio, prio == KIOP_URGENT ? 'E' : 'P', &sl->batch, 0, err)) {
        kiop_wait(s->io, &sl->batch); /* what was queued before the failure lands in the buffer first */
        sl->loading = 0;
        slot_evict(s, sl);
        return -1;
    }
    return 0;
}

static int slot_wait(kstore *s, struct slot *sl, krun_err *err)
{
    uint32_t i = (uint32_t)sl->extent;
    if (sl->loading) {
        int rc = kstore_wait(s, i, &sl->batch, err);
        sl->loading = 0;
        if (rc) return -1;  /* still fresh: the last kstore_put evicts it */
    }
    return 0;
}

/* The slot to reuse: nobody holds it, and (while there is another choice)
 * no read is landing in it -- a wrong prediction still in flight would have
 * to be waited for. */
static struct slot *expert_victim(kstore *s, int may_wait)
{
    struct slot *best = NULL;
    if (may_wait) {
        struct slot *v = expert_victim(s, 0);
        if (v) return v;
    }
    for (int k = 0; k < s->n_live; k++) {
        struct slot *sl = &s->eslots[k];
        if (sl->refs || (sl->loading && !may_wait)) continue;
        if (sl->extent < 0) return sl;
        if (!best) { best = sl; continue; }
        if (s->opt.policy == KSTORE_LFU) {
            /* least often requested; among equals the MOST recently used: layers
             * come round in a fixed cycle, so the expert used last is the one
             * needed latest (LRU evicts exactly what the next step needs) */
            uint32_t a = s->uses[sl->extent], b = s->uses[best->extent];
            if (a < b || (a == b && sl->last_use > best->last_use)) best = sl;
        } else if (sl->last_use < best->last_use) {
            best = sl;
        }
    }
    return best;
}

/* Extents in file order (insertion sort: a layer's misses are few, and qsort may allocate). */
static void sort_by_offset(const kstore *s, uint32_t *v, size_t n)
{
    (void)s;
    for (size_t i = 1; i < n; i++) {
        uint32_t x = v[i];
        size_t j = i;
        /* the table lists each member's (and the stripe space's) extents in offset order */
        for (; j > 0 && v[j - 1] > x; j--) v[j] = v[j - 1];
        v[j] = x;
    }
}

size_t kstore_expert_capacity(const kstore *s) { return s->opt.layout ? (size_t)s->n_live : 256; }

static const uint8_t *mapped_or_decoded(kstore *s, uint32_t i, krun_err *err);

/* Takes a slot for each of ids (a hit keeps its slot) and starts reading the
 * misses, concurrently and in file order on every disk; kstore_expert_wait
 * then hands out each one as its own read completes, so the forward pass
 * computes the first experts while the disks still read the rest. */
int kstore_experts_request(kstore *s, const uint32_t *ids, size_t n, krun_err *err)
{
    krange r;
    uint32_t miss[256];
    size_t nm = 0;
    if (!s->opt.layout || n == 0) return 0;
    if (n > 256 || n > (size_t)s->n_live) {
        krun_err_set(err, KRUN_EDATA, "%zu experts requested at once, the cache has %d slots", n, s->n_live);
        return -1;
    }
    s->tick++;
    for (size_t k = 0; k < n; k++) {
        int32_t sl = s->slot_of[ids[k]];
        s->uses[ids[k]]++;
        if (sl >= 0 && s->eslots[sl].predicted) { /* read ahead for this request: a miss read early */
            s->eslots[sl].refs++;
            s->eslots[sl].last_use = s->tick;
            s->eslots[sl].predicted = 0;
            s->st.expert_misses++;
            s->st.experts_predicted_used++;
        } else if (sl >= 0) {                 /* resident before this request: a true hit */
            s->eslots[sl].refs++;
            s->eslots[sl].last_use = s->tick;
            s->st.expert_hits++;
        } else {
            miss[nm++] = ids[k];
        }
    }
    /* predictions the router did not confirm: what no disk has started on is
     * not read at all, so the misses go first, and the slot is emptied (what
     * is in flight lands in a slot no extent owns); one already read whole,
     * or being read, stays as an ordinary cache entry */
    for (int k = 0; k < s->n_live; k++) {
        struct slot *sl = &s->eslots[k];
        uint64_t b;
        if (!sl->predicted || sl->refs) continue;
        sl->predicted = 0;
        if (!sl->loading || !(b = kiop_cancel(s->io, &sl->batch))) continue;
        s->st.bytes_cancelled += b;
        s->st.bytes_experts -= b;
        s->st.bytes_read -= b;
        s->st.bytes_predicted -= b;
        s->slot_of[sl->extent] = -1;
        sl->extent = -1;
        sl->fresh = 0;
        if (kiop_done(s->io, &sl->batch)) sl->loading = 0;
    }
    sort_by_offset(s, miss, nm);
    for (size_t k = 0; k < nm; k++) {
        struct slot *v = expert_victim(s, 1);
        if (!v) { krun_err_set(err, KRUN_EDATA, "expert cache full (%d slots in use)", s->n_live); goto fail; }
        slot_evict(s, v);
        s->slot_of[miss[k]] = (int32_t)(v - s->eslots);
        v->refs = 1;
        v->last_use = s->tick;
        if (slot_load(s, v, miss[k], KIOP_URGENT, err)) { v->refs = 0; goto fail; } /* slot_load emptied the slot */
        kring_range(s->f, miss[k], 0, kpk_extent_at(s->f, miss[k])->raw_len, s->stage_bytes, &r);
        s->st.bytes_experts += r.read_bytes;
        s->st.bytes_read += r.read_bytes;
        s->st.expert_misses++;
    }
    return 0;
fail:
    for (size_t q = 0; q < n; q++) kstore_put(s, ids[q]);
    return -1;
}

size_t kstore_experts_predict(kstore *s, const uint32_t *ids, size_t n)
{
    uint32_t want[256];
    struct slot *taken[256];
    size_t nw = 0, nt = 0;
    if (!s->opt.layout || !s->io) return 0;
    for (size_t k = 0; k < n && nw < 256; k++)
        if (s->role[ids[k]] == ROLE_EXPERT && s->slot_of[ids[k]] < 0) want[nw++] = ids[k];
    /* ids come most likely first.  The likelier three quarters are read
     * first, the rest after them, each part in file order: the guesses the
     * router is least likely to confirm sit at the tail of every disk's
     * queue, where kstore_experts_request takes them back unread when they
     * are wrong.  (Split layout on the HDD model, side by side with all of
     * them in file order: 2-7% fewer expert bytes read per token; the time
     * within the machine's noise; docs/PERFORMANCE.md.) */
    size_t sure = (nw * 3 + 3) / 4;
    sort_by_offset(s, want, sure);
    sort_by_offset(s, want + sure, nw - sure);
    for (size_t k = 0; k < nw; k++) {
        struct slot *v = expert_victim(s, 0);  /* never wait: the caller is about to compute */
        krun_err e = {0};
        krange r;
        if (!v) break;
        slot_evict(s, v);
        s->slot_of[want[k]] = (int32_t)(v - s->eslots);
        v->refs = 1;                          /* not a victim for the rest of this call */
        taken[nt++] = v;
        if (slot_load(s, v, want[k], KIOP_AHEAD, &e)) { v->refs = 0; nt--; break; } /* only a guess: the request reads it */
        v->predicted = 1;
        kring_range(s->f, want[k], 0, kpk_extent_at(s->f, want[k])->raw_len, s->stage_bytes, &r);
        s->st.bytes_experts += r.read_bytes;
        s->st.bytes_read += r.read_bytes;
        s->st.bytes_predicted += r.read_bytes;
        s->st.experts_predicted++;
    }
    for (size_t k = 0; k < nt; k++) taken[k]->refs = 0;
    return nt;
}

const uint8_t *kstore_expert_wait(kstore *s, uint32_t i, krun_err *err)
{
    struct slot *v;
    const kpk_extent *x = kpk_extent_at(s->f, i);
    if (!s->opt.layout) return kstore_get(s, i, NULL, err);
    if (!x || s->role[i] != ROLE_EXPERT || s->slot_of[i] < 0 || !s->eslots[s->slot_of[i]].refs) {
        krun_err_set(err, KRUN_EDATA, "internal: extent %u waited for without a request", i);
        return NULL;
    }
    v = &s->eslots[s->slot_of[i]];
    if (slot_wait(s, v, err)) return NULL;
    if (kstore_need_verify(s, i)) {
        if (x->codec == KPK_CODEC_NONE && (v->mapped ? verify_mapped(s, i, v->data, err) : kstore_extent_check(s, i, v->data, err)))
            { v->fresh = 1; return NULL; } /* the caller's kstore_put evicts it */
        verified(s, i);                   /* codec 2: every block was checked as it was decoded */
    }
    v->fresh = 0;
    return v->data;
}

int kstore_get_many(kstore *s, const uint32_t *ids, size_t n, const uint8_t **out, krun_err *err)
{
    if (!s->opt.layout || n == 0) {
        for (size_t k = 0; k < n; k++)
            if (!(out[k] = kstore_get(s, ids[k], NULL, err))) return -1;
        return 0;
    }
    if (kstore_experts_request(s, ids, n, err)) return -1;
    for (size_t k = 0; k < n; k++)
        if (!(out[k] = kstore_expert_wait(s, ids[k], err))) {
            for (size_t q = 0; q < n; q++) kstore_put(s, ids[q]);
            return -1;
        }
    return 0;
}

/* ---- held extents (with a plan) ------------------------------------------- */

/* The globals' prefix [0, prefix_end), never held, checked once: codec 0
 * hashed through the window (the state kept: the held part and the lm_head
 * pieces continue it); codec 2 decoded block by block. */
static int check_prefix(kstore *s, uint32_t i, krun_err *err)
{
    const kpk_extent *x = kpk_extent_at(s->f, i);
    if (s->have_prefix) return 0;
    if (x->codec == KPK_CODEC_BLOCKS) {
        const kpk_block *b = kpk_extent_blocks(s->f, i);
        uint64_t max_raw, max_stored;
        prefix_blocks(s->opt.model, &max_raw, &max_stored);
        for (uint32_t k = 0; k < kpk_extent_block_count(s->f, i) && b[k].raw_off < s->prefix_end; k++) {
            uint64_t a = b[k].stored_off / KPIECE_ALIGN * KPIECE_ALIGN;
            uint8_t *stored = s->window + up(max_raw);
            if (kstore_read_stored(s, i, a, up(b[k].stored_off + b[k].stored_len) - a, stored, err)) return -1;
            if (kstore_block_decode(s, i, k, stored + (b[k].stored_off - a), s->window, err)) return -1;
            s->st.bytes_resident += up(b[k].stored_off + b[k].stored_len) - a;
            s->st.bytes_read += up(b[k].stored_off + b[k].stored_len) - a;
        }
    } else {
        XXH3_64bits_reset(s->prefix_xxh);
        for (uint64_t pos = 0; pos < s->prefix_end; pos += s->window_bytes) {
            uint64_t n = s->prefix_end - pos < s->window_bytes ? s->prefix_end - pos : s->window_bytes;
            if (kstore_read_stored(s, i, pos, up(n), s->window, err)) return -1;
            XXH3_64bits_update(s->prefix_xxh, s->window, n);
            s->st.bytes_resident += up(n);
            s->st.bytes_read += up(n);
        }
    }
    s->have_prefix = 1;
    (void)x;
    return 0;
}

static int check_held(kstore *s, uint32_t i, krun_err *err)
{
    const kpk_extent *x = kpk_extent_at(s->f, i);
    if (x->codec == KPK_CODEC_BLOCKS) {  /* checked block by block as decoded */
        if ((int64_t)i == s->globals && check_prefix(s, i, err)) return -1;
        if ((int64_t)i != s->globals || !s->opt.layout->head_streamed) verified(s, i);
        return 0;
    }
    if ((int64_t)i == s->globals) {
        if (check_prefix(s, i, err)) return -1;
        /* with lm_head streaming, the hash is finished after its pieces (store_ring.c) */
        if (s->opt.layout->head_streamed) return 0;
        XXH3_copyState(s->xxh, s->prefix_xxh);
    } else {
        XXH3_64bits_reset(s->xxh);
    }
    {
        const uint64_t from = (int64_t)i == s->globals ? s->tail_from : 0;
        XXH3_64bits_update(s->xxh, s->held_buf[i] + (from - s->held_base[i]), x->stored_len - from);
    }
    if (XXH3_64bits_digest(s->xxh) != x->stored_xxh3) { kstore_err_extent(s, i, err, KRUN_EDATA, "checksum mismatch"); return -1; }
    verified(s, i);
    return 0;
}

static const uint8_t *held_get(kstore *s, uint32_t i, uint64_t *first, krun_err *err)
{
    if (s->held_r0[i] && !first) { kstore_err_extent(s, i, err, KRUN_EDATA, "asked for whole, held in part"); return NULL; }
    if (!s->held_loaded[i]) {
        kiop_batch b;
        krange r;
        memset(&b, 0, sizeof b);
        kring_range(s->f, i, s->held_r0[i], kpk_extent_at(s->f, i)->raw_len, s->stage_bytes, &r);
        if (!kstore_submit(s, i, &r, s->held_buf[i], KIOP_URGENT, 'R', &b, 0, err)) { kiop_wait(s->io, &b); return NULL; }
        if (kstore_wait(s, i, &b, err)) return NULL;
        s->held_loaded[i] = 1;
        s->st.bytes_resident += r.read_bytes;
        s->st.bytes_read += r.read_bytes;
        if (s->reread[i]) s->st.bytes_lent_reread += r.read_bytes;
    }
    /* a lent layer held again came from the disk again: checked again (unless --verify off) */
    if (kstore_need_verify(s, i) || (s->reread[i] && s->opt.verify != KSTORE_VERIFY_OFF)) {
        if (check_held(s, i, err)) { s->held_loaded[i] = 0; return NULL; }
        s->reread[i] = 0;
    }
    if (first) *first = s->held_base[i];
    return s->held_buf[i];
}

/* ---- in place (no plan) --------------------------------------------------------- */

/* Straight from the mapping when the extent lies in one member uncompressed;
 * otherwise read (and decoded) whole into memory once. */
static const uint8_t *mapped_or_decoded(kstore *s, uint32_t i, krun_err *err)
{
    const kpk_extent *x = kpk_extent_at(s->f, i);
    if (x->member != KPK_STRIPED && !kpk_member_here(s->f, x->member)) {
        kstore_err_extent(s, i, err, KRUN_EINPUT, "its member file is not on this machine");
        return NULL;
    }
    if (x->codec == KPK_CODEC_NONE && x->member != KPK_STRIPED) {
        const uint8_t *d = s->map[x->member] + x->offset;
        if (kstore_need_verify(s, i) && verify_mapped(s, i, d, err)) return NULL;
        if (!s->touched[i]) {
            s->touched[i] = 1;
            s->st.bytes_resident += x->stored_len;
            s->st.bytes_read += x->stored_len;
        }
        return d;
    }
    if (!s->decoded[i]) {
        int check = kstore_need_verify(s, i);
        s->decoded[i] = malloc(x->raw_len ? x->raw_len : 1);
        if (!s->decoded[i]) { kstore_err_extent(s, i, err, KRUN_ENOMEM, "out of memory reading it whole"); return NULL; }
        if (kstore_extent_read(s, i, s->decoded[i], check, err)) {
            free(s->decoded[i]);
            s->decoded[i] = NULL;
            return NULL;
        }
        if (check) verified(s, i);
        s->st.bytes_resident += x->stored_len;
        s->st.bytes_read += x->stored_len;
    } else if (s->opt.verify == KSTORE_VERIFY_ALWAYS && x->codec == KPK_CODEC_NONE) {
        if (kstore_extent_check(s, i, s->decoded[i], err)) return NULL;
    }
    return s->decoded[i];
}

/* ---- get / put ---------------------------------------------------------------- */

const uint8_t *kstore_get(kstore *s, uint32_t i, uint64_t *first, krun_err *err)
{
    const kpk_extent *x = kpk_extent_at(s->f, i);
    if (!x) { krun_err_set(err, KRUN_EDATA, "no extent %u", i); return NULL; }
    if (first) *first = 0;
    if (s->role[i] == ROLE_HELD) return held_get(s, i, first, err);
    if (s->role[i] == ROLE_EXPERT) {
        const uint8_t *p;
        return kstore_get_many(s, &i, 1, &p, err) ? NULL : p;
    }
    if (s->role[i] == ROLE_AWAY) { kstore_err_extent(s, i, err, KRUN_EINPUT, "computed by another rank, not read here"); return NULL; }
    if (s->role[i] == ROLE_RING || !s->map) { kstore_err_extent(s, i, err, KRUN_EDATA, "internal: streamed in pieces, not held whole"); return NULL; }
    return mapped_or_decoded(s, i, err);
}

void kstore_put(kstore *s, uint32_t i)
{
    struct slot *v;
    if (s->role[i] != ROLE_EXPERT || s->slot_of[i] < 0) return;
    v = &s->eslots[s->slot_of[i]];
    if (v->refs > 0 && --v->refs == 0 && (v->loading || v->fresh))
        slot_evict(s, v); /* given back before it was used (a failure elsewhere in its batch): bytes
                           * never checked must not be found as a hit later */
}

/* ---- phases: the flex region lent to a prefill block and taken back -------------------- */

int kstore_phase_now(const kstore *s) { return s->phase; }

int kstore_phase(kstore *s, int prefill, krun_err *err)
{
    const kstore_layout *p = s->opt.layout;
    prefill = !!prefill;
    if (!p || prefill == s->phase || (p->pin_prefill >= p->pin && p->expert_slots_prefill >= p->expert_slots)) return 0;
    for (int L = p->pin_prefill; L < p->pin; L++) {
        uint32_t i = s->opt.model->trunk_extent[L];
        if (!k3_here(s->opt.model, L)) continue;
        s->role[i] = prefill ? ROLE_RING : ROLE_HELD;
        s->held_loaded[i] = 0;         /* forgotten: its buffer is scratch now, or to be read again */
        s->reread[i] = !prefill;
    }
    /* the lent slots: whatever lands in one is waited for before the region is reused */
    for (int k = p->expert_slots_prefill; k < p->expert_slots; k++) {
        struct slot *sl = &s->eslots[k];
        slot_evict(s, sl);             /* a wrong guess still being read is waited for */
        sl->refs = 0;
    }
    s->n_live = prefill ? p->expert_slots_prefill : p->expert_slots;
    s->pin_now = prefill ? p->pin_prefill : p->pin;
    s->phase = prefill;
    if (prefill) s->st.phase_switches++;
    return kstore_ring_restart(s, prefill ? 0 : s->q_first_decode, err);
}

/* ---- embedding rows --------------------------------------------------------------- */

int kstore_read(kstore *s, uint32_t i, uint64_t off, size_t len, void *dst, krun_err *err)
{
    const kpk_extent *x = kpk_extent_at(s->f, i);
    if (!x || off + len > x->raw_len) { krun_err_set(err, KRUN_EDATA, "bad read of extent %u", i); return -1; }
    if (!s->opt.layout) { /* the extent was checked when the run attached it */
        const uint8_t *d = x->codec == KPK_CODEC_NONE && x->member != KPK_STRIPED ? s->map[x->member] + x->offset : s->decoded[i];
        if (!d && !(d = mapped_or_decoded(s, i, err))) return -1;
        memcpy(dst, d + off, len);
        return 0;
    }
    if (x->codec == KPK_CODEC_BLOCKS) {
        /* a row lies inside one block (block boundaries fall on rows): a raw
         * block is read in place, any other decoded in the window */
        const kpk_block *b = kpk_extent_blocks(s->f, i);
        uint32_t n = kpk_extent_block_count(s->f, i), lo = 0, hi = n;
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (b[mid].raw_off + b[mid].raw_len <= off) lo = mid + 1; else hi = mid;
        }
        if (lo == n || off + len > b[lo].raw_off + b[lo].raw_len) { kstore_err_extent(s, i, err, KRUN_EDATA, "a row across blocks"); return -1; }
        if (b[lo].method == KPK_METHOD_RAW) {
            if (kstore_extent_pread(s, i, dst, len, b[lo].stored_off + (off - b[lo].raw_off), err)) return -1;
            kstore_count_sync(s, i, b[lo].stored_off + (off - b[lo].raw_off), len);
            s->st.bytes_globals += len;
            s->st.bytes_read += len;
        } else {
            uint64_t max_raw, max_stored, a = b[lo].stored_off / KPIECE_ALIGN * KPIECE_ALIGN;
            uint64_t span = up(b[lo].stored_off + b[lo].stored_len) - a;
            uint8_t *stored;
            prefix_blocks(s->opt.model, &max_raw, &max_stored);
            stored = s->window + up(max_raw);
            if (b[lo].raw_off >= s->prefix_end || up(max_raw) + span > s->window_bytes) {
                kstore_err_extent(s, i, err, KRUN_EDATA, "internal: an embedding block outside the window");
                return -1;
            }
            if (kstore_read_stored(s, i, a, span, stored, err)) return -1;
            if (kstore_block_decode(s, i, lo, stored + (b[lo].stored_off - a), s->window, err)) return -1;
            memcpy(dst, s->window + (off - b[lo].raw_off), len);
            s->st.bytes_globals += span;
            s->st.bytes_read += span;
        }
        return 0;
    }
    if (kstore_extent_pread(s, i, dst, len, off, err)) return -1;
    kstore_count_sync(s, i, off, len);
    s->st.bytes_globals += len;
    s->st.bytes_read += len;
    return 0;
}

void kstore_stats_get(const kstore *s, kstore_stats *st)
{
    *st = s->st;
    st->io_wait_seconds = s->io ? kiop_wait_seconds(s->io) : 0;
    for (uint16_t m = 0; m < s->nm && m < KSTORE_MAX_MEMBERS; m++) {
        st->member_queued_bytes[m] = s->io ? kiop_member_bytes(s->io, m) : 0;
        st->member_busy_seconds[m] = s->io ? kiop_member_busy(s->io, m) : 0;
        st->member_bytes[m] = s->io ? st->member_queued_bytes[m] + s->sync_bytes[m] : 0;
    }
}

int kstore_trace_write(kstore *s, const char *path)
{
    if (!s->io) {
        FILE *f = fopen(path, "w"); /* no streaming reads: an empty trace */
        if (!f) return -1;
        fprintf(f, "kind\tmember\toffset\tlength\tstart_s\tend_s\n");
        return fclose(f);
    }
    return kiop_trace_write(s->io, path);
}
