/* Kimi Delta Attention, spec §4.5, for a block of positions. */
#include "layers.h"

#include "ablate_variants.h"
#include "ops.h"
#include "run/kernels/kernels_seq.h"
#include "run/kernels/kmath.h"
#include "run/util/ablate.h"

#include <math.h>
#include <string.h>

#define KDA_MAX_D 1024             /* head dimension bound of the recurrence's stack vectors */

/* Causal depthwise ShortConv with fused SiLU over T new positions of one
 * sequence: c(t) = SiLU(sum_j w[j] * x(t - (Kc-1) + j)), taps oldest first, so
 * w[Kc-1] multiplies the current input; positions before t=0 come from hist,
 * the last Kc-1 pre-conv inputs (oldest first), which is then advanced
 * (unless the block is a verification: kda_commit advances it).  snap, when
 * not NULL, receives the history as it is after the first snap_at positions
 * (a snapshot inside the block, forward.h). */
static void short_conv(float *xv, size_t T, size_t P, const float *wconv, int Kc, float *hist, int advance, float *tmp,
                       float *snap, size_t snap_at)
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
        if (advance)
            for (size_t i = 0; i < H; i++) hist[i * P + ch] = tmp[T + i];
        if (snap)
            for (size_t i = 0; i < H; i++) snap[i * P + ch] = tmp[snap_at + i];
    }
}

/* Spec §4.5 step 6 for one head and one position, in two passes over the
 * head's [D][D] state (docs/NUMERICS.md §4: each element sees the same
 * operations in the same order as decay, read, write and output done one
 * after another): decay each row and read u = S^T k from it; then write
 * S += k (x) beta (v - u) and read the output o = S^T q from the written
 * rows.  Sin is the state before the step: S itself, or the state a copy S
 * starts from (speculative verification, which must leave Sin as it was).
 * With o == NULL only the state advances.  u and d are D floats of scratch. */
static void kda_step(float *S, const float *Sin, const float *q, const float *k, const float *v, const float *alpha,
                     float beta, float *o, size_t D, float *u, float *d)
{
    kseq_decay_read(S, Sin, D, alpha, k, u);
    for (size_t c = 0; c < D; c++) d[c] = beta * (v[c] - u[c]);
    kseq_write_out(S, D, k, d, q, o);
}

struct kda_job {
    const k3_block *b;
    const k3_kda_scratch *s;
    int L;
    size_t Hk, D, P;
    float *copies;         /* a journaled segment's heads run on copies of their states (journal.h) */
};

/* The recurrence of every (segment, head) pair in [j0, j1): each on its own state. */
static void recurrence(void *arg, size_t j0, size_t j1)
{
    const struct kda_job *j = arg;
    const size_t D = j->D, P = j->P;
    float u[KDA_MAX_D], d[KDA_MAX_D];
    for (size_t jh = j0; jh < j1; jh++) {
        const size_t g = jh / j->Hk, h = jh % j->Hk;
        const k3_seg *sg = &j->b->seg[g];
        const float *Sin = sg->st->kda_S[j->L] + h * D * D;     /* the state before the block */
        float *S = sg->journal ? j->copies + (j->b->jidx[g] * j->Hk + h) * D * D : (float *)Sin;
        /* the row after which a snapshot copies the state (forward.h), or none */
        const size_t snap_row = sg->snap ? j->b->row0[g] + sg->snap->at - 1 : (size_t)-1;
        for (size_t t = j->b->row0[g]; t < j->b->row0[g] + sg->n; t++) {
            const size_t at = t * P + h * D;
            const float beta = j->s->beta[t * j->Hk + h];
            (ABLATED(KDA_READ_BEFORE_DECAY) || ABLATED(KDA_OUTPUT_PRE_WRITE) ? abl_kda_step : kda_step)(
                S, Sin, j->s->q + at, j->s->k + at, j->s->v + at, j->s->z + at, beta, j->s->o + at, D, u, d);
            Sin = S;
            if (t == snap_row) memcpy(sg->snap->S[j->L] + h * D * D, S, D * D * sizeof *S);
        }
    }
}

