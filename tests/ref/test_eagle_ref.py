#!/usr/bin/python3
"""Checks tests/ref/eagle_ref.py, the float64 reference of the K3 EAGLE-3.1 drafter.

    /usr/bin/python3 tests/ref/test_eagle_ref.py [--target DIR]... [--k3synth BIN]

Prints TAP-like lines ("ok - ", "not ok - ", "skip - ") and exits non-zero on a failure.

1. The self-test: the §3.7 check values (ω_i, τ), absorbed == expanded attention (§3.8),
   the release's header size (§1.2), the tap-id rule (§2.1).
2. Hand cases: RoPE of one pair, two-row attention with a known score gap, and a chain
   whose result has a closed form (fc picks tap 1, no attention or MLP output: o is
   RMSNorm(RMSNorm(T1)) and the feedback keeps it).
3. A literal second implementation (scalar loops over Python floats, written from
   K3_EAGLE §3.3/§3.7/§3.8 in another shape: per-head expanded keys, explicit cos/sin per
   pair, YaRN from its formula) against eagle_ref on random micro drafters: committed rows
   and a 4-step chain after 3 committed rows, 1e-12.
4. The writer and reader: write-random round trip (the roster, BF16, the header's
   `__metadata__`, nested and root configs), refusals (a missing/extra/F32/misshapen
   tensor, another width or vocabulary, bad tap ids, num_hidden_layers 2, norm_output
   false, a non-yarn rope_scaling).
5. With a target (--target DIR, a K3 checkpoint; or --k3synth BIN to make a 12-layer one):
   the taps are P after step 8 (the closed form of §2.2 from the layer outputs), and every
   §7 trap, monkeypatched into eagle_ref here (eagle_ref.py has no broken paths), moves the
   outputs a C comparison checks (KV rows, chain logits, drafts) by far more than the
   tolerance in docs/DRAFTER.md.
"""
import argparse
import copy
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import eagle_ref as ER  # noqa: E402
import k3ref  # noqa: E402

failures = 0


def report(ok, what):
    global failures
    print(("ok - " if ok else "not ok - ") + what)
    sys.stdout.flush()
    if not ok:
        failures += 1


# ---------------------------------------------------------------------------------------
# micro drafters built in memory
# ---------------------------------------------------------------------------------------

def micro_config(E=6, V=11, H=2, q_lora=5, kv_lora=4, dn=3, dr=4, dv=3, inter=7,
                 yarn=True, aux=(2, 3, 5)):
    c = ER.DraftConfig()
    c.hidden, c.vocab, c.heads, c.q_lora, c.kv_lora = E, V, H, q_lora, kv_lora
    c.d_nope, c.d_rope, c.d_v, c.inter = dn, dr, dv, inter
    return ER.parse_draft_config(ER.draft_config_json(c, list(aux), yarn=yarn))


def drafter_from(c, W):
    """A Drafter from float arrays by roster name (no file, no BF16 rounding)."""
    D = ER.Drafter()
    D.cfg = c
    a = "layers.0.self_attn."
    D.embed, D.fc, D.lm_head, D.norm = (W["embed_tokens.weight"], W["fc.weight"],
                                        W["lm_head.weight"], W["norm.weight"])
    D.fc_norm = [W[f"fc_norm.{i}.weight"] for i in range(3)]
    D.hidden_norm = W["layers.0.hidden_norm.weight"]
    D.input_ln = W["layers.0.input_layernorm.weight"]
    D.post_ln = W["layers.0.post_attention_layernorm.weight"]
    D.gate, D.up, D.down = (W["layers.0.mlp.gate_proj.weight"], W["layers.0.mlp.up_proj.weight"],
                            W["layers.0.mlp.down_proj.weight"])
    D.q_a, D.q_a_ln, D.q_b = W[a + "q_a_proj.weight"], W[a + "q_a_layernorm.weight"], W[a + "q_b_proj.weight"]
    D.kv_a, D.kv_a_ln, D.kv_b = (W[a + "kv_a_proj_with_mqa.weight"], W[a + "kv_a_layernorm.weight"],
                                 W[a + "kv_b_proj.weight"])
    D.o_proj = W[a + "o_proj.weight"]
    D.omega, D.cs, D.tau = ER.rope_tables(c)
    D.tap_layers = None
    return D


def random_micro(c, seed):
    W = {n: a.astype(np.float64) for n, a in ER.random_weights(c, seed).items()}
    return drafter_from(c, W)


# ---------------------------------------------------------------------------------------
# 2. hand cases
# ---------------------------------------------------------------------------------------

