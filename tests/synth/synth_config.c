/* config.json in the released nested shape (spec §1.5), or the flat shape of the
 * oracle fixture (same keys, same order, same spelling as its config.json). */
#include "synth.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static int set(json_t *o, const char *k, json_t *v) { return v ? json_object_set_new(o, k, v) : -1; }

/* Language-model keys, in the fixture's order (the flat shape also carries the
 * KDA block here; the nested one puts it in linear_attn_config). */
static int lm_keys(json_t *o, const synth_geom *g, int flat)
{
    int e = 0;
    e |= set(o, "hidden_size", json_integer(g->hidden));
    e |= set(o, "num_hidden_layers", json_integer(g->layers));
    e |= set(o, "vocab_size", json_integer(g->vocab));
    e |= set(o, "rms_norm_eps", json_real(g->eps));
    if (flat) {
        e |= set(o, "kda_num_heads", json_integer(g->kda_heads));
        e |= set(o, "kda_head_dim", json_integer(g->kda_dim));
        e |= set(o, "short_conv_kernel_size", json_integer(g->conv));
        e |= set(o, "gate_lower_bound", json_real(g->lb));
    }
    e |= set(o, "num_attention_heads", json_integer(g->mla_heads));
    e |= set(o, "q_lora_rank", json_integer(g->q_lora));
    e |= set(o, "kv_lora_rank", json_integer(g->kv_lora));
    e |= set(o, "qk_nope_head_dim", json_integer(g->nope));
    e |= set(o, "qk_rope_head_dim", json_integer(g->rope));
    e |= set(o, "v_head_dim", json_integer(g->vdim));
    if (!flat) e |= set(o, "mla_use_nope", json_true());
    e |= set(o, "mla_use_output_gate", json_true());
    e |= set(o, "num_experts", json_integer(g->experts));
    e |= set(o, "num_experts_per_token", json_integer(g->topk));
    e |= set(o, "num_shared_experts", json_integer(g->shared));
    e |= set(o, "routed_expert_hidden_size", json_integer(g->latent));
    e |= set(o, "moe_intermediate_size", json_integer(g->moe_inter));
    e |= set(o, "routed_scaling_factor", json_real(g->rscale));
    e |= set(o, "moe_renormalize", json_true());
    e |= set(o, "latent_moe_use_norm", json_true());
    e |= set(o, "first_k_dense_replace", json_integer(g->first_dense));
    e |= set(o, "intermediate_size", json_integer(g->dense_inter));
    e |= set(o, "attn_res_block_size", json_integer(g->block));
    e |= set(o, flat ? "situ_beta" : "activation_situ_beta", json_real(g->beta1));
    e |= set(o, flat ? "situ_linear_beta" : "activation_situ_linear_beta", json_real(g->beta2));
    return e;
}

static json_t *int_list(const int *v, int n)
{
    json_t *a = json_array();
    if (!a) return NULL;
    for (int i = 0; i < n; i++)
        if (json_array_append_new(a, json_integer(v[i])) != 0) { json_decref(a); return NULL; }
    return a;
}

int synth_config_json(const synth_geom *g, const synth_tok *tok, int flat, char **out, size_t *len)
{
    json_t *root = json_object();
    int e = 0;
    char *s;
    if (!root) return -1;
    if (flat) {
        e |= lm_keys(root, g, 1);
        e |= set(root, "full_attn_layers", int_list(g->full_attn, g->n_full));
        if (tok->eos_id >= 0) e |= set(root, "eos_token_id", json_integer(tok->eos_id));
    } else {
        json_t *tc = json_object(), *lin = json_object(), *vis = json_object(), *q = json_object();
        int kda[K3_MAX_LAYERS], nk = 0;
        if (!tc || !lin || !vis || !q) {
            json_decref(tc); json_decref(lin); json_decref(vis); json_decref(q); json_decref(root);
            return -1;
        }
        for (int L = 1; L <= g->layers; L++) {
            int mla = 0;
            for (int i = 0; i < g->n_full; i++) mla |= g->full_attn[i] == L;
            if (!mla) kda[nk++] = L;
        }
        e |= set(root, "architectures", json_pack("[s]", "KimiK3ForConditionalGeneration"));
        e |= set(root, "model_type", json_string("kimi_k3"));
        e |= set(tc, "model_type", json_string("kimi_linear"));
        e |= lm_keys(tc, g, 0);
        e |= set(tc, "tie_word_embeddings", json_false());
        e |= set(tc, "num_nextn_predict_layers", json_integer(0));
        e |= set(tc, "num_expert_group", json_integer(1));
        e |= set(lin, "num_heads", json_integer(g->kda_heads));
        e |= set(lin, "head_dim", json_integer(g->kda_dim));
        e |= set(lin, "short_conv_kernel_size", json_integer(g->conv));
        e |= set(lin, "gate_lower_bound", json_real(g->lb));
        e |= set(lin, "use_full_rank_gate", json_true());
        e |= set(lin, "full_attn_layers", int_list(g->full_attn, g->n_full));
        e |= set(lin, "kda_layers", int_list(kda, nk));
        e |= set(tc, "linear_attn_config", lin);
        if (tok->bos_id >= 0) e |= set(tc, "bos_token_id", json_integer(tok->bos_id));
        if (tok->eos_id >= 0) e |= set(tc, "eos_token_id", json_integer(tok->eos_id));
        e |= set(root, "text_config", tc);
        /* MoonViT-V2 stub (spec §1.5); unused by text inference */
        e |= set(vis, "model_type", json_string("moonvit_v2"));
        e |= set(vis, "num_hidden_layers", json_integer(27));
        e |= set(vis, "hidden_size", json_integer(1024));
        e |= set(vis, "patch_size", json_integer(14));
        e |= set(vis, "num_attention_heads", json_integer(12));
        e |= set(vis, "intermediate_size", json_integer(4096));
        e |= set(vis, "merge_kernel_size", json_pack("[ii]", 2, 2));
        e |= set(vis, "mm_projector_type", json_string("patchmergerv2"));
        e |= set(root, "vision_config", vis);
        if (tok->media_id >= 0) e |= set(root, "media_placeholder_token_id", json_integer(tok->media_id));
        e |= set(q, "quant_method", json_string("mxfp4"));
        e |= set(q, "group_size", json_integer(32));
        e |= set(root, "quantization_config", q);
        e |= set(root, "tie_word_embeddings", json_false());
        if (tok->bos_id >= 0) e |= set(root, "bos_token_id", json_integer(tok->bos_id));
        if (tok->eos_id >= 0) e |= set(root, "eos_token_id", json_integer(tok->eos_id));
        e |= set(root, "torch_dtype", json_string("bfloat16"));
    }
    if (e) { json_decref(root); return -1; }
    s = json_dumps(root, JSON_INDENT(flat ? 1 : 2) | JSON_REAL_PRECISION(15));
    json_decref(root);
    if (!s) return -1;
    {   /* one trailing newline */
        size_t l = strlen(s);
        char *t = realloc(s, l + 2);
        if (!t) { free(s); return -1; }
        t[l] = '\n';
        t[l + 1] = 0;
        *out = t;
        *len = l + 1;
    }
    return 0;
}
