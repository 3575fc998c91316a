/* The K3 tensor inventory: names, dtypes and shapes of spec §2. */
#include "k3_schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LM "language_model.model."
#define LAYER_PREFIX LM "layers."

/* Globals carry full names; layer roles carry the part after "layers.{L}.". */
static const char *const suffixes[K3T_COUNT] = {
    [K3T_EMBED] = LM "embed_tokens.weight",
    [K3T_LM_HEAD] = "language_model.lm_head.weight", /* not under model. */
    [K3T_FINAL_NORM] = LM "norm.weight",
    [K3T_OUT_RES_NORM] = LM "output_attn_res_norm.weight",
    [K3T_OUT_RES_PROJ] = LM "output_attn_res_proj.weight",
    [K3T_INPUT_LN] = "input_layernorm.weight",
    [K3T_POST_ATTN_LN] = "post_attention_layernorm.weight",
    [K3T_ATTN_RES_NORM] = "self_attention_res_norm.weight",
    [K3T_ATTN_RES_PROJ] = "self_attention_res_proj.weight",
    [K3T_MLP_RES_NORM] = "mlp_res_norm.weight",
    [K3T_MLP_RES_PROJ] = "mlp_res_proj.weight",
    [K3T_KDA_Q] = "self_attn.q_proj.weight",
    [K3T_KDA_K] = "self_attn.k_proj.weight",
    [K3T_KDA_V] = "self_attn.v_proj.weight",
    [K3T_KDA_G] = "self_attn.g_proj.weight",
    [K3T_KDA_O] = "self_attn.o_proj.weight",
    [K3T_KDA_QCONV] = "self_attn.q_conv1d.weight",
    [K3T_KDA_KCONV] = "self_attn.k_conv1d.weight",
    [K3T_KDA_VCONV] = "self_attn.v_conv1d.weight",
    [K3T_KDA_FA] = "self_attn.f_a_proj.weight",
    [K3T_KDA_FB] = "self_attn.f_b_proj.weight",
    [K3T_KDA_B] = "self_attn.b_proj.weight",
    [K3T_KDA_ALOG] = "self_attn.A_log",
    [K3T_KDA_DTBIAS] = "self_attn.dt_bias",
    [K3T_KDA_ONORM] = "self_attn.o_norm.weight",
    [K3T_MLA_QA] = "self_attn.q_a_proj.weight",
    [K3T_MLA_QA_NORM] = "self_attn.q_a_layernorm.weight",
    [K3T_MLA_QB] = "self_attn.q_b_proj.weight",
    [K3T_MLA_KVA] = "self_attn.kv_a_proj_with_mqa.weight",
    [K3T_MLA_KVA_NORM] = "self_attn.kv_a_layernorm.weight",
    [K3T_MLA_KVB] = "self_attn.kv_b_proj.weight",
    [K3T_MLA_O] = "self_attn.o_proj.weight",
    [K3T_MLA_G] = "self_attn.g_proj.weight",
    [K3T_FFN_GATE] = "mlp.gate_proj.weight",
    [K3T_FFN_UP] = "mlp.up_proj.weight",
    [K3T_FFN_DOWN] = "mlp.down_proj.weight",
    [K3T_MOE_ROUTER] = "block_sparse_moe.gate.weight",
    [K3T_MOE_BIAS] = "block_sparse_moe.gate.e_score_correction_bias",
    [K3T_MOE_DOWN] = "block_sparse_moe.routed_expert_down_proj.weight",
    [K3T_MOE_UP] = "block_sparse_moe.routed_expert_up_proj.weight",
    [K3T_MOE_NORM] = "block_sparse_moe.routed_expert_norm.weight",
    [K3T_SH_GATE] = "block_sparse_moe.shared_experts.gate_proj.weight",
    [K3T_SH_UP] = "block_sparse_moe.shared_experts.up_proj.weight",
    [K3T_SH_DOWN] = "block_sparse_moe.shared_experts.down_proj.weight",
    [K3T_EXP_W1_PACKED] = "w1.weight_packed",
    [K3T_EXP_W1_SCALE] = "w1.weight_scale",
    [K3T_EXP_W2_PACKED] = "w2.weight_packed",
    [K3T_EXP_W2_SCALE] = "w2.weight_scale",
    [K3T_EXP_W3_PACKED] = "w3.weight_packed",
    [K3T_EXP_W3_SCALE] = "w3.weight_scale",
};

