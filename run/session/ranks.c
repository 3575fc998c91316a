/* The session API on several machines: ranks.h. */
#include "ranks.h"

#include "run/engine/forward.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The handshake's messages (tags OP and REPLY); the op codes are apart from kcl_node's orders. */
enum { OP_STOPPED = KCL_STOP, OP_HELLO = 100, OP_PLAN = 101 };

typedef struct hello_msg {
    int32_t op, nranks;
    uint64_t ctx, chunk, max_seqs, spec, prompt_tokens;
    int32_t io, verify, policy, predict, cache, paged, trace, pad;
    char path[4096];
} hello_msg;

typedef struct report_msg {
    int32_t code, threads;
    uint64_t budget;
    kcl_members have;
    char msg[1024];
} report_msg;

typedef struct plan_hdr {
    int32_t op, nranks, n_layers, pad;
    kcl_members have[KCL_MAX_RANKS];
} plan_hdr;

typedef struct ready_msg {
    int32_t code, pin, slots, pad;
    uint64_t total;
    char msg[1024];
} ready_msg;

struct krun_ranks {
    pthread_mutex_t mu;            /* rank 0's exchanges with the others, one at a time */
    int nranks;
    kcl_members have[KCL_MAX_RANKS];
    uint8_t *owner;                /* [n_layers] */
    kcl_node *node;
};

kcl_node *krun_ranks_node(const krun_ranks *x) { return x ? x->node : NULL; }

void krun_ranks_free(krun_ranks *x)
{
    if (!x) return;
    pthread_mutex_destroy(&x->mu);
    kcl_node_free(x->node);
    free(x->owner);
    free(x);
}

static void members_of(const kpk_file *f, kcl_members *h)
{
    memset(h, 0, sizeof *h);
    for (uint16_t k = 0; k < kpk_member_count(f) && k < 256; k++)
        if (kpk_member_here(f, k)) h->bits[k >> 6] |= 1ull << (k & 63);
}

/* The machine member k was laid out for by kpack convert --machines: its
 * file is named <entry name>.m<machine>.<disk> (docs/FORMAT.md §7.1); -1
 * for any other member. */
static int machine_of(const kpk_file *f, uint16_t k)
{
    const char *name = kpk_member_name(f, k), *entry = strrchr(kpk_path(f), '/'), *base;
    size_t n;
    char *end;
    long mach;
    entry = entry ? entry + 1 : kpk_path(f);
    base = name ? strrchr(name, '/') : NULL;
    base = base ? base + 1 : name;
    n = strlen(entry);
    if (!base || strncmp(base, entry, n) || strncmp(base + n, ".m", 2)) return -1;
    mach = strtol(base + n + 2, &end, 10);
    if (end == base + n + 2 || *end != '.' || mach < 0 || mach >= KCL_MAX_RANKS) return -1;
    for (const char *d = end + 1; ; d++) {
        if (!*d) return d > end + 1 ? (int)mach : -1;
        if (*d < '0' || *d > '9') return -1;
    }
}

/* A rank that can read extent i: all of its members present. */
static int can_read(const kpk_file *f, const kcl_members *h, uint32_t i)
{
    const kpk_extent *x = kpk_extent_at(f, i);
    if (x->member != KPK_STRIPED) return kcl_has(h, x->member);
    for (uint16_t k = 0; k < kpk_member_count(f); k++)
        if (kpk_member_at(f, k)->role == KPK_ROLE_STRIPE && !kcl_has(h, k)) return 0;
    return 1;
}

/* Which ranks can read extent i, named for a message. */
static void where(const kpk_file *f, uint32_t i, char *out, size_t n)
{
    const kpk_extent *x = kpk_extent_at(f, i);
    char d[64];
    kpk_extent_name(f, i, d, sizeof d);
    if (x->member != KPK_STRIPED)
        snprintf(out, n, "%s is in member %u (%s), which no rank has", d, x->member, kpk_member_path(f, x->member));
    else
        snprintf(out, n, "%s is striped over the stripe members, which no rank has all of", d);
}

