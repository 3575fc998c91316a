/* The K3 model as krun sees it: the configuration read from the KPK file,
 * where every tensor sits inside its extent, and "binding": turning the raw
 * bytes of an extent (resident, mapped or streamed) into typed weights. */
#ifndef KRUN_MODEL_H
#define KRUN_MODEL_H

#include "k3_config.h"
#include "k3_schema.h"
#include "kernels.h"
#include "kpk_reader.h"

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
} k3_model;

/* Read the config and tokenizer, check that every tensor the config implies
 * is present with an accepted dtype and the right shape (errors name the
 * tensor).  The file stays owned by the caller. */
int k3_model_open(kpk_file *f, k3_model *m, char *err, size_t errlen);
void k3_model_close(k3_model *m);

/* Weights of the globals extent. */
typedef struct k3_globals_w {
    const void *embed;             /* [V][E] rows of embed_dtype */
    int embed_dtype;
    kmat lm_head;
    float *final_norm, *f_out;     /* f_out = output_attn_res_norm ⊙ output_attn_res_proj */
    float *arena;
} k3_globals_w;

/* Weights of one trunk layer.  Matrices point into the extent's bytes; the
 * small vectors are widened to float (and AttnRes folded) into an arena. */
typedef struct k3_layer_w {
    int layer, mla, moe;
    float *in_ln, *post_ln;
    float *f_attn, *f_mlp;         /* res_norm ⊙ res_proj, folded */
    /* KDA */
    kmat q, k, v, g, o, fa, fb, b;
    float *qconv, *kconv, *vconv;  /* [P][Kc] */
    float *a_log, *dt_bias, *o_norm;
    /* MLA */
    kmat qa, qb, kva, kvb, mo, mg;
    float *qa_ln, *kva_ln;
    /* dense FFN */
    kmat ffn_gate, ffn_up, ffn_down;
    /* MoE trunk */
    kmat router, moe_down, moe_up, sh_gate, sh_up, sh_down;
    float *router_bias, *moe_norm;
    float *arena;
} k3_layer_w;

typedef struct k3_expert_w {
    kmat w1, w2, w3;               /* gate, down, up; MXFP4 */
} k3_expert_w;

int k3_bind_globals(const k3_model *m, const uint8_t *raw, k3_globals_w *w, char *err, size_t errlen);
void k3_unbind_globals(k3_globals_w *w);
int k3_bind_layer(const k3_model *m, int L, const uint8_t *raw, k3_layer_w *w, char *err, size_t errlen);
void k3_unbind_layer(k3_layer_w *w);
/* Looks the expert's six tensors up by name and checks them. */
int k3_bind_expert(const k3_model *m, int L, int e, const uint8_t *raw, k3_expert_w *w, char *err, size_t errlen);

/* n values of a float dtype (F32, BF16, F16) at p, widened exactly to float. */
void k3_widen(const uint8_t *p, int dtype, size_t n, float *out);

/* Extent index of expert (L, e). */
int64_t k3_expert_extent(const k3_model *m, int L, int e);

#endif
