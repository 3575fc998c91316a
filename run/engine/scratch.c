#include "scratch.h"

#include <string.h>

static void kda_carve(k3_kda_scratch *k, const k3_config *c, size_t T, karena *a)
{
    const size_t D = (size_t)c->kda_head_dim, Hk = (size_t)c->kda_heads, P = Hk * D;
    KTAKE(a, k->q, T * P);
    KTAKE(a, k->k, T * P);
    KTAKE(a, k->v, T * P);
    KTAKE(a, k->g, T * P);
    KTAKE(a, k->z, T * P);
    KTAKE(a, k->o, T * P);
    KTAKE(a, k->beta, T * Hk);
    KTAKE(a, k->fa, T * D);
    KTAKE(a, k->tmp, (size_t)c->conv_width - 1 + T);
}

static void mla_carve(k3_mla_scratch *m, const k3_config *c, size_t T, size_t ctx, karena *a)
{
    const size_t H = (size_t)c->mla_heads, Rq = (size_t)c->q_lora, Rkv = (size_t)c->kv_lora;
    const size_t dr = (size_t)c->qk_rope, dn = (size_t)c->qk_nope, dv = (size_t)c->v_head;
    KTAKE(a, m->cq, T * Rq);
    KTAKE(a, m->qfull, T * H * (dn + dr));
    KTAKE(a, m->kv, T * (Rkv + dr));
    if (c->mla_output_gate) KTAKE(a, m->gate, T * H * dv);
    else m->gate = NULL;
    KTAKE(a, m->out, T * H * dv);
    KTAKE(a, m->qt, H * Rkv);
    KTAKE(a, m->qr, H * dr);
    KTAKE(a, m->sc, H * ctx);
    m->olat_ld = Rkv + 16;
    KTAKE(a, m->olat, H * m->olat_ld);
    KTAKE(a, m->oh, H * dv);
    KTAKE(a, m->part, (size_t)K3_MLA_ITEMS * 2 * K3_MLA_PB * H);
    m->ctx = ctx;
}

static void moe_carve(k3_moe_scratch *m, const k3_config *c, size_t T, karena *a)
{
    const size_t E = (size_t)c->hidden, Ne = (size_t)c->n_experts, k = (size_t)c->topk;
    const size_t Lt = (size_t)c->latent, I = (size_t)c->moe_inter, Is = (size_t)k3_shared_inter(c);
    KTAKE(a, m->logits, T * Ne);
    KTAKE(a, m->route, 2 * Ne);
    KTAKE(a, m->idx, T * k);
    KTAKE(a, m->wts, T * k);
    KTAKE(a, m->zeta, T * Lt);
    KTAKE(a, m->slots, T * k * Lt);
    KTAKE(a, m->agg, T * Lt);
    KTAKE(a, m->xe, T * Lt);
    KTAKE(a, m->a1, T * I);
    KTAKE(a, m->a3, T * I);
    KTAKE(a, m->rows, T * k);
    KTAKE(a, m->distinct, Ne);
    KTAKE(a, m->used, Ne);
    KTAKE(a, m->bound, K3_EXPERT_BATCH);
    KTAKE(a, m->extent, K3_EXPERT_BATCH);
    KTAKE(a, m->sg, T * Is);
    KTAKE(a, m->su, T * Is);
    KTAKE(a, m->sh, T * E);
}

static void dense_carve(k3_dense_scratch *d, const k3_config *c, size_t T, karena *a)
{
    KTAKE(a, d->g, T * (size_t)c->dense_inter);
    KTAKE(a, d->u, T * (size_t)c->dense_inter);
}

void k3_scratch_carve(k3_scratch *s, const k3_config *c, size_t T, size_t S, size_t ctx, size_t taps, karena *a)
{
    const size_t E = (size_t)c->hidden, V = (size_t)c->vocab;
    size_t start, end = 0;
    memset(s, 0, sizeof *s);
    s->T = T;
    s->S = S;
    s->ctx = ctx;
    s->max_src = (size_t)(c->n_layers / c->attn_res_block) + 2;
    KTAKE(a, s->ids, T);
    KTAKE(a, s->snap, T * s->max_src * E);
    KTAKE(a, s->P, T * E);
    KTAKE(a, s->a, T * E);
    KTAKE(a, s->xn, T * E);
    KTAKE(a, s->y, T * E);
    KTAKE(a, s->src, s->max_src + 1);
    KTAKE(a, s->embed_row, E * 4);
    KTAKE(a, s->xg, S * E);
    KTAKE(a, s->lg, S * V);
    if (taps) KTAKE(a, s->taps, T * taps);
    s->tap_floats = taps;
    /* one region, four tenants */
    start = a->used;
#define TENANT(call) do { a->used = start; call; if (a->used > end) end = a->used; } while (0)
    TENANT(kda_carve(&s->kda, c, T, a));
    TENANT(mla_carve(&s->mla, c, T, ctx, a));
    TENANT(moe_carve(&s->moe, c, T, a));
    TENANT(dense_carve(&s->dense, c, T, a));
#undef TENANT
    a->used = end;
}
