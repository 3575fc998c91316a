#!/usr/bin/python3
"""Checks the training side (tests/train) against the float64 references; needs torch.

    /usr/bin/python3 tests/train/test_train.py --k3synth BIN/k3synth --krun BIN/krun --kpack BIN/kpack
                                               [--quick] [--make-pair tests/train/make_pair.sh --bin BIN]

Prints ok/not ok/skip lines; exits non-zero on a failure. Without python3-torch it prints
one skip line and exits 0. --quick runs checks 1-3 only (the float32 ports against the
float64 references: what `make test` runs, well under a minute); the rest (minutes of
training) runs in `make bench` (tests/bench/bench_train.sh).

1. k3torch.Target (float32) against k3ref (float64): logits and taps on every position.
2. k3torch.Drafter.ttt against eagle_ref: each of K teacher-fed chained steps at every
   anchor equals eagle_ref's row computed from the same taps and tokens (the drafter's
   arithmetic alone).
3. A float32 pipeline end to end -- taps from the float32 target, committed rows and a
   chain from the float32 drafter -- against eagle_ref's float64 one: the gap a C
   engine's comparison must tolerate (docs/DRAFTER-TRAINING.md §5 quotes it).
4. fit_head on a tiny corpus: the refitted head lowers the bits per byte, and only the
   four tensors' bytes change in the shard.
5. train_drafter end to end at a toy size, twice: the same bytes both times (seeded,
   fixed threads), a file eagle_ref loads, a loss that falls.
6. make_pair.sh --quick end to end (with --make-pair): TARGET.kpk, drafter/ that
   eagle_ref loads with the target's embedding, report.json with the acceptance of the
   trained and of the untrained drafter; a second run into the same OUTDIR without
   --force is refused (exit 2) and leaves it as it was.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "ref"))

failures = 0


def report(ok, what):
    global failures
    print(("ok - " if ok else "not ok - ") + what, flush=True)
    failures += 0 if ok else 1


def rel(a, b):
    import numpy as np
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k3synth", required=True)
    ap.add_argument("--krun", required=True)
    ap.add_argument("--kpack", required=True)
    ap.add_argument("--quick", action="store_true", help="checks 1-3 only")
    ap.add_argument("--make-pair", help="tests/train/make_pair.sh: check 6")
    ap.add_argument("--bin", help="the binaries make_pair.sh uses (--bin)")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("skip - tests/train (no torch: apt-get install python3-torch; tests/deps.sh train)")
        return 0
    import numpy as np
    import eagle_ref as ER
    import k3torch as KT
    import fit_head as FH
    import train_drafter as TD
    from safetensors_np import Checkpoint
    torch.set_num_threads(2)
    tmp = tempfile.mkdtemp(prefix="kpk-train.")
    try:
        tgt = os.path.join(tmp, "tgt")
        subprocess.run([a.k3synth, tgt, "--geometry", "tiny", "--layers", "12", "--seed", "4",
                        "--quiet"], check=True)
        tg = KT.Target(tgt)
        rng = np.random.default_rng(1)
        ids = rng.integers(0, 256, (2, 18))
        lg, tp = tg.forward(torch.from_numpy(ids), [1, 5, 8])
        wl = wt = 0.0
        agree = True
        for b in range(2):
            L64, T64 = ER.target_taps(tg.model, [int(x) for x in ids[b]], [1, 5, 8])
            wl = max(wl, rel(lg[b], L64))
            wt = max(wt, rel(tp[b], T64))
            agree &= bool((lg[b].numpy().argmax(-1) == L64.argmax(-1)).all())
        report(wl < 3e-3 and wt < 5e-4 and agree,
               f"k3torch.Target (float32) vs k3ref: logits {wl:.1e}, taps {wt:.1e} of max|ref|, "
               f"argmax equal at 36 positions")

        # 2. the drafter's arithmetic: ttt against eagle_ref rows, same taps and tokens
        c = ER.geometry(tg.cfg, heads=3, inter=96)
        emb = Checkpoint(tgt).raw("language_model.model.embed_tokens.weight")
        dr = KT.Drafter(c, emb, seed=3)
        with torch.no_grad():                       # an untrained drafter: give it scale
            for n in dr.shapes:
                if len(dr.shapes[n]) == 2 and n != "embed_tokens.weight":
                    dr.p(n).mul_(1.5)
        dr.round_bf16_()
        ddir = os.path.join(tmp, "dr")
        dr.export(ddir)
        D = ER.load_drafter(ddir, tg.model.cfg)
        seq = [int(x) for x in ids[0]]
        _, T64 = ER.target_taps(tg.model, seq, D.tap_layers)
        kv = ER.committed_rows(D, T64, seq)
        K = 4
        with torch.no_grad():
            outs = dr.ttt(torch.tensor([seq]), KT.t32(T64)[None], K)
        worst = 0.0
        for P in range(len(seq) - K):
            cache, g, tok = list(kv[:P]), ER.fuse(D, T64[P]), seq[P + 1]
            for j in range(K):
                o, L = ER.row(D, cache, P + j, tok, g)
                worst = max(worst, rel(outs[j][0, P], L))
                g, tok = o, seq[P + j + 2] if P + j + 2 < len(seq) else 0
        report(worst < 2e-5, f"k3torch.Drafter.ttt == eagle_ref rows, {K} chained steps at "
               f"{len(seq) - K} anchors (max {worst:.1e} of max|logit|)")

        # 3. float32 end to end (taps from the float32 target) vs float64
        with torch.no_grad():
            _, t32 = tg.forward(torch.tensor([seq]), D.tap_layers)
            qN, qR, ch, kr = dr.project(torch.tensor([seq[1:]]), dr.fuse(t32[:, :-1]),
                                        torch.arange(len(seq) - 1)[None])
        kv32 = torch.cat([ch, kr], -1)[0].numpy()
        kvw = max(rel(kv32[q], np.concatenate(kv[q])) for q in range(len(seq) - 1))
        P = len(seq) - 1
        ref = ER.chain(D, kv, P, 7, T64[P], K)
        with torch.no_grad():
            g, tok, cache_c, cache_r, lw, same = dr.fuse(t32[0, P]), 7, ch[0], kr[0], 0.0, True
            for j in range(K):
                qN, qR, c1, r1 = dr.project(torch.tensor([tok]), g[None], torch.tensor([P + j]))
                cache_c, cache_r = torch.cat([cache_c, c1]), torch.cat([cache_r, r1])
                kN, v = dr.keys(cache_c)
                s = dr.tau * (torch.einsum("hd,shd->hs", qN[0], kN) + qR[0] @ cache_r.T)
                o = torch.einsum("hs,shd->hd", torch.softmax(s, -1), v).reshape(1, -1)
                g, L = dr.finish(g[None], o)
                g, L = g[0], L[0]
                lw = max(lw, rel(L, ref["logits"][j]))
                tok = int(L.argmax())
                same &= tok == ref["drafts"][j]
        report(kvw < 2e-4 and lw < 5e-4 and same,
               f"float32 taps + float32 drafter vs eagle_ref (float64): committed rows {kvw:.1e}, "
               f"chain logits {lw:.1e} of max|row|, the same {K} drafts")

        if a.quick:
            print("skip - checks 4-6 (fit_head, train_drafter twice, make_pair.sh: minutes of "
                  "training): make bench runs them (tests/bench/bench_train.sh)")
            return 1 if failures else 0

        # 4. fit_head: a tiny corpus, the bits fall, only the four tensors change
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w") as f:
            f.write(("the cat sat on the mat. the dog ate the bone. " * 40
                     + "a quick brown fox jumps over the lazy dog. " * 40))
        ck = Checkpoint(tgt)
        shard = ck._file(FH.HEAD).path
        before = open(shard, "rb").read()
        r = subprocess.run([sys.executable, os.path.join(HERE, "fit_head.py"), tgt, "--corpus", corpus,
                            "--windows", "48", "--window", "32", "--steps", "120"],
                           capture_output=True, text=True)
        res = json.loads(r.stdout) if r.returncode == 0 else {}
        after = open(shard, "rb").read()
        st = Checkpoint(tgt)._file(FH.HEAD)
        changed = {n for n, (_, _, x, y) in st.tensors.items()
                   if before[st.data_start + x: st.data_start + y] != after[st.data_start + x: st.data_start + y]}
        g = "language_model.model."
        report(r.returncode == 0 and res["bits_per_byte"] < res["bits_per_byte_random_head"] - 1
               and len(before) == len(after) and before[:st.data_start] == after[:st.data_start]
               and changed <= {FH.HEAD, g + "norm.weight", g + "output_attn_res_norm.weight",
                               g + "output_attn_res_proj.weight"} and FH.HEAD in changed,
               f"fit_head: {res.get('bits_per_byte_random_head')} -> {res.get('bits_per_byte')} "
               f"bits per byte; the header and every other tensor unchanged ({sorted(changed)})")

        # 5. train_drafter at a toy size, twice
        kpk = tgt + ".kpk"
        subprocess.run([a.kpack, "convert", tgt, kpk, "--quiet"], check=True)
        digests, reps = [], []
        for i in range(2):
            out = os.path.join(tmp, f"run{i}")
            rc = TD.main(["--target", tgt, "--kpk", kpk, "--out", os.path.join(out, "drafter"),
                          "--work", os.path.join(out, "work"), "--corpus", corpus,
                          "--train-prompts", "12", "--heldout-prompts", "3", "--gen", "24",
                          "--steps", "30", "--ttt", "3", "--batch", "8", "--max-drafts", "4",
                          "--krun", a.krun, "--report", os.path.join(out, "rep.json"), "--quiet"])
            files = [os.path.join(out, "drafter", n) for n in ("config.json", "model.safetensors")]
            digests.append(rc == 0 and [hashlib.sha256(open(p, "rb").read()).hexdigest() for p in files])
            reps.append(json.load(open(os.path.join(out, "rep.json"))) if rc == 0 else None)
        ok = digests[0] and digests[0] == digests[1]
        report(ok, "train_drafter twice with the same options: byte-identical config.json and "
               "model.safetensors")
        if reps[0]:
            cur = reps[0]["curve"]
            D2 = ER.load_drafter(os.path.join(tmp, "run0", "drafter"), tg.model.cfg)
            acc = reps[0]["acceptance"]
            report(cur[-1]["loss"] < cur[0]["loss"] - 0.5 and D2.tap_layers == [1, 5, 8]
                   and ER.embed_matches(D2, tg.model) and len(acc["sampled"]["a"]) == 4,
                   f"train_drafter: loss {cur[0]['loss']} -> {cur[-1]['loss']}, eagle_ref loads "
                   f"the file (taps after 1,5,8, the target's embedding), acceptance a_j "
                   f"{[round(x, 2) for x in acc['sampled']['a']]}")

        # 6. the one command, end to end at a toy size
        if a.make_pair:
            out = os.path.join(tmp, "pair")
            cmd = [a.make_pair, out, "--quick"] + (["--bin", a.bin] if a.bin else [])
            r = subprocess.run(cmd, capture_output=True, text=True)
            ok = r.returncode == 0
            why = r.stderr.strip()[-300:]
            if ok:
                rep = json.load(open(os.path.join(out, "report.json")))
                D3 = ER.load_drafter(os.path.join(out, "drafter"), KT.Target(os.path.join(out, "target")).model.cfg)
                t, u = rep["acceptance"]["sampled"], rep["acceptance_untrained"]["sampled"]
                ok = (os.path.getsize(os.path.join(out, "TARGET.kpk")) > 0 and D3.tap_layers == [1, 5, 8]
                      and t["anchors"] > 0 and t["anchors"] == u["anchors"]
                      and "trained   held-out sampled" in r.stdout)
                why = (f"taps after {D3.tap_layers}, first-draft acceptance (held-out sampled) "
                       f"{t['a'][0]:.2f} trained vs {u['a'][0]:.2f} untrained")
            report(ok, f"make_pair.sh --quick: TARGET.kpk, drafter/ eagle_ref loads, report.json ({why})")
            snap = {n: os.path.getmtime(os.path.join(out, n)) for n in os.listdir(out)} if ok else {}
            r2 = subprocess.run(cmd, capture_output=True, text=True)
            report(r2.returncode == 2 and "--force" in r2.stderr and
                   snap == {n: os.path.getmtime(os.path.join(out, n)) for n in os.listdir(out)},
                   "make_pair.sh into a non-empty OUTDIR without --force: exit 2, names --force, "
                   "touches nothing")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
