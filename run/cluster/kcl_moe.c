/* A MoE layer's routed experts over several ranks: kcl_moe.h. */
#include "kcl_moe.h"

#include "run/store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE 0xff

/* An answer's header (tag EXO); rows and error text follow as a message of their own. */
enum { EXO_ROWS = 0, EXO_DONE = 1, EXO_ERROR = 2 };
typedef struct exo_hdr { int32_t kind, expert, nrows, code; } exo_hdr;
/* The rows message's header (tag EXROWS); npos < 0: the request is taken back. */
typedef struct rows_hdr { int32_t L, npos, nexp, nrows; } rows_hdr;

struct kcl_moe {
    const k3_model *m;
    k3_run *run;
    int nranks, me, nm;
    int n_stripe;                 /* stripe members: the disks an expert of the stripe space is spread over */
    uint64_t *holders;            /* [NL][Ne] */
    uint16_t *member;             /* [NL][Ne]: where each expert's bytes lie (KPK_STRIPED: the stripe space) */
    uint64_t *bytes;              /* [NL][Ne]: its stored bytes */
    uint8_t *last;                /* [NL][Ne]: the rank that computed it last (its cache may hold it), or NONE */
    uint64_t *load;               /* [nranks][nm + 1]: bytes given to each rank's disks in the layer in flight */
    /* the requester's layer in flight */
    int L;
    uint8_t *assign;              /* [Ne]: the rank of each expert of the block */
    int *by_rank;                 /* [Ne]: the remote experts, grouped by rank, each group in id order */
    int at[KCL_MAX_RANKS + 1];    /* group r is by_rank[at[r] .. at[r + 1]) */
    uint8_t asked[KCL_MAX_RANKS], rows_sent[KCL_MAX_RANKS];
    /* the prediction of one layer */
    int pred_L;
    uint8_t *pred;                /* [Ne]: the rank its read-ahead went to, or NONE */
    /* messages: a request, the rows (built by the requester, received by the server) */
    int32_t *q;                   /* [2 + Ne] */
    int32_t *ex;                  /* [Ne]: the request being served */
    int *order;                   /* [Ne]: assign's work list */
    int busy;                     /* serving a request */
    uint8_t *msg;
    size_t msg_cap;
    size_t T;
    uint64_t served, predicted;
};

static size_t rows_bytes(const k3_config *c, size_t T)
{
    return sizeof(rows_hdr) + 4 * ((size_t)c->n_experts + T * (size_t)c->topk) + 16 + T * (size_t)c->latent * 4;
}

uint64_t kcl_moe_bytes(const k3_config *c, size_t T)
{
    const uint64_t per = (uint64_t)c->n_layers * (uint64_t)c->n_experts;
    return per * (8 + 2 + 8 + 1) + (uint64_t)KCL_MAX_RANKS * 257 * 8 + (uint64_t)c->n_experts * (1 + 4 + 1 + 4 + 4 + 4) + 8 +
           rows_bytes(c, T);
}

