"""k3torch: float32 PyTorch ports, for training the drafter (tests/train/train_drafter.py).

* `Target`: the K3 forward pass of tests/ref/k3ref.py, batched over sequences of equal
  length and teacher forced, returning the logits and the drafter's taps (K3_EAGLE §2.2:
  the block-local prefix P after §4.4 step 8 of each tapped layer). Weights come from
  k3ref.load_model (so the file is read, checked and MXFP4-decoded by the reference);
  the arithmetic follows k3ref function by function, in float32. test_train.py checks
  it against k3ref (float64) on every position.
* `Drafter`: the EAGLE-3.1 layer of tests/ref/eagle_ref.py (K3_EAGLE §3) as a trainable
  module, with `ttt`, the training-time test: k chained steps for every anchor at once,
  each step fed the previous step's post-norm output (§3.3 step 8) at position p+j-1,
  attending to the step-1 rows of positions <= p (what the committed rows are at
  inference, §3.8) and to the anchor's own earlier chain rows. `export` writes it in the
  released layout with eagle_ref's writer; test_train.py checks that eagle_ref reproduces
  its chains.
"""
import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import eagle_ref as ER  # noqa: E402
import k3ref  # noqa: E402

F = torch.float32


def t32(a):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def lin(x, W):
    """x @ W.T for W [out, in], as a width-1 convolution: torch's oneDNN convolution is
    several times faster than the matrix product of Debian's python3-torch, which calls
    the reference BLAS (BLAS_INFO=generic); the sums are the same up to rounding."""
    y = torch.nn.functional.conv1d(x.reshape(-1, x.shape[-1], 1), W.unsqueeze(-1))
    return y.reshape(*x.shape[:-1], W.shape[0])


def rms(x, w, eps):
    return w * x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)


def situ(g, u, b1, b2):
    return (b1 * torch.tanh(g / b1) * torch.sigmoid(g)) * (b2 * torch.tanh(u / b2))


# ---------------------------------------------------------------------------------------
# The target (K3_MODEL §4 as k3ref computes it), float32, batched, no grad
# ---------------------------------------------------------------------------------------

