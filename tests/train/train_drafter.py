#!/usr/bin/python3
"""Train a small EAGLE-3.1 drafter for a synthetic K3 on the target's own continuations.

    train_drafter.py --target CKPT_DIR --kpk TARGET.kpk --out DRAFTER_DIR [--work DIR]
                     [--corpus FILE]... [--seed N] [--train-prompts N] [--heldout-prompts N] [--gen N]
                     [--steps N] [--ttt K] [--batch N] [--lr X] [--threads N]
                     [--max-drafts K] [--krun PATH] [--report FILE.json] [--quiet]

1. Continuations (data): prompts cut from --corpus text (8..32 tokens; held-out prompts
   from the corpus' last 20 %), or random ids (lengths 4..16) without one, each
   continued by `krun batch` (the C runtime, from TARGET.kpk) --gen tokens greedily and
   once more sampled at temperature 1 (seed = the prompt's index): the target's own text.
   Held-out prompts come from another stream of the seed (the corpus' last 20 %) and are
   continued both ways too.
2. Taps and labels: one teacher-forced pass of k3torch.Target (float32 port of
   tests/ref/k3ref.py) over each continuation gives the taps T(p) (K3_EAGLE §2.2) and the
   target's logits at every position.
3. Training (k3torch.Drafter.ttt): for every anchor p, K = --ttt chained steps, step j fed
   the post-norm output of step j-1 (norm_output) and the token the target emitted at
   p+j, at position p+j-1, attending to the committed rows (step 1 of positions <= p) and
   to its own chain: the loss at step j is the cross-entropy against the target's softmax
   at position p+j (mean over steps and positions). The embedding is frozen (it is the
   target's, §1.3); Adam, linear warm-up and cosine decay; torch seeded, --threads fixed,
   so the same options give the same bytes.
4. The drafter is rounded to BF16 and written in the released layout (eagle_ref's
   writer: the 20 names, `__metadata__`, config.json with §1.4's keys and the aux ids of
   the serving convention for this depth).
5. Offline acceptance (K3_EAGLE §4.6) of the written file, measured by eagle_ref (float64)
   on the held-out continuations, greedy and sampled apart: per-depth a_j and tokens per
   pass at 1..K drafts. A draft is accepted when it equals the token the target emitted:
   on the sampled ones that is exactly krun's rule at temperature 1 with that seed (its
   draw depends on the position only). The same figures for the untrained drafter (the
   initial weights, BF16, the same file layout) are the baseline. --report writes the
   set-up and the figures as JSON.

Exit status: 0 done, 1 a step failed (krun, a refused file), 2 bad options.
"""
import argparse
import json
import math
import os
import random
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import eagle_ref as ER  # noqa: E402
import fit_head as FH  # noqa: E402
import k3torch as KT  # noqa: E402
from safetensors_np import Checkpoint  # noqa: E402

TOP = os.path.abspath(os.path.join(HERE, "..", ".."))


def log(a, *msg):
    if not a.quiet:
        print("train_drafter:", *msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# 1. continuations from krun batch
# ---------------------------------------------------------------------------------------

def prompts(seed, stream, n, vocab, corpus=None):
    """n prompts: snippets of 8..32 tokens of the corpus' part for this stream (text, as a
    user's prompt is), or without a corpus random ids of lengths 4..16."""
    rng = random.Random(f"{seed}/{stream}")
    if corpus is None:
        return [[rng.randrange(vocab) for _ in range(rng.randint(4, 16))] for _ in range(n)]
    out = []
    for _ in range(n):
        k = rng.randint(8, 32)
        s = rng.randrange(len(corpus) - k)
        out.append([int(x) for x in corpus[s:s + k]])
    return out


def continue_with_krun(a, kpk, plist, sampled, path):
    """Each prompt continued --gen tokens by krun batch (greedy; and at temperature 1 when
    sampled). Returns [{"prompt", "ids", "sampled"}] in input order."""
    req, res = path + ".requests.jsonl", path + ".results.jsonl"
    with open(req, "w") as f:
        for i, p in enumerate(plist):
            for temp in ((0, 1) if sampled else (0,)):
                body = {"prompt": p, "max_tokens": a.gen, "temperature": temp, "seed": i,
                        "ignore_eos": True, "return_token_ids": True}
                f.write(json.dumps({"custom_id": f"p{i}-t{temp}", "method": "POST",
                                    "url": "/v1/completions", "body": body}) + "\n")
    if os.path.exists(res):
        os.unlink(res)
    r = subprocess.run([a.krun, "batch", kpk, req, res, "--max-seqs", "32", "--quiet",
                        "--threads", str(a.threads)], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"krun batch exited {r.returncode}: {r.stderr.strip()[:400]}")
    out = []
    with open(res) as f:
        for line in f:
            o = json.loads(line)
            i, t = o["custom_id"][1:].split("-t")
            body = (o.get("response") or {}).get("body") or {}
            toks = (body.get("choices") or [{}])[0].get("token_ids")
            if toks is None or len(toks) != a.gen:
                raise RuntimeError(f"krun batch: request {o['custom_id']}: no {a.gen} token ids: "
                                   f"{json.dumps(o)[:300]}")
            p = plist[int(i)]
            out.append({"prompt": p, "ids": p + toks, "sampled": t == "1"})
    with open(path, "w") as f:
        for s in out:
            f.write(json.dumps(s) + "\n")
    return out


# ---------------------------------------------------------------------------------------
# 2. taps and labels
# ---------------------------------------------------------------------------------------

def tensors(target, seqs, tap_layers, chunk=64):
    """Padded ids [N, T], lengths [N], taps [N, T, 3, E] and target logits [N, T, V].
    Padding sits after each sequence (causal: it changes nothing before it)."""
    T = max(len(s["ids"]) for s in seqs)
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s["ids"])] = torch.tensor(s["ids"])
    lens = torch.tensor([len(s["ids"]) for s in seqs])
    taps, logits = [], []
    for i in range(0, len(seqs), chunk):
        lg, tp = target.forward(ids[i:i + chunk], tap_layers)
        taps.append(tp)
        logits.append(lg)
    return ids, lens, torch.cat(taps), torch.cat(logits)


