#!/usr/bin/env bash
# Speculative decoding (--spec N): the generated ids, the logits each token
# was chosen from (--dump-gen-logits) and the saved state are bit-identical
# to --spec 0, in place and at a streaming budget, on text that repeats
# (drafts accepted, and rejected: the state rolled back in the middle of a
# block, across KDA layers with ShortConv and MLA layers) and on text that
# does not (then nothing is drafted and nothing more is read or run); the
# plan counts the journal; --spec with --recompute is refused.  The same at
# temperatures 0.7 and 1 with top-k, top-p, min-p and penalties, at three
# budgets, and continued from a saved state: the sampler's draw depends on
# (seed, position) only, so verification picks what plain sampling picks.
# Verification at every place of a block, with drafts chosen to fail there,
# is probe_session spec (here on the tiny model; test_krun_slice.sh at full
# width).
. "$(dirname "$0")/lib.sh"
case ${BUILD:-build} in /*) PROBE="$BUILD/tests/probe_session" ;; *) PROBE="$TOP/${BUILD:-build}/tests/probe_session" ;; esac

"$BIN/k3synth" "$T/m" --geometry tiny --seed 21 --quiet >/dev/null 2>"$T/err" || { notok "k3synth: $(cat "$T/err")"; finish; exit 1; }
"$BIN/kpack" convert "$T/m" "$T/m.kpk" --quiet || { notok "convert"; finish; exit 1; }
# two layers (one KDA, one MLA): its greedy text falls into a repeating run
"$BIN/k3synth" "$T/r" --geometry tiny --layers 2 --seed 1 --quiet >/dev/null && "$BIN/kpack" convert "$T/r" "$T/r.kpk" --quiet \
    || { notok "k3synth/convert of the 2-layer model"; finish; exit 1; }
# streaming: no trunk layer pinned, two expert slots (top-2), the same split with
# and without --spec (at one budget the journal would take expert slots)
STREAM="--mem 1G --pin 0 --expert-slots 2"
"$BIN/krun" "$T/m.kpk" --plan --mem 1G --ctx 128 --spec 8 --json "$T/p.json" >/dev/null

# spec_same LABEL KPK IDS GEN CHECK ARGS...: --spec 8 and --spec 0 give the same
# ids, generated logits and saved state; CHECK (python, on the --spec json j
# and the --spec 0 json j0) must hold
spec_same() {
    local label=$1 kpk=$2 ids=$3 gen=$4 check=$5; shift 5
    "$BIN/krun" "$kpk" --ids "$ids" --gen "$gen" --ignore-eos --print-ids --quiet --dump-gen-logits "$T/a.bin" --json "$T/a.json" \
        --save-state "$T/a.st" "$@" >"$T/a.ids" 2>"$T/a.err" || { notok "$label: --spec 0 run: $(head -c 300 "$T/a.err")"; return; }
    "$BIN/krun" "$kpk" --ids "$ids" --gen "$gen" --ignore-eos --print-ids --quiet --dump-gen-logits "$T/b.bin" --json "$T/b.json" \
        --save-state "$T/b.st" --spec 8 "$@" >"$T/b.ids" 2>"$T/b.err" || { notok "$label: --spec 8 run: $(head -c 300 "$T/b.err")"; return; }
    if cmp -s "$T/a.ids" "$T/b.ids" && cmp -s "$T/a.bin" "$T/b.bin" && cmp -s "$T/a.st" "$T/b.st" && [ -s "$T/a.bin" ]; then
        ok "$label: --spec 8 == --spec 0: ids, every generated token's logits, the saved state"
    else
        notok "$label: --spec 8 differs from --spec 0"
    fi
    python3 - "$T/b.json" "$T/a.json" "$check" <<'PY' && ok "$label: $(cat "$T/why")" || notok "$label: $(cat "$T/why")"
import json, sys
j, j0, check = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
s, d, d0 = j["spec"], j["decode"], j0["decode"]
partial = sum(1 for k, a in s["rounds"] if 0 < a < k)
why = (f'{s["drafted"]} drafted, {s["accepted"]} accepted, {s["rollbacks"]} rolled back ({partial} in the middle of a block); '
       f'{d["sweeps"]} sweeps for {d["tokens"]} tokens (--spec 0: {d0["sweeps"]}); {d["bytes"]} bytes read (--spec 0: {d0["bytes"]})')
open(sys.argv[1].rsplit("/", 1)[0] + "/why", "w").write(why)
assert j["generated_ids"] == j0["generated_ids"] and d["tokens"] == d0["tokens"]
assert sum(k for k, a in s["rounds"]) == s["drafted"] and sum(a for k, a in s["rounds"]) == s["accepted"]
assert s["acceptance"] == (s["accepted"] / s["drafted"] if s["drafted"] else None), s
assert d["sweeps"] == d["tokens"] - s["accepted"]
assert eval(check), check
PY
}

# ---- text that repeats ------------------------------------------------------------
# A run of one token x as the prompt: find an x whose greedy continuation starts
# with x and then leaves it, so a draft of more x is partly accepted (the block
# is rolled back in its middle).
X=""
run_of() { local r=$1; for _ in $(seq 2 24); do r=$r,$1; done; echo "$r"; }
for x in $(seq 0 255); do
    p=$(run_of $x)
    c=$("$BIN/krun" "$T/m.kpk" --ids "$p" --gen 3 --ignore-eos --print-ids --quiet 2>/dev/null)
    set -- $c
    if [ "${1:-}" = "$x" ] && [ "${3:-}" != "$x" ]; then X=$x; break; fi
done
if [ -z "$X" ]; then
    notok "no token of the tiny model continues a run of itself (the search for a repeating prompt failed)"
else
    RUN=$(run_of $X)
    for budget in "" "$STREAM"; do
        spec_same "run of token $X${budget:+, $budget}" "$T/m.kpk" "$RUN" 12 \
            's["accepted"] > 0 and s["drafted"] > s["accepted"] and partial > 0' $budget
    done
fi
# the two-layer model's text settles into a repeating run: long drafts accepted
for budget in "" "$STREAM"; do
    spec_same "2-layer model, repeating text${budget:+, $budget}" "$T/r.kpk" 3,7,11,5,9,100,200,30 60 \
        's["accepted"] >= 20 and d["sweeps"] < d0["sweeps"] and max(k for k, a in s["rounds"]) == 8' $budget
done
# a continued conversation: the pending token of turn one runs before the first verification
"$BIN/krun" "$T/r.kpk" --ids 3,7,11,5,9,100,200,30 --gen 20 --ignore-eos --save-state "$T/t1.st" --quiet >/dev/null
"$BIN/krun" "$T/r.kpk" --load-state "$T/t1.st" --gen 30 --ignore-eos --print-ids --quiet --spec 6 --save-state "$T/c6.st" >"$T/c6" \
    && "$BIN/krun" "$T/r.kpk" --load-state "$T/t1.st" --gen 30 --ignore-eos --print-ids --quiet --save-state "$T/c0.st" >"$T/c0" \
    && cmp -s "$T/c6" "$T/c0" && cmp -s "$T/c6.st" "$T/c0.st" \
    && ok "after --load-state, --spec 6 == --spec 0 (ids and saved state)" || notok "--load-state with --spec"
# a verification block larger than a prefill chunk
spec_same "2-layer model, --chunk 2 (blocks of 9 positions)" "$T/r.kpk" 3,7,11,5,9,100,200,30 40 's["accepted"] > 0' --chunk 2

# ---- at a temperature: the sampler's own pick at each verified position ---------------------
# The sampler's draw for a position depends on (seed, position) only (run/session/sampler.h), so
# a draft stands exactly when plain sampling would pick it there: --spec 8 == --spec 0 bit for
# bit at every temperature, filter and penalty.  A model with a peaked next-token distribution
# (--logit-gain 4, as a trained model's) and a prompt in its repeating run: sampled text that
# repeats, with departures that reject drafts in the middle of a block.
"$BIN/k3synth" "$T/g" --geometry tiny --layers 2 --seed 1 --logit-gain 4 --quiet >/dev/null && "$BIN/kpack" convert "$T/g" "$T/g.kpk" --quiet \
    || { notok "k3synth/convert of the peaked model"; finish; exit 1; }
LOOP=3,7,11,5,9,100,200,30,179,166,117,149,152,36,47,52,136,110,64,245,185,229,17,105,105,105,105,105
MID="--mem 1G --pin 1 --expert-slots 3"
for budget in "" "$MID" "$STREAM"; do
    spec_same "temp 0.7, seed 3${budget:+, $budget}" "$T/g.kpk" $LOOP 60 \
        's["accepted"] > 0 and partial > 0 and d["sweeps"] < d0["sweeps"]' --temp 0.7 --seed 3 $budget
done
spec_same "temp 1, seed 3" "$T/g.kpk" $LOOP 60 's["accepted"] > 0 and s["rollbacks"] > 1' --temp 1 --seed 3
spec_same "temp 0.9, top-k 40, min-p 0.02, seed 2" "$T/g.kpk" $LOOP 60 's["accepted"] > 0 and partial > 0' \
    --temp 0.9 --top-k 40 --min-p 0.02 --seed 2
for budget in "" "$STREAM"; do
    spec_same "temp 1, top-p 0.9, seed 3${budget:+, $budget}" "$T/g.kpk" $LOOP 60 's["accepted"] >= 20' --temp 1 --top-p 0.9 --seed 3 $budget
done
spec_same "temp 0.7, presence 0.2, frequency 0.05, repetition 1.05, seed 3" "$T/g.kpk" $LOOP 60 's["accepted"] > 0 and partial > 0' \
    --temp 0.7 --presence-penalty 0.2 --frequency-penalty 0.05 --repetition-penalty 1.05 --seed 3
# a sampled conversation continued from a saved state, with and without --spec
"$BIN/krun" "$T/g.kpk" --ids $LOOP --gen 10 --ignore-eos --temp 0.7 --seed 3 --save-state "$T/g1.st" --quiet >/dev/null
"$BIN/krun" "$T/g.kpk" --load-state "$T/g1.st" --gen 30 --ignore-eos --temp 0.7 --print-ids --quiet --spec 6 --save-state "$T/g6.st" \
    --json "$T/g6.json" >"$T/g6" \
    && "$BIN/krun" "$T/g.kpk" --load-state "$T/g1.st" --gen 30 --ignore-eos --temp 0.7 --print-ids --quiet --save-state "$T/g0.st" >"$T/g0" \
    && cmp -s "$T/g6" "$T/g0" && cmp -s "$T/g6.st" "$T/g0.st" \
    && python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["spec"]["accepted"] > 0' "$T/g6.json" \
    && ok "temp 0.7 after --load-state (the saved seed): --spec 6 == --spec 0 (ids and saved state), drafts accepted" \
    || notok "--load-state with --spec at a temperature"

# ---- text that does not repeat ----------------------------------------------------
# nothing is drafted, so nothing more is run or read than without --spec
for budget in "" "$STREAM"; do
    spec_same "no repetition${budget:+, $budget}" "$T/m.kpk" 3,7,11,5,9,100,200,30 40 \
        's["drafted"] == 0 and d["sweeps"] == d0["sweeps"] and d["bytes"] == d0["bytes"]' $budget
    spec_same "no repetition, temp 1${budget:+, $budget}" "$T/m.kpk" 3,7,11,5,9,100,200,30 40 \
        's["drafted"] == 0 and d["sweeps"] == d0["sweeps"] and d["bytes"] == d0["bytes"]' --temp 1 --seed 4 $budget
done

# ---- the plan and the refusals ------------------------------------------------------
"$BIN/krun" "$T/m.kpk" --plan --mem 1G --ctx 128 --json "$T/p0.json" >/dev/null
"$BIN/krun" "$T/m.kpk" --plan --mem 1G --ctx 128 --spec 8 >"$T/p8.out"
python3 - "$T/p0.json" "$T/p.json" <<'PY' && ok "--plan --spec 8: the journal is part of the scratch and of the minimum budget" || notok "plan with --spec"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["spec"] == 0 and a["spec_journal_bytes"] == 0 and b["spec"] == 8 and b["spec_journal_bytes"] > 0, (a, b)
assert b["scratch_bytes"] - a["scratch_bytes"] == b["spec_journal_bytes"], (a["scratch_bytes"], b["scratch_bytes"], b["spec_journal_bytes"])
assert b["minimum_bytes"] - a["minimum_bytes"] == b["spec_journal_bytes"]
PY
grep -q "spec 8 journal" "$T/p8.out" && ok "the plan names the journal" || notok "plan output: $(cat "$T/p8.out")"
expect_exit 2 "--spec with --recompute is refused" "$BIN/krun" "$T/m.kpk" --ids 1,2,3 --gen 4 --spec 4 --recompute --quiet
expect_exit 2 "--spec 65 is refused" "$BIN/krun" "$T/m.kpk" --ids 1,2,3 --gen 4 --spec 65 --quiet
"$BIN/krun" "$T/m.kpk" --ids "${RUN:-1,2,3}" --gen 12 --ignore-eos --spec 4 >/dev/null 2>"$T/st.err"
grep -qE -- "--spec 4: [0-9]+ drafted, [0-9]+ accepted .* sweeps for [0-9]+ tokens" "$T/st.err" \
    && ok "the statistics line on stderr" || notok "statistics line: $(cat "$T/st.err")"

# ---- the session API: a wrong draft at every place of a block ------------------------
if [ -x "$PROBE" ]; then
    "$PROBE" spec "$T/m.kpk"
    min=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["minimum_bytes"])' "$T/p.json")
    "$PROBE" spec "$T/m.kpk" --mem "$min" --spec 3
    "$PROBE" spec "$T/m.kpk" --temp 0.7 --top-p 0.9 --seed 3 --quick
    "$PROBE" spec "$T/m.kpk" --mem "$min" --spec 3 --temp 1 --top-k 20 --min-p 0.05 --penalties --mask --seed 9 --quick
    for c in memory allocs batch; do "$PROBE" $c "$T/m.kpk" --spec 5 | sed 's/^\(not ok\|ok\|skip\) - /&--spec 5: /'; done
else
    notok "the session probe $PROBE is missing (make unit)"
fi
finish