const char *k3_role_suffix(k3_role r) { return (unsigned)r < K3T_COUNT ? suffixes[r] : "?"; }

/* Does role r exist in layer L of this config? (Globals and experts aside.) */
static int role_in_layer(const k3_config *c, k3_role r, int L)
{
    int mla = c->layer_is_mla[L], moe = k3_layer_is_moe(c, L);
    if (r >= K3T_INPUT_LN && r <= K3T_MLP_RES_PROJ) return 1;
    if (r >= K3T_KDA_Q && r <= K3T_KDA_ONORM) return !mla;
    if (r == K3T_MLA_G) return mla && c->mla_output_gate;
    if (r >= K3T_MLA_QA && r <= K3T_MLA_O) return mla;
    if (r >= K3T_FFN_GATE && r <= K3T_FFN_DOWN) return !moe;
    if (r >= K3T_MOE_ROUTER && r <= K3T_SH_DOWN) return moe;
    return 0;
}

int k3_schema_layer_roles(const k3_config *c, int L, k3_role *out)
{
    int n = 0;
    for (int r = K3T_INPUT_LN; r <= K3T_SH_DOWN; r++)
        if (role_in_layer(c, (k3_role)r, L)) out[n++] = (k3_role)r;
    return n;
}

void k3_schema_init(k3_schema *s, const k3_config *c)
{
    k3_role roles[K3T_COUNT];
    uint64_t at = 5; /* the five globals come first */
    memset(s, 0, sizeof *s);
    s->cfg = c;
    for (int L = 0; L < c->n_layers; L++) {
        int n = k3_schema_layer_roles(c, L, roles);
        s->layer_first[L] = at;
        s->layer_trunk_count[L] = (uint8_t)n;
        at += (uint64_t)n;
        if (k3_layer_is_moe(c, L)) at += (uint64_t)c->n_experts * 6;
    }
    s->layer_first[c->n_layers] = at;
    s->count = at;
}

#define SHAPE1(a) (out->ndim = 1, out->shape[0] = (uint64_t)(a))
#define SHAPE2(a, b) (out->ndim = 2, out->shape[0] = (uint64_t)(a), out->shape[1] = (uint64_t)(b))

