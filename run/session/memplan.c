#include "memplan.h"

#include "sweep_model.h"
#include "format/kprogress.h"
#include "run/engine/forward.h"
#include "run/engine/predict.h"
#include "run/engine/statepage.h"
#include "run/store/iopool.h"
#include "run/store/store.h"
#include "run/store/store_pieces.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int64_t kmem_preset(const char *name)
{
    static const struct { const char *n; int gib; } p[] = {
        {"laptop", 8}, {"desktop", 32}, {"workstation", 64}, {"server", 128}, {"max", 224}};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (strcmp(name, p[i].n) == 0) return (int64_t)p[i].gib << 30;
    return -1;
}

uint64_t kmem_base_bytes(const k3_model *m)
{
    const kpk_file *f = m->file;
    uint64_t n_ext = kpk_extent_count(f), n_t = kpk_tensor_count(f), slots = 16;
    uint64_t dir;
    while (slots < n_t * 2) slots <<= 1;
    /* the reader's tables: decoded extents, raw tensor records, the name
     * hash, the per-layer and per-expert indexes; the string pool and the
     * manifest are bounded by the file's directory size */
    dir = n_ext * sizeof(kpk_extent) + n_t * KPK_TENSOR_RECORD_SIZE + slots * 4 +
          (uint64_t)kpk_layer_count(f) * (1 + kpk_expert_count(f)) * 8 +
          (kpk_size(f) - kpk_super(f)->tensor_table_off);
    /* the tokenizer: the rank file, its decoded pieces and hash table */
    return KMEM_PROCESS_BYTES + kstore_window_bytes(m) + dir + 4 * (uint64_t)m->tokenizer_rank_len + m->tokenizer_config_len +
           m->config_len;
}

/* Everything a plan is assembled from, measured once. */
struct cand {                  /* one piece size: the cut of every layer and lm_head */
    uint64_t piece;
    uint64_t slot_max[K3_MAX_LAYERS + 1];   /* the largest slot of slot s's pieces */
    uint64_t slot_read[K3_MAX_LAYERS + 1];  /* bytes slot s reads per step */
    int slot_k[K3_MAX_LAYERS + 1];          /* the fewest ring slots slot s runs with */
    uint32_t slot_n[K3_MAX_LAYERS + 1];     /* its pieces */
};

struct sizes {
    uint64_t globals_held[2];  /* [head streamed?] the held part of the globals */
    int head_streamable;
    uint64_t expert_slot;
    uint64_t trunk[K3_MAX_LAYERS]; /* a pinned layer's buffer */
    uint64_t io;               /* every I/O worker's decode buffers */
    int io_threads;
    int moe_layers;
    int max_slots, min_slots;  /* expert slots: every expert of every MoE layer; top-k */
    uint64_t predict_buf, predict_stage; /* the prediction's router buffers */
    struct cand *cand;
    int ncand;
};

static void sizes_free(struct sizes *s) { free(s->cand); }

/* Piece sizes the planner tries, largest first: the largest streamed range
 * whole, then halving, down to what keeps a step under 65,536 pieces. */
static int candidates(const k3_model *m, uint64_t forced, uint64_t *out)
{
    const kpk_file *f = m->file;
    uint64_t whole = 0, total = 0, floor_, p;
    int n = 0;
    if (forced) { out[0] = forced; return 1; }
    for (int L = 0; L <= m->cfg.n_layers; L++) {
        uint64_t len = L < m->cfg.n_layers ? kpk_extent_at(f, m->trunk_extent[L])->raw_len : m->globals[K3T_LM_HEAD].nbytes;
        if (!k3_here(m, L < m->cfg.n_layers ? L : K3_GLOBALS)) continue;     /* another rank's (run/cluster) */
        if (len > whole) whole = len;
        total += len;
    }
    out[n++] = whole ? whole : 1;
    floor_ = total / 65536 > KPIECE_ALIGN ? total / 65536 : KPIECE_ALIGN;
    for (p = 1; p * 2 < whole; p *= 2) {}
    for (; p >= floor_ && n < 48; p /= 2) out[n++] = p;
    return n;
}