class Target:
    def __init__(self, ckpt_dir):
        self.model = m = k3ref.load_model(ckpt_dir)
        self.cfg = c = m.cfg
        self.embed = t32(m.embed)
        self.lm_head, self.final_norm, self.f_out = t32(m.lm_head), t32(m.final_norm), t32(m.f_out)
        self.layers = []
        for L, W in enumerate(m.layers):
            T = {k: (t32(v) if isinstance(v, np.ndarray) else v) for k, v in W.items()
                 if k not in ("experts", "expert_prefix")}
            if W["ffn"] == "moe":
                ex = [k3ref.expert(m, L, e) for e in range(c.n_experts)]
                # gate and up rows stacked [Ne*I, Lt], the down matrices side by side
                # [Lt, Ne*I]: expert e is block e*I..(e+1)*I of each
                T["w1"] = t32(np.concatenate([x[0] for x in ex]))
                T["w3"] = t32(np.concatenate([x[2] for x in ex]))
                T["w2"] = t32(np.concatenate([x[1] for x in ex], axis=1))
            self.layers.append(T)

    def attn_res(self, sources, f):
        V = torch.stack(sources)                                   # [n, B, T, E]
        keys = V * torch.rsqrt((V * V).mean(-1, keepdim=True) + self.cfg.eps)
        p = torch.softmax(keys @ f, dim=0)
        return (p.unsqueeze(-1) * V).sum(0)

    def kda(self, W, x):
        c = self.cfg
        B, T, _ = x.shape
        H, D, K = c.kda_heads, c.kda_dim, c.conv_k

        def conv(z, w):                                            # §4.5.2, zero history
            zp = torch.nn.functional.pad(z, (0, 0, K - 1, 0))
            acc = sum(w[:, j] * zp[:, j:j + T] for j in range(K))
            return acc * torch.sigmoid(acc)
        q = conv(lin(x, W["q_proj"]), W["q_conv"]).view(B, T, H, D)
        k = conv(lin(x, W["k_proj"]), W["k_conv"]).view(B, T, H, D)
        v = conv(lin(x, W["v_proj"]), W["v_conv"]).view(B, T, H, D)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) / math.sqrt(D)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        beta = torch.sigmoid(lin(x, W["b_proj"]))                    # [B, T, H]
        zeta = lin(lin(x, W["f_a"]), W["f_b"]).view(B, T, H, D)
        A = torch.exp(W["A_log"][:H]).view(1, 1, H, 1)
        alpha = torch.exp(c.lb * torch.sigmoid(A * (zeta + W["dt_bias"].view(H, D))))
        S = x.new_zeros(B, H, D, D)
        outs = []
        for t in range(T):
            S = S * alpha[:, t].unsqueeze(-1)
            u = torch.einsum("bhij,bhi->bhj", S, k[:, t])
            S = S + k[:, t].unsqueeze(-1) * (beta[:, t].unsqueeze(-1) * (v[:, t] - u)).unsqueeze(-2)
            outs.append(torch.einsum("bhij,bhi->bhj", S, q[:, t]))
        o = rms(torch.stack(outs, 1), W["o_norm"], c.eps).reshape(B, T, H * D)
        return lin(o * torch.sigmoid(lin(x, W["g_proj"])), W["o_proj"])

    def mla(self, W, x):
        c = self.cfg
        B, T, _ = x.shape
        H, dn, dr, dv = c.mla_heads, c.d_nope, c.d_rope, c.d_v
        eps = k3ref.MLA_LORA_NORM_EPS                          # the LoRA norms' (K3_MODEL §9)
        q = lin(rms(lin(x, W["q_a"]), W["q_a_ln"], eps), W["q_b"]).view(B, T, H, dn + dr)
        kv = lin(x, W["kv_a"])
        ch = rms(kv[..., :c.kv_lora], W["kv_a_ln"], eps)
        kr = kv[..., c.kv_lora:]
        kvx = lin(ch, W["kv_b"]).view(B, T, H, dn + dv)
        s = (torch.einsum("bthd,bshd->bhts", q[..., :dn], kvx[..., :dn])
             + torch.einsum("bthd,bsd->bhts", q[..., dn:], kr)) / math.sqrt(dn + dr)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
        o = torch.einsum("bhts,bshd->bthd", p, kvx[..., dn:]).reshape(B, T, H * dv)
        if c.mla_gate:
            o = o * torch.sigmoid(lin(x, W["g_proj"]))
        return lin(o, W["o_proj"])

    def moe(self, W, x):
        c = self.cfg
        sc = torch.sigmoid(lin(x, W["router"]))                    # [B, T, Ne]
        idx = torch.topk(sc + W["router_bias"], c.top_k, dim=-1).indices
        w = torch.gather(sc, -1, idx)
        if c.renormalize:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        weight = torch.zeros_like(sc).scatter(-1, idx, w * c.routed_scale)
        z = lin(x, W["lat_down"])                                    # [B, T, Lt]
        zf, wf = z.reshape(-1, z.shape[-1]), weight.reshape(-1, c.n_experts)
        agg = torch.zeros_like(zf)
        I = W["w1"].shape[0] // c.n_experts
        for e in range(c.n_experts):                                 # routed rows only
            rows = torch.nonzero(wf[:, e]).squeeze(-1)
            if rows.numel() == 0:
                continue
            sl = slice(e * I, (e + 1) * I)
            a = situ(lin(zf[rows], W["w1"][sl]), lin(zf[rows], W["w3"][sl]), c.beta1, c.beta2)
            agg.index_add_(0, rows, lin(a, W["w2"][:, sl]) * wf[rows, e].unsqueeze(-1))
        agg = agg.view(z.shape)
        n = rms(agg, W["lat_norm"], c.eps) if c.latent_norm else agg
        out = lin(n, W["lat_up"])
        if "sh_gate" in W:
            out = out + lin(situ(lin(x, W["sh_gate"]), lin(x, W["sh_up"]), c.beta1, c.beta2), W["sh_down"])
        return out

    @torch.no_grad()
    def forward(self, ids, tap_layers):
        """ids: LongTensor [B, T]. Returns (logits [B, T, V], taps [B, T, 3, E])."""
        feat, taps = self.features(ids, tap_layers)
        return lin(feat, self.lm_head), taps

    @torch.no_grad()
    def features(self, ids, tap_layers=()):
        """(RMSNorm_norm(h_out) [B, T, E], the lm_head's input (§4.9), and the taps)."""
        src, taps = self.sources(ids, tap_layers)
        return self.readout(src), taps

    def readout(self, src, f_out=None, final_norm=None):
        """§4.9: RMSNorm_norm(AR(B, h; f_out)) from the stacked sources [S, B, T, E]."""
        return rms(self.attn_res(list(src), self.f_out if f_out is None else f_out),
                   self.final_norm if final_norm is None else final_norm, self.cfg.eps)

    @torch.no_grad()
    def sources(self, ids, tap_layers=()):
        """The output aggregator's sources (the block snapshots and the last h, stacked
        [S, B, T, E]) and the taps."""
        c, eps = self.cfg, self.cfg.eps
        h = self.embed[ids]
        B, taps = [], {}
        for L, W in enumerate(self.layers):                        # §4.4 steps 1-8
            P = h
            a = self.attn_res(B + [P], W["f_attn"]) if B else h
            if L % c.block_size == 0:
                B.append(P)
                P = None
            x = rms(a, W["input_ln"], eps)
            y = self.kda(W, x) if W["type"] == "kda" else self.mla(W, x)
            P = y if P is None else P + y
            xf = rms(self.attn_res(B + [P], W["f_mlp"]), W["post_ln"], eps)
            z = (lin(situ(lin(xf, W["gate_proj"]), lin(xf, W["up_proj"]), c.beta1, c.beta2), W["down_proj"])
                 if W["ffn"] == "dense" else self.moe(W, xf))
            h = P + z
            if L in tap_layers:
                taps[L] = h
        return torch.stack(B + [h]), \
            (torch.stack([taps[L] for L in tap_layers], 2) if tap_layers else None)


