/* Stable LatentMoE (spec §4.7) and the dense layer-0 FFN (spec §4.8). */
#include "layers.h"

#include "ablate_variants.h"
#include "ops.h"
#include "remote.h"
#include "run/util/ablate.h"

#include <string.h>

void moe_route(const k3_config *c, const float *logits, const float *bias, float *scratch, int *idx, float *weight)
{
    const int Ne = c->n_experts, k = c->topk;
    float *s = scratch, *sel = scratch + Ne;
    double sum = 0;
    for (int e = 0; e < Ne; e++) s[e] = op_sigmoid(logits[e]);      /* independent scores, not a softmax */
    if (ABLATED(ROUTER_SOFTMAX)) { memcpy(s, logits, (size_t)Ne * sizeof *s); op_softmax(s, (size_t)Ne); }
    for (int e = 0; e < Ne; e++) sel[e] = s[e] + bias[e];            /* the bias only selects */
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < Ne; e++) {
            int taken = 0;
            for (int q = 0; q < j; q++) taken |= idx[q] == e;
            if (!taken && (best < 0 || sel[e] > sel[best])) best = e;  /* strict: ties go to the lower index */
        }
        idx[j] = best;
        weight[j] = ABLATED(ROUTER_BIAS_IN_WEIGHTS) ? sel[best] : s[best];
        sum += weight[j];
    }
    if (c->moe_renormalize && !ABLATED(NO_RENORMALIZE))
        for (int j = 0; j < k; j++) weight[j] = (float)(weight[j] / (sum + 1e-20));
    for (int j = 0; j < k; j++) weight[j] = weight[j] * (float)c->routed_scale;
}

/* An expert's matrix times the rows of the positions that chose it. */
static void expert_matmul(kpool *pool, const kmat *W, const float *X, size_t ldx, size_t n, float *Y, size_t ldy)
{
    if (ABLATED(MXFP4_NIBBLE_SWAP) || ABLATED(MXFP4_SCALE_BIAS_126)) { abl_expert_matmul(W, X, ldx, n, Y, ldy); return; }
    kmatmul(pool, W, X, ldx, n, Y, ldy);
}

void moe_expert_apply(k3_run *r, const k3_expert_w *W, float *xe, size_t n)
{
    const k3_config *c = &r->model->cfg;
    const k3_moe_scratch *s = &r->s.moe;
    const size_t Lt = (size_t)c->latent, I = (size_t)c->moe_inter;
    const float b1 = (float)c->situ_beta1, b2 = (float)c->situ_beta2;
    const kmat *g = ABLATED(EXPERT_W1_W3_SWAPPED) ? &W->w3 : &W->w1;
    const kmat *u = ABLATED(EXPERT_W1_W3_SWAPPED) ? &W->w1 : &W->w3;
    expert_matmul(r->pool, g, xe, Lt, n, s->a1, I);
    expert_matmul(r->pool, u, xe, Lt, n, s->a3, I);
    for (size_t i = 0; i < n * I; i++) s->a1[i] = op_situ(s->a1[i], s->a3[i], b1, b2);
    expert_matmul(r->pool, &W->w2, s->a1, I, n, xe, Lt);
}

/* Step 3 for the experts computed here, distinct[0..nd): each for every
 * position that chose it, as soon as its bytes are in, eb at a time (the
 * first eb already requested); every requested one is given back. */
static int experts_here(k3_run *r, int L, size_t T, size_t nd, size_t eb, krun_err *err)
{
    const k3_config *c = &r->model->cfg;
    const k3_moe_scratch *s = &r->s.moe;
    const size_t k = (size_t)c->topk, Lt = (size_t)c->latent;
    for (size_t b0 = 0; b0 < nd; b0 += eb) {
        size_t nb = nd - b0 < eb ? nd - b0 : eb;
        if (b0 && k3_weights_experts_request(&r->w, L, s->distinct + b0, nb, s->extent, err)) return -1;
        for (size_t q = 0; q < nb; q++) {
            const int e = s->distinct[b0 + q];
            if (k3_weights_expert_ready(&r->w, L, s->extent[q], &s->bound[q], err)) {
                k3_weights_experts_release(&r->w, L, s->distinct + b0, nb);
                return -1;
            }
            size_t n = 0;
            for (size_t i = 0; i < T * k; i++)
                if (s->idx[i] == e) { s->rows[n] = (int)i; memcpy(s->xe + n * Lt, s->zeta + (i / k) * Lt, Lt * sizeof *s->xe); n++; }
            moe_expert_apply(r, &s->bound[q], s->xe, n);
            for (size_t q2 = 0; q2 < n; q2++) memcpy(s->slots + (size_t)s->rows[q2] * Lt, s->xe + q2 * Lt, Lt * sizeof *s->xe);
        }
        k3_weights_experts_release(&r->w, L, s->distinct + b0, nb);
    }
    return 0;
}

