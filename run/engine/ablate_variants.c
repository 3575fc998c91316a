/* The broken variants of the ablation build (see ablate.h).  Only the test
 * build (-DKRUN_ABLATIONS) contains them. */
#include "ablate_variants.h"

#include "run/util/ablate.h"

#ifdef KRUN_ABLATIONS
#include "ops.h"
#include "weights.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void abl_kda_step(float *S, const float *Sin, const float *q, const float *k, const float *v, const float *alpha,
                  float beta, float *o, size_t D, float *u, float *d)
{
    (void)Sin; /* in place only: the ablations never verify speculatively */
    if (ABLATED(KDA_READ_BEFORE_DECAY)) {
        for (size_t c = 0; c < D; c++) u[c] = 0.0f;
        for (size_t i = 0; i < D; i++)
            for (size_t c = 0; c < D; c++) u[c] = u[c] + S[i * D + c] * k[i];
    }
    for (size_t i = 0; i < D; i++)
        for (size_t c = 0; c < D; c++) S[i * D + c] = S[i * D + c] * alpha[i];
    if (!ABLATED(KDA_READ_BEFORE_DECAY)) {
        for (size_t c = 0; c < D; c++) u[c] = 0.0f;
        for (size_t i = 0; i < D; i++)
            for (size_t c = 0; c < D; c++) u[c] = u[c] + S[i * D + c] * k[i];
    }
    for (size_t c = 0; c < D; c++) d[c] = beta * (v[c] - u[c]);
    if (ABLATED(KDA_OUTPUT_PRE_WRITE)) {
        for (size_t c = 0; c < D; c++) o[c] = 0.0f;
        for (size_t i = 0; i < D; i++)
            for (size_t c = 0; c < D; c++) o[c] = o[c] + S[i * D + c] * q[i];
    }
    for (size_t i = 0; i < D; i++)
        for (size_t c = 0; c < D; c++) S[i * D + c] = S[i * D + c] + k[i] * d[c];
    if (!ABLATED(KDA_OUTPUT_PRE_WRITE)) {
        for (size_t c = 0; c < D; c++) o[c] = 0.0f;
        for (size_t i = 0; i < D; i++)
            for (size_t c = 0; c < D; c++) o[c] = o[c] + S[i * D + c] * q[i];
    }
}

void abl_kda_gate_before_norm(float *oh, const float *gh, const float *o_norm, size_t D, double eps)
{
    for (size_t i = 0; i < D; i++) oh[i] = oh[i] * op_sigmoid(gh[i]);
    op_rmsnorm(oh, oh, o_norm, D, eps);
}

void abl_mla_norm_rope(float *dst, const float *src, const float *kva_ln, size_t Rkv, size_t row, double eps)
{
    double ss = 0;
    float inv;
    for (size_t i = 0; i < row; i++) ss += (double)src[i] * src[i];
    inv = (float)(1.0 / sqrt(ss / (double)row + eps));
    for (size_t i = 0; i < Rkv; i++) dst[i] = (src[i] * inv) * kva_ln[i];
    for (size_t i = Rkv; i < row; i++) dst[i] = src[i] * inv;
}

void abl_mla_gate_from_latent(struct kpool *pool, const struct k3_weights *w, int L, const float *cq, size_t Rq, size_t E,
                              size_t T, float *gate, size_t ldg)
{
    /* wrong input: the gate projection of the residual-free latent query */
    float *xx = calloc(T * E, sizeof *xx);
    if (!xx) abort();
    for (size_t t = 0; t < T; t++) memcpy(xx + t * E, cq + t * Rq, (Rq < E ? Rq : E) * sizeof *xx);
    wmatmul(pool, w, L, K3T_MLA_G, xx, E, T, gate, ldg);
    free(xx);
}

void abl_expert_matmul(const kmat *W, const float *X, size_t ldx, size_t n, float *Y, size_t ldy)
{
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
}

void abl_attnres_values(float *out, const float *const *v, const float *s, size_t n, size_t E, double eps)
{
    memset(out, 0, E * sizeof *out);
    for (size_t j = 0; j < n; j++) {
        double ss = 0;
        float inv;
        for (size_t i = 0; i < E; i++) ss += (double)v[j][i] * v[j][i];
        inv = (float)(1.0 / sqrt(ss / (double)E + eps));
        for (size_t i = 0; i < E; i++) out[i] = out[i] + s[j] * (v[j][i] * inv);
    }
}
#else
typedef int ablate_variants_unused; /* the normal build has none */
#endif
