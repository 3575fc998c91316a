/* The session API on several machines: ranks.h. */
#include "ranks.h"

#include "run/engine/forward.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The handshake's messages (tags OP and REPLY); the op codes are apart from kcl_node's orders. */
enum { OP_STOPPED = 1 /* kcl_node's stop */, OP_HELLO = 100, OP_PLAN = 101 };

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
    int nranks;
    kcl_members have[KCL_MAX_RANKS];
    uint8_t *owner;                /* [n_layers] */
    kcl_node *node;
};

kcl_node *krun_ranks_node(const krun_ranks *x) { return x ? x->node : NULL; }

void krun_ranks_free(krun_ranks *x)
{
    if (!x) return;
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

/* Which rank computes each trunk layer: rank 0 all of them (the trunk in
 * rank 0's budget, streamed as in one process; the other ranks read and
 * compute experts). */
static int place_layers(const kpk_file *f, const k3_model *m, krun_ranks *x, krun_err *err)
{
    (void)f;
    (void)err;
    memset(x->owner, 0, (size_t)m->cfg.n_layers);
    return 0;
}

int krun_ranks_hello(krun_ranks **out, const krun_model *model, kpk_file *f, k3_model *m, krun_model_opts *o, krun_err *err)
{
    const k3_config *c = &m->cfg;
    krun_ranks *x = calloc(1, sizeof *x);
    hello_msg h;
    (void)model;
    *out = NULL;
    if (!x || !(x->owner = calloc((size_t)c->n_layers, 1))) { free(x); return krun_err_set(err, KRUN_ENOMEM, "out of memory"); }
    x->nranks = kcl_size();
    /* every rank lays out blocks of the same size: one prompt block (no prefill layout) */
    if (!o->chunk) o->chunk = KMEM_DECODE_BLOCK;
    o->extra_bytes += kcl_node_bytes(c, k3_block_positions(o->chunk, o->max_seqs, o->spec));
    memset(&h, 0, sizeof h);
    h = (hello_msg){OP_HELLO, x->nranks, o->ctx, o->chunk, o->max_seqs, o->spec, o->prompt_tokens, o->io, o->verify,
                    o->cache_policy, o->predict, o->cache, o->state_dir != NULL, o->trace, 0, {0}};
    if (strlen(o->path) >= sizeof h.path) { krun_ranks_free(x); return krun_err_set(err, KRUN_EINPUT, "%s: path too long", o->path); }
    strcpy(h.path, o->path);
    for (int r = 1; r < x->nranks; r++)
        if (kcl_send(r, KCL_OP, &h, sizeof h, err)) { krun_ranks_free(x); return -1; }
    members_of(f, &x->have[0]);
    for (int r = 1; r < x->nranks; r++) {
        report_msg rep;
        if (kcl_get(r, KCL_REPLY, &rep, sizeof rep, NULL, err)) { krun_ranks_free(x); return -1; }
        rep.msg[sizeof rep.msg - 1] = 0;
        if (rep.code) {
            krun_err_set(err, rep.code, "%s: %s", kcl_who(r), rep.msg);
            krun_ranks_free(x);
            return -1;
        }
        x->have[r] = rep.have;
    }
    if (place_layers(f, m, x, err) || check_coverage(f, m, x, err)) { krun_ranks_free(x); return -1; }
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

/* ---- the other ranks -------------------------------------------------------------------------- */

int krun_ranks_await(krun_follower *fw, const krun_model_opts *own, krun_err *err)
{
    hello_msg h;
    size_t len;
    int src;
    memset(fw, 0, sizeof *fw);
    if (kcl_wait(1, KCL_OP, &src, &len, err)) return -1;
    if (len != sizeof h) {
        int32_t op = 0;
        uint8_t tmp[64];
        if (kcl_recv(0, KCL_OP, tmp, sizeof tmp, len, err)) return -1;
        memcpy(&op, tmp, sizeof op);
        if (op == OP_STOPPED) return 1;
        return krun_err_set(err, KRUN_EINPUT, "cluster: rank 0 sent something other than its model (krun versions differ?)");
    }
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
    int src;
    memset(&rep, 0, sizeof rep);
    rep.code = fw->code;
    snprintf(rep.msg, sizeof rep.msg, "%s", fw->msg);
    rep.budget = fw->o.budget;
    rep.threads = fw->o.threads;
    if (f) members_of(f, &rep.have);
    if (kcl_send(0, KCL_REPLY, &rep, sizeof rep, err)) return -1;
    if (fw->code) return 0;
    if (kcl_wait(1, KCL_OP, &src, &len, err)) return -1;
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
    {
        uint8_t tmp[64];
        int32_t op = 0;
        if (len > sizeof tmp || kcl_recv(0, KCL_OP, tmp, sizeof tmp, len, err)) return -1;
        memcpy(&op, tmp, sizeof op);
        return op == OP_STOPPED ? 1 : krun_err_set(err, KRUN_EINPUT, "cluster: an unexpected message from rank 0");
    }
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
    for (;;) {
        size_t len;
        int src;
        uint8_t buf[8192];
        if (kcl_wait(1, KCL_OP, &src, &len, &e)) return;
        if (len > sizeof buf) {   /* something large (an order meant for a working rank): taken and dropped */
            uint8_t *big = malloc(len);
            if (!big || kcl_recv(0, KCL_OP, big, len, len, &e)) { free(big); return; }
            free(big);
            continue;
        }
        if (kcl_recv(0, KCL_OP, buf, sizeof buf, len, &e)) return;
        if (len >= 4) {
            int32_t op;
            memcpy(&op, buf, sizeof op);
            if (op == OP_STOPPED) return;
        }
    }
}

void krun_follower_free(krun_follower *fw) { free(fw->owner); fw->owner = NULL; }
