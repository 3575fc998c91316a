/* The K3 forward pass, top to bottom (spec §4).
 *
 * A block of T new positions, possibly from several sequences, goes through
 * one layer at a time: the layer's trunk extent is fetched once and applied
 * to all T positions as matrix x matrix, the union of the experts its
 * positions chose is fetched once each, and the sequential state (KDA,
 * ShortConv, MLA cache) of each sequence is advanced by its own positions. */
#include "forward.h"

#include "layers.h"
#include "ops.h"
#include "predict.h"
#include "remote.h"
#include "run/util/ablate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the run's memory: laid out once ------------------------------------------ */

static void run_carve(k3_run *r, const k3_config *c, size_t T, size_t S, size_t ctx, size_t spec, size_t taps, karena *a)
{
    k3_weights_carve(&r->w, c, a);
    k3_scratch_carve(&r->s, c, T, S, ctx, taps, a);
    k3_journal_carve(&r->j, c, spec, a);
    KTAKE(a, r->routed, (size_t)c->n_layers * (size_t)c->n_experts);
}

size_t k3_run_vectors_bytes(const k3_config *c)
{
    k3_weights w;
    karena a = {NULL, 0};
    k3_weights_carve(&w, c, &a);
    return karena_round(a.used);
}

size_t k3_run_scratch_bytes(const k3_config *c, size_t T, size_t S, size_t ctx, size_t taps)
{
    k3_scratch sc;
    karena a = {NULL, 0};
    k3_scratch_carve(&sc, c, T, S, ctx, taps, &a);
    return karena_round(a.used);
}

size_t k3_run_bytes(const k3_config *c, size_t T, size_t S, size_t ctx, size_t spec, size_t taps)
{
    k3_run r;
    karena a = {NULL, 0};
    run_carve(&r, c, T, S, ctx, spec, taps, &a);
    return karena_round(a.used);
}

int k3_run_init(k3_run *r, const k3_model *m, kstore *store, kpool *pool, size_t T, size_t S, size_t ctx, size_t spec,
                size_t taps, krun_err *err)
{
    const k3_config *c = &m->cfg;
    karena a = {NULL, 0};
    const uint8_t *g;
    uint64_t first = 0;
    memset(r, 0, sizeof *r);
    if (c->kda_head_dim > 1024) {
        krun_err_set(err, KRUN_EDATA, "%s: kda head_dim %d is larger than krun supports (1024)", kpk_path(m->file), c->kda_head_dim);
        return -1;
    }
    if (S > K3_MAX_SEQS || S > T || spec + 1 > T) {
        krun_err_set(err, KRUN_EINPUT, "%zu sequences per block: at most %d, and no more than the positions per block (%zu), "
                     "which must hold %zu drafts and the token before them", S, K3_MAX_SEQS, T, spec);
        return -1;
    }
    r->model = m;
    r->store = store;
    r->pool = pool;
    r->T_own = T;
    r->S = S;
    r->ctx = ctx;
    r->scratch_off = k3_run_vectors_bytes(c);
    r->arena_bytes = k3_run_bytes(c, T, S, ctx, spec, taps);
    r->arena = aligned_alloc(KARENA_ALIGN, r->arena_bytes);
    if (!r->arena) {
        krun_err_set(err, KRUN_ENOMEM, "out of memory: %zu bytes for the run state (activations of a %zu-position block)",
                     r->arena_bytes, T);
        return -1;
    }
    a.base = r->arena;
    run_carve(r, c, T, S, ctx, spec, taps, &a);
    memset(r->routed, 0, (size_t)c->n_layers * (size_t)c->n_experts * sizeof *r->routed);
    k3_weights_setup(&r->w, m, store);
    /* the globals are held for the whole run: lm_head and the output vectors */
    if (!k3_here(m, K3_GLOBALS)) return 0;                     /* another rank's (run/cluster) */
    g = kstore_get(store, m->globals_extent, &first, err);
    if (!g) {
        k3_run_free(r);
        return -1;
    }
    k3_weights_attach(&r->w, K3_GLOBALS, g, first);
    return 0;
}

