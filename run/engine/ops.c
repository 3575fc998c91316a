#include "ops.h"

#include "ablate_variants.h"
#include "format/k3_config.h"
#include "run/kernels/kmath.h"
#include "run/util/ablate.h"

#include <math.h>
#include <string.h>

void op_rmsnorm(float *y, const float *x, const float *w, size_t n, double eps)
{
    double ss = 0;
    float inv;
    for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    inv = (float)(1.0 / sqrt(ss / (double)n + eps));
    for (size_t i = 0; i < n; i++) y[i] = (x[i] * inv) * w[i];
}

void op_l2norm(float *x, size_t n)
{
    double ss = 0;
    float inv;
    for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    /* a sum, not a mean (spec trap 5) */
    if (ABLATED(L2NORM_MEAN)) ss /= (double)n;
    inv = (float)(1.0 / sqrt(ss + 1e-6));
    for (size_t i = 0; i < n; i++) x[i] = x[i] * inv;
}

float op_sigmoid(float x) { return 1.0f / (1.0f + kmath_expf(-x)); } /* not libm's expf: kmath.h */

float op_silu(float x) { return x * op_sigmoid(x); }

float op_situ(float g, float u, float b1, float b2)
{
    float gate, up;
    if (ABLATED(SITU_BETAS_SWAPPED)) { float t = b1; b1 = b2; b2 = t; }
    if (ABLATED(SITU_NO_CAPS)) return g * op_sigmoid(g) * u;
    gate = b1 * kmath_tanhf(g / b1); /* not libm's tanhf: the same bits on every machine (kmath.h) */
    gate = gate * op_sigmoid(ABLATED(SITU_SIGMA_OF_CAPPED) ? gate : g);
    up = b2 * kmath_tanhf(u / b2);
    return gate * up;
}

void op_softmax(float *s, size_t n)
{
    float m = s[0];
    double z = 0;
    for (size_t i = 1; i < n; i++) if (s[i] > m) m = s[i];
    for (size_t i = 0; i < n; i++) { s[i] = kmath_expf(s[i] - m); z += s[i]; }
    for (size_t i = 0; i < n; i++) s[i] = (float)(s[i] / z);
}

void op_attnres(float *out, const float *const *v, size_t n, const float *f, size_t E, double eps)
{
    float s[K3_MAX_LAYERS + 2]; /* one score per source: the snapshots and the prefix */
    for (size_t j = 0; j < n; j++) {
        double ss = 0, dot = 0;
        float inv;
        for (size_t i = 0; i < E; i++) ss += (double)v[j][i] * v[j][i];
        inv = (float)(1.0 / sqrt(ss / (double)E + eps));
        for (size_t i = 0; i < E; i++) dot += (double)((v[j][i] * inv) * f[i]);
        s[j] = (float)dot;
    }
    op_softmax(s, n);
    if (ABLATED(ATTNRES_NORMALISED_VALUES)) { abl_attnres_values(out, v, s, n, E, eps); return; }
    /* the values are the raw sources (spec trap 13) */
    memset(out, 0, E * sizeof *out);
    for (size_t j = 0; j < n; j++)
        for (size_t i = 0; i < E; i++) out[i] = out[i] + s[j] * v[j][i];
}
