#!/usr/bin/env bash
# Generated seeds for `make fuzz` (the committed ones in tests/fuzz/corpus/
# are small hand-made files; these come from the tiny synthetic model and
# are too large or too derived to keep in git):
#   kpk/          small .kpk conversions (two orders, two alignments)
#   safetensors/  every shard's header, alone and with the first data bytes
#   config/       the nested and the flat config.json
#   tokenizer_load/  tokenizer_config.json + "\n--\n" + rank file (synthetic,
#                 and the first 1,000 ranks of the real file when present)
#   tiktoken.model   the synthetic rank file fuzz_tokenizer falls back on
#   state/        krun --save-state files of kpk/layer-major.kpk, the model
#                 fuzz_state loads them with (a state is tied to its model)
# Usage: make_seeds.sh BIN OUTDIR
set -eu
BIN=$1 OUT=$2
SHARED=${K3_SHARED:-$(cd "$(dirname "$0")/../../.." && pwd)/shared}
rm -rf "$OUT"; mkdir -p "$OUT"/{kpk,safetensors,config,tokenizer_load,state}
W="$OUT/work"; mkdir -p "$W"
small="--geometry micro"
"$BIN/k3synth" "$W/src" $small --seed 1 --quiet
"$BIN/k3synth" "$W/moe" --geometry micro --first-dense 0 --seed 2 --flat-config --single-file --quiet
"$BIN/kpack" convert "$W/src" "$OUT/kpk/layer-major.kpk" --quiet
"$BIN/kpack" convert "$W/src" "$OUT/kpk/trunk-first-8k.kpk" --order trunk-first --align 8192 --quiet
"$BIN/kpack" convert "$W/moe" "$OUT/kpk/flat-moe.kpk" --quiet
for f in "$W"/src/*.safetensors "$W"/moe/*.safetensors; do
    b=$(basename "$(dirname "$f")")-$(basename "$f" .safetensors)
    n=$(python3 -c 'import struct,sys; print(struct.unpack("<Q", open(sys.argv[1],"rb").read(8))[0])' "$f")
    head -c $((8 + n)) "$f" > "$OUT/safetensors/$b.header"
    head -c $((8 + n + 4096)) "$f" > "$OUT/safetensors/$b.head4k"
done
cp "$W/src/config.json" "$OUT/config/nested.json"
cp "$W/moe/config.json" "$OUT/config/flat.json"
cp "$W/src/tiktoken.model" "$OUT/tiktoken.model"
{ cat "$W/src/tokenizer_config.json"; printf '\n--\n'; cat "$W/src/tiktoken.model"; } > "$OUT/tokenizer_load/synthetic"
cp "$W/src/tiktoken.model" "$OUT/tokenizer_load/synthetic-ranks-only"
if [ -f "$SHARED/fixtures/tokenizer/tiktoken.model" ]; then
    head -n 1000 "$SHARED/fixtures/tokenizer/tiktoken.model" > "$OUT/tokenizer_load/real-first-1000"
fi
M="$OUT/kpk/layer-major.kpk"
"$BIN/krun" "$M" --ids 1,2,3,4,5 --gen 3 --save-state "$OUT/state/greedy" --quiet >/dev/null
"$BIN/krun" "$M" --ids 7 --gen 0 --save-state "$OUT/state/one-position" --quiet >/dev/null
"$BIN/krun" "$M" --load-state "$OUT/state/greedy" --ids 9,10 --gen 4 --temp 0.8 --seed 3 \
    --save-state "$OUT/state/sampled-second-turn" --quiet >/dev/null
rm -rf "$W"
