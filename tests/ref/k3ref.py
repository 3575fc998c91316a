#!/usr/bin/python3
"""k3ref: an independent float64 reference of the Kimi K3 forward pass (numpy only).

Written top to bottom from /work/shared/spec/K3_MODEL.md; every step cites the spec
section it implements. It is a test oracle for the C runtime: accuracy and readability
over speed. It runs tiny checkpoints only (the real model would need terabytes of RAM).

    python3 tests/ref/k3ref.py CKPT_DIR --ids 3,7,11 [--gen N] [--mode full|incremental]
                               --out OUT.json [--logits-bin FILE]

Module API:
    model = load_model(dir)
    logits = forward(model, ids)                 # [T][V] float64, teacher forcing
    gen = generate(model, ids, n, incremental=True)   # greedy ids (list of int)
    state = new_state(model); logits = step(model, state, ids)   # carried-state decode
    forward(model, ids, tap=fn) / step(..., tap=fn): fn(L, P) sees each layer's
                                 block-local prefix P after §4.4 step 8 (drafter taps)

Two ways to run: `forward` evaluates §4 over the whole sequence with no carried state
(MLA with expanded per-head keys/values, §4.6); `step` carries the §5 decode state (KDA
S matrices, ShortConv history, and an MLA cache of the compressed latent, attended in
the absorbed form of §5). They must agree to float64 rounding.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_np import Checkpoint  # noqa: E402


# ---------------------------------------------------------------------------------------
# §1.5 config.json: nested (released) or flat (tiny fixtures). Missing required field =
# error, never a default.
# ---------------------------------------------------------------------------------------

class ConfigError(ValueError):
    pass


# (attribute, flat key, nested key, where to look in the nested shape)
# "tc" = text_config, "lac" = text_config.linear_attn_config, "root" = file root.
_INT_KEYS = [
    ("hidden", "hidden_size", "hidden_size", ("tc", "root")),
    ("n_layers", "num_hidden_layers", "num_hidden_layers", ("tc", "root")),
    ("vocab", "vocab_size", "vocab_size", ("tc", "root")),
    # §1.5: "A safer reader takes num_heads/head_dim only from linear_attn_config."
    ("kda_heads", "kda_num_heads", "num_heads", ("lac",)),
    ("kda_dim", "kda_head_dim", "head_dim", ("lac",)),
    # §9: location of these two in the nested shape is uncertain; lac first, then tc.
    ("conv_k", "short_conv_kernel_size", "short_conv_kernel_size", ("lac", "tc", "root")),
    ("mla_heads", "num_attention_heads", "num_attention_heads", ("tc", "root")),
    ("q_lora", "q_lora_rank", "q_lora_rank", ("tc", "root")),
    ("kv_lora", "kv_lora_rank", "kv_lora_rank", ("tc", "root")),
    ("d_nope", "qk_nope_head_dim", "qk_nope_head_dim", ("tc", "root")),
    ("d_rope", "qk_rope_head_dim", "qk_rope_head_dim", ("tc", "root")),
    ("d_v", "v_head_dim", "v_head_dim", ("tc", "root")),
    ("n_experts", "num_experts", "num_experts", ("tc", "root")),
    ("top_k", "num_experts_per_token", "num_experts_per_token", ("tc", "root")),
    ("n_shared", "num_shared_experts", "num_shared_experts", ("tc", "root")),
    ("latent", "routed_expert_hidden_size", "routed_expert_hidden_size", ("tc", "root")),
    ("expert_inter", "moe_intermediate_size", "moe_intermediate_size", ("tc", "root")),
    ("first_dense", "first_k_dense_replace", "first_k_dense_replace", ("tc", "root")),
    ("dense_inter", "intermediate_size", "intermediate_size", ("tc", "root")),
    ("block_size", "attn_res_block_size", "attn_res_block_size", ("tc", "root")),
]
_FLOAT_KEYS = [
    ("eps", "rms_norm_eps", "rms_norm_eps", ("tc", "root")),
    ("lb", "gate_lower_bound", "gate_lower_bound", ("lac", "tc", "root")),
    ("routed_scale", "routed_scaling_factor", "routed_scaling_factor", ("tc", "root")),
    ("beta1", "situ_beta", "activation_situ_beta", ("tc", "root")),
    ("beta2", "situ_linear_beta", "activation_situ_linear_beta", ("tc", "root")),
]
_BOOL_KEYS_DEFAULT_TRUE = [
    ("mla_gate", "mla_use_output_gate"),
    ("renormalize", "moe_renormalize"),
    ("latent_norm", "latent_moe_use_norm"),
]


class Config:
    pass


def _as_bool(v, key):
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise ConfigError(f"config: {key} must be true/false or 0/1, got {v!r}")


def _as_int(v, key):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v):
        raise ConfigError(f"config: {key} must be an integer, got {v!r}")
    return int(v)


def _as_float(v, key):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"config: {key} must be a number, got {v!r}")
    return float(v)


def parse_config(raw):
    """raw: the parsed config.json. Returns a Config with every literal of §4."""
    nested = "text_config" in raw
    if nested:
        tc = raw["text_config"]
        if not isinstance(tc, dict) or not isinstance(tc.get("linear_attn_config"), dict):
            raise ConfigError("config: nested shape needs text_config.linear_attn_config")
        scopes = {"tc": tc, "lac": tc["linear_attn_config"], "root": raw}
    else:
        scopes = {"root": raw}

    def find(flat_key, nested_key, where, required=True):
        if not nested:
            if flat_key in raw:
                return raw[flat_key], flat_key
        else:
            for s in where:
                if nested_key in scopes[s]:
                    return scopes[s][nested_key], nested_key
        if required:
            shown = flat_key if not nested else "/".join(
                {"tc": "text_config", "lac": "text_config.linear_attn_config",
                 "root": "<root>"}[s] for s in where) + "." + nested_key
            raise ConfigError(f"config: missing required field {shown}")
        return None, None

    c = Config()
    c.nested = nested
    for attr, fk, nk, where in _INT_KEYS:
        v, k = find(fk, nk, where)
        setattr(c, attr, _as_int(v, k))
    for attr, fk, nk, where in _FLOAT_KEYS:
        v, k = find(fk, nk, where)
        setattr(c, attr, _as_float(v, k))
    for attr, key in _BOOL_KEYS_DEFAULT_TRUE:      # §1.5: these three default to true
        v, k = find(key, key, ("tc", "root"), required=False)
        setattr(c, attr, True if v is None else _as_bool(v, k))

    v, k = find("full_attn_layers", "full_attn_layers", ("lac",))
    if not isinstance(v, list) or not v:
        raise ConfigError("config: full_attn_layers must be a non-empty list")
    c.full_attn_layers = [_as_int(x, k) for x in v]             # 1-based (§4.2)

    # §1.5: refuse what cannot be honoured rather than ignoring it.
    for key, ok in (("tie_word_embeddings", lambda x: not _as_bool(x, key)),
                    ("num_nextn_predict_layers", lambda x: _as_int(x, key) == 0),
                    ("num_expert_group", lambda x: _as_int(x, key) <= 1),
                    ("mla_use_nope", lambda x: _as_bool(x, key)),
                    ("use_full_rank_gate", lambda x: _as_bool(x, key))):
        v, _ = find(key, key, ("tc", "lac", "root"), required=False)
        if v is not None and not ok(v):
            raise ConfigError(f"config: {key}={v!r} is not supported")

    # §1.5 upstream checks
    if not (1 <= c.top_k <= 64 and c.top_k <= c.n_experts):
        raise ConfigError(f"config: top-k {c.top_k} must be in 1..min(64, {c.n_experts})")
    if any(not (1 <= i <= c.n_layers) for i in c.full_attn_layers):
        raise ConfigError(f"config: full_attn_layers {c.full_attn_layers} outside 1..{c.n_layers}")
    if len(set(c.full_attn_layers)) >= c.n_layers:
        raise ConfigError("config: full_attn_layers must leave at least one KDA layer")
    if c.block_size <= 0 or c.conv_k < 1:
        raise ConfigError("config: attn_res_block_size must be > 0, conv width >= 1")
    if not (0 <= c.first_dense <= c.n_layers):
        raise ConfigError("config: first_k_dense_replace out of range")

    # §4.2: MLA layers are listed 1-based; zero-based MLA layer = entry - 1.
    mla = {i - 1 for i in c.full_attn_layers}
    c.layer_type = ["mla" if L in mla else "kda" for L in range(c.n_layers)]
    return c


# ---------------------------------------------------------------------------------------
# §3 MXFP4 decode
# ---------------------------------------------------------------------------------------

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6,
                 -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def mxfp4_dequant(packed, scale):
    """packed U8 [rows, in/2], scale U8 [rows, in/32] -> float64 [rows, in], exactly.

    §3: byte j of a row holds element 2j in its LOW nibble and 2j+1 in its HIGH nibble;
    scale byte g covers elements 32g..32g+31 of the same row (the input axis); the
    multiplier is 2^(s-127), s=255 -> 0, and s=0 is 2^-127 (no flush to zero).
    """
    rows, half = packed.shape
    n_in = 2 * half
    if scale.shape != (rows, n_in // 32) or n_in % 32:
        raise ValueError(f"MXFP4: packed {packed.shape} and scale {scale.shape} disagree")
    p = packed.astype(np.int64)
    nib = np.empty((rows, n_in), dtype=np.int64)
    nib[:, 0::2] = p & 15          # even element: low nibble
    nib[:, 1::2] = p >> 4          # odd element: high nibble
    s = scale.astype(np.int64)
    mult = np.where(s == 255, 0.0, np.ldexp(1.0, s - 127))
    return E2M1[nib] * np.repeat(mult, 32, axis=1)


# ---------------------------------------------------------------------------------------
# Loading (§2 tensor inventory). Every tensor widened exactly to float64, honouring its
# header dtype (§8 trap 14); routed experts dequantised on first use.
# ---------------------------------------------------------------------------------------

class Model:
    pass


def load_model(ckpt_dir):
    with open(os.path.join(ckpt_dir, "config.json")) as f:
        cfg = parse_config(json.load(f))
    ck = Checkpoint(ckpt_dir)
    E = cfg.hidden

    def get(name, shape):
        if name not in ck:
            raise KeyError(f"tensor missing from checkpoint: {name}")
        if tuple(ck.shape(name)) != tuple(shape):
            raise ValueError(f"{name}: shape {list(ck.shape(name))}, expected {list(shape)}")
        if ck.dtype(name) == "U8":
            raise ValueError(f"{name}: unexpected U8 dtype")
        return ck.float64(name)

    def fold(norm, proj):
        # §4.4: f = res_norm.weight ⊙ res_proj.weight[0, :]
        return get(norm, (E,)) * get(proj, (1, E))[0]

    m = Model()
    m.cfg = cfg
    m.ckpt = ck
    g = "language_model.model."
    # §4.3 embedding: kept as float32 when that is exact (BF16/F16/F32) to save memory;
    # rows are widened to float64 on lookup.
    m.embed = get(g + "embed_tokens.weight", (cfg.vocab, E))
    if ck.dtype(g + "embed_tokens.weight") in ("BF16", "F16", "F32"):
        m.embed = m.embed.astype(np.float32)
    m.lm_head = get("language_model.lm_head.weight", (cfg.vocab, E))    # §2: no "model."
    m.final_norm = get(g + "norm.weight", (E,))
    m.f_out = fold(g + "output_attn_res_norm.weight", g + "output_attn_res_proj.weight")

    H, D = cfg.kda_heads, cfg.kda_dim
    Pk = H * D
    Hm, dn, dr, dv = cfg.mla_heads, cfg.d_nope, cfg.d_rope, cfg.d_v
    m.layers = []
    for L in range(cfg.n_layers):
        p = f"{g}layers.{L}."
        W = {"type": cfg.layer_type[L]}
        W["input_ln"] = get(p + "input_layernorm.weight", (E,))
        W["post_ln"] = get(p + "post_attention_layernorm.weight", (E,))
        W["f_attn"] = fold(p + "self_attention_res_norm.weight", p + "self_attention_res_proj.weight")
        W["f_mlp"] = fold(p + "mlp_res_norm.weight", p + "mlp_res_proj.weight")
        a = p + "self_attn."
        if W["type"] == "kda":
            for n in ("q", "k", "v", "g"):
                W[n + "_proj"] = get(a + n + "_proj.weight", (Pk, E))
            W["o_proj"] = get(a + "o_proj.weight", (E, Pk))
            for n in ("q", "k", "v"):
                # §2.2: [P,1,Kc], middle axis is the depthwise group axis -> [P][Kc]
                W[n + "_conv"] = get(a + n + "_conv1d.weight", (Pk, 1, cfg.conv_k))[:, 0, :]
            W["f_a"] = get(a + "f_a_proj.weight", (D, E))
            W["f_b"] = get(a + "f_b_proj.weight", (Pk, D))
            W["b_proj"] = get(a + "b_proj.weight", (H, E))
            W["A_log"] = get(a + "A_log", ck.shape(a + "A_log"))
            if W["A_log"].ndim != 1 or W["A_log"].shape[0] < H:
                raise ValueError(f"{a}A_log: needs at least {H} values")
            W["dt_bias"] = get(a + "dt_bias", (Pk,))
            W["o_norm"] = get(a + "o_norm.weight", (D,))
        else:
            W["q_a"] = get(a + "q_a_proj.weight", (cfg.q_lora, E))
            W["q_a_ln"] = get(a + "q_a_layernorm.weight", (cfg.q_lora,))
            W["q_b"] = get(a + "q_b_proj.weight", (Hm * (dn + dr), cfg.q_lora))
            W["kv_a"] = get(a + "kv_a_proj_with_mqa.weight", (cfg.kv_lora + dr, E))
            W["kv_a_ln"] = get(a + "kv_a_layernorm.weight", (cfg.kv_lora,))
            W["kv_b"] = get(a + "kv_b_proj.weight", (Hm * (dn + dv), cfg.kv_lora))
            W["o_proj"] = get(a + "o_proj.weight", (E, Hm * dv))
            if cfg.mla_gate:
                W["g_proj"] = get(a + "g_proj.weight", (Hm * dv, E))
        if L < cfg.first_dense:
            W["ffn"] = "dense"
            W["gate_proj"] = get(p + "mlp.gate_proj.weight", (cfg.dense_inter, E))
            W["up_proj"] = get(p + "mlp.up_proj.weight", (cfg.dense_inter, E))
            W["down_proj"] = get(p + "mlp.down_proj.weight", (E, cfg.dense_inter))
        else:
            W["ffn"] = "moe"
            b = p + "block_sparse_moe."
            Lt, Is = cfg.latent, cfg.n_shared * cfg.expert_inter
            W["router"] = get(b + "gate.weight", (cfg.n_experts, E))
            W["router_bias"] = get(b + "gate.e_score_correction_bias", (cfg.n_experts,))
            W["lat_down"] = get(b + "routed_expert_down_proj.weight", (Lt, E))
            W["lat_up"] = get(b + "routed_expert_up_proj.weight", (E, Lt))
            if cfg.latent_norm:
                W["lat_norm"] = get(b + "routed_expert_norm.weight", (Lt,))
            if Is > 0:
                W["sh_gate"] = get(b + "shared_experts.gate_proj.weight", (Is, E))
                W["sh_up"] = get(b + "shared_experts.up_proj.weight", (Is, E))
                W["sh_down"] = get(b + "shared_experts.down_proj.weight", (E, Is))
            # Check every routed expert is present with the right shapes now (§8 trap 17:
            # a dropped expert must fail the run); decode lazily in expert().
            for e in range(cfg.n_experts):
                for w, (rows, cols) in (("w1", (cfg.expert_inter, Lt)),
                                        ("w2", (Lt, cfg.expert_inter)),
                                        ("w3", (cfg.expert_inter, Lt))):
                    base = f"{b}experts.{e}.{w}."
                    for suffix, shape in (("weight_packed", (rows, cols // 2)),
                                          ("weight_scale", (rows, cols // 32))):
                        n = base + suffix
                        if n not in ck:
                            raise KeyError(f"tensor missing from checkpoint: {n}")
                        if ck.dtype(n) != "U8" or tuple(ck.shape(n)) != shape:
                            raise ValueError(f"{n}: {ck.dtype(n)}{list(ck.shape(n))}, "
                                             f"expected U8{list(shape)}")
            W["expert_prefix"] = b + "experts."
            W["experts"] = {}
        m.layers.append(W)
    return m


def expert(model, L, e):
    """(W1 gate, W2 down, W3 up) of routed expert e in layer L, dequantised (§2, §3)."""
    W = model.layers[L]
    if e not in W["experts"]:
        ck, base = model.ckpt, f"{W['expert_prefix']}{e}."
        W["experts"][e] = tuple(
            mxfp4_dequant(ck.raw(base + w + ".weight_packed"), ck.raw(base + w + ".weight_scale"))
            for w in ("w1", "w2", "w3"))
    return W["experts"][e]


# ---------------------------------------------------------------------------------------
# §4.1 primitives (x is [..., n]; everything float64)
# ---------------------------------------------------------------------------------------

def rms_norm(x, w, eps):
    """RMSNorm: w ⊙ x / sqrt(mean(x²) + eps), eps inside the root."""
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def l2_norm(x):
    """L2Norm: x / sqrt(Σ x² + 1e-6) — a SUM, not a mean."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def sigmoid(x):
    e = np.exp(-np.abs(x))                      # stable for large |x|
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def silu(x):
    return x * sigmoid(x)


