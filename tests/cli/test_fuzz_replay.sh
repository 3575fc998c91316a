#!/usr/bin/env bash
# The fuzz harnesses without libFuzzer (tests/fuzz/): every crash input the
# fuzzers found (tests/fuzz/regress/NAME/) is replayed and must neither crash
# nor break an invariant; every committed seed (tests/fuzz/corpus/NAME/) is a
# valid input and must be accepted all the way through, which proves each
# harness really reaches the code it fuzzes.  The KPK harness gets a fresh
# small conversion (accepted) and a damaged copy (refused); the state-file
# harness gets states saved with that conversion (its model: a state is tied
# to the file it was computed with, so its seeds are made here, not committed).
. "$(dirname "$0")/lib.sh"
FZ="$TOP/tests/fuzz"

replay() { # replay NAME LABEL WANT_ACCEPTED PATH...: WANT_ACCEPTED "all", "none" or a number
    local h=$1 label=$2 want=$3; shift 3
    local bin="${BUILD:-build}/tests/fuzz_replay_$h" out n acc
    case $bin in /*) ;; *) bin="$TOP/$bin";; esac
    [ -x "$bin" ] || { notok "fuzz_replay_$h is not built"; return; }
    if ! out=$("$bin" "$@" 2>"$T/replay.err"); then
        notok "fuzz_replay_$h $label: crashed or broke an invariant: $(tail -5 "$T/replay.err")"
        return
    fi
    n=$(sed -n 's/^replayed \([0-9]*\) inputs, \([0-9]*\) accepted$/\1/p' <<<"$out")
    acc=$(sed -n 's/^replayed \([0-9]*\) inputs, \([0-9]*\) accepted$/\2/p' <<<"$out")
    case $want in all) want=$n;; none) want=0;; esac
    if [ -n "$n" ] && [ "$n" -gt 0 ] && [ "$acc" = "$want" ]; then ok "fuzz_replay_$h $label: $n inputs, $acc accepted"
    else notok "fuzz_replay_$h $label: $out (wanted $want accepted)"; fi
}

"$BIN/k3synth" "$T/src" --geometry micro --quiet >/dev/null 2>&1 \
    && "$BIN/kpack" convert "$T/src" "$T/small.kpk" --quiet \
    || { notok "cannot make the small model"; finish; exit 1; }
# fuzz_tokenizer's rank file: the real one when the shared fixtures are there,
# else the synthetic one (same format)
KPK_FUZZ_TIKTOKEN="$K3_SHARED/fixtures/tokenizer/tiktoken.model"
[ -f "$KPK_FUZZ_TIKTOKEN" ] || KPK_FUZZ_TIKTOKEN="$T/src/tiktoken.model"
export KPK_FUZZ_TIKTOKEN
export KPK_FUZZ_STATE_MODEL="$T/small.kpk"

for dir in "$FZ"/corpus/*/; do
    h=$(basename "$dir")
    replay "$h" "seeds" all "$dir"
done
for dir in "$FZ"/regress/*/; do
    [ -d "$dir" ] || continue
    h=$(basename "$dir")
    replay "$h" "regression inputs" none "$dir"
done

replay kpk "a fresh small conversion" all "$T/small.kpk"
cp "$T/small.kpk" "$T/flip.kpk"
printf '\x01' | dd of="$T/flip.kpk" bs=1 seek=$((4096 * 3 + 100)) conv=notrunc 2>/dev/null
replay kpk "the same with one byte changed" none "$T/flip.kpk"
n=$(python3 -c 'import struct,sys; print(struct.unpack("<Q", open(sys.argv[1],"rb").read(8))[0])' "$T/src/model-00001-of-000003.safetensors")
head -c $((8 + n)) "$T/src/model-00001-of-000003.safetensors" > "$T/header"
replay safetensors "a real shard's header" all "$T/header" "$T/src/model-00001-of-000003.safetensors"
replay config "the model's config.json" all "$T/src/config.json"

mkdir -p "$T/states"
"$BIN/krun" "$T/small.kpk" --ids 1,2,3,4,5 --gen 3 --save-state "$T/states/greedy" --quiet >/dev/null \
    && "$BIN/krun" "$T/small.kpk" --ids 7 --gen 0 --save-state "$T/states/one-position" --quiet >/dev/null \
    && "$BIN/krun" "$T/small.kpk" --load-state "$T/states/greedy" --ids 9,10 --gen 4 --temp 0.8 --seed 3 \
        --save-state "$T/states/sampled-second-turn" --quiet >/dev/null \
    || notok "krun --save-state on the small model"
replay state "states saved by krun" all "$T/states"
# a token id of the history changed (offset 168: the first token): the
# checksum refuses it as given, and re-sealed the id is out of the vocabulary
cp "$T/states/greedy" "$T/bad.state"
printf '\xff' | dd of="$T/bad.state" bs=1 seek=$((160 + 8 + 1)) conv=notrunc 2>/dev/null
replay state "the same with a token id out of the vocabulary" none "$T/bad.state"

# a codec-2 block whose zstd frame has one byte changed (the 16-byte record,
# then the frame): refused as given (the re-sealed variant may decode)
cp "$FZ/corpus/block/zstd-text" "$T/bad.block"
printf '\x5a' | dd of="$T/bad.block" bs=1 seek=$((16 + 40)) conv=notrunc 2>/dev/null
replay block "a zstd block with one byte changed" none "$T/bad.block"
finish