/* Every expert readable by some rank, every trunk layer by its owner and the globals by rank 0. */
static int check_coverage(const kpk_file *f, const k3_model *m, const krun_ranks *x, krun_err *err)
{
    const k3_config *c = &m->cfg;
    char w[600];
    if (!can_read(f, &x->have[0], m->globals_extent)) {
        where(f, m->globals_extent, w, sizeof w);
        return krun_err_set(err, KRUN_EINPUT, "cluster: rank 0 computes the embedding and lm_head, but %s on its machine: put it "
                            "there (rank 0 is the first host of the hostfile)", w);
    }
    for (int L = 0; L < c->n_layers; L++) {
        const uint32_t i = m->trunk_extent[L];
        if (!can_read(f, &x->have[x->owner[L]], i)) {
            where(f, i, w, sizeof w);
            return krun_err_set(err, KRUN_EINPUT, "cluster: %s computes layer %d, but cannot read it: %s", kcl_who(x->owner[L]), L, w);
        }
        if (!k3_layer_is_moe(c, L)) continue;
        for (int e = 0; e < c->n_experts; e++) {
            int64_t id = k3_expert_extent(m, L, e);
            int ok = 0;
            for (int r = 0; r < x->nranks && !ok && id >= 0; r++) ok = can_read(f, &x->have[r], (uint32_t)id);
            if (!ok && id >= 0) {
                where(f, (uint32_t)id, w, sizeof w);
                return krun_err_set(err, KRUN_EINPUT, "cluster: no rank can read every expert: %s (a member missing on every "
                                    "machine: copy it to one, next to its main file)", w);
            }
        }
    }
    return 0;
}

/* Does the set of layers (away[L] = 0) fit rank r's budget with every one of
 * them pinned?  The rank's own planner, run here on its budget: each rank
 * plans with the same code and numbers, so what fits here fits there. */
static int fits(const krun_model *model, k3_model *m, const krun_model_opts *o, uint64_t budget, const uint8_t *away, int globals_away,
                int last)
{
    uint8_t *keep = m->away;
    const int keep_g = m->globals_away;
    krun_model_opts q = *o;
    kmemplan p;
    krun_err e;
    int ok;
    if (!budget) return 1;         /* no budget: the file is used in place, from its mapping */
    q.budget = budget;
    q.pin = q.expert_slots = q.head = -1;
    q.piece = 0;
    m->away = (uint8_t *)away;
    m->globals_away = globals_away;
    ok = krun_model_make_plan(model, &q, &p, &e) == 0 && p.pin > last && p.total <= budget;
    m->away = keep;
    m->globals_away = keep_g;
    return ok;
}

/* Which rank computes each trunk layer (pipeline stages): in file order,
 * each rank from rank 0 on takes the longest run of layers its budget holds
 * pinned (and its disks can read: the trunk of a set laid out for several
 * machines is on one of them); what no budget holds goes to the last rank
 * that took layers, which streams it as one process would.  Stages are off
 * (every layer on rank 0, the others serve experts) with --stages off or
 * states paged to disk. */
