#!/usr/bin/env bash
# The drafter's training side (tests/train, docs/DRAFTER-TRAINING.md), the cheap part: the
# float32 ports of tests/train/k3torch.py against the float64 references (k3ref, eagle_ref)
# -- the arithmetic the trained drafter is made with. ~15 s. The training checks (fit_head,
# train_drafter's reproducible bytes, make_pair.sh end to end) take minutes: make bench
# (tests/bench/bench_train.sh). Needs python3-torch: without it, one visible skip.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
if ! $PY -c "import torch, numpy" 2>/dev/null; then
    skip "tests/train: /usr/bin/python3 has no torch (apt-get install python3-torch)"
    finish; exit 0
fi
$PY "$TOP/tests/train/test_train.py" --k3synth "$BIN/k3synth" --krun "$BIN/krun" --kpack "$BIN/kpack" \
    --quick || FAILS=$((FAILS + 1))
finish