static int measure(const k3_model *m, const kmemplan_req *q, struct sizes *s, krun_err *err)
{
    const kpk_file *f = m->file;
    const k3_config *c = &m->cfg;
    const uint32_t g = m->globals_extent;
    const uint64_t stage = kiop_stage_bytes(f);
    int64_t first = k3_globals_first(m);
    uint64_t cands[48];
    krange r;
    memset(s, 0, sizeof *s);
    if (first < 0) {
        krun_err_set(err, KRUN_EINPUT, "%s: the embedding is not the first tensor of the globals extent, so it cannot be left "
                     "out of memory; run without --mem", kpk_path(f));
        return -1;
    }
    for (uint32_t i = 0; i < kpk_extent_count(f); i++) {
        const kpk_extent *x = kpk_extent_at(f, i);
        if (x->codec == KPK_CODEC_ZSTD && (x->kind == KPK_KIND_GLOBALS || x->kind == KPK_KIND_TRUNK || x->kind == KPK_KIND_EXPERT)) {
            char d[64];
            kpk_extent_name(f, i, d, sizeof d);
            krun_err_set(err, KRUN_EINPUT, "%s: %s is one zstd frame (codec 1), which krun decodes only whole; run without --mem, or "
                         "re-lay the file out with blocks (codec 2)", kpk_path(f), d);
            return -1;
        }
    }
    /* the globals but the embedding, or but the embedding and lm_head (nothing when another rank has them) */
    kring_range(f, g, (uint64_t)first, kpk_extent_at(f, g)->raw_len, stage, &r);
    s->globals_held[0] = k3_here(m, K3_GLOBALS) ? r.buf_bytes : 0;
    s->head_streamable = k3_here(m, K3_GLOBALS) && kring_head_streamable(m);
    if (s->head_streamable) {
        kring_range(f, g, m->globals[K3T_LM_HEAD].offset + m->globals[K3T_LM_HEAD].nbytes, kpk_extent_at(f, g)->raw_len, stage, &r);
        s->globals_held[1] = r.buf_bytes;
    }
    for (int L = 0; L < c->n_layers; L++) {
        kring_range(f, m->trunk_extent[L], 0, kpk_extent_at(f, m->trunk_extent[L])->raw_len, stage, &r);
        s->trunk[L] = k3_here(m, L) ? r.buf_bytes : 0;
        if (k3_layer_is_moe(c, L)) {
            s->moe_layers++;
            for (int e = 0; e < c->n_experts; e++) {
                uint32_t i = (uint32_t)k3_expert_extent(m, L, e);
                kring_range(f, i, 0, kpk_extent_at(f, i)->raw_len, stage, &r);
                if (r.buf_bytes > s->expert_slot) s->expert_slot = r.buf_bytes;
            }
        }
    }
    s->max_slots = s->moe_layers * c->n_experts;
    s->min_slots = c->topk < s->max_slots ? c->topk : s->max_slots;
    k3_predict_bytes(m, &s->predict_buf, &s->predict_stage);
    s->io_threads = kstore_io_threads(f, q->io_threads, NULL);
    s->io = (uint64_t)s->io_threads * kiop_worker_bytes(f);
    /* every candidate piece size: the cut of every layer and (when it can stream) lm_head */
    s->ncand = candidates(m, q->piece, cands);
    s->cand = calloc((size_t)s->ncand, sizeof *s->cand);
    if (!s->cand) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    for (int k = 0; k < s->ncand; k++) {
        struct cand *cd = &s->cand[k];
        kring ring;
        if (kring_build(&ring, m, cands[k], 0, s->head_streamable, stage, err)) { sizes_free(s); return -1; }
        cd->piece = cands[k];
        for (int t = 0; t < ring.n_slots; t++) {
            cd->slot_n[t] = ring.slot_npieces[t];
            cd->slot_k[t] = kring_slot_min_slots(&ring, m, t);
            for (uint32_t j = ring.slot_piece0[t]; j < ring.slot_piece0[t] + ring.slot_npieces[t]; j++) {
                if (ring.piece[j].slot_bytes > cd->slot_max[t]) cd->slot_max[t] = ring.piece[j].slot_bytes;
                cd->slot_read[t] += ring.piece[j].read_bytes;
            }
        }
        kring_free(&ring);
    }
    return 0;
}

/* One way to lay the budget out. */
struct choice { int head, pin, cand; };

/* The ring for a choice: K slots of ring_slot bytes (0, 0 when nothing streams). */
static void ring_of(const struct sizes *s, const struct choice *ch, int NL, int *k, uint64_t *slot_bytes, uint32_t *pieces)
{
    const struct cand *cd = &s->cand[ch->cand];
    *k = 0;
    *slot_bytes = 0;
    *pieces = 0;
    for (int t = ch->pin; t <= NL; t++) {
        if (t == NL && !ch->head) break;
        if (!cd->slot_n[t]) continue;
        if (cd->slot_k[t] > *k) *k = cd->slot_k[t];
        if (cd->slot_max[t] > *slot_bytes) *slot_bytes = cd->slot_max[t];
        *pieces += cd->slot_n[t];
    }
    if (*k && *k < 2) *k = 2; /* one piece in use, one being read */
}

static uint64_t total_for(const struct sizes *s, const kmemplan *p, const struct choice *ch, int slots)
{
    int k;
    uint64_t rs, pb = 0;
    uint32_t np;
    ring_of(s, ch, p->n_layers, &k, &rs, &np);
    for (int L = 0; L < ch->pin; L++) pb += s->trunk[L];
    return p->base + s->globals_held[ch->head] + p->state_bytes + p->vectors_bytes + p->scratch_bytes + s->io + pb + p->predict_bytes +
           (uint64_t)k * rs + (uint64_t)slots * s->expert_slot;
}

int kmemplan_split_layout(const k3_model *m)
{
    const kpk_extent *expert = NULL;
    for (int L = 0; L < m->cfg.n_layers && !expert; L++)
        if (k3_layer_is_moe(&m->cfg, L) && k3_expert_extent(m, L, 0) >= 0)
            expert = kpk_extent_at(m->file, (uint32_t)k3_expert_extent(m, L, 0));
    if (!expert) return 0;
    for (int L = 0; L < m->cfg.n_layers; L++)
        if (kpk_extent_at(m->file, m->trunk_extent[L])->member != expert->member) return 1;
    return 0;
}

/* The plan's parts that no choice changes: the base, the state, the vectors,
 * the scratch and journal, the I/O workers, the prediction's buffers. */
