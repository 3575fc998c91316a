/* This process's part of a cluster run: kcl_node.h. */
#include "kcl_node.h"

#include "run/store/store.h"

#include <stdlib.h>
#include <string.h>

/* rank 0's orders (tag OP) */
enum { OP_STOP = KCL_STOP, OP_ABORT, OP_FORWARD, OP_RESET, OP_COPY, OP_COMMIT, OP_NEW, OP_FREE, OP_LAYER_GET, OP_LAYER_PUT, OP_STATS };
typedef struct op_hdr { int32_t op, n, a, b; int64_t x, y; } op_hdr;
/* one segment of a forward block */
typedef struct op_seg { int32_t id, n, journal, all_positions, snap_at, snap_dst; } op_seg;
/* a block's hidden state between stages (tag HID), or (L < 0) a rank's failure sent to rank 0 */
typedef struct hid_hdr { int32_t L, T, nsnap, prefix_empty, code, pad; } hid_hdr;

struct kcl_node {
    const k3_model *m;
    k3_run *run;
    kcl_moe *moe;
    k3_remote remote;
    uint8_t *owner;                 /* [n_layers] */
    uint64_t stage_ranks;           /* ranks that compute some layer (rank 0 among them) */
    int me, nranks;
    size_t ctx;
    /* the sequences' states by id: [0, n_fixed) the session slots, then snapshots */
    k3_state **st;
    size_t n_st, cap_st, n_fixed;
    uint8_t **mine;                 /* [cap_st]: a copy this rank allocated (followers' snapshots) */
    /* a block on a follower */
    uint8_t *msg;                   /* an order's message */
    size_t msg_cap;
    k3_seg segs[K3_MAX_SEQS];
    k3_snap snaps[K3_MAX_SEQS];
    int block_failed;               /* rank 0: a block failed after it was sent; nothing more runs */
    krun_err why;
};

uint64_t kcl_node_bytes(const k3_config *c, size_t T)
{
    return kcl_moe_bytes(c, T) + (uint64_t)c->n_layers + sizeof(op_hdr) + K3_MAX_SEQS * sizeof(op_seg) + T * 4 + 4096;
}

int kcl_node_owner(const kcl_node *n, int L) { return L < 0 || L >= n->m->cfg.n_layers ? 0 : n->owner[L]; }
int kcl_node_staged(const kcl_node *n) { return n->stage_ranks != 1; }

int kcl_node_lost(const kcl_node *n, krun_err *why)
{
    if (kcl_failed(why)) return 1;
    if (n->block_failed && why) *why = n->why;
    return n->block_failed;
}
kcl_moe *kcl_node_moe(kcl_node *n) { return n->moe; }

static long state_id(const kcl_node *n, const k3_state *st)
{
    for (size_t i = 0; i < n->n_st; i++)
        if (n->st[i] == st) return (long)i;
    return -1;
}

/* ---- the seams (remote.h) ----------------------------------------------------------------- */

static int r_block(void *ctx, k3_run *r, const k3_seg *segs, size_t nseg, krun_err *err);
static int r_stage(void *ctx, k3_run *r, int L, const k3_block *b, size_t *nsnap, int *prefix_empty, krun_err *err);
static int r_begin(void *ctx, k3_run *r, int L, int *d, size_t *nd, size_t T, krun_err *err) { return kcl_moe_begin(((kcl_node *)ctx)->moe, r, L, d, nd, T, err); }
static int r_rows(void *ctx, k3_run *r, int L, size_t T, krun_err *err) { return kcl_moe_rows(((kcl_node *)ctx)->moe, r, L, T, err); }
static int r_end(void *ctx, k3_run *r, int L, size_t T, int failed, krun_err *err) { return kcl_moe_end(((kcl_node *)ctx)->moe, r, L, T, failed, err); }
static size_t r_predict(void *ctx, k3_run *r, int L, const int *e, size_t n)
{
    kcl_node *x = ctx;
    /* the layer's owner computes its MoE: only there do the guesses and the choices meet */
    return kcl_node_owner(x, L) == x->me ? kcl_moe_predict(x->moe, r, L, e, n) : 0;
}
static void r_commit(void *ctx, k3_run *r, const k3_state *st, size_t keep);