int k3_schema_spec(const k3_config *c, k3_role r, int L, int e, k3_tensor_spec *out)
{
    const uint64_t E = (uint64_t)c->hidden, D = (uint64_t)c->kda_head_dim, Hk = (uint64_t)c->kda_heads;
    const uint64_t P = Hk * D, H = (uint64_t)c->mla_heads;
    const uint64_t dqk = (uint64_t)(c->qk_nope + c->qk_rope), Lt = (uint64_t)c->latent, I = (uint64_t)c->moe_inter;
    const uint64_t Is = (uint64_t)k3_shared_inter(c);

    memset(out, 0, sizeof *out);
    if ((unsigned)r >= K3T_COUNT) return -1;
    out->role = r;
    out->layer = -1;
    out->expert = -1;
    out->dtypes = K3_DTM_FLOAT;
    out->release_dtype = KPK_DT_BF16;

    if (k3_role_is_global(r)) {
        out->kind = KPK_KIND_GLOBALS;
        snprintf(out->name, sizeof out->name, "%s", suffixes[r]);
    } else if (k3_role_is_expert(r)) {
        if (L < 0 || L >= c->n_layers || !k3_layer_is_moe(c, L) || e < 0 || e >= c->n_experts) return -1;
        out->kind = KPK_KIND_EXPERT;
        out->layer = L;
        out->expert = e;
        out->dtypes = K3_DTM(KPK_DT_U8);
        out->release_dtype = KPK_DT_U8;
        snprintf(out->name, sizeof out->name, LAYER_PREFIX "%d.block_sparse_moe.experts.%d.%s", L, e, suffixes[r]);
    } else {
        if (L < 0 || L >= c->n_layers || !role_in_layer(c, r, L)) return -1;
        out->kind = KPK_KIND_TRUNK;
        out->layer = L;
        snprintf(out->name, sizeof out->name, LAYER_PREFIX "%d.%s", L, suffixes[r]);
    }

    switch (r) {
    case K3T_EMBED: case K3T_LM_HEAD: SHAPE2(c->vocab, E); break;
    case K3T_FINAL_NORM: case K3T_OUT_RES_NORM: SHAPE1(E); break;
    case K3T_OUT_RES_PROJ: SHAPE2(1, E); break;
    case K3T_INPUT_LN: case K3T_POST_ATTN_LN: case K3T_ATTN_RES_NORM: case K3T_MLP_RES_NORM: SHAPE1(E); break;
    case K3T_ATTN_RES_PROJ: case K3T_MLP_RES_PROJ: SHAPE2(1, E); break;
    case K3T_KDA_Q: case K3T_KDA_K: case K3T_KDA_V: case K3T_KDA_G: SHAPE2(P, E); break;
    case K3T_KDA_O: SHAPE2(E, P); break;
    case K3T_KDA_QCONV: case K3T_KDA_KCONV: case K3T_KDA_VCONV:
        out->ndim = 3; out->shape[0] = P; out->shape[1] = 1; out->shape[2] = (uint64_t)c->conv_width;
        out->release_dtype = KPK_DT_F32;
        break;
    case K3T_KDA_FA: SHAPE2(D, E); break;
    case K3T_KDA_FB: SHAPE2(P, D); break;
    case K3T_KDA_B: SHAPE2(Hk, E); break;
    /* Stored with D entries, of which the first Hk are meaningful (spec §2.2). */
    case K3T_KDA_ALOG: SHAPE1(D > Hk ? D : Hk); out->release_dtype = KPK_DT_F32; break;
    case K3T_KDA_DTBIAS: SHAPE1(P); out->release_dtype = KPK_DT_F32; break;
    case K3T_KDA_ONORM: SHAPE1(D); out->release_dtype = KPK_DT_F32; break;
    case K3T_MLA_QA: SHAPE2(c->q_lora, E); break;
    case K3T_MLA_QA_NORM: SHAPE1(c->q_lora); break;
    case K3T_MLA_QB: SHAPE2(H * dqk, c->q_lora); break;
    case K3T_MLA_KVA: SHAPE2(c->kv_lora + c->qk_rope, E); break;
    case K3T_MLA_KVA_NORM: SHAPE1(c->kv_lora); break;
    case K3T_MLA_KVB: SHAPE2(H * (uint64_t)(c->qk_nope + c->v_head), c->kv_lora); break;
    case K3T_MLA_O: SHAPE2(E, H * (uint64_t)c->v_head); break;
    case K3T_MLA_G: SHAPE2(H * (uint64_t)c->v_head, E); break;
    case K3T_FFN_GATE: case K3T_FFN_UP: SHAPE2(c->dense_inter, E); break;
    case K3T_FFN_DOWN: SHAPE2(E, c->dense_inter); break;
    case K3T_MOE_ROUTER: SHAPE2(c->n_experts, E); break;
    case K3T_MOE_BIAS: SHAPE1(c->n_experts); out->release_dtype = KPK_DT_F32; break;
    case K3T_MOE_DOWN: SHAPE2(Lt, E); break;
    case K3T_MOE_UP: SHAPE2(E, Lt); break;
    case K3T_MOE_NORM: SHAPE1(Lt); break;
    case K3T_SH_GATE: case K3T_SH_UP: SHAPE2(Is, E); break;
    case K3T_SH_DOWN: SHAPE2(E, Is); break;
    /* MXFP4: packed [rows, in/2], scales [rows, in/32]; w1/w3 read the latent, w2 the intermediate. */
    case K3T_EXP_W1_PACKED: case K3T_EXP_W3_PACKED: SHAPE2(I, Lt / 2); break;
    case K3T_EXP_W1_SCALE: case K3T_EXP_W3_SCALE: SHAPE2(I, Lt / 32); break;
    case K3T_EXP_W2_PACKED: SHAPE2(Lt, I / 2); break;
    case K3T_EXP_W2_SCALE: SHAPE2(Lt, I / 32); break;
    default: return -1;
    }
    return 0;
}

uint64_t k3_schema_index(const k3_schema *s, k3_role r, int L, int e)
{
    const k3_config *c = s->cfg;
    if (k3_role_is_global(r)) return (uint64_t)r;
    if (k3_role_is_expert(r))
        return s->layer_first[L] + s->layer_trunk_count[L] + (uint64_t)e * 6 + (uint64_t)(r - K3T_EXP_W1_PACKED);
    {
        uint64_t i = s->layer_first[L];
        for (int q = K3T_INPUT_LN; q < (int)r; q++) i += (uint64_t)role_in_layer(c, (k3_role)q, L);
        return i;
    }
}

