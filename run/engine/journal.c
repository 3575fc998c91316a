#include "journal.h"

#include <string.h>

void k3_journal_carve(k3_journal *j, const k3_config *c, size_t drafts, karena *a)
{
    const size_t NL = (size_t)c->n_layers, D = (size_t)c->kda_head_dim, Hk = (size_t)c->kda_heads;
    memset(j, 0, sizeof *j);
    if (drafts == 0) return;
    j->cap = drafts + 1;
    j->max_segs = j->cap / 2 > 1 ? j->cap / 2 : 1;
    j->rec_floats = k3_journal_beta(c) + Hk;     /* 4P + Hk */
    KTAKE(a, j->rec, NL);
    for (size_t L = 0; L < NL; L++) {
        float *rec = NULL;
        if (!c->layer_is_mla[L]) KTAKE(a, rec, j->cap * j->rec_floats);
        if (a->base) j->rec[L] = rec;
    }
    KTAKE(a, j->S, j->max_segs * Hk * D * D);
    KTAKE(a, j->logits, j->cap * (size_t)c->vocab);
}

size_t k3_journal_bytes(const k3_config *c, size_t drafts)
{
    k3_journal j;
    karena a = {NULL, 0};
    k3_journal_carve(&j, c, drafts, &a);
    return karena_round(a.used);
}