void k3_run_use_block(k3_run *r, uint8_t *mem, size_t T)
{
    karena a = {mem ? mem : (uint8_t *)r->arena, mem ? 0 : r->scratch_off};
    k3_scratch_carve(&r->s, &r->model->cfg, mem ? T : r->T_own, r->S, r->ctx, r->s.tap_floats, &a);
}

size_t k3_run_expert_batch(const k3_run *r)
{
    size_t cap = kstore_expert_capacity(r->store);
    return cap < K3_EXPERT_BATCH ? cap : K3_EXPERT_BATCH;
}

void k3_run_free(k3_run *r)
{
    if (r->w.raw && r->w.raw[r->model->cfg.n_layers]) kstore_put(r->store, r->model->globals_extent);
    free(r->arena);
    k3_predict_free(r);
    memset(r, 0, sizeof *r);
}

/* One embedding row, read from the file on demand: the table (2.35 GB at
 * full scale) is never held. */
static int embed_row(k3_run *r, int32_t id, float *out, krun_err *err)
{
    const k3_model *m = r->model;
    const kt_loc *emb = &m->globals[K3T_EMBED];
    const size_t E = (size_t)m->cfg.hidden, rowb = E * kpk_dtype_size(emb->dtype);
    if (kstore_read(r->store, m->globals_extent, emb->offset + (uint64_t)id * rowb, rowb, r->s.embed_row, err)) return -1;
    k3_widen(r->s.embed_row, emb->dtype, E, out);
    return 0;
}

/* AttnRes over position t's block snapshots and the prefix P (spec §4.4). */
static void attnres(k3_run *r, size_t t, size_t nsnap, const float *f, float *out)
{
    const k3_config *c = &r->model->cfg;
    const size_t E = (size_t)c->hidden;
    for (size_t j = 0; j < nsnap; j++) r->s.src[j] = r->s.snap + (t * r->s.max_src + j) * E;
    r->s.src[nsnap] = r->s.P + t * E;
    op_attnres(out, r->s.src, nsnap + 1, f, E, c->rms_eps);
}

/* Logits that are not finite mean overflow somewhere in the weights or the
 * configuration: no token may be chosen from them.  The scan is integer
 * arithmetic the compiler vectorises: a masked exponent field plus one
 * carries into bit 31 only when it is all ones (infinity or NaN). */
int k3_check_finite(const k3_run *r, const float *logits, size_t rows, size_t pos, krun_err *err)
{
    const size_t V = (size_t)r->model->cfg.vocab, n = rows * V;
    uint32_t acc[16] = {0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) {
            uint32_t u;
            memcpy(&u, &logits[i + (size_t)j], 4);
            acc[j] |= (u & 0x7f800000u) + 0x00800000u;
        }
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, &logits[i], 4);
        acc[0] |= (u & 0x7f800000u) + 0x00800000u;
    }
    for (int j = 1; j < 16; j++) acc[0] |= acc[j];
    if (!(acc[0] & 0x80000000u)) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(logits[i])) {
            krun_err_set(err, KRUN_EDATA,
                         "%s: the logits at position %zu are not finite (%s at token id %zu): the model's weights or "
                         "configuration overflow float; no token computed from them is used",
                         kpk_path(r->model->file), pos + i / V, isnan(logits[i]) ? "NaN" : "infinity", i % V);
            break;
        }
    return -1;
}

/* ---- the forward pass ------------------------------------------------------- */

/* Check the segments and lay them out as one block: segment g is rows
 * [row0[g], row0[g] + n) of every activation, its tokens in s->ids. */
