/* Stable LatentMoE (spec §4.7) and the dense layer-0 FFN (spec §4.8). */
#include "layers.h"

#include "ablate.h"
#include "ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void moe_route(const k3_config *c, const float *logits, const float *bias, int *idx, float *weight)
{
    const int Ne = c->n_experts, k = c->topk;
    float *s = malloc((size_t)Ne * 2 * sizeof *s), *sel;
    double sum = 0;
    if (!s) { /* cannot happen in practice: Ne floats; route to the first experts rather than crash */
        for (int j = 0; j < k; j++) { idx[j] = j; weight[j] = 1.0f / (float)k; }
        return;
    }
    sel = s + Ne;
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
    free(s);
}

/* The MXFP4 ablations decode nibbles wrongly on purpose; only the test build has them. */
static void expert_matmul(kpool *pool, const kmat *W, const float *X, size_t ldx, size_t n, float *Y, size_t ldy)
{
    if (ABLATED(MXFP4_NIBBLE_SWAP) || ABLATED(MXFP4_SCALE_BIAS_126)) {
        const uint8_t *pk = W->data;
        for (size_t t = 0; t < n; t++)
            for (size_t r = 0; r < W->rows; r++) {
                float acc = 0.0f;
                for (size_t i = 0; i < W->cols; i++) {
                    uint8_t b = pk[r * (W->cols / 2) + i / 2];
                    int nib = ((i & 1) ^ ABLATED(MXFP4_NIBBLE_SWAP)) ? b >> 4 : b & 15;
                    int sb = W->scales[r * (W->cols / 32) + i / 32];
                    float sc = sb == 255 ? 0.0f : ldexpf(1.0f, sb - (ABLATED(MXFP4_SCALE_BIAS_126) ? 126 : 127));
                    acc += KE2M1[nib] * sc * X[t * ldx + i];
                }
                Y[t * ldy + r] = acc;
            }
        return;
    }
    kmatmul(pool, W, X, ldx, n, Y, ldy);
}

