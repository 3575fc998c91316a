/* Predicting a layer's experts before its router runs: predict.h. */
#include "predict.h"

#include "ops.h"
#include "remote.h"
#include "run/store/store.h"

#include <stdlib.h>
#include <string.h>

/* The buffer: [router copy, aligned for O_DIRECT][x: E][logits: Ne][route scratch: 2 Ne] */
static uint64_t up4k(uint64_t x) { return (x + 4095) / 4096 * 4096; }
static uint64_t router_room(const k3_model *m, uint64_t *stage)
{
    uint64_t most = 0;
    *stage = 0;
    for (int L = 0; L < m->cfg.n_layers; L++) {
        const kt_loc *rl = &m->trunk[(size_t)L * K3T_COUNT + K3T_MOE_ROUTER];
        uint64_t b, s;
        if (!k3_layer_is_moe(&m->cfg, L) || !rl->nbytes) continue;
        kstore_tensor_read_bytes(m->file, m->trunk_extent[L], rl->offset, rl->nbytes, &b, &s);
        if (b > most) most = b;
        if (s > *stage) *stage = s;
    }
    return up4k(most);
}

void k3_predict_bytes(const k3_model *m, uint64_t *buf, uint64_t *stage)
{
    const k3_config *c = &m->cfg;
    uint64_t room = router_room(m, stage);
    *buf = room ? up4k(room + ((uint64_t)c->hidden + 3 * (uint64_t)c->n_experts) * sizeof(float)) : 0;
    *stage = *stage ? up4k(*stage) : 0;
}

int k3_predict_init(k3_run *r, uint64_t buf, uint64_t stage, krun_err *err)
{
    if (!buf) return 0;
    r->predict_mem = aligned_alloc(4096, buf + stage);
    if (!r->predict_mem) {
        krun_err_set(err, KRUN_ENOMEM, "out of memory: %llu bytes for the expert prediction (run with --predict off)",
                     (unsigned long long)(buf + stage));
        return -1;
    }
    r->predict_router_bytes = router_room(r->model, &(uint64_t){0});
    r->predict_buf_bytes = buf;
    r->predict_stage_bytes = stage;
    return 0;
}

void k3_predict_free(k3_run *r)
{
    free(r->predict_mem);
    r->predict_mem = NULL;
}

void k3_predict_experts(k3_run *r, int at, const k3_block *b, size_t nsnap)
{
    const k3_model *m = r->model;
    const k3_config *c = &m->cfg;
    const size_t E = (size_t)c->hidden, Ne = (size_t)c->n_experts, k = (size_t)c->topk;
    /* this layer, or after a dense one the next: its whole compute would
     * otherwise leave the expert disks idle */
    const int L = k3_layer_is_moe(c, at) ? at : at + 1;
    const kt_loc *rl;
    k3_scratch *s = &r->s;
    const uint8_t *W;
    float *x, *logits, *route, wts[64];
    int idx[64];
    uint32_t ids[64];
    kmat M;
    if (!r->predict_mem || b->T != 1 || L >= c->n_layers || !k3_layer_is_moe(c, L) || k > 64 || !k3_weights_bound(&r->w, L)) return;
    rl = &m->trunk[(size_t)L * K3T_COUNT + K3T_MOE_ROUTER];
    if (!rl->nbytes) return;
    x = (float *)(void *)(r->predict_mem + r->predict_router_bytes);
    logits = x + E;
    route = logits + Ne;
    /* the router: held whole, or read now from the trunk's disk */
    W = k3_weights_whole(&r->w, L, K3T_MOE_ROUTER);
    if (!W) {
        krun_err e = {0};
        W = kstore_tensor_read(r->store, m->trunk_extent[L], rl->offset, rl->nbytes, r->predict_mem,
                               r->predict_stage_bytes ? r->predict_mem + r->predict_buf_bytes : NULL, &e);
        if (!W) return;
    }
    /* what step 6 will compute, without this layer's attention output */
    {
        const k3_vecs *v = k3_weights_vecs(&r->w, L);
        for (size_t j = 0; j < nsnap; j++) s->src[j] = s->snap + j * E;
        s->src[nsnap] = s->P;
        op_attnres(x, s->src, nsnap + 1, v->f_mlp, E, c->rms_eps);
        op_rmsnorm(x, x, v->post_ln, E, c->rms_eps);
        M = k3_mat_of(rl, W);
        kmatmul(r->pool, &M, x, E, 1, logits, Ne);
        moe_route(c, logits, v->router_bias, route, idx, wts);
    }
    for (size_t j = 0; j < k; j++) {
        int64_t id = k3_expert_extent(m, L, idx[j]);
        if (id < 0) return;
        ids[j] = (uint32_t)id;
    }
    /* with several ranks, each guess is read by the rank that will compute it (remote.h) */
    if (r->remote) r->remote->predict(r->remote->ctx, r, L, idx, k);
    else kstore_experts_predict(r->store, ids, k);
}
