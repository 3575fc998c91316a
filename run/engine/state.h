/* Per-sequence state carried between decoding steps (spec §5): the KDA
 * recurrent state and ShortConv history of every KDA layer, and the MLA cache
 * of every MLA layer, which holds only the compressed latent: the normalised
 * kv latent and the raw shared rope key, kv_lora + qk_rope floats per
 * position (576 at full scale).  Carved from a session's slot (arena.h): the
 * size the planner counts is the size allocated. */
#ifndef KRUN_STATE_H
#define KRUN_STATE_H

#include "format/k3_config.h"
#include "run/util/arena.h"

#include <stddef.h>
#include <stdint.h>

typedef struct k3_state {
    const k3_config *cfg;
    size_t pos;            /* positions already processed */
    size_t ctx;            /* capacity of the MLA caches, in positions */
    float **kda_S;         /* [layer] -> [Hk][D][D], NULL for MLA layers */
    float **kda_conv;      /* [layer] -> [3 (q,k,v)][Kc-1][P], oldest first */
    float **mla_cache;     /* [layer] -> [ctx][kv_lora + qk_rope], NULL for KDA layers */
    /* paged to disk (statepage.h): the layers above point into the pager's window, valid only
     * for the layer a forward block is running; NULL: resident, the layers are the slot's own */
    struct k3_pager *pager;
    size_t page_slot;
} k3_state;

static inline size_t k3_mla_row(const k3_config *c) { return (size_t)(c->kv_lora + c->qk_rope); }
static inline size_t k3_kda_S_floats(const k3_config *c) { return (size_t)c->kda_heads * c->kda_head_dim * c->kda_head_dim; }
static inline size_t k3_kda_conv_floats(const k3_config *c)
{
    return 3 * (size_t)(c->conv_width - 1) * (size_t)c->kda_heads * c->kda_head_dim;
}

/* Lay the state for ctx positions out in a (see arena.h); reset before use. */
void k3_state_carve(k3_state *s, const k3_config *c, size_t ctx, karena *a);
/* The same without the layers another rank computes (away[L] = 1; NULL: all
 * here): their tables' entries stay NULL, and reset, copy and the forward
 * pass never touch them (run/cluster keeps them on their rank). */
void k3_state_carve_away(k3_state *s, const k3_config *c, size_t ctx, const uint8_t *away, karena *a);
/* The per-layer tables only, for a state whose layers a pager holds
 * (k3_pager_attach points them into its window). */
void k3_state_carve_tables(k3_state *s, const k3_config *c, size_t ctx, karena *a);
/* Back to position 0 (KDA state and ShortConv history zeroed; paged: marked
 * zero, no I/O). */
void k3_state_reset(k3_state *s);
/* dst (same config, room for src->pos positions) becomes src: every KDA
 * layer's state and ShortConv history, the MLA rows of the positions run,
 * and the position.  Bit for bit: dst then continues exactly as src would.
 * Resident states only (a paged state's layers are not in RAM between
 * blocks: the session layer refuses what would copy one). */
void k3_state_copy(k3_state *dst, const k3_state *src);

#endif