int moe_forward(const k3_config *c, const k3_layer_w *w, kpool *pool, const k3_expert_source *src, const float *x,
                size_t T, float *y, int *routed, char *err, size_t errlen)
{
    const size_t E = (size_t)c->hidden, Ne = (size_t)c->n_experts, k = (size_t)c->topk;
    const size_t Lt = (size_t)c->latent, I = (size_t)c->moe_inter, Is = (size_t)k3_shared_inter(c);
    const float b1 = (float)c->situ_beta1, b2 = (float)c->situ_beta2;
    float *logits = NULL, *wts = NULL, *zeta = NULL, *slots = NULL, *agg = NULL, *xe = NULL, *a1 = NULL, *a3 = NULL;
    float *sg = NULL, *su = NULL, *sh = NULL;
    int *idx = NULL, *distinct = NULL, *rows = NULL;
    k3_expert_w *bound = NULL;
    size_t nd = 0;
    int rc = -1;

    logits = malloc(T * Ne * sizeof *logits);
    idx = malloc(T * k * sizeof *idx);
    wts = malloc(T * k * sizeof *wts);
    zeta = malloc(T * Lt * sizeof *zeta);
    slots = malloc(T * k * Lt * sizeof *slots);
    agg = malloc(T * Lt * sizeof *agg);
    xe = malloc(T * Lt * sizeof *xe);
    a1 = malloc(T * I * sizeof *a1);
    a3 = malloc(T * I * sizeof *a3);
    distinct = malloc(Ne * sizeof *distinct);
    rows = malloc(T * k * sizeof *rows);
    bound = malloc((src->batch_max ? src->batch_max : 1) * sizeof *bound);
    if (!logits || !idx || !wts || !zeta || !slots || !agg || !xe || !a1 || !a3 || !distinct || !rows || !bound) {
        snprintf(err, errlen, "out of memory in the MoE");
        goto out;
    }

    /* 1. route on the full width */
    kmatmul(pool, &w->router, x, E, T, logits, Ne);
    for (size_t t = 0; t < T; t++) moe_route(c, logits + t * Ne, w->router_bias, idx + t * k, wts + t * k);
    if (routed) memcpy(routed, idx, T * k * sizeof *idx);
    /* 2. into the latent space */
    kmatmul(pool, &w->moe_down, x, E, T, zeta, Lt);

    /* 3. each chosen expert once, for every position that chose it; experts in id order */
    {
        uint8_t *used = calloc(Ne, 1);
        if (!used) { snprintf(err, errlen, "out of memory in the MoE"); goto out; }
        for (size_t i = 0; i < T * k; i++) used[idx[i]] = 1;
        for (size_t e = 0; e < Ne; e++) if (used[e]) distinct[nd++] = (int)e;
        free(used);
    }
    for (size_t b0 = 0; b0 < nd; b0 += src->batch_max) {
        size_t nb = nd - b0 < src->batch_max ? nd - b0 : src->batch_max;
        if (src->fetch(src->ctx, w->layer, distinct + b0, nb, bound, err, errlen)) goto out;
        for (size_t q = 0; q < nb; q++) {
            const int e = distinct[b0 + q];
            const kmat *g = ABLATED(EXPERT_W1_W3_SWAPPED) ? &bound[q].w3 : &bound[q].w1;
            const kmat *u = ABLATED(EXPERT_W1_W3_SWAPPED) ? &bound[q].w1 : &bound[q].w3;
            size_t n = 0;
            for (size_t i = 0; i < T * k; i++)
                if (idx[i] == e) { rows[n] = (int)i; memcpy(xe + n * Lt, zeta + (i / k) * Lt, Lt * sizeof *xe); n++; }
            expert_matmul(pool, g, xe, Lt, n, a1, I);
            expert_matmul(pool, u, xe, Lt, n, a3, I);
            for (size_t i = 0; i < n * I; i++) a1[i] = op_situ(a1[i], a3[i], b1, b2);
            expert_matmul(pool, &bound[q].w2, a1, I, n, xe, Lt);
            for (size_t r = 0; r < n; r++) memcpy(slots + (size_t)rows[r] * Lt, xe + r * Lt, Lt * sizeof *xe);
        }
        src->release(src->ctx, w->layer, distinct + b0, nb);
    }
    /* the weighted sum in top-k order, then ONE RMSNorm of the aggregate */
    for (size_t t = 0; t < T; t++) {
        float *a = agg + t * Lt;
        memset(a, 0, Lt * sizeof *a);
        for (size_t j = 0; j < k; j++) {
            float *e = slots + (t * k + j) * Lt;
            if (ABLATED(MOE_NORM_PER_EXPERT)) op_rmsnorm(e, e, w->moe_norm, Lt, c->rms_eps);
            for (size_t i = 0; i < Lt; i++) a[i] = a[i] + wts[t * k + j] * e[i];
        }
        if (c->latent_norm && !ABLATED(MOE_NORM_PER_EXPERT)) op_rmsnorm(a, a, w->moe_norm, Lt, c->rms_eps);
    }
    /* 5. back to the full width */
    kmatmul(pool, &w->moe_up, agg, Lt, T, y, E);

    /* 6. the fused shared expert on the ORIGINAL x, added unweighted */
    sg = malloc(T * Is * sizeof *sg);
    su = malloc(T * Is * sizeof *su);
    sh = malloc(T * E * sizeof *sh);
    if (!sg || !su || !sh) { snprintf(err, errlen, "out of memory in the shared expert"); goto out; }
    kmatmul(pool, &w->sh_gate, x, E, T, sg, Is);
    kmatmul(pool, &w->sh_up, x, E, T, su, Is);
    for (size_t i = 0; i < T * Is; i++) sg[i] = op_situ(sg[i], su[i], b1, b2);
    kmatmul(pool, &w->sh_down, sg, Is, T, sh, E);
    for (size_t t = 0; t < T; t++) {
        const float s = ABLATED(SHARED_ON_LATENT_WEIGHTED) ? wts[t * k] : 1.0f;
        for (size_t i = 0; i < E; i++) y[t * E + i] = y[t * E + i] + (ABLATED(SHARED_ON_LATENT_WEIGHTED) ? s * sh[t * E + i] : sh[t * E + i]);
    }
    rc = 0;
out:
    free(logits); free(idx); free(wts); free(zeta); free(slots); free(agg); free(xe); free(a1); free(a3);
    free(distinct); free(rows); free(bound); free(sg); free(su); free(sh);
    return rc;
}

int dense_ffn_forward(const k3_config *c, const k3_layer_w *w, kpool *pool, const float *x, size_t T, float *y)
{
    const size_t E = (size_t)c->hidden, Id = (size_t)c->dense_inter;
    const float b1 = (float)c->situ_beta1, b2 = (float)c->situ_beta2;
    float *g = malloc(T * Id * sizeof *g), *u = malloc(T * Id * sizeof *u);
    if (!g || !u) { free(g); free(u); return -1; }
    kmatmul(pool, &w->ffn_gate, x, E, T, g, Id);
    kmatmul(pool, &w->ffn_up, x, E, T, u, Id);
    for (size_t i = 0; i < T * Id; i++) g[i] = op_situ(g[i], u[i], b1, b2);
    kmatmul(pool, &w->ffn_down, g, Id, T, y, E);
    free(g);
    free(u);
    return 0;
}