static int place_layers(const krun_model *model, const kpk_file *f, k3_model *m, const krun_model_opts *o, const uint64_t *budget,
                        krun_ranks *x, krun_err *err)
{
    const int NL = m->cfg.n_layers;
    uint8_t away[K3_MAX_LAYERS];
    int L = 0, last = 0;
    memset(x->owner, 0, (size_t)NL);
    if (o->stages < 0 || o->state_dir) return 0;
    if (o->stages == 1) {
        /* as given: stage_layers[r] layers to rank r, in order */
        for (int r = 0; r < KRUN_MAX_RANKS; r++) {
            if (o->stage_layers[r] && r >= x->nranks)
                return krun_err_set(err, KRUN_EINPUT, "--stages gives layers to rank %d, and there are %d ranks", r, x->nranks);
            for (int k = 0; k < o->stage_layers[r] && L < NL; k++) x->owner[L++] = (uint8_t)r;
            last += o->stage_layers[r];
        }
        if (last != NL) return krun_err_set(err, KRUN_EINPUT, "--stages gives %d layers; the model has %d", last, NL);
        return 0;
    }
    for (int r = 0; r < x->nranks && L < NL; r++) {
        const int start = L;
        int lo = start, hi = start;          /* [start, lo) fits; find the largest */
        while (hi < NL && can_read(f, &x->have[r], m->trunk_extent[hi])) hi++;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            for (int k = 0; k < NL; k++) away[k] = k < start || k >= mid;
            if (fits(model, m, o, budget[r], away, r != 0, mid - 1)) lo = mid;
            else hi = mid - 1;
        }
        for (int k = start; k < lo; k++) x->owner[k] = (uint8_t)r;
        if (lo > start) last = r;
        L = lo;
    }
    /* what no budget holds pinned streams, on a rank that can read it */
    for (; L < NL; L++) {
        int r = can_read(f, &x->have[last], m->trunk_extent[L]) ? last : -1;
        for (int k = 0; k < x->nranks && r < 0; k++)
            if (can_read(f, &x->have[k], m->trunk_extent[L])) r = k;
        if (r < 0) {
            char w[600];
            where(f, m->trunk_extent[L], w, sizeof w);
            return krun_err_set(err, KRUN_EINPUT, "cluster: no rank can read layer %d: %s", L, w);
        }
        x->owner[L] = (uint8_t)(last = r);
    }
    return 0;
}

static krun_ranks *ranks_new(int n_layers, int nranks)
{
    krun_ranks *x = calloc(1, sizeof *x);
    if (!x || !(x->owner = calloc((size_t)n_layers, 1))) { free(x); return NULL; }
    pthread_mutex_init(&x->mu, NULL);
    x->nranks = nranks;
    return x;
}

/* What every rank lays out alike: blocks of one size (no prefill layout), the cluster's buffers. */
static void shared_opts(const k3_config *c, krun_model_opts *o)
{
    if (!o->chunk) o->chunk = KMEM_DECODE_BLOCK;
    o->extra_bytes += kcl_node_bytes(c, k3_block_positions(o->chunk, o->max_seqs, o->spec));
}

/* HELLO to every rank; their reports: the members each has, its budget. */
static int gather(krun_ranks *x, kpk_file *f, const krun_model_opts *o, uint64_t *budget, krun_err *err)
{
    hello_msg h;
    memset(&h, 0, sizeof h);
    h = (hello_msg){OP_HELLO, x->nranks, o->ctx, o->chunk, o->max_seqs, o->spec, o->prompt_tokens, o->io, o->verify,
                    o->cache_policy, o->predict, o->cache, o->state_dir != NULL, o->trace, 0, {0}};
    if (strlen(o->path) >= sizeof h.path) return krun_err_set(err, KRUN_EINPUT, "%s: path too long", o->path);
    strcpy(h.path, o->path);
    for (int r = 1; r < x->nranks; r++)
        if (kcl_send(r, KCL_OP, &h, sizeof h, err)) return -1;
    members_of(f, &x->have[0]);
    budget[0] = o->budget;
    for (int r = 1; r < x->nranks; r++) {
        report_msg rep;
        if (kcl_get(r, KCL_REPLY, &rep, sizeof rep, NULL, err)) return -1;
        rep.msg[sizeof rep.msg - 1] = 0;
        if (rep.code) return krun_err_set(err, rep.code, "%s: %s", kcl_who(r), rep.msg);
        x->have[r] = rep.have;
        budget[r] = rep.budget;
    }
    return 0;
}

