/* The drafter's layer (K3_EAGLE.md §3): committed rows (their KV row only,
 * §3.9) and chain steps (the whole layer).  Every product is kmatmul's
 * (each output a kdot, docs/NUMERICS.md §3), the norms, softmax and weighted
 * sums those of §4, so a row's bits do not depend on which rows it is
 * computed with. */
#include "draft_internal.h"

#include "run/engine/ops.h"
#include "run/util/ablate.h"

#include <string.h>

/* The KV row of position q from g (its fused taps, or a chain's o) and the
 * embedding e of its successor token: x = [norm(e) | norm(g)] (embedding half
 * first, K3_EAGLE §3.3 step 1), kv = W_kva x; the cache row is
 * [RMSNorm(c) | RoPE(k^R)] (§3.3 step 3).  cnt rows at once: g, e, x rows of
 * E, E, 2E floats. */
static void x_row(const kdraft *d, const float *e, const float *g, float *x)
{
    const size_t E = (size_t)d->cfg.hidden;
    const size_t he = ABLATED(DRAFT_HIDDEN_FIRST) ? E : 0;
    op_rmsnorm(x + he, e, d->in_ln, E, d->cfg.rms_eps);
    op_rmsnorm(x + E - he, g, d->hid_norm, E, d->cfg.rms_eps);
}

static void cache_row(const kdraft *d, const float *kv, size_t q, float *dst)
{
    const size_t Rkv = (size_t)d->cfg.kv_lora, dr = (size_t)d->cfg.qk_rope;
    op_rmsnorm(dst, kv, d->kva_norm, Rkv, d->cfg.rms_eps);
    memcpy(dst + Rkv, kv + Rkv, dr * sizeof *dst);
    kdraft_rope(dst + Rkv, dr, d->omega, d->cos_mult, q);
}

/* Committed rows q0 .. q0 + cnt - 1 of st: g rows (E apart), the embeddings
 * of their successors the block's rows erow0 .. erow0 + cnt - 1. */
static void commit_rows(kdraft *d, const k3_run *r, kdraft_state *st, size_t q0, size_t cnt, const float *g, size_t erow0)
{
    const size_t E = (size_t)d->cfg.hidden, row = (size_t)(d->cfg.kv_lora + d->cfg.qk_rope);
    for (size_t i = 0; i < cnt; i++) x_row(d, k3_block_embedding(r, erow0 + i), g + i * E, d->cm.x + i * 2 * E);
    kmatmul(d->pool, &d->kva, d->cm.x, 2 * E, cnt, d->cm.kv, row);
    for (size_t i = 0; i < cnt; i++) cache_row(d, d->cm.kv + i * row, q0 + i, st->cache + (q0 + i) * row);
    st->n = q0 + cnt;
}

void kdraft_commit(kdraft *d, const k3_run *r, const kdraft_seg *segs, size_t nseg)
{
    const size_t E = (size_t)d->cfg.hidden, w = kdraft_tap_floats(d);
    for (size_t k = 0; k < nseg; k++) {
        const kdraft_seg *s = &segs[k];
        kdraft_state *st = s->st;
        if (!s->n) continue;
        /* the pending row pairs with the block's first token (K3_EAGLE §4.1 step 5) */
        if (kdraft_ready(st, s->pos)) commit_rows(d, r, st, s->pos - 1, 1, st->pending, s->row0);
        else if (st->n != s->pos) st->start = st->n = s->pos;   /* no row before pos: the context starts here */
        st->has_pending = 0;
        for (size_t i0 = 0; i0 < s->n; i0 += KD_COMMIT_ROWS) {
            const size_t cnt = s->n - i0 < KD_COMMIT_ROWS ? s->n - i0 : KD_COMMIT_ROWS;
            const size_t last = i0 + cnt == s->n;      /* this chunk ends with the segment's newest row: pending */
            /* fusion, K3_EAGLE §3.3 step 0: g = W_fc [tap 1 | tap 2 | tap 3] */
            kmatmul(d->pool, &d->fc, r->s.taps + (s->row0 + i0) * w, w, cnt, d->cm.g, E);
            if (cnt - last) commit_rows(d, r, st, s->pos + i0, cnt - last, d->cm.g, s->row0 + i0 + 1 - ABLATED(DRAFT_PAIR_OWN_TOKEN));
            if (last) {
                memcpy(st->pending, d->cm.g + (cnt - 1) * E, E * sizeof *st->pending);
                st->has_pending = 1;
            }
        }
    }
}

void kdraft_fuse_row(kdraft *d, const k3_run *r, size_t row, float *out)
{
    const size_t w = kdraft_tap_floats(d);
    kmatmul(d->pool, &d->fc, r->s.taps + row * w, w, 1, out, (size_t)d->cfg.hidden);
}

