#!/usr/bin/python3
"""eagle_ref: an independent float64 reference of Kimi K3's EAGLE-3.1 MLA drafter (numpy only).

Written from ../shared/spec/K3_EAGLE.md alone (never from the C side); each step cites the
section it implements. The target side is tests/ref/k3ref.py (K3_MODEL.md), whose
`forward(..., tap=fn)` hook yields the block-local prefix P of every layer (§2.2).
Float64 throughout; BF16 weights are widened exactly.

Command line
------------
    eagle_ref.py run TARGET_DIR DRAFTER_DIR --ids 3,7,11,... --out OUT.json
                 [--chains P:K[,P:K...] | --chains all:K] [--top N] [--taps]
                 [--next N --drafts K [--logits-bin FILE]] [--kv-bin FILE]
        TARGET_DIR: a K3 checkpoint in the released safetensors layout (bin/k3synth);
        DRAFTER_DIR: config.json + model.safetensors in the released drafter layout
        (K3_EAGLE §1.3/§1.4, any geometry). The target runs ids[0..n-1] once, teacher
        forced, and yields the taps T(0..n-1).
        * committed drafter row q, q = 0..n-2: (T(q), token ids[q+1]) at position q (§3.8);
        * chain "P:K", 0 <= P <= n-1: committed rows 0..P-1, then the first draft row
          (P, u, Fuse(T(P))) with u = ids[P+1] -- or, for P = n-1, the target's greedy
          token at P --, then rows (P+j-1, d_{j-1}, o_{j-1}) for j = 2..K (§3.2, §4.1).
          A C test that prefills ids[0..n-1] and drafts K tokens compares with "(n-1):K".
          "all:K" is every P in 0..n-1.
        * --drafts K [--next N]: one more chain, at P = n-1, with u = N (the token the
          target emitted after ids; default: its greedy token): what a runtime drafts
          after a prefill of ids. Its ids and margins are also "draft_ids"/"margins";
          --logits-bin writes its logits, float32 little-endian [K][V].
        * --kv-bin: float32 little-endian, the n-1 committed rows [n-1][kv_lora + d_rope]
          (as "kv"), then the pending row's fused g [E] (as "pending_g").
    eagle_ref.py write-random OUT_DIR --target TARGET_DIR [--seed N] [--heads H]
                 [--q-lora R] [--kv-lora R] [--nope N] [--rope N] [--v-dim N] [--inter F]
                 [--aux-ids A,B,C] [--nest] [--no-rope-scaling] [--force]
        A random drafter for that target in the released layout (§1.3: the 20 names,
        BF16, compact header sorted by name with an `__metadata__` entry, space-padded
        to a multiple of 8; config.json with the §1.4 keys). The embedding is the
        target's (as TorchSpec's exporter does, §1.3). Geometry defaults: the target's
        MLA widths; --inter defaults to 18432 at E = 7168, else 2E. --aux-ids default:
        the serving default (2, N//2, N-3) of an N-layer target. --nest puts the model
        keys and eagle_config under text_config.
    eagle_ref.py accept TARGET_DIR DRAFTER_DIR --seqs FILE.jsonl --out OUT.json
                 [--max-drafts 7]
        Offline acceptance (§4.6): FILE.jsonl has one {"prompt": [...], "ids": [...]}
        per line, ids = prompt + the target's greedy continuation (as bin/krun emitted
        it). At every anchor P from len(prompt)-1 on (while P+K+1 < len(ids)) a greedy
        chain of K drafts is replayed and compared with the tokens the target emitted;
        see `acceptance` below for the figures.
    eagle_ref.py selftest
        The §3.7 check values (ω_i, τ), expanded == absorbed attention (§3.8), the
        full-geometry header size (§1.2: 2,128 bytes), the tap-id rule. Prints ok/not ok.

Exit status: 0 done; 1 a self-test failed; 2 bad input (a refused config, roster, dtype,
shape, id; the message names it, prefixed "eagle_ref: error:").

OUT.json of `run` (floats are float64, printed shortest round-trip):
    "schema": "kpk-eagle-ref/1"
    "ids": [n], "tap_layers": [3] (zero-based layers after which P is tapped)
    "target_argmax": [n]        argmax of the target's logits at every position
    "kv": [n-1][kv_lora + d_rope]   committed row q: ĉ (after kv_a_layernorm), then the
                                    ROTATED k^R (position q)
    "pending_g": [E]            Fuse(T(n-1)), the g of the first draft at P = n-1
    "taps": [n][3][E]           (with --taps) T(q), in the config's tap order
    "chains": [{"p0", "k", "u",
                "positions": [k], "drafts": [k] (argmax, first index on ties, §4.2),
                "margin": [k] (top-1 minus top-2 logit),
                "logits": [k][V] | "top": [k][N][id, logit] (with --top N)}]
    "draft_ids": [K], "margins": [K]   (with --drafts) the chain at n-1
    "embed_matches_target": bool   the drafter's embed_tokens equals the target's, byte
                                   for byte (§1.3, §6.5); this reference uses the drafter's

Module API (sys.path.insert(0, "tests/ref"); import eagle_ref as ER):
    D = ER.load_drafter(dir, target_cfg)       # checked against §1.3 and the target
    logits, taps = ER.target_taps(model, ids, D.tap_layers)   # [n,V], [n,3,E]
    kv = ER.committed_rows(D, taps, ids)       # list of (ĉ, k^R)
    ch = ER.chain(D, kv[:P], P, u, taps[P], K) # dict: drafts, logits, o, positions
    m = ER.accepted_lengths(D, model, prompt, ids, K)   # §4.6: per anchor
    ER.acceptance([m, ...], K)                 # a_j, tokens per pass

The reference computes each row in the expanded per-head form of §3.3 step 4;
`attend_absorbed` is the §3.8 form, checked equal by the self-test.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3ref  # noqa: E402
from k3ref import rms_norm, softmax, silu  # noqa: E402  (K3_EAGLE §3.1 = K3_MODEL §4.1)
from safetensors_np import SafetensorsFile  # noqa: E402

SCHEMA = "kpk-eagle-ref/1"
N_TAPS = 3                   # §0: Na = 3; fc reads [T1 | T2 | T3], 3E wide


class RefError(ValueError):
    """Bad input: a refused config, roster, dtype, shape or id (exit 2)."""


# ---------------------------------------------------------------------------------------
# §1.4 config.json
# ---------------------------------------------------------------------------------------

class DraftConfig:
    pass


def _lookup(raw, key):
    """A key at the root or under text_config (§1.4 last paragraph). Present at both
    with different values: refused, since a reader could pick either."""
    tc = raw.get("text_config")
    tc = tc if isinstance(tc, dict) else {}
    here = [d[key] for d in (raw, tc) if key in d]
    if len(here) == 2 and here[0] != here[1]:
        raise RefError(f"drafter config: {key} differs between the root and text_config")
    return here[0] if here else None


def _int(raw, key, lo=1):
    v = _lookup(raw, key)
    if v is None:
        raise RefError(f"drafter config: missing required field {key}")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < lo:
        raise RefError(f"drafter config: {key} must be an integer >= {lo}, got {v!r}")
    return int(v)


def _num(d, key, where, positive=True):
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (positive and v <= 0) \
            or not math.isfinite(v):
        raise RefError(f"drafter config: {where}{key} must be a "
                       f"{'positive ' if positive else ''}number, got {v!r}")
    return float(v)


def _flag(raw, key):
    """fc_norm / norm_output: absent means the contract's value (true); false is refused
    (an EAGLE-3 checkpoint without them is not this contract, §1.1, §6.4)."""
    v = _lookup(raw, key)
    if v is None:
        return
    if v is not True and v != 1:
        raise RefError(f"drafter config: {key}={v!r}: only EAGLE-3.1 ({key} true) is "
                       f"supported (K3_EAGLE §1.1)")


def parse_draft_config(raw):
    if not isinstance(raw, dict):
        raise RefError("drafter config: not a JSON object")
    c = DraftConfig()
    c.hidden = _int(raw, "hidden_size")
    c.inter = _int(raw, "intermediate_size")
    c.layers = _int(raw, "num_hidden_layers")
    if c.layers != 1:                                     # §1.4: one decoder layer
        raise RefError(f"drafter config: num_hidden_layers {c.layers}, the drafter has 1")
    c.heads = _int(raw, "num_attention_heads")
    kvh = _lookup(raw, "num_key_value_heads")
    if kvh is not None and kvh != c.heads:
        raise RefError(f"drafter config: num_key_value_heads {kvh!r} != "
                       f"num_attention_heads {c.heads} (MLA, §1.4)")
    c.q_lora = _int(raw, "q_lora_rank")
    c.kv_lora = _int(raw, "kv_lora_rank")
    c.d_nope = _int(raw, "qk_nope_head_dim")
    c.d_rope = _int(raw, "qk_rope_head_dim", lo=2)
    if c.d_rope % 2:
        raise RefError(f"drafter config: qk_rope_head_dim {c.d_rope} must be even "
                       f"(adjacent pairs, §3.7)")
    c.d_v = _int(raw, "v_head_dim")
    c.vocab = _int(raw, "vocab_size")
    dv = _lookup(raw, "draft_vocab_size")
    if dv is not None and dv != c.vocab:                  # §1.3: no d2t/t2d mapping
        raise RefError(f"drafter config: draft_vocab_size {dv!r} != vocab_size {c.vocab}: "
                       f"a pruned draft vocabulary is not supported (K3_EAGLE §1.3)")
    v = _lookup(raw, "rms_norm_eps")
    if v is None:
        raise RefError("drafter config: missing required field rms_norm_eps")
    c.eps = _num({"rms_norm_eps": v}, "rms_norm_eps", "")
    act = _lookup(raw, "hidden_act")
    if act is not None and act != "silu":                 # §3.1: SwiGLU, not SiTU
        raise RefError(f"drafter config: hidden_act {act!r}, expected \"silu\"")
    tie = _lookup(raw, "tie_word_embeddings")
    if tie not in (None, False, 0):
        raise RefError("drafter config: tie_word_embeddings is true; the drafter's "
                       "lm_head is its own (K3_EAGLE §3.5)")
    _flag(raw, "fc_norm")
    _flag(raw, "norm_output")
    theta = _lookup(raw, "rope_theta")
    if theta is None:
        raise RefError("drafter config: missing required field rope_theta")
    c.rope_theta = _num({"rope_theta": theta}, "rope_theta", "")
    c.max_pos = _lookup(raw, "max_position_embeddings")
    if c.max_pos is not None:
        c.max_pos = _int(raw, "max_position_embeddings")
    # §3.7 / §6.2: YaRN when rope_scaling is given; plain RoPE (θ only) when it is absent.
    rs = _lookup(raw, "rope_scaling")
    if rs is None:
        c.yarn = None
    else:
        if not isinstance(rs, dict):
            raise RefError("drafter config: rope_scaling must be an object or null")
        kind = rs.get("type", rs.get("rope_type"))
        if kind != "yarn":
            raise RefError(f"drafter config: rope_scaling type {kind!r}, only \"yarn\" "
                           f"(K3_EAGLE §3.7)")
        c.yarn = {k: _num(rs, k, "rope_scaling.", positive=(k != "mscale_all_dim"
                                                             and k != "mscale"))
                  for k in ("factor", "original_max_position_embeddings", "beta_fast",
                            "beta_slow", "mscale", "mscale_all_dim")}
    # §1.4 / §2.1: eagle_config.eagle_aux_hidden_state_layer_ids, root or text_config.
    ec = _lookup(raw, "eagle_config")
    ids = ec.get("eagle_aux_hidden_state_layer_ids") if isinstance(ec, dict) else None
    if ids is None:
        raise RefError("drafter config: missing eagle_config.eagle_aux_hidden_state_layer_ids")
    if (not isinstance(ids, list) or len(ids) != N_TAPS
            or any(isinstance(i, bool) or not isinstance(i, int) for i in ids)
            or sorted(set(ids)) != ids):
        raise RefError(f"drafter config: eagle_aux_hidden_state_layer_ids {ids!r} must be "
                       f"{N_TAPS} distinct ascending integers")
    c.aux_ids = list(ids)
    return c


# ---------------------------------------------------------------------------------------
# §2.1 which layers are tapped
# ---------------------------------------------------------------------------------------

def tap_layers(aux_ids, n_layers):
    """Zero-based target layers after which P is tapped (K3_EAGLE §2.1, §6.1).

    * N = 93 (the released K3): the contract hard-codes the taps after zero-based 1, 45,
      89 and only cross-checks the config: [2, 46, 90] (the exported, one-based
      completed-layer ids) and [1, 45, 89] (TorchSpec's zero-based form) are accepted,
      anything else is refused ("never add the +1 shift a second time").
    * Any other depth: the ids are the exported config's convention (§1.4), one-based
      completed-layer ids: capture after zero-based layer id-1, each id in 1..N. (A
      TorchSpec-native config at another depth would be read one too far; the released
      layout is the export, so that is the reading its files need. t30's C side reads
      them the same way: /work/notes/t30-t30r.md.)
    """
    ids, N = list(aux_ids), n_layers
    if N == 93:
        if ids in ([2, 46, 90], [1, 45, 89]):
            return [1, 45, 89]
        raise RefError(f"drafter config: aux layer ids {ids} for the 93-layer K3; the "
                       f"contract's are [2, 46, 90] (or TorchSpec's [1, 45, 89])")
    if any(not (1 <= i <= N) for i in ids):
        raise RefError(f"drafter config: aux layer ids {ids} outside 1..{N} (one-based "
                       f"completed-layer ids of a {N}-layer target)")
    return [i - 1 for i in ids]


# ---------------------------------------------------------------------------------------
# §3.7 RoPE with YaRN (DeepSeek style)
# ---------------------------------------------------------------------------------------

def yarn_mscale(s, m):
    return 0.1 * m * math.log(s) + 1.0 if s > 1 else 1.0


def rope_tables(cfg):
    """(ω [d_rope/2], cos/sin multiplier, τ) of §3.7 for this config."""
    d = cfg.d_rope
    i = np.arange(d // 2, dtype=np.float64)
    e = cfg.rope_theta ** (-2.0 * i / d)                  # extrapolated e_i
    dqk = cfg.d_nope + cfg.d_rope
    if cfg.yarn is None:                                  # §6.2: plain RoPE
        return e, 1.0, 1.0 / math.sqrt(dqk)
    y = cfg.yarn
    s, L0 = y["factor"], y["original_max_position_embeddings"]

    def corr(r):
        return d * math.log(L0 / (2 * math.pi * r)) / (2 * math.log(cfg.rope_theta))
    low = max(math.floor(corr(y["beta_fast"])), 0)
    high = min(math.ceil(corr(y["beta_slow"])), d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((i - low) / (high - low), 0.0, 1.0)
    omega = e * (1 - ramp) + (e / s) * ramp
    cs = yarn_mscale(s, y["mscale"]) / yarn_mscale(s, y["mscale_all_dim"])
    tau = yarn_mscale(s, y["mscale_all_dim"]) ** 2 / math.sqrt(dqk)
    return omega, cs, tau


def rope(x, pos, omega, cs):
    """Rotate adjacent pairs (2i, 2i+1) of the last axis by pos·ω_i (§3.7):
    (a, b) -> (a cos θ - b sin θ, b cos θ + a sin θ), cos and sin times cs."""
    th = pos * omega
    c, s = cs * np.cos(th), cs * np.sin(th)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = b * c + a * s
    return out


# ---------------------------------------------------------------------------------------
# §1.3 the drafter file: the roster, loaded and checked
# ---------------------------------------------------------------------------------------

def roster(c):
    """The 20 tensors of §1.3 at this geometry: name -> shape ([out, in])."""
    E, H, R, dr = c.hidden, c.heads, c.kv_lora, c.d_rope
    p = "layers.0."
    a = p + "self_attn."
    r = {"embed_tokens.weight": (c.vocab, E),
         "fc.weight": (E, N_TAPS * E),
         p + "hidden_norm.weight": (E,),
         p + "input_layernorm.weight": (E,),
         p + "mlp.down_proj.weight": (E, c.inter),
         p + "mlp.gate_proj.weight": (c.inter, E),
         p + "mlp.up_proj.weight": (c.inter, E),
         p + "post_attention_layernorm.weight": (E,),
         a + "kv_a_layernorm.weight": (R,),
         a + "kv_a_proj_with_mqa.weight": (R + dr, 2 * E),
         a + "kv_b_proj.weight": (H * (c.d_nope + c.d_v), R),
         a + "o_proj.weight": (E, H * c.d_v),
         a + "q_a_layernorm.weight": (c.q_lora,),
         a + "q_a_proj.weight": (c.q_lora, 2 * E),
         a + "q_b_proj.weight": (H * (c.d_nope + dr), c.q_lora),
         "lm_head.weight": (c.vocab, E),
         "norm.weight": (E,)}
    for i in range(N_TAPS):
        r[f"fc_norm.{i}.weight"] = (E,)
    return r


class Drafter:
    pass


def load_drafter(ddir, target_cfg=None):
    """config.json + model.safetensors (one file, §1.2). Refuses any roster, dtype or
    shape other than §1.3 at the config's geometry, and, given the target's config, a
    drafter for another model (width, vocabulary, taps)."""
    try:
        with open(os.path.join(ddir, "config.json")) as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise RefError(f"{ddir}/config.json: not JSON: {e}") from None
    c = parse_draft_config(raw)
    st = SafetensorsFile(os.path.join(ddir, "model.safetensors"))
    want = roster(c)
    have = set(st.keys())
    for n in sorted(have - set(want)):
        raise RefError(f"{ddir}/model.safetensors: tensor {n} is not in the drafter roster "
                       f"(K3_EAGLE §1.3)")
    for n in sorted(set(want) - have):
        raise RefError(f"{ddir}/model.safetensors: tensor {n} is missing (K3_EAGLE §1.3)")
    D = Drafter()
    D.cfg, D.dir = c, ddir
    W = {}
    for n, shape in want.items():
        if st.dtype(n) != "BF16":
            raise RefError(f"{ddir}/model.safetensors: {n} is {st.dtype(n)}, the drafter "
                           f"stores every tensor BF16 (K3_EAGLE §1.3)")
        if tuple(st.shape(n)) != shape:
            raise RefError(f"{ddir}/model.safetensors: {n} has shape {list(st.shape(n))}, "
                           f"the config implies {list(shape)}")
        W[n] = st.float64(n)
    D.raw_embed = st.raw("embed_tokens.weight")
    a = "layers.0.self_attn."
    D.embed, D.fc, D.lm_head, D.norm = (W["embed_tokens.weight"], W["fc.weight"],
                                        W["lm_head.weight"], W["norm.weight"])
    D.fc_norm = [W[f"fc_norm.{i}.weight"] for i in range(N_TAPS)]
    D.hidden_norm = W["layers.0.hidden_norm.weight"]
    D.input_ln = W["layers.0.input_layernorm.weight"]
    D.post_ln = W["layers.0.post_attention_layernorm.weight"]
    D.gate, D.up, D.down = (W["layers.0.mlp.gate_proj.weight"], W["layers.0.mlp.up_proj.weight"],
                            W["layers.0.mlp.down_proj.weight"])
    D.q_a, D.q_a_ln, D.q_b = W[a + "q_a_proj.weight"], W[a + "q_a_layernorm.weight"], W[a + "q_b_proj.weight"]
    D.kv_a, D.kv_a_ln, D.kv_b = (W[a + "kv_a_proj_with_mqa.weight"], W[a + "kv_a_layernorm.weight"],
                                 W[a + "kv_b_proj.weight"])
    D.o_proj = W[a + "o_proj.weight"]
    D.omega, D.cs, D.tau = rope_tables(c)
    D.tap_layers = None
    if target_cfg is not None:
        if target_cfg.hidden != c.hidden:
            raise RefError(f"drafter hidden_size {c.hidden} != the target's {target_cfg.hidden}")
        if target_cfg.vocab != c.vocab:
            raise RefError(f"drafter vocab_size {c.vocab} != the target's {target_cfg.vocab}")
        D.tap_layers = tap_layers(c.aux_ids, target_cfg.n_layers)
    return D


def embed_matches(D, model):
    """§1.3, §6.5: is the drafter's embed_tokens the target's, byte for byte?"""
    name = "language_model.model.embed_tokens.weight"
    ck = model.ckpt
    if ck.dtype(name) != "BF16":
        return bool(np.array_equal(D.embed, ck.float64(name)))
    return bool(np.array_equal(D.raw_embed, ck.raw(name)))


# ---------------------------------------------------------------------------------------
# §2 taps from the target (k3ref's forward with its tap hook)
# ---------------------------------------------------------------------------------------

def target_taps(model, ids, layers):
    """One teacher-forced target forward over ids: (logits [n, V], taps [n, 3, E]).
    T_L = P after §4.4 step 8 of zero-based layer L (§2.2), in ascending layer order."""
    got = {}

    def tap(L, P):
        if L in layers:
            got[L] = P.copy()
    logits = k3ref.forward(model, ids, tap=tap)
    return logits, np.stack([got[L] for L in layers], axis=1)


# ---------------------------------------------------------------------------------------
# §3.3 one drafter row
# ---------------------------------------------------------------------------------------

def fuse(D, tap_row):
    """§3.3 step 0: g = W_fc [RMSNorm_fc_norm.0(T1) | ...1(T2) | ...2(T3)], each tap
    normalised on its own."""
    eps = D.cfg.eps
    return D.fc @ np.concatenate([rms_norm(tap_row[i], D.fc_norm[i], eps) for i in range(N_TAPS)])


def layer_input(D, u, g):
    """§3.3 step 1: x = [RMSNorm_input_layernorm(embed(u)) | RMSNorm_hidden_norm(g)]."""
    eps = D.cfg.eps
    return np.concatenate([rms_norm(D.embed[u], D.input_ln, eps), rms_norm(g, D.hidden_norm, eps)])


def kv_entry(D, x, pos):
    """§3.3 step 3: (ĉ, k^R) of one row: ĉ = RMSNorm_kv_a_layernorm(c) over the latent
    only, k^R = the rope part rotated at this row's position (§3.7)."""
    R = D.cfg.kv_lora
    kv = D.kv_a @ x
    return rms_norm(kv[:R], D.kv_a_ln, D.cfg.eps), rope(kv[R:], pos, D.omega, D.cs)


def queries(D, x, pos):
    """§3.3 step 2: per head q^N (dn) and rotated q^R (dr)."""
    c = D.cfg
    cq = rms_norm(D.q_a @ x, D.q_a_ln, c.eps)
    q = (D.q_b @ cq).reshape(c.heads, c.d_nope + c.d_rope)
    return q[:, :c.d_nope], rope(q[:, c.d_nope:], pos, D.omega, D.cs)


def attend_expanded(D, qN, qR, C, KR):
    """§3.3 step 4, expanded: k_h^N(s) = W_kvb^{K,h} ĉ_s, v_h(s) = W_kvb^{V,h} ĉ_s;
    score = τ (q^N·k^N + q^R·k^R), softmax over the rows given (C: [S, R], KR: [S, dr]);
    returns concat_h(o_h) [H·dv]."""
    c = D.cfg
    kvb = D.kv_b.reshape(c.heads, c.d_nope + c.d_v, c.kv_lora)
    kN = np.einsum("hdr,sr->shd", kvb[:, :c.d_nope], C)
    v = np.einsum("hdr,sr->shd", kvb[:, c.d_nope:], C)
    s = D.tau * (np.einsum("hd,shd->hs", qN, kN) + np.einsum("hd,sd->hs", qR, KR))
    p = softmax(s, axis=-1)
    return np.einsum("hs,shd->hd", p, v).reshape(-1)


def attend_absorbed(D, qN, qR, C, KR):
    """§3.8, the absorbed form: q̃_h = (W_kvb^{K,h})ᵀ q_h^N, score = τ(q̃·ĉ + q^R·k^R),
    o_h = W_kvb^{V,h} Σ_s p_s ĉ_s. Equal to attend_expanded (the self-test checks it)."""
    c = D.cfg
    kvb = D.kv_b.reshape(c.heads, c.d_nope + c.d_v, c.kv_lora)
    qt = np.einsum("hdr,hd->hr", kvb[:, :c.d_nope], qN)
    s = D.tau * (qt @ C.T + qR @ KR.T)
    p = softmax(s, axis=-1)
    return np.einsum("hdr,hr->hd", kvb[:, c.d_nope:], p @ C).reshape(-1)


attend = attend_expanded


def row(D, cache, pos, u, g):
    """One drafter row (§3.3) at position pos = its cache index (§3.7): appends its
    (ĉ, k^R) to cache (a list of pairs, len(cache) == pos on entry), attends to rows
    0..pos, returns (o, logits). g is the raw incoming hidden state (r0 = g)."""
    c = D.cfg
    if len(cache) != pos:
        raise ValueError(f"row at position {pos} with {len(cache)} cached rows")
    if c.max_pos is not None and pos >= c.max_pos:
        raise RefError(f"position {pos} >= max_position_embeddings {c.max_pos}")
    x = layer_input(D, u, g)
    cache.append(kv_entry(D, x, pos))
    qN, qR = queries(D, x, pos)
    C = np.stack([e[0] for e in cache])
    KR = np.stack([e[1] for e in cache])
    r1 = g + D.o_proj @ attend(D, qN, qR, C, KR)                 # step 5: no gate
    n = rms_norm(r1, D.post_ln, c.eps)                           # step 6: SwiGLU
    r2 = r1 + D.down @ (silu(D.gate @ n) * (D.up @ n))
    o = rms_norm(r2, D.norm, c.eps)                              # step 7
    return o, D.lm_head @ o


def committed_rows(D, taps, ids):
    """§3.8: committed row q = (T(q), token ids[q+1]) at position q, q = 0..n-2; only its
    KV entry is needed (§3.9). Returns the list of (ĉ, k^R)."""
    out = []
    for q in range(len(ids) - 1):
        out.append(kv_entry(D, layer_input(D, ids[q + 1], fuse(D, taps[q])), q))
    return out


def argmax_margin(v):
    i = int(np.argmax(v))                        # first maximum on ties (§4.2)
    rest = np.delete(v, i)
    return i, float(v[i] - (rest.max() if rest.size else v[i]))


def chain(D, committed, p0, u, tap_row, k):
    """§4.1 step 2: a greedy chain of k drafts. committed: the KV entries of rows
    0..p0-1 (not modified); first row (p0, u, Fuse(T(p0))), then (p0+j-1, d_{j-1},
    o_{j-1}) with the POST-norm o fed back (norm_output, §3.3 step 8)."""
    if len(committed) != p0:
        raise ValueError(f"chain at {p0} given {len(committed)} committed rows")
    cache = list(committed)                      # chain rows are scratch (§3.8)
    g, tok = fuse(D, tap_row), u
    res = {"p0": p0, "k": k, "u": int(u), "positions": [], "drafts": [], "margin": [],
           "logits": [], "o": []}
    for j in range(k):
        o, logits = row(D, cache, p0 + j, tok, g)
        d, margin = argmax_margin(logits)
        res["positions"].append(p0 + j)
        res["drafts"].append(d)
        res["margin"].append(margin)
        res["logits"].append(logits)
        res["o"].append(o)
        g, tok = o, d
    return res


# ---------------------------------------------------------------------------------------
# §4.6 offline acceptance: replay greedy chains against what the target emitted
# ---------------------------------------------------------------------------------------

def accepted_lengths(D, model, prompt, ids, K):
    """For each anchor P = len(prompt)-1 .. (with P+K+1 < len(ids)): m(P), the number of
    leading drafts of a K-chain at P equal to the tokens the target emitted,
    ids[P+2..P+K+1] (draft j is judged by the target at position P+j, §4.1 step 3)."""
    ids = [int(i) for i in ids]
    _, taps = target_taps(model, ids, D.tap_layers)
    kv = committed_rows(D, taps, ids)
    out = []
    for P in range(len(prompt) - 1, len(ids) - K - 1):
        ch = chain(D, kv[:P], P, ids[P + 1], taps[P], K)
        m = 0
        while m < K and ch["drafts"][m] == ids[P + m + 2]:
            m += 1
        out.append(m)
    return out


def acceptance(lengths_per_seq, K, prompt_lens=None):
    """The §4.6 figures from accepted lengths m(P) of K-chains.

    * per-depth a_j = #(m >= j) / #(m >= j-1), pooled over every anchor;
    * tokens per pass at k drafts, every anchor: E[1 + min(m, k)] (= 1 + Σ_{j<=k} Π a_i);
    * simulated passes at width k: start at the prompt's end, accept min(m(P), k), emit
      that plus one target token, move P on by as much; tokens per pass = emitted/passes
      (the chain at P does not depend on k, so m(P) of the K-chain serves every k <= K).
    """
    ms = [m for seq in lengths_per_seq for m in seq]
    n = len(ms)
    a, prev = [], n
    for j in range(1, K + 1):
        cnt = sum(1 for m in ms if m >= j)
        a.append(cnt / prev if prev else 0.0)
        prev = cnt
    every = [1 + sum(min(m, k) for m in ms) / n if n else 0.0 for k in range(1, K + 1)]
    sim = []
    for k in range(1, K + 1):
        passes = toks = 0
        for seq in lengths_per_seq:
            i = 0
            while i < len(seq):          # seq[i] is m at anchor prompt_len-1+i
                acc = min(seq[i], k)
                passes += 1
                toks += acc + 1
                i += acc + 1
        sim.append(toks / passes if passes else 0.0)
    return {"anchors": n, "a": a, "tokens_per_pass_every_anchor": every,
            "tokens_per_pass_simulated": sim,
            "first_draft_accept": a[0] if a else 0.0}


# ---------------------------------------------------------------------------------------
# Writing a drafter in the released layout (§1.2-§1.4)
# ---------------------------------------------------------------------------------------

def f64_to_bf16(x):
    """float64 -> BF16 bit patterns, round to nearest even (via float32, exact for the
    values written here: they are drawn as float32 first)."""
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return r.astype(np.uint16)


def safetensors_header(entries, metadata):
    """entries: (name, dtype, shape, nbytes). The header as the release lays it out (§1.2,
    §1.3 [X]): compact JSON, tensors sorted by name after the `__metadata__` key (which
    sorts first), entry keys dtype, shape, data_offsets, data in the same order with no
    gaps, space-padded to a multiple of 8. Returns (the 8 + N header bytes, names in
    data order)."""
    entries = sorted(entries)
    off = 0
    parts = ['"__metadata__":' + json.dumps(metadata, separators=(",", ":"), sort_keys=True)]
    for n, dt, shape, nb in entries:
        parts.append(json.dumps(n) + ":" + json.dumps(
            {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + nb]},
            separators=(",", ":")))
        off += nb
    head = ("{" + ",".join(parts) + "}").encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head, [e[0] for e in entries]


