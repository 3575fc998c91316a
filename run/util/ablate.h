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
