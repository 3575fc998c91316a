/* The sequential kernels (run/kernels/kernels_seq.h) against independent references
 * written from docs/NUMERICS.md §4, bit for bit, on every SIMD level the CPU
 * has:
 *  - the KDA step in two passes == the four passes of the spec (decay every
 *    row, read u = S^T k, write S += k (x) d, output o = S^T q), over several
 *    steps of one evolving state, for head sizes that are and are not
 *    multiples of the vector widths, with signed zeros, subnormals and
 *    values of very different magnitudes;
 *  - decaying into a copy leaves the source state untouched and gives the
 *    in-place bits; the state-only write (o == NULL) gives the same state;
 *  - the MLA weighted sums of H heads at once == one head, one position at a
 *    time, in position order. */
#include "check.h"
#include "testrand.h"
#include "run/kernels/kernels.h"
#include "run/kernels/kernels_seq.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Awkward values now and then, bounded so nothing overflows over a few steps. */
static float special(void)
{
    float s = (rnd() & 1) ? -1.0f : 1.0f;
    switch (rnd() % 10) {
    case 0: return -0.0f;
    case 1: return 0.0f;
    case 2: return s * bitsf((uint32_t)(rnd() % 0x7fffff) + 1);            /* subnormal */
    case 3: return s * ldexpf(unif(1.0f, 2.0f), 8 + (int)(rnd() % 8));     /* large */
    case 4: return s * ldexpf(unif(1.0f, 2.0f), -120 + (int)(rnd() % 20)); /* tiny */
    default: return unif(-1.0f, 1.0f);
    }
}
/* ---- the references: the spec's four passes, one after another ---- */

static void ref_kda_step(float *S, const float *q, const float *k, const float *v, const float *alpha, float beta, float *o,
                         size_t D)
{
    float *u = xmalloc(D * sizeof *u), *d = xmalloc(D * sizeof *d);
    for (size_t i = 0; i < D; i++)
        for (size_t c = 0; c < D; c++) S[i * D + c] = S[i * D + c] * alpha[i];
    for (size_t c = 0; c < D; c++) {
        float acc = 0.0f;
        for (size_t i = 0; i < D; i++) acc = acc + S[i * D + c] * k[i];
        u[c] = acc;
    }
    for (size_t c = 0; c < D; c++) d[c] = beta * (v[c] - u[c]);
    for (size_t i = 0; i < D; i++)
        for (size_t c = 0; c < D; c++) S[i * D + c] = S[i * D + c] + k[i] * d[c];
    for (size_t c = 0; c < D; c++) {
        float acc = 0.0f;
        for (size_t i = 0; i < D; i++) acc = acc + S[i * D + c] * q[i];
        o[c] = acc;
    }
    free(u);
    free(d);
}

static void two_pass_step(float *S, const float *Sin, const float *q, const float *k, const float *v, const float *alpha,
                          float beta, float *o, size_t D)
{
    float *u = xmalloc(D * sizeof *u), *d = xmalloc(D * sizeof *d);
    kseq_decay_read(S, Sin, D, alpha, k, u);
    for (size_t c = 0; c < D; c++) d[c] = beta * (v[c] - u[c]);
    kseq_write_out(S, D, k, d, q, o);
    free(u);
    free(d);
}

static void fill(float *x, size_t n, int awkward)
{
    for (size_t i = 0; i < n; i++) x[i] = awkward ? special() : unif(-1.0f, 1.0f);
}

