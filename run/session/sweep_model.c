/* The union model: bytes one decoding sweep reads (sweep_model.h). */
#include "sweep_model.h"

#include "run/draft/draft.h"

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

double ksweep_draft(const kmemplan *p, const k3_config *c, size_t B, size_t max_width, size_t fixed, double extra, size_t *width,
                    double *tokens, double *bytes)
{
    double a[KDRAFT_MAX_WIDTH], best = 0;
    size_t lo = 0, hi = p->draft_path[0] ? max_width : 0;
    if (hi > KDRAFT_MAX_WIDTH) hi = KDRAFT_MAX_WIDTH;
    if (fixed && hi) lo = hi = fixed < hi ? fixed : hi;
    for (size_t j = 0; j < KDRAFT_MAX_WIDTH; j++) a[j] = p->draft_accept;
    *width = 0;
    for (size_t w = lo; w <= hi; w++) {
        double sweep = ksweep_bytes(p, c, B * (w + 1)) + extra, tok = (double)B * kdraft_expected_tokens(a, w);
        if (w == lo || sweep / tok < best) {
            best = sweep / tok;
            *width = w;
            *tokens = tok;
            *bytes = sweep;
        }
    }
    return best;
}