# TorchSpec writes its version here (§1.2); a 5-character value gives the release's
# 2,128-byte header at full geometry. "synth" says what the file is.
METADATA = {"torchspec_version": "synth"}


def draft_config_json(c, aux_ids, nest=False, yarn=True):
    """config.json with the §1.4 keys at this geometry."""
    model = {"hidden_size": c.hidden, "intermediate_size": c.inter,
             "num_hidden_layers": 1, "num_attention_heads": c.heads,
             "num_key_value_heads": c.heads, "q_lora_rank": c.q_lora,
             "kv_lora_rank": c.kv_lora, "qk_nope_head_dim": c.d_nope,
             "qk_rope_head_dim": c.d_rope, "v_head_dim": c.d_v, "hidden_act": "silu",
             "rms_norm_eps": 1e-05, "vocab_size": c.vocab, "draft_vocab_size": c.vocab,
             "torch_dtype": "bfloat16", "rope_theta": 50000.0,
             "max_position_embeddings": 1048576, "mla_use_nope": True,
             "fc_norm": True, "norm_output": True, "tie_word_embeddings": False}
    if yarn:
        model["rope_scaling"] = {"type": "yarn", "factor": 32.0,
                                 "original_max_position_embeddings": 32768,
                                 "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                                 "mscale_all_dim": 1.0}
    else:
        model["max_position_embeddings"] = 32768
    eagle = {"eagle_aux_hidden_state_layer_ids": list(aux_ids), "use_aux_hidden_state": True,
             "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True,
             "use_mtp_layernorm": False}
    top = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2",
           "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 0}
    if nest:
        model["eagle_config"] = eagle
        top["text_config"] = model
    else:
        top.update(model)
        top["eagle_config"] = eagle
    return top


def write_drafter(out_dir, c, arrays, nest=False, raw_bf16=None, metadata=METADATA):
    """c: a parsed config (geometry, aux ids, YaRN or not); arrays: name -> float array
    (rounded to BF16 here); raw_bf16: name -> uint16 bit patterns written as they are
    (the target's embedding)."""
    want = roster(c)
    data = {}
    for n, shape in want.items():
        bits = raw_bf16[n] if raw_bf16 and n in raw_bf16 else f64_to_bf16(arrays[n])
        if tuple(bits.shape) != shape:
            raise ValueError(f"{n}: shape {bits.shape}, roster {shape}")
        data[n] = np.ascontiguousarray(bits, dtype="<u2").tobytes()
    head, order = safetensors_header([(n, "BF16", want[n], len(data[n])) for n in want],
                                     metadata)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "model.safetensors"), "wb") as f:
        f.write(head)
        for n in order:
            f.write(data[n])
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(draft_config_json(c, c.aux_ids, nest, c.yarn is not None), f, indent=2)
        f.write("\n")


