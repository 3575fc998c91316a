/* Per-sequence state carried between decoding steps (spec §5): the KDA
 * recurrent state and ShortConv history of every KDA layer, and the MLA cache
 * of every MLA layer, which holds only the compressed latent: the normalised
 * kv latent and the raw shared rope key, kv_lora + qk_rope floats per
 * position (576 at full scale). */
#ifndef KRUN_STATE_H
#define KRUN_STATE_H

#include "k3_config.h"

#include <stddef.h>

typedef struct k3_state {
    const k3_config *cfg;
    size_t pos;            /* positions already processed */
    size_t ctx;            /* capacity of the MLA caches, in positions */
    float **kda_S;         /* [layer] -> [Hk][D][D], NULL for MLA layers */
    float **kda_conv;      /* [layer] -> [3 (q,k,v)][Kc-1][P], oldest first */
    float **mla_cache;     /* [layer] -> [ctx][kv_lora + qk_rope], NULL for KDA layers */
} k3_state;

/* Bytes the state needs for ctx positions. */
size_t k3_state_bytes(const k3_config *c, size_t ctx);
int k3_state_init(k3_state *s, const k3_config *c, size_t ctx);
void k3_state_reset(k3_state *s);
void k3_state_free(k3_state *s);
static inline size_t k3_mla_row(const k3_config *c) { return (size_t)(c->kv_lora + c->qk_rope); }

#endif