static int make_block(k3_run *r, const k3_seg *segs, size_t nseg, k3_block *b, krun_err *err)
{
    const size_t V = (size_t)r->model->cfg.vocab;
    k3_scratch *s = &r->s;
    size_t jn = 0, jrows = 0;
    b->T = 0;
    b->nseg = nseg;
    b->seg = segs;
    if (nseg == 0 || nseg > s->S) { krun_err_set(err, KRUN_EINPUT, "%zu sequences in one block (1..%zu)", nseg, s->S); return -1; }
    for (size_t g = 0; g < nseg; g++) {
        const k3_seg *sg = &segs[g];
        if (sg->n == 0) { krun_err_set(err, KRUN_EINPUT, "no tokens to process"); return -1; }
        if (sg->st->pos + sg->n > sg->st->ctx) {
            krun_err_set(err, KRUN_EINPUT, "context full: %zu positions reserved, %zu needed (give a larger --ctx)",
                         sg->st->ctx, sg->st->pos + sg->n);
            return -1;
        }
        for (size_t h = 0; h < g; h++)
            if (segs[h].st == sg->st) { krun_err_set(err, KRUN_EINPUT, "one sequence twice in a block"); return -1; }
        if (sg->snap && (sg->journal || sg->snap->at < 1 || sg->snap->at > sg->n)) {
            krun_err_set(err, KRUN_EINPUT, "a snapshot after position %zu of a %s segment of %zu", sg->snap->at,
                         sg->journal ? "journaled" : "", sg->n);
            return -1;
        }
        if (r->pager && sg->snap)
            return krun_err_set(err, KRUN_EINPUT, "a prefix-cache snapshot in a block whose states are paged to disk (not supported: "
                                "statepage.h)");
        if (sg->journal) {
            /* the block's verifications share the journal's rows, in block order */
            if (jn + 1 > r->j.max_segs || sg->n > r->j.cap - jrows) {
                krun_err_set(err, KRUN_EINPUT, "verification blocks of %zu positions in %zu sequences: the journal holds %zu "
                             "positions in at most %zu sequences (spec)", jrows + sg->n, jn + 1, r->j.cap, r->j.max_segs);
                return -1;
            }
            b->jrow[g] = jrows;
            b->jidx[g] = jn++;
            jrows += sg->n;
        }
        if (b->T + sg->n > s->T) { krun_err_set(err, KRUN_EINPUT, "%zu positions in one block (at most %zu)", b->T + sg->n, s->T); return -1; }
        for (size_t i = 0; i < sg->n; i++) {
            if (sg->ids[i] < 0 || (size_t)sg->ids[i] >= V) {
                krun_err_set(err, KRUN_EINPUT, "token id %d is outside the vocabulary (0..%zu)", sg->ids[i], V - 1);
                return -1;
            }
            s->ids[b->T + i] = sg->ids[i];
        }
        b->row0[g] = b->T;
        b->T += sg->n;
    }
    return 0;
}

/* §4.9: the model-level aggregator, the final norm and lm_head, for the
 * positions whose logits are wanted: every position of an all_positions
 * segment, else the segment's last.  The rows of an all_positions segment go
 * straight into its buffer; the last rows of the others are gathered so that
 * lm_head is read once for all of them. */
static int output(k3_run *r, const k3_block *b, size_t nsnap, krun_err *err)
{
    const k3_config *c = &r->model->cfg;
    const size_t E = (size_t)c->hidden, V = (size_t)c->vocab;
    const k3_vecs *g = k3_weights_vecs(&r->w, K3_GLOBALS);
    const k3_role head = ABLATED(LM_HEAD_TIED) ? K3T_EMBED : K3T_LM_HEAD;
    k3_scratch *s = &r->s;
    wcall calls[K3_MAX_SEQS + 1];
    size_t ng = 0, nc = 0, last = 0;
    for (size_t k = 0; k < b->nseg; k++) {
        const k3_seg *sg = &b->seg[k];
        for (size_t t = sg->all_positions ? b->row0[k] : b->row0[k] + sg->n - 1; t < b->row0[k] + sg->n; t++) {
            if (ABLATED(NO_OUTPUT_AGGREGATOR)) memcpy(s->a + t * E, s->P + t * E, E * sizeof *s->a);
            else attnres(r, t, nsnap, g->f_out, s->a + t * E);
            op_rmsnorm(s->xn + t * E, s->a + t * E, g->final_norm, E, c->rms_eps);
        }
        if (sg->all_positions) {
            calls[nc++] = (wcall){s->xn + b->row0[k] * E, E, sg->n, sg->journal ? r->j.logits + b->jrow[k] * V : sg->logits, V};
        } else {
            memcpy(s->xg + ng++ * E, s->xn + (b->row0[k] + sg->n - 1) * E, E * sizeof *s->xg);
            last = k;
        }
    }
    /* the last rows of the other segments, gathered: one row (a single
     * sequence) straight into its buffer */
    if (ng) calls[nc++] = (wcall){s->xg, E, ng, ng == 1 ? b->seg[last].logits : s->lg, V};
    /* lm_head read once for every row wanted (it may stream in pieces) */
    if (k3_weights_begin(&r->w, K3_GLOBALS, err)) return -1;
    wmatmul_many(r->pool, &r->w, K3_GLOBALS, head, calls, nc);
    if (k3_weights_end(&r->w, K3_GLOBALS, err)) return -1;
    ng = 0;
    for (size_t k = 0; k < b->nseg; k++) {
        const k3_seg *sg = &b->seg[k];
        if (sg->all_positions) {
            /* a verification block checks only the rows it keeps (session.c): a rejected
             * draft's logits are never used, and a plain run would not compute them */
            if (!sg->journal && k3_check_finite(r, sg->logits, sg->n, sg->st->pos, err)) return -1;
        } else {
            const float *row = calls[nc - 1].Y + ng++ * V;
            if (k3_check_finite(r, row, 1, sg->st->pos + sg->n - 1, err)) return -1;
            if (row != sg->logits) memcpy(sg->logits, row, V * sizeof *sg->logits);
        }
    }
    return 0;
}

