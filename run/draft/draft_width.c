/* Width by cost: how many drafts a verification pass carries (draft.h). */
#include "draft.h"

#include <math.h>
#include <string.h>

/* Distinct experts r rows choose in one MoE layer, N (1 - (1 - t/N)^r). */
static double distinct(const kdraft_cost *c, double r)
{
    return c->n_experts > 0 && r > 0 ? c->n_experts * (1.0 - pow(1.0 - (double)c->topk / c->n_experts, r)) : 0;
}

double kdraft_pass_bytes(const kdraft_cost *c, size_t rows)
{
    const double share = c->share > 1 ? c->share : 1;
    return c->c0 / share + c->moe_layers * (distinct(c, c->rows_else + (double)rows) - distinct(c, c->rows_else)) * c->expert_bytes;
}

double kdraft_expected_tokens(const double *a, size_t k)
{
    double t = 1, p = 1;
    for (size_t j = 0; j < k; j++) {
        p *= a[j];
        t += p;
    }
    return t;
}

size_t kdraft_cheapest(const kdraft_cost *c, const double *a, size_t kmax, double *tokens, double *bytes_per_token)
{
    size_t best = 0;
    double best_bpt = kdraft_pass_bytes(c, 1), best_tok = 1;
    for (size_t k = 1; k <= kmax; k++) {
        const double tok = kdraft_expected_tokens(a, k), bpt = kdraft_pass_bytes(c, k + 1) / tok;
        if (bpt < best_bpt) { best = k; best_bpt = bpt; best_tok = tok; }
    }
    if (tokens) *tokens = best_tok;
    if (bytes_per_token) *bytes_per_token = best_bpt;
    return best;
}

void kdraft_width_init(kdraft_width *w)
{
    memset(w, 0, sizeof *w);
    w->grown = 2;
}

void kdraft_width_accept(const kdraft_width *w, double *a, size_t n)
{
    for (size_t j = 0; j < n && j < KDRAFT_MAX_WIDTH; j++)
        a[j] = (w->took[j] + KDRAFT_PRIOR_ACCEPT * KDRAFT_PRIOR_WEIGHT) / (w->seen[j] + KDRAFT_PRIOR_WEIGHT);
}

size_t kdraft_width_next(kdraft_width *w, const kdraft_cost *c, size_t kmax, size_t fixed)
{
    double a[KDRAFT_MAX_WIDTH], one, two;
    size_t k;
    if (kmax > KDRAFT_MAX_WIDTH) kmax = KDRAFT_MAX_WIDTH;
    if (fixed) return fixed < kmax ? fixed : kmax;
    if (!kmax) return 0;
    kdraft_width_accept(w, a, kmax);
    k = kdraft_cheapest(c, a, kmax < w->grown ? kmax : w->grown, NULL, NULL);
    if (k) { w->since_probe = 0; return k; }
    /* nothing pays now: a probe of one draft now and then keeps the record current, at most
     * KDRAFT_PROBE_COST of the bytes (its extra row over a plain pass's) */
    one = kdraft_pass_bytes(c, 1);
    two = kdraft_pass_bytes(c, 2);
    if (one > 0 && ++w->since_probe >= (uint64_t)ceil((two - one) / (KDRAFT_PROBE_COST * one))) {
        w->since_probe = 0;
        return 1;
    }
    return 0;
}

void kdraft_width_result(kdraft_width *w, size_t drafted, size_t accepted)
{
    /* draft j was judged only when every one before it was accepted */
    for (size_t j = 0; j < drafted && j <= accepted && j < KDRAFT_MAX_WIDTH; j++) {
        w->seen[j] += 1;
        w->took[j] += j < accepted;
    }
    if (!drafted) return;
    if (accepted == drafted) w->grown = drafted * 2 > w->grown ? drafted * 2 : w->grown;
    else w->grown = accepted + 1 > 2 ? accepted + 1 : 2;
    if (w->grown > KDRAFT_MAX_WIDTH) w->grown = KDRAFT_MAX_WIDTH;
}