int krun_ranks_layout(const krun_model *model, kpk_file *f, k3_model *m, krun_model_opts *o, int hypothetical, krun_layout *out,
                      krun_err *err)
{
    krun_ranks *x = ranks_new(m->cfg.n_layers, hypothetical ? hypothetical : kcl_size());
    int rc;
    if (!x) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    if (x->nranks > KCL_MAX_RANKS) { krun_ranks_free(x); return krun_err_set(err, KRUN_EINPUT, "at most %d ranks", KCL_MAX_RANKS); }
    shared_opts(&m->cfg, o);
    if (hypothetical) {
        /* N machines like this one: its budget and its members each -- but of a set laid out for
         * machines (kpack convert --machines), machine r's members only, as each would have them */
        kcl_members here;
        members_of(f, &here);
        for (int r = 0; r < x->nranks; r++) {
            x->have[r] = here;
            out->budget[r] = o->budget;
            for (uint16_t k = 1; k < kpk_member_count(f) && k < 256; k++) {
                const int mach = machine_of(f, k);
                if (mach >= 0 && mach != r) x->have[r].bits[k >> 6] &= ~(1ull << (k & 63));
            }
        }
        rc = 0;
    } else {
        rc = gather(x, f, o, out->budget, err);
    }
    if (!rc) rc = place_layers(model, f, m, o, out->budget, x, err) || check_coverage(f, m, x, err) ? -1 : 0;
    if (!rc) {
        out->nranks = x->nranks;
        memcpy(out->have, x->have, sizeof out->have);
        memcpy(out->owner, x->owner, (size_t)m->cfg.n_layers);
    }
    krun_ranks_free(x);
    return rc;
}

int krun_ranks_hello(krun_ranks **out, const krun_model *model, kpk_file *f, k3_model *m, krun_model_opts *o, krun_err *err)
{
    const k3_config *c = &m->cfg;
    krun_ranks *x = ranks_new(c->n_layers, kcl_size());
    uint64_t budget[KCL_MAX_RANKS];
    *out = NULL;
    if (!x) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    shared_opts(c, o);
    if (gather(x, f, o, budget, err)) { krun_ranks_free(x); return -1; }
    if (place_layers(model, f, m, o, budget, x, err) || check_coverage(f, m, x, err)) { krun_ranks_free(x); return -1; }
    {
        uint8_t away[K3_MAX_LAYERS];
        int rc;
        plan_hdr ph;
        for (int L = 0; L < c->n_layers; L++) away[L] = x->owner[L] != 0;
        rc = k3_model_set_away(m, away, 0, err);
        if (rc) { krun_ranks_free(x); return -1; }
        memset(&ph, 0, sizeof ph);
        ph.op = OP_PLAN;
        ph.nranks = x->nranks;
        ph.n_layers = c->n_layers;
        memcpy(ph.have, x->have, sizeof ph.have);
        for (int r = 1; r < x->nranks; r++) {
            uint8_t *msg = malloc(sizeof ph + (size_t)c->n_layers);
            if (!msg) { krun_ranks_free(x); return krun_err_set(err, KRUN_ENOMEM, "out of memory"); }
            memcpy(msg, &ph, sizeof ph);
            memcpy(msg + sizeof ph, x->owner, (size_t)c->n_layers);
            rc = kcl_send(r, KCL_OP, msg, sizeof ph + (size_t)c->n_layers, err);
            free(msg);
            if (rc) { krun_ranks_free(x); return -1; }
        }
    }
    *out = x;
    return 0;
}

int krun_ranks_ready(krun_ranks *x, k3_model *m, k3_run *run, k3_state **states, size_t n, size_t ctx, krun_err *err)
{
    if (kcl_node_new(m, run, x->have, x->owner, states, n, ctx, &x->node, err)) return -1;
    kcl_node_attach(x->node);
    for (int r = 1; r < x->nranks; r++) {
        ready_msg rd;
        if (kcl_get(r, KCL_REPLY, &rd, sizeof rd, NULL, err)) return -1;
        rd.msg[sizeof rd.msg - 1] = 0;
        if (rd.code) return krun_err_set(err, rd.code, "%s: %s", kcl_who(r), rd.msg);
    }
    return 0;
}

/* ---- rank 0's blocks and states ---------------------------------------------------------------- */

int krun_ranks_staged(const krun_ranks *x) { return x && x->node && kcl_node_staged(x->node); }

int krun_ranks_forward(krun_ranks *x, k3_run *run, const k3_seg *segs, size_t n, krun_err *err)
{
    int rc;
    if (!x) return k3_forward(run, segs, n, err);
    pthread_mutex_lock(&x->mu);
    rc = k3_forward(run, segs, n, err);
    pthread_mutex_unlock(&x->mu);
    return rc;
}

