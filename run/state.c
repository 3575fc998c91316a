#include "state.h"

#include <stdlib.h>
#include <string.h>

static size_t kda_S_floats(const k3_config *c) { return (size_t)c->kda_heads * c->kda_head_dim * c->kda_head_dim; }
static size_t kda_conv_floats(const k3_config *c)
{
    return 3 * (size_t)(c->conv_width - 1) * (size_t)c->kda_heads * c->kda_head_dim;
}

size_t k3_state_bytes(const k3_config *c, size_t ctx)
{
    size_t n = 0;
    for (int L = 0; L < c->n_layers; L++)
        n += c->layer_is_mla[L] ? ctx * k3_mla_row(c) : kda_S_floats(c) + kda_conv_floats(c);
    return n * sizeof(float);
}

int k3_state_init(k3_state *s, const k3_config *c, size_t ctx)
{
    memset(s, 0, sizeof *s);
    s->cfg = c;
    s->ctx = ctx;
    s->kda_S = calloc((size_t)c->n_layers, sizeof *s->kda_S);
    s->kda_conv = calloc((size_t)c->n_layers, sizeof *s->kda_conv);
    s->mla_cache = calloc((size_t)c->n_layers, sizeof *s->mla_cache);
    if (!s->kda_S || !s->kda_conv || !s->mla_cache) goto oom;
    for (int L = 0; L < c->n_layers; L++) {
        if (c->layer_is_mla[L]) {
            if (!(s->mla_cache[L] = malloc(ctx * k3_mla_row(c) * sizeof(float) + 1))) goto oom;
        } else {
            if (!(s->kda_S[L] = calloc(kda_S_floats(c), sizeof(float)))) goto oom;
            if (!(s->kda_conv[L] = calloc(kda_conv_floats(c) + 1, sizeof(float)))) goto oom;
        }
    }
    return 0;
oom:
    k3_state_free(s);
    return -1;
}

void k3_state_reset(k3_state *s)
{
    const k3_config *c = s->cfg;
    s->pos = 0;
    for (int L = 0; L < c->n_layers; L++) {
        if (s->kda_S[L]) memset(s->kda_S[L], 0, kda_S_floats(c) * sizeof(float));
        if (s->kda_conv[L]) memset(s->kda_conv[L], 0, kda_conv_floats(c) * sizeof(float));
    }
}

void k3_state_free(k3_state *s)
{
    if (s->cfg)
        for (int L = 0; L < s->cfg->n_layers; L++) {
            if (s->kda_S) free(s->kda_S[L]);
            if (s->kda_conv) free(s->kda_conv[L]);
            if (s->mla_cache) free(s->mla_cache[L]);
        }
    free(s->kda_S);
    free(s->kda_conv);
    free(s->mla_cache);
    memset(s, 0, sizeof *s);
}