int kcl_node_new(const k3_model *m, k3_run *run, const kcl_members *have, const uint8_t *owner, k3_state **states,
                 size_t n_fixed, size_t ctx, kcl_node **out, krun_err *err)
{
    const k3_config *c = &m->cfg;
    kcl_node *n = calloc(1, sizeof *n);
    *out = NULL;
    if (!n) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    n->m = m;
    n->run = run;
    n->me = kcl_rank();
    n->nranks = kcl_size();
    n->ctx = ctx;
    n->n_fixed = n->n_st = n_fixed;
    n->cap_st = n_fixed + 64;
    n->owner = malloc((size_t)c->n_layers);
    n->st = calloc(n->cap_st, sizeof *n->st);
    n->mine = calloc(n->cap_st, sizeof *n->mine);
    n->msg_cap = sizeof(op_hdr) + K3_MAX_SEQS * sizeof(op_seg) + run->T_own * 4;
    n->msg = malloc(n->msg_cap);
    if (!n->owner || !n->st || !n->mine || !n->msg) { kcl_node_free(n); return krun_err_set(err, KRUN_ENOMEM, "out of memory"); }
    memcpy(n->owner, owner, (size_t)c->n_layers);
    memcpy(n->st, states, n_fixed * sizeof *states);
    n->stage_ranks = 1;
    for (int L = 0; L < c->n_layers; L++) n->stage_ranks |= 1ull << owner[L];
    if (kcl_moe_new(m, run, have, n->nranks, &n->moe, err)) { kcl_node_free(n); return -1; }
    n->remote = (k3_remote){n, r_block, r_stage, r_begin, r_rows, r_end, r_predict, r_commit};
    *out = n;
    return 0;
}

void kcl_node_free(kcl_node *n)
{
    if (!n) return;
    if (n->run && n->run->remote == &n->remote) n->run->remote = NULL;
    kcl_set_server(NULL, NULL);
    kcl_moe_free(n->moe);
    for (size_t i = 0; n->mine && i < n->cap_st; i++) free(n->mine[i]);
    free(n->mine);
    free(n->st);
    free(n->owner);
    free(n->msg);
    free(n);
}

void kcl_node_attach(kcl_node *n)
{
    n->run->remote = &n->remote;
    kcl_set_server(kcl_moe_serve, n->moe);
}

/* The ranks other than this one that compute some layer. */
static uint64_t others(const kcl_node *n) { return n->stage_ranks & ~(1ull << n->me); }

static int send_op(int to, const op_hdr *h, const void *more, size_t len, krun_err *err)
{
    if (!more || !len) return kcl_send(to, KCL_OP, h, sizeof *h, err);
    /* one message: the header, then the rest */
    {
        uint8_t buf[4096];
        uint8_t *p = sizeof *h + len <= sizeof buf ? buf : malloc(sizeof *h + len);
        int rc;
        if (!p) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
        memcpy(p, h, sizeof *h);
        memcpy(p + sizeof *h, more, len);
        rc = kcl_send(to, KCL_OP, p, sizeof *h + len, err);
        if (p != buf) free(p);
        return rc;
    }
}

/* An order to every other rank that computes layers. */
static int to_stages(kcl_node *n, const op_hdr *h, krun_err *err)
{
    for (int r = 1; r < n->nranks; r++)
        if ((others(n) >> r & 1) && send_op(r, h, NULL, 0, err)) return -1;
    return 0;
}

/* A block that failed after it began on the other ranks: they give it up
 * (their waits are interrupted), and nothing more runs on the cluster. */
static void block_abort(kcl_node *n, const krun_err *why)
{
    op_hdr h = {OP_ABORT, 0, 0, 0, 0, 0};
    krun_err e;
    if (n->block_failed) return;
    n->block_failed = 1;
    n->why = *why;
    for (int r = 1; r < n->nranks; r++) kcl_send(r, KCL_CTRL, &h, sizeof h, &e);
}