static void fixed_parts(kmemplan *p, const kmemplan_req *q, const struct sizes *s, const k3_config *c)
{
    p->budget = q->budget;
    p->base = q->base;
    p->ctx = q->ctx;
    p->chunk_auto = q->chunk == 0;
    p->chunk = q->chunk ? q->chunk : KMEM_DECODE_BLOCK;
    p->max_seqs = q->max_seqs;
    p->spec = q->spec;
    p->block = k3_block_positions(p->chunk, q->max_seqs, q->spec);
    p->moe_layers = s->moe_layers;
    p->n_experts = c->n_experts;
    p->topk = c->topk;
    p->max_slots = s->max_slots;
    p->n_layers = c->n_layers;
    p->session_bytes = q->session_bytes;
    p->paged = q->paged;
    if (q->paged) {
        /* the same functions the pager allocates and reads by */
        p->page_window_bytes = k3_page_window_bytes(c, q->ctx, q->max_seqs);
        p->page_file_bytes = k3_page_file_bytes(c, q->ctx, q->max_seqs);
        k3_page_sweep_bytes(c, q->max_seqs, q->ctx - 1, &p->page_read_bytes, &p->page_write_bytes);
    }
    p->state_bytes = (uint64_t)q->max_seqs * p->session_bytes + p->page_window_bytes;
    p->vectors_bytes = k3_run_vectors_bytes(c);
    p->taps = q->taps;
    p->scratch_bytes = k3_run_bytes(c, p->block, q->max_seqs, q->ctx, q->spec, q->taps) - p->vectors_bytes;
    p->spec_bytes = k3_journal_bytes(c, q->spec);
    p->expert_slot_bytes = s->expert_slot;
    p->io_threads = s->io_threads;
    p->io_worker_bytes = s->io_threads ? s->io / (uint64_t)s->io_threads : 0;
    p->io_bytes = s->io;
    /* the prediction's buffers, when asked for (--predict on) */
    p->predict = q->predict > 0 && s->moe_layers;
    p->predict_buf_bytes = p->predict ? s->predict_buf : 0;
    p->predict_stage_bytes = p->predict ? s->predict_stage : 0;
    p->predict_bytes = p->predict_buf_bytes + p->predict_stage_bytes;
}

/* The smallest total over every choice (p->minimum), and the choice: what is
 * read on every token held first (lm_head, then the longest trunk prefix),
 * then the largest pieces that fit (whole extents first), within --pin and
 * --head and with `slots` expert slots.  When nothing fits, the plan closest
 * to what was asked: nothing pinned, the smallest total. */
static struct choice choose(const struct sizes *s, kmemplan *p, const kmemplan_req *q, int slots)
{
    const int NL = p->n_layers, pin = q->pin > NL ? NL : q->pin;
    struct choice ch = {0, 0, 0}, best = ch;
    uint64_t low = UINT64_MAX;
    int found = 0;
    p->minimum = UINT64_MAX;
    for (ch.head = 0; ch.head <= s->head_streamable; ch.head++)
        for (ch.pin = NL; ch.pin >= 0; ch.pin--)
            for (ch.cand = 0; ch.cand < s->ncand; ch.cand++) {
                uint64_t t = total_for(s, p, &ch, s->min_slots);
                if (t < p->minimum) p->minimum = t;
                if (found || (q->pin >= 0 && ch.pin != pin) || (q->head >= 0 && ch.head != q->head)) continue;
                if (total_for(s, p, &ch, slots) <= q->budget) { best = ch; found = 1; }
            }
    if (found) return best;
    for (ch.head = 0; ch.head <= s->head_streamable; ch.head++)
        for (ch.cand = 0; ch.cand < s->ncand; ch.cand++) {
            if (q->head >= 0 && ch.head != q->head) continue;
            ch.pin = q->pin >= 0 ? pin : 0;
            if (total_for(s, p, &ch, slots) < low) { low = total_for(s, p, &ch, slots); best = ch; }
        }
    return best;
}

/* The plan of choice ch: its parts, and the expert slots (the caller's, or
 * what the budget leaves: the expert cache takes the rest). */
static void fill(kmemplan *p, const struct sizes *s, const struct choice *ch, const kmemplan_req *q, const k3_config *c, int slots)
{
    const int NL = p->n_layers;
    if (slots < 0) {
        uint64_t rest = total_for(s, p, ch, 0);
        slots = rest < q->budget && s->expert_slot ? (int)((q->budget - rest) / s->expert_slot) : 0;
        if (slots > s->max_slots) slots = s->max_slots;
        if (slots < s->min_slots) slots = s->min_slots;
    }
    if (s->max_slots > 0 && slots < 1) slots = 1;
    p->pin = ch->pin;
    p->head_streamed = ch->head;
    p->expert_slots = slots;
    p->total = total_for(s, p, ch, slots);
    p->globals_resident = s->globals_held[ch->head];
    for (int L = 0; L < ch->pin; L++) p->pinned_bytes += s->trunk[L];
    ring_of(s, ch, NL, &p->ring_slots, &p->ring_slot_bytes, &p->ring_pieces);
    p->piece_bytes = p->ring_slots ? s->cand[ch->cand].piece : 0;
    for (int L = ch->pin; L < NL; L++) p->trunk_stream_bytes += s->cand[ch->cand].slot_read[L];
    if (ch->head) p->head_stream_bytes = s->cand[ch->cand].slot_read[NL];
    /* one layout until choose_prefill adds the other */
    p->pin_prefill = p->pin;
    p->pinned_prefill_bytes = p->pinned_bytes;
    p->expert_slots_prefill = slots;
    p->ring_pieces_prefill = p->ring_pieces;
    p->trunk_stream_prefill_bytes = p->trunk_stream_bytes;
    p->expert_reads_max = (uint64_t)s->moe_layers * (uint64_t)c->topk * s->expert_slot * (p->predict ? 2 : 1);
    {
        /* sessions that fit: the rest of the plan with the fewest expert slots */
        /* paged: each session also brings its share of the window (it is linear in the sessions) */
        uint64_t rest = total_for(s, p, ch, s->min_slots) - p->state_bytes;
        uint64_t per = p->session_bytes + (p->paged ? k3_page_window_bytes(c, p->ctx, 1) : 0);
        p->sessions_fit = q->budget > rest && per ? (q->budget - rest) / per : 0;
    }
}

/* ---- the prefill layout (--chunk auto) ------------------------------------------------ */

/* Expected distinct experts a block of b positions chooses in one MoE layer:
 * N (1 - (1 - k/N)^b), each position choosing k of N uniformly. */
static double distinct(const kmemplan *p, double b)
{
    if (p->n_experts <= 0 || b <= 0) return 0;
    return p->n_experts * (1.0 - pow(1.0 - (double)p->topk / p->n_experts, b));
}