int kcl_moe_new(const k3_model *m, k3_run *run, const kcl_members *have, int nranks, kcl_moe **out, krun_err *err)
{
    const k3_config *c = &m->cfg;
    const size_t NL = (size_t)c->n_layers, Ne = (size_t)c->n_experts;
    const kpk_file *f = m->file;
    kcl_moe *x = calloc(1, sizeof *x);
    *out = NULL;
    if (!x) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    x->m = m;
    x->run = run;
    x->nranks = nranks;
    x->me = kcl_rank();
    x->nm = kpk_member_count(f);
    x->L = -1;
    x->pred_L = -1;
    x->T = run ? run->T_own : 1;   /* no run: a plan's cost model only (kcl_moe_expect) */
    x->msg_cap = rows_bytes(c, x->T);
    x->holders = calloc(NL * Ne, sizeof *x->holders);
    x->member = calloc(NL * Ne, sizeof *x->member);
    x->bytes = calloc(NL * Ne, sizeof *x->bytes);
    x->last = malloc(NL * Ne);
    x->load = calloc((size_t)nranks * (size_t)(x->nm + 1), sizeof *x->load);
    x->assign = malloc(Ne);
    x->by_rank = malloc(Ne * sizeof *x->by_rank);
    x->pred = malloc(Ne);
    x->q = malloc((2 + Ne) * sizeof *x->q);
    x->ex = malloc(Ne * sizeof *x->ex);
    x->order = malloc(Ne * sizeof *x->order);
    x->msg = malloc(x->msg_cap);
    if (!x->holders || !x->member || !x->bytes || !x->last || !x->load || !x->assign || !x->by_rank || !x->pred || !x->q || !x->ex || !x->order || !x->msg) {
        kcl_moe_free(x);
        return krun_err_set(err, KRUN_ENOMEM, "out of memory for the cluster's expert tables");
    }
    memset(x->last, NONE, NL * Ne);
    for (uint16_t k = 0; k < x->nm; k++) x->n_stripe += kpk_member_at(f, k)->role == KPK_ROLE_STRIPE;
    memset(x->pred, NONE, Ne);
    for (size_t L = 0; L < NL; L++) {
        if (!k3_layer_is_moe(c, (int)L)) continue;
        for (size_t e = 0; e < Ne; e++) {
            int64_t i = k3_expert_extent(m, (int)L, (int)e);
            const kpk_extent *xe;
            uint64_t h = 0;
            if (i < 0) continue;
            xe = kpk_extent_at(f, (uint32_t)i);
            x->member[L * Ne + e] = xe->member;
            x->bytes[L * Ne + e] = xe->stored_len;
            for (int r = 0; r < nranks; r++) {
                int ok = 1;
                if (xe->member != KPK_STRIPED) ok = kcl_has(&have[r], xe->member);
                else
                    for (uint16_t k = 0; k < x->nm; k++)
                        if (kpk_member_at(f, k)->role == KPK_ROLE_STRIPE) ok &= kcl_has(&have[r], k);
                if (ok) h |= 1ull << r;
            }
            x->holders[L * Ne + e] = h;
        }
    }
    *out = x;
    return 0;
}

void kcl_moe_free(kcl_moe *x)
{
    if (!x) return;
    free(x->holders);
    free(x->member);
    free(x->bytes);
    free(x->last);
    free(x->load);
    free(x->assign);
    free(x->by_rank);
    free(x->pred);
    free(x->q);
    free(x->ex);
    free(x->order);
    free(x->msg);
    free(x);
}

uint64_t kcl_moe_holders(const kcl_moe *x, int L, int e) { return x->holders[(size_t)L * (size_t)x->m->cfg.n_experts + (size_t)e]; }

int kcl_moe_unreadable(const kcl_moe *x, int *L, int *e, int *member)
{
    const k3_config *c = &x->m->cfg;
    for (int l = 0; l < c->n_layers; l++) {
        if (!k3_layer_is_moe(c, l)) continue;
        for (int k = 0; k < c->n_experts; k++)
            if (!kcl_moe_holders(x, l, k)) {
                *L = l;
                *e = k;
                *member = x->member[(size_t)l * (size_t)c->n_experts + (size_t)k];
                return 0;
            }
    }
    return -1;
}

void kcl_moe_counts(const kcl_moe *x, uint64_t *served, uint64_t *predicted)
{
    *served = x ? x->served : 0;
    *predicted = x ? x->predicted : 0;
}

/* ---- who computes what ---------------------------------------------------------------- */

static int popcount64(uint64_t v) { return __builtin_popcountll(v); }

/* Give each of ids[0..n) of layer L a rank into out[] (indexed by expert):
 * fewest holders first, then the least loaded disk, then the ties (kcl_moe.h). */