def situ(g, u, beta1, beta2):
    """SiTU-GLU: [β1·tanh(g/β1)·σ(g)] · [β2·tanh(u/β2)]; σ takes the UNcapped g."""
    return (beta1 * np.tanh(g / beta1) * sigmoid(g)) * (beta2 * np.tanh(u / beta2))


def softmax(s, axis):
    s = s - np.max(s, axis=axis, keepdims=True)
    e = np.exp(s)
    return e / np.sum(e, axis=axis, keepdims=True)


# ---------------------------------------------------------------------------------------
# §4.4 AttnRes aggregator: keys normalised (no weight beyond f), values raw
# ---------------------------------------------------------------------------------------

def attn_res(sources, f, eps):
    """sources: list of [T, E] (oldest block first, prefix last); f: folded [E]."""
    V = np.stack(sources)                                           # [n, T, E]
    keys = V / np.sqrt(np.mean(V * V, axis=-1, keepdims=True) + eps)
    p = softmax(keys @ f, axis=0)                                   # [n, T]
    return np.einsum("nt,nte->te", p, V)


# ---------------------------------------------------------------------------------------
# §4.5 KDA
# ---------------------------------------------------------------------------------------

def short_conv(x, w, hist):
    """Causal depthwise ShortConv with fused SiLU (§4.5.2).

    x: [T, P] new pre-conv values; w: [P, K]; hist: [K-1, P] the previous K-1 pre-conv
    values, oldest first (zeros at sequence start, §5). Taps run oldest -> newest:
    w[:, K-1] multiplies the current input. Returns (SiLU(conv) [T, P], new hist).
    """
    K = w.shape[1]
    T = x.shape[0]
    xs = np.concatenate([hist, x], axis=0)                          # [K-1+T, P]
    acc = np.zeros_like(x)
    for j in range(K):                  # c(t) = Σ_j w[j] · x(t-(K-1)+j)
        acc = acc + w[:, j] * xs[j: j + T]
    return silu(acc), xs[xs.shape[0] - (K - 1):]


