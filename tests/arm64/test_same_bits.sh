#!/usr/bin/env bash
# x86-64 and aarch64 on the same KPK files: the aarch64 krun (under
# qemu-aarch64-static; BIN is tests/arm64/run.sh's wrappers) gives the ids and
# every logit bit of the x86-64 krun in $X86_BIN (this machine's SIMD path,
# itself compared with the x86-64 scalar path), on the NEON and the scalar path, for the synthetic geometries of
# test_krun_ref, the oracle fixture, MXFP4 experts quantised as a real
# checkpoint, a compressed file and a streamed budget; and the aarch64 kpack
# writes the same bytes as the x86-64 one.
. "$(dirname "$0")/../cli/lib.sh"
X86_BIN=${X86_BIN:-$TOP/bin}
for b in krun kpack k3synth; do
    [ -x "$X86_BIN/$b" ] || { notok "the x86-64 $X86_BIN/$b is missing (make all)"; finish; exit 1; }
done

# x86 writes every input with its own tools; both builds read the same files.
# name | k3synth options | kpack options | prompt ids | generated tokens
MODELS=(
  "tiny|--geometry tiny --seed 21 --shards 2|-|5,80,81,82,200,13,7,7,7,31,99|8"
  "k7|--geometry tiny --seed 2 --layers 7 --full-attn 2,5,7 --attn-res-block 2 --experts 16 --topk 4|-|1,2,3,250,4|8"
  "k5|--geometry tiny --seed 3 --layers 5 --full-attn 1,5 --attn-res-block 1 --experts 4 --topk 1 --first-dense 2 --single-file --flat-config|-|17,17,17,200,201,202|8"
  "quant|--geometry tiny --seed 41 --mxfp4 quantized --fixture-dtypes|--compress all|9,8,7,6,5,4,3|6"
)
run_pair() { # NAME KPK IDS GEN ARGS...: x86 (its default path) vs aarch64 neon and scalar
    local name=$1 kpk=$2 ids=$3 gen=$4; shift 4
    "$X86_BIN/krun" "$kpk" --ids "$ids" --gen "$gen" --dump-all-logits "$T/x86.bin" --dump-logits "$T/x86.last" \
        --json "$T/x86.json" --quiet "$@" >/dev/null 2>"$T/err" || { notok "$name: x86 krun: $(head -c 300 "$T/err")"; return; }
    # the x86-64 scalar path gives the same bits as its SIMD one (the chain: x86 scalar == x86 SIMD == aarch64 NEON == aarch64 scalar)
    if "$X86_BIN/krun" "$kpk" --ids "$ids" --gen "$gen" --dump-all-logits "$T/x86s.bin" --quiet --simd scalar "$@" >/dev/null 2>"$T/err" \
            && cmp -s "$T/x86.bin" "$T/x86s.bin"; then
        ok "$name${*:+ ($*)}: x86-64 scalar == x86-64 $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["simd"])' "$T/x86.json"): every logit bit"
    else
        notok "$name${*:+ ($*)}: x86-64 scalar and SIMD differ: $(head -c 300 "$T/err")"
    fi
    for simd in neon scalar; do
        if ! "$BIN/krun" "$kpk" --ids "$ids" --gen "$gen" --dump-all-logits "$T/arm.bin" --dump-logits "$T/arm.last" \
                --json "$T/arm.json" --quiet --simd $simd "$@" >/dev/null 2>"$T/err"; then
            notok "$name: aarch64 krun --simd $simd: $(head -c 300 "$T/err")"; continue
        fi
        if cmp -s "$T/x86.bin" "$T/arm.bin" && cmp -s "$T/x86.last" "$T/arm.last" && python3 - "$T/x86.json" "$T/arm.json" "$simd" <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert a["generated_ids"] == b["generated_ids"] and a["prompt_ids"] == b["prompt_ids"], (a["generated_ids"], b["generated_ids"])
assert b["simd"] == sys.argv[3], b["simd"]
PY
        then
            ok "$name${*:+ ($*)}: aarch64 $simd == x86-64 $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["simd"])' "$T/x86.json"): ids, every logit bit ($(($(stat -c %s "$T/x86.bin") / 4)) logits), the last-position dump"
        else
            notok "$name${*:+ ($*)}: aarch64 $simd and x86-64 differ"
        fi
    done
}

for m in "${MODELS[@]}"; do
    IFS='|' read -r name synth pack ids gen <<<"$m"
    "$X86_BIN/k3synth" "$T/$name" $synth --quiet >/dev/null 2>"$T/err" || { notok "k3synth $name: $(cat "$T/err")"; continue; }
    [ "$pack" = - ] && pack=""
    "$X86_BIN/kpack" convert "$T/$name" "$T/$name.kpk" $pack --quiet 2>"$T/err" || { notok "convert $name: $(cat "$T/err")"; continue; }
    run_pair "$name" "$T/$name.kpk" "$ids" "$gen"
done

# the tiny model within a budget: streamed pieces, O_DIRECT reads, 2 threads
if [ -f "$T/tiny.kpk" ]; then
    run_pair tiny "$T/tiny.kpk" 5,80,81,82,200,13,7,7,7,31,99 4 --mem 1G --pin 2 --expert-slots 2 --head stream --piece 8K --threads 2
fi

# the PyTorch oracle fixture
ORACLE="$K3_SHARED/fixtures/k3-tiny-oracle"
if [ -f "$ORACLE/reference.json" ]; then
    "$X86_BIN/kpack" convert "$ORACLE" "$T/o.kpk" --quiet
    prompt=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompt_ids"])))' "$ORACLE/reference.json")
    run_pair oracle "$T/o.kpk" "$prompt" 16
else
    skip "the oracle fixture: $ORACLE is absent"
fi

# kpack itself: the aarch64 converter writes the x86-64 converter's bytes
if [ -d "$T/tiny" ] && [ -d "$T/quant" ]; then
    "$BIN/kpack" convert "$T/tiny" "$T/tiny_arm.kpk" --quiet 2>"$T/err" && cmp -s "$T/tiny.kpk" "$T/tiny_arm.kpk" \
        && ok "kpack convert on aarch64 writes the x86-64 file byte for byte ($(stat -c %s "$T/tiny.kpk") bytes)" \
        || notok "kpack convert on aarch64 differs from x86-64: $(head -c 300 "$T/err")"
    "$BIN/kpack" convert "$T/quant" "$T/quant_arm.kpk" --compress all --quiet 2>"$T/err" && cmp -s "$T/quant.kpk" "$T/quant_arm.kpk" \
        && ok "kpack convert --compress all on aarch64 writes the x86-64 file byte for byte" \
        || notok "kpack convert --compress all on aarch64 differs from x86-64: $(head -c 300 "$T/err")"
    "$BIN/kpack" verify "$T/quant.kpk" --quiet >/dev/null 2>"$T/err" && ok "kpack verify on aarch64 accepts the x86-64 file" \
        || notok "kpack verify on aarch64: $(head -c 300 "$T/err")"
fi
finish