static void assign(kcl_moe *x, int L, const int *ids, size_t n, const uint8_t *sticky, uint8_t *out)
{
    const size_t Ne = (size_t)x->m->cfg.n_experts, W = (size_t)x->nm + 1;
    int *order = x->order;
    size_t no = 0;
    memset(x->load, 0, (size_t)x->nranks * W * sizeof *x->load);
    /* the predicted ones where their reads went, first */
    for (size_t j = 0; j < n; j++) {
        const int e = ids[j];
        const size_t ke = (size_t)L * Ne + (size_t)e;
        const int r = sticky ? sticky[e] : NONE;
        if (r != NONE && r < x->nranks && (x->holders[ke] >> r & 1)) {
            const uint16_t mb = x->member[ke];
            out[e] = (uint8_t)r;
            x->load[(size_t)r * W + (mb == KPK_STRIPED ? W - 1 : mb)] += x->bytes[ke];
        } else {
            order[no++] = e;
        }
    }
    /* fewest holders first (stable: id order within) */
    for (size_t a = 1; a < no; a++) {
        int v = order[a];
        int hv = popcount64(x->holders[(size_t)L * Ne + (size_t)v]);
        size_t b = a;
        while (b > 0 && popcount64(x->holders[(size_t)L * Ne + (size_t)order[b - 1]]) > hv) { order[b] = order[b - 1]; b--; }
        order[b] = v;
    }
    for (size_t j = 0; j < no; j++) {
        const int e = order[j];
        const size_t ke = (size_t)L * Ne + (size_t)e;
        const uint16_t mb = x->member[ke];
        const size_t slot = mb == KPK_STRIPED ? W - 1 : mb;
        /* a stripe spreads an expert over its disks: the cost is the bytes per disk */
        const double width = mb == KPK_STRIPED && x->n_stripe ? (double)x->n_stripe : 1.0;
        int best = -1;
        double best_cost = 0;
        for (int k = 0; k < x->nranks; k++) {
            const int r = (k + e + L) % x->nranks;          /* round the ranks, a different start per expert */
            double cost;
            if (!(x->holders[ke] >> r & 1)) continue;
            cost = (double)(x->load[(size_t)r * W + slot] + x->bytes[ke]) / width;
            if (best < 0 || cost < best_cost ||
                (cost == best_cost && (r == x->me ? best != x->me : best != x->me && r == x->last[ke] && best != x->last[ke]))) {
                best = r;
                best_cost = cost;
            }
        }
        if (best < 0) best = x->me;      /* no holder: refused when the cluster was set up */
        out[e] = (uint8_t)best;
        x->load[(size_t)best * W + slot] += x->bytes[ke];
    }
}

/* ---- the requester ------------------------------------------------------------------- */

int kcl_moe_begin(kcl_moe *x, k3_run *r, int L, int *distinct, size_t *nd, size_t T, krun_err *err)
{
    const size_t n = *nd;
    size_t mine = 0;
    (void)r;
    (void)T;
    x->L = L;
    memset(x->asked, 0, sizeof x->asked);
    memset(x->rows_sent, 0, sizeof x->rows_sent);
    assign(x, L, distinct, n, x->pred_L == L ? x->pred : NULL, x->assign);
    x->pred_L = -1;
    /* the remote ones grouped by rank (each group in id order), the local ones kept in distinct */
    for (int k = 0; k <= x->nranks; k++) x->at[k] = 0;
    for (size_t j = 0; j < n; j++)
        if (x->assign[distinct[j]] != x->me) x->at[x->assign[distinct[j]] + 1]++;
    for (int k = 0; k < x->nranks; k++) x->at[k + 1] += x->at[k];
    {
        int fill[KCL_MAX_RANKS];
        memcpy(fill, x->at, sizeof fill);
        for (size_t j = 0; j < n; j++) {
            const int e = distinct[j], rk = x->assign[e];
            x->last[(size_t)L * (size_t)x->m->cfg.n_experts + (size_t)e] = (uint8_t)rk;
            if (rk == x->me) distinct[mine++] = e;
            else x->by_rank[fill[rk]++] = e;
        }
    }
    *nd = mine;
    /* their reads start now, while this rank computes the latent projection */
    for (int k = 0; k < x->nranks; k++) {
        const int cnt = x->at[k + 1] - x->at[k];
        if (!cnt) continue;
        x->q[0] = L;
        x->q[1] = cnt;
        memcpy(x->q + 2, x->by_rank + x->at[k], (size_t)cnt * sizeof *x->q);
        if (kcl_send(k, KCL_EXQ, x->q, (size_t)(2 + cnt) * sizeof *x->q, err)) return -1;
        x->asked[k] = 1;
    }
    return 0;
}

/* Rank k's rows message in x->msg: the positions that chose any of its
 * experts, once each, and each expert's rows as indices into them. */
