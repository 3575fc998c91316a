/* Cutting the step's streamed ranges into pieces, and how many ring slots a
 * step needs (store_pieces.h). */
#include "store_pieces.h"

#include "run/model/use_order.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AL KPIECE_ALIGN

static uint64_t down(uint64_t v) { return v / AL * AL; }
static uint64_t up(uint64_t v) { return (v + AL - 1) / AL * AL; }

/* ---- decode requests -------------------------------------------------------------- */

uint64_t kring_groups(const kpk_file *f, uint32_t i, uint32_t b0, uint32_t b1, uint64_t stage_bytes, kgroup_fn fn, void *ctx)
{
    const kpk_extent *x = kpk_extent_at(f, i);
    const kpk_block *b = kpk_extent_blocks(f, i);
    const uint64_t U = x->member == KPK_STRIPED ? kpk_super(f)->stripe_unit : 0;
    uint64_t total = 0;
    for (uint32_t g = b0; g < b1;) {
        uint64_t s0 = down(b[g].stored_off), unit_end = UINT64_MAX;
        uint32_t e = g + 1;
        if (U) unit_end = ((x->offset + b[g].stored_off) / U + 1) * U - x->offset;
        while (e < b1) {
            uint64_t end = b[e].stored_off + b[e].stored_len;
            if (up(end) - s0 > stage_bytes || end > unit_end) break;
            e++;
        }
        {
            uint64_t s1 = up(b[e - 1].stored_off + b[e - 1].stored_len);
            if (fn) fn(ctx, g, e, s0, s1 - s0);
            total += s1 - s0;
        }
        g = e;
    }
    return total;
}

/* The blocks of codec-2 extent i that overlap decoded bytes [r0, r1). */
static void blocks_over(const kpk_file *f, uint32_t i, uint64_t r0, uint64_t r1, uint32_t *b0, uint32_t *b1)
{
    const kpk_block *b = kpk_extent_blocks(f, i);
    uint32_t n = kpk_extent_block_count(f, i), lo = 0, hi = n;
    while (lo < hi) { /* the first block ending after r0 */
        uint32_t mid = lo + (hi - lo) / 2;
        if (b[mid].raw_off + b[mid].raw_len <= r0) lo = mid + 1; else hi = mid;
    }
    *b0 = lo;
    while (hi < n && b[hi].raw_off < r1) hi++;
    *b1 = hi > lo ? hi : lo;
}

void kring_range(const kpk_file *f, uint32_t i, uint64_t r0, uint64_t r1, uint64_t stage_bytes, krange *o)
{
    const kpk_extent *x = kpk_extent_at(f, i);
    memset(o, 0, sizeof *o);
    if (x->codec == KPK_CODEC_BLOCKS) {
        const kpk_block *b = kpk_extent_blocks(f, i);
        blocks_over(f, i, r0, r1, &o->b0, &o->b1);
        if (o->b1 > o->b0) {
            o->r0 = b[o->b0].raw_off;
            o->r1 = b[o->b1 - 1].raw_off + b[o->b1 - 1].raw_len;
        }
        o->a0 = down(o->r0);
        o->read_bytes = kring_groups(f, i, o->b0, o->b1, stage_bytes, NULL, NULL);
        o->buf_bytes = up(o->r1 - o->a0);
    } else {
        o->r0 = r0;
        o->r1 = r1;
        o->a0 = down(r0);
        o->a1 = up(r1);
        o->read_bytes = o->a1 - o->a0;
        o->buf_bytes = o->a1 - o->a0;
    }
    if (!o->buf_bytes) o->buf_bytes = AL;
}

/* ---- cutting ---------------------------------------------------------------------- */

struct tens { uint8_t role, use; uint64_t off, end, rowb; };

struct build {
    kring *r;
    const k3_model *m;
    uint32_t cap_p, cap_q;
    krun_err *err;
};

static int grow(void **v, uint32_t *cap, uint32_t need, size_t size)
{
    void *n;
    uint32_t c;
    if (need <= *cap) return 0;
    c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    n = realloc(*v, (size_t)c * size);
    if (!n) return -1;
    *v = n;
    *cap = c;
    return 0;
}

