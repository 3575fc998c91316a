/* Gated MLA with NoPE, spec §4.6, attending from the compressed latent cache
 * (spec §5): the key side of kv_b_proj is absorbed into the query and the
 * value side applied after the weighted sum, so the cache holds only the
 * normalised kv latent and the raw shared rope key of each position. */
#include "layers.h"

#include "ablate.h"
#include "ops.h"

#include <math.h>
#include <string.h>

struct mla_job {
    const k3_run *r;
    int L;
    const k3_seg *seg;
    size_t row0;           /* the segment's first row in the block */
    const k3_mla_scratch *s;
};

/* Heads [h0, h1) of every position of one segment. */
static void heads(void *arg, size_t h0, size_t h1)
{
    const struct mla_job *j = arg;
    const k3_config *c = &j->r->model->cfg;
    const k3_mla_scratch *s = j->s;
    const size_t Rkv = (size_t)c->kv_lora, dr = (size_t)c->qk_rope, dn = (size_t)c->qk_nope, dv = (size_t)c->v_head;
    const size_t H = (size_t)c->mla_heads, row = Rkv + dr, qrow = H * (dn + dr);
    const float *cache = j->seg->st->mla_cache[j->L];
    const size_t pos0 = j->seg->st->pos;
    const float scale = (float)(1.0 / sqrt((double)(ABLATED(MLA_SCALE_NOPE) ? dn : dn + dr)));
    for (size_t h = h0; h < h1; h++) {
        float *qt = s->heads + h * s->per_head, *olat = qt + Rkv, *oh = olat + Rkv, *sc = oh + dv;
        const size_t kr0 = h * (dn + dv);         /* this head's rows in kv_b_proj: dn key rows, then dv value rows */
        for (size_t i = 0; i < j->seg->n; i++) {
            const size_t t = j->row0 + i;          /* row in the block */
            const float *qn = s->qfull + t * qrow + h * (dn + dr), *qr = qn + dn;
            const size_t n = pos0 + i + 1;         /* causal: positions 0..pos0+i */
            /* q~ = W_kvb^K,h^T q^N: the query in latent space */
            wmatvec_t(&j->r->w, j->L, K3T_MLA_KVB, kr0, kr0 + dn, qn, qt);
            for (size_t p = 0; p < n; p++) {
                const float *cs = cache + p * row;
                float a = kdot_f32(qt, cs, Rkv);
                float b = ABLATED(MLA_DROP_ROPE) ? 0.0f : kdot_f32(qr, cs + Rkv, dr); /* one rope key shared by all heads */
                sc[p] = (a + b) * scale;
            }
            op_softmax(sc, n);
            for (size_t q = 0; q < Rkv; q++) olat[q] = 0.0f;
            for (size_t p = 0; p < n; p++) {
                const float *cs = cache + p * row;
                const float w = sc[p];
                for (size_t q = 0; q < Rkv; q++) olat[q] = olat[q] + w * cs[q];
            }
            /* o_h = W_kvb^V,h o_lat */
            wmatmul_rows(&j->r->w, j->L, K3T_MLA_KVB, kr0 + dn, kr0 + dn + dv, olat, Rkv, 1, oh, dv);
            for (size_t q = 0; q < dv; q++) {
                float v = oh[q];
                if (s->gate) v = v * op_sigmoid(s->gate[t * H * dv + h * dv + q]);
                s->out[t * H * dv + h * dv + q] = v;
            }
        }
    }
}

void mla_forward(k3_run *r, int L, const k3_block *b, const float *x, float *y)
{
    const k3_config *c = &r->model->cfg;
    const k3_vecs *w = k3_weights_vecs(&r->w, L);
    const k3_mla_scratch *s = &r->s.mla;
    const size_t T = b->T, E = (size_t)c->hidden, Rq = (size_t)c->q_lora, Rkv = (size_t)c->kv_lora;
    const size_t dr = (size_t)c->qk_rope, dn = (size_t)c->qk_nope, dv = (size_t)c->v_head, H = (size_t)c->mla_heads;
    const size_t row = Rkv + dr;

    /* 1. queries through the LoRA path */
    wmatmul(r->pool, &r->w, L, K3T_MLA_QA, x, E, T, s->cq, Rq);
    for (size_t t = 0; t < T; t++) op_rmsnorm(s->cq + t * Rq, s->cq + t * Rq, w->qa_ln, Rq, c->rms_eps);
    wmatmul(r->pool, &r->w, L, K3T_MLA_QB, s->cq, Rq, T, s->qfull, H * (dn + dr));
    /* 2. the latent [c | k^R]: normalise the kv_lora part only, keep k^R raw,
     *    append to each segment's cache */
    wmatmul(r->pool, &r->w, L, K3T_MLA_KVA, x, E, T, s->kv, row);
    for (size_t g = 0; g < b->nseg; g++)
        for (size_t i = 0; i < b->seg[g].n; i++) {
            const k3_state *st = b->seg[g].st;
            float *dst = st->mla_cache[L] + (st->pos + i) * row, *src = s->kv + (b->row0[g] + i) * row;
            if (ABLATED(MLA_NORM_ROPE)) { abl_mla_norm_rope(dst, src, w->kva_ln, Rkv, row, c->rms_eps); continue; }
            op_rmsnorm(dst, src, w->kva_ln, Rkv, c->rms_eps);
            memcpy(dst + Rkv, src + Rkv, dr * sizeof *dst);
        }
    /* 6. the output gate reads the normalised layer input x */
    if (s->gate && ABLATED(MLA_GATE_FROM_LATENT)) abl_mla_gate_from_latent(r->pool, &r->w, L, s->cq, Rq, E, T, s->gate, H * dv);
    else if (s->gate) wmatmul(r->pool, &r->w, L, K3T_MLA_G, x, E, T, s->gate, H * dv);
    /* 3-5. per segment, heads in parallel: scores against the segment's cache, softmax, values */
    for (size_t g = 0; g < b->nseg; g++) {
        struct mla_job job = {r, L, &b->seg[g], b->row0[g], s};
        kpool_for(r->pool, H, heads, &job);
    }
    wmatmul(r->pool, &r->w, L, K3T_MLA_O, s->out, H * dv, T, y, E);
}
