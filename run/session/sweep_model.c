/* The union model: bytes one decoding sweep reads (sweep_model.h). */
#include "sweep_model.h"

#include <math.h>

double ksweep_bytes(const kmemplan *p, const k3_config *c, size_t B)
{
    double n_moe = (double)(c->n_layers - c->first_dense), N = (double)c->n_experts, k = (double)c->topk;
    double all = n_moe * N * (double)p->expert_slot_bytes;           /* every routed expert, as a slot holds it */
    double cached = n_moe * N > 0 ? (double)p->expert_slots / (n_moe * N) : 0;
    double in_union = N > 0 ? 1 - pow(1 - k / N, (double)B) : 0;
    if (cached > 1) cached = 1;
    return (double)p->trunk_stream_bytes + (double)p->head_stream_bytes + all * in_union * (1 - cached);
}