void krun_ranks_commit(krun_ranks *x, k3_run *run, k3_state *st, size_t keep)
{
    if (x) pthread_mutex_lock(&x->mu);
    k3_commit(run, st, keep);     /* the other ranks' layers through the commit seam (remote.h) */
    if (x) pthread_mutex_unlock(&x->mu);
}

void krun_ranks_reset(krun_ranks *x, k3_state *st)
{
    krun_err e;
    k3_state_reset(st);
    if (!krun_ranks_staged(x)) return;
    pthread_mutex_lock(&x->mu);
    kcl_node_reset(x->node, st, &e);      /* a failure here is the cluster's: every later exchange reports it */
    pthread_mutex_unlock(&x->mu);
}

void krun_ranks_copy(krun_ranks *x, k3_state *dst, const k3_state *src)
{
    krun_err e;
    k3_state_copy(dst, src);
    if (!krun_ranks_staged(x)) return;
    pthread_mutex_lock(&x->mu);
    kcl_node_copy(x->node, dst, src, &e);
    pthread_mutex_unlock(&x->mu);
}

int krun_ranks_state_new(krun_ranks *x, k3_state *st, size_t cap, krun_err *err)
{
    int rc;
    if (!krun_ranks_staged(x)) return 0;
    pthread_mutex_lock(&x->mu);
    rc = kcl_node_state_new(x->node, st, cap, err);
    pthread_mutex_unlock(&x->mu);
    return rc;
}

void krun_ranks_state_free(krun_ranks *x, k3_state *st)
{
    if (!krun_ranks_staged(x)) return;
    pthread_mutex_lock(&x->mu);
    kcl_node_state_free(x->node, st);
    pthread_mutex_unlock(&x->mu);
}

static int far_get(void *ctx, const k3_state *st, int L, float *S, float *conv, float *mla, krun_err *err)
{
    return kcl_node_layer_get(ctx, st, L, S, conv, mla, err);
}

static int far_put(void *ctx, const k3_state *st, int L, const float *S, const float *conv, const float *mla, size_t pos, krun_err *err)
{
    return kcl_node_layer_put(ctx, st, L, S, conv, mla, pos, err);
}

int krun_ranks_far_begin(krun_ranks *x, const k3_config *c, size_t ctx, krun_state_far *far, const krun_state_far **use,
                         krun_err *err)
{
    const size_t n = krun_state_far_floats(c, ctx);
    *use = NULL;
    memset(far, 0, sizeof *far);
    if (!krun_ranks_staged(x)) return 0;
    /* one layer at a time passes through it: outside the plan, freed at once */
    if (!(far->buf = malloc(n * sizeof *far->buf)))
        return krun_err_set(err, KRUN_ENOMEM, "out of memory: %zu bytes for a layer of state on its way to or from another rank",
                            n * sizeof *far->buf);
    far->get = far_get;
    far->put = far_put;
    far->ctx = x->node;
    pthread_mutex_lock(&x->mu);
    *use = far;
    return 0;
}

void krun_ranks_far_end(krun_ranks *x, krun_state_far *far)
{
    if (!far->buf) return;
    pthread_mutex_unlock(&x->mu);
    free(far->buf);
    far->buf = NULL;
}

/* ---- the other ranks -------------------------------------------------------------------------- */

/* Rank 0's next order (0, its length in *len), or its stop (1; a control message taken). */
static int next_order(size_t *len, krun_err *err)
{
    for (;;) {
        int tag;
        uint8_t tmp[64];
        int32_t op = 0;
        if (kcl_wait_order(&tag, len, err)) return -1;
        if (tag == KCL_OP) return 0;
        if (*len > sizeof tmp || kcl_recv(0, KCL_CTRL, tmp, sizeof tmp, *len, err)) return -1;
        memcpy(&op, tmp, sizeof op);
        if (op == OP_STOPPED) { kcl_stopped(tmp, *len); return 1; }   /* else a block given up: nothing to do here */
    }
}

