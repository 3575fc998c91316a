#!/usr/bin/python3
"""Compare krun with the independent numpy reference (tests/ref/k3ref.py) on
one checkpoint.

usage: compare_ref.py KRUN CKPT_DIR FILE.kpk --ids 1,2,3 --gen N [--label L]
                      [--ref-cache DIR] [--expect-fail] [--tol 3e-4]

Checks, each printed as one TAP line:
  * greedy continuation, incremental decoding, equals the reference's
  * greedy continuation, full recompute every step, equals it too
  * teacher-forced logits at every position of prompt+continuation are within
    tol * max|ref| of the reference (float32 against float64: most positions
    agree to ~1e-5, an ill-conditioned one reaches ~1.3e-4), and the argmax
    agrees at every position
    (a disagreement is tolerated only where the reference itself has a
    near-tie: its top two within 1e-5 * max|ref|)
With --expect-fail (ablation builds) the lines are inverted: the run must
FAIL at least one check, else "not ok".
"""
import argparse, array, json, os, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "..", "ref", "k3ref.py")


def floats(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a


def run_ref(ckpt, ids, gen, cache):
    key = os.path.join(cache, "ref-%s-%s-%d" % (os.path.basename(os.path.normpath(ckpt)), ids.replace(",", "_"), gen)) if cache else None
    if key and os.path.exists(key + ".json"):
        return json.load(open(key + ".json")), floats(key + ".bin")
    tmp = key or tempfile.mktemp()
    r = subprocess.run(["/usr/bin/python3", REF, ckpt, "--ids", ids, "--gen", str(gen), "--mode", "full",
                        "--out", tmp + ".json", "--logits-bin", tmp + ".bin"], capture_output=True, text=True)
    if r.returncode:
        sys.exit("reference failed: " + r.stderr)
    return json.load(open(tmp + ".json")), floats(tmp + ".bin")


def krun(bin_, kpk, ids, gen, extra, tmpdir):
    out = os.path.join(tmpdir, "k.json")
    cmd = [bin_, kpk, "--ids", ids, "--gen", str(gen), "--json", out, "--quiet", "--print-ids"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        return None, r.stderr.strip()
    return json.load(open(out)), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("krun")
    ap.add_argument("ckpt")
    ap.add_argument("kpk")
    ap.add_argument("--ids", required=True)
    ap.add_argument("--gen", type=int, default=12)
    ap.add_argument("--label", default="")
    ap.add_argument("--ref-cache")
    ap.add_argument("--expect-fail", action="store_true")
    ap.add_argument("--tol", type=float, default=3e-4)
    a = ap.parse_args()
    label = a.label or os.path.basename(os.path.normpath(a.ckpt))
    ref, ref_logits = run_ref(a.ckpt, a.ids, a.gen, a.ref_cache)
    want = ref["generated_ids"]
    full = [int(x) for x in a.ids.split(",")] + want
    V = len(ref_logits) // len(full)
    results = []
    with tempfile.TemporaryDirectory() as td:
        for mode, extra in (("incremental", []), ("recompute", ["--recompute"])):
            got, err = krun(a.krun, a.kpk, a.ids, a.gen, extra, td)
            if got is None:
                results.append((False, "%s: greedy %s: krun failed: %s" % (label, mode, err[:200])))
            else:
                g = got["generated_ids"]
                first = next((i for i, (x, y) in enumerate(zip(g, want)) if x != y), None)
                ok = g == want
                results.append((ok, "%s: greedy %d tokens, %s decoding%s" % (
                    label, len(want), mode, "" if ok else " (first difference at step %s: %s vs %s)" % (
                        first, g[first] if first is not None and first < len(g) else "-", want[first] if first is not None else "-"))))
        # teacher forcing over prompt + reference continuation
        tf = os.path.join(td, "tf.bin")
        ids_full = ",".join(map(str, full))
        got, err = krun(a.krun, a.kpk, ids_full, 0, ["--dump-all-logits", tf], td)
        if got is None:
            results.append((False, "%s: teacher forcing: krun failed: %s" % (label, err[:200])))
        else:
            kl = floats(tf)
            worst, argmax_bad, ties = 0.0, 0, 0
            for t in range(len(full)):
                r = ref_logits[t * V:(t + 1) * V]
                k = kl[t * V:(t + 1) * V]
                scale = max(abs(x) for x in r)
                worst = max(worst, max(abs(x - y) for x, y in zip(k, r)) / scale)
                ka = max(range(V), key=k.__getitem__)
                ra = max(range(V), key=r.__getitem__)
                if ka != ra:
                    if r[ra] - r[ka] <= 1e-5 * scale:
                        ties += 1
                    else:
                        argmax_bad += 1
            results.append((worst <= a.tol, "%s: teacher-forced logits at %d positions within %.0e of max|ref| (worst %.2e)" % (
                label, len(full), a.tol, worst)))
            results.append((argmax_bad == 0, "%s: teacher-forced argmax at every position (%d disagree%s)" % (
                label, argmax_bad, ", %d reference near-ties" % ties if ties else "")))
    failed = [m for ok, m in results if not ok]
    if a.expect_fail:
        if failed:
            print("ok - %s: the broken build is caught (%s)" % (label, failed[0]))
            return 0
        print("not ok - %s: the broken build passes every check" % label)
        return 1
    for ok, m in results:
        print(("ok - " if ok else "not ok - ") + m)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
