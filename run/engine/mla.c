/* Gated MLA with NoPE, spec §4.6, attending from the compressed latent cache
 * (spec §5): the key side of kv_b_proj is absorbed into the query and the
 * value side applied after the weighted sum, so the cache holds only the
 * normalised kv latent and the raw shared rope key of each position. */
#include "layers.h"

#include "ablate_variants.h"
#include "ops.h"
#include "run/kernels/kernels_seq.h"
#include "run/util/ablate.h"

#include <math.h>
#include <string.h>

/* Attention of one position t of a segment against the n cached positions
 * 0..n-1 of its latent cache, every head at once: the cache is read once
 * per pass for all heads (scores, then weighted sums), not once per head.
 * Each score and each weighted sum is computed exactly as for one head
 * alone (docs/NUMERICS.md §4): the passes only change the loop nest. */
struct mla_pos {
    const k3_run *r;
    int L;
    const k3_mla_scratch *s;
    const float *cache;    /* the segment's latent cache, rows of Rkv + dr */
    size_t t;              /* the position's row in the block */
    size_t n;              /* causal: cached positions 0..n-1 */
    size_t items;          /* work items of the score pass (position ranges) */
    size_t col_items;      /* work items of the weighted sums (latent column ranges) */
    float scale;
};

/* 1. the query of heads [h0, h1) in latent space: q~ = W_kvb^K,h^T q^N, and
 *    its rope part gathered, so that all heads form one matrix each. */
static void absorb(void *arg, size_t h0, size_t h1)
{
    const struct mla_pos *j = arg;
    const k3_config *c = &j->r->model->cfg;
    const size_t Rkv = (size_t)c->kv_lora, dr = (size_t)c->qk_rope, dn = (size_t)c->qk_nope, dv = (size_t)c->v_head;
    const float *q = j->s->qfull + j->t * (size_t)c->mla_heads * (dn + dr);
    for (size_t h = h0; h < h1; h++) {
        const size_t kr0 = h * (dn + dv);         /* this head's rows in kv_b_proj: dn key rows, then dv value rows */
        wmatvec_t(&j->r->w, j->L, K3T_MLA_KVB, kr0, kr0 + dn, q + h * (dn + dr), j->s->qt + h * Rkv);
        memcpy(j->s->qr + h * dr, q + h * (dn + dr) + dn, dr * sizeof *j->s->qr);
    }
}

/* 2. scores of every head for the cached positions of items [i0, i1): each
 *    block of positions is one product with the heads' queries (the cache
 *    rows are read once for all heads), a = kdot(q~, c_s) and
 *    b = kdot(q^R, k^R_s) as a product computes them, then
 *    score = (a + b) * scale into each head's row. */
static void scores(void *arg, size_t i0, size_t i1)
{
    const struct mla_pos *j = arg;
    const k3_config *c = &j->r->model->cfg;
    const k3_mla_scratch *s = j->s;
    const size_t Rkv = (size_t)c->kv_lora, dr = (size_t)c->qk_rope, H = (size_t)c->mla_heads, row = Rkv + dr;
    const kmat Q = {KD_F32, H, Rkv, s->qt, NULL}, R = {KD_F32, H, dr, s->qr, NULL};
    for (size_t it = i0; it < i1; it++) {
        float *a = s->part + it * 2 * K3_MLA_PB * H, *b = a + K3_MLA_PB * H;
        for (size_t p0 = it * j->n / j->items, p1 = (it + 1) * j->n / j->items, np; p0 < p1; p0 += np) {
            np = p1 - p0 < K3_MLA_PB ? p1 - p0 : K3_MLA_PB;
            kmatmul_rows(&Q, 0, H, j->cache + p0 * row, row, np, a, H);
            if (!ABLATED(MLA_DROP_ROPE)) kmatmul_rows(&R, 0, H, j->cache + p0 * row + Rkv, row, np, b, H); /* one rope key shared by all heads */
            else memset(b, 0, np * H * sizeof *b);
            for (size_t p = 0; p < np; p++)
                for (size_t h = 0; h < H; h++) s->sc[h * s->ctx + p0 + p] = (a[p * H + h] + b[p * H + h]) * j->scale;
        }
    }
}

/* 3. softmax of heads [h0, h1); their value latents start from zero */
static void normalise(void *arg, size_t h0, size_t h1)
{
    const struct mla_pos *j = arg;
    const size_t Rkv = (size_t)j->r->model->cfg.kv_lora;
    for (size_t h = h0; h < h1; h++) {
        op_softmax(j->s->sc + h * j->s->ctx, j->n);
        memset(j->s->olat + h * j->s->olat_ld, 0, Rkv * sizeof *j->s->olat);
    }
}

/* 4. the weighted sums of latents, every head, for the column ranges of
 *    items [i0, i1): one item per thread, so each thread reads the scores
 *    once and its columns of every cached row once */
static void values(void *arg, size_t i0, size_t i1)
{
    const struct mla_pos *j = arg;
    const k3_config *c = &j->r->model->cfg;
    const size_t Rkv = (size_t)c->kv_lora, row = Rkv + (size_t)c->qk_rope;
    /* item boundaries on multiples of 16 columns, so the vector paths have whole vectors */
    const size_t lo = i0 * Rkv / j->col_items / 16 * 16, hi = i1 == j->col_items ? Rkv : i1 * Rkv / j->col_items / 16 * 16;
    kseq_wsum(j->s->olat + lo, j->s->olat_ld, j->s->sc, j->s->ctx, (size_t)c->mla_heads, j->cache + lo, row, j->n, hi - lo);
}