def hand_cases():
    # RoPE of one pair at position 3 with ω_0 = 1 (e_0 = θ^0 = 1 whatever θ, ramp 0):
    # (1, 2) -> (cos 3 - 2 sin 3, 2 cos 3 + sin 3).
    c = micro_config(dr=2, dn=2)
    om, cs, tau = ER.rope_tables(c)
    got = ER.rope(np.array([1.0, 2.0]), 3, om, cs)
    want = [math.cos(3) - 2 * math.sin(3), 2 * math.cos(3) + math.sin(3)]
    report(np.max(np.abs(got - want)) < 1e-15 and om[0] == 1.0,
           "hand: RoPE of the pair (1, 2) at position 3 with ω_0 = 1 is (cos3 - 2sin3, 2cos3 + sin3)")
    # RoPE is a rotation: q·k depends on the positions' difference only.
    c8 = micro_config(dr=8)
    om, cs, _ = ER.rope_tables(c8)
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal(8), rng.standard_normal(8)
    d1 = ER.rope(q, 9, om, cs) @ ER.rope(k, 4, om, cs)
    d2 = ER.rope(q, 105, om, cs) @ ER.rope(k, 100, om, cs)
    report(abs(d1 - d2) < 1e-12, "hand: rotated q·k depends only on the position difference")

    # Two-row attention, one head, q^N = 0: score(s) = τ q^R·k^R(s). With q^R = (1, 0) at
    # position 0 (unrotated) and k^R(0) = (a, 0), k^R(1) = (0, 0): the scores are τa and
    # 0, so p = (σ(τa), 1 - σ(τa)); v(s) = W_V ĉ_s with W_V = I.
    c = micro_config(H=1, dn=2, dr=2, dv=2, kv_lora=2)
    D = random_micro(c, 1)
    D.kv_b = np.vstack([np.zeros((2, 2)), np.eye(2)])          # k_nope rows 0, v rows I
    a = 1.7
    C = np.array([[1.0, 2.0], [-3.0, 0.5]])
    KR = np.array([[a, 0.0], [0.0, 0.0]])
    out = ER.attend_expanded(D, np.zeros((1, 2)), np.array([[1.0, 0.0]]), C, KR)
    p0 = 1 / (1 + math.exp(-D.tau * a))
    want = p0 * C[0] + (1 - p0) * C[1]
    report(np.max(np.abs(out - want)) < 1e-14,
           f"hand: two-row attention with score gap τ·1.7 (τ = {D.tau:.6f}) weighs the rows "
           f"σ(τa) = {p0:.6f} and 1 - σ(τa)")
    out2 = ER.attend_absorbed(D, np.zeros((1, 2)), np.array([[1.0, 0.0]]), C, KR)
    report(np.max(np.abs(out2 - want)) < 1e-14, "hand: the absorbed form gives the same")

    # A chain with a closed form: fc = [I | 0 | 0] picks tap 1; o_proj = 0 and down = 0
    # remove the attention and MLP outputs; every norm weight 1. Then for the first draft
    # g = N(T1) (N = RMSNorm with weight 1), r2 = r1 = g, o_1 = N(N(T1)); the draft is
    # argmax(lm_head o_1). Step 2 feeds o_1 back: o_2 = N(o_1) = N(N(N(T1))).
    E, V = 4, 5
    c = micro_config(E=E, V=V)
    D = random_micro(c, 2)
    D.fc = np.hstack([np.eye(E), np.zeros((E, 2 * E))])
    D.o_proj = np.zeros_like(D.o_proj)
    D.down = np.zeros_like(D.down)
    for n in ("norm", "hidden_norm", "input_ln", "post_ln"):
        setattr(D, n, np.ones(E))
    D.fc_norm = [np.ones(E)] * 3
    D.lm_head = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1],
                          [-1, -1, 0, 0]], dtype=np.float64)
    eps = c.eps
    T1 = np.array([3.0, -1.0, 2.0, 0.5])

    def N(x):
        return x / math.sqrt(float(np.mean(x * x)) + eps)
    taps = np.stack([T1, np.array([9.0, 9, 9, 9]), np.array([-9.0, 5, 5, 5])])
    ch = ER.chain(D, [], 0, 3, taps, 2)
    o1 = N(N(T1))
    o2 = N(o1)
    report(np.max(np.abs(ch["o"][0] - o1)) < 1e-14 and np.max(np.abs(ch["o"][1] - o2)) < 1e-14
           and ch["drafts"] == [0, 0] and abs(ch["margin"][0] - (o1[0] - o1[2])) < 1e-14,
           "hand: a 2-step chain with fc = [I|0|0], no attention or MLP output: o_1 = N(N(T1)), "
           "o_2 = N(o_1), drafts [0, 0], margin o_1[0] - o_1[2]")
    taps_rev = taps[::-1].copy()                     # the first tap is what is read
    ch2 = ER.chain(D, [], 0, 3, taps_rev, 1)
    report(ch2["drafts"] != [0] or np.max(np.abs(ch2["o"][0] - o1)) > 1e-3,
           "hand: the same chain from the taps in the other order differs (fc reads tap 1 first)")


