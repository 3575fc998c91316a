#!/usr/bin/env bash
# make demo: synthesize a tiny Kimi K3 checkpoint in the released format,
# convert it, verify it, and generate text with it.
set -eu
cd "$(dirname "$0")/.."
D=${DEMO_DIR:-build/demo}
rm -rf "$D"; mkdir -p "$D"
TOK=../shared/fixtures/tokenizer/tiktoken.model
if [ -f "$TOK" ]; then
    echo "== k3synth: tiny K3 (13 layers, hidden 128) with the real Kimi tokenizer, vocabulary 163,840"
    bin/k3synth "$D/ckpt" --geometry tiny --seed 1 --shards 3 --tokenizer "$TOK"
else
    echo "== k3synth: tiny K3 (13 layers, hidden 128) with a byte-level tokenizer (../shared is absent)"
    bin/k3synth "$D/ckpt" --geometry tiny --seed 1 --shards 3 --vocab 512
fi
echo "== kpack check-source"
bin/kpack check-source "$D/ckpt"
echo "== kpack convert"
bin/kpack convert "$D/ckpt" "$D/tiny.kpk"
echo "== kpack verify"
bin/kpack verify "$D/tiny.kpk"
echo "== kpack info"
bin/kpack info "$D/tiny.kpk"
echo "== krun (random weights: fluent nonsense is the expected output)"
bin/krun "$D/tiny.kpk" --prompt "The capital of France is" --gen 24
echo "== krun, sampled"
bin/krun "$D/tiny.kpk" --prompt "Once upon a time" --gen 24 --temp 0.8 --top-p 0.9 --seed 42