def kda_decay(A_log, zeta, dt_bias, H, D, lb):
    """§4.5.4: g = lb·σ(exp(A_log[h])·(ζ + dt_bias)), α = exp(g). A_log is per HEAD:
    only its first H entries are used (§2.2). zeta: [T, H, D]. Returns α [T, H, D]."""
    A = np.exp(A_log[:H])[None, :, None]
    g = lb * sigmoid(A * (zeta + dt_bias.reshape(H, D)))
    return np.exp(g)


def kda_recurrence(q, k, v, alpha, beta, S):
    """§4.5.6, per head, in time order. q (pre-scaled), k, v, alpha: [T, H, D];
    beta: [T, H]; S: [H, D(key i), D(value j)], updated in place. Returns o [T, H, D]."""
    o = np.empty_like(v)
    for t in range(q.shape[0]):
        S *= alpha[t][:, :, None]                                   # 1. decay rows i
        u = np.einsum("hij,hi->hj", S, k[t])                        # 2. read u = Sᵀk
        S += k[t][:, :, None] * (beta[t][:, None] * (v[t] - u))[:, None, :]   # 3. write
        o[t] = np.einsum("hij,hi->hj", S, q[t])                     # 4. o = Sᵀq̂ (updated S)
    return o


def new_kda_state(cfg):
    P = cfg.kda_heads * cfg.kda_dim
    return {"S": np.zeros((cfg.kda_heads, cfg.kda_dim, cfg.kda_dim)),
            "hist": {n: np.zeros((cfg.conv_k - 1, P)) for n in "qkv"}}