int moe_forward(k3_run *r, int L, size_t T, const float *x, float *y, krun_err *err)
{
    const k3_config *c = &r->model->cfg;
    const k3_vecs *w = k3_weights_vecs(&r->w, L);
    const k3_moe_scratch *s = &r->s.moe;
    const size_t E = (size_t)c->hidden, Ne = (size_t)c->n_experts, k = (size_t)c->topk;
    const size_t Lt = (size_t)c->latent, Is = (size_t)k3_shared_inter(c);
    const float b1 = (float)c->situ_beta1, b2 = (float)c->situ_beta2;
    const size_t eb = k3_run_expert_batch(r);   /* fewer while the store lends its slots (a prefill block) */
    size_t nd = 0;

    /* 1. route on the full width */
    wmatmul(r->pool, &r->w, L, K3T_MOE_ROUTER, x, E, T, s->logits, Ne);
    for (size_t t = 0; t < T; t++) moe_route(c, s->logits + t * Ne, w->router_bias, s->route, s->idx + t * k, s->wts + t * k);
    /* the chosen experts, each once for the whole block, in id order: the
     * disks start on the first batch now, while the latent projection runs */
    memset(s->used, 0, Ne);
    for (size_t i = 0; i < T * k; i++) {
        s->used[s->idx[i]] = 1;
        r->routed[(size_t)L * Ne + (size_t)s->idx[i]]++;   /* the routing's histogram (krun --json "routing") */
    }
    for (size_t e = 0; e < Ne; e++) if (s->used[e]) s->distinct[nd++] = (int)e;
    /* those other ranks read from their own disks go there (run/cluster): nd keeps this rank's */
    if (k3_remote_experts_begin(r, L, s->distinct, &nd, T, err)) return -1;
    if (nd && k3_weights_experts_request(&r->w, L, s->distinct, nd < eb ? nd : eb, s->extent, err))
        return k3_remote_experts_end(r, L, T, 1, err);
    /* 2. into the latent space */
    wmatmul(r->pool, &r->w, L, K3T_MOE_DOWN, x, E, T, s->zeta, Lt);

    /* 3. each expert for every position that chose it, as soon as its bytes are in (the other
     * ranks', with their rows sent now, at the same time) */
    if (k3_remote_experts_rows(r, L, T, err)) {
        if (nd) k3_weights_experts_release(&r->w, L, s->distinct, nd < eb ? nd : eb);
        return k3_remote_experts_end(r, L, T, 1, err);
    }
    if (k3_remote_experts_end(r, L, T, experts_here(r, L, T, nd, eb, err) != 0, err)) return -1;
    /* 4. the weighted sum in top-k order, then ONE RMSNorm of the aggregate */
    for (size_t t = 0; t < T; t++) {
        float *a = s->agg + t * Lt;
        memset(a, 0, Lt * sizeof *a);
        for (size_t j = 0; j < k; j++) {
            float *e = s->slots + (t * k + j) * Lt;
            if (ABLATED(MOE_NORM_PER_EXPERT)) op_rmsnorm(e, e, w->moe_norm, Lt, c->rms_eps);
            for (size_t i = 0; i < Lt; i++) a[i] = a[i] + s->wts[t * k + j] * e[i];
        }
        if (c->latent_norm && !ABLATED(MOE_NORM_PER_EXPERT)) op_rmsnorm(a, a, w->moe_norm, Lt, c->rms_eps);
    }
    /* 5. back to the full width */
    wmatmul(r->pool, &r->w, L, K3T_MOE_UP, s->agg, Lt, T, y, E);

    /* 6. the fused shared expert on the ORIGINAL x, added unweighted */
    wmatmul(r->pool, &r->w, L, K3T_SH_GATE, x, E, T, s->sg, Is);
    wmatmul(r->pool, &r->w, L, K3T_SH_UP, x, E, T, s->su, Is);
    for (size_t i = 0; i < T * Is; i++) s->sg[i] = op_situ(s->sg[i], s->su[i], b1, b2);
    wmatmul(r->pool, &r->w, L, K3T_SH_DOWN, s->sg, Is, T, s->sh, E);
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < E; i++)
            y[t * E + i] = y[t * E + i] + (ABLATED(SHARED_ON_LATENT_WEIGHTED) ? s->wts[t * k] * s->sh[t * E + i] : s->sh[t * E + i]);
    return 0;
}

void dense_ffn_forward(k3_run *r, int L, size_t T, const float *x, float *y)
{
    const k3_config *c = &r->model->cfg;
    const k3_dense_scratch *s = &r->s.dense;
    const size_t E = (size_t)c->hidden, Id = (size_t)c->dense_inter;
    const float b1 = (float)c->situ_beta1, b2 = (float)c->situ_beta2;
    wmatmul(r->pool, &r->w, L, K3T_FFN_GATE, x, E, T, s->g, Id);
    wmatmul(r->pool, &r->w, L, K3T_FFN_UP, x, E, T, s->u, Id);
    for (size_t i = 0; i < T * Id; i++) s->g[i] = op_situ(s->g[i], s->u[i], b1, b2);
    wmatmul(r->pool, &r->w, L, K3T_FFN_DOWN, s->g, Id, T, y, E);
}
