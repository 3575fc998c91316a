/* The K3 tensor inventory (spec §2) as a function of the config: every
 * tensor's released name, accepted dtypes and shape, and where it goes in a
 * KPK file (globals, the trunk extent of its layer, or its expert's extent).
 *
 * One table serves kpack (coverage and shape checks), k3synth (what to
 * generate) and krun (finding weights), so the three agree by construction;
 * the independent checks are the external oracle fixture and k3synth
 * --virtual, which must reproduce the released shard sizes to the byte. */
#ifndef K3_SCHEMA_H
#define K3_SCHEMA_H

#include "k3_config.h"
#include "kpk.h"

#define K3_NAME_MAX 128

/* Roles, in canonical order: a KPK extent stores its tensors in this order. */
typedef enum k3_role {
    /* globals extent */
    K3T_EMBED, K3T_LM_HEAD, K3T_FINAL_NORM, K3T_OUT_RES_NORM, K3T_OUT_RES_PROJ,
    /* every layer */
    K3T_INPUT_LN, K3T_POST_ATTN_LN, K3T_ATTN_RES_NORM, K3T_ATTN_RES_PROJ, K3T_MLP_RES_NORM, K3T_MLP_RES_PROJ,
    /* KDA layers */
    K3T_KDA_Q, K3T_KDA_K, K3T_KDA_V, K3T_KDA_G, K3T_KDA_O, K3T_KDA_QCONV, K3T_KDA_KCONV, K3T_KDA_VCONV,
    K3T_KDA_FA, K3T_KDA_FB, K3T_KDA_B, K3T_KDA_ALOG, K3T_KDA_DTBIAS, K3T_KDA_ONORM,
    /* MLA layers */
    K3T_MLA_QA, K3T_MLA_QA_NORM, K3T_MLA_QB, K3T_MLA_KVA, K3T_MLA_KVA_NORM, K3T_MLA_KVB, K3T_MLA_O, K3T_MLA_G,
    /* dense FFN layers (L < first_k_dense_replace) */
    K3T_FFN_GATE, K3T_FFN_UP, K3T_FFN_DOWN,
    /* MoE layers: the trunk part */
    K3T_MOE_ROUTER, K3T_MOE_BIAS, K3T_MOE_DOWN, K3T_MOE_UP, K3T_MOE_NORM, K3T_SH_GATE, K3T_SH_UP, K3T_SH_DOWN,
    /* one routed expert, in the released run order */
    K3T_EXP_W1_PACKED, K3T_EXP_W1_SCALE, K3T_EXP_W2_PACKED, K3T_EXP_W2_SCALE, K3T_EXP_W3_PACKED, K3T_EXP_W3_SCALE,
    K3T_COUNT
} k3_role;

#define K3_DTM(dt) (1u << (dt))
#define K3_DTM_FLOAT (K3_DTM(KPK_DT_F32) | K3_DTM(KPK_DT_BF16) | K3_DTM(KPK_DT_F16))

typedef struct k3_tensor_spec {
    k3_role role;
    int layer;            /* -1 for globals */
    int expert;           /* -1 unless a routed-expert tensor */
    int kind;             /* KPK_KIND_GLOBALS / TRUNK / EXPERT */
    unsigned dtypes;      /* accepted dtypes, K3_DTM bits */
    int release_dtype;    /* the dtype the released checkpoint uses */
    int ndim;
    uint64_t shape[4];
    char name[K3_NAME_MAX];
} k3_tensor_spec;

/* Precomputed per-config index: the canonical position of every tensor. */
typedef struct k3_schema {
    const k3_config *cfg;
    uint64_t count;                         /* all expected tensors */
    uint64_t layer_first[K3_MAX_LAYERS + 1];/* index of the layer's first trunk tensor */
    uint8_t layer_trunk_count[K3_MAX_LAYERS];
} k3_schema;

void k3_schema_init(k3_schema *s, const k3_config *cfg);

/* Trunk roles of layer L in canonical order; returns how many (<= K3T_COUNT). */
int k3_schema_layer_roles(const k3_config *cfg, int L, k3_role *out);
static inline int k3_role_is_expert(k3_role r) { return r >= K3T_EXP_W1_PACKED && r <= K3T_EXP_W3_SCALE; }
static inline int k3_role_is_global(k3_role r) { return r <= K3T_OUT_RES_PROJ; }

/* Fill the spec of (role, layer, expert).  Returns -1 if that tensor does not
 * exist in this config (e.g. an MLA role in a KDA layer). */
int k3_schema_spec(const k3_config *cfg, k3_role role, int layer, int expert, k3_tensor_spec *out);
/* Canonical index in [0, count) of an existing (role, layer, expert). */
uint64_t k3_schema_index(const k3_schema *s, k3_role role, int layer, int expert);
/* Inverse of k3_schema_index. */
int k3_schema_at(const k3_schema *s, uint64_t index, k3_tensor_spec *out);

enum k3_class {
    K3_CLASS_TENSOR = 0,   /* a known text tensor: out is filled */
    K3_CLASS_DROPPED = 1,  /* vision tower / projector: not carried into KPK */
    K3_CLASS_UNKNOWN = 2,  /* not part of this config's model: why says why */
};
/* Classify a released tensor name. */
int k3_schema_classify(const k3_config *cfg, const char *name, k3_tensor_spec *out, char *why, size_t whylen);

/* Release name of a role ("...self_attn.q_proj.weight"), without the layer prefix. */
const char *k3_role_suffix(k3_role r);

#endif