def kda_layer(W, cfg, x, st):
    """x: [T, E] normalised layer input (§4.4.4); st: KDA state, updated. Returns y [T, E]."""
    T = x.shape[0]
    H, D = cfg.kda_heads, cfg.kda_dim
    # 1. projections
    qt, kt, vt = x @ W["q_proj"].T, x @ W["k_proj"].T, x @ W["v_proj"].T     # [T, P]
    beta = sigmoid(x @ W["b_proj"].T)                                          # [T, H]
    zeta = (x @ W["f_a"].T) @ W["f_b"].T                       # no activation between
    # 2. ShortConv + SiLU on q, k, v separately
    qc, st["hist"]["q"] = short_conv(qt, W["q_conv"], st["hist"]["q"])
    kc, st["hist"]["k"] = short_conv(kt, W["k_conv"], st["hist"]["k"])
    vc, st["hist"]["v"] = short_conv(vt, W["v_conv"], st["hist"]["v"])
    # 3. L2Norm per head on q and k only
    q = l2_norm(qc.reshape(T, H, D))
    k = l2_norm(kc.reshape(T, H, D))
    v = vc.reshape(T, H, D)
    # 4. decay
    alpha = kda_decay(W["A_log"], zeta.reshape(T, H, D), W["dt_bias"], H, D, cfg.lb)
    # 5. query scaled by 1/sqrt(D) before the recurrence
    q = q / math.sqrt(D)
    # 6. recurrence
    o = kda_recurrence(q, k, v, alpha, beta, st["S"])
    # 7. RMSNorm over D with the one shared o_norm weight; 8. sigmoid gate, then o_proj
    o = rms_norm(o, W["o_norm"], cfg.eps).reshape(T, H * D)
    return (o * sigmoid(x @ W["g_proj"].T)) @ W["o_proj"].T