static int r_block(void *ctx, k3_run *r, const k3_seg *segs, size_t nseg, krun_err *err)
{
    kcl_node *n = ctx;
    op_hdr *h = (op_hdr *)(void *)n->msg;
    op_seg *sg = (op_seg *)(void *)(h + 1);
    int32_t *ids;
    size_t T = 0;
    (void)r;
    if (n->me != 0 || !others(n)) return 0;
    if (n->block_failed) { *err = n->why; return -1; }
    for (size_t k = 0; k < nseg; k++) {
        long id = state_id(n, segs[k].st), dst = segs[k].snap ? -2 : -1;
        if (id < 0) return krun_err_set(err, KRUN_EINPUT, "cluster: a sequence the other ranks do not know");
        if (segs[k].snap) {
            /* the snapshot's target: the state whose tables it writes */
            for (size_t i = 0; i < n->n_st; i++)
                if (n->st[i] && n->st[i]->kda_S == segs[k].snap->S) dst = (long)i;
            if (dst < 0) return krun_err_set(err, KRUN_EINPUT, "cluster: a snapshot into a file is not supported with layers on other ranks");
        }
        sg[k] = (op_seg){(int32_t)id, (int32_t)segs[k].n, segs[k].journal, segs[k].all_positions,
                         segs[k].snap ? (int32_t)segs[k].snap->at : 0, (int32_t)dst};
        T += segs[k].n;
    }
    ids = (int32_t *)(void *)(sg + nseg);
    T = 0;
    for (size_t k = 0; k < nseg; k++) { memcpy(ids + T, segs[k].ids, segs[k].n * sizeof *ids); T += segs[k].n; }
    *h = (op_hdr){OP_FORWARD, (int32_t)nseg, (int32_t)T, 0, 0, 0};
    for (int rk = 1; rk < n->nranks; rk++)
        if ((others(n) >> rk & 1) &&
            kcl_send(rk, KCL_OP, n->msg, sizeof *h + nseg * sizeof *sg + T * sizeof *ids, err)) {
            block_abort(n, err);
            return -1;
        }
    return 0;
}

/* The block's hidden state to rank `to` (before layer L). */
static int hid_send(kcl_node *n, k3_run *r, int to, int L, const k3_block *b, size_t nsnap, int prefix_empty, krun_err *err)
{
    const size_t E = (size_t)n->m->cfg.hidden;
    hid_hdr h = {L, (int32_t)b->T, (int32_t)nsnap, prefix_empty, 0, 0};
    if (kcl_send(to, KCL_HID, &h, sizeof h, err) || kcl_post(to, KCL_HID, r->s.P, b->T * E * sizeof(float), err)) return -1;
    for (size_t t = 0; nsnap && t < b->T; t++)
        if (kcl_post(to, KCL_HID, r->s.snap + t * r->s.max_src * E, nsnap * E * sizeof(float), err)) return -1;
    return kcl_flush(err);
}