# ---------------------------------------------------------------------------------------
# The drafter (K3_EAGLE §3), trainable
# ---------------------------------------------------------------------------------------

class Drafter(torch.nn.Module):
    """Parameters named as the released roster (§1.3), '.' -> '_' for torch."""

    def __init__(self, cfg, embed_bf16, seed):
        super().__init__()
        self.cfg = c = cfg
        g = torch.Generator().manual_seed(seed)
        self.embed_bits = embed_bf16                                # frozen: the target's
        self.register_buffer("embed", t32((embed_bf16.astype(np.uint32) << 16).view(np.float32)))
        self.shapes = ER.roster(c)
        for n, shape in self.shapes.items():
            if n == "embed_tokens.weight":
                continue
            if len(shape) == 1:
                w = torch.ones(shape)
            else:
                w = torch.randn(shape, generator=g) / math.sqrt(shape[1])
            setattr(self, n.replace(".", "_"), torch.nn.Parameter(w))
        omega, cs, tau = ER.rope_tables(c)
        self.register_buffer("omega", t32(omega))
        self.cs, self.tau = float(cs), float(tau)

    def p(self, name):
        return getattr(self, name.replace(".", "_"))

    def rope(self, x, pos):
        """§3.7 adjacent pairs; pos broadcasts against x's leading axes ([B, T] or [B, T, 1])."""
        th = pos.unsqueeze(-1).to(F) * self.omega
        c, s = self.cs * torch.cos(th), self.cs * torch.sin(th)
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * c - b * s, b * c + a * s], -1).flatten(-2)

    def fuse(self, taps):
        eps = self.cfg.eps
        return lin(torch.cat([rms(taps[..., i, :], self.p(f"fc_norm.{i}.weight"), eps)
                              for i in range(ER.N_TAPS)], -1), self.p("fc.weight"))

    def project(self, u, g, pos):
        """Per row: x, then (q^N, rotated q^R) per head and the KV entry (ĉ, rotated k^R)."""
        c, eps = self.cfg, self.cfg.eps
        a = "layers.0.self_attn."
        x = torch.cat([rms(self.embed[u], self.p("layers.0.input_layernorm.weight"), eps),
                       rms(g, self.p("layers.0.hidden_norm.weight"), eps)], -1)
        q = lin(rms(lin(x, self.p(a + "q_a_proj.weight")), self.p(a + "q_a_layernorm.weight"), eps),
                self.p(a + "q_b_proj.weight"))
        q = q.view(*q.shape[:-1], c.heads, c.d_nope + c.d_rope)
        qN, qR = q[..., :c.d_nope], self.rope(q[..., c.d_nope:], pos.unsqueeze(-1))
        kv = lin(x, self.p(a + "kv_a_proj_with_mqa.weight"))
        ch = rms(kv[..., :c.kv_lora], self.p(a + "kv_a_layernorm.weight"), eps)
        return qN, qR, ch, self.rope(kv[..., c.kv_lora:], pos)

    def keys(self, ch):
        """Per-head k^N and v from ĉ (expanded form, §3.3 step 4)."""
        c = self.cfg
        kvx = lin(ch, self.p("layers.0.self_attn.kv_b_proj.weight"))
        kvx = kvx.view(*kvx.shape[:-1], c.heads, c.d_nope + c.d_v)
        return kvx[..., :c.d_nope], kvx[..., c.d_nope:]

    def finish(self, g, o_heads):
        """§3.3 steps 5-7 from the raw residual g and concat_h(o_h)."""
        eps = self.cfg.eps
        r1 = g + lin(o_heads, self.p("layers.0.self_attn.o_proj.weight"))
        n = rms(r1, self.p("layers.0.post_attention_layernorm.weight"), eps)
        act = torch.nn.functional.silu(lin(n, self.p("layers.0.mlp.gate_proj.weight"))) \
            * lin(n, self.p("layers.0.mlp.up_proj.weight"))
        r2 = r1 + lin(act, self.p("layers.0.mlp.down_proj.weight"))
        o = rms(r2, self.p("norm.weight"), eps)
        return o, lin(o, self.p("lm_head.weight"))

    def ttt(self, ids, taps, k):
        """Training-time test over a batch. ids [B, T], taps [B, T, 3, E].

        Anchor p (0 <= p <= T-2): step 1 is the row (p, ids[p+1], Fuse(T(p))) -- the
        committed row of p --; step j is (p+j-1, ids[p+j], o_{j-1}(p)): the token the
        target emitted, so that a chain whose drafts were all accepted sees exactly this.
        Step j's logits predict the target at position p+j. Returns a list of k logits
        tensors [B, T-1, V] (entries with p+j > T-1 are meaningless: mask them)."""
        Bn, T = ids.shape
        n = T - 1
        pos = torch.arange(n).expand(Bn, n)
        qN, qR, ch, kr = self.project(ids[:, 1:], self.fuse(taps[:, :n]), pos)
        kN, v = self.keys(ch)                                      # step-1 rows = committed
        causal = torch.ones(n, n, dtype=torch.bool).tril()         # query p, key s <= p
        own_s, own_v = [], []                                      # chain rows, per anchor
        g = self.fuse(taps[:, :n])
        out = []
        for j in range(1, k + 1):
            if j > 1:
                tok = torch.cat([ids[:, j:], ids.new_zeros(Bn, j - 1)], 1)[:, :n]
                qN, qR, chj, krj = self.project(tok, g, pos + (j - 1))
                kNj, vj = self.keys(chj)
                own_s.append((kNj, krj))
                own_v.append(vj)
            s = self.tau * (torch.einsum("bphd,bshd->bhps", qN, kN)
                            + torch.einsum("bphd,bsd->bhps", qR, kr))
            s = s.masked_fill(~causal, float("-inf"))
            extra = [self.tau * ((qN * kNi).sum(-1) + (qR * kri.unsqueeze(-2)).sum(-1))
                     .permute(0, 2, 1).unsqueeze(-1) for kNi, kri in own_s]     # [B, H, p, 1]
            pr = torch.softmax(torch.cat([s] + extra, -1), -1)
            o = torch.einsum("bhps,bshd->bphd", pr[..., :n], v)
            for i, vi in enumerate(own_v):
                o = o + pr[..., n + i].permute(0, 2, 1).unsqueeze(-1) * vi
            g, logits = self.finish(g, o.reshape(Bn, n, -1))
            out.append(logits)
        return out

    @torch.no_grad()
    def round_bf16_(self):
        """Every parameter rounded to BF16 in place (what export writes)."""
        for n in self.shapes:
            if n != "embed_tokens.weight":
                w = self.p(n)
                bits = ER.f64_to_bf16(w.double().numpy()).astype(np.uint32) << 16
                w.copy_(t32(bits.view(np.float32)))

    def export(self, out_dir, nest=False):
        """The released layout (§1.3/§1.4) through eagle_ref's writer: BF16 (round to
        nearest even), the embedding's bits as the target's."""
        arrays = {n: self.p(n).detach().double().numpy() for n in self.shapes
                  if n != "embed_tokens.weight"}
        ER.write_drafter(out_dir, self.cfg, arrays, nest=nest,
                         raw_bf16={"embed_tokens.weight": self.embed_bits})