void kmemplan_prompt_in(const kmemplan *p, size_t n, int prefill, int in_prefill, kprompt *o)
{
    const int pf = prefill && p->block_prefill > 0;
    const size_t B = pf ? p->block_prefill : p->block, full = n / B, rem = n % B;
    const int slots = pf ? p->expert_slots_prefill : p->expert_slots;
    memset(o, 0, sizeof *o);
    o->positions = n;
    o->block = n < B ? n : B;
    o->blocks = full + (rem > 0);
    o->prefill = pf;
    o->trunk_bytes = (uint64_t)o->blocks * (pf ? p->trunk_stream_prefill_bytes : p->trunk_stream_bytes);
    o->head_bytes = (uint64_t)o->blocks * p->head_stream_bytes;
    /* a block reads each expert it chose once; the next block finds none of
     * them (a cache smaller than every expert is turned over by a block's
     * reads), unless the cache holds every expert: then each is read once */
    if (slots >= p->max_slots) o->experts = p->moe_layers * distinct(p, (double)n);
    else o->experts = p->moe_layers * ((double)full * distinct(p, (double)B) + distinct(p, (double)rem));
    o->expert_bytes = (uint64_t)llround(o->experts * (double)p->expert_slot_bytes);
    o->switch_bytes = pf && !in_prefill ? p->switch_bytes : 0;
    o->total_bytes = o->trunk_bytes + o->head_bytes + o->expert_bytes + o->switch_bytes;
}

void kmemplan_prompt(const kmemplan *p, size_t n, int in_prefill, kprompt *out)
{
    kprompt f;
    kmemplan_prompt_in(p, n, 0, in_prefill, out);
    if (!p->block_prefill || n <= p->block) return;
    kmemplan_prompt_in(p, n, 1, in_prefill, &f);
    if (f.total_bytes < out->total_bytes) *out = f;
}

