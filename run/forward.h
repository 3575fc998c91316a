/* The whole K3 forward pass over a block of new positions. */
#ifndef KRUN_FORWARD_H
#define KRUN_FORWARD_H

#include "model.h"
#include "state.h"
#include "store.h"
#include "threadpool.h"

typedef struct k3_run {
    k3_model *model;
    kstore *store;
    kpool *pool;
    k3_state state;
    k3_globals_w globals;
    const uint8_t *globals_raw;
    size_t expert_batch;        /* experts resident at once in one layer */
    uint64_t expert_uses;       /* routed (position, expert) pairs so far */
} k3_run;

int k3_run_init(k3_run *r, k3_model *m, kstore *store, kpool *pool, size_t ctx, char *err, size_t errlen);
void k3_run_free(k3_run *r);

/* Process T new tokens after the r->state.pos already processed.  Writes the
 * logits of the last position (or, with all_positions, of every one of the T
 * positions, [T][vocab]) into logits.  On error returns -1 with err set; the
 * state is then unusable (reset it before reuse). */
int k3_forward(k3_run *r, const int32_t *ids, size_t T, int all_positions, float *logits, char *err, size_t errlen);

#endif