/* ... and from rank `from`.  Rank 0 also hears a failure from any rank there. */
static int hid_recv(kcl_node *n, k3_run *r, int from, int L, const k3_block *b, size_t *nsnap, int *prefix_empty, krun_err *err)
{
    const size_t E = (size_t)n->m->cfg.hidden;
    const uint64_t watch = n->me == 0 ? others(n) | (1ull << from) : 1ull << from;
    hid_hdr h;
    size_t len;
    int src, rc;
    for (;;) {
        if ((rc = kcl_wait(watch, KCL_HID, &src, &len, err))) {
            return rc < 0 ? -1 : krun_err_set(err, KRUN_EINPUT, "cluster: the block was given up while waiting for %s", kcl_who(from));
        }
        if (len < sizeof h || kcl_recv(src, KCL_HID, &h, sizeof h, sizeof h, err)) {
            if (len < sizeof h) krun_err_set(err, KRUN_EINPUT, "cluster: a malformed message from %s", kcl_who(src));
            return -1;
        }
        if (h.L < 0) {                 /* a rank failed its part */
            char text[900];
            if (kcl_get(src, KCL_HID, text, sizeof text - 1, &len, err)) return -1;
            text[len] = 0;
            return krun_err_set(err, h.code == KRUN_EDATA ? KRUN_EDATA : h.code == KRUN_ENOMEM ? KRUN_ENOMEM : KRUN_EINPUT, "%s: %s",
                                kcl_who(src), text);
        }
        if (src != from || h.L != L || (size_t)h.T != b->T || h.nsnap < 0 || (size_t)h.nsnap > r->s.max_src) {
            krun_err_set(err, KRUN_EINPUT, "cluster: %s sent the hidden state of layer %d where layer %d's from %s was due", kcl_who(src),
                         h.L, L, kcl_who(from));
            kcl_fail(err);
            return -1;
        }
        break;
    }
    if (kcl_get(from, KCL_HID, r->s.P, b->T * E * sizeof(float), NULL, err)) return -1;
    for (size_t t = 0; t < b->T && h.nsnap; t++)
        if (kcl_get(from, KCL_HID, r->s.snap + t * r->s.max_src * E, (size_t)h.nsnap * E * sizeof(float), NULL, err)) return -1;
    *nsnap = (size_t)h.nsnap;
    *prefix_empty = h.prefix_empty;
    return 0;
}

static int r_stage(void *ctx, k3_run *r, int L, const k3_block *b, size_t *nsnap, int *prefix_empty, krun_err *err)
{
    kcl_node *n = ctx;
    const int NL = n->m->cfg.n_layers;
    const int prev = L == 0 ? 0 : n->owner[L - 1], cur = L == NL ? 0 : n->owner[L];
    if (prev == cur) return cur == n->me;
    if (prev == n->me) {
        if (hid_send(n, r, cur, L, b, *nsnap, *prefix_empty, err)) goto fail;
        return 0;
    }
    if (cur != n->me) return 0;
    if (hid_recv(n, r, prev, L, b, nsnap, prefix_empty, err)) goto fail;
    if (n->me == 0 && r->on_layer) r->on_layer(r->on_layer_ctx, L, NL);   /* the layers run elsewhere are done */
    return 1;
fail:
    if (n->me == 0) block_abort(n, err);
    return -1;
}

static void r_commit(void *ctx, k3_run *r, const k3_state *st, size_t keep)
{
    kcl_node *n = ctx;
    op_hdr h = {OP_COMMIT, 0, 0, 0, 0, (int64_t)keep};
    krun_err e;
    (void)r;
    if (n->me != 0 || !others(n)) return;
    h.a = (int32_t)state_id(n, st);
    if (to_stages(n, &h, &e)) block_abort(n, &e);      /* noticed by the next block */
}

/* ---- rank 0: orders about a sequence's state ------------------------------------------------ */

int kcl_node_reset(kcl_node *n, const k3_state *st, krun_err *err)
{
    op_hdr h = {OP_RESET, 0, (int32_t)state_id(n, st), 0, 0, 0};
    return others(n) ? to_stages(n, &h, err) : 0;
}

int kcl_node_copy(kcl_node *n, const k3_state *dst, const k3_state *src, krun_err *err)
{
    op_hdr h = {OP_COPY, 0, (int32_t)state_id(n, dst), (int32_t)state_id(n, src), 0, 0};
    if (!others(n)) return 0;
    if (h.a < 0 || h.b < 0) return krun_err_set(err, KRUN_EINPUT, "cluster: a copy between states the other ranks do not know");
    return to_stages(n, &h, err);
}

/* The state table twice as long (the new entries empty). */
static int grow_states(kcl_node *n, krun_err *err)
{
    size_t c2 = n->cap_st * 2;
    k3_state **s2 = realloc(n->st, c2 * sizeof *s2);
    uint8_t **m2 = s2 ? realloc(n->mine, c2 * sizeof *m2) : NULL;
    if (s2) n->st = s2;
    if (!s2 || !m2) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    n->mine = m2;
    memset(n->st + n->cap_st, 0, (c2 - n->cap_st) * sizeof *s2);
    memset(n->mine + n->cap_st, 0, (c2 - n->cap_st) * sizeof *m2);
    n->cap_st = c2;
    return 0;
}