# ---------------------------------------------------------------------------------------
# 3. training
# ---------------------------------------------------------------------------------------

def ttt_loss(dr, ids, lens, taps, logits, K):
    """Mean over steps j = 1..K and valid anchors of CE(target softmax at p+j, step j)."""
    n = ids.shape[1] - 1
    outs = dr.ttt(ids, taps, K)
    p = torch.arange(n)
    total, count = 0.0, 0
    for j, lg in enumerate(outs, 1):
        valid = (p + j).unsqueeze(0) < lens.unsqueeze(1)            # label position exists
        tgt = torch.softmax(torch.cat([logits[:, j:], logits[:, :j]], 1)[:, :n], -1)
        ce = -(tgt * torch.log_softmax(lg, -1)).sum(-1)
        total = total + (ce * valid).sum()
        count += int(valid.sum())
    return total / count


@torch.no_grad()
def quick_accept(dr, ids, lens, taps, prompt_lens, K):
    """Teacher-forced chain argmax vs the emitted tokens: the fraction of anchors whose
    first j drafts all match, j = 1..K (a cheap monitor; the reported figures come from
    eagle_ref on the written file)."""
    outs = dr.ttt(ids, taps, K)
    n = ids.shape[1] - 1
    ok = torch.ones(ids.shape[0], n, dtype=torch.bool)
    p = torch.arange(n)
    anchor = (p.unsqueeze(0) >= (prompt_lens - 1).unsqueeze(1)) & \
             ((p + K + 1).unsqueeze(0) < lens.unsqueeze(1))
    frac = []
    for j, lg in enumerate(outs, 1):
        emitted = torch.cat([ids[:, j + 1:], ids.new_zeros(ids.shape[0], j + 1)], 1)[:, :n]
        ok = ok & (lg.argmax(-1) == emitted)
        frac.append(float((ok & anchor).sum()) / max(1, int(anchor.sum())))
    return frac


