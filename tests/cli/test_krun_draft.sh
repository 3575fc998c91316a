#!/usr/bin/env bash
# krun with the EAGLE drafter (--draft; docs/RUNTIME.md §11): the output is
# the model's, bit for bit -- the generated ids, the logits each token was
# chosen from, the model's part of the saved state -- with and without the
# drafter, at every width it allows (1 .. 64), greedy and at temperatures
# 0.7 and 1 with top-k, top-p, min-p and penalties and several seeds, in
# place and streaming at the minimum budget, on 1 and 2 threads, the scalar
# and a SIMD path, and on a two-member stripe set; the drafter's state
# continues through --save-state / --load-state; --json reports what it
# drafted; --plan names it; --draft auto finds MODEL.draft.kpk; and a
# drafter for another model (its vocabulary, width, taps or embedding), a
# damaged one and a file that is not one are refused naming why, exit 2
# (damage: 1), never run with wrong taps.  The drafter's state along every
# path (prompt blocks, verifications accepting and rejecting at every place,
# batched, copies, snapshots, marks, saved states) is probe_draft paths.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
case ${BUILD:-build} in /*) PROBE="$BUILD/tests/probe_draft" ;; *) PROBE="$TOP/${BUILD:-build}/tests/probe_draft" ;; esac

"$BIN/k3synth" "$T/m" --single-file --seed 5 --logit-gain 4 --quiet && "$BIN/kpack" convert "$T/m" "$T/m.kpk" --quiet \
    || { notok "the tiny target"; finish; exit 1; }
"$BIN/k3synth" "$T/d" --drafter --target "$T/m" --seed 5 --rope-theta 10000 --yarn-factor 4 --yarn-orig 256 --quiet \
    && "$BIN/kpack" convert "$T/d" "$T/d.kpk" --quiet || { notok "the drafter"; finish; exit 1; }
IDS=3,7,11,5,9,4,4,31,2
"$BIN/krun" "$T/m.kpk" --draft "$T/d.kpk" --mem 1G --plan --json "$T/min.json" >/dev/null 2>&1
MIN=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["minimum_bytes"])' "$T/min.json")

# the model's part of a state file (docs/STATE.md): the header's identity and sampler fields and
# the payload before the drafter section, with the 1.2 fields and flag left out
model_part() {
    "$PY" - "$1" <<'PY'
import struct, sys, hashlib
b = open(sys.argv[1], "rb").read()
flags = struct.unpack_from("<I", b, 88)[0]
plen = struct.unpack_from("<Q", b, 128)[0]
end = 160 + plen
if flags & 2:
    pos = struct.unpack_from("<Q", b, 72)[0]
    width, hidden = struct.unpack_from("<I", b, 92)[0], struct.unpack_from("<I", b, 124)[0]
    end -= 16 + (max(pos - 1, 0) * width + hidden) * 4
head = bytearray(b[:160])
head[10:12] = b"\0\0"; head[88:92] = struct.pack("<I", flags & 1); head[92:96] = b"\0" * 4
head[124:128] = b"\0" * 4; head[128:152] = b"\0" * 24; head[152:160] = b"\0" * 8
print(hashlib.sha256(bytes(head) + b[160:end]).hexdigest())
PY
}

# same_out LABEL ARGS...: --draft off --spec 0 and the drafter give the same ids, generated logits
# and the model's part of the saved state; the drafter drafted
same_out() {
    local label=$1; shift
    "$BIN/krun" "$T/m.kpk" --ids $IDS --gen 24 --ignore-eos --print-ids --quiet --draft off --spec 0 --dump-gen-logits "$T/a.bin" \
        --save-state "$T/a.st" "$@" >"$T/a.ids" 2>"$T/a.err" || { notok "$label: without: $(head -c 300 "$T/a.err")"; return; }
    "$BIN/krun" "$T/m.kpk" --ids $IDS --gen 24 --ignore-eos --print-ids --quiet --draft "$T/d.kpk" --spec "${SPEC:-8}" \
        --dump-gen-logits "$T/b.bin" --save-state "$T/b.st" --json "$T/b.json" "$@" >"$T/b.ids" 2>"$T/b.err" \
        || { notok "$label: with the drafter: $(head -c 300 "$T/b.err")"; return; }
    if cmp -s "$T/a.ids" "$T/b.ids" && cmp -s "$T/a.bin" "$T/b.bin" && [ -s "$T/a.bin" ] && [ "$(model_part "$T/a.st")" = "$(model_part "$T/b.st")" ] \
        && "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1]))["spec"]["drafter"]; assert d and d["drafted"] > 0, d' "$T/b.json" 2>/dev/null; then
        ok "$label: with the drafter == without: ids, every generated token's logits, the model's saved state"
    else
        notok "$label: with the drafter differs from without (or drafted nothing)"
    fi
}

SAMPLED="--temp 0.7 --top-k 40 --top-p 0.9 --min-p 0.02 --repetition-penalty 1.1 --presence-penalty 0.3 --frequency-penalty 0.2"
same_out "greedy, widths by cost"
for w in 1 2 3 5 8; do same_out "greedy, --draft-width $w" --draft-width $w; done
same_out "temperature 0.7, filters and penalties, seed 1" $SAMPLED --seed 1 --draft-width 4
same_out "temperature 0.7, filters and penalties, seed 9" $SAMPLED --seed 9 --draft-width 6
same_out "temperature 1, seed 4" --temp 1 --seed 4 --draft-width 3
same_out "streaming at the minimum budget, nothing pinned" --mem "$MIN" --pin 0 --expert-slots 2 --draft-width 4
same_out "streaming, sampled" --mem "$MIN" --pin 0 --expert-slots 2 $SAMPLED --seed 3 --draft-width 5
same_out "one thread, the scalar kernels" --threads 1 --simd scalar --draft-width 4
same_out "two threads, the best kernels" --threads 2 --draft-width 7
# every width it allows: 1 .. 64
SPEC=64
bad=""
for w in $(seq 1 64); do
    "$BIN/krun" "$T/m.kpk" --ids $IDS --gen 12 --ignore-eos --print-ids --quiet --draft "$T/d.kpk" --spec 64 --draft-width $w \
        --dump-gen-logits "$T/w.bin" >"$T/w.ids" 2>/dev/null || { bad="$bad $w(run)"; continue; }
    [ $w -gt 1 ] || "$BIN/krun" "$T/m.kpk" --ids $IDS --gen 12 --ignore-eos --print-ids --quiet --draft off --spec 0 \
        --dump-gen-logits "$T/w0.bin" >"$T/w0.ids" 2>/dev/null
    cmp -s "$T/w.ids" "$T/w0.ids" && cmp -s "$T/w.bin" "$T/w0.bin" || bad="$bad $w"
done
check "every width 1 .. 64: ids and logits == without the drafter${bad:+ (differ at:$bad)}" test -z "$bad"
SPEC=8

# a two-member stripe set of the model
mkdir -p "$T/s1" "$T/s2"
"$BIN/kpack" convert "$T/m" "$T/set.kpk" --stripe "$T/s1,$T/s2" --stripe-unit 4096 --quiet && \
"$BIN/krun" "$T/set.kpk" --ids $IDS --gen 24 --ignore-eos --print-ids --quiet --draft "$T/d.kpk" --draft-width 3 \
    --dump-gen-logits "$T/s.bin" >"$T/s.ids" 2>/dev/null && "$BIN/krun" "$T/m.kpk" --ids $IDS --gen 24 --ignore-eos --print-ids --quiet \
    --draft off --spec 0 --dump-gen-logits "$T/a.bin" >"$T/a.ids" 2>/dev/null
check "a two-member stripe set with the drafter == the single file without" sh -c "cmp -s '$T/s.ids' '$T/a.ids' && cmp -s '$T/s.bin' '$T/a.bin'"

# a conversation saved and continued: the drafter's rows go with the state (STATE.md 1.2)
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen 10 --ignore-eos --quiet --draft "$T/d.kpk" --draft-width 3 --save-state "$T/c1.st" >/dev/null 2>&1
"$BIN/krun" "$T/m.kpk" --load-state "$T/c1.st" --ids 8,9 --gen 10 --ignore-eos --print-ids --quiet --draft "$T/d.kpk" --draft-width 3 \
    --json "$T/c2.json" --dump-gen-logits "$T/c2.bin" >"$T/c2.ids" 2>"$T/c2.err"
"$BIN/krun" "$T/m.kpk" --load-state "$T/c1.st" --ids 8,9 --gen 10 --ignore-eos --print-ids --quiet --draft off --spec 0 \
    --dump-gen-logits "$T/c0.bin" >"$T/c0.ids" 2>/dev/null
check "a state saved with the drafter, continued with and without it: the same ids and logits" sh -c "cmp -s '$T/c2.ids' '$T/c0.ids' && cmp -s '$T/c2.bin' '$T/c0.bin'"
check "the state file is 1.2 with the drafter's section" "$PY" -c '
import struct, sys; b = open(sys.argv[1], "rb").read(); assert struct.unpack_from("<H", b, 10)[0] == 2 and struct.unpack_from("<I", b, 88)[0] & 2' "$T/c1.st"

# --json, --plan, --draft auto
check "--json: spec.drafter has what it drafted and accepted" "$PY" -c '
import json, sys; s = json.load(open(sys.argv[1]))["spec"]; d = s["drafter"]
assert d["file"].endswith("d.kpk") and d["drafted"] >= d["accepted"] >= 0 and d["verifications"] > 0 and s["max_drafts"] == 8, s' "$T/b.json"
"$BIN/krun" "$T/m.kpk" --draft "$T/d.kpk" --mem 1G --plan >"$T/plan.txt" 2>&1
check "--plan names the drafter and its bytes" grep -q "drafter .*d.kpk: its weights" "$T/plan.txt"
cp "$T/d.kpk" "$T/m.draft.kpk"
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen 8 --quiet --json "$T/auto.json" >/dev/null 2>&1
check "--draft auto (the default) finds MODEL.draft.kpk, and --spec defaults to 8 with it" "$PY" -c '
import json, sys; s = json.load(open(sys.argv[1]))["spec"]; assert s["drafter"]["file"].endswith("m.draft.kpk") and s["max_drafts"] == 8, s' "$T/auto.json"
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen 8 --quiet --draft off --json "$T/off.json" >/dev/null 2>&1
check "--draft off: none, and --spec stays 0" "$PY" -c 'import json, sys; assert json.load(open(sys.argv[1]))["spec"] is None' "$T/off.json"
rm -f "$T/m.draft.kpk"

# ---- the bytes: a drafter that is (almost) never right costs at most 3% (draft.h: width by cost) ------------
# (this random drafter proposes what the model takes about once in 256; streamed, nothing pinned, at the
# minimum budget: every pass reads the trunk, and each draft verified costs its row's experts)
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen 96 --ignore-eos --quiet --draft off --spec 0 --mem "$MIN" --pin 0 --json "$T/by0.json" >/dev/null 2>&1
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen 96 --ignore-eos --quiet --draft "$T/d.kpk" --mem "$MIN" --pin 0 --json "$T/by1.json" >/dev/null 2>&1
check "a drafter that is never right, streamed: at most 1.03x the bytes per generated token of none, and it drafted" "$PY" -c '
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
pa, pb = (x["bytes_read"] / len(x["generated_ids"]) for x in (a, b))
d = b["spec"]["drafter"]
assert d["drafted"] > 0 and d["acceptance"] < 0.2 and pb <= 1.03 * pa, (pa, pb, d)
print(pb / pa, file=sys.stderr)' "$T/by0.json" "$T/by1.json"
if [ -z "$NOT_KRUNS_MEMORY" ]; then
    cg_run "$MIN" "$BIN/krun" "$T/m.kpk" --ids $IDS --gen 24 --ignore-eos --quiet --draft "$T/d.kpk" --mem "$MIN" --json "$T/cg.json" \
        --dump-gen-logits "$T/cg.bin" >/dev/null 2>"$T/cg.err"; rc=$?
    if [ $rc -eq 99 ]; then skip "peak RSS with the drafter: no writable cgroup v1/v2 memory controller here"
    else
        peak=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["peak_rss_bytes"])' "$T/cg.json" 2>/dev/null || echo 0)
        [ $rc -eq 0 ] && [ "$peak" -gt 0 ] && [ "$peak" -le "$MIN" ] \
            && ok "the drafter planned at the minimum budget, under a cgroup limit of it: peak RSS $peak <= $MIN" \
            || notok "the drafter under a cgroup limit of $MIN: exit $rc, peak $peak: $(head -c 300 "$T/cg.err")"
    fi
else
    skip "peak RSS with the drafter: $NOT_KRUNS_MEMORY"
fi

# ---- a drafter for another model, a damaged one, not a drafter: refused, named ------------------------
refused() {
    local code=$1 label=$2 pat=$3; shift 3
    expect_exit "$code" "$label" "$BIN/krun" "$T/m.kpk" --ids $IDS --gen 4 --quiet "$@"
    expect_err "$pat" "...naming it"
}
"$BIN/k3synth" "$T/v512" --single-file --vocab 512 --seed 5 --quiet && "$BIN/k3synth" "$T/dv" --drafter --target "$T/v512" --seed 5 --quiet \
    && "$BIN/kpack" convert "$T/dv" "$T/dv.kpk" --quiet
refused 2 "a drafter for another vocabulary" "a drafter for another model: its hidden size 128 and vocabulary 512" --draft "$T/dv.kpk"
"$BIN/k3synth" "$T/h32" --geometry micro --vocab 256 --seed 5 --quiet && "$BIN/k3synth" "$T/dh" --drafter --target "$T/h32" --seed 5 --quiet \
    && "$BIN/kpack" convert "$T/dh" "$T/dh.kpk" --quiet
refused 2 "a drafter for another width" "a drafter for another model: its hidden size 32" --draft "$T/dh.kpk"
"$BIN/k3synth" "$T/dt" --drafter --target "$T/m" --seed 5 --taps 2,6,13 --quiet && "$PY" - "$T/dt/config.json" <<'PY'
import json, sys; c = json.load(open(sys.argv[1])); c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 6, 14]; json.dump(c, open(sys.argv[1], "w"))
PY
"$BIN/kpack" convert "$T/dt" "$T/dt.kpk" --quiet
refused 2 "a drafter tapping a layer the model does not have" "taps completed layer 14 .*the model has 13 layers" --draft "$T/dt.kpk"
"$BIN/k3synth" "$T/de" --drafter --target "$T/m" --seed 6 --quiet && "$BIN/kpack" convert "$T/de" "$T/de.kpk" --quiet
refused 2 "a drafter whose embedding is another model's" "its token embedding differs from the model's" --draft "$T/de.kpk"
"$PY" "$TOP/tests/cli/flip_drafter.py" "$T/d.kpk" "$T/dmg.kpk"
refused 1 "a damaged drafter (a flipped bit in its weights)" "drafter weights .*checksum" --draft "$T/dmg.kpk"
refused 2 "a model file given as the drafter" "not a drafter" --draft "$T/m.kpk"
refused 2 "a drafter file that does not exist" "no-such.kpk: No such file" --draft "$T/no-such.kpk"

# ---- the drafter's state along every path ---------------------------------------------------------------
if [ -x "$PROBE" ]; then
    "$PROBE" paths "$T/m.kpk" "$T/d.kpk" --spec 6 >"$T/probe.out" 2>&1 && ok "probe_draft paths: $(grep -c '^ok' "$T/probe.out") checks" \
        || notok "probe_draft paths: $(grep -v '^ok' "$T/probe.out" | head -c 400)"
    "$PROBE" paths "$T/m.kpk" "$T/d.kpk" --spec 6 --mem "$MIN" >"$T/probe.out" 2>&1 && ok "probe_draft paths, streaming at the minimum budget" \
        || notok "probe_draft paths, streaming: $(grep -v '^ok' "$T/probe.out" | head -c 400)"
else
    notok "probe_draft not built (make unit)"
fi

finish
