#!/usr/bin/env bash
# The drafter's float64 reference (tests/ref/eagle_ref.py) checked on its own: the
# K3_EAGLE §3.7 check values, hand cases, a literal second implementation, the
# writer and reader of the released layout, the taps' closed form and every §7 trap
# (tests/ref/test_eagle_ref.py), on a k3synth target and the oracle fixture; then
# its command line end to end.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
REF="$TOP/tests/ref/eagle_ref.py"
if ! $PY -c "import numpy" 2>/dev/null; then
    skip "eagle_ref: /usr/bin/python3 has no numpy (python3-numpy)"; finish; exit 0
fi
targets=()
[ -d "$K3_SHARED/fixtures/k3-tiny-oracle" ] && targets+=(--target "$K3_SHARED/fixtures/k3-tiny-oracle")
$PY "$TOP/tests/ref/test_eagle_ref.py" --k3synth "$BIN/k3synth" "${targets[@]}" || true
[ ${#targets[@]} -eq 0 ] && skip "eagle_ref on the oracle fixture's target: $K3_SHARED/fixtures/k3-tiny-oracle is absent"

# The command line: write-random, run, accept, and the refusals (exit 2, named).
"$BIN/k3synth" "$T/tgt" --geometry tiny --layers 12 --seed 8 --quiet >/dev/null 2>"$T/err" || notok "k3synth: $(cat "$T/err")"
expect_exit 0 "write-random" $PY "$REF" write-random "$T/dr" --target "$T/tgt" --seed 3 --heads 3 --inter 200
expect_exit 2 "write-random refuses to overwrite a drafter" $PY "$REF" write-random "$T/dr" --target "$T/tgt"
expect_err "exists" "... naming it"
expect_exit 0 "run: chains at 2 positions" $PY "$REF" run "$T/tgt" "$T/dr" --ids 5,6,7,8,200,3 --chains 2:3,5:4 --top 2 --taps --out "$T/o.json"
$PY - "$T/o.json" <<'PY' && ok "run: OUT.json has the documented shape (kv n-1 rows of kv_lora+d_rope, chains, taps [n][3][E])" || notok "run: OUT.json shape"
import json, sys
r = json.load(open(sys.argv[1]))
n = len(r["ids"])
assert r["schema"] == "kpk-eagle-ref/1" and r["tap_layers"] == [1, 5, 8]
assert len(r["kv"]) == n - 1 and all(len(k) == 32 + 8 for k in r["kv"])
assert len(r["taps"]) == n and all(len(t) == 3 and len(t[0]) == 128 for t in r["taps"])
assert len(r["target_argmax"]) == n and r["embed_matches_target"] is True
c = r["chains"]
assert [x["p0"] for x in c] == [2, 5] and c[0]["u"] == r["ids"][3] and c[1]["u"] == r["target_argmax"][5]
assert c[1]["positions"] == [5, 6, 7, 8] and len(c[1]["top"]) == 4 and len(c[1]["top"][0]) == 2
assert all(x["top"][j][0][0] == x["drafts"][j] for x in c for j in range(x["k"]))
assert all(abs(x["top"][j][0][1] - x["top"][j][1][1] - x["margin"][j]) < 1e-12 for x in c for j in range(x["k"]))
PY
expect_exit 0 "run --next --drafts --logits-bin --kv-bin (the runtime's view: prefill, emitted token, K drafts)" \
    $PY "$REF" run "$T/tgt" "$T/dr" --ids 5,6,7,8,200,3 --next 77 --drafts 3 --logits-bin "$T/l.f32" --kv-bin "$T/kv.f32" --out "$T/o2.json"
$PY - "$T/o2.json" "$T/l.f32" "$T/kv.f32" <<'PY' && ok "... draft_ids, margins, logits [K][V] and kv rows + pending g as float32 equal OUT.json's" || notok "run --drafts outputs"
import json, sys, numpy as np
r = json.load(open(sys.argv[1]))
c = r["chains"][-1]
assert c["p0"] == 5 and c["u"] == 77 and r["draft_ids"] == c["drafts"] and r["margins"] == c["margin"]
L = np.fromfile(sys.argv[2], "<f4").reshape(3, 256)
assert np.array_equal(L, np.array(c["logits"], dtype=np.float32))
assert [int(np.argmax(x)) for x in L] == c["drafts"]
kv = np.fromfile(sys.argv[3], "<f4")
want = np.concatenate([np.ravel(r["kv"]), r["pending_g"]]).astype(np.float32)
assert kv.size == 5 * 40 + 128 and np.array_equal(kv, want)
PY
expect_exit 2 "run: an id outside the vocabulary" $PY "$REF" run "$T/tgt" "$T/dr" --ids 5,256 --out "$T/x.json"
expect_exit 2 "run: a chain past the ids" $PY "$REF" run "$T/tgt" "$T/dr" --ids 5,6 --chains 2:1 --out "$T/x.json"
expect_err "chains" "... naming --chains"
"$BIN/k3synth" "$T/tgt7" --geometry tiny --layers 7 --seed 8 --quiet >/dev/null 2>&1
expect_exit 2 "run: a drafter whose aux ids do not fit the target (12-layer ids on a 7-layer target)" \
    $PY "$REF" run "$T/tgt7" "$T/dr" --ids 5,6 --out "$T/x.json"
expect_err "aux layer ids|outside" "... naming the aux layer ids"
printf '{"prompt": [5, 6, 7], "ids": [5, 6, 7, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9]}\n' >"$T/seqs.jsonl"
expect_exit 0 "accept: offline acceptance on one sequence" $PY "$REF" accept "$T/tgt" "$T/dr" --seqs "$T/seqs.jsonl" --max-drafts 3 --out "$T/acc.json"
$PY - "$T/acc.json" <<'PY' && ok "accept: a_j in [0,1], tokens per pass in [1, 1+k], anchors counted" || notok "accept: output"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["anchors"] == 14 - 3 - 3 and len(r["a"]) == 3 and all(0 <= a <= 1 for a in r["a"])
for k, (e, s) in enumerate(zip(r["tokens_per_pass_every_anchor"], r["tokens_per_pass_simulated"]), 1):
    assert 1 <= e <= 1 + k and 1 <= s <= 1 + k
PY
finish