/* Append piece [r0, r1) of slot s (extent i), with a part for every tensor of ts it overlaps. */
static int emit(struct build *B, int s, uint32_t i, uint64_t r0, uint64_t r1, uint32_t b0, uint32_t b1, const struct tens *ts,
                int nt, uint64_t stage)
{
    kring *r = B->r;
    const kpk_file *f = B->m->file;
    kpiece *p;
    if (grow((void **)&r->piece, &B->cap_p, r->n + 1, sizeof *r->piece)) goto oom;
    p = &r->piece[r->n];
    memset(p, 0, sizeof *p);
    p->extent = i;
    p->slot = s;
    p->r0 = r0;
    p->r1 = r1;
    p->part0 = r->nparts;
    if (kpk_extent_at(f, i)->codec == KPK_CODEC_BLOCKS) {
        p->b0 = b0;
        p->b1 = b1;
        p->a0 = down(r0);
        p->read_bytes = kring_groups(f, i, b0, b1, stage, NULL, NULL);
        p->slot_bytes = up(r1 - p->a0);
    } else {
        p->a0 = down(r0);
        p->a1 = up(r1);
        p->read_bytes = p->a1 - p->a0;
        p->slot_bytes = p->a1 - p->a0;
    }
    for (int k = 0; k < nt; k++) {
        const struct tens *t = &ts[k];
        uint64_t a = t->off > r0 ? t->off : r0, e = t->end < r1 ? t->end : r1;
        kpart *q;
        if (a >= e) continue;
        if ((a - t->off) % t->rowb || (e - t->off) % t->rowb) {
            char d[64];
            kpk_extent_name(f, i, d, sizeof d);
            krun_err_set(B->err, KRUN_EINPUT, "%s: %s: a piece boundary falls inside a row of tensor %d (the file breaks FORMAT.md "
                         "§8.1's row rule)", kpk_path(f), d, t->role);
            return -1;
        }
        if (grow((void **)&r->part, &B->cap_q, r->nparts + 1, sizeof *r->part)) goto oom;
        q = &r->part[r->nparts++];
        q->piece = r->n;
        q->role = t->role;
        q->use = t->use;
        q->row0 = (a - t->off) / t->rowb;
        q->row1 = (e - t->off) / t->rowb;
        if (!r->tnparts[(size_t)s * K3T_COUNT + t->role]) r->tpart0[(size_t)s * K3T_COUNT + t->role] = r->nparts - 1;
        r->tnparts[(size_t)s * K3T_COUNT + t->role]++;
    }
    p->nparts = r->nparts - p->part0;
    if (p->slot_bytes > r->slot_bytes) r->slot_bytes = p->slot_bytes;
    r->n++;
    return 0;
oom:
    krun_err_set(B->err, KRUN_ENOMEM, "out of memory cutting the streamed extents into pieces");
    return -1;
}