static void check_kda(const char *level)
{
    static const size_t dims[] = {1, 3, 8, 15, 16, 17, 24, 33, 64, 100, 128, 136, 200};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const size_t D = dims[di], DD = D * D;
        float *S_ref = xmalloc(DD * 4), *S = xmalloc(DD * 4), *Scopy = xmalloc(DD * 4), *S_keep = xmalloc(DD * 4),
              *S_noout = xmalloc(DD * 4);
        float *q = xmalloc(D * 4), *k = xmalloc(D * 4), *v = xmalloc(D * 4), *alpha = xmalloc(D * 4);
        float *o_ref = xmalloc(D * 4), *o = xmalloc(D * 4), *o_copy = xmalloc(D * 4);
        int same_state = 1, same_out = 1, copy_ok = 1, src_kept = 1, noout_ok = 1;
        fill(S_ref, DD, 1);
        memcpy(S, S_ref, DD * 4);
        memcpy(S_noout, S_ref, DD * 4);
        for (int step = 0; step < 6; step++) {
            float beta = unif(0.0f, 1.0f);
            fill(q, D, step & 1);
            fill(k, D, step & 1);
            fill(v, D, 1);
            for (size_t i = 0; i < D; i++) alpha[i] = (rnd() % 7 == 0) ? bitsf((uint32_t)(rnd() % 0x7fffff) + 1) : unif(0.01f, 1.0f);
            if (step == 2) alpha[0] = 1.0f, alpha[D - 1] = 0.0f;
            /* into a copy first: the source must not change */
            memcpy(S_keep, S, DD * 4);
            two_pass_step(Scopy, S, q, k, v, alpha, beta, o_copy, D);
            src_kept &= memcmp(S_keep, S, DD * 4) == 0;
            ref_kda_step(S_ref, q, k, v, alpha, beta, o_ref, D);
            two_pass_step(S, S, q, k, v, alpha, beta, o, D);
            {
                float *u = xmalloc(D * 4), *d = xmalloc(D * 4);
                kseq_decay_read(S_noout, S_noout, D, alpha, k, u);
                for (size_t c = 0; c < D; c++) d[c] = beta * (v[c] - u[c]);
                kseq_write_out(S_noout, D, k, d, NULL, NULL);
                free(u);
                free(d);
            }
            same_state &= memcmp(S_ref, S, DD * 4) == 0;
            same_out &= memcmp(o_ref, o, D * 4) == 0;
            copy_ok &= memcmp(Scopy, S, DD * 4) == 0 && memcmp(o_copy, o, D * 4) == 0;
            noout_ok &= memcmp(S_noout, S, DD * 4) == 0;
        }
        CHECK(same_state && same_out, "%s: KDA two passes == four passes, D %zu, 6 steps: state and output bits", level, D);
        CHECK(copy_ok && src_kept, "%s: KDA step into a copy, D %zu: the copy has the in-place bits, the source is unchanged", level, D);
        CHECK(noout_ok, "%s: KDA state-only step (no output), D %zu: the same state bits", level, D);
        free(S_ref); free(S); free(Scopy); free(S_keep); free(S_noout);
        free(q); free(k); free(v); free(alpha); free(o_ref); free(o); free(o_copy);
    }
}

static void check_wsum(const char *level)
{
    static const size_t shapes[][3] = {{1, 1, 1}, {3, 7, 5}, {4, 16, 33}, {96, 64, 40}, {5, 200, 17}, {2, 129, 3}, {96, 512, 9}, {6, 70, 130}, {96, 512, 150}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const size_t H = shapes[si][0], m = shapes[si][1], n = shapes[si][2];
        const size_t ldy = m + 3, ldw = n + 5, ldx = m + 11;
        float *y = xmalloc(H * ldy * 4), *yr = xmalloc(H * ldy * 4), *w = xmalloc(H * ldw * 4), *x = xmalloc(n * ldx * 4);
        fill(y, H * ldy, 1);
        memcpy(yr, y, H * ldy * 4);
        fill(w, H * ldw, 0);
        fill(x, n * ldx, 1);
        for (size_t h = 0; h < H; h++)        /* one head, one element at a time, positions in order */
            for (size_t c = 0; c < m; c++) {
                float acc = yr[h * ldy + c];
                for (size_t p = 0; p < n; p++) acc = acc + w[h * ldw + p] * x[p * ldx + c];
                yr[h * ldy + c] = acc;
            }
        kseq_wsum(y, ldy, w, ldw, H, x, ldx, n, m);
        CHECK(memcmp(y, yr, H * ldy * 4) == 0, "%s: MLA weighted sums, %zu heads x %zu latents x %zu positions == each alone in "
              "position order (bits, padding untouched)", level, H, m, n);
        free(y); free(yr); free(w); free(x);
    }
}

int main(void)
{
    /* this build's levels (the Makefile compiles only the target's kernels) */
    static const ksimd levels[] = {KSIMD_SCALAR,
#if defined(__x86_64__)
                                   KSIMD_AVX2, KSIMD_AVX512
#elif defined(__aarch64__)
                                   KSIMD_NEON
#endif
    };
    rs = 0x2545F4914F6CDD1Dull;
    for (size_t l = 0; l < sizeof levels / sizeof *levels; l++) {
        if (!kern_simd_supported(levels[l])) { SKIP("%s: the CPU does not have it", kern_simd_name(levels[l])); continue; }
        kern_simd_set(levels[l]);
        check_kda(kern_simd_name(levels[l]));
        check_wsum(kern_simd_name(levels[l]));
    }
    return check_exit();
}