static size_t build_rows(kcl_moe *x, k3_run *r, int k, size_t T)
{
    const k3_config *c = &x->m->cfg;
    const size_t kk = (size_t)c->topk, Lt = (size_t)c->latent;
    const int *ex = x->by_rank + x->at[k];
    const int nexp = x->at[k + 1] - x->at[k];
    rows_hdr *h = (rows_hdr *)(void *)x->msg;
    int32_t *nrows = (int32_t *)(void *)(h + 1), *pos = nrows + nexp, *slot_of = r->s.moe.rows;   /* rows: [T k] ints, free now */
    size_t npos = 0, nr = 0;
    float *rows;
    for (size_t t = 0; t < T; t++) slot_of[t] = -1;
    for (int j = 0; j < nexp; j++) {
        int cnt = 0;
        for (size_t i = 0; i < T * kk; i++) {
            size_t t = i / kk;
            if (r->s.moe.idx[i] != ex[j]) continue;
            if (slot_of[t] < 0) slot_of[t] = (int)npos++;
            pos[nr++] = slot_of[t];
            cnt++;
        }
        nrows[j] = cnt;
    }
    rows = (float *)(void *)(x->msg + ((sizeof *h + 4 * ((size_t)nexp + nr) + 15) & ~(size_t)15));
    for (size_t t = 0; t < T; t++)
        if (slot_of[t] >= 0) memcpy(rows + (size_t)slot_of[t] * Lt, r->s.moe.zeta + t * Lt, Lt * sizeof *rows);
    *h = (rows_hdr){x->L, (int32_t)npos, nexp, (int32_t)nr};
    return (size_t)((uint8_t *)(rows + npos * Lt) - x->msg);
}

int kcl_moe_rows(kcl_moe *x, k3_run *r, int L, size_t T, krun_err *err)
{
    (void)L;                      /* (the layer in flight, x->L, is in the rows' header) */
    for (int k = 0; k < x->nranks; k++) {
        if (!x->asked[k]) continue;
        if (kcl_send(k, KCL_EXROWS, x->msg, build_rows(x, r, k, T), err)) return -1;
        x->rows_sent[k] = 1;
    }
    return 0;
}

/* Rank k's answer: each expert's rows into the block's (position, choice)
 * rows (into nothing when keep is 0), until its last header.  -1 with err
 * when it failed or could not be heard. */
static int take_answer(kcl_moe *x, k3_run *r, int k, size_t T, int keep, krun_err *err)
{
    const k3_config *c = &x->m->cfg;
    const size_t kk = (size_t)c->topk, Lt = (size_t)c->latent;
    float *xe = r->s.moe.xe;
    for (;;) {
        exo_hdr h;
        size_t len;
        int rc = kcl_get(k, KCL_EXO, &h, sizeof h, NULL, err);
        if (rc) return rc > 0 ? krun_err_set(err, KRUN_EINPUT, "cluster: interrupted while waiting for %s", kcl_who(k)) : -1;
        if (h.kind == EXO_DONE) return 0;
        if (h.kind == EXO_ERROR) {
            char text[900];
            if (kcl_get(k, KCL_EXO, text, sizeof text - 1, &len, err)) return -1;
            text[len] = 0;
            return krun_err_set(err, h.code == KRUN_EDATA ? KRUN_EDATA : h.code == KRUN_ENOMEM ? KRUN_ENOMEM : KRUN_EINPUT,
                                "%s: %s", kcl_who(k), text);
        }
        if (h.kind != EXO_ROWS || h.nrows < 1 || (size_t)h.nrows > T || h.expert < 0 || h.expert >= c->n_experts) {
            krun_err_set(err, KRUN_EINPUT, "cluster: %s answered out of turn (kind %d, %d rows)", kcl_who(k), h.kind, h.nrows);
            kcl_fail(err);
            return -1;
        }
        if (kcl_get(k, KCL_EXO, xe, (size_t)h.nrows * Lt * sizeof *xe, NULL, err)) return -1;
        if (!keep) continue;
        {
            int n = 0;
            for (size_t i = 0; i < T * kk && n < h.nrows; i++)
                if (r->s.moe.idx[i] == h.expert) memcpy(r->s.moe.slots + i * Lt, xe + (size_t)(n++) * Lt, Lt * sizeof *xe);
            if (n != h.nrows) {
                krun_err_set(err, KRUN_EINPUT, "cluster: %s sent %d rows of expert %d, the block has %d", kcl_who(k), h.nrows,
                             h.expert, n);
                kcl_fail(err);
                return -1;
            }
        }
    }
}

