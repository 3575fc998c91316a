/* Element-wise and normalisation operations of the K3 forward pass, each
 * written once with the rounding docs/NUMERICS.md §4 prescribes. */
#ifndef KRUN_OPS_H
#define KRUN_OPS_H

#include <stddef.h>

/* y = (x * inv) * w, inv = 1/sqrt(mean(x^2) + eps), sum of squares in double.  y may be x. */
void op_rmsnorm(float *y, const float *x, const float *w, size_t n, double eps);
/* x *= 1/sqrt(sum(x^2) + 1e-6), in place. */
void op_l2norm(float *x, size_t n);
float op_sigmoid(float x);
float op_silu(float x);
/* SiTU-GLU of spec §4.1: [b1 tanh(g/b1) sigma(g)] * [b2 tanh(u/b2)]; sigma takes the uncapped g. */
float op_situ(float g, float u, float b1, float b2);
/* In place: p = exp(s - max) / sum, sum in double.  n >= 1. */
void op_softmax(float *s, size_t n);
/* AttnRes (spec §4.4): out = sum_j softmax(s)_j v_j with s_j = <v_j / rms(v_j), f>.
 * v[j] points to source j (oldest first).  n <= K3_MAX_LAYERS + 2. */
void op_attnres(float *out, const float *const *v, size_t n, const float *f, size_t E, double eps);

#endif