/* ---- paged states' commits (journal.h) ---- */

/* The deferred commits the block replays, in d (the journal's list emptied for the block's own):
 * a state whose position moved since (reset) drops its commit; one the block does not hold has
 * it replayed now, on its own pass of the pager over the layers (no rows computed). */
static int take_deferred(k3_run *r, const k3_seg *segs, size_t nseg, k3_journal *d, krun_err *err)
{
    const k3_config *c = &r->model->cfg;
    k3_journal *j = &r->j;
    k3_state *alone[K3_JOURNAL_MAX_SEGS];
    size_t none[K3_JOURNAL_MAX_SEGS] = {0}, row[K3_JOURNAL_MAX_SEGS], keep[K3_JOURNAL_MAX_SEGS], na = 0;
    d->n_def = 0;
    for (size_t i = 0; i < j->n_def; i++) {
        k3_state *st = j->def_st[i];
        size_t g = 0;
        if (st->pos != j->def_pos[i]) continue;
        while (g < nseg && segs[g].st != st) g++;
        if (g < nseg) {
            d->def_st[d->n_def] = st;
            d->def_row[d->n_def] = j->def_row[i];
            d->def_keep[d->n_def++] = j->def_keep[i];
        } else {
            alone[na] = st;
            row[na] = j->def_row[i];
            keep[na++] = j->def_keep[i];
        }
    }
    j->n_def = 0;
    if (!na) return 0;
    if (k3_pager_block_begin(r->pager, alone, none, na, err)) return -1;
    for (int L = 0; L < c->n_layers; L++) {
        if (k3_pager_layer_begin(r->pager, L, err)) return -1;
        for (size_t i = 0; i < na && !c->layer_is_mla[L]; i++) kda_commit(r, L, alone[i], row[i], keep[i]);
        k3_pager_layer_end(r->pager, L);
    }
    return k3_pager_block_end(r->pager, err);
}

