/* How the forward pass uses each tensor of a layer, and in what order.
 *
 * A fact about the model's forward pass that the layers below it need: the
 * store cuts only what is used once into pieces and proves from the order
 * that its ring's slots suffice (store_pieces.h), and the weights seam
 * (weights.h) reads each vector just before its first use.  The forward pass
 * (forward.c, kda.c, mla.c, moe.c) keeps to the order: a streamed product out
 * of it fails the step naming both roles, so the declaration cannot silently
 * drift from the code. */
#ifndef KRUN_USE_ORDER_H
#define KRUN_USE_ORDER_H

#include "model.h"

#include <stdint.h>

/* How the forward pass uses a tensor within one block. */
enum k3_use {
    K3U_NONE = 0,              /* not at all */
    K3U_VEC = 1,               /* a vector, widened once; read before the next product in the order */
    K3U_ONCE = 2,              /* a matrix multiplied once per block: it may stream in row blocks */
    K3U_MULTI = 3,             /* a matrix read many times per block (MLA's kv_b): held whole until the layer ends */
};
typedef struct k3_use_step { uint8_t role, use; } k3_use_step;

/* The tensors of layer L (K3_GLOBALS: what streams of the globals, lm_head)
 * in the order the forward pass uses them; roles the file lacks are left out.
 * Returns how many (<= K3T_COUNT). */
int k3_use_order(const k3_model *m, int L, k3_use_step *out);

#endif