# ---------------------------------------------------------------------------------------
# 3. a literal second implementation, scalar loops
# ---------------------------------------------------------------------------------------

def lit_rms(x, w, eps):
    ms = sum(v * v for v in x) / len(x)
    r = 1.0 / math.sqrt(ms + eps)
    return [w[i] * (x[i] * r) for i in range(len(x))]


def lit_mv(W, x):
    return [sum(W[r][i] * x[i] for i in range(len(x))) for r in range(len(W))]


def lit_omega(c):
    """§3.7 written out again: e_i, corr, low/high, ramp, blend; mscale; τ."""
    d, th = c.d_rope, c.rope_theta
    y = c.yarn
    om = []
    for i in range(d // 2):
        e = th ** (-(2.0 * i) / d)
        if y is None:
            om.append(e)
            continue
        s, L0 = y["factor"], y["original_max_position_embeddings"]
        lo = max(math.floor(d * math.log(L0 / (2 * math.pi * y["beta_fast"])) / (2 * math.log(th))), 0)
        hi = min(math.ceil(d * math.log(L0 / (2 * math.pi * y["beta_slow"])) / (2 * math.log(th))), d - 1)
        if lo == hi:
            hi += 0.001
        ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
        om.append(e * (1 - ramp) + e / s * ramp)
    if y is None:
        return om, 1.0, 1.0 / math.sqrt(c.d_nope + c.d_rope)
    ms = lambda m: 1.0 + 0.1 * m * math.log(y["factor"])  # noqa: E731
    return om, ms(y["mscale"]) / ms(y["mscale_all_dim"]), \
        ms(y["mscale_all_dim"]) ** 2 / math.sqrt(c.d_nope + c.d_rope)


def lit_rot(v, pos, om, cs):
    out = list(v)
    for i in range(len(v) // 2):
        a, b = v[2 * i], v[2 * i + 1]
        co, si = cs * math.cos(pos * om[i]), cs * math.sin(pos * om[i])
        out[2 * i], out[2 * i + 1] = a * co - b * si, b * co + a * si
    return out


class Lit:
    """The drafter, literally, from lists (weights as nested lists)."""

    def __init__(self, D):
        self.c = D.cfg
        L = lambda a: a.tolist()  # noqa: E731
        self.embed, self.fc, self.lm, self.norm = L(D.embed), L(D.fc), L(D.lm_head), L(D.norm)
        self.fcn = [L(w) for w in D.fc_norm]
        self.hn, self.iln, self.pln = L(D.hidden_norm), L(D.input_ln), L(D.post_ln)
        self.gate, self.up, self.down = L(D.gate), L(D.up), L(D.down)
        self.qa, self.qaln, self.qb = L(D.q_a), L(D.q_a_ln), L(D.q_b)
        self.kva, self.kvaln, self.kvb, self.o = L(D.kv_a), L(D.kv_a_ln), L(D.kv_b), L(D.o_proj)
        self.om, self.cs, self.tau = lit_omega(self.c)
        self.rows = []                    # (c_hat, kR) per cache index

    def fuse(self, taps):
        cat = []
        for i in range(3):
            cat += lit_rms(list(taps[i]), self.fcn[i], self.c.eps)
        return lit_mv(self.fc, cat)

    def row(self, pos, u, g, want_out=True):
        c, eps = self.c, self.c.eps
        assert len(self.rows) == pos
        x = lit_rms(self.embed[u], self.iln, eps) + lit_rms(g, self.hn, eps)   # embedding first
        kv = lit_mv(self.kva, x)
        self.rows.append((lit_rms(kv[:c.kv_lora], self.kvaln, eps),
                          lit_rot(kv[c.kv_lora:], pos, self.om, self.cs)))
        if not want_out:
            return None, None
        cq = lit_rms(lit_mv(self.qa, x), self.qaln, eps)
        q = lit_mv(self.qb, cq)
        dqk, dkv = c.d_nope + c.d_rope, c.d_nope + c.d_v
        heads_out = []
        for h in range(c.heads):
            qh = q[h * dqk:(h + 1) * dqk]
            qN, qR = qh[:c.d_nope], lit_rot(qh[c.d_nope:], pos, self.om, self.cs)
            WK = self.kvb[h * dkv: h * dkv + c.d_nope]
            WV = self.kvb[h * dkv + c.d_nope:(h + 1) * dkv]
            sc, vs = [], []
            for (ch, kr) in self.rows:
                kN = lit_mv(WK, ch)
                vs.append(lit_mv(WV, ch))
                sc.append(self.tau * (sum(qN[i] * kN[i] for i in range(c.d_nope))
                                      + sum(qR[i] * kr[i] for i in range(c.d_rope))))
            m = max(sc)
            ex = [math.exp(s - m) for s in sc]
            Z = sum(ex)
            heads_out += [sum(ex[s] / Z * vs[s][j] for s in range(len(vs))) for j in range(c.d_v)]
        r1 = [g[i] + a for i, a in enumerate(lit_mv(self.o, heads_out))]
        n = lit_rms(r1, self.pln, eps)
        gt, up = lit_mv(self.gate, n), lit_mv(self.up, n)
        act = [gt[i] / (1 + math.exp(-gt[i])) * up[i] for i in range(len(gt))]
        r2 = [r1[i] + f for i, f in enumerate(lit_mv(self.down, act))]
        o = lit_rms(r2, self.norm, eps)
        return o, lit_mv(self.lm, o)


def literal_cases():
    for seed, yarn, geo in ((1, True, {}), (2, False, {}), (3, True, {"H": 3, "dr": 8, "dn": 2}),
                            (4, True, {"E": 8, "kv_lora": 6, "inter": 5})):
        c = micro_config(yarn=yarn, **geo)
        D = random_micro(c, seed)
        rng = np.random.default_rng(100 + seed)
        n = 5
        ids = [int(i) for i in rng.integers(0, c.vocab, n)]
        taps = rng.standard_normal((n, 3, c.hidden)) * rng.uniform(0.5, 20, (n, 3, 1))
        kv = ER.committed_rows(D, taps, ids)
        lit = Lit(D)
        for q in range(n - 1):
            lit.row(q, ids[q + 1], lit.fuse(taps[q]), want_out=False)
        kv_diff = max(float(np.max(np.abs(np.concatenate(kv[q]) - np.array(lit.rows[q][0] + lit.rows[q][1]))))
                      for q in range(n - 1))
        P, K = 3, 4
        ch = ER.chain(D, kv[:P], P, ids[P + 1], taps[P], K)
        lit.rows = lit.rows[:P]
        g, tok, worst, drafts = lit.fuse(taps[P]), ids[P + 1], 0.0, []
        for j in range(K):
            o, logits = lit.row(P + j, tok, g)
            worst = max(worst, float(np.max(np.abs(np.array(logits) - ch["logits"][j]))),
                        float(np.max(np.abs(np.array(o) - ch["o"][j]))))
            tok = max(range(len(logits)), key=lambda i: (logits[i], -i))
            drafts.append(tok)
            g = o
        report(kv_diff < 1e-12 and worst < 1e-12 and drafts == ch["drafts"],
               f"literal: {'YaRN' if yarn else 'plain RoPE'} {geo or 'E6 H2'} seed {seed}: committed "
               f"rows (max diff {kv_diff:.1e}) and a {K}-step chain after {P} committed rows "
               f"(logits/o max diff {worst:.1e}, drafts {drafts})")


# ---------------------------------------------------------------------------------------
# 4. writer / reader
# ---------------------------------------------------------------------------------------

def writer_cases(tmp, target):
    """target: a K3 checkpoint directory (k3ref loads it)."""
    tcfg = k3ref.load_model(target).cfg
    d1 = os.path.join(tmp, "d_root")
    ER.write_random(d1, target, seed=7)
    D = ER.load_drafter(d1, tcfg)
    st = ER.SafetensorsFile(os.path.join(d1, "model.safetensors"))
    with open(os.path.join(d1, "model.safetensors"), "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        head = json.loads(f.read(n))
    names = [k for k in head if k != "__metadata__"]
    offs = [head[k]["data_offsets"] for k in names]
    report(len(names) == 20 and names == sorted(names) and list(head)[0] == "__metadata__"
           and all(head[k]["dtype"] == "BF16" for k in names) and n % 8 == 0
           and offs == sorted(offs) and all(offs[i][1] == offs[i + 1][0] for i in range(19))
           and offs[0][0] == 0 and os.path.getsize(os.path.join(d1, "model.safetensors")) == 8 + n + offs[-1][1],
           f"writer: 20 BF16 tensors sorted by name after __metadata__, no gaps, header {n} B "
           f"(a multiple of 8)")
    report(D.tap_layers == [1, tcfg.n_layers // 2 - 1, tcfg.n_layers - 4] and set(st.keys()) == set(ER.roster(D.cfg)),
           f"writer: the default aux ids name the layers after {D.tap_layers} ({tcfg.n_layers}-layer target)")
    model = k3ref.load_model(target)
    report(ER.embed_matches(D, model), "writer: embed_tokens is the target's, byte for byte")
    d2 = os.path.join(tmp, "d_nest")
    ER.write_random(d2, target, seed=7, nest=True)
    D2 = ER.load_drafter(d2, tcfg)
    cfg2 = json.load(open(os.path.join(d2, "config.json")))
    report("text_config" in cfg2 and "eagle_config" in cfg2["text_config"] and "hidden_size" not in cfg2
           and all(np.array_equal(getattr(D, k), getattr(D2, k)) for k in ("fc", "q_b", "lm_head"))
           and D2.tap_layers == D.tap_layers,
           "reader: the same drafter with its keys and eagle_config under text_config")

    def refused(label, mutate_cfg=None, mutate_st=None, pattern=""):
        d = os.path.join(tmp, "bad")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(d1, d)
        if mutate_cfg:
            p = os.path.join(d, "config.json")
            c = json.load(open(p))
            mutate_cfg(c)
            json.dump(c, open(p, "w"))
        if mutate_st:
            mutate_st(d)
        try:
            ER.load_drafter(d, tcfg)
            report(False, f"refused: {label} (it loaded)")
        except ER.RefError as e:
            report(pattern in str(e), f"refused: {label} ({e})")

    refused("num_hidden_layers 2", lambda c: c.update(num_hidden_layers=2), pattern="num_hidden_layers")
    refused("norm_output false", lambda c: c.update(norm_output=False), pattern="norm_output")
    refused("rope_scaling type linear", lambda c: c["rope_scaling"].update(type="linear"), pattern="yarn")
    refused("rope_scaling without mscale_all_dim", lambda c: c["rope_scaling"].pop("mscale_all_dim"),
            pattern="mscale_all_dim")
    refused("aux ids out of range", lambda c: c["eagle_config"].update(
        eagle_aux_hidden_state_layer_ids=[2, 5, tcfg.n_layers + 1]), pattern="outside")
    refused("two aux ids", lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[2, 5]),
            pattern="3 distinct")
    refused("draft_vocab_size smaller", lambda c: c.update(draft_vocab_size=100), pattern="draft_vocab_size")
    refused("hidden_size at root and text_config disagree",
            lambda c: c.update(text_config={"hidden_size": c["hidden_size"] * 2}), pattern="differs")

    def resave(d, edit, extra=None):
        """Rewrite model.safetensors with edit(name, dtype, raw) -> (dtype, raw) or None
        (dropped), plus an extra tensor (name, dtype, array)."""
        p = os.path.join(d, "model.safetensors")
        st = ER.SafetensorsFile(p)
        ents, data = [], {}
        for k in st.keys():
            r = edit(k, st.dtype(k), st.raw(k))
            if r is not None:
                data[k] = np.ascontiguousarray(r[1]).tobytes()
                ents.append((k, r[0], r[1].shape, len(data[k])))
        if extra:
            data[extra[0]] = extra[2].tobytes()
            ents.append((extra[0], extra[1], extra[2].shape, len(data[extra[0]])))
        head, order = ER.safetensors_header(ents, ER.METADATA)
        with open(p, "wb") as f:
            f.write(head)
            for k in order:
                f.write(data[k])

    def keep(k, dt, r):
        return dt, r
    refused("fc_norm.1 missing", mutate_st=lambda d: resave(
        d, lambda k, dt, r: None if k == "fc_norm.1.weight" else (dt, r)),
        pattern="fc_norm.1.weight is missing")
    refused("a g_proj (a NoPE/gated design, §6.3)", mutate_st=lambda d: resave(
        d, keep, ("layers.0.self_attn.g_proj.weight", "BF16", np.zeros((4, 4), "<u2"))),
        pattern="not in the drafter roster")
    refused("norm.weight stored F32", mutate_st=lambda d: resave(
        d, lambda k, dt, r: ("F32", (r.astype(np.uint32) << 16).view(np.float32))
        if k == "norm.weight" else (dt, r)), pattern="F32")
    refused("q_b_proj one row short", mutate_st=lambda d: resave(
        d, lambda k, dt, r: (dt, r[:-1]) if k == "layers.0.self_attn.q_b_proj.weight" else (dt, r)),
        pattern="shape")
    try:
        other = copy.copy(tcfg)
        other.hidden = tcfg.hidden * 2
        ER.load_drafter(d1, other)
        report(False, "refused: a drafter for another width")
    except ER.RefError as e:
        report("hidden_size" in str(e), f"refused: a drafter for another width ({e})")
    try:
        other = copy.copy(tcfg)
        other.vocab = tcfg.vocab + 1
        ER.load_drafter(d1, other)
        report(False, "refused: a drafter for another vocabulary")
    except ER.RefError as e:
        report("vocab" in str(e), f"refused: a drafter for another vocabulary ({e})")
    return d1


# ---------------------------------------------------------------------------------------
# 5. against a target: the taps' closed form, and the §7 traps
# ---------------------------------------------------------------------------------------

def outputs(D, model, ids, K):
    """What a C comparison checks: committed KV rows and a K-chain at every position."""
    _, taps = ER.target_taps(model, ids, D.tap_layers)
    kv = ER.committed_rows(D, taps, ids)
    chains = []
    for P in range(len(ids) - 1):
        chains.append(ER.chain(D, kv[:P], P, ids[P + 1], taps[P], K))
    return np.array([np.concatenate(e) for e in kv]), chains


def tap_closed_form(model, ids, layers):
    """§2.2: T_L = Σ (y_l + z_l) over the layers of L's block up to L (the embedding is
    not part of P), from the module outputs, collected by wrapping k3ref's mixers."""
    cfg = model.cfg
    ys, zs = {}, {}
    orig = (k3ref.kda_layer, k3ref.mla_full, k3ref.dense_ffn, k3ref.latent_moe)
    count = {"L": -1}

    def wrap_mix(f):
        def g(W, c, x, *a):
            count["L"] += 1
            ys[count["L"]] = out = f(W, c, x, *a)
            return out
        return g

    def wrap_dense(W, c, x):
        zs[count["L"]] = out = orig[2](W, c, x)
        return out

    def wrap_moe(m, L, x):
        zs[L] = out = orig[3](m, L, x)
        return out
    k3ref.kda_layer, k3ref.mla_full = wrap_mix(orig[0]), wrap_mix(orig[1])
    k3ref.dense_ffn, k3ref.latent_moe = wrap_dense, wrap_moe
    try:
        _, taps = ER.target_taps(model, ids, layers)
    finally:
        k3ref.kda_layer, k3ref.mla_full, k3ref.dense_ffn, k3ref.latent_moe = orig
    worst = 0.0
    for i, L in enumerate(layers):
        start = L - L % cfg.block_size
        want = sum(ys[l] + zs[l] for l in range(start, L + 1))
        worst = max(worst, float(np.max(np.abs(taps[:, i] - want)) / np.max(np.abs(want))))
    return worst


def ablations(D0, model):
    """name -> install(D) -> undo. Each is one §7 trap (or a plausible slip in the same
    place); eagle_ref.py itself has none of them."""
    A = {}

    def patch(mod, name, new):
        old = getattr(mod, name)
        setattr(mod, name, new)
        return lambda: setattr(mod, name, old)

    def tap_stream(kind):
        """Tap another stream of the layer: the AttnRes mixture m (§7.1) or P before z
        (§7.3), by a variant of k3ref.run_stack."""
        def run_stack(model, ids, mixer, tap=None):
            eps = model.cfg.eps
            h = model.embed[np.asarray(ids, dtype=np.int64)].astype(np.float64)
            B = []
            for L, W in enumerate(model.layers):
                P = h
                a = k3ref.attn_res(B + [P], W["f_attn"], eps) if B else h
                if L % model.cfg.block_size == 0:
                    B.append(P)
                    P = None
                y = mixer(L, k3ref.rms_norm(a, W["input_ln"], eps))
                P = y if P is None else P + y
                m = k3ref.attn_res(B + [P], W["f_mlp"], eps)
                xf = k3ref.rms_norm(m, W["post_ln"], eps)
                z = k3ref.dense_ffn(W, model.cfg, xf) if W["ffn"] == "dense" \
                    else k3ref.latent_moe(model, L, xf)
                if tap is not None:
                    tap(L, m if kind == "mixture" else P)
                h = P + z
            h_out = k3ref.attn_res(B + [h], model.f_out, eps)
            return k3ref.rms_norm(h_out, model.final_norm, eps) @ model.lm_head.T
        return lambda D: patch(k3ref, "run_stack", run_stack)

    A["tap the AttnRes mixture m, not P (§7.1)"] = tap_stream("mixture")
    A["tap P before z is added (§7.3)"] = tap_stream("pre_z")

    def shift_layers(delta):
        def inst(D):
            old = D.tap_layers
            D.tap_layers = [L + delta for L in old]
            return lambda: setattr(D, "tap_layers", old)
        return inst
    A["taps after layer id, not id-1 (off by one, §7.2)"] = shift_layers(+1)
    A["taps before the layer (off by one the other way, §7.2)"] = shift_layers(-1)

    def fuse_variant(f):
        return lambda D: patch(ER, "fuse", f)
    A["taps concatenated out of order (§7.4)"] = fuse_variant(
        lambda D, t: D.fc @ np.concatenate([k3ref.rms_norm(t[2 - i], D.fc_norm[i], D.cfg.eps) for i in range(3)]))
    A["one RMSNorm over the 3E concatenation (§7.4)"] = fuse_variant(
        lambda D, t: D.fc @ k3ref.rms_norm(np.concatenate(list(t)), np.concatenate(D.fc_norm), D.cfg.eps))
    A["fc_norm skipped"] = fuse_variant(lambda D, t: D.fc @ np.concatenate(list(t)))

    A["hidden half first in x (§7.6)"] = lambda D: patch(ER, "layer_input", lambda D, u, g: np.concatenate(
        [k3ref.rms_norm(g, D.hidden_norm, D.cfg.eps), k3ref.rms_norm(D.embed[u], D.input_ln, D.cfg.eps)]))

    orig_row = ER.row

    def row_variant(kind):
        def row(D, cache, pos, u, g):
            c = D.cfg
            x = ER.layer_input(D, u, g)
            cache.append(ER.kv_entry(D, x, pos))
            qN, qR = ER.queries(D, x, pos)
            C = np.stack([e[0] for e in cache])
            KR = np.stack([e[1] for e in cache])
            r0 = k3ref.rms_norm(g, D.hidden_norm, c.eps) if kind == "norm_residual" else g
            r1 = r0 + D.o_proj @ ER.attend(D, qN, qR, C, KR)
            n = k3ref.rms_norm(r1, D.post_ln, c.eps)
            if kind == "situ":
                act = k3ref.situ(D.gate @ n, D.up @ n, 4.0, 25.0)
            else:
                act = k3ref.silu(D.gate @ n) * (D.up @ n)
            r2 = r1 + D.down @ act
            o = k3ref.rms_norm(r2, D.norm, c.eps)
            if kind == "feed_r2":
                return r2, D.lm_head @ o
            if kind == "no_final_norm":
                return o, D.lm_head @ r2
            return o, D.lm_head @ o
        return lambda D: patch(ER, "row", row)
    A["normalised g as the residual (§7.5)"] = row_variant("norm_residual")
    A["feed back r2, not the post-norm o (§7.8)"] = row_variant("feed_r2")
    A["head on r2 without the final norm (§7.9)"] = row_variant("no_final_norm")
    A["SiTU MLP with K3's betas (§7.11)"] = row_variant("situ")
    assert orig_row is ER.row

    def target_head(D):
        old = D.lm_head
        D.lm_head = model.lm_head
        return lambda: setattr(D, "lm_head", old)
    A["K3's lm_head instead of the drafter's (§7.9)"] = target_head

    def rope_variant(kind):
        def inst(D):
            old = (D.omega, D.cs, D.tau)
            if kind == "none":
                D.omega = np.zeros_like(D.omega)
            elif kind == "plain":
                c = copy.copy(D.cfg)
                c.yarn = None
                D.omega, D.cs, D.tau = ER.rope_tables(c)
            elif kind == "scale":
                D.tau = 1 / math.sqrt(D.cfg.d_nope + D.cfg.d_rope)

            def undo():
                D.omega, D.cs, D.tau = old
            return undo
        return inst
    A["RoPE skipped (mla_use_nope taken literally, §7.7)"] = rope_variant("none")
    A["plain RoPE instead of YaRN (§7.7)"] = rope_variant("plain")
    A["scores scaled by 1/√dqk, not τ (§7.7)"] = rope_variant("scale")

    def half_split(x, pos, omega, cs):
        d = x.shape[-1] // 2
        th = pos * omega
        c, s = cs * np.cos(th), cs * np.sin(th)
        a, b = x[..., :d], x[..., d:]
        return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)
    A["half-split RoPE instead of adjacent pairs (§7.7)"] = lambda D: patch(ER, "rope", half_split)

    def kv_variant(kind):
        def kv_entry(D, x, pos):
            R = D.cfg.kv_lora
            kv = D.kv_a @ x
            if kind == "norm_all":
                w = np.concatenate([D.kv_a_ln, np.ones(kv.size - R)])
                kv = k3ref.rms_norm(kv, w, D.cfg.eps)
                return kv[:R], ER.rope(kv[R:], pos, D.omega, D.cs)
            if kind == "unrotated":
                return k3ref.rms_norm(kv[:R], D.kv_a_ln, D.cfg.eps), kv[R:]
            if kind == "pos+1":
                pos += 1
            return k3ref.rms_norm(kv[:R], D.kv_a_ln, D.cfg.eps), ER.rope(kv[R:], pos, D.omega, D.cs)
        return lambda D: patch(ER, "kv_entry", kv_entry)
    A["kv_a_layernorm over the rope part too"] = kv_variant("norm_all")
    A["k^R not rotated"] = kv_variant("unrotated")
    A["key position q+1, not q (§7.10)"] = kv_variant("pos+1")

    def committed_own_token(D):
        def committed_rows(D, taps, ids):
            return [ER.kv_entry(D, ER.layer_input(D, ids[q], ER.fuse(D, taps[q])), q)
                    for q in range(len(ids) - 1)]
        return patch(ER, "committed_rows", committed_rows)
    A["T(q) paired with token q, not q+1 (§7.10)"] = committed_own_token

    def kvb_swapped(D):
        """A reader taking each head's block as [v | k_nope]: the correct reader on the
        block rotated by dv rows sees what that reader sees."""
        c = D.cfg
        old = D.kv_b
        k = old.reshape(c.heads, c.d_nope + c.d_v, c.kv_lora)
        D.kv_b = np.concatenate([k[:, c.d_v:], k[:, :c.d_v]], axis=1).reshape(old.shape)
        return lambda: setattr(D, "kv_b", old)
    A["kv_b per head v rows first"] = kvb_swapped

    def qb_rope_first(D):
        c = D.cfg
        old = D.q_b
        q = old.reshape(c.heads, c.d_nope + c.d_rope, c.q_lora)
        D.q_b = np.concatenate([q[:, c.d_rope:], q[:, :c.d_rope]], axis=1).reshape(old.shape)
        return lambda: setattr(D, "q_b", old)
    A["q_b per head rope rows first"] = qb_rope_first
    return A


def target_cases(target, tmp, K=4):
    model = k3ref.load_model(target)
    d = os.path.join(tmp, "abl_drafter")
    ER.write_random(d, target, seed=11)
    D = ER.load_drafter(d, model.cfg)
    rng = np.random.default_rng(9)
    ids = [int(i) for i in rng.integers(0, model.cfg.vocab, 14)]
    w = tap_closed_form(model, ids, D.tap_layers)
    report(w < 1e-12, f"taps: T_L = Σ(y_l + z_l) over L's block, layers {D.tap_layers} "
           f"(§2.2 closed form, max rel diff {w:.1e})")
    kv0, ch0 = outputs(D, model, ids, K)
    tol = 1e-3      # 10x the comparison tolerance of docs/DRAFTER.md
    for name, install in ablations(D, model).items():
        undo = install(D)
        try:
            kv1, ch1 = outputs(D, model, ids, K)
        finally:
            undo()
        kvd = float(np.max(np.abs(kv1 - kv0)) / np.max(np.abs(kv0)))
        first = max(float(np.max(np.abs(a["logits"][0] - b["logits"][0])) / np.max(np.abs(a["logits"][0])))
                    for a, b in zip(ch0, ch1))
        changed = sum(x != y for a, b in zip(ch0, ch1) for x, y in zip(a["drafts"], b["drafts"]))
        total = sum(len(a["drafts"]) for a in ch0)
        report(kvd > tol or first > tol or changed > 0,
               f"ablation caught: {name}: kv rows {kvd:.1e}, first-draft logits {first:.1e}, "
               f"drafts changed {changed}/{total}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", action="append", default=[])
    ap.add_argument("--k3synth")
    a = ap.parse_args()
    selftest_bad = []
    ER.selftest(lambda ok, what: (report(ok, "selftest: " + what), ok or selftest_bad.append(what)))
    hand_cases()
    literal_cases()
    tmp = tempfile.mkdtemp(prefix="eagle_ref.")
    try:
        targets = list(a.target)
        if a.k3synth:
            t = os.path.join(tmp, "k12")
            r = subprocess.run([a.k3synth, t, "--geometry", "tiny", "--layers", "12", "--seed", "5",
                                "--quiet"], capture_output=True, text=True)
            if r.returncode:
                report(False, f"k3synth: {r.stderr.strip()}")
            else:
                targets.append(t)
        if not targets:
            print("skip - writer and target checks (no --target or --k3synth given)")
        for i, t in enumerate(targets):
            sub = os.path.join(tmp, f"t{i}")
            os.makedirs(sub)
            writer_cases(sub, t)
            target_cases(t, sub)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