# ---------------------------------------------------------------------------------------
# §4.6 Gated MLA with NoPE
# ---------------------------------------------------------------------------------------

# K3_MODEL.md §9: the release's modeling_kimi_linear.py builds q_a_layernorm and
# kv_a_layernorm as KimiRMSNorm(rank) with no eps argument, so they take the class
# default 1e-6; every other norm takes rms_norm_eps. This reference follows the release.
MLA_LORA_NORM_EPS = 1e-6


def mla_project(W, cfg, x):
    """Steps 1-2: per-head queries and the compressed latent of each position."""
    T, Hm, dn, dr = x.shape[0], cfg.mla_heads, cfg.d_nope, cfg.d_rope
    cq = rms_norm(x @ W["q_a"].T, W["q_a_ln"], MLA_LORA_NORM_EPS)
    q = (cq @ W["q_b"].T).reshape(T, Hm, dn + dr)        # per head: nope then rope
    kv = x @ W["kv_a"].T
    c_hat = rms_norm(kv[:, :cfg.kv_lora], W["kv_a_ln"], MLA_LORA_NORM_EPS)   # norm: latent only
    k_rope = kv[:, cfg.kv_lora:]                                    # raw, shared by heads
    return q[:, :, :dn], q[:, :, dn:], c_hat, k_rope


