#include "ablate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KRUN_ABLATIONS
int krun_ablation = ABL_NONE;
#endif

static const char *const names[ABL_COUNT] = {
    [ABL_NONE] = "NONE",
    [ABL_ALOG_PER_CHANNEL] = "ALOG_PER_CHANNEL",
    [ABL_NO_DT_BIAS] = "NO_DT_BIAS",
    [ABL_KDA_READ_BEFORE_DECAY] = "KDA_READ_BEFORE_DECAY",
    [ABL_KDA_OUTPUT_PRE_WRITE] = "KDA_OUTPUT_PRE_WRITE",
    [ABL_KDA_NO_Q_SCALE] = "KDA_NO_Q_SCALE",
    [ABL_L2NORM_MEAN] = "L2NORM_MEAN",
    [ABL_CONV_TAPS_REVERSED] = "CONV_TAPS_REVERSED",
    [ABL_NO_CONV_SILU] = "NO_CONV_SILU",
    [ABL_NO_CONV_HISTORY] = "NO_CONV_HISTORY",
    [ABL_KDA_GATE_BEFORE_NORM] = "KDA_GATE_BEFORE_NORM",
    [ABL_MLA_DROP_ROPE] = "MLA_DROP_ROPE",
    [ABL_MLA_SCALE_NOPE] = "MLA_SCALE_NOPE",
    [ABL_MLA_NORM_ROPE] = "MLA_NORM_ROPE",
    [ABL_MLA_LORA_EPS_CONFIG] = "MLA_LORA_EPS_CONFIG",
    [ABL_MLA_GATE_FROM_LATENT] = "MLA_GATE_FROM_LATENT",
    [ABL_ROUTER_BIAS_IN_WEIGHTS] = "ROUTER_BIAS_IN_WEIGHTS",
    [ABL_ROUTER_SOFTMAX] = "ROUTER_SOFTMAX",
    [ABL_NO_RENORMALIZE] = "NO_RENORMALIZE",
    [ABL_MOE_NORM_PER_EXPERT] = "MOE_NORM_PER_EXPERT",
    [ABL_SHARED_ON_LATENT_WEIGHTED] = "SHARED_WEIGHTED",
    [ABL_SITU_NO_CAPS] = "SITU_NO_CAPS",
    [ABL_SITU_SIGMA_OF_CAPPED] = "SITU_SIGMA_OF_CAPPED",
    [ABL_SITU_BETAS_SWAPPED] = "SITU_BETAS_SWAPPED",
    [ABL_EXPERT_W1_W3_SWAPPED] = "EXPERT_W1_W3_SWAPPED",
    [ABL_MXFP4_NIBBLE_SWAP] = "MXFP4_NIBBLE_SWAP",
    [ABL_MXFP4_SCALE_BIAS_126] = "MXFP4_SCALE_BIAS_126",
    [ABL_ATTNRES_NORMALISED_VALUES] = "ATTNRES_NORMALISED_VALUES",
    [ABL_ATTNRES_NO_CLEAR] = "ATTNRES_NO_CLEAR",
    [ABL_ATTNRES_NO_EMBED_SOURCE] = "ATTNRES_NO_EMBED_SOURCE",
    [ABL_ATTNRES_FOLDS_SWAPPED] = "ATTNRES_FOLDS_SWAPPED",
    [ABL_NO_OUTPUT_AGGREGATOR] = "NO_OUTPUT_AGGREGATOR",
    [ABL_LM_HEAD_TIED] = "LM_HEAD_TIED",
};

const char *krun_ablation_name(int id) { return id >= 0 && id < ABL_COUNT && names[id] ? names[id] : "?"; }

int krun_ablation_from_env(void)
{
#ifdef KRUN_ABLATIONS
    const char *v = getenv("KRUN_ABLATE");
    if (!v || !*v) return 0;
    for (int i = 0; i < ABL_COUNT; i++)
        if (names[i] && strcmp(v, names[i]) == 0) { krun_ablation = i; return 0; }
    fprintf(stderr, "krun: unknown KRUN_ABLATE=%s\n", v);
    return -1;
#else
    return 0;
#endif
}
