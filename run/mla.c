/* Gated MLA with NoPE, spec §4.6, attending from the compressed latent cache
 * (spec §5): the key side of kv_b_proj is absorbed into the query and the
 * value side applied after the weighted sum, so the cache holds only the
 * normalised kv latent and the raw shared rope key of each position. */
#include "layers.h"

#include "ablate.h"
#include "ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct mla_job {
    const k3_config *c;
    const k3_layer_w *w;
    size_t T, pos0;
    const float *qfull;    /* [T][H*(dn+dr)] */
    const float *gate;     /* [T][H*dv] or NULL */
    const float *cache;    /* [ctx][Rkv+dr] */
    float *out;            /* [T][H*dv] */
    float *scratch;        /* per head: Rkv (q~) + Rkv (o_lat) + dv + ctx (scores) */
    size_t scratch_per_head;
};

static void heads(void *arg, size_t h0, size_t h1)
{
    struct mla_job *j = arg;
    const k3_config *c = j->c;
    const size_t Rkv = (size_t)c->kv_lora, dr = (size_t)c->qk_rope, dn = (size_t)c->qk_nope, dv = (size_t)c->v_head;
    const size_t H = (size_t)c->mla_heads, row = Rkv + dr, qrow = H * (dn + dr);
    const float scale = (float)(1.0 / sqrt((double)(ABLATED(MLA_SCALE_NOPE) ? dn : dn + dr)));
    for (size_t h = h0; h < h1; h++) {
        float *qt = j->scratch + h * j->scratch_per_head, *olat = qt + Rkv, *oh = olat + Rkv, *sc = oh + dv;
        const size_t kr0 = h * (dn + dv);         /* this head's rows in kv_b_proj: dn key rows, then dv value rows */
        for (size_t t = 0; t < j->T; t++) {
            const float *qn = j->qfull + t * qrow + h * (dn + dr), *qr = qn + dn;
            const size_t n = j->pos0 + t + 1;     /* causal: positions 0..pos0+t */
            /* q~ = W_kvb^K,h^T q^N: the query in latent space */
            kmatvec_t(&j->w->kvb, kr0, kr0 + dn, qn, qt);
            for (size_t s = 0; s < n; s++) {
                const float *cs = j->cache + s * row;
                float a = kdot_f32(qt, cs, Rkv);
                float b = ABLATED(MLA_DROP_ROPE) ? 0.0f : kdot_f32(qr, cs + Rkv, dr); /* one rope key shared by all heads */
                sc[s] = (a + b) * scale;
            }
            op_softmax(sc, n);
            for (size_t i = 0; i < Rkv; i++) olat[i] = 0.0f;
            for (size_t s = 0; s < n; s++) {
                const float *cs = j->cache + s * row;
                const float p = sc[s];
                for (size_t i = 0; i < Rkv; i++) olat[i] = olat[i] + p * cs[i];
            }
            /* o_h = W_kvb^V,h o_lat */
            for (size_t i = 0; i < dv; i++) oh[i] = kmat_row_dot(&j->w->kvb, kr0 + dn + i, olat);
            for (size_t i = 0; i < dv; i++) {
                float v = oh[i];
                if (j->gate) v = v * op_sigmoid(j->gate[t * H * dv + h * dv + i]);
                j->out[t * H * dv + h * dv + i] = v;
            }
        }
    }
}

int mla_forward(const k3_config *c, const k3_layer_w *w, kpool *pool, const float *x, size_t T, float *y,
                float *cache, size_t pos0)
{
    const size_t E = (size_t)c->hidden, Rq = (size_t)c->q_lora, Rkv = (size_t)c->kv_lora, dr = (size_t)c->qk_rope;
    const size_t dn = (size_t)c->qk_nope, dv = (size_t)c->v_head, H = (size_t)c->mla_heads, row = Rkv + dr;
    float *cq = NULL, *qfull = NULL, *kv = NULL, *gate = NULL, *out = NULL, *scratch = NULL;
    struct mla_job job;
    size_t per_head = 2 * Rkv + dv + pos0 + T;
    int rc = -1;

    cq = malloc(T * Rq * sizeof *cq);
    qfull = malloc(T * H * (dn + dr) * sizeof *qfull);
    kv = malloc(T * row * sizeof *kv);
    out = malloc(T * H * dv * sizeof *out);
    scratch = malloc(H * per_head * sizeof *scratch);
    if (c->mla_output_gate) gate = malloc(T * H * dv * sizeof *gate);
    if (!cq || !qfull || !kv || !out || !scratch || (c->mla_output_gate && !gate)) goto out;

    /* 1. queries through the LoRA path */
    kmatmul(pool, &w->qa, x, E, T, cq, Rq);
    for (size_t t = 0; t < T; t++) op_rmsnorm(cq + t * Rq, cq + t * Rq, w->qa_ln, Rq, c->rms_eps);
    kmatmul(pool, &w->qb, cq, Rq, T, qfull, H * (dn + dr));
    /* 2. the latent [c | k^R]: normalise the kv_lora part only, keep k^R raw, append to the cache */
    kmatmul(pool, &w->kva, x, E, T, kv, row);
    for (size_t t = 0; t < T; t++) {
        float *dst = cache + (pos0 + t) * row, *src = kv + t * row;
        if (ABLATED(MLA_NORM_ROPE)) {
            double ss = 0;
            float inv;
            for (size_t i = 0; i < row; i++) ss += (double)src[i] * src[i];
            inv = (float)(1.0 / sqrt(ss / (double)row + c->rms_eps));
            for (size_t i = 0; i < Rkv; i++) dst[i] = (src[i] * inv) * w->kva_ln[i];
            for (size_t i = Rkv; i < row; i++) dst[i] = src[i] * inv;
            continue;
        }
        op_rmsnorm(dst, src, w->kva_ln, Rkv, c->rms_eps);
        memcpy(dst + Rkv, src + Rkv, dr * sizeof *dst);
    }
    /* 6. the output gate reads the normalised layer input x */
    if (gate) {
        if (ABLATED(MLA_GATE_FROM_LATENT)) {
            /* wrong input: the gate projection of the residual-free latent query */
            float *xx = calloc(T * E, sizeof *xx);
            if (!xx) goto out;
            for (size_t t = 0; t < T; t++) memcpy(xx + t * E, cq + t * Rq, (Rq < E ? Rq : E) * sizeof *xx);
            kmatmul(pool, &w->mg, xx, E, T, gate, H * dv);
            free(xx);
        } else {
            kmatmul(pool, &w->mg, x, E, T, gate, H * dv);
        }
    }
    /* 3-5. per head, per position: scores against the cache, softmax, values */
    job.c = c; job.w = w; job.T = T; job.pos0 = pos0; job.qfull = qfull; job.gate = gate;
    job.cache = cache; job.out = out; job.scratch = scratch; job.scratch_per_head = per_head;
    kpool_for(pool, H, heads, &job);
    kmatmul(pool, &w->mo, out, H * dv, T, y, E);
    rc = 0;
out:
    free(cq); free(qfull); free(kv); free(gate); free(out); free(scratch);
    return rc;
}