static int forward_block(k3_run *r, const k3_seg *segs, size_t nseg, krun_err *err)
{
    const k3_config *c = &r->model->cfg;
    const size_t E = (size_t)c->hidden;
    k3_scratch *s = &r->s;
    k3_block b;
    size_t nsnap = 0;
    int prefix_empty = 0, here;
    k3_journal def;            /* paged states' commits this block replays (journal.h) */

    def.n_def = 0;
    if (make_block(r, segs, nseg, &b, err) || (r->j.n_def && take_deferred(r, segs, nseg, &def, err)) ||
        k3_remote_block(r, segs, nseg, err) || k3_weights_step_begin(&r->w, err))
        return -1;
    if (r->pager) {
        /* paged states: layer 0 of the block's sequences is read while the embedding rows are */
        k3_state *sts[K3_MAX_SEQS];
        size_t news[K3_MAX_SEQS];
        for (size_t k = 0; k < nseg; k++) { sts[k] = segs[k].st; news[k] = segs[k].n; }
        if (k3_pager_block_begin(r->pager, sts, news, nseg, err)) return -1;
    }

    /* §4.3: the embedding is the first hidden state; no scaling, no positions (where the globals are) */
    for (size_t t = 0; t < b.T && k3_here(r->model, K3_GLOBALS); t++)
        if (embed_row(r, s->ids[t], s->P + t * E, err)) return -1;

    for (int L = 0; L < c->n_layers; L++) {
        const k3_vecs *w;
        const float *f_attn, *f_mlp;
        /* a layer another rank holds runs there, the block's hidden state with it (remote.h) */
        if ((here = k3_remote_stage(r, L, &b, &nsnap, &prefix_empty, err)) <= 0) {
            if (here < 0) return -1;
            continue;
        }
        /* layer L's weights: held whole, or streamed in pieces under the seam (weights.h) */
        if (k3_weights_begin(&r->w, L, err)) return -1;
        /* and, paged, the block's states of layer L (layer L+1's are read while it runs) */
        if (r->pager && k3_pager_layer_begin(r->pager, L, err)) {
            k3_weights_end(&r->w, L, &(krun_err){0, {0}});
            return -1;
        }
        for (size_t i = 0; i < def.n_def && !c->layer_is_mla[L]; i++) kda_commit(r, L, def.def_st[i], def.def_row[i], def.def_keep[i]);
        w = k3_weights_vecs(&r->w, L);
        f_attn = ABLATED(ATTNRES_FOLDS_SWAPPED) ? w->f_mlp : w->f_attn;
        f_mlp = ABLATED(ATTNRES_FOLDS_SWAPPED) ? w->f_attn : w->f_mlp;

        /* §4.4 steps 1-2: a = AR(B, P) over the snapshots and the prefix (h = P here);
         * with no snapshot yet (layer 0) a = h. */
        for (size_t t = 0; t < b.T; t++) {
            if (nsnap == 0) memcpy(s->a + t * E, s->P + t * E, E * sizeof *s->a);
            else attnres(r, t, nsnap, f_attn, s->a + t * E);
        }
        /* step 3: at a block boundary the prefix becomes a snapshot and is cleared */
        if (L % c->attn_res_block == 0 && !(ABLATED(ATTNRES_NO_EMBED_SOURCE) && L == 0)) {
            for (size_t t = 0; t < b.T; t++) memcpy(s->snap + (t * s->max_src + nsnap) * E, s->P + t * E, E * sizeof *s->P);
            nsnap++;
            prefix_empty = !ABLATED(ATTNRES_NO_CLEAR);
        }
        /* while attention runs, the disks read the experts the router is likely to choose (predict.h) */
        k3_predict_experts(r, L, &b, nsnap);
        /* step 4: attention on the normalised aggregate, each segment on its own state */
        for (size_t t = 0; t < b.T; t++) op_rmsnorm(s->xn + t * E, s->a + t * E, w->in_ln, E, c->rms_eps);
        if (c->layer_is_mla[L]) mla_forward(r, L, &b, s->xn, s->y);
        else kda_forward(r, L, &b, s->xn, s->y);
        /* step 5 */
        if (prefix_empty) memcpy(s->P, s->y, b.T * E * sizeof *s->P);
        else for (size_t i = 0; i < b.T * E; i++) s->P[i] = s->P[i] + s->y[i];
        prefix_empty = 0;
        /* step 6: m = AR(B, P), unconditionally */
        for (size_t t = 0; t < b.T; t++) {
            attnres(r, t, nsnap, f_mlp, s->a + t * E);
            op_rmsnorm(s->xn + t * E, s->a + t * E, w->post_ln, E, c->rms_eps);
        }
        /* step 7: the FFN; the MoE fetches the union of the block's experts once */
        if (!k3_layer_is_moe(c, L)) dense_ffn_forward(r, L, b.T, s->xn, s->y);
        else if (moe_forward(r, L, b.T, s->xn, s->y, err)) {
            k3_weights_end(&r->w, L, &(krun_err){0, {0}});
            return krun_err_prefix(err, "layer %d: ", L);
        }
        /* step 8: the next layer's h is P */
        if (r->tap && ABLATED(DRAFT_TAP_BEFORE_FFN)) r->tap(r->tap_ctx, L, s->P, b.T, s->taps);
        for (size_t i = 0; i < b.T * E; i++) s->P[i] = s->P[i] + s->y[i];
        /* a drafter's taps: P as it leaves the layer (a hook: run/draft sets it, K3_EAGLE.md §2) */
        if (r->tap && !ABLATED(DRAFT_TAP_BEFORE_FFN)) r->tap(r->tap_ctx, L, ABLATED(DRAFT_TAP_MIXTURE) ? s->a : s->P, b.T, s->taps);
        /* fails when anything read for the layer was bad: its results must not be used */
        if (k3_weights_end(&r->w, L, err)) return -1;
        if (r->pager) k3_pager_layer_end(r->pager, L);          /* written back while layer L+1 runs */
        for (size_t k = 0; k < nseg; k++)
            if (segs[k].snap && segs[k].snap->layer_done) segs[k].snap->layer_done(segs[k].snap->ctx, L);
        if (r->on_layer) r->on_layer(r->on_layer_ctx, L + 1, c->n_layers);
    }

    /* the output where the globals are: the hidden state comes back there (remote.h) */
    if ((here = k3_remote_stage(r, c->n_layers, &b, &nsnap, &prefix_empty, err)) < 0 || (here && output(r, &b, nsnap, err)))
        return -1;
    /* the last layers' states are written while lm_head runs; the block is done when they are */
    if (r->pager && k3_pager_block_end(r->pager, err)) return -1;
    r->j.n_segs = 0;
    for (size_t k = 0; k < nseg; k++) {
        if (!segs[k].journal) { segs[k].st->pos += segs[k].n; continue; }
        /* k3_commit advances the state */
        r->j.seg_st[r->j.n_segs] = segs[k].st;
        r->j.seg_row[r->j.n_segs] = b.jrow[k];
        r->j.seg_n[r->j.n_segs++] = segs[k].n;
    }
    return 0;
}

