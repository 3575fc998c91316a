#!/usr/bin/env bash
# krun: determinism (threads, SIMD, prefill blocking, recompute), text in and
# out through the tokenizer, sampling, and bad input.
. "$(dirname "$0")/lib.sh"

"$BIN/k3synth" "$T/m" --geometry tiny --seed 21 --shards 2 --quiet >/dev/null 2>"$T/err" || { notok "k3synth: $(cat "$T/err")"; finish; exit 1; }
"$BIN/kpack" convert "$T/m" "$T/m.kpk" --quiet || { notok "convert"; finish; exit 1; }
IDS=5,80,81,82,200,13,7,7,7,31,99

# Determinism: logits bits identical across thread counts, SIMD paths, prefill
# blocking and full recompute; generated ids identical too.
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen 8 --dump-all-logits "$T/ref.bin" --json "$T/ref.json" --quiet --print-ids >/dev/null
simds="scalar avx2 avx512 neon"
for v in "--threads 1" "--threads 2" "--threads 3" "--chunk 1" "--chunk 4 --threads 1" "--recompute"; do
    "$BIN/krun" "$T/m.kpk" --ids $IDS --gen 8 --dump-all-logits "$T/x.bin" --json "$T/x.json" --quiet --print-ids $v >/dev/null
    cmp -s "$T/ref.bin" "$T/x.bin" && python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["generated_ids"]==json.load(open(sys.argv[2]))["generated_ids"]' "$T/ref.json" "$T/x.json" \
        && ok "identical logits bits and ids with $v" || notok "results differ with $v"
done
for s in $simds; do
    "$BIN/krun" "$T/m.kpk" --ids $IDS --gen 8 --dump-all-logits "$T/x.bin" --quiet --simd $s --json "$T/x.json" >/dev/null 2>"$T/err"
    used=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["simd"])' "$T/x.json" 2>/dev/null)
    if [ "$used" != "$s" ]; then skip "SIMD path $s: this CPU runs $used instead"; continue; fi
    cmp -s "$T/ref.bin" "$T/x.bin" && ok "identical logits bits on the $s path" || notok "logits differ on the $s path"
done
KRUN_SIMD=scalar "$BIN/krun" "$T/m.kpk" --ids $IDS --gen 8 --dump-all-logits "$T/x.bin" --quiet --threads 1 >/dev/null
cmp -s "$T/ref.bin" "$T/x.bin" && ok "identical logits bits: scalar, 1 thread (KRUN_SIMD) vs default" || notok "KRUN_SIMD=scalar differs"

# Another build of the same source (gcc's bin/ when this suite runs a clang,
# sanitizer or other build): the same bits.  Skipped when bin/krun is older
# than the source (it would not be the same program).
if [ "$(cd "$BIN" && pwd)" != "$TOP/bin" ] && [ -x "$TOP/bin/krun" ] && \
   [ -z "$(find "$TOP/run" "$TOP/format" -name '*.[ch]' -newer "$TOP/bin/krun" 2>/dev/null | head -1)" ]; then
    "$TOP/bin/krun" "$T/m.kpk" --ids $IDS --gen 8 --dump-all-logits "$T/x.bin" --json "$T/x.json" --quiet --print-ids >/dev/null
    cmp -s "$T/ref.bin" "$T/x.bin" && python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["generated_ids"]==json.load(open(sys.argv[2]))["generated_ids"]' "$T/ref.json" "$T/x.json" \
        && ok "identical logits bits and ids from $BIN/krun and the default build bin/krun (another compiler or flags)" \
        || notok "$BIN/krun and bin/krun give different bits"
else
    skip "bits across builds: this is the default build, or bin/krun is missing or older than the source"
fi

# JSON report keys
python3 - "$T/ref.json" <<'PY' && ok "--json has prompt_ids, generated_ids, seconds_per_token, bytes_read, peak_rss_bytes" || notok "--json keys"
import json, sys
j = json.load(open(sys.argv[1]))
for k in ("prompt_ids", "generated_ids", "seconds_per_token", "bytes_read", "peak_rss_bytes"):
    assert k in j, k
assert len(j["generated_ids"]) == 8 and len(j["seconds_per_token"]) == 8 and j["peak_rss_bytes"] > 0 and j["bytes_read"] > 0
PY

# Sampling: the same seed gives the same ids; the filters keep ids valid.
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen 12 --temp 0.9 --top-k 40 --top-p 0.95 --seed 7 --print-ids --quiet > "$T/s1"
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen 12 --temp 0.9 --top-k 40 --top-p 0.95 --seed 7 --print-ids --quiet --threads 1 > "$T/s2"
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen 12 --temp 0.9 --top-k 40 --top-p 0.95 --seed 8 --print-ids --quiet > "$T/s3"
cmp -s "$T/s1" "$T/s2" && ok "sampling: same seed, same ids" || notok "sampling not reproducible"
cmp -s "$T/s1" "$T/s3" && notok "sampling: seeds 7 and 8 gave the same 12 ids" || ok "sampling: another seed, other ids"
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen 6 --temp 1 --min-p 0.2 --seed 1 --print-ids --quiet >/dev/null && ok "--min-p runs" || notok "--min-p"