int kcl_moe_end(kcl_moe *x, k3_run *r, int L, size_t T, int failed, krun_err *err)
{
    krun_err mine;
    int bad = failed;
    for (int k = 0; k < x->nranks; k++) {
        krun_err *e = bad ? &mine : err;
        if (!x->asked[k]) continue;
        x->asked[k] = 0;
        if (!x->rows_sent[k]) {
            rows_hdr cancel = {L, -1, 0, 0};
            if (kcl_send(k, KCL_EXROWS, &cancel, sizeof cancel, e)) { bad = 1; continue; }
        }
        /* every answer is taken whole, kept or not, so that nothing of it is left for the next layer */
        if (take_answer(x, r, k, T, !bad, e)) bad = 1;
    }
    return bad ? -1 : 0;
}

size_t kcl_moe_predict(kcl_moe *x, k3_run *r, int L, const int *experts, size_t n)
{
    const size_t Ne = (size_t)x->m->cfg.n_experts;
    uint32_t local[256];
    size_t nl = 0, started = 0;
    krun_err e;
    if (n > 256) n = 256;
    memset(x->pred, NONE, Ne);
    assign(x, L, experts, n, NULL, x->pred);
    x->pred_L = L;
    /* most likely first, as the router ranks them: each rank gets its share in that order */
    for (int k = 0; k < x->nranks; k++) {
        int cnt = 0;
        for (size_t j = 0; j < n; j++) {
            if (x->pred[experts[j]] != k) continue;
            if (k == x->me) {
                int64_t id = k3_expert_extent(x->m, L, experts[j]);
                if (id >= 0) local[nl++] = (uint32_t)id;
            } else {
                x->q[2 + cnt++] = experts[j];
            }
        }
        if (k == x->me || !cnt) continue;
        x->q[0] = L;
        x->q[1] = cnt;
        /* only a guess: a failed send is noticed where it matters, at the request */
        if (kcl_send(k, KCL_PRED, x->q, (size_t)(2 + cnt) * sizeof *x->q, &e) == 0) started += (size_t)cnt;
    }
    return started + (nl ? kstore_experts_predict(r->store, local, nl) : 0);
}

/* ---- what a layer costs, expected (the cluster's plan) ------------------------------------- */

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kcl_moe_expect(kcl_moe *x, int requester, int L, size_t positions, double drive_bps, int samples, kcl_moe_cost *out)
{
    const k3_config *c = &x->m->cfg;
    const size_t Ne = (size_t)c->n_experts, k = (size_t)c->topk, W = (size_t)x->nm + 1;
    const int me = x->me;
    uint64_t seed = 0x6b706b2d636c7573ull ^ (uint64_t)L;   /* the same draws on every run: a plan is reproducible */
    uint8_t *used = calloc(Ne, 1), *pos_rank = calloc(positions * (size_t)x->nranks, 1);
    int *chosen = malloc(positions * k * sizeof *chosen);
    memset(out, 0, sizeof *out);
    if (!used || !pos_rank || !chosen || samples < 1) { free(used); free(pos_rank); free(chosen); return; }
    x->me = requester;
    for (int smp = 0; smp < samples; smp++) {
        size_t nd = 0;
        double slowest = 0;
        uint8_t asked[KCL_MAX_RANKS] = {0};
        memset(used, 0, Ne);
        memset(pos_rank, 0, positions * (size_t)x->nranks);
        /* each position chooses k distinct experts, uniformly (the release's routing is balanced) */
        for (size_t p = 0; p < positions; p++)
            for (size_t j = 0; j < k; j++) {
                int e, dup;
                do {
                    e = (int)(mix(&seed) % Ne);
                    dup = 0;
                    for (size_t q = 0; q < j; q++) dup |= chosen[p * k + q] == e;
                } while (dup);
                chosen[p * k + j] = e;
                used[e] = 1;
            }
        for (size_t e = 0; e < Ne; e++)
            if (used[e]) x->order[nd++] = (int)e;
        memcpy(x->by_rank, x->order, nd * sizeof *x->by_rank);     /* assign reorders x->order */
        assign(x, L, x->by_rank, nd, NULL, x->assign);
        for (int r = 0; r < x->nranks; r++)
            for (size_t sl = 0; sl < W; sl++) {
                const double width = sl == W - 1 && x->n_stripe ? (double)x->n_stripe : 1.0;
                const double t = (double)x->load[(size_t)r * W + sl] / (width * drive_bps);
                out->bytes[r] += (double)x->load[(size_t)r * W + sl] / samples;
                if (t > slowest) slowest = t;
            }
        out->seconds += slowest / samples;
        for (size_t j = 0; j < nd; j++) {
            const int rk = x->assign[x->by_rank[j]];
            if (rk != requester) { out->remote_experts += 1.0 / samples; asked[rk] = 1; }
        }
        for (size_t p = 0; p < positions; p++)
            for (size_t j = 0; j < k; j++) {
                const int rk = x->assign[chosen[p * k + j]];
                if (rk != requester && !pos_rank[p * (size_t)x->nranks + (size_t)rk]) {
                    pos_rank[p * (size_t)x->nranks + (size_t)rk] = 1;
                    out->remote_rows += 1.0 / samples;
                }
            }
        for (int r = 0; r < x->nranks; r++) out->remote_ranks += asked[r] / (double)samples;
        out->rows_per_expert += (double)(positions * k) / (double)nd / samples;
    }
    x->me = me;
    free(used);
    free(pos_rank);
    free(chosen);
}

