#!/usr/bin/env bash
# krun against the external PyTorch oracle (../shared/fixtures/k3-tiny-oracle):
# greedy ids exact (incremental and full recompute), prompt logits within the
# fixture's tolerance, teacher-forced argmax over the generated span.
. "$(dirname "$0")/lib.sh"
ORACLE="$K3_SHARED/fixtures/k3-tiny-oracle"
if [ ! -f "$ORACLE/reference.json" ]; then
    skip "krun vs the PyTorch oracle: $ORACLE is absent"
    finish; exit 0
fi
"$BIN/kpack" convert "$ORACLE" "$T/o.kpk" --quiet || { notok "convert the oracle"; finish; exit 1; }
prompt=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompt_ids"])))' "$ORACLE/reference.json")
full=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["full_ids"])))' "$ORACLE/reference.json")

"$BIN/krun" "$T/o.kpk" --ids "$prompt" --gen 16 --json "$T/inc.json" --dump-logits "$T/last.bin" --quiet >/dev/null \
    || notok "krun on the oracle failed"
"$BIN/krun" "$T/o.kpk" --ids "$prompt" --gen 16 --json "$T/rec.json" --recompute --quiet >/dev/null \
    || notok "krun --recompute on the oracle failed"
"$BIN/krun" "$T/o.kpk" --ids "$full" --gen 0 --dump-all-logits "$T/tf.bin" --quiet >/dev/null \
    || notok "krun teacher forcing on the oracle failed"

python3 - "$ORACLE/reference.json" "$T" <<'PY'
import array, json, sys
ref = json.load(open(sys.argv[1])); d = sys.argv[2]
def floats(p):
    a = array.array("f"); a.frombytes(open(p, "rb").read()); return a
def check(ok, msg):
    print(("ok - " if ok else "not ok - ") + msg)
want = ref["greedy_ids"]
for mode in ("inc", "rec"):
    got = json.load(open(f"{d}/{mode}.json"))["generated_ids"]
    check(got == want, f"oracle greedy ids, {'incremental' if mode == 'inc' else 'full recompute'}: {sum(a == b for a, b in zip(got, want))}/{len(want)} exact")
r = ref["prompt_last_logits"]; c = floats(f"{d}/last.bin")
scale = max(abs(x) for x in r)
err = max(abs(a - b) for a, b in zip(c, r))
bound = 1.2e-7 * (ref["config"]["hidden_size"] ** 0.5) * 50
am = max(range(len(c)), key=c.__getitem__)
check(err / scale <= bound and am == ref["prompt_last_argmax"],
      f"oracle prompt logits: max abs error {err:.3e}, {err/scale:.3e} of max|ref| (bound {bound:.2e}), argmax {am}")
check(all(abs(a - b) <= 1e-4 + 1e-3 * abs(b) for a, b in zip(c, r)), "oracle prompt logits elementwise within 1e-4 + 1e-3|r|")
tf = floats(f"{d}/tf.bin"); V = len(r); n = len(ref["full_ids"]); p = len(ref["prompt_ids"])
span = range(p - 1, n - 1)
bad = [i for i in span if max(range(V), key=lambda v: tf[i * V + v]) != ref["tf_argmax"][i]]
check(not bad, f"oracle teacher-forced argmax over the generated span ({len(span)} positions; mismatches at {bad})")
worst = max(max(abs(tf[i * V + v] - ref["tf_logits"][i][v]) for v in range(V)) / max(abs(x) for x in ref["tf_logits"][i]) for i in range(n))
check(worst <= bound, f"oracle teacher-forced logit rows: worst {worst:.3e} of max|ref| (bound {bound:.2e})")
print(f"# oracle logit max abs error {err:.3e} (relative {err/scale:.3e})")
PY
finish