# Text in and out with the byte-level tokenizer of the synthetic model
printf 'caf\xc3\xa9 \xe4\xb8\xad' > "$T/prompt.txt"
"$BIN/krun" "$T/m.kpk" --prompt-file "$T/prompt.txt" --gen 4 --json "$T/t.json" --quiet >"$T/t.out" \
    && ok "--prompt-file with UTF-8 text" || notok "--prompt-file: $(cat "$T/t.out")"
"$BIN/krun" "$T/m.kpk" --prompt "Hello" --gen 5 --quiet >"$T/t.out" && ok "--prompt streams text" || notok "--prompt"

# The real tokenizer, full vocabulary, when ../shared has it
TOK="$K3_SHARED/fixtures/tokenizer/tiktoken.model"
if [ -f "$TOK" ]; then
    "$BIN/k3synth" "$T/rt" --geometry tiny --seed 2 --layers 4 --tokenizer "$TOK" --quiet >/dev/null 2>"$T/err" || notok "k3synth --tokenizer: $(cat "$T/err")"
    "$BIN/kpack" convert "$T/rt" "$T/rt.kpk" --quiet
    "$BIN/krun" "$T/rt.kpk" --prompt "The capital of France is" --gen 3 --json "$T/rt.json" --quiet >/dev/null
    python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["prompt_ids"]==[1008,10484,318,15383,387]' "$T/rt.json" \
        && ok "real tokenizer in the KPK: \"The capital of France is\" -> 1008,10484,318,15383,387" || notok "real tokenizer prompt ids"
    "$BIN/krun" "$T/rt.kpk" --ids 3,4,5,6,7 --gen 0 --json "$T/rt2.json" --quiet >/dev/null && ok "real-vocabulary model runs from ids" || notok "real vocabulary from ids"
    # generation stops at K3's end-of-message id: a prompt of that id alone is
    # not enough to force it, so check the stop logic through --ignore-eos instead
    printf '<|end_of_msg|>' > "$T/eom.txt"
    "$BIN/krun" "$T/rt.kpk" --prompt-file "$T/eom.txt" --gen 0 --json "$T/eom.json" --quiet >/dev/null
    python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["prompt_ids"]==[163586]' "$T/eom.json" \
        && ok "<|end_of_msg|> in a prompt is the special id 163586" || notok "special token in prompt"
else
    skip "real tokenizer checks: $TOK is absent"
fi

# Generation stops at the model's end-of-message id: make the 3rd greedy token
# the EOS of a copy of the model and check the run stops right there.
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen 6 --json "$T/g.json" --quiet --ignore-eos >/dev/null
eos=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["generated_ids"][2])' "$T/g.json")
cp -r "$T/m" "$T/m_eos"
python3 -c 'import json,sys; p=sys.argv[1]; c=json.load(open(p)); c["eos_token_id"]=int(sys.argv[2]); json.dump(c, open(p,"w"))' "$T/m_eos/config.json" "$eos"
"$BIN/kpack" convert "$T/m_eos" "$T/m_eos.kpk" --quiet
"$BIN/krun" "$T/m_eos.kpk" --ids $IDS --gen 6 --json "$T/e.json" --quiet >/dev/null
python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["generated_ids"]; b=json.load(open(sys.argv[2]))["generated_ids"]; assert b==a[:3], (a,b)' "$T/g.json" "$T/e.json" \
    && ok "generation stops at eos_token_id ($eos) after 3 of 6 tokens" || notok "EOS stop"

# Bad input
expect_exit 2 "token id out of range" "$BIN/krun" "$T/m.kpk" --ids 1,2,99999 --gen 1 --quiet
expect_err "token id 99999 .* outside the vocabulary" "the bad id is named"
expect_exit 2 "empty prompt" "$BIN/krun" "$T/m.kpk" --prompt "" --gen 1 --quiet
expect_err "empty" "says the prompt is empty"
expect_exit 2 "prompt longer than the context" "$BIN/krun" "$T/m.kpk" --ids $IDS --gen 4 --ctx 5 --quiet
expect_err "do not fit the context" "says it does not fit"
expect_exit 2 "no prompt" "$BIN/krun" "$T/m.kpk" --gen 1
expect_exit 2 "unknown option" "$BIN/krun" "$T/m.kpk" --ids 1 --frobnicate
expect_exit 2 "not a KPK file" "$BIN/krun" "$T/prompt.txt" --ids 1
"$BIN/kpack" convert "$K3_SHARED/fixtures/k3-tiny-oracle" "$T/notok.kpk" --quiet 2>/dev/null && {
    expect_exit 2 "text prompt on a model without a tokenizer" "$BIN/krun" "$T/notok.kpk" --prompt "hi" --gen 1
    expect_err "no tokenizer" "says to use --ids"
}
expect_exit 0 "krun --help" "$BIN/krun" --help

# A corrupted expert extent: stop, name it, print no token computed from it.
corrupt_experts "$T/m.kpk" "$T/bad.kpk"
expect_exit 1 "a corrupted expert extent stops the run" "$BIN/krun" "$T/bad.kpk" --ids $IDS --gen 4 --print-ids --quiet
expect_err "layer [0-9]+ expert [0-9]+ .*checksum mismatch" "the extent is named"
[ ! -s "$T/last.out" ] && ok "no token was printed" || notok "tokens printed from corrupt data: $(cat "$T/last.out")"
expect_exit 0 "--verify off skips the check (the user asked for it)" "$BIN/krun" "$T/bad.kpk" --ids $IDS --gen 1 --verify off --quiet
finish