/* 5. heads [h0, h1): o_h = W_kvb^V,h o_lat, then the output gate */
static void outputs(void *arg, size_t h0, size_t h1)
{
    const struct mla_pos *j = arg;
    const k3_config *c = &j->r->model->cfg;
    const k3_mla_scratch *s = j->s;
    const size_t Rkv = (size_t)c->kv_lora, dn = (size_t)c->qk_nope, dv = (size_t)c->v_head, H = (size_t)c->mla_heads;
    for (size_t h = h0; h < h1; h++) {
        const size_t kr0 = h * (dn + dv);
        float *oh = s->oh + h * dv;
        wmatmul_rows(&j->r->w, j->L, K3T_MLA_KVB, kr0 + dn, kr0 + dn + dv, s->olat + h * s->olat_ld, Rkv, 1, oh, dv);
        for (size_t q = 0; q < dv; q++) {
            float v = oh[q];
            if (s->gate) v = v * op_sigmoid(s->gate[j->t * H * dv + h * dv + q]);
            s->out[j->t * H * dv + h * dv + q] = v;
        }
    }
}

/* Below this many multiply-adds a pass runs on the calling thread: waking
 * the pool would cost more than it saves. */
#define MLA_PARALLEL_MIN ((size_t)1 << 16)

static void attend(k3_run *r, int L, const k3_seg *seg, size_t row0, size_t i)
{
    const k3_config *c = &r->model->cfg;
    const size_t Rkv = (size_t)c->kv_lora, dr = (size_t)c->qk_rope, dn = (size_t)c->qk_nope, dv = (size_t)c->v_head;
    const size_t H = (size_t)c->mla_heads, n = seg->st->pos + i + 1;
    const size_t per_head = dn * Rkv + dv * Rkv, per_pos = H * (Rkv + dr);
    struct mla_pos j = {r, L, &r->s.mla, seg->st->mla_cache[L], row0 + i, n, 0, 0,
                        (float)(1.0 / sqrt((double)(ABLATED(MLA_SCALE_NOPE) ? dn : dn + dr)))};
    kpool *heads_pool = H * per_head >= MLA_PARALLEL_MIN ? r->pool : NULL;
    kpool *cache_pool = n * per_pos >= MLA_PARALLEL_MIN ? r->pool : NULL;
    /* score items of at least 64 positions each */
    j.items = (n + 63) / 64 < K3_MLA_ITEMS ? (n + 63) / 64 : K3_MLA_ITEMS;
    kpool_for(heads_pool, H, absorb, &j);
    kpool_for(cache_pool, j.items, scores, &j);
    kpool_for(cache_pool, H, normalise, &j);
    j.col_items = (size_t)kpool_threads(cache_pool) < Rkv / 16 ? (size_t)kpool_threads(cache_pool) : Rkv / 16 ? Rkv / 16 : 1;
    kpool_for(cache_pool, j.col_items, values, &j);
    kpool_for(heads_pool, H, outputs, &j);
}

void mla_forward(k3_run *r, int L, const k3_block *b, const float *x, float *y)
{
    const k3_config *c = &r->model->cfg;
    const k3_vecs *w = k3_weights_vecs(&r->w, L);
    const k3_mla_scratch *s = &r->s.mla;
    const size_t T = b->T, E = (size_t)c->hidden, Rq = (size_t)c->q_lora, Rkv = (size_t)c->kv_lora;
    const size_t dr = (size_t)c->qk_rope, dn = (size_t)c->qk_nope, dv = (size_t)c->v_head, H = (size_t)c->mla_heads;
    const size_t row = Rkv + dr;
    const double lora_eps = ABLATED(MLA_LORA_EPS_CONFIG) ? c->rms_eps : K3_MLA_LORA_NORM_EPS;

    /* 1. queries through the LoRA path (its norm's eps: K3_MLA_LORA_NORM_EPS, not rms_norm_eps) */
    wmatmul(r->pool, &r->w, L, K3T_MLA_QA, x, E, T, s->cq, Rq);
    for (size_t t = 0; t < T; t++) op_rmsnorm(s->cq + t * Rq, s->cq + t * Rq, w->qa_ln, Rq, lora_eps);
    wmatmul(r->pool, &r->w, L, K3T_MLA_QB, s->cq, Rq, T, s->qfull, H * (dn + dr));
    /* 2. the latent [c | k^R]: normalise the kv_lora part only, keep k^R raw,
     *    append to each segment's cache */
    wmatmul(r->pool, &r->w, L, K3T_MLA_KVA, x, E, T, s->kv, row);
    for (size_t g = 0; g < b->nseg; g++)
        for (size_t i = 0; i < b->seg[g].n; i++) {
            const k3_state *st = b->seg[g].st;
            float *dst = st->mla_cache[L] + (st->pos + i) * row, *src = s->kv + (b->row0[g] + i) * row;
            if (ABLATED(MLA_NORM_ROPE)) { abl_mla_norm_rope(dst, src, w->kva_ln, Rkv, row, lora_eps); continue; }
            op_rmsnorm(dst, src, w->kva_ln, Rkv, lora_eps);
            memcpy(dst + Rkv, src + Rkv, dr * sizeof *dst);
        }
    /* 6. the output gate reads the normalised layer input x */
    if (s->gate && ABLATED(MLA_GATE_FROM_LATENT)) abl_mla_gate_from_latent(r->pool, &r->w, L, s->cq, Rq, E, T, s->gate, H * dv);
    else if (s->gate) wmatmul(r->pool, &r->w, L, K3T_MLA_G, x, E, T, s->gate, H * dv);
    /* 3-5. per segment, position by position: every head against the segment's cache */
    for (size_t g = 0; g < b->nseg; g++)
        for (size_t i = 0; i < b->seg[g].n; i++) attend(r, L, &b->seg[g], b->row0[g], i);
    wmatmul(r->pool, &r->w, L, K3T_MLA_O, s->out, H * dv, T, y, E);
}
