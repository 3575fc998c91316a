#!/usr/bin/python3
"""Give a k3synth target a trained output head (K3_MODEL §4.9), in place.

    fit_head.py CKPT_DIR --corpus FILE [--corpus FILE]... [--windows N] [--window T]
                [--steps N] [--seed N] [--threads N]

Why: a random K3 (k3synth) emits text no model could predict. Its greedy continuation
does not repeat (0-6 repeated trigrams in 300 tokens at 2 to 12 layers), the best bigram
table predicts 9-18 % of it, and a drafter trained on it accepted 3 % of its first
drafts (docs/DRAFTER-TRAINING.md §1). --logit-gain cannot change that: scaling lm_head leaves
every greedy argmax where it was. A trained model's text is predictable, and a drafter's
acceptance measures that predictability, so here the output head is trained on bytes of
real text (make_pair.sh: the license texts of Debian's base-files): the output AttnRes vector f_out, the final norm's
weight and lm_head (§4.9: logits = lm_head RMSNorm_norm(AR(B, h; f_out))), by Adam on
the next byte's cross-entropy, over the aggregator's sources (the block snapshots and h)
of the unchanged random trunk, computed once. The target then continues text as a small
byte-level language model does (3.5 bits per byte on make_pair's corpus); the trunk,
the experts and the layout stay k3synth's.

The vocabulary must be bytes only (k3synth's tiny vocab 256): id r of tiktoken.model is
the byte it spells. The trained tensors are written in their own dtype at their own
extents in the shards (pwrite of the same byte count; f_out goes into
output_attn_res_proj, output_attn_res_norm becomes ones), so the header and every other
byte stay as k3synth wrote them.

Prints one JSON line: bits per byte before and after, positions, steps.
"""
import argparse
import base64
import json
import math
import os
import random
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import eagle_ref as ER  # noqa: E402
import k3torch as KT  # noqa: E402
from safetensors_np import Checkpoint  # noqa: E402

HEAD = "language_model.lm_head.weight"


def byte_ids(ckpt_dir):
    """byte value -> token id from tiktoken.model (every id < 256 is one byte)."""
    m = {}
    with open(os.path.join(ckpt_dir, "tiktoken.model")) as f:
        for line in f:
            tok, rank = line.split()
            b = base64.b64decode(tok)
            if len(b) == 1:
                m[b[0]] = int(rank)
    if len(m) != 256:
        raise ValueError(f"{ckpt_dir}/tiktoken.model: {len(m)} single-byte tokens, need 256")
    return np.array([m[b] for b in range(256)], dtype=np.int64)


TRAIN_SHARE = 0.8     # the corpus' first 80 %: the head's windows and training prompts


def corpus_ids(ckpt_dir, paths, part="train"):
    """The corpus as token ids: its first TRAIN_SHARE ("train") or the rest ("heldout")."""
    data = b"".join(open(p, "rb").read() for p in paths)
    ids = byte_ids(ckpt_dir)[np.frombuffer(data, dtype=np.uint8)]
    cut = int(len(ids) * TRAIN_SHARE)
    return ids[:cut] if part == "train" else ids[cut:]


def windows(ids, n, T, seed):
    rng = random.Random(seed)
    starts = [rng.randrange(len(ids) - T - 1) for _ in range(n)]
    return np.stack([ids[s:s + T + 1] for s in starts])


def fit(tg, src, nxt, steps, seed, log=None):
    """Adam on (f_out, the final norm's weight, lm_head) over cached sources
    [S, N, T, E] with next ids [N, T]. Returns the three tensors and bits per byte
    (before, after) on all windows."""
    g = torch.Generator().manual_seed(seed)
    f = torch.nn.Parameter(tg.f_out.clone())
    nw = torch.nn.Parameter(tg.final_norm.clone())
    W = torch.nn.Parameter(torch.randn(tg.lm_head.shape, generator=g) * 0.01)
    opt = torch.optim.Adam([f, nw, W], lr=0.03)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    N, V = src.shape[1], tg.lm_head.shape[0]

    def bits(f_, nw_, W_, idx=None):
        s_, y = (src, nxt) if idx is None else (src[:, idx], nxt[idx])
        lg = KT.lin(tg.readout(s_, f_, nw_), W_).reshape(-1, V)
        return torch.nn.functional.cross_entropy(lg, y.reshape(-1)) / math.log(2)
    with torch.no_grad():
        before = float(bits(tg.f_out, tg.final_norm, tg.lm_head))
    for step in range(steps):
        loss = bits(f, nw, W, torch.randint(0, N, (min(N, 64),), generator=g))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    with torch.no_grad():
        after = float(bits(f, nw, W))
    return f.detach(), nw.detach(), W.detach(), before, after


def write_tensors(ckpt_dir, arrays):
    """pwrite each array's bits over its tensor's extent, in its dtype (BF16 rounded to
    nearest even, or F32): the same byte count, so the header and every other byte of
    the shard stay as they were."""
    ck = Checkpoint(ckpt_dir)
    for name, arr in arrays.items():
        st = ck._file(name)
        dt, shape, a, b = st.tensors[name]
        arr = np.asarray(arr, dtype=np.float64).reshape(shape)
        if dt == "BF16":
            bits = np.ascontiguousarray(ER.f64_to_bf16(arr), dtype="<u2").tobytes()
        elif dt == "F32":
            bits = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        else:
            raise ValueError(f"{name}: {dt}: only BF16 and F32 are rewritten")
        if len(bits) != b - a:
            raise ValueError(f"{name}: {len(bits)} bytes for an extent of {b - a}")
        fd = os.open(st.path, os.O_WRONLY)
        try:
            if os.pwrite(fd, bits, st.data_start + a) != len(bits):
                raise OSError(f"{st.path}: short write")
            os.fsync(fd)
        finally:
            os.close(fd)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("ckpt")
    ap.add_argument("--corpus", action="append", required=True)
    ap.add_argument("--windows", type=int, default=192)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    try:
        ids = corpus_ids(a.ckpt, a.corpus)
        tg = KT.Target(a.ckpt)
        if tg.cfg.vocab != 256:
            raise ValueError(f"{a.ckpt}: vocab {tg.cfg.vocab}; fit_head needs the bytes-only 256")
        win = torch.from_numpy(windows(ids, a.windows, a.window, a.seed))
        src = torch.cat([tg.sources(win[i:i + 64, :-1])[0] for i in range(0, len(win), 64)], 1)
        f, nw, W, before, after = fit(tg, src, win[:, 1:], a.steps, a.seed)
        g = "language_model.model."
        E = tg.cfg.hidden
        write_tensors(a.ckpt, {g + "output_attn_res_norm.weight": np.ones(E),
                               g + "output_attn_res_proj.weight": f.double().numpy()[None],
                               g + "norm.weight": nw.double().numpy(),
                               HEAD: W.double().numpy()})
    except (OSError, ValueError, KeyError) as e:
        print(f"fit_head: error: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"positions": int(win[:, 1:].numel()), "steps": a.steps,
                      "bits_per_byte_random_head": round(before, 3),
                      "bits_per_byte": round(after, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