/* The largest block in (lo, hi] whose activations fit in F bytes; lo if none. */
static size_t largest_block(const k3_config *c, const kmemplan *p, size_t lo, size_t hi, uint64_t F)
{
    while (lo < hi) {
        size_t mid = lo + (hi - lo + 1) / 2;
        if (k3_run_scratch_bytes(c, mid, p->max_seqs, p->ctx, p->taps) <= F) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* With --chunk auto: a prefill layout of the same budget, when the cost model
 * says a prompt of prompt_ref positions reads fewer bytes in it.  For every
 * piece size and every choice of the layers it lends (none, or the pinned
 * ones from the last down), the fixed part is the decoding plan with
 * pin_prefill layers and top-k expert slots; the flex region is the rest of
 * the budget: the decoding layout fills it with the lent layers and expert
 * slots, a prefill block with its activations, as many positions as fit.
 * The piece size is tried too because both layouts share one ring, built for
 * the prefill pin: the decoding plan's piece may be a whole extent (when it
 * pins every layer, nothing streams and the largest piece costs nothing), and
 * a ring of whole extents makes lending a layer cost twice that layer
 * (measured: 896 experts, 2 layers, --mem 4G chose 2 x 536 over 1 x 1024). */
static void choose_prefill(kmemplan *p, const struct sizes *s, const struct choice *ch, const kmemplan_req *q, const k3_model *m)
{
    const k3_config *c = &m->cfg;
    const int Smin = s->min_slots;
    const size_t cap = q->ctx < KMEM_BLOCK_MAX ? q->ctx : KMEM_BLOCK_MAX;
    const size_t P = q->prompt_hint ? q->prompt_hint : q->ctx;
    const uint64_t slot = s->expert_slot;
    kmemplan t = *p, best = *p;
    kprompt k;
    uint64_t best_bytes;
    int best_cand = ch->cand;
    kstore_layout lay;
    if (!q->budget || cap <= p->block || p->expert_slots < Smin || p->total > q->budget) return;
    kmemplan_prompt_in(p, P, 0, 0, &k);
    best_bytes = k.total_bytes;
    /* the decoding plan's piece first: another wins only by reading fewer bytes */
    for (int ci = -1; ci < s->ncand; ci++) {
        const int cand = ci < 0 ? ch->cand : ci;
        const struct cand *cd = &s->cand[cand];
        if (ci == ch->cand) continue;
        for (int pin = p->pin; pin >= 0; pin--) {
            const struct choice c2 = {ch->head, pin, cand}, cdec = {ch->head, p->pin, cand};
            const uint64_t fixed0 = total_for(s, p, &c2, Smin);
            uint64_t F, lent_pins = 0, lent_read = 0, keep, ring_b;
            int slots, Sp, ring_k;
            size_t B;
            if (fixed0 >= q->budget) continue;
            F = q->budget - fixed0;    /* the rest: the decoding layout's lent layers and slots, or a block */
            for (int L = pin; L < p->pin; L++) {
                krange r;
                lent_pins += s->trunk[L];
                kring_range(m->file, m->trunk_extent[L], 0, kpk_extent_at(m->file, m->trunk_extent[L])->raw_len, kiop_stage_bytes(m->file), &r);
                lent_read += r.read_bytes;
            }
            if (lent_pins > F) continue;
            slots = q->slots >= 0 ? p->expert_slots : Smin + (int)(slot ? (F - lent_pins) / slot : 0);
            if (slots > s->max_slots) slots = s->max_slots;
            if (lent_pins + (uint64_t)(slots - Smin) * slot > F) continue;
            B = largest_block(c, p, p->block, cap, F);
            if (B <= p->block) continue;
            t = *p;
            /* the decoding layout's reads with this piece (the same ring) */
            ring_of(s, &cdec, p->n_layers, &ring_k, &ring_b, &t.ring_pieces);
            t.trunk_stream_bytes = 0;
            for (int L = p->pin; L < p->n_layers; L++) t.trunk_stream_bytes += cd->slot_read[L];
            t.head_stream_bytes = ch->head ? cd->slot_read[p->n_layers] : 0;
            t.scratch_prefill_bytes = k3_run_scratch_bytes(c, B, p->max_seqs, p->ctx, p->taps);
            /* what the block leaves (a block capped by the context) keeps expert slots in the prefill layout too */
            keep = slot ? (F - t.scratch_prefill_bytes) / slot : 0;
            Sp = Smin + (keep < (uint64_t)(slots - Smin) ? (int)keep : slots - Smin);
            t.block_prefill = B;
            t.pin_prefill = pin;
            t.expert_slots_prefill = Sp;
            t.expert_slots = slots;
            t.trunk_stream_prefill_bytes = 0;
            for (int L = pin; L < p->n_layers; L++) t.trunk_stream_prefill_bytes += cd->slot_read[L];
            t.switch_bytes = lent_read;
            t.lent_bytes = lent_pins + (uint64_t)(slots - Sp) * slot;
            t.flex_bytes = t.lent_bytes > t.scratch_prefill_bytes ? t.lent_bytes : t.scratch_prefill_bytes;
            t.total = fixed0 + (uint64_t)(Sp - Smin) * slot + t.flex_bytes;
            kmemplan_prompt(&t, P, 0, &k);
            if (k.prefill && k.total_bytes < best_bytes) {  /* ties: the decoding plan's piece, the fewest layers lent */
                best = t;
                best_bytes = k.total_bytes;
                best_cand = cand;
            }
        }
    }
    if (!best.block_prefill) return;
    *p = best;
    {
        const struct choice c2 = {ch->head, p->pin_prefill, best_cand};
        uint32_t np;
        p->pinned_prefill_bytes = 0;
        for (int L = 0; L < p->pin_prefill; L++) p->pinned_prefill_bytes += s->trunk[L];
        ring_of(s, &c2, p->n_layers, &p->ring_slots, &p->ring_slot_bytes, &np);
        p->ring_pieces_prefill = np;
        p->piece_bytes = p->ring_slots ? s->cand[best_cand].piece : 0;
    }
    /* the flex region's decoding tenants, as the store carves them (the same sizes) */
    kmemplan_layout(p, &lay);
    p->lent_bytes = kstore_lent_bytes(m->file, m, &lay, kiop_stage_bytes(m->file));
    p->flex_bytes = p->lent_bytes > p->scratch_prefill_bytes ? p->lent_bytes : p->scratch_prefill_bytes;
}

int kmemplan_make(const k3_model *m, const kmemplan_req *q, kmemplan *p, krun_err *err)
{
    struct sizes s;
    struct choice ch;
    int slots;
    char b1[32], b2[32];
    if (q->predict < 0) { /* auto: on for a split layout, unless only the plan without it fits */
        kmemplan_req r = *q;
        r.predict = kmemplan_split_layout(m);
        if (r.predict && kmemplan_make(m, &r, p, err) == 0) return 0;
        r.predict = 0;
        return kmemplan_make(m, &r, p, err);
    }
    memset(p, 0, sizeof *p);
    if (measure(m, q, &s, err)) return -1;
    if (q->head > 0 && !s.head_streamable) {
        sizes_free(&s);
        return krun_err_set(err, KRUN_EINPUT, "%s: lm_head does not follow the embedding in the globals extent, so it cannot "
                            "stream (--head stream)", kpk_path(m->file));
    }
    fixed_parts(p, q, &s, &m->cfg);
    slots = q->slots > s.max_slots ? s.max_slots : q->slots;
    ch = choose(&s, p, q, slots >= 0 ? slots : s.min_slots);
    fill(p, &s, &ch, q, &m->cfg, slots);
    p->prompt_ref = q->prompt_hint ? q->prompt_hint : q->ctx;
    if (p->chunk_auto) choose_prefill(p, &s, &ch, q, m);
    sizes_free(&s);
    p->sweep_bytes = (uint64_t)ksweep_bytes(p, &m->cfg, p->max_seqs);
    if (p->total > q->budget) {
        kfmt_bytes(q->budget, b1, sizeof b1);
        kfmt_bytes(p->minimum, b2, sizeof b2);
        return krun_err_set(err, KRUN_EINPUT, "a budget of %s (%llu bytes) cannot hold this plan (%llu bytes); the minimum for "
                            "this model with --ctx %zu is %s (%llu bytes)", b1, (unsigned long long)q->budget,
                            (unsigned long long)p->total, q->ctx, b2, (unsigned long long)p->minimum);
    }
    return 0;
}

void kmemplan_layout(const kmemplan *p, kstore_layout *out)
{
    *out = (kstore_layout){p->pin, p->head_streamed, p->piece_bytes, p->ring_pieces, p->ring_slots, p->ring_slot_bytes,
                           p->expert_slots, p->expert_slot_bytes, p->pin_prefill, p->expert_slots_prefill, p->ring_pieces_prefill};
}

void kmemplan_print(const kmemplan *p, FILE *out)
{
    char b[32], c2[32], c3[32];
    const int two = p->block_prefill > 0;
#define ROW(label, bytes, ...) do { kfmt_bytes(bytes, b, sizeof b); fprintf(out, "  %-22s %10s  ", label, b); fprintf(out, __VA_ARGS__); fputc('\n', out); } while (0)
    kfmt_bytes(p->budget, b, sizeof b);
    fprintf(out, "memory plan: budget %s%s%s%s (%llu bytes)\n", b, p->preset ? " (preset " : "", p->preset ? p->preset : "",
            p->preset ? ")" : "", (unsigned long long)p->budget);
    ROW("process base", p->base - p->draft_bytes, "code, threads, KPK directory, tokenizer");   /* the drafter: its own row */
    if (p->head_streamed) ROW("held globals", p->globals_resident, "global vectors (lm_head streams; embedding rows read on demand)");
    else ROW("held globals", p->globals_resident, "lm_head and global vectors (embedding rows read on demand)");
    if (p->pin && two && p->pin_prefill < p->pin)
        ROW("pinned trunk", p->pinned_bytes, "layers 0..%d of %d (%d..%d lent to a prefill block)", p->pin - 1, p->n_layers,
            p->pin_prefill, p->pin - 1);
    else if (p->pin) ROW("pinned trunk", p->pinned_bytes, "layers 0..%d of %d", p->pin - 1, p->n_layers);
    else ROW("pinned trunk", p->pinned_bytes, "none of %d layers", p->n_layers);
    kfmt_bytes(p->ring_slot_bytes, c2, sizeof c2);
    kfmt_bytes(p->piece_bytes, c3, sizeof c3);
    if (p->ring_slots && two && p->ring_pieces_prefill != p->ring_pieces)
        ROW("trunk ring", (uint64_t)p->ring_slots * p->ring_slot_bytes, "%d slots x %s: %u pieces of up to ~%s per step (%u in a "
            "prefill block)%s", p->ring_slots, c2, p->ring_pieces, c3, p->ring_pieces_prefill, p->head_streamed ? ", lm_head last" : "");
    else if (p->ring_slots)
        ROW("trunk ring", (uint64_t)p->ring_slots * p->ring_slot_bytes, "%d slots x %s: %u pieces of up to ~%s per step%s", p->ring_slots,
            c2, p->ring_pieces, c3, p->head_streamed ? ", lm_head last" : "");
    else
        ROW("trunk ring", (uint64_t)0, "none: nothing streams");
    kfmt_bytes(p->expert_slot_bytes, c2, sizeof c2);
    if (two && p->expert_slots_prefill < p->expert_slots)
        ROW("expert cache", (uint64_t)p->expert_slots * p->expert_slot_bytes, "%d slots x %s (%d kept during a prefill block)",
            p->expert_slots, c2, p->expert_slots_prefill);
    else
        ROW("expert cache", (uint64_t)p->expert_slots * p->expert_slot_bytes, "%d slots x %s", p->expert_slots, c2);
    if (p->io_bytes) {
        kfmt_bytes(p->io_worker_bytes, c2, sizeof c2);
        ROW("I/O staging", p->io_bytes, "%d I/O workers x %s: stored bytes of the compressed blocks each decodes", p->io_threads, c2);
    }
    if (p->predict) ROW("prediction", p->predict_bytes, "a router read early, to read a layer's likely experts during its attention");
    kfmt_bytes(p->session_bytes, c2, sizeof c2);
    if (p->paged) {
        kfmt_bytes(p->page_window_bytes, c3, sizeof c3);
        ROW("state", p->state_bytes, "%zu session%s x %s (tokens, logits, sampler) + a window of %s: the layers in flight of every "
            "session's state (3 at most of each kind), the rest on disk (--state-dir); %llu would fit", p->max_seqs, p->max_seqs == 1 ? "" : "s", c2, c3,
            (unsigned long long)p->sessions_fit);
    } else {
        ROW("state", p->state_bytes, "%zu session%s x %s (KDA + ShortConv state, MLA latent cache for --ctx %zu); %llu would fit",
            p->max_seqs, p->max_seqs == 1 ? "" : "s", c2, p->ctx, (unsigned long long)p->sessions_fit);
    }
    if (p->draft_path[0]) {
        kfmt_bytes(p->draft_weight_bytes, c2, sizeof c2);
        kfmt_bytes(p->draft_state_bytes, c3, sizeof c3);
        ROW("drafter", p->draft_bytes, "%s: its weights (%s) held, its chains' scratch (in state: %s per session)", p->draft_path, c2, c3);
    }
    ROW("bound vectors", p->vectors_bytes, "norms, AttnRes folds, conv taps, biases of every layer, widened once");
    if (p->spec) {
        kfmt_bytes(p->spec_bytes, c2, sizeof c2);
        ROW("scratch", p->scratch_bytes, "activations of a %zu-position block; %s of it the --spec %zu journal", p->block, c2, p->spec);
    } else {
        ROW("scratch", p->scratch_bytes, "activations of a %zu-position block%s", p->block, two ? " (while decoding)" : "");
    }
    if (two) {
        kfmt_bytes(p->lent_bytes, c2, sizeof c2);
        kfmt_bytes(p->scratch_prefill_bytes, c3, sizeof c3);
        ROW("flex region", p->flex_bytes, "while decoding: the lent layers and expert slots (%s); during a prefill block: its "
            "activations, %zu positions (%s)", c2, p->block_prefill, c3);
    }
    ROW("total", p->total, "(minimum for this model and --ctx: %.3g GB)", (double)p->minimum / 1e9);
    kfmt_bytes(p->trunk_stream_bytes, b, sizeof b);
    kfmt_bytes(p->expert_reads_max, c2, sizeof c2);
    kfmt_bytes(p->head_stream_bytes, c3, sizeof c3);
    fprintf(out, "reads per decoding step: trunk %s (every unpinned layer)%s%s%s, experts up to %s (top-k of every MoE layer, less cache hits)\n",
            b, p->head_streamed ? ", lm_head " : "", p->head_streamed ? c3 : "", p->head_streamed ? " (streamed)" : "", c2);
    if (p->draft_path[0]) {
        kfmt_bytes(p->bytes_per_token, b, sizeof b);
        kfmt_bytes(p->bytes_per_token_nodraft, c2, sizeof c2);
        fprintf(out, "drafter: at an acceptance of %.2f per draft it pays to verify %zu drafts a pass: %.2f tokens per pass, %s per "
                "generated token%s%s%s (the width and acceptance are measured again per request as it runs)\n", p->draft_accept,
                p->draft_width, p->draft_tokens_per_pass, b, p->bytes_per_token_nodraft ? " (without it, its memory given to the "
                "model: " : "", p->bytes_per_token_nodraft ? c2 : "", p->bytes_per_token_nodraft ? ")" : "");
    } else if (p->draft_note) {
        fprintf(out, "drafter: none (%s)\n", p->draft_note);
    }
    if (p->paged) {
        char r[32], w[32], f[32];
        const double st = (double)(p->page_read_bytes + p->page_write_bytes);
        kfmt_bytes(p->page_read_bytes, r, sizeof r);
        kfmt_bytes(p->page_write_bytes, w, sizeof w);
        kfmt_bytes(p->page_file_bytes, f, sizeof f);
        kfmt_bytes(p->sweep_bytes, b, sizeof b);
        fprintf(out, "states on disk: a decoding sweep of %zu sequence%s at position %zu reads %s and writes %s of state, next to %s "
                "of weights (union model): %.1f%% of the sweep's bytes; state file %s\n", p->max_seqs, p->max_seqs == 1 ? "" : "s",
                p->ctx - 1, r, w, b, 100.0 * st / (st + (double)p->sweep_bytes), f);
    }
    if (two) {
        kfmt_bytes(p->trunk_stream_prefill_bytes, b, sizeof b);
        kfmt_bytes(p->switch_bytes, c2, sizeof c2);
        kfmt_bytes(p->expert_slot_bytes, c3, sizeof c3);
        fprintf(out, "prompt blocks (--chunk auto): up to %zu positions while decoding; a longer prompt runs in blocks of up to %zu "
                "positions when the cost model says it reads fewer bytes (each reads the trunk %s, and %s more when decoding resumes)\n",
                p->block, p->block_prefill, b, c2);
        fprintf(out, "cost model: a P-token prompt in blocks of B reads ceil(P/B) x (unpinned trunk%s + %d MoE layers x "
                "%d (1 - (1 - %d/%d)^B) experts x %s), + the lent layers once when decoding resumes (chosen for P = %zu)\n",
                p->head_streamed ? " + lm_head" : "", p->moe_layers, p->n_experts, p->topk, p->n_experts, c3, p->prompt_ref);
    } else if (p->chunk_auto) {
        fprintf(out, "prompt blocks (--chunk auto): %zu positions (no larger block saves bytes at this budget)\n", p->block);
    }
#undef ROW
}

void kmemplan_prompt_print(const kmemplan *p, size_t n, double disk_mbps, FILE *out)
{
    kprompt k;
    char t[32], h[32], e[32], w[32], a[32];
    kmemplan_prompt(p, n, 0, &k);
    kfmt_bytes(k.trunk_bytes, t, sizeof t);
    kfmt_bytes(k.head_bytes, h, sizeof h);
    kfmt_bytes(k.expert_bytes, e, sizeof e);
    kfmt_bytes(k.switch_bytes, w, sizeof w);
    kfmt_bytes(k.total_bytes, a, sizeof a);
    fprintf(out, "prompt of %zu tokens: %zu block%s of up to %zu positions (%s layout); reads %s: trunk %s, lm_head %s, experts %s "
            "(%.0f expected reads), decoding resumes %s\n", n, k.blocks, k.blocks == 1 ? "" : "s", k.block,
            k.prefill ? "prefill" : "decoding", a, t, h, e, k.experts, w);
    if (disk_mbps > 0) {
        char d[32];
        kfmt_duration((double)k.total_bytes / (disk_mbps * 1e6), d, sizeof d);
        fprintf(out, "at %.0f MB/s: %s of reading (the compute is not counted)\n", disk_mbps, d);
    }
}

json_t *kmemplan_prompt_json(const kmemplan *p, size_t n, double disk_mbps)
{
    kprompt k;
    json_t *j = json_object();
    kmemplan_prompt(p, n, 0, &k);
    json_object_set_new(j, "tokens", json_integer((json_int_t)n));
    json_object_set_new(j, "block", json_integer((json_int_t)k.block));
    json_object_set_new(j, "blocks", json_integer((json_int_t)k.blocks));
    json_object_set_new(j, "layout", json_string(k.prefill ? "prefill" : "decoding"));
    json_object_set_new(j, "expected_expert_reads", json_real(k.experts));
    json_object_set_new(j, "trunk_bytes", json_integer((json_int_t)k.trunk_bytes));
    json_object_set_new(j, "head_bytes", json_integer((json_int_t)k.head_bytes));
    json_object_set_new(j, "expert_bytes", json_integer((json_int_t)k.expert_bytes));
    json_object_set_new(j, "switch_bytes", json_integer((json_int_t)k.switch_bytes));
    json_object_set_new(j, "total_bytes", json_integer((json_int_t)k.total_bytes));
    json_object_set_new(j, "disk_mbps", disk_mbps > 0 ? json_real(disk_mbps) : json_null());
    json_object_set_new(j, "seconds", disk_mbps > 0 ? json_real((double)k.total_bytes / (disk_mbps * 1e6)) : json_null());
    return j;
}

json_t *kmemplan_json(const kmemplan *p)
{
    json_t *j = json_object();
    json_object_set_new(j, "budget_bytes", json_integer((json_int_t)p->budget));
    json_object_set_new(j, "preset", p->preset ? json_string(p->preset) : json_null());
    json_object_set_new(j, "base_bytes", json_integer((json_int_t)p->base));
    json_object_set_new(j, "globals_resident_bytes", json_integer((json_int_t)p->globals_resident));
    json_object_set_new(j, "head_streamed", json_boolean(p->head_streamed));
    json_object_set_new(j, "piece_bytes", json_integer((json_int_t)p->piece_bytes));
    json_object_set_new(j, "ring_pieces", json_integer((json_int_t)p->ring_pieces));
    json_object_set_new(j, "io_threads", json_integer(p->io_threads));
    json_object_set_new(j, "io_worker_bytes", json_integer((json_int_t)p->io_worker_bytes));
    json_object_set_new(j, "io_bytes", json_integer((json_int_t)p->io_bytes));
    json_object_set_new(j, "pinned_layers", json_integer(p->pin));
    json_object_set_new(j, "pinned_bytes", json_integer((json_int_t)p->pinned_bytes));
    json_object_set_new(j, "ring_slots", json_integer(p->ring_slots));
    json_object_set_new(j, "ring_slot_bytes", json_integer((json_int_t)p->ring_slot_bytes));
    json_object_set_new(j, "expert_slots", json_integer(p->expert_slots));
    json_object_set_new(j, "expert_slot_bytes", json_integer((json_int_t)p->expert_slot_bytes));
    json_object_set_new(j, "state_bytes", json_integer((json_int_t)p->state_bytes));
    json_object_set_new(j, "session_bytes", json_integer((json_int_t)p->session_bytes));
    json_object_set_new(j, "max_seqs", json_integer((json_int_t)p->max_seqs));
    json_object_set_new(j, "sessions_fit", json_integer((json_int_t)p->sessions_fit));
    json_object_set_new(j, "states_paged", json_boolean(p->paged));
    json_object_set_new(j, "state_window_bytes", json_integer((json_int_t)p->page_window_bytes));
    json_object_set_new(j, "state_file_bytes", json_integer((json_int_t)p->page_file_bytes));
    json_object_set_new(j, "state_read_bytes_per_sweep", json_integer((json_int_t)p->page_read_bytes));
    json_object_set_new(j, "state_write_bytes_per_sweep", json_integer((json_int_t)p->page_write_bytes));
    json_object_set_new(j, "sweep_weight_bytes", json_integer((json_int_t)p->sweep_bytes));
    json_object_set_new(j, "vectors_bytes", json_integer((json_int_t)p->vectors_bytes));
    json_object_set_new(j, "scratch_bytes", json_integer((json_int_t)p->scratch_bytes));
    json_object_set_new(j, "block_positions", json_integer((json_int_t)p->block));
    json_object_set_new(j, "spec", json_integer((json_int_t)p->spec));
    json_object_set_new(j, "spec_journal_bytes", json_integer((json_int_t)p->spec_bytes));
    json_object_set_new(j, "total_bytes", json_integer((json_int_t)p->total));
    json_object_set_new(j, "minimum_bytes", json_integer((json_int_t)p->minimum));
    json_object_set_new(j, "ctx", json_integer((json_int_t)p->ctx));
    json_object_set_new(j, "trunk_stream_bytes_per_token", json_integer((json_int_t)p->trunk_stream_bytes));
    json_object_set_new(j, "head_stream_bytes_per_token", json_integer((json_int_t)p->head_stream_bytes));
    json_object_set_new(j, "expert_read_bytes_per_token_max", json_integer((json_int_t)p->expert_reads_max));
    json_object_set_new(j, "predict", json_boolean(p->predict));
    json_object_set_new(j, "predict_bytes", json_integer((json_int_t)p->predict_bytes));
    json_object_set_new(j, "chunk_auto", json_boolean(p->chunk_auto));
    json_object_set_new(j, "block_prefill", json_integer((json_int_t)p->block_prefill));
    json_object_set_new(j, "pinned_layers_prefill", json_integer(p->pin_prefill));
    json_object_set_new(j, "pinned_bytes_prefill", json_integer((json_int_t)p->pinned_prefill_bytes));
    json_object_set_new(j, "expert_slots_prefill", json_integer(p->expert_slots_prefill));
    json_object_set_new(j, "ring_pieces_prefill", json_integer((json_int_t)p->ring_pieces_prefill));
    json_object_set_new(j, "lent_bytes", json_integer((json_int_t)p->lent_bytes));
    json_object_set_new(j, "scratch_prefill_bytes", json_integer((json_int_t)p->scratch_prefill_bytes));
    json_object_set_new(j, "flex_bytes", json_integer((json_int_t)p->flex_bytes));
    json_object_set_new(j, "trunk_stream_bytes_prefill", json_integer((json_int_t)p->trunk_stream_prefill_bytes));
    json_object_set_new(j, "switch_bytes", json_integer((json_int_t)p->switch_bytes));
    json_object_set_new(j, "prompt_ref", json_integer((json_int_t)p->prompt_ref));
    json_object_set_new(j, "bytes_per_token", json_integer((json_int_t)p->bytes_per_token));
    if (p->draft_path[0]) {
        json_t *d = json_object();
        json_object_set_new(d, "file", json_string(p->draft_path));
        json_object_set_new(d, "bytes", json_integer((json_int_t)p->draft_bytes));
        json_object_set_new(d, "weight_bytes", json_integer((json_int_t)p->draft_weight_bytes));
        json_object_set_new(d, "state_bytes_per_session", json_integer((json_int_t)p->draft_state_bytes));
        json_object_set_new(d, "accept", json_real(p->draft_accept));
        json_object_set_new(d, "width", json_integer((json_int_t)p->draft_width));
        json_object_set_new(d, "tokens_per_pass", json_real(p->draft_tokens_per_pass));
        json_object_set_new(d, "bytes_per_token_without", p->bytes_per_token_nodraft ? json_integer((json_int_t)p->bytes_per_token_nodraft)
                                                                                      : json_null());
        json_object_set_new(j, "drafter", d);
    } else {
        json_object_set_new(j, "drafter", json_null());
        json_object_set_new(j, "drafter_note", p->draft_note ? json_string(p->draft_note) : json_null());
    }
    json_object_set_new(j, "cost_model", json_pack("{sisisisIsi}", "moe_layers", p->moe_layers, "n_experts", p->n_experts, "topk", p->topk,
                                                   "expert_bytes", (json_int_t)p->expert_slot_bytes, "max_slots", p->max_slots));
    return j;
}
