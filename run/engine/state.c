#include "state.h"

#include "statepage.h"

#include <stdlib.h>
#include <string.h>

void k3_state_carve_tables(k3_state *s, const k3_config *c, size_t ctx, karena *a)
{
    const size_t NL = (size_t)c->n_layers;
    memset(s, 0, sizeof *s);
    s->cfg = c;
    s->ctx = ctx;
    KTAKE(a, s->kda_S, NL);
    KTAKE(a, s->kda_conv, NL);
    KTAKE(a, s->mla_cache, NL);
}

void k3_state_carve(k3_state *s, const k3_config *c, size_t ctx, karena *a) { k3_state_carve_away(s, c, ctx, NULL, a); }

void k3_state_carve_away(k3_state *s, const k3_config *c, size_t ctx, const uint8_t *away, karena *a)
{
    const size_t NL = (size_t)c->n_layers;
    k3_state_carve_tables(s, c, ctx, a);
    for (size_t L = 0; L < NL; L++) {
        float *S = NULL, *conv = NULL, *cache = NULL;
        if (away && away[L]) {
            /* another rank's layer: its state lives there (run/cluster) */
        } else if (c->layer_is_mla[L]) {
            KTAKE(a, cache, ctx * k3_mla_row(c));
        } else {
            KTAKE(a, S, k3_kda_S_floats(c));
            KTAKE(a, conv, k3_kda_conv_floats(c));
        }
        if (a->base) { s->kda_S[L] = S; s->kda_conv[L] = conv; s->mla_cache[L] = cache; }
    }
}

void k3_state_reset(k3_state *s)
{
    const k3_config *c = s->cfg;
    s->pos = 0;
    if (s->pager) { k3_pager_reset(s->pager, s->page_slot); return; }
    for (int L = 0; L < c->n_layers; L++) {
        if (s->kda_S[L]) memset(s->kda_S[L], 0, k3_kda_S_floats(c) * sizeof(float));
        if (s->kda_conv[L]) memset(s->kda_conv[L], 0, k3_kda_conv_floats(c) * sizeof(float));
    }
}

void k3_state_copy(k3_state *dst, const k3_state *src)
{
    const k3_config *c = src->cfg;
    if (dst->pager || src->pager) abort();    /* a caller's bug: refused above (session.c) */
    for (int L = 0; L < c->n_layers; L++) {
        if (!src->mla_cache[L] && !src->kda_S[L]) continue;     /* another rank's layer (run/cluster) */
        if (c->layer_is_mla[L]) {
            memcpy(dst->mla_cache[L], src->mla_cache[L], src->pos * k3_mla_row(c) * sizeof(float));
        } else {
            memcpy(dst->kda_S[L], src->kda_S[L], k3_kda_S_floats(c) * sizeof(float));
            memcpy(dst->kda_conv[L], src->kda_conv[L], k3_kda_conv_floats(c) * sizeof(float));
        }
    }
    dst->pos = src->pos;
}