int k3_forward(k3_run *r, const k3_seg *segs, size_t nseg, krun_err *err)
{
    int rc = forward_block(r, segs, nseg, err);
    /* after the block's last read, before anything computed in it is used: was every byte it read
     * the file's as it was opened?  (A file changed under the process also explains a failure.) */
    if (k3_weights_step_check(&r->w, err)) return -1;
    return rc;
}

/* The journal entry of st's verification in the last block, or -1. */
static long journal_seg(const k3_run *r, const k3_state *st)
{
    for (size_t i = 0; i < r->j.n_segs; i++)
        if (r->j.seg_st[i] == st) return (long)i;
    return -1;
}

const float *k3_block_embedding(const k3_run *r, size_t row)
{
    /* §4.4: B[0] is the token embedding, pushed at layer 0 (a boundary) */
    return r->s.snap + row * r->s.max_src * (size_t)r->model->cfg.hidden;
}

const float *k3_journal_logits(const k3_run *r, const k3_state *st)
{
    long i = journal_seg(r, st);
    return i < 0 ? NULL : r->j.logits + r->j.seg_row[i] * (size_t)r->model->cfg.vocab;
}

void k3_commit(k3_run *r, k3_state *st, size_t keep)
{
    const k3_config *c = &r->model->cfg;
    long i = journal_seg(r, st);
    if (i < 0 || keep < 1 || keep > r->j.seg_n[i]) abort();   /* a caller's bug: the state would be wrong */
    if (r->remote) r->remote->commit(r->remote->ctx, r, st, keep);   /* the other ranks' layers (remote.h) */
    st->pos += keep;
    if (st->pager) {
        /* on disk: replayed as the next block brings its layers in (journal.h; paged states keep
         * every layer on this rank: ranks.c) */
        r->j.def_st[r->j.n_def] = st;
        r->j.def_row[r->j.n_def] = r->j.seg_row[i];
        r->j.def_keep[r->j.n_def] = keep;
        r->j.def_pos[r->j.n_def++] = st->pos;
    } else {
        for (int L = 0; L < c->n_layers; L++)
            if (!c->layer_is_mla[L] && k3_here(r->model, L)) kda_commit(r, L, st, r->j.seg_row[i], keep);
    }
    r->j.seg_st[i] = NULL;                                    /* committed once */
}