/* ---- a chain step ------------------------------------------------------------ */

/* Attention of one row (§3.3 step 4, absorbed as §3.8): heads in parallel,
 * each head's sums in position order. */
struct att {
    const kdraft *d;
    const float *q;            /* the row's [H][dn + dr], rope part rotated */
    const float *cache;        /* rows [s0, s1) of its state */
    size_t s0, s1;
    float *out;                /* [H][dv] */
};

static void att_heads(void *arg, size_t h0, size_t h1)
{
    const struct att *a = arg;
    const kdraft *d = a->d;
    const size_t Rkv = (size_t)d->cfg.kv_lora, dr = (size_t)d->cfg.qk_rope, dn = (size_t)d->cfg.qk_nope, dv = (size_t)d->cfg.v_head;
    const size_t row = Rkv + dr, n = a->s1 - a->s0;
    const float tau = (float)d->tau;
    for (size_t h = h0; h < h1; h++) {
        const float *qn = a->q + h * (dn + dr), *qr = qn + dn;
        float *qt = d->ch.qt + h * Rkv, *sc = d->ch.sc + h * d->cap, *olat = d->ch.olat + h * Rkv;
        const size_t kr0 = h * (dn + dv);  /* kv_b: dn key rows, then dv value rows per head */
        kmatvec_t(&d->kvb, kr0, kr0 + dn, qn, qt);
        for (size_t s = 0; s < n; s++) {
            const float *c = a->cache + (a->s0 + s) * row;
            sc[s] = (kdot_f32(qt, c, Rkv) + kdot_f32(qr, c + Rkv, dr)) * tau;
        }
        op_softmax(sc, n);
        memset(olat, 0, Rkv * sizeof *olat);
        for (size_t s = 0; s < n; s++) {
            const float *c = a->cache + (a->s0 + s) * row, p = sc[s];
            for (size_t j = 0; j < Rkv; j++) olat[j] = olat[j] + p * c[j];
        }
        for (size_t v = 0; v < dv; v++) a->out[h * dv + v] = kmat_row_dot(&d->kvb, kr0 + dn + v, olat);
    }
}

static int32_t argmax(const float *x, size_t n)
{
    size_t b = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;   /* the first maximum: the lowest id on ties (K3_EAGLE §4.2) */
    return (int32_t)b;
}

/* One embedding row of the target's table (the drafter's is the same: checked at load), widened. */
static int embed(kdraft *d, int32_t id, float *out, krun_err *err)
{
    const kt_loc *emb = &d->target->globals[K3T_EMBED];
    const size_t E = (size_t)d->cfg.hidden, rowb = E * kpk_dtype_size(emb->dtype);
    if (kstore_read(d->store, d->globals_extent, emb->offset + (uint64_t)id * rowb, rowb, d->ch.erow, err)) return -1;
    k3_widen(d->ch.erow, emb->dtype, E, out);
    return 0;
}