def random_weights(c, seed):
    """Weights that make every §7 trap visible in the chains of a tiny drafter: unit-scale
    activations through RMS-normalised inputs ("gain g" = N(0, g/√fan_in)), norm gains
    U(0.8, 1.2), attention scores of std ~3 after τ (neither uniform nor one-hot, so τ,
    RoPE and the rope rows all move them), logits of std ~3."""
    rng = np.random.default_rng(seed)
    E, H, R, dr, dn, dv = c.hidden, c.heads, c.kv_lora, c.d_rope, c.d_nope, c.d_v

    def lin(rows, cols, gain):
        return (rng.standard_normal((rows, cols)) * (gain / math.sqrt(cols))).astype(np.float32)

    def gains(n):
        return rng.uniform(0.8, 1.2, n).astype(np.float32)
    p, a = "layers.0.", "layers.0.self_attn."
    W = {"fc.weight": lin(E, N_TAPS * E, 1.0),
         p + "hidden_norm.weight": gains(E), p + "input_layernorm.weight": gains(E),
         p + "post_attention_layernorm.weight": gains(E), "norm.weight": gains(E),
         a + "q_a_layernorm.weight": gains(c.q_lora), a + "kv_a_layernorm.weight": gains(R),
         a + "q_a_proj.weight": lin(c.q_lora, 2 * E, 1.0),
         a + "q_b_proj.weight": lin(H * (dn + dr), c.q_lora, 0.8),
         a + "o_proj.weight": lin(E, H * dv, 2.0),
         p + "mlp.gate_proj.weight": lin(c.inter, E, 1.5),
         p + "mlp.up_proj.weight": lin(c.inter, E, 1.5),
         p + "mlp.down_proj.weight": lin(E, c.inter, 2.0),
         "lm_head.weight": lin(c.vocab, E, 3.0)}
    for i in range(N_TAPS):
        W[f"fc_norm.{i}.weight"] = gains(E)
    gk = math.sqrt(2.0 * (dn + dr) / dn)                 # key rows: nope and rope halves
    kv_a = lin(R + dr, 2 * E, 1.0)                       # of the score of equal variance
    kv_a[R:] *= gk * math.sqrt(dn / dr)
    W[a + "kv_a_proj_with_mqa.weight"] = kv_a
    kvb = lin(H * (dn + dv), R, 1.0).reshape(H, dn + dv, R)
    kvb[:, :dn] *= gk
    W[a + "kv_b_proj.weight"] = kvb.reshape(H * (dn + dv), R)
    W["embed_tokens.weight"] = rng.standard_normal((c.vocab, E)).astype(np.float32)
    return W


