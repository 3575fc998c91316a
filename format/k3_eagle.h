/* The Kimi K3 EAGLE-3.1 drafter (../shared/spec/K3_EAGLE.md): its config.json,
 * its tensor roster as a function of that config, the taps it reads from a
 * target, and the check of a drafter KPK file (docs/FORMAT.md §15).
 *
 * One table serves kpack (the roster a checkpoint must have exactly), k3synth
 * (what to generate) and krun (where each weight sits), as k3_schema.h does
 * for the target.  The roster is K3_EAGLE §1.3: 17 tensors plus one
 * fc_norm.k per tap, all BF16; any other name, dtype or shape is refused
 * with the tensor named. */
#ifndef K3_EAGLE_H
#define K3_EAGLE_H

#include "k3_config.h"
#include "kpk_reader.h"

#include <stddef.h>
#include <stdint.h>

#define K3E_MAX_TAPS 8           /* taps a drafter reads, at most (the release reads 3) */
#define K3E_NAME_MAX 64

/* The released drafter: its files' pinned SHA-256 (K3_EAGLE §1.2), the
 * safetensors file's size and header length, and the target layers it taps
 * (zero-based; K3_EAGLE §2.1: never shifted twice). */
#define K3E_RELEASE_REPO "lightseekorg/kimi-k3-eagle3.1-mla"
#define K3E_RELEASE_CONFIG_SHA256 "f57ad7ca2e5023bf01fba58c96ac5cb6842c43111be3e1a964b5a4080b85ac8d"
#define K3E_RELEASE_WEIGHTS_SHA256 "af999f57eea206c5193feee3463034ce63db62ceba93ba87cc6de2c4201b595f"
#define K3E_RELEASE_FILE_BYTES 6031253592ull
#define K3E_RELEASE_HEADER_BYTES 2128u
#define K3E_RELEASE_TARGET_LAYERS 93
extern const int K3E_RELEASE_TAPS[3];  /* 1, 45, 89 */

/* The parts of a drafter KPK file: kind-6 extents, `layer` = the part. */
enum k3e_part { K3E_PART_WEIGHTS = 0, K3E_PART_EMBED = 1 };

typedef struct k3_eagle_config {
    int hidden;            /* E: the target's */
    int inter;             /* F: the SwiGLU MLP's width */
    int vocab;             /* V: the target's, no draft vocabulary */
    int heads;             /* Hd */
    int q_lora, kv_lora;   /* Rq, Rkv */
    int qk_nope, qk_rope, v_head;   /* dn, dr (even), dv */
    double rms_eps;        /* every drafter norm */
    double rope_theta;
    int yarn;              /* rope_scaling is YaRN (else plain RoPE with rope_theta) */
    double yarn_factor, yarn_beta_fast, yarn_beta_slow, yarn_mscale, yarn_mscale_all_dim;
    int yarn_orig_max;     /* original_max_position_embeddings */
    long max_positions;    /* max_position_embeddings; 0 when absent */
    int n_taps;            /* Na */
    int tap_ids[K3E_MAX_TAPS];  /* as the config writes them: one-based completed-layer ids (or, for the release, [1,45,89]) */
    char architecture[64]; /* architectures[0], informational */
} k3_eagle_config;

/* Parse and validate the drafter's config.json (keys at the root, or under
 * text_config; eagle_config likewise).  A missing required field is an error
 * naming it; values this engine cannot honour (another architecture's
 * flags: fc_norm or norm_output false, more than one layer, a draft
 * vocabulary, tied embeddings, a non-SiLU MLP, a non-YaRN rope scaling) are
 * refused by name.  Returns 0, or -1 with err. */
int k3e_config_parse(const char *json, size_t len, k3_eagle_config *c, char *err, size_t errlen);

/* The target layers (zero-based) whose block-local prefix P after step 8 of
 * K3_MODEL §4.4 the drafter reads, in fc's column order.  For the released
 * target (93 layers, hidden 7168, vocab 163840) they are hard-coded to 1, 45,
 * 89 and the config must name those tensors ([2,46,90] exported, or
 * [1,45,89] TorchSpec-native); at any other depth the config's ids are taken
 * as exported one-based completed-layer ids (tap = id - 1).  The drafter must
 * also match the target's hidden width and vocabulary.  Returns 0, or -1
 * with err naming what differs ("a drafter for another model"). */