def mla_output(W, cfg, x, o):
    """Step 6: o [T, H, dv]; sigmoid gate from the layer input x, before o_proj."""
    o = o.reshape(o.shape[0], -1)
    if cfg.mla_gate:
        o = o * sigmoid(x @ W["g_proj"].T)
    return o @ W["o_proj"].T


def mla_scores_scale(cfg):
    return 1.0 / math.sqrt(cfg.d_nope + cfg.d_rope)                # √(dn+dr), not √dn


def mla_full(W, cfg, x):
    """§4.6 over a whole sequence, expanded per-head keys and values."""
    T, Hm, dn, dv = x.shape[0], cfg.mla_heads, cfg.d_nope, cfg.d_v
    qN, qR, c_hat, kR = mla_project(W, cfg, x)
    kvx = (c_hat @ W["kv_b"].T).reshape(T, Hm, dn + dv)   # 3. per head: k_nope then v
    kN, v = kvx[:, :, :dn], kvx[:, :, dn:]
    # 4. score_h(t,s) = (qN_h(t)·kN_h(s) + qR_h(t)·kR(s)) / √(dn+dr), no rotation
    s = (np.einsum("thd,shd->hts", qN, kN) + np.einsum("thd,sd->hts", qR, kR)) \
        * mla_scores_scale(cfg)
    # 5. causal mask s <= t, softmax over s
    s = np.where(np.tril(np.ones((T, T), dtype=bool))[None], s, -np.inf)
    p = softmax(s, axis=-1)
    o = np.einsum("hts,shd->thd", p, v)
    return mla_output(W, cfg, x, o)


def mla_cached(W, cfg, x, cache):
    """§4.6 for new positions given a §5 latent cache (ĉ, raw k^R per past position),
    attended in the absorbed form: score = ([W_kvb^K,h ᵀ qN_h]·ĉ_s + qR_h·kR_s)/√(dn+dr),
    o_h = W_kvb^V,h · Σ_s p_s ĉ_s. cache is extended in place."""
    T, Hm, dn, dv = x.shape[0], cfg.mla_heads, cfg.d_nope, cfg.d_v
    qN, qR, c_hat, kR = mla_project(W, cfg, x)
    cache["c"] = np.concatenate([cache["c"], c_hat])
    cache["kr"] = np.concatenate([cache["kr"], kR])
    n = cache["c"].shape[0]
    start = n - T                                        # absolute position of x[0]
    Wb = W["kv_b"].reshape(Hm, dn + dv, cfg.kv_lora)
    WK, WV = Wb[:, :dn, :], Wb[:, dn:, :]
    q_lat = np.einsum("thd,hdr->thr", qN, WK)            # [T, H, kv_lora]
    s = (np.einsum("thr,sr->hts", q_lat, cache["c"]) + np.einsum("thd,sd->hts", qR, cache["kr"])) \
        * mla_scores_scale(cfg)
    mask = np.arange(n)[None, :] <= (start + np.arange(T))[:, None]
    p = softmax(np.where(mask[None], s, -np.inf), axis=-1)
    ctx = np.einsum("hts,sr->thr", p, cache["c"])
    o = np.einsum("hdr,thr->thd", WV, ctx)
    return mla_output(W, cfg, x, o)


