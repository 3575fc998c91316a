/* The drafter's private state, shared by draft_model.c (file, load, taps,
 * state) and draft_layer.c (commit, propose).  Not for other folders. */
#ifndef KRUN_DRAFT_INTERNAL_H
#define KRUN_DRAFT_INTERNAL_H

#include "draft.h"

#define KD_COMMIT_ROWS 64         /* committed rows computed together (one read of fc and kv_a for them) */
#define KD_MAX_ROPE 1024          /* rope dims, at most (k3_eagle's range) */

struct kdraft {
    char *path;
    kpk_file *f;
    k3_eagle_config cfg;
    int taps[K3E_MAX_TAPS];        /* target layers, zero-based */
    char pinned[64];
    uint64_t config_xxh3;          /* of its config.json */
    uint32_t wext, eext;           /* the weights and embedding extents */
    const k3_model *target;
    kstore *store;                 /* the target's: its embedding rows */
    uint32_t globals_extent;
    kpool *pool;
    double omega[KD_MAX_ROPE / 2], tau, cos_mult;
    /* held: one arena */
    uint8_t *mem;
    size_t mem_bytes;
    uint8_t *weights;              /* the weights extent, as stored */
    kmat fc, qa, qb, kva, kvb, o, gate, up, down, lm;
    float *fc_norm[K3E_MAX_TAPS], *in_ln, *hid_norm, *qa_norm, *kva_norm, *post_ln, *norm;
    float *dump;                   /* kdraft_set_dump: chain 0's logits, step after step */
    struct { float *g, *x, *kv; } cm;      /* commit: [KD_COMMIT_ROWS] rows of g [E], x [2E], kv [Rkv + dr] */
    size_t rows, cap;              /* a chain step's rows at most; a state's cache rows */
    struct {
        float *g;                  /* [rows][E]: the incoming hidden state (pending g, then o) */
        float *x;                  /* [rows][2E]: [norm(embedding) | norm(g)] */
        float *cq, *q, *kv;        /* [rows][Rq], [rows][H (dn + dr)], [rows][Rkv + dr] */
        float *att;                /* [rows][H dv]: every head's output */
        float *r, *n;              /* [rows][E]: the residual, its norm */
        float *gate, *up;          /* [rows][F] */
        float *f;                  /* [rows][E] */
        float *logits;             /* [rows][V] */
        uint8_t *erow;             /* one embedding row as stored */
        float *qt, *sc, *olat;     /* attention of one row, every head: [H][Rkv], [H][cap], [H][Rkv] */
        size_t *rows;              /* [rows]: which session each active row is */
    } ch;
};

#endif