void kda_forward(k3_run *r, int L, const k3_block *b, const float *x, float *y)
{
    const k3_config *c = &r->model->cfg;
    const k3_vecs *w = k3_weights_vecs(&r->w, L);
    const k3_kda_scratch *s = &r->s.kda;
    const size_t T = b->T, E = (size_t)c->hidden, D = (size_t)c->kda_head_dim, Hk = (size_t)c->kda_heads, P = Hk * D;
    const int Kc = c->conv_width;
    const float lb = (float)c->gate_lb, qscale = (float)(1.0 / sqrt((double)D));
    struct kda_job job = {b, s, L, Hk, D, P, r->j.S};
    const size_t rf = r->j.rec_floats;

    /* 1. projections, every position of the block */
    wmatmul(r->pool, &r->w, L, K3T_KDA_Q, x, E, T, s->q, P);
    wmatmul(r->pool, &r->w, L, K3T_KDA_K, x, E, T, s->k, P);
    wmatmul(r->pool, &r->w, L, K3T_KDA_V, x, E, T, s->v, P);
    wmatmul(r->pool, &r->w, L, K3T_KDA_G, x, E, T, s->g, P);
    wmatmul(r->pool, &r->w, L, K3T_KDA_B, x, E, T, s->beta, Hk);
    for (size_t i = 0; i < T * Hk; i++) s->beta[i] = op_sigmoid(s->beta[i]);
    wmatmul(r->pool, &r->w, L, K3T_KDA_FA, x, E, T, s->fa, D);
    wmatmul(r->pool, &r->w, L, K3T_KDA_FB, s->fa, D, T, s->z, P);  /* no activation between f_a and f_b */

    /* a verification records the pre-conv inputs: the history it does not advance */
    for (size_t g = 0; g < b->nseg; g++)
        for (size_t i = 0; b->seg[g].journal && i < b->seg[g].n; i++) {
            const size_t t = b->row0[g] + i;
            float *at = r->j.rec[L] + (b->jrow[g] + i) * rf;
            memcpy(at, s->q + t * P, P * sizeof *at);
            memcpy(at + P, s->k + t * P, P * sizeof *at);
            memcpy(at + 2 * P, s->v + t * P, P * sizeof *at);
        }

    /* 2. ShortConv + SiLU on q, k, v separately, each segment carrying its own histories */
    for (size_t g = 0; g < b->nseg; g++) {
        const size_t o = b->row0[g] * P, n = b->seg[g].n;
        const int advance = !b->seg[g].journal;
        const k3_snap *sn = b->seg[g].snap;
        const size_t HP = (size_t)(Kc - 1) * P;
        float *hist = b->seg[g].st->kda_conv[L], *shist = sn ? sn->conv[L] : NULL;
        const size_t sat = sn ? sn->at : 0;
        short_conv(s->q + o, n, P, w->qconv, Kc, hist + 0 * HP, advance, s->tmp, shist ? shist + 0 * HP : NULL, sat);
        short_conv(s->k + o, n, P, w->kconv, Kc, hist + 1 * HP, advance, s->tmp, shist ? shist + 1 * HP : NULL, sat);
        short_conv(s->v + o, n, P, w->vconv, Kc, hist + 2 * HP, advance, s->tmp, shist ? shist + 2 * HP : NULL, sat);
    }

    for (size_t t = 0; t < T; t++)
        for (size_t h = 0; h < Hk; h++) {
            float *qh = s->q + t * P + h * D, *kh = s->k + t * P + h * D, *zh = s->z + t * P + h * D;
            /* 3. L2Norm of q and k per head; v is left alone */
            op_l2norm(qh, D);
            op_l2norm(kh, D);
            /* 5. scale q before the recurrence */
            if (!ABLATED(KDA_NO_Q_SCALE))
                for (size_t i = 0; i < D; i++) qh[i] = qh[i] * qscale;
            /* 4. decay alpha = exp(lb * sigma(exp(A_log[h]) * (zeta + dt_bias))); A_log per HEAD */
            for (size_t i = 0; i < D; i++) {
                float A = kmath_expf(w->a_log[ABLATED(ALOG_PER_CHANNEL) ? i : h]);
                float arg = zh[i] + (ABLATED(NO_DT_BIAS) ? 0.0f : w->dt_bias[h * D + i]);
                zh[i] = kmath_expf(lb * op_sigmoid(A * arg)); /* z now holds alpha */
            }
        }

    /* and the decay and write strength, to replay the positions that are kept */
    for (size_t g = 0; g < b->nseg; g++)
        for (size_t i = 0; b->seg[g].journal && i < b->seg[g].n; i++) {
            const size_t t = b->row0[g] + i;
            float *at = r->j.rec[L] + (b->jrow[g] + i) * rf;
            memcpy(at + k3_journal_alpha(c), s->z + t * P, P * sizeof *at);
            memcpy(at + k3_journal_beta(c), s->beta + t * Hk, Hk * sizeof *at);
        }

    /* 6. the recurrence: every (segment, head) pair in parallel, each on its own state */
    kpool_for(r->pool, b->nseg * Hk, recurrence, &job);

    /* 7-8. head-wise RMSNorm with the shared o_norm, then the sigmoid gate, then o_proj */
    for (size_t t = 0; t < T; t++)
        for (size_t h = 0; h < Hk; h++) {
            float *oh = s->o + t * P + h * D, *gh = s->g + t * P + h * D;
            if (ABLATED(KDA_GATE_BEFORE_NORM)) { abl_kda_gate_before_norm(oh, gh, w->o_norm, D, c->rms_eps); continue; }
            op_rmsnorm(oh, oh, w->o_norm, D, c->rms_eps);
            for (size_t i = 0; i < D; i++) oh[i] = oh[i] * op_sigmoid(gh[i]);
        }
    wmatmul(r->pool, &r->w, L, K3T_KDA_O, s->o, P, T, y, E);
}

