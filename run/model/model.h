/* The K3 model as krun sees it: the configuration read from the KPK file and
 * where every tensor sits inside its extent, resolved once at open (the
 * forward pass never looks a tensor up by name). */
#ifndef KRUN_MODEL_H
#define KRUN_MODEL_H

#include "format/k3_config.h"
#include "format/k3_schema.h"
#include "format/kpk_reader.h"
#include "run/kernels/kernels.h"
#include "run/util/krun_err.h"

/* The "layer" of the globals extent, where a layer number is expected. */
#define K3_GLOBALS (-1)

/* Where one tensor sits in its extent. */
typedef struct kt_loc {
    uint64_t offset, nbytes;
    int dtype;
    int ndim;
    uint64_t shape[4];
} kt_loc;

typedef struct k3_model {
    k3_config cfg;
    kpk_file *file;
    uint32_t globals_extent;
    uint32_t *trunk_extent;        /* [n_layers] */
    kt_loc globals[K3T_OUT_RES_PROJ + 1];
    kt_loc *trunk;                 /* [n_layers][K3T_COUNT]; nbytes 0 = absent */
    char *tokenizer_rank_file;     /* NULL when the file has no tokenizer */
    size_t tokenizer_rank_len;
    char *tokenizer_config;        /* tokenizer_config.json, may be NULL */
    size_t tokenizer_config_len;
    int eos_id;                    /* eos_token_id of config.json, -1 if none */
    char *config_text;             /* the embedded config.json, as stored (its hash identifies */
    size_t config_len;             /*   the model in saved states) */
    /* Where w1, w2, w3 (packed, scale) sit in an expert extent of layer L:
     * expert_off[L * 6 + k], the same for every expert of a layer (checked at open). */
    uint64_t *expert_off;
    /* Several ranks (run/cluster): the part of the model this process does
     * not compute.  away[L] = 1: trunk layer L runs on another rank, so its
     * extent is never read, held, streamed or planned here; globals_away: the
     * embedding, lm_head and the output vectors likewise.  NULL and 0 (one
     * process): everything is here.  Routed experts are not in it: any rank
     * computes the experts it can read (run/cluster/kcl_experts.c). */
    uint8_t *away;                 /* [n_layers], or NULL */
    int globals_away;
} k3_model;

/* Trunk layer L (K3_GLOBALS: the globals) is computed by this process. */
static inline int k3_here(const k3_model *m, int L)
{
    return L == K3_GLOBALS ? !m->globals_away : !m->away || !m->away[L];
}
/* Set what is away (a copy of away[n_layers]; NULL: every layer here). */
int k3_model_set_away(k3_model *m, const uint8_t *away, int globals_away, krun_err *err);

/* Read the config and tokenizer, check that every tensor the config implies
 * is present with an accepted dtype and the right shape (errors name the
 * tensor; KRUN_EDATA).  The file stays owned by the caller. */
int k3_model_open(kpk_file *f, k3_model *m, krun_err *err);
void k3_model_close(k3_model *m);

/* A routed expert's three MXFP4 matrices, pointing into its extent's bytes. */
typedef struct k3_expert_w {
    kmat w1, w2, w3;               /* gate, down, up */
} k3_expert_w;

/* Bind expert e of layer L held at raw: offsets resolved at open, no lookups. */
void k3_bind_expert(const k3_model *m, int L, const uint8_t *raw, k3_expert_w *w);

/* n values of a float dtype (F32, BF16, F16) at p, widened exactly to float. */
void k3_widen(const uint8_t *p, int dtype, size_t n, float *out);

/* The globals extent is held from this byte on (the embedding before it is
 * read a row at a time); -1 if the embedding is not first in the extent. */
int64_t k3_globals_first(const k3_model *m);

/* Extent index of expert (L, e). */
int64_t k3_expert_extent(const k3_model *m, int L, int e);

#endif
