#!/usr/bin/env bash
# make demo: synthesize a tiny Kimi K3 checkpoint in the released format,
# convert it, verify it, and generate text with it.
# KPK_BIN=DIR: the kpack and krun to run (default bin/; tests/cli/test_install.sh runs the
# installed ones); K3SYNTH: the synthesizer (default bin/k3synth, a test tool: not installed).
set -eu
cd "$(dirname "$0")/.."
D=${DEMO_DIR:-build/demo}
B=${KPK_BIN:-bin}
K3SYNTH=${K3SYNTH:-bin/k3synth}
rm -rf "$D"; mkdir -p "$D"
TOK=../shared/fixtures/tokenizer/tiktoken.model
if [ -f "$TOK" ]; then
    echo "== k3synth: tiny K3 (13 layers, hidden 128) with the real Kimi tokenizer, vocabulary 163,840"
    "$K3SYNTH" "$D/ckpt" --geometry tiny --seed 1 --shards 3 --tokenizer "$TOK"
else
    echo "== k3synth: tiny K3 (13 layers, hidden 128) with a byte-level tokenizer (../shared is absent)"
    "$K3SYNTH" "$D/ckpt" --geometry tiny --seed 1 --shards 3 --vocab 512
fi
echo "== kpack check-source"
"$B/kpack" check-source "$D/ckpt"
echo "== kpack convert"
"$B/kpack" convert "$D/ckpt" "$D/tiny.kpk"
echo "== kpack verify"
"$B/kpack" verify "$D/tiny.kpk"
echo "== kpack info"
"$B/kpack" info "$D/tiny.kpk"
echo "== krun (random weights: fluent nonsense is the expected output)"
"$B/krun" "$D/tiny.kpk" --prompt "The capital of France is" --gen 24
echo "== krun, sampled"
"$B/krun" "$D/tiny.kpk" --prompt "Once upon a time" --gen 24 --temp 0.8 --top-p 0.9 --seed 42