static int by_offset(const void *a, const void *b)
{
    const struct tens *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Codec 0: runs of whole tensors, row blocks of a large tensor used once. */
static int cut_plain(struct build *B, int s, uint32_t i, uint64_t ra, uint64_t rb, const struct tens *ts, int nt, uint64_t P)
{
    uint64_t cur = ra;
    int has = 0;
    for (int k = 0; k < nt; k++) {
        const struct tens *t = &ts[k];
        if (t->end - t->off > P && t->use == K3U_ONCE) {
            uint64_t rows = (t->end - t->off) / t->rowb, per = P / t->rowb ? P / t->rowb : 1;
            if (has && emit(B, s, i, cur, t->off, 0, 0, ts, nt, 0)) return -1;
            if (has) cur = t->off;
            for (uint64_t r0 = 0; r0 < rows; r0 += per) {
                uint64_t end = t->off + (r0 + per < rows ? r0 + per : rows) * t->rowb;
                if (emit(B, s, i, cur, end, 0, 0, ts, nt, 0)) return -1;
                cur = end;
            }
            has = 0;
        } else {
            if (has && t->end - cur > P) {
                if (emit(B, s, i, cur, t->off, 0, 0, ts, nt, 0)) return -1;
                cur = t->off;
            }
            has = 1;
        }
    }
    if (cur < rb && emit(B, s, i, cur, rb, 0, 0, ts, nt, 0)) return -1;
    B->r->piece[B->r->n - 1].last = 1;
    return 0;
}

/* Codec 2: runs of whole blocks; never a boundary inside a tensor that is not used once. */
static int cut_blocks(struct build *B, int s, uint32_t i, uint64_t ra, uint64_t rb, const struct tens *ts, int nt, uint64_t P,
                      uint64_t stage)
{
    const kpk_file *f = B->m->file;
    const kpk_block *b = kpk_extent_blocks(f, i);
    uint32_t g, e, end;
    blocks_over(f, i, ra, rb, &g, &end);
    while (g < end) {
        e = g + 1;
        while (e < end) {
            uint64_t at = b[e].raw_off;
            int inside = 0;
            for (int k = 0; k < nt && !inside; k++) inside = ts[k].use != K3U_ONCE && ts[k].off < at && at < ts[k].end;
            if (!inside && b[e].raw_off + b[e].raw_len - b[g].raw_off > P) break;
            e++;
        }
        if (emit(B, s, i, b[g].raw_off, b[e - 1].raw_off + b[e - 1].raw_len, g, e, ts, nt, stage)) return -1;
        g = e;
    }
    if (B->r->n) B->r->piece[B->r->n - 1].last = 1;
    return 0;
}

int kring_head_streamable(const k3_model *m)
{
    const kt_loc *e = &m->globals[K3T_EMBED], *lm = &m->globals[K3T_LM_HEAD];
    if (e->offset + e->nbytes > lm->offset) return 0;
    for (int r = K3T_FINAL_NORM; r <= K3T_OUT_RES_PROJ; r++)
        if (m->globals[r].nbytes && m->globals[r].offset < lm->offset + lm->nbytes) return 0;
    return 1;
}

int kring_slot(const kring *r, int L) { return L == K3_GLOBALS ? r->n_slots - 1 : L; }

int kring_build(kring *r, const k3_model *m, uint64_t piece_bytes, int pin, int head, uint64_t stage_bytes, krun_err *err)
{
    const int NL = m->cfg.n_layers;
    struct build B = {r, m, 0, 0, err};
    memset(r, 0, sizeof *r);
    r->piece_bytes = piece_bytes ? piece_bytes : 1;
    r->n_slots = NL + 1;
    r->slot_piece0 = calloc((size_t)r->n_slots, sizeof *r->slot_piece0);
    r->slot_npieces = calloc((size_t)r->n_slots, sizeof *r->slot_npieces);
    r->tpart0 = calloc((size_t)r->n_slots * K3T_COUNT, sizeof *r->tpart0);
    r->tnparts = calloc((size_t)r->n_slots * K3T_COUNT, sizeof *r->tnparts);
    if (!r->slot_piece0 || !r->slot_npieces || !r->tpart0 || !r->tnparts) {
        krun_err_set(err, KRUN_ENOMEM, "out of memory cutting the streamed extents into pieces");
        kring_free(r);
        return -1;
    }
    for (int s = pin < 0 ? 0 : pin; s <= NL; s++) {
        const int L = s == NL ? K3_GLOBALS : s;
        struct tens ts[K3T_COUNT];
        k3_use_step order[K3T_COUNT];
        int nt = 0, no = k3_use_order(m, L, order);
        uint32_t i = s == NL ? m->globals_extent : m->trunk_extent[s];
        const kpk_extent *x = kpk_extent_at(m->file, i);
        uint64_t ra = 0, rb = x->raw_len;
        if (s == NL && (!head || !k3_here(m, K3_GLOBALS))) break;
        if (!k3_here(m, L)) { r->slot_piece0[s] = r->n; continue; }     /* another rank's layer: nothing streams here */
        for (int k = 0; k < no; k++) {
            const kt_loc *l = L == K3_GLOBALS ? &m->globals[order[k].role] : &m->trunk[(size_t)s * K3T_COUNT + order[k].role];
            struct tens *t = &ts[nt++];
            t->role = order[k].role;
            t->use = order[k].use;
            t->off = l->offset;
            t->end = l->offset + l->nbytes;
            t->rowb = l->shape[0] ? l->nbytes / l->shape[0] : l->nbytes;
            if (!t->rowb) t->rowb = 1;
        }
        if (L == K3_GLOBALS) {
            /* lm_head streams only when it lies between the embedding (never
             * held) and the small vectors (held) */
            const kt_loc *lm = &m->globals[K3T_LM_HEAD];
            if (!kring_head_streamable(m)) {
                krun_err_set(err, KRUN_EINPUT, "%s: lm_head does not follow the embedding in the globals extent, so it cannot be "
                             "streamed; give a budget that holds it", kpk_path(m->file));
                kring_free(r);
                return -1;
            }
            ra = lm->offset;
            rb = lm->offset + lm->nbytes;
        } else {
            /* every tensor of the extent; those the forward pass never names are parts nobody uses */
            for (int role = K3T_INPUT_LN; role < K3T_EXP_W1_PACKED; role++) {
                const kt_loc *l = &m->trunk[(size_t)s * K3T_COUNT + role];
                int seen = 0;
                if (!l->nbytes) continue;
                for (int k = 0; k < nt; k++) seen |= ts[k].role == role;
                if (seen) continue;
                ts[nt].role = (uint8_t)role;
                ts[nt].use = K3U_NONE;
                ts[nt].off = l->offset;
                ts[nt].end = l->offset + l->nbytes;
                ts[nt].rowb = l->shape[0] ? l->nbytes / l->shape[0] : 1;
                nt++;
            }
        }
        qsort(ts, (size_t)nt, sizeof *ts, by_offset);
        r->slot_piece0[s] = r->n;
        if (rb > ra) {
            int rc = x->codec == KPK_CODEC_BLOCKS ? cut_blocks(&B, s, i, ra, rb, ts, nt, r->piece_bytes, stage_bytes)
                                                  : cut_plain(&B, s, i, ra, rb, ts, nt, r->piece_bytes);
            if (rc) { kring_free(r); return -1; }
            r->piece[r->slot_piece0[s]].first = 1;
        }
        r->slot_npieces[s] = r->n - r->slot_piece0[s];
        for (uint32_t q = r->slot_piece0[s]; q < r->n; q++) {
            if (s == NL) r->head_bytes += r->piece[q].read_bytes;
            else r->trunk_bytes += r->piece[q].read_bytes;
        }
    }
    r->min_slots = 2;
    for (int s = 0; s < r->n_slots; s++) {
        int k = kring_slot_min_slots(r, m, s);
        if (k > r->min_slots) r->min_slots = k;
    }
    return 0;
}

void kring_free(kring *r)
{
    free(r->piece);
    free(r->part);
    free(r->slot_piece0);
    free(r->slot_npieces);
    free(r->tpart0);
    free(r->tnparts);
    memset(r, 0, sizeof *r);
}

/* ---- how many slots ----------------------------------------------------------------- */

struct sim {
    const kring *r;
    uint32_t p0, n;            /* the slot's pieces */
    uint32_t *pending;         /* [n]: parts not used yet */
    int64_t consumed;          /* the last piece read and handed out */
    uint32_t held;             /* consumed pieces with parts pending */
    int k;
};

/* Pieces [pa, pb] (local) are needed at once: everything before them that is
 * still held, plus them, must be in slots. */
static void sim_need(struct sim *S, uint32_t pa, uint32_t pb)
{
    uint32_t in_range = 0;
    int need;
    while (S->consumed < (int64_t)pb) {
        S->consumed++;
        if (S->pending[S->consumed]) S->held++;
    }
    for (uint32_t q = pa; q <= pb; q++) in_range += S->pending[q] > 0;
    need = (int)(S->held - in_range + (pb - pa + 1));
    if (need > S->k) S->k = need;
}

static void sim_use(struct sim *S, uint32_t q)
{
    if (S->pending[q] && --S->pending[q] == 0 && (int64_t)q <= S->consumed) S->held--;
}

int kring_slot_min_slots(const kring *r, const k3_model *m, int s)
{
    struct sim S;
    k3_use_step order[K3T_COUNT];
    int no, L = s == r->n_slots - 1 ? K3_GLOBALS : s;
    if (!r->slot_npieces[s]) return 0;
    memset(&S, 0, sizeof S);
    S.r = r;
    S.p0 = r->slot_piece0[s];
    S.n = r->slot_npieces[s];
    S.consumed = -1;
    S.k = 1;
    S.pending = calloc(S.n, sizeof *S.pending);
    if (!S.pending) return 1 << 30;
    for (uint32_t q = 0; q < S.n; q++) {
        const kpiece *p = &r->piece[S.p0 + q];
        for (uint32_t k = 0; k < p->nparts; k++) S.pending[q] += r->part[p->part0 + k].use != K3U_NONE;
    }
    no = k3_use_order(m, L, order);
    for (int k = 0; k < no; k++) {
        size_t t = (size_t)s * K3T_COUNT + order[k].role;
        uint32_t a = r->tpart0[t], n = r->tnparts[t];
        if (!n) continue;
        if (order[k].use == K3U_ONCE) {
            for (uint32_t j = 0; j < n; j++) {
                uint32_t q = r->part[a + j].piece - S.p0;
                sim_need(&S, q, q);
                sim_use(&S, q);
            }
        } else {
            sim_need(&S, r->part[a].piece - S.p0, r->part[a + n - 1].piece - S.p0);
            if (order[k].use == K3U_VEC)
                for (uint32_t j = 0; j < n; j++) sim_use(&S, r->part[a + j].piece - S.p0);
        }
    }
    /* the end of the layer: the rest is read (and hashed), held parts are released */
    sim_need(&S, S.n - 1, S.n - 1);
    free(S.pending);
    return S.k;
}