def geometry(target_cfg, aux_ids=None, yarn=True, heads=None, q_lora=None, kv_lora=None,
             nope=None, rope_dim=None, v_dim=None, inter=None):
    """The parsed config of a drafter for this target: its width and vocabulary, the
    target's MLA widths unless given, --inter 18432 at E = 7168 else 2E, the §1.4 values
    for the rest; aux ids default to the serving default of its depth."""
    c = DraftConfig()
    t = target_cfg
    c.hidden, c.vocab = t.hidden, t.vocab
    c.heads = heads or t.mla_heads
    c.q_lora, c.kv_lora = q_lora or t.q_lora, kv_lora or t.kv_lora
    c.d_nope, c.d_rope, c.d_v = nope or t.d_nope, rope_dim or t.d_rope, v_dim or t.d_v
    c.inter = inter or (18432 if t.hidden == 7168 else 2 * t.hidden)
    aux = aux_ids or default_aux_ids(t.n_layers)
    tap_layers(aux, t.n_layers)                          # refuse ids the reader would
    return parse_draft_config(draft_config_json(c, aux, yarn=yarn))


def default_aux_ids(n_layers):
    """The serving default (2, N//2, N-3) (§2.1): [2, 46, 90] at N = 93."""
    return [2, n_layers // 2, n_layers - 3]


def write_random(out_dir, target_dir, seed=1, aux_ids=None, nest=False, yarn=True, **geo):
    with open(os.path.join(target_dir, "config.json")) as f:
        tcfg = k3ref.parse_config(json.load(f))
    c = geometry(tcfg, aux_ids, yarn, **geo)
    W = random_weights(c, seed)
    from safetensors_np import Checkpoint
    ck = Checkpoint(target_dir)
    name = "language_model.model.embed_tokens.weight"
    raw = {"embed_tokens.weight": ck.raw(name)} if ck.dtype(name) == "BF16" else None
    if raw is None:
        W["embed_tokens.weight"] = ck.float64(name)
    write_drafter(out_dir, c, W, nest=nest, raw_bf16=raw)
    return c


# ---------------------------------------------------------------------------------------
# Self-test (also run by tests/ref/test_eagle_ref.py)
# ---------------------------------------------------------------------------------------

def release_config():
    """The §1.4 config at full geometry (for the check values and the header size)."""
    c = DraftConfig()
    c.hidden, c.inter, c.heads, c.q_lora, c.kv_lora = 7168, 18432, 64, 1536, 512
    c.d_nope, c.d_rope, c.d_v, c.vocab = 128, 64, 128, 163840
    return parse_draft_config(draft_config_json(c, [2, 46, 90]))


def selftest(report):
    c = release_config()
    omega, cs, tau = rope_tables(c)
    want = {0: 1.0, 1: 0.713111, 2: 0.508527, 15: 6.27130e-3, 16: 4.07828e-3,
            20: 6.47243e-4, 26: 4.75266e-6, 31: 8.76441e-7}            # §3.7 check values
    worst = max(abs(omega[i] - v) / v for i, v in want.items())
    report(worst < 5e-6, f"§3.7 YaRN ω_i at the 8 check values (worst rel {worst:.1e})")
    report(abs(tau - 0.13086080) < 5e-9 and cs == 1.0,
           f"§3.7 τ = {tau:.8f} (0.13086080), cos/sin multiplier {cs}")
    plain = DraftConfig()
    plain.__dict__.update(c.__dict__)
    plain.yarn = None
    om2, _, tau2 = rope_tables(plain)
    report(np.array_equal(om2[:16], omega[:16]) and not np.allclose(om2[16:], omega[16:])
           and abs(tau2 - 1 / math.sqrt(192)) < 1e-15,
           "§6.2 plain RoPE differs from YaRN only in ω_16..31 and τ = 1/√192")
    report(tap_layers([2, 46, 90], 93) == [1, 45, 89] and tap_layers([1, 45, 89], 93) == [1, 45, 89],
           "§2.1 tap ids: [2,46,90] and [1,45,89] both mean after zero-based 1, 45, 89")
    try:
        tap_layers([3, 47, 91], 93)
        report(False, "§2.1 tap ids [3,47,91] at 93 layers refused")
    except RefError:
        report(True, "§2.1 tap ids [3,47,91] at 93 layers refused")
    report(tap_layers([2, 6, 9], 12) == [1, 5, 8] and tap_layers([1, 5, 8], 12) == [0, 4, 7]
           and tap_layers([3, 7, 12], 12) == [2, 6, 11],
           "§2.1 tap ids at 12 layers: one-based completed-layer ids ([2,6,9] -> after 1,5,8)")
    # §1.2: the release's roster gives a 2,128-byte header and a 6,031,253,592-byte file.
    ents = [(n, "BF16", sh, 2 * int(np.prod(sh))) for n, sh in roster(c).items()]
    head, _ = safetensors_header(ents, METADATA)
    total = len(head) + sum(e[3] for e in ents)
    own = total - len(head) - 2 * c.vocab * c.hidden
    report(len(head) - 8 == 2128 and total == 6031253592 and own == 3682441216,
           f"§1.2 full-geometry header {len(head) - 8} B (2,128), file {total} B "
           f"(6,031,253,592), all but the embedding {own} B (3,682,441,216)")
    # expanded == absorbed (§3.8) on a random tiny drafter's attention.
    rng = np.random.default_rng(5)
    t = DraftConfig()
    t.hidden, t.inter, t.heads, t.q_lora, t.kv_lora = 16, 24, 3, 12, 10
    t.d_nope, t.d_rope, t.d_v, t.vocab = 6, 4, 5, 20
    t = parse_draft_config(draft_config_json(t, [2, 3, 5]))
    D = Drafter()
    D.cfg = t
    D.kv_b = rng.standard_normal((t.heads * (t.d_nope + t.d_v), t.kv_lora))
    D.omega, D.cs, D.tau = rope_tables(t)
    qN, qR = rng.standard_normal((t.heads, t.d_nope)), rng.standard_normal((t.heads, t.d_rope))
    C, KR = rng.standard_normal((7, t.kv_lora)), rng.standard_normal((7, t.d_rope))
    diff = np.max(np.abs(attend_expanded(D, qN, qR, C, KR) - attend_absorbed(D, qN, qR, C, KR)))
    report(diff < 1e-12, f"§3.8 absorbed attention == expanded (max diff {diff:.1e})")
    return c


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------

def _ids(s, what="--ids"):
    try:
        v = [int(x) for x in s.split(",") if x.strip() != ""]
    except ValueError:
        raise RefError(f"{what} must be comma-separated integers") from None
    if not v:
        raise RefError(f"{what} is empty")
    return v


def _load_pair(target_dir, drafter_dir):
    model = k3ref.load_model(target_dir)
    return model, load_drafter(drafter_dir, model.cfg)


def cmd_run(a):
    model, D = _load_pair(a.target, a.drafter)
    ids = k3ref.check_ids(model, _ids(a.ids))
    n = len(ids)
    logits, taps = target_taps(model, ids, D.tap_layers)
    targ = [int(np.argmax(r)) for r in logits]
    kv = committed_rows(D, taps, ids)
    specs = []
    if a.chains:
        try:
            if a.chains.startswith("all:"):
                specs = [(p, int(a.chains[4:])) for p in range(n)]
            else:
                specs = [tuple(int(x) for x in part.split(":")) for part in a.chains.split(",")]
        except ValueError:
            raise RefError(f"--chains {a.chains!r}: expected P:K[,P:K...] or all:K") from None
    if a.next is not None and not (0 <= a.next < model.cfg.vocab):
        raise RefError(f"--next {a.next} outside 0..{model.cfg.vocab - 1}")
    if a.drafts:
        specs.append((n - 1, a.drafts))
    chains = []
    for spec in specs:
        if len(spec) != 2 or not (0 <= spec[0] < n) or spec[1] < 1:
            raise RefError(f"--chains {spec}: need P:K with 0 <= P < {n} and K >= 1")
        p, k = spec
        u = ids[p + 1] if p + 1 < n else (a.next if a.next is not None else targ[p])
        chains.append(chain(D, kv[:p], p, u, taps[p], k))
    res = {"schema": SCHEMA, "ids": ids, "tap_layers": D.tap_layers, "target_argmax": targ,
           "embed_matches_target": embed_matches(D, model),
           "kv": [[float(x) for x in np.concatenate(e)] for e in kv],
           "pending_g": [float(x) for x in fuse(D, taps[n - 1])], "chains": []}
    for ch in chains:
        out = {x: ch[x] for x in ("p0", "k", "u", "positions", "drafts", "margin")}
        if a.top:
            out["top"] = [[[int(i), float(L[i])] for i in np.argsort(-L, kind="stable")[:a.top]]
                          for L in ch["logits"]]
        else:
            out["logits"] = [[float(x) for x in L] for L in ch["logits"]]
        res["chains"].append(out)
    if a.drafts:
        res["draft_ids"], res["margins"] = chains[-1]["drafts"], chains[-1]["margin"]
        if a.logits_bin:
            np.asarray(chains[-1]["logits"], dtype="<f4").tofile(a.logits_bin)
    if a.kv_bin:
        rows = [np.concatenate(e) for e in kv] + [fuse(D, taps[n - 1])]
        np.concatenate(rows).astype("<f4").tofile(a.kv_bin)
    if a.taps:
        res["taps"] = [[[float(x) for x in t] for t in tr] for tr in taps]
    if not res["embed_matches_target"]:
        print("eagle_ref: note: the drafter's embed_tokens differs from the target's; "
              "this reference uses the drafter's (K3_EAGLE §1.3)", file=sys.stderr)
    with open(a.out, "w") as f:
        json.dump(res, f)
        f.write("\n")
    return 0


def cmd_write_random(a):
    if os.path.exists(os.path.join(a.out_dir, "model.safetensors")) and not a.force:
        raise RefError(f"{a.out_dir}/model.safetensors exists (use --force)")
    write_random(a.out_dir, a.target, seed=a.seed,
                 aux_ids=_ids(a.aux_ids, "--aux-ids") if a.aux_ids else None,
                 nest=a.nest, yarn=not a.no_rope_scaling, heads=a.heads, q_lora=a.q_lora,
                 kv_lora=a.kv_lora, nope=a.nope, rope_dim=a.rope, v_dim=a.v_dim,
                 inter=a.inter)
    return 0


def cmd_accept(a):
    model, D = _load_pair(a.target, a.drafter)
    per_seq = []
    with open(a.seqs) as f:
        for line in f:
            if not line.strip():
                continue
            s = json.loads(line)
            ids = k3ref.check_ids(model, s["ids"])
            per_seq.append(accepted_lengths(D, model, s["prompt"], ids, a.max_drafts))
    res = acceptance(per_seq, a.max_drafts)
    res["max_drafts"] = a.max_drafts
    res["sequences"] = len(per_seq)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    return 0


def cmd_selftest(_a):
    bad = []

    def report(ok, what):
        print(("ok - " if ok else "not ok - ") + what)
        if not ok:
            bad.append(what)
    selftest(report)
    return 1 if bad else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description="float64 reference of the K3 EAGLE-3.1 drafter")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("target")
    r.add_argument("drafter")
    r.add_argument("--ids", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--chains")
    r.add_argument("--top", type=int, default=0)
    r.add_argument("--taps", action="store_true")
    r.add_argument("--next", type=int)
    r.add_argument("--drafts", type=int, default=0)
    r.add_argument("--logits-bin")
    r.add_argument("--kv-bin")
    w = sub.add_parser("write-random")
    w.add_argument("out_dir")
    w.add_argument("--target", required=True)
    w.add_argument("--seed", type=int, default=1)
    for o in ("heads", "q-lora", "kv-lora", "nope", "rope", "v-dim", "inter"):
        w.add_argument("--" + o, type=int)
    w.add_argument("--aux-ids")
    w.add_argument("--nest", action="store_true")
    w.add_argument("--no-rope-scaling", action="store_true")
    w.add_argument("--force", action="store_true")
    c = sub.add_parser("accept")
    c.add_argument("target")
    c.add_argument("drafter")
    c.add_argument("--seqs", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--max-drafts", type=int, default=7)
    sub.add_parser("selftest")
    a = ap.parse_args(argv)
    try:
        return {"run": cmd_run, "write-random": cmd_write_random, "accept": cmd_accept,
                "selftest": cmd_selftest}[a.cmd](a)
    except (OSError, ValueError, KeyError) as e:      # RefError, ConfigError are ValueErrors
        print(f"eagle_ref: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