/* ---- the server -------------------------------------------------------------------------- */

static int send_status(int to, int kind, int code, const char *text, krun_err *err)
{
    exo_hdr h = {kind, -1, 0, code};
    if (kcl_send(to, KCL_EXO, &h, sizeof h, err)) return -1;
    return kind == EXO_ERROR ? kcl_send(to, KCL_EXO, text, strlen(text), err) : 0;
}

/* The requested experts of layer L for `from`: read (a batch at a time),
 * computed on the rows it sends, each answered as it is done. */
static int serve_request(kcl_moe *x, int from, int L, const int32_t *ex, int n, krun_err *err)
{
    k3_run *r = x->run;
    const k3_config *c = &x->m->cfg;
    k3_moe_scratch *s = &r->s.moe;
    const size_t Lt = (size_t)c->latent, eb = k3_run_expert_batch(r);
    size_t len, out = 0;
    int src, rc, nb0 = n < (int)eb ? n : (int)eb;
    const rows_hdr *h;
    const int32_t *nrows, *pos;
    const float *rows;
    krun_err fail = {0, {0}};
    int failed = 0;
    memcpy(s->distinct, ex, (size_t)n * sizeof *ex);
    /* the reads start before the rows arrive */
    if (k3_weights_experts_request(&r->w, L, s->distinct, (size_t)nb0, s->extent, &fail)) { failed = 1; nb0 = 0; }
    rc = kcl_wait(1ull << from, KCL_EXROWS, &src, &len, err);
    if (rc == 0) rc = kcl_recv(from, KCL_EXROWS, x->msg, x->msg_cap, len, err);
    if (rc) {
        if (nb0) k3_weights_experts_release(&r->w, L, s->distinct, (size_t)nb0);
        return rc < 0 ? -1 : 0;    /* interrupted: rank 0 has orders; the request is dropped */
    }
    h = (const rows_hdr *)(const void *)x->msg;
    if (h->npos < 0) {             /* taken back */
        if (nb0) k3_weights_experts_release(&r->w, L, s->distinct, (size_t)nb0);
        return send_status(from, EXO_DONE, 0, "", err);
    }
    nrows = (const int32_t *)(const void *)(h + 1);
    pos = nrows + n;
    rows = (const float *)(const void *)(x->msg + ((sizeof *h + 4 * ((size_t)n + (size_t)h->nrows) + 15) & ~(size_t)15));
    if (h->L != L || h->nexp != n || (size_t)h->npos > r->T_own) {
        if (nb0) k3_weights_experts_release(&r->w, L, s->distinct, (size_t)nb0);
        krun_err_set(err, KRUN_EINPUT, "cluster: %s sent rows that do not match its request", kcl_who(from));
        kcl_fail(err);
        return -1;
    }
    for (int b0 = 0; b0 < n && !failed; b0 += (int)eb) {
        const int nb = n - b0 < (int)eb ? n - b0 : (int)eb;
        if (b0 && k3_weights_experts_request(&r->w, L, s->distinct + b0, (size_t)nb, s->extent, &fail)) { failed = 1; break; }
        for (int q = 0; q < nb && !failed; q++) {
            const int j = b0 + q, cnt = nrows[j];
            size_t first = 0;
            exo_hdr oh = {EXO_ROWS, ex[j], cnt, 0};
            for (int i = 0; i < j; i++) first += (size_t)nrows[i];
            if (k3_weights_expert_ready(&r->w, L, s->extent[q], &s->bound[q], &fail)) { failed = 1; break; }
            for (int i = 0; i < cnt; i++) memcpy(s->xe + (size_t)i * Lt, rows + (size_t)pos[first + (size_t)i] * Lt, Lt * sizeof *s->xe);
            moe_expert_apply(r, &s->bound[q], s->xe, (size_t)cnt);
            /* kept in the slots until sent: the next expert is computed meanwhile */
            memcpy(s->slots + out * Lt, s->xe, (size_t)cnt * Lt * sizeof *s->xe);
            if (kcl_send(from, KCL_EXO, &oh, sizeof oh, err) ||
                kcl_post(from, KCL_EXO, s->slots + out * Lt, (size_t)cnt * Lt * sizeof *s->xe, err)) {
                k3_weights_experts_release(&r->w, L, s->distinct + b0, (size_t)nb);
                return -1;
            }
            out += (size_t)cnt;
            x->served++;
        }
        k3_weights_experts_release(&r->w, L, s->distinct + b0, (size_t)nb);
    }
    if (kcl_flush(err)) return -1;
    if (failed) {
        char text[900];
        snprintf(text, sizeof text, "layer %d: %s", L, fail.msg);
        return send_status(from, EXO_ERROR, fail.code, text, err);
    }
    return send_status(from, EXO_DONE, 0, "", err);
}