int krun_ranks_await(krun_follower *fw, const krun_model_opts *own, krun_err *err)
{
    hello_msg h;
    size_t len;
    int rc;
    memset(fw, 0, sizeof *fw);
    if ((rc = next_order(&len, err))) return rc;
    if (len != sizeof h) return krun_err_set(err, KRUN_EINPUT, "cluster: rank 0 sent something other than its model (krun versions differ?)");
    if (kcl_recv(0, KCL_OP, &h, sizeof h, len, err)) return -1;
    h.path[sizeof h.path - 1] = 0;
    strcpy(fw->path, h.path);
    fw->o = *own;                  /* this rank's budget, threads, I/O threads, SIMD path */
    fw->o.path = fw->path;
    fw->o.ctx = (size_t)h.ctx;
    fw->o.chunk = (size_t)h.chunk;
    fw->o.max_seqs = (size_t)h.max_seqs;
    fw->o.spec = (size_t)h.spec;
    fw->o.prompt_tokens = (size_t)h.prompt_tokens;
    fw->o.io = h.io;
    fw->o.verify = h.verify;
    fw->o.cache_policy = h.policy;
    fw->o.predict = h.predict;
    fw->o.cache = h.cache;
    fw->o.trace = 0;
    fw->o.state_dir = NULL;        /* a follower holds no session of its own to page */
    return 0;
}

int krun_ranks_report(krun_follower *fw, const kpk_file *f, const k3_config *c, krun_err *err)
{
    report_msg rep;
    plan_hdr ph;
    size_t len;
    int rc;
    memset(&rep, 0, sizeof rep);
    rep.code = fw->code;
    snprintf(rep.msg, sizeof rep.msg, "%s", fw->msg);
    rep.budget = fw->o.budget;
    rep.threads = fw->o.threads;
    if (f) members_of(f, &rep.have);
    if (kcl_send(0, KCL_REPLY, &rep, sizeof rep, err)) return -1;
    if (fw->code) return 0;
    if ((rc = next_order(&len, err))) return rc;
    if (c && len == sizeof ph + (size_t)c->n_layers) {
        uint8_t *msg = malloc(len);
        if (!msg) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
        if (kcl_recv(0, KCL_OP, msg, len, len, err)) { free(msg); return -1; }
        memcpy(&ph, msg, sizeof ph);
        if (ph.op != OP_PLAN || ph.n_layers != c->n_layers || !(fw->owner = malloc((size_t)c->n_layers))) {
            free(msg);
            return krun_err_set(err, KRUN_EINPUT, "cluster: rank 0's plan does not fit this rank's model (krun versions differ?)");
        }
        memcpy(fw->have, ph.have, sizeof fw->have);
        memcpy(fw->owner, msg + sizeof ph, (size_t)c->n_layers);
        free(msg);
        return 0;
    }
    return krun_err_set(err, KRUN_EINPUT, "cluster: an unexpected message from rank 0 (krun versions differ?)");
}

int krun_ranks_say_ready(krun_follower *fw, const kmemplan *plan, krun_err *err)
{
    ready_msg rd;
    memset(&rd, 0, sizeof rd);
    rd.code = fw->code;
    snprintf(rd.msg, sizeof rd.msg, "%s", fw->msg);
    if (plan) {
        rd.pin = plan->pin;
        rd.slots = plan->expert_slots;
        rd.total = plan->total;
    }
    return kcl_send(0, KCL_REPLY, &rd, sizeof rd, err);
}

void krun_ranks_await_stop(void)
{
    krun_err e;
    size_t len;
    int rc;
    /* orders meant for a working rank are taken and dropped */
    while ((rc = next_order(&len, &e)) == 0) {
        uint8_t *big = malloc(len ? len : 1);
        rc = !big || kcl_recv(0, KCL_OP, big, len, len, &e);
        free(big);
        if (rc) return;
    }
}

void krun_follower_free(krun_follower *fw) { free(fw->owner); fw->owner = NULL; }