int kcl_node_state_new(kcl_node *n, k3_state *st, size_t cap, krun_err *err)
{
    size_t i = n->n_fixed;
    op_hdr h = {OP_NEW, 0, 0, 0, (int64_t)cap, 0};
    while (i < n->n_st && n->st[i]) i++;
    if (i == n->cap_st && grow_states(n, err)) return -1;
    n->st[i] = st;
    if (i == n->n_st) n->n_st++;
    h.a = (int32_t)i;
    return others(n) ? to_stages(n, &h, err) : 0;
}

void kcl_node_state_free(kcl_node *n, k3_state *st)
{
    long i = state_id(n, st);
    op_hdr h = {OP_FREE, 0, (int32_t)i, 0, 0, 0};
    krun_err e;
    if (i < (long)n->n_fixed) return;
    n->st[i] = NULL;
    if (others(n)) to_stages(n, &h, &e);
}

static size_t layer_floats(const k3_config *c, int L, size_t pos, size_t *a, size_t *b)
{
    *a = c->layer_is_mla[L] ? pos * k3_mla_row(c) : k3_kda_S_floats(c);
    *b = c->layer_is_mla[L] ? 0 : k3_kda_conv_floats(c);
    return *a + *b;
}

int kcl_node_layer_get(kcl_node *n, const k3_state *st, int L, float *S, float *conv, float *mla, krun_err *err)
{
    const k3_config *c = &n->m->cfg;
    const int r = n->owner[L];
    op_hdr h = {OP_LAYER_GET, 0, (int32_t)state_id(n, st), L, (int64_t)st->pos, 0};
    size_t a, b;
    layer_floats(c, L, st->pos, &a, &b);
    if (send_op(r, &h, NULL, 0, err)) return -1;
    if (c->layer_is_mla[L]) return kcl_get(r, KCL_STATE, mla, a * sizeof(float), NULL, err) < 0 ? -1 : 0;
    if (kcl_get(r, KCL_STATE, S, a * sizeof(float), NULL, err) || kcl_get(r, KCL_STATE, conv, b * sizeof(float), NULL, err)) return -1;
    return 0;
}

int kcl_node_layer_put(kcl_node *n, const k3_state *st, int L, const float *S, const float *conv, const float *mla, size_t pos,
                       krun_err *err)
{
    const k3_config *c = &n->m->cfg;
    const int r = n->owner[L];
    op_hdr h = {OP_LAYER_PUT, 0, (int32_t)state_id(n, st), L, (int64_t)pos, 0};
    size_t a, b;
    layer_floats(c, L, pos, &a, &b);
    if (send_op(r, &h, NULL, 0, err)) return -1;
    if (c->layer_is_mla[L]) return kcl_send(r, KCL_STATE, mla, a * sizeof(float), err);
    return kcl_send(r, KCL_STATE, S, a * sizeof(float), err) || kcl_send(r, KCL_STATE, conv, b * sizeof(float), err) ? -1 : 0;
}

static void own_stats(const kcl_node *n, kcl_rank_stats *x)
{
    memset(x, 0, sizeof *x);
    kstore_stats_get(n->run->store, &x->st);
    kcl_moe_counts(n->moe, &x->experts_served, &x->experts_predicted);
    kcl_bytes(&x->bytes_sent, &x->bytes_received);
    for (int L = 0; L < n->m->cfg.n_layers; L++) x->layers += n->owner[L] == n->me;
}

int kcl_node_stats(kcl_node *n, kcl_rank_stats *all, krun_err *err)
{
    op_hdr h = {OP_STATS, 0, 0, 0, 0, 0};
    own_stats(n, &all[0]);
    for (int r = 1; r < n->nranks; r++)
        if (send_op(r, &h, NULL, 0, err) || kcl_get(r, KCL_REPLY, &all[r], sizeof all[r], NULL, err)) return -1;
    return 0;
}