def new_mla_cache(cfg):
    return {"c": np.zeros((0, cfg.kv_lora)), "kr": np.zeros((0, cfg.d_rope))}


# ---------------------------------------------------------------------------------------
# §4.7 Stable LatentMoE, §4.8 dense FFN
# ---------------------------------------------------------------------------------------

def route(logits, bias, cfg):
    """Router on one position (§4.7.1). logits: [Ne] = W_gate x. Returns (idx, weights).
    Sigmoid scores; the bias only selects; top-k with ties to the lower index; weights
    are the unbiased scores, renormalised when moe_renormalize, times routed scale."""
    s = sigmoid(logits)
    c = s + bias
    idx = np.argsort(-c, kind="stable")[:cfg.top_k]  # descending; stable = lower index first
    w = s[idx]
    if cfg.renormalize:
        w = w / (np.sum(w) + 1e-20)
    return idx, w * cfg.routed_scale


def latent_moe(model, L, x):
    cfg, W = model.cfg, model.layers[L]
    T = x.shape[0]
    logits = x @ W["router"].T                                        # 1. full width
    zeta = x @ W["lat_down"].T                                        # 2. [T, Lt]
    weight = np.zeros((T, cfg.n_experts))                             # routing weights
    for t in range(T):
        idx, w = route(logits[t], W["router_bias"], cfg)
        weight[t, idx] = w
    agg = np.zeros_like(zeta)
    for e in range(cfg.n_experts):                                    # 3. experts
        rows = np.nonzero(weight[:, e])[0]
        if rows.size == 0:
            continue
        W1, W2, W3 = expert(model, L, e)          # w1 = gate, w2 = down, w3 = up
        z = zeta[rows]
        a = situ(z @ W1.T, z @ W3.T, cfg.beta1, cfg.beta2)
        agg[rows] += weight[rows, e][:, None] * (a @ W2.T)
    n = rms_norm(agg, W["lat_norm"], cfg.eps) if cfg.latent_norm else agg   # 4. aggregate
    out = n @ W["lat_up"].T                                           # 5. up-project
    if "sh_gate" in W:                                # 6. fused shared experts on x
        out = out + situ(x @ W["sh_gate"].T, x @ W["sh_up"].T, cfg.beta1, cfg.beta2) \
            @ W["sh_down"].T
    return out


def dense_ffn(W, cfg, x):
    return situ(x @ W["gate_proj"].T, x @ W["up_proj"].T, cfg.beta1, cfg.beta2) \
        @ W["down_proj"].T


# ---------------------------------------------------------------------------------------
# §4.3, §4.4, §4.9: the decoder stack with AttnRes; mixer(L, x) is the attention module
# ---------------------------------------------------------------------------------------

def run_stack(model, ids, mixer, tap=None):
    """tap(L, P), when given, sees the block-local prefix P of every layer L after step 8
    (the h handed to layer L+1): the drafter's taps (K3_EAGLE.md §2.2). It must not
    modify P."""
    cfg = model.cfg
    eps = cfg.eps
    h = model.embed[np.asarray(ids, dtype=np.int64)].astype(np.float64)   # §4.3
    B = []                                       # block snapshots
    for L, W in enumerate(model.layers):
        P = h                                                          # 1.
        a = attn_res(B + [P], W["f_attn"], eps) if B else h            # 2. guarded
        if L % cfg.block_size == 0:                                    # 3. boundary
            B.append(P)
            P = None
        y = mixer(L, rms_norm(a, W["input_ln"], eps))                  # 4.
        P = y if P is None else P + y                                  # 5.
        m = attn_res(B + [P], W["f_mlp"], eps)                         # 6. unguarded
        xf = rms_norm(m, W["post_ln"], eps)                            # 7.
        z = dense_ffn(W, cfg, xf) if W["ffn"] == "dense" else latent_moe(model, L, xf)
        h = P + z                                                      # 8.
        if tap is not None:
            tap(L, h)
    h_out = attn_res(B + [h], model.f_out, eps)                        # §4.9.1
    return rms_norm(h_out, model.final_norm, eps) @ model.lm_head.T    # §4.9.2