/* ---- committing a verification block (journal.h) ---------------------------- */

struct commit_job {
    const k3_config *c;
    const k3_kda_scratch *s;
    const float *rec;
    size_t rf, keep;
    float *S;
};

/* Heads [h0, h1): the recurrence of the kept positions, replayed on the real
 * state (the same kda_step, without the output). */
static void replay(void *arg, size_t h0, size_t h1)
{
    const struct commit_job *j = arg;
    const size_t D = (size_t)j->c->kda_head_dim, P = (size_t)j->c->kda_heads * D;
    float u[KDA_MAX_D], d[KDA_MAX_D];
    for (size_t h = h0; h < h1; h++) {
        float *S = j->S + h * D * D;
        for (size_t t = 0; t < j->keep; t++) {
            const float *r = j->rec + t * j->rf;
            kda_step(S, S, NULL, j->s->k + t * P + h * D, j->s->v + t * P + h * D, r + k3_journal_alpha(j->c) + h * D,
                     r[k3_journal_beta(j->c) + h], NULL, D, u, d);
        }
    }
}

void kda_commit(k3_run *r, int L, k3_state *st, size_t row, size_t keep)
{
    const k3_config *c = &r->model->cfg;
    const k3_vecs *w = k3_weights_vecs(&r->w, L);   /* bound once: still there after the layer's extent went back */
    const k3_kda_scratch *s = &r->s.kda;            /* free between forward blocks */
    const size_t D = (size_t)c->kda_head_dim, Hk = (size_t)c->kda_heads, P = Hk * D, H = (size_t)c->conv_width - 1;
    const size_t rf = r->j.rec_floats;
    const int Kc = c->conv_width;
    const float *rec = r->j.rec[L] + row * r->j.rec_floats;
    float *hist = st->kda_conv[L];
    struct commit_job job = {c, s, rec, rf, keep, st->kda_S[L]};
    /* the kept positions' ShortConv inputs through the convolution again:
     * it moves the histories as a plain run does, and gives k and v */
    for (size_t t = 0; t < keep; t++) {
        memcpy(s->q + t * P, rec + t * rf, P * sizeof *s->q);
        memcpy(s->k + t * P, rec + t * rf + P, P * sizeof *s->k);
        memcpy(s->v + t * P, rec + t * rf + 2 * P, P * sizeof *s->v);
    }
    short_conv(s->q, keep, P, w->qconv, Kc, hist + 0 * H * P, 1, s->tmp, NULL, 0);
    short_conv(s->k, keep, P, w->kconv, Kc, hist + 1 * H * P, 1, s->tmp, NULL, 0);
    short_conv(s->v, keep, P, w->vconv, Kc, hist + 2 * H * P, 1, s->tmp, NULL, 0);
    for (size_t t = 0; t < keep; t++)
        for (size_t h = 0; h < Hk; h++) op_l2norm(s->k + t * P + h * D, D);
    kpool_for(r->pool, Hk, replay, &job);
}