int k3e_target_taps(const k3_eagle_config *c, const k3_config *target, int *layers, char *err, size_t errlen);

/* ---- the roster ------------------------------------------------------------ */

typedef enum k3e_role {
    K3E_EMBED,             /* embed_tokens.weight [V, E] (part EMBED) */
    /* part WEIGHTS, in the order the forward pass uses them */
    K3E_FC_NORM,           /* fc_norm.k.weight [E], one per tap */
    K3E_FC,                /* fc.weight [E, Na E] */
    K3E_INPUT_LN,          /* layers.0.input_layernorm.weight [E] */
    K3E_HIDDEN_NORM,       /* layers.0.hidden_norm.weight [E] */
    K3E_QA,                /* q_a_proj [Rq, 2E] */
    K3E_QA_NORM,           /* q_a_layernorm [Rq] */
    K3E_QB,                /* q_b_proj [Hd (dn + dr), Rq] */
    K3E_KVA,               /* kv_a_proj_with_mqa [Rkv + dr, 2E] */
    K3E_KVA_NORM,          /* kv_a_layernorm [Rkv] */
    K3E_KVB,               /* kv_b_proj [Hd (dn + dv), Rkv] */
    K3E_O,                 /* o_proj [E, Hd dv] */
    K3E_POST_LN,           /* post_attention_layernorm [E] */
    K3E_GATE,              /* mlp.gate_proj [F, E] */
    K3E_UP,                /* mlp.up_proj [F, E] */
    K3E_DOWN,              /* mlp.down_proj [E, F] */
    K3E_NORM,              /* norm.weight [E] */
    K3E_LM_HEAD,           /* lm_head.weight [V, E] */
    K3E_ROLE_COUNT
} k3e_role;

typedef struct k3e_spec {
    k3e_role role;
    int tap;               /* K3E_FC_NORM: which; else -1 */
    int part;              /* enum k3e_part */
    int ndim;
    uint64_t shape[4];
    char name[K3E_NAME_MAX];
} k3e_spec;

/* Tensors in the roster: K3E_ROLE_COUNT - 1 + n_taps (20 for the release). */
int k3e_count(const k3_eagle_config *c);
/* Tensor i of the canonical order (0: the embedding, then the weights part in
 * role order, fc_norm.0 .. Na-1 first). */
void k3e_at(const k3_eagle_config *c, int i, k3e_spec *out);
/* The canonical index of (role, tap). */
int k3e_index(const k3_eagle_config *c, k3e_role role, int tap);
/* The index of a released name, or -1 (not in the roster). */
int k3e_find(const k3_eagle_config *c, const char *name);
/* "[7168, 21504]" */
void k3e_shape_str(int ndim, const uint64_t *shape, char *buf, size_t n);
/* Every roster tensor is BF16. */
#define K3E_DTYPE KPK_DT_BF16
/* Bytes of the roster: all (with the embedding), and the weights part alone. */
uint64_t k3e_bytes(const k3_eagle_config *c, int with_embedding);

/* Is this KPK file a drafter (the DRAFTER feature bit)? */
int k3e_is_drafter_file(const kpk_file *f);
/* The drafter check of a KPK file: a drafter file whose meta extent holds
 * config.json, whose two drafter extents hold exactly the roster, each
 * tensor BF16 of its shape in its part, in canonical order.  Parses the
 * embedded config into *c.  Returns 0, or -1 naming the tensor or extent. */
int k3e_check_kpk(const kpk_file *f, k3_eagle_config *c, char *err, size_t errlen);

/* YaRN (K3_EAGLE §3.7, for any even rope width dr): the inverse frequencies
 * omega[0 .. dr/2), the softmax scale tau and the cos/sin multiplier.  Plain
 * RoPE (no rope_scaling): omega_i = theta^(-2i/dr), tau = 1/sqrt(dn + dr),
 * multiplier 1. */
void k3e_rope(const k3_eagle_config *c, double *omega, double *tau, double *cos_mult);

#endif