int kcl_moe_serve(void *ctx, int from, int tag, krun_err *err)
{
    kcl_moe *x = ctx;
    const k3_config *c = &x->m->cfg;
    size_t len;
    int32_t *q = x->q;
    if (!kcl_pending(from, tag, &len) || kcl_recv(from, tag, q, (2 + (size_t)c->n_experts) * sizeof *q, len, err)) return -1;
    if (len < 2 * sizeof *q || q[0] < 0 || q[0] >= c->n_layers || !k3_layer_is_moe(c, q[0]) || q[1] < 1 ||
        q[1] > c->n_experts || len != (size_t)(2 + q[1]) * sizeof *q) {
        krun_err_set(err, KRUN_EINPUT, "cluster: a malformed expert request from %s", kcl_who(from));
        kcl_fail(err);
        return -1;
    }
    for (int j = 0; j < q[1]; j++)
        if (q[2 + j] < 0 || q[2 + j] >= c->n_experts) {
            krun_err_set(err, KRUN_EINPUT, "cluster: %s asked for expert %d of %d", kcl_who(from), q[2 + j], c->n_experts);
            kcl_fail(err);
            return -1;
        }
    if (tag == KCL_PRED) {
        uint32_t ids[256];
        size_t n = 0;
        for (int j = 0; j < q[1] && n < 256; j++) {
            int64_t id = k3_expert_extent(x->m, q[0], q[2 + j]);
            if (id >= 0) ids[n++] = (uint32_t)id;
        }
        x->predicted += n;
        kstore_experts_predict(x->run->store, ids, n);
        return 0;
    }
    if (x->busy) {
        krun_err_set(err, KRUN_EINPUT, "cluster: %s asked for experts while another request was being served", kcl_who(from));
        kcl_fail(err);
        return -1;
    }
    {
        /* the list is copied: x->q is reused (a prediction) while it is served */
        int rc;
        memcpy(x->ex, q + 2, (size_t)q[1] * sizeof *x->ex);
        x->busy = 1;
        rc = serve_request(x, from, q[0], x->ex, q[1], err);
        x->busy = 0;
        return rc;
    }
}
