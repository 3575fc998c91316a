#!/usr/bin/env bash
# The small trained pair of issue 30 point 7, in one command: a synthetic K3 target whose
# text repeats as a trained model's does, converted for krun, and an EAGLE-3.1 drafter
# trained on its own continuations, in the released layout.
#
#   tests/train/make_pair.sh OUTDIR [--quick] [--seed N] [--force] [--bin DIR]
#
# Leaves in OUTDIR:
#   target/        the k3synth checkpoint (safetensors; what the references read)
#   TARGET.kpk     the same, converted by kpack (what krun streams)
#   drafter/       config.json + model.safetensors (BF16, K3_EAGLE §1.3/§1.4 at this
#                  geometry): `kpack convert OUTDIR/drafter DRAFT.kpk`, then krun --draft
#   report.json    the set-up, the training curve, the offline acceptance of the trained
#                  and of the untrained drafter (per-depth a_j, tokens per pass at 1..7
#                  drafts; eagle_ref, float64, held-out prompts, greedy and sampled)
#   work/          the continuations krun batch wrote (train.jsonl, heldout.jsonl)
#   corpus.sha256  the text the head and the prompts come from, with its digests
# and prints the acceptance. Same options, same bytes (seeded; threads fixed at 2).
#
# The steps (docs/DRAFTER-TRAINING.md explains each choice):
#   1. make bin/k3synth bin/kpack bin/krun
#   2. k3synth: --geometry tiny --layers 12 --experts 32 --topk 4 --seed 7 (bytes vocabulary)
#   3. tests/train/fit_head.py: the output head refitted to the corpus' bytes, in place
#   4. kpack convert target -> TARGET.kpk
#   5. tests/train/train_drafter.py: krun batch continuations (greedy and sampled), taps,
#      training-time test, BF16 export, acceptance
# The corpus is the license texts every Debian system carries (base-files), fixed for
# decades, so the pair does not change when this repository's docs do.
#
# --quick: a toy size (for tests): fewer prompts, shorter continuations, 40 steps.
# --bin DIR: use DIR's k3synth, kpack and krun as they are (no build; tests pass $BIN).
# Exit status: 0 done; 1 a step failed; 2 bad usage (or OUTDIR not empty without --force).
set -euo pipefail
TOP="$(cd "$(dirname "$0")/../.." && pwd)"
PY=/usr/bin/python3
out="" quick=0 seed=7 force=0 bin=""
usage() { sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//; /^set -e/d'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --seed) [ $# -ge 2 ] || { echo "make_pair: --seed needs a value" >&2; exit 2; }
                seed="$2"; shift ;;
        --force) force=1 ;;
        --bin) [ $# -ge 2 ] || { echo "make_pair: --bin needs a directory" >&2; exit 2; }
               bin="$(cd "$2" && pwd)" || exit 2; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "make_pair: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) [ -z "$out" ] || { echo "make_pair: one OUTDIR only" >&2; exit 2; }; out="$1" ;;
    esac
    shift
done
[ -n "$out" ] || { echo "make_pair: usage: make_pair.sh OUTDIR [--quick] [--seed N] [--force] [--bin DIR]" >&2; exit 2; }
case "$seed" in ''|*[!0-9]*) echo "make_pair: --seed $seed: not a number" >&2; exit 2 ;; esac
if [ -d "$out" ] && [ -n "$(ls -A "$out")" ] && [ $force -eq 0 ]; then
    echo "make_pair: $out is not empty; choose another OUTDIR or pass --force (it replaces target/, drafter/, TARGET.kpk, report.json, work/)" >&2
    exit 2
fi
if ! $PY -c "import torch, numpy" 2>/dev/null; then
    echo "make_pair: /usr/bin/python3 lacks torch or numpy: apt-get install python3-torch python3-numpy" >&2
    exit 1
fi
corpus=()
for f in GPL-3 GPL-2 LGPL-2.1 Apache-2.0 MPL-2.0; do
    p=/usr/share/common-licenses/$f
    [ -r "$p" ] || { echo "make_pair: $p is missing (Debian's base-files has it)" >&2; exit 1; }
    corpus+=("$p")
done
step() { echo "make_pair: $*" >&2; }
mkdir -p "$out"
out="$(cd "$out" && pwd)"
rm -rf "$out/target" "$out/drafter" "$out/work" "$out/TARGET.kpk" "$out/report.json"
sha256sum "${corpus[@]}" > "$out/corpus.sha256"

if [ -z "$bin" ]; then
    step "1/5 build"
    make -C "$TOP" -j2 --no-print-directory bin/k3synth bin/kpack bin/krun >&2
    bin="$TOP/bin"
else
    step "1/5 the binaries of $bin"
    for b in k3synth kpack krun; do
        [ -x "$bin/$b" ] || { echo "make_pair: $bin/$b is missing (make all)" >&2; exit 1; }
    done
fi

step "2/5 k3synth target (tiny, 12 layers, 32 experts top-4, seed $seed)"
"$bin/k3synth" "$out/target" --geometry tiny --layers 12 --experts 32 --topk 4 \
    --seed "$seed" --threads 2 --quiet

step "3/5 fit_head: the output head trained on the corpus' bytes"
if [ $quick -eq 1 ]; then fh=(--windows 64 --window 48 --steps 150); else fh=(); fi
corp=(); for p in "${corpus[@]}"; do corp+=(--corpus "$p"); done
$PY "$TOP/tests/train/fit_head.py" "$out/target" "${corp[@]}" --seed "$seed" "${fh[@]}" >&2

step "4/5 kpack convert -> TARGET.kpk"
"$bin/kpack" convert "$out/target" "$out/TARGET.kpk" --quiet

step "5/5 train_drafter"
if [ $quick -eq 1 ]; then
    td=(--train-prompts 24 --heldout-prompts 4 --gen 32 --steps 40 --ttt 3 --max-drafts 4)
else
    td=()
fi
$PY "$TOP/tests/train/train_drafter.py" --target "$out/target" --kpk "$out/TARGET.kpk" \
    --out "$out/drafter" --work "$out/work" "${corp[@]}" --seed "$seed" \
    --krun "$bin/krun" --report "$out/report.json" "${td[@]}"

$PY - "$out/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for name, acc in (("trained", r["acceptance"]), ("untrained", r["acceptance_untrained"])):
    for kind in ("sampled", "greedy"):
        a = acc[kind]
        print("%-9s held-out %-7s (%4d anchors): a_j %s; tokens per pass at 1..%d drafts %s" %
              (name, kind, a["anchors"], " ".join("%.3f" % x for x in a["a"]), len(a["a"]),
               " ".join("%.2f" % x for x in a["tokens_per_pass_simulated"])))
print("held-out greedy text: %.0f %% of its tokens repeat the one before" %
      (100 * r["heldout_greedy_repeats"]))
print("wall seconds: %s" % r["seconds"])
PY
echo "make_pair: done: $out/TARGET.kpk and $out/drafter/" >&2
