/* The Kimi K3 model configuration (spec §1.5): parsed from config.json in
 * either the released nested shape or the flat shape of the test fixtures.
 *
 * A missing required field is an error listing every missing field, never a
 * default: a defaulted full_attn_layers would silently run every layer as KDA. */
#ifndef K3_CONFIG_H
#define K3_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define K3_MAX_LAYERS 1024

/* The eps of the two MLA LoRA norms (q_a_layernorm, kv_a_layernorm), which is
 * not rms_norm_eps: the release's own modeling_kimi_linear.py builds both as
 * KimiRMSNorm(rank) with no eps argument, so they take that class's default
 * 1e-6, while every other norm is given rms_norm_eps (1e-5).  krun follows the
 * release's code (K3_MODEL.md §9; docs/NUMERICS.md "The MLA LoRA norms' eps":
 * the sources, and what the choice changes). */
#define K3_MLA_LORA_NORM_EPS 1e-6

typedef struct k3_config {
    /* trunk */
    int hidden;            /* E */
    int n_layers;          /* NL */
    int vocab;             /* V */
    double rms_eps;
    /* KDA */
    int kda_heads;         /* Hk */
    int kda_head_dim;      /* D (dk = dv) */
    int conv_width;        /* Kc */
    double gate_lb;        /* lower bound of the KDA decay, -5 in K3 */
    /* MLA */
    int mla_heads;         /* H */
    int q_lora;            /* Rq */
    int kv_lora;           /* Rkv */
    int qk_nope;           /* dn */
    int qk_rope;           /* dr */
    int v_head;            /* dv */
    int mla_output_gate;   /* bool */
    /* MoE */
    int n_experts;         /* Ne */
    int topk;              /* k */
    int n_shared;          /* Ns */
    int latent;            /* Lt: routed_expert_hidden_size */
    int moe_inter;         /* I */
    double routed_scale;
    int moe_renormalize;   /* bool */
    int latent_norm;       /* bool */
    int first_dense;       /* first_k_dense_replace */
    int dense_inter;       /* Id */
    /* AttnRes and activation */
    int attn_res_block;    /* Bk */
    double situ_beta1;     /* gate cap */
    double situ_beta2;     /* up cap */
    /* layer map, zero-based: 1 if layer L is MLA (full attention), 0 if KDA */
    uint8_t layer_is_mla[K3_MAX_LAYERS];
    int nested;            /* 1 if parsed from the released nested shape */
} k3_config;

/* Parse and validate config.json bytes.  On failure returns -1 and writes a
 * message (every missing field, or the first invalid value) into err. */
int k3_config_parse(const char *json, size_t len, k3_config *cfg, char *err, size_t errlen);

/* Derived sizes. */
static inline int k3_layer_is_moe(const k3_config *c, int L) { return L >= c->first_dense; }
int k3_config_mla_layer_count(const k3_config *c);
/* Shared-expert intermediate width Is = Ns * I. */
static inline int k3_shared_inter(const k3_config *c) { return c->n_shared * c->moe_inter; }

#endif
