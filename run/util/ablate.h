/* Deliberately broken variants of the forward pass, one per silent-wrongness
 * trap of the spec (§8), used ONLY by the test suite to prove that its checks
 * can fail.  They exist in a separate test build compiled with
 * -DKRUN_ABLATIONS (build/ablate/krun), selected there by the environment
 * variable KRUN_ABLATE=NAME.  In every normal build ABLATED(x) is the constant
 * 0 and the compiler removes the broken code.
 *
 * In the production files an ablation point is one line: a swapped operand,
 * or a call into a broken variant (ablate_variants.h, compiled only into the
 * test build). */
#ifndef KRUN_ABLATE_H
#define KRUN_ABLATE_H

enum krun_ablation {
    ABL_NONE = 0,
    ABL_ALOG_PER_CHANNEL,        /* 2: A_log indexed per channel */
    ABL_NO_DT_BIAS,              /* 3: dt_bias omitted */
    ABL_KDA_READ_BEFORE_DECAY,   /* 4: read u before the decay */
    ABL_KDA_OUTPUT_PRE_WRITE,    /* 4: output from the pre-write state */
    ABL_KDA_NO_Q_SCALE,          /* 4: q not scaled by 1/sqrt(D) */
    ABL_L2NORM_MEAN,             /* 5: mean instead of sum */
    ABL_CONV_TAPS_REVERSED,      /* 5 */
    ABL_NO_CONV_SILU,            /* 5 */
    ABL_NO_CONV_HISTORY,         /* 5: history not carried across steps */
    ABL_KDA_GATE_BEFORE_NORM,    /* 6 */
    ABL_MLA_DROP_ROPE,           /* 7 */
    ABL_MLA_SCALE_NOPE,          /* 7: 1/sqrt(128) instead of 1/sqrt(192) */
    ABL_MLA_NORM_ROPE,           /* 7: rope slice normalised with kv_a_layernorm */
    ABL_MLA_GATE_FROM_LATENT,    /* 8: gate fed the wrong input */
    ABL_MLA_LORA_EPS_CONFIG,     /* §9: the LoRA norms given rms_norm_eps instead of 1e-6 */
    ABL_ROUTER_BIAS_IN_WEIGHTS,  /* 9 */
    ABL_ROUTER_SOFTMAX,          /* 9 */
    ABL_NO_RENORMALIZE,          /* 9 */
    ABL_MOE_NORM_PER_EXPERT,     /* 10 */
    ABL_SHARED_ON_LATENT_WEIGHTED, /* 10: shared expert weighted by the top weight */
    ABL_SITU_NO_CAPS,            /* 11 */
    ABL_SITU_SIGMA_OF_CAPPED,    /* 11 */
    ABL_SITU_BETAS_SWAPPED,      /* 11 */
    ABL_EXPERT_W1_W3_SWAPPED,    /* 11 */
    ABL_MXFP4_NIBBLE_SWAP,       /* 12 */
    ABL_MXFP4_SCALE_BIAS_126,    /* 12 */
    ABL_ATTNRES_NORMALISED_VALUES, /* 13 */
    ABL_ATTNRES_NO_CLEAR,        /* 13: prefix not cleared at boundaries */
    ABL_ATTNRES_NO_EMBED_SOURCE, /* 13: embedding not source 0 */
    ABL_ATTNRES_FOLDS_SWAPPED,   /* 13/4.4: f_attn and f_mlp swapped */
    ABL_NO_OUTPUT_AGGREGATOR,    /* 13 */
    ABL_LM_HEAD_TIED,            /* 15 */
    /* the EAGLE drafter's traps (K3_EAGLE.md §7; run/draft): the target's output stays right, the
     * drafts go wrong -- tests/cli/test_draft_ref.sh, against tests/ref/eagle_ref.py */
    ABL_DRAFT_TAP_MIXTURE,       /* 1: the AttnRes mixture m, not P */
    ABL_DRAFT_TAP_OFF_BY_ONE,    /* 2: after zero-based id + 1 */
    ABL_DRAFT_TAP_BEFORE_FFN,    /* 3: P before z_L is added */
    ABL_DRAFT_TAPS_OUT_OF_ORDER, /* 4: concatenated last first */
    ABL_DRAFT_TAPS_UNNORMED,     /* 4: no fc_norm */
    ABL_DRAFT_NORMED_RESIDUAL,   /* 5: norm(g) as the residual */
    ABL_DRAFT_HIDDEN_FIRST,      /* 6: the hidden half first in x */
    ABL_DRAFT_NO_ROPE,           /* 7 */
    ABL_DRAFT_ROPE_HALF_SPLIT,   /* 7: pairs (i, i + dr/2) */
    ABL_DRAFT_PLAIN_ROPE,        /* 7: no YaRN */
    ABL_DRAFT_SCALE_PLAIN,       /* 7: 1/sqrt(dn + dr), not tau */
    ABL_DRAFT_FEED_R2,           /* 8: r2 fed back, not o */
    ABL_DRAFT_HEAD_NO_NORM,      /* 9: lm_head on r2 */
    ABL_DRAFT_CHAIN_POSITION_PLUS_ONE, /* 10: a chain row rotated at q + 1 */
    ABL_DRAFT_PAIR_OWN_TOKEN,    /* 10: T(q) paired with token q, not q + 1 */
    ABL_DRAFT_SILU_OF_UP,        /* 11: SiLU(up) * gate */
    ABL_COUNT
};

#ifdef KRUN_ABLATIONS
extern int krun_ablation;
#define ABLATED(x) (krun_ablation == ABL_##x)
#else
#define ABLATED(x) 0
#endif

/* Name <-> id, for the test build's KRUN_ABLATE variable. */
const char *krun_ablation_name(int id);
int krun_ablation_from_env(void);

#endif
