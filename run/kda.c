/* Kimi Delta Attention, spec §4.5, for a block of T positions. */
#include "layers.h"

#include "ablate.h"
#include "ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct kda_job {
    const k3_config *c;
    const k3_layer_w *w;
    size_t T, P, D;
    float *q, *k, *v, *beta, *alpha, *gate, *o;  /* [T][P] (beta [T][Hk]) */
    float *S;
};

/* Causal depthwise ShortConv with fused SiLU over T new positions:
 * c(t) = SiLU(sum_j w[j] * x(t - (Kc-1) + j)), taps oldest first, so w[Kc-1]
 * multiplies the current input; positions before t=0 come from hist, the last
 * Kc-1 pre-conv inputs (oldest first), which is then advanced. */
static void short_conv(float *xv, size_t T, size_t P, const float *wconv, int Kc, float *hist, float *tmp)
{
    const size_t H = (size_t)(Kc - 1);
    for (size_t ch = 0; ch < P; ch++) {
        const float *w = wconv + ch * (size_t)Kc;
        /* the channel's inputs: history then the new positions */
        for (size_t i = 0; i < H; i++) tmp[i] = ABLATED(NO_CONV_HISTORY) ? 0.0f : hist[i * P + ch];
        for (size_t t = 0; t < T; t++) tmp[H + t] = xv[t * P + ch];
        for (size_t t = 0; t < T; t++) {
            float acc = 0.0f;
            for (int j = 0; j < Kc; j++)
                acc = acc + (ABLATED(CONV_TAPS_REVERSED) ? w[Kc - 1 - j] : w[j]) * tmp[t + (size_t)j];
            xv[t * P + ch] = ABLATED(NO_CONV_SILU) ? acc : op_silu(acc);
        }
        for (size_t i = 0; i < H; i++) hist[i * P + ch] = tmp[T + i];
    }
}

/* The recurrence of spec §4.5 step 6, for heads [h0, h1). */
static void recurrence(void *arg, size_t h0, size_t h1)
{
    struct kda_job *j = arg;
    const size_t D = j->D, P = j->P;
    float u[1024], d[1024]; /* D <= 1024 (checked by the caller) */
    for (size_t h = h0; h < h1; h++) {
        float *S = j->S + h * D * D;
        for (size_t t = 0; t < j->T; t++) {
            const float *k = j->k + t * P + h * D, *v = j->v + t * P + h * D;
            const float *q = j->q + t * P + h * D, *a = j->alpha + t * P + h * D;
            const float beta = j->beta[t * (size_t)j->c->kda_heads + h];
            float *o = j->o + t * P + h * D;
            if (ABLATED(KDA_READ_BEFORE_DECAY)) {
                for (size_t c = 0; c < D; c++) u[c] = 0.0f;
                for (size_t i = 0; i < D; i++)
                    for (size_t c = 0; c < D; c++) u[c] = u[c] + S[i * D + c] * k[i];
            }
            /* 1. decay: S[i][:] *= alpha_i */
            for (size_t i = 0; i < D; i++)
                for (size_t c = 0; c < D; c++) S[i * D + c] = S[i * D + c] * a[i];
            /* 2. read: u = S^T k, sequential in i */
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
            /* 3. delta write: S += k (x) beta (v - u) */
            for (size_t i = 0; i < D; i++)
                for (size_t c = 0; c < D; c++) S[i * D + c] = S[i * D + c] + k[i] * d[c];
            /* 4. output from the updated state: o = S^T q */
            if (!ABLATED(KDA_OUTPUT_PRE_WRITE)) {
                for (size_t c = 0; c < D; c++) o[c] = 0.0f;
                for (size_t i = 0; i < D; i++)
                    for (size_t c = 0; c < D; c++) o[c] = o[c] + S[i * D + c] * q[i];
            }
        }
    }
}

