#!/usr/bin/env bash
# The trained drafter of issue 30 (make bench; BENCH_ONLY=train): docs/DRAFTER-TRAINING.md.
#  1. tests/train/test_train.py in full: the float32 ports against the float64 references,
#     fit_head, train_drafter twice (the same bytes), make_pair.sh --quick end to end
#     (checks; `make test` runs only the first three, tests/cli/test_train.sh).
#  2. tests/train/make_pair.sh at its full size (~30 min on 2 cores; BENCH_TRAIN_QUICK=1:
#     the toy size, ~4 min): the pair, and its offline acceptance -- trained vs untrained
#     drafter, held-out greedy and sampled continuations, per-depth a_j and tokens per pass
#     at 1..7 drafts. The runtime's figures with the pair (bytes per generated token under
#     --mem, page cache dropped) are krun's, measured where krun --draft is (bench_spec.sh).
# Prints figures; the exit status is non-zero only if a command failed. Without
# python3-torch: one line saying so.
# Env: BENCH_DIR (work directory, deleted at the end unless BENCH_TRAIN_KEEP=1),
#      BENCH_TRAIN_QUICK=1.
set -u
cd "$(dirname "$0")/../.." || exit 2
TOP=$PWD
PY=/usr/bin/python3
if ! $PY -c "import torch, numpy" 2>/dev/null; then
    echo "skipped: /usr/bin/python3 has no torch (apt-get install python3-torch)"
    exit 0
fi
W=${BENCH_DIR:-$(mktemp -d "$TOP/build/bench-train.XXXXXX")}
mkdir -p "$W"
[ "${BENCH_TRAIN_KEEP:-0}" = 1 ] || trap 'rm -rf "$W"' EXIT
rc=0
echo "== tests/train/test_train.py (full)"
nice -n 10 $PY tests/train/test_train.py --k3synth bin/k3synth --krun bin/krun --kpack bin/kpack \
    --make-pair tests/train/make_pair.sh --bin bin || rc=1
echo "== tests/train/make_pair.sh $W/pair ${BENCH_TRAIN_QUICK:+--quick}"
q=(); [ "${BENCH_TRAIN_QUICK:-0}" = 1 ] && q=(--quick)
start=$(date +%s)
nice -n 10 tests/train/make_pair.sh "$W/pair" --bin bin "${q[@]}" 2>"$W/pair.log" || { rc=1; tail -20 "$W/pair.log"; }
echo "make_pair: $(( $(date +%s) - start )) s (a shared machine: indicative)"
exit "$rc"