void kcl_node_leave(int status) { kcl_finish(status); }

/* ---- the other ranks -------------------------------------------------------------------------- */

static k3_state *mirror(kcl_node *n, int32_t id)
{
    return id >= 0 && (size_t)id < n->n_st ? n->st[id] : NULL;
}

/* A copy of a snapshot's state with this rank's layers only. */
static int mirror_new(kcl_node *n, int32_t id, size_t cap, krun_err *err)
{
    const k3_config *c = &n->m->cfg;
    karena a = {NULL, 0};
    k3_state tmp;
    if (id < (int32_t)n->n_fixed || (size_t)id > n->n_st + 1024) return krun_err_set(err, KRUN_EINPUT, "cluster: state %d", id);
    while ((size_t)id >= n->cap_st)
        if (grow_states(n, err)) return -1;
    free(n->mine[id]);
    n->st[id] = NULL;
    k3_state_carve_away(&tmp, c, cap, n->m->away, &a);
    {
        const size_t head = karena_round(sizeof(k3_state)), body = karena_round(a.used);
        karena b;
        k3_state *st;
        n->mine[id] = aligned_alloc(KARENA_ALIGN, head + body);
        if (!n->mine[id]) return krun_err_set(err, KRUN_ENOMEM, "out of memory for a snapshot's layers (%zu bytes)", head + body);
        st = (k3_state *)(void *)n->mine[id];
        b = (karena){n->mine[id] + head, 0};
        k3_state_carve_away(st, c, cap, n->m->away, &b);
        k3_state_reset(st);
        n->st[id] = st;
    }
    if ((size_t)id >= n->n_st) n->n_st = (size_t)id + 1;
    return 0;
}

static int do_forward(kcl_node *n, const op_hdr *h, krun_err *err)
{
    const op_seg *sg = (const op_seg *)(const void *)(h + 1);
    const int32_t *ids = (const int32_t *)(const void *)(sg + h->n);
    const k3_config *c = &n->m->cfg;
    size_t off = 0;
    if (h->n < 1 || h->n > K3_MAX_SEQS) return krun_err_set(err, KRUN_EINPUT, "cluster: a block of %d segments", h->n);
    for (int k = 0; k < h->n; k++) {
        k3_state *st = mirror(n, sg[k].id), *dst = sg[k].snap_at ? mirror(n, sg[k].snap_dst) : NULL;
        if (!st || (sg[k].snap_at && !dst) || sg[k].n < 1 || off + (size_t)sg[k].n > (size_t)h->a)
            return krun_err_set(err, KRUN_EINPUT, "cluster: a block naming a sequence this rank does not have");
        n->segs[k] = (k3_seg){st, ids + off, (size_t)sg[k].n, NULL, sg[k].all_positions, sg[k].journal, NULL};
        if (dst) {
            n->snaps[k] = (k3_snap){(size_t)sg[k].snap_at, dst->kda_S, dst->kda_conv, NULL, NULL};
            n->segs[k].snap = &n->snaps[k];
        }
        off += (size_t)sg[k].n;
    }
    if (k3_forward(n->run, n->segs, (size_t)h->n, err)) return -1;
    /* a snapshot inside the block: its MLA rows are the source's first rows (as on rank 0) */
    for (int k = 0; k < h->n; k++) {
        k3_state *src = n->segs[k].st, *dst;
        if (!sg[k].snap_at) continue;
        dst = mirror(n, sg[k].snap_dst);
        for (int L = 0; L < c->n_layers; L++)
            if (c->layer_is_mla[L] && src->mla_cache[L])
                memcpy(dst->mla_cache[L], src->mla_cache[L], (size_t)sg[k].snap_at * k3_mla_row(c) * sizeof(float));
        dst->pos = (size_t)sg[k].snap_at;
    }
    return 0;
}