def train(a, dr, data, held):
    params = [p for p in dr.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=a.lr, betas=(0.9, 0.95))
    warm = max(1, a.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, a.steps) / a.steps)))
    g = torch.Generator().manual_seed(a.seed)
    ids, lens, taps, logits = data
    N = ids.shape[0]
    curve = []
    t0 = time.time()
    for step in range(a.steps):
        idx = torch.randperm(N, generator=g)[:a.batch]
        T = int(lens[idx].max())
        loss = ttt_loss(dr, ids[idx, :T], lens[idx], taps[idx, :T], logits[idx, :T], a.ttt)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % max(1, a.steps // 10) == 0 or step == a.steps - 1:
            acc = quick_accept(dr, *held, a.ttt)
            curve.append({"step": step, "loss": round(float(loss), 4),
                          "heldout_prefix_match": [round(x, 3) for x in acc]})
            log(a, f"step {step}/{a.steps} loss {float(loss):.3f} held-out first-j match "
                   f"{' '.join(f'{x:.2f}' for x in acc)} ({time.time() - t0:.0f} s)")
    return curve


def offline_acceptance(a, drafter_dir, target, ho):
    """eagle_ref's §4.6 figures of the drafter file on the held-out continuations, greedy
    and sampled apart."""
    D = ER.load_drafter(drafter_dir, target.model.cfg)
    out = {}
    for kind, flag in (("greedy", False), ("sampled", True)):
        seqs = [s for s in ho if s["sampled"] == flag]
        per_seq = [ER.accepted_lengths(D, target.model, s["prompt"], s["ids"], a.max_drafts)
                   for s in seqs]
        out[kind] = ER.acceptance(per_seq, a.max_drafts)
    return out


def repeats(seqs):
    """The fraction of generated tokens equal to the one before: how far greedy text has
    fallen into a loop of one token (which makes any drafter look good)."""
    n = same = 0
    for s in seqs:
        g = s["ids"][len(s["prompt"]) - 1:]
        n += len(g) - 1
        same += sum(1 for x, y in zip(g, g[1:]) if x == y)
    return round(same / n, 4) if n else 0.0


# ---------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--target", required=True, help="the target checkpoint directory")
    ap.add_argument("--kpk", required=True, help="the target converted by kpack (krun reads it)")
    ap.add_argument("--out", required=True, help="the drafter directory to write")
    ap.add_argument("--work", help="where the continuations go (default: OUT/../train-work)")
    ap.add_argument("--corpus", action="append",
                    help="text the prompts are cut from (the first 80 %% for training, the rest "
                         "held out); default: random ids")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--train-prompts", type=int, default=256)
    ap.add_argument("--heldout-prompts", type=int, default=32)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--ttt", type=int, default=4, help="chained steps in training")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-drafts", type=int, default=7)
    ap.add_argument("--krun", default=os.path.join(TOP, "bin", "krun"))
    ap.add_argument("--report")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    if min(a.train_prompts, a.heldout_prompts, a.gen, a.steps, a.ttt, a.batch, a.threads) < 1:
        ap.error("counts must be >= 1")
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    work = a.work or os.path.join(os.path.dirname(os.path.abspath(a.out)), "train-work")
    os.makedirs(work, exist_ok=True)
    t_all = time.time()
    try:
        target = KT.Target(a.target)
        c = ER.geometry(target.cfg)
        taps_at = ER.tap_layers(c.aux_ids, target.cfg.n_layers)
        t0 = time.time()
        V = target.cfg.vocab
        cor = {p: FH.corpus_ids(a.target, a.corpus, p) if a.corpus else None
               for p in ("train", "heldout")}
        tr = continue_with_krun(a, a.kpk, prompts(a.seed, "train", a.train_prompts, V, cor["train"]),
                                True, os.path.join(work, "train.jsonl"))
        ho = continue_with_krun(a, a.kpk, prompts(a.seed, "heldout", a.heldout_prompts, V, cor["heldout"]),
                                True, os.path.join(work, "heldout.jsonl"))
        t_gen = time.time() - t0
        log(a, f"{len(tr)} training and {len(ho)} held-out continuations from krun batch "
               f"({t_gen:.0f} s)")
        t0 = time.time()
        data = tensors(target, tr, taps_at)
        hid, hlen, htap, _ = tensors(target, ho, taps_at)
        held = (hid, hlen, htap, torch.tensor([len(s["prompt"]) for s in ho]))
        t_taps = time.time() - t0
        log(a, f"taps and labels of {len(tr) + len(ho)} sequences ({t_taps:.0f} s)")
        emb = Checkpoint(a.target).raw("language_model.model.embed_tokens.weight")
        dr = KT.Drafter(c, emb, a.seed)
        untrained = KT.Drafter(c, emb, a.seed)            # the baseline: the initial weights
        untrained.round_bf16_()
        untrained.export(os.path.join(work, "untrained"))
        t0 = time.time()
        curve = train(a, dr, data, held)
        t_train = time.time() - t0
        dr.round_bf16_()
        dr.export(a.out)
        t0 = time.time()
        acc, base = (offline_acceptance(a, d, target, ho)
                     for d in (a.out, os.path.join(work, "untrained")))
        t_acc = time.time() - t0
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        print(f"train_drafter: error: {e}", file=sys.stderr)
        return 1
    for name, r in (("trained", acc), ("untrained", base)):
        for kind in ("greedy", "sampled"):
            log(a, f"offline acceptance, {name}, held-out {kind}: a_j " +
                " ".join(f"{x:.3f}" for x in r[kind]["a"]) + "; tokens per pass at 1..%d drafts " %
                a.max_drafts + " ".join(f"{x:.2f}" for x in r[kind]["tokens_per_pass_simulated"]))
    rep = {"target": os.path.abspath(a.target), "drafter": os.path.abspath(a.out),
           "tap_layers": taps_at, "aux_ids": c.aux_ids,
           "setup": {k: getattr(a, k) for k in ("seed", "train_prompts", "heldout_prompts", "gen",
                                                "steps", "ttt", "batch", "lr", "threads")},
           "train_sequences": len(tr), "train_positions": int(data[1].sum()),
           "parameters": sum(p.numel() for p in dr.parameters()),
           "curve": curve, "acceptance": acc, "acceptance_untrained": base,
           "heldout_greedy_repeats": repeats([s for s in ho if not s["sampled"]]),
           "seconds": {"continuations": round(t_gen, 1), "taps": round(t_taps, 1),
                       "training": round(t_train, 1), "acceptance": round(t_acc, 1),
                       "total": round(time.time() - t_all, 1)},
           "torch": torch.__version__}
    if a.report:
        with open(a.report, "w") as f:
            json.dump(rep, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