int kda_forward(const k3_config *c, const k3_layer_w *w, kpool *pool, const float *x, size_t T, float *y,
                float *S, float *conv)
{
    const size_t E = (size_t)c->hidden, D = (size_t)c->kda_head_dim, Hk = (size_t)c->kda_heads, P = Hk * D;
    const int Kc = c->conv_width;
    const float lb = (float)c->gate_lb, qscale = (float)(1.0 / sqrt((double)D));
    float *q = NULL, *k = NULL, *v = NULL, *g = NULL, *beta = NULL, *fa = NULL, *z = NULL, *o = NULL, *tmp = NULL;
    struct kda_job job;
    int rc = -1;
    (void)E;
    if (D > 1024) return -1;
    q = malloc(T * P * sizeof *q);
    k = malloc(T * P * sizeof *k);
    v = malloc(T * P * sizeof *v);
    g = malloc(T * P * sizeof *g);
    z = malloc(T * P * sizeof *z);
    o = malloc(T * P * sizeof *o);
    beta = malloc(T * Hk * sizeof *beta);
    fa = malloc(T * D * sizeof *fa);
    tmp = malloc(((size_t)Kc + T) * sizeof *tmp);
    if (!q || !k || !v || !g || !z || !o || !beta || !fa || !tmp) goto out;

    /* 1. projections */
    kmatmul(pool, &w->q, x, E, T, q, P);
    kmatmul(pool, &w->k, x, E, T, k, P);
    kmatmul(pool, &w->v, x, E, T, v, P);
    kmatmul(pool, &w->g, x, E, T, g, P);
    kmatmul(pool, &w->b, x, E, T, beta, Hk);
    for (size_t i = 0; i < T * Hk; i++) beta[i] = op_sigmoid(beta[i]);
    kmatmul(pool, &w->fa, x, E, T, fa, D);
    kmatmul(pool, &w->fb, fa, D, T, z, P);       /* no activation between f_a and f_b */

    /* 2. ShortConv + SiLU on q, k, v separately, carrying their histories */
    short_conv(q, T, P, w->qconv, Kc, conv + 0 * (size_t)(Kc - 1) * P, tmp);
    short_conv(k, T, P, w->kconv, Kc, conv + 1 * (size_t)(Kc - 1) * P, tmp);
    short_conv(v, T, P, w->vconv, Kc, conv + 2 * (size_t)(Kc - 1) * P, tmp);

    for (size_t t = 0; t < T; t++)
        for (size_t h = 0; h < Hk; h++) {
            float *qh = q + t * P + h * D, *kh = k + t * P + h * D, *zh = z + t * P + h * D;
            /* 3. L2Norm of q and k per head; v is left alone */
            op_l2norm(qh, D);
            op_l2norm(kh, D);
            /* 5. scale q before the recurrence */
            if (!ABLATED(KDA_NO_Q_SCALE))
                for (size_t i = 0; i < D; i++) qh[i] = qh[i] * qscale;
            /* 4. decay alpha = exp(lb * sigma(exp(A_log[h]) * (zeta + dt_bias))); A_log per HEAD */
            for (size_t i = 0; i < D; i++) {
                float A = expf(w->a_log[ABLATED(ALOG_PER_CHANNEL) ? i : h]);
                float arg = zh[i] + (ABLATED(NO_DT_BIAS) ? 0.0f : w->dt_bias[h * D + i]);
                zh[i] = expf(lb * op_sigmoid(A * arg)); /* z now holds alpha */
            }
        }

    /* 6. the recurrence, heads in parallel */
    job.c = c; job.w = w; job.T = T; job.P = P; job.D = D;
    job.q = q; job.k = k; job.v = v; job.beta = beta; job.alpha = z; job.o = o; job.S = S;
    kpool_for(pool, Hk, recurrence, &job);

    /* 7-8. head-wise RMSNorm with the shared o_norm, then the sigmoid gate, then o_proj */
    for (size_t t = 0; t < T; t++)
        for (size_t h = 0; h < Hk; h++) {
            float *oh = o + t * P + h * D, *gh = g + t * P + h * D;
            if (ABLATED(KDA_GATE_BEFORE_NORM)) {
                for (size_t i = 0; i < D; i++) oh[i] = oh[i] * op_sigmoid(gh[i]);
                op_rmsnorm(oh, oh, w->o_norm, D, c->rms_eps);
                continue;
            }
            op_rmsnorm(oh, oh, w->o_norm, D, c->rms_eps);
            for (size_t i = 0; i < D; i++) oh[i] = oh[i] * op_sigmoid(gh[i]);
        }
    kmatmul(pool, &w->o, o, P, T, y, E);
    rc = 0;
out:
    free(q); free(k); free(v); free(g); free(z); free(o); free(beta); free(fa); free(tmp);
    return rc;
}
