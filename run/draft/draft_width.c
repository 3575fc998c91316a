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

void kdraft_width_init(kdraft_width *w) { memset(w, 0, sizeof *w); }

/* took / seen over every depth of the contexts [c0, c1), shrunk towards prior by weight. */
static double rate(const kdraft_width *w, int c0, int c1, double prior, double weight)
{
    double took = 0, seen = 0;
    for (int c = c0; c < c1; c++)
        for (size_t j = 0; j < KDRAFT_MAX_WIDTH; j++) {
            took += w->took[c][j];
            seen += w->seen[c][j];
        }
    return (took + prior * weight) / (seen + weight);
}

void kdraft_width_accept(const kdraft_width *w, double *a, size_t n)
{
    const double all = rate(w, 0, 2, KDRAFT_PRIOR_ACCEPT, KDRAFT_PRIOR_WEIGHT);
    const double ctx = rate(w, w->ctx, w->ctx + 1, all, KDRAFT_CTX_WEIGHT);
    for (size_t j = 0; j < n && j < KDRAFT_MAX_WIDTH; j++)
        a[j] = (w->took[w->ctx][j] + ctx * KDRAFT_DEPTH_WEIGHT) / (w->seen[w->ctx][j] + KDRAFT_DEPTH_WEIGHT);
}

size_t kdraft_width_next(kdraft_width *w, const kdraft_cost *c, size_t kmax, size_t fixed)
{
    double a[KDRAFT_MAX_WIDTH], one, two;
    size_t k;
    if (kmax > KDRAFT_MAX_WIDTH) kmax = KDRAFT_MAX_WIDTH;
    if (fixed) return fixed < kmax ? fixed : kmax;
    if (!kmax) return 0;
    kdraft_width_accept(w, a, kmax);
    k = kdraft_cheapest(c, a, kmax, NULL, NULL);
    if (k) {
        w->since_probe = 0;
        /* one draft more than pays now and then: a depth the estimates undervalue would otherwise
         * never be verified again, and its record never corrected */
        if (k < kmax && ++w->since_deeper >= KDRAFT_EXPLORE) {
            w->since_deeper = 0;
            k++;
        }
        return k;
    }
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
        w->seen[w->ctx][j] += 1;
        w->took[w->ctx][j] += j < accepted;
    }
    w->ctx = drafted && accepted == drafted;
}