int k3_schema_at(const k3_schema *s, uint64_t idx, k3_tensor_spec *out)
{
    const k3_config *c = s->cfg;
    int lo = 0, hi = c->n_layers - 1;
    if (idx >= s->count) return -1;
    if (idx < 5) return k3_schema_spec(c, (k3_role)idx, -1, -1, out);
    /* binary search for the layer whose range holds idx */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (s->layer_first[mid] <= idx) lo = mid; else hi = mid - 1;
    }
    {
        int L = lo;
        uint64_t rel = idx - s->layer_first[L];
        if (rel < s->layer_trunk_count[L]) {
            k3_role roles[K3T_COUNT];
            k3_schema_layer_roles(c, L, roles);
            return k3_schema_spec(c, roles[rel], L, -1, out);
        }
        rel -= s->layer_trunk_count[L];
        return k3_schema_spec(c, (k3_role)(K3T_EXP_W1_PACKED + (int)(rel % 6)), L, (int)(rel / 6), out);
    }
}

/* Parse a decimal without sign or leading zeros; advances *p. */
static int parse_index(const char **p, long max, long *out)
{
    const char *s = *p;
    long v = 0;
    if (*s < '0' || *s > '9') return -1;
    if (*s == '0' && s[1] >= '0' && s[1] <= '9') return -1;
    while (*s >= '0' && *s <= '9') {
        v = v * 10 + (*s - '0');
        if (v > max) return -1;
        s++;
    }
    *p = s;
    *out = v;
    return 0;
}

static int starts(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

int k3_schema_classify(const k3_config *c, const char *name, k3_tensor_spec *out, char *why, size_t whylen)
{
    const char *p;
    long L, e;
    if (why && whylen) why[0] = 0;
    if (starts(name, "vision_tower.") || starts(name, "mm_projector.")) return K3_CLASS_DROPPED;
    for (int r = 0; r <= K3T_OUT_RES_PROJ; r++)
        if (strcmp(name, suffixes[r]) == 0) return k3_schema_spec(c, (k3_role)r, -1, -1, out) ? K3_CLASS_UNKNOWN : K3_CLASS_TENSOR;
    if (!starts(name, LAYER_PREFIX)) {
        snprintf(why, whylen, "not a Kimi K3 text-model tensor name");
        return K3_CLASS_UNKNOWN;
    }
    p = name + strlen(LAYER_PREFIX);
    if (parse_index(&p, 1L << 30, &L) || *p != '.') {
        snprintf(why, whylen, "malformed layer number");
        return K3_CLASS_UNKNOWN;
    }
    p++;
    if (L >= c->n_layers) {
        snprintf(why, whylen, "layer %ld does not exist (the config has %d layers)", L, c->n_layers);
        return K3_CLASS_UNKNOWN;
    }
    if (starts(p, "block_sparse_moe.experts.")) {
        p += strlen("block_sparse_moe.experts.");
        if (parse_index(&p, 1L << 30, &e) || *p != '.') {
            snprintf(why, whylen, "malformed expert number");
            return K3_CLASS_UNKNOWN;
        }
        p++;
        if (!k3_layer_is_moe(c, (int)L)) {
            snprintf(why, whylen, "layer %ld is a dense-FFN layer and has no routed experts", L);
            return K3_CLASS_UNKNOWN;
        }
        if (e >= c->n_experts) {
            snprintf(why, whylen, "expert %ld does not exist (the config has %d experts)", e, c->n_experts);
            return K3_CLASS_UNKNOWN;
        }
        for (int r = K3T_EXP_W1_PACKED; r <= K3T_EXP_W3_SCALE; r++)
            if (strcmp(p, suffixes[r]) == 0) return k3_schema_spec(c, (k3_role)r, (int)L, (int)e, out) ? K3_CLASS_UNKNOWN : K3_CLASS_TENSOR;
        snprintf(why, whylen, "unknown routed-expert tensor");
        return K3_CLASS_UNKNOWN;
    }
    /* o_proj and g_proj names are shared by KDA and MLA: the layer type decides. */
    for (int r = K3T_INPUT_LN; r <= K3T_SH_DOWN; r++) {
        if (strcmp(p, suffixes[r]) != 0) continue;
        if (k3_schema_spec(c, (k3_role)r, (int)L, -1, out) == 0) return K3_CLASS_TENSOR;
    }
    snprintf(why, whylen, "no such tensor in layer %ld (a %s %s layer)", L, c->layer_is_mla[L] ? "MLA" : "KDA",
             k3_layer_is_moe(c, (int)L) ? "MoE" : "dense-FFN");
    return K3_CLASS_UNKNOWN;
}