int kdraft_propose(kdraft *d, kdraft_state *const *st, const int32_t *first, const size_t *k, size_t n, int32_t *const *out,
                   krun_err *err)
{
    const k3_eagle_config *c = &d->cfg;
    const size_t E = (size_t)c->hidden, V = (size_t)c->vocab, F = (size_t)c->inter, H = (size_t)c->heads;
    const size_t Rq = (size_t)c->q_lora, Rkv = (size_t)c->kv_lora, dn = (size_t)c->qk_nope, dr = (size_t)c->qk_rope,
                 dv = (size_t)c->v_head, QW = H * (dn + dr), row = Rkv + dr;
    size_t kmax = 0;
    if (n > d->rows) return krun_err_set(err, KRUN_EINPUT, "%zu chains in one drafter step: it was laid out for %zu", n, d->rows);
    for (size_t i = 0; i < n; i++) {
        if (k[i] > kmax) kmax = k[i];
        if (k[i] && (!st[i]->has_pending || st[i]->n + k[i] > st[i]->cap))
            return krun_err_set(err, KRUN_EINPUT, "a chain of %zu drafts from a drafter state %s", k[i],
                                st[i]->has_pending ? "whose cache cannot hold it" : "without a pending row");
        /* §4.5: the chain restarts from the pending row's g */
        if (k[i]) memcpy(d->ch.g + i * E, st[i]->pending, E * sizeof *d->ch.g);
    }
    for (size_t j = 0; j < kmax; j++) {
        size_t act = 0;
        for (size_t i = 0; i < n; i++)
            if (j < k[i]) d->ch.rows[act++] = i;
        /* x = [norm(embed(u)) | norm(g)]: u the sampled token, then the previous draft (§3.2) */
        for (size_t a = 0; a < act; a++) {
            const size_t i = d->ch.rows[a];
            if (embed(d, j ? out[i][j - 1] : first[i], d->ch.f + a * E, err)) return krun_err_prefix(err, "drafter: ");
            x_row(d, d->ch.f + a * E, d->ch.g + i * E, d->ch.x + a * 2 * E);
        }
        /* §3.3 step 2: queries through the LoRA path, rope part rotated at the row's position */
        kmatmul(d->pool, &d->qa, d->ch.x, 2 * E, act, d->ch.cq, Rq);
        for (size_t a = 0; a < act; a++) op_rmsnorm(d->ch.cq + a * Rq, d->ch.cq + a * Rq, d->qa_norm, Rq, c->rms_eps);
        kmatmul(d->pool, &d->qb, d->ch.cq, Rq, act, d->ch.q, QW);
        /* step 3: the row's latent into the cache at its position (scratch past the committed rows) */
        kmatmul(d->pool, &d->kva, d->ch.x, 2 * E, act, d->ch.kv, row);
        for (size_t a = 0; a < act; a++) {
            const size_t i = d->ch.rows[a], q = st[i]->n + j, qr = q + ABLATED(DRAFT_CHAIN_POSITION_PLUS_ONE);
            for (size_t h = 0; h < H; h++) kdraft_rope(d->ch.q + a * QW + h * (dn + dr) + dn, dr, d->omega, d->cos_mult, qr);
            cache_row(d, d->ch.kv + a * row, qr, st[i]->cache + q * row);
        }
        /* step 4: attention over the committed rows and the chain's rows up to this one */
        for (size_t a = 0; a < act; a++) {
            const size_t i = d->ch.rows[a];
            struct att at = {d, d->ch.q + a * QW, st[i]->cache, st[i]->start, st[i]->n + j + 1, d->ch.att + a * H * dv};
            kpool_for(H * (st[i]->n + j + 1 - st[i]->start) * (Rkv + dr) >= (1u << 16) ? d->pool : NULL, H, att_heads, &at);
        }
        /* step 5: a = W_o heads; r1 = g + a (no output gate) */
        kmatmul(d->pool, &d->o, d->ch.att, H * dv, act, d->ch.r, E);
        for (size_t a = 0; a < act; a++) {
            const float *g = ABLATED(DRAFT_NORMED_RESIDUAL) ? d->ch.x + a * 2 * E + E : d->ch.g + d->ch.rows[a] * E;
            float *r = d->ch.r + a * E;
            for (size_t e = 0; e < E; e++) r[e] = g[e] + r[e];
            op_rmsnorm(d->ch.n + a * E, r, d->post_ln, E, c->rms_eps);
        }
        /* step 6: SwiGLU, r2 = r1 + down(SiLU(gate) * up) */
        kmatmul(d->pool, &d->gate, d->ch.n, E, act, d->ch.gate, F);
        kmatmul(d->pool, &d->up, d->ch.n, E, act, d->ch.up, F);
        for (size_t i = 0; i < act * F; i++)
            d->ch.gate[i] = ABLATED(DRAFT_SILU_OF_UP) ? op_silu(d->ch.up[i]) * d->ch.gate[i] : op_silu(d->ch.gate[i]) * d->ch.up[i];
        kmatmul(d->pool, &d->down, d->ch.gate, F, act, d->ch.f, E);
        /* step 7: o = norm(r2), logits = lm_head o, the draft their argmax; step 8: o is the next g */
        for (size_t a = 0; a < act; a++) {
            float *r = d->ch.r + a * E, *f = d->ch.f + a * E;
            for (size_t e = 0; e < E; e++) r[e] = r[e] + f[e];
            op_rmsnorm(d->ch.n + a * E, r, d->norm, E, c->rms_eps);
            memcpy(d->ch.g + d->ch.rows[a] * E, ABLATED(DRAFT_FEED_R2) ? r : d->ch.n + a * E, E * sizeof *d->ch.g);
        }
        kmatmul(d->pool, &d->lm, ABLATED(DRAFT_HEAD_NO_NORM) ? d->ch.r : d->ch.n, E, act, d->ch.logits, V);
        for (size_t a = 0; a < act; a++) out[d->ch.rows[a]][j] = argmax(d->ch.logits + a * V, V);
        if (d->dump && act && d->ch.rows[0] == 0) memcpy(d->dump + j * V, d->ch.logits, V * sizeof *d->dump);
    }
    return 0;
}

void kdraft_set_dump(kdraft *d, float *logits) { d->dump = logits; }