/* Layer L of a state, sent to rank 0 or taken from it. */
static int do_layer(kcl_node *n, const op_hdr *h, krun_err *err)
{
    const k3_config *c = &n->m->cfg;
    k3_state *st = mirror(n, h->a);
    const int L = h->b;
    const size_t pos = (size_t)h->x;
    size_t a, b;
    if (!st || L < 0 || L >= c->n_layers || n->owner[L] != n->me || pos > st->ctx)
        return krun_err_set(err, KRUN_EINPUT, "cluster: rank 0 asked for layer %d of a state this rank does not hold", L);
    layer_floats(c, L, pos, &a, &b);
    if (h->op == OP_LAYER_GET) {
        if (c->layer_is_mla[L]) return kcl_send(0, KCL_STATE, st->mla_cache[L], a * sizeof(float), err);
        return kcl_send(0, KCL_STATE, st->kda_S[L], a * sizeof(float), err) || kcl_send(0, KCL_STATE, st->kda_conv[L], b * sizeof(float), err)
                   ? -1 : 0;
    }
    st->pos = pos;
    if (c->layer_is_mla[L]) return kcl_get(0, KCL_STATE, st->mla_cache[L], a * sizeof(float), NULL, err) < 0 ? -1 : 0;
    return kcl_get(0, KCL_STATE, st->kda_S[L], a * sizeof(float), NULL, err) || kcl_get(0, KCL_STATE, st->kda_conv[L], b * sizeof(float), NULL, err)
               ? -1 : 0;
}

/* A failure of this rank's part of a block, told to rank 0. */
static void tell_rank0(const krun_err *e)
{
    hid_hdr h = {-1, 0, 0, 0, e->code, 0};
    krun_err ignore;
    if (kcl_send(0, KCL_HID, &h, sizeof h, &ignore) == 0) kcl_send(0, KCL_HID, e->msg, strlen(e->msg), &ignore);
}

int kcl_node_follow(kcl_node *n, krun_err *err)
{
    for (;;) {
        op_hdr *h = (op_hdr *)(void *)n->msg;
        size_t len;
        int tag, rc = 0;
        krun_err e = {0, {0}};
        if (kcl_wait_order(&tag, &len, err) || kcl_recv(0, tag, n->msg, n->msg_cap, len, err)) return -1;
        if (len < sizeof *h) return krun_err_set(err, KRUN_EINPUT, "cluster: a malformed order from rank 0");
        kcl_interrupted(1);
        switch (h->op) {
        case OP_STOP: kcl_stopped(n->msg, len); return 0;
        case OP_ABORT: break;          /* a block given up (KCL_CTRL): whatever waited for it was interrupted */
        case OP_FORWARD:
            if (do_forward(n, h, &e) && !kcl_interrupted(0)) {
                if (kcl_failed(NULL)) { *err = e; return -1; }
                tell_rank0(&e);
            }
            break;
        case OP_RESET:
            if (mirror(n, h->a)) k3_state_reset(mirror(n, h->a));
            break;
        case OP_COPY:
            if (mirror(n, h->a) && mirror(n, h->b)) k3_state_copy(mirror(n, h->a), mirror(n, h->b));
            break;
        case OP_COMMIT:
            if (mirror(n, h->a)) k3_commit(n->run, mirror(n, h->a), (size_t)h->y);
            break;
        case OP_NEW: rc = mirror_new(n, h->a, (size_t)h->x, &e); break;
        case OP_FREE:
            if (h->a >= (int32_t)n->n_fixed && (size_t)h->a < n->n_st) {
                free(n->mine[h->a]);
                n->mine[h->a] = NULL;
                n->st[h->a] = NULL;
            }
            break;
        case OP_LAYER_GET:
        case OP_LAYER_PUT: rc = do_layer(n, h, &e); break;
        case OP_STATS: {
            kcl_rank_stats st;
            own_stats(n, &st);
            rc = kcl_send(0, KCL_REPLY, &st, sizeof st, &e);
            break;
        }
        default: return krun_err_set(err, KRUN_EINPUT, "cluster: an order this rank does not know (%d): krun versions differ?", h->op);
        }
        if (rc) { *err = e; return -1; }
    }
}