def check_ids(model, ids):
    ids = [int(i) for i in ids]
    if not ids:
        raise ValueError("empty id sequence")
    if any(i < 0 or i >= model.cfg.vocab for i in ids):
        raise ValueError(f"token id outside 0..{model.cfg.vocab - 1}")
    return ids


def forward(model, ids, tap=None):
    """Teacher-forced forward over a whole sequence: logits [T, V] (float64).
    tap: see run_stack."""
    ids = check_ids(model, ids)

    def mixer(L, x):
        W = model.layers[L]
        if W["type"] == "kda":
            return kda_layer(W, model.cfg, x, new_kda_state(model.cfg))
        return mla_full(W, model.cfg, x)
    return run_stack(model, ids, mixer, tap)


# ---------------------------------------------------------------------------------------
# §5 incremental decoding with carried state
# ---------------------------------------------------------------------------------------

def new_state(model):
    cfg = model.cfg
    return {"pos": 0,
            "layers": [new_kda_state(cfg) if t == "kda" else new_mla_cache(cfg)
                       for t in cfg.layer_type]}


def step(model, state, ids, tap=None):
    """Feed new ids (the prompt for prefill, then one id per step); returns their logits
    [T_new, V] and advances state. tap: see run_stack."""
    ids = check_ids(model, ids)

    def mixer(L, x):
        W, st = model.layers[L], state["layers"][L]
        if W["type"] == "kda":
            return kda_layer(W, model.cfg, x, st)
        return mla_cached(W, model.cfg, x, st)
    logits = run_stack(model, ids, mixer, tap)
    state["pos"] += len(ids)
    return logits


def argmax_first(v):
    return int(np.argmax(v))                       # numpy returns the first maximum


def generate(model, ids, n, incremental=True, return_logits=False):
    """Greedy decode n ids after `ids` (§4.9.3). incremental: prefill + carried state;
    otherwise the whole sequence is recomputed at every step. With return_logits, also
    returns the list of logit vectors each choice was made from."""
    ids = check_ids(model, ids)
    out, used = [], []
    if n <= 0:
        return (out, used) if return_logits else out
    if incremental:
        state = new_state(model)
        last = step(model, state, ids)[-1]
        for i in range(n):
            used.append(last)
            out.append(argmax_first(last))
            if i + 1 < n:
                last = step(model, state, [out[-1]])[-1]
    else:
        for _ in range(n):
            last = forward(model, ids + out)[-1]
            used.append(last)
            out.append(argmax_first(last))
    return (out, used) if return_logits else out


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description="Kimi K3 float64 reference forward pass")
    ap.add_argument("ckpt_dir")
    ap.add_argument("--ids", required=True, help="comma-separated prompt token ids")
    ap.add_argument("--gen", type=int, default=0, help="greedy ids to generate")
    ap.add_argument("--mode", choices=("full", "incremental"), default="incremental")
    ap.add_argument("--out", required=True, help="output JSON")
    ap.add_argument("--logits-bin", help="float32 LE logits [positions][vocab] of the "
                    "teacher-forced pass over prompt+generated")
    a = ap.parse_args(argv)
    try:
        prompt = [int(s) for s in a.ids.split(",") if s.strip() != ""]
    except ValueError:
        ap.error("--ids must be comma-separated integers")
    try:
        model = load_model(a.ckpt_dir)
        prompt = check_ids(model, prompt)
    except (OSError, ValueError, KeyError) as e:     # ConfigError is a ValueError
        print(f"k3ref: error: {e}", file=sys.stderr)
        return 2

    gen, used = generate(model, prompt, a.gen, incremental=(a.mode == "incremental"),
                         return_logits=True)
    # logits at the last prompt position: those the first greedy choice was made from
    last_logits = used[0] if used else forward(model, prompt)[-1]
    tf = forward(model, prompt + gen)
    res = {"prompt_ids": prompt, "generated_ids": gen,
           "tf_argmax": [argmax_first(r) for r in tf],
           "last_logits": [float(x) for x in last_logits],
           "mode": a.mode}
    with open(a.out, "w") as f:
        json.dump(res, f)
        f.write("\n")
    if a.logits_bin:
        tf.astype("<f4").tofile(a.logits_bin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
