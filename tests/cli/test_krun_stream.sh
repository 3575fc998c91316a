#!/usr/bin/env bash
# krun within a memory budget: the same bits at every budget, --io mode and
# cache policy; reads per step equal the planner's compulsory reads; peak RSS
# below the budget under a real cgroup memory limit; corruption caught on the
# first read of an extent.
. "$(dirname "$0")/lib.sh"

"$BIN/k3synth" "$T/m" --geometry tiny --seed 31 --shards 2 --quiet >/dev/null 2>"$T/err" || { notok "k3synth: $(cat "$T/err")"; finish; exit 1; }
"$BIN/kpack" convert "$T/m" "$T/m.kpk" --quiet || { notok "convert"; finish; exit 1; }
IDS=3,7,11,5,9,100,200,30
GEN=8

# The reference: no budget, everything in place from the mapping.
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen $GEN --dump-all-logits "$T/ref.bin" --json "$T/ref.json" --quiet >/dev/null

# The smallest budget the planner accepts, and what it says below it.
"$BIN/krun" "$T/m.kpk" --plan --mem 1G --ctx 16 --json "$T/plan.json" >/dev/null || notok "--plan"
min=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["minimum_bytes"])' "$T/plan.json")
expect_exit 2 "a budget below the minimum is refused" "$BIN/krun" "$T/m.kpk" --ids $IDS --gen $GEN --mem $((min - 4096)) --quiet
expect_err "the minimum for this model with --ctx 16 is .*\($min bytes\)" "the refusal names the minimum ($min bytes)"
expect_exit 0 "--plan at the minimum prints the plan" "$BIN/krun" "$T/m.kpk" --plan --mem $min --ctx 16
grep -q "trunk ring" "$T/last.out" && grep -q "expert cache" "$T/last.out" && ok "the plan lists ring, cache, state, scratch" || notok "plan output"
expect_exit 2 "--pin without a budget is a usage error" "$BIN/krun" "$T/m.kpk" --ids 1 --pin 2

same() { same_bits "$T/m.kpk" "$@"; }
# Four budgets, from the minimum (nothing pinned, top-k expert slots) to
# everything resident, each with the three I/O modes.  The minimum of these
# runs (which also hold every prompt position's logits) is read from the
# planner's own refusal.
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen $GEN --dump-all-logits "$T/x.bin" --mem 4096 --quiet 2>"$T/x.err"
minrun=$(sed -n 's/.*the minimum .* (\([0-9]*\) bytes)$/\1/p' "$T/x.err")
[ -n "$minrun" ] || { notok "no minimum in: $(cat "$T/x.err")"; minrun=$min; }
for mem in $minrun $((minrun + 300000)) $((minrun * 2)) 1G; do
    for io in direct pread mmap; do same "--mem $mem --io $io" --mem $mem --io $io; done
done
# Forced streaming shapes, both cache policies
same "--pin 0 --expert-slots 1 (one expert at a time)" --mem 1G --pin 0 --expert-slots 1
same "--pin 5 --expert-slots 3 --cache lfu" --mem 1G --pin 5 --expert-slots 3 --cache lfu
same "--pin 12 --expert-slots 2 --io-threads 1" --mem 1G --pin 12 --expert-slots 2 --io-threads 1
same "--pin 3 --verify always --chunk 3" --mem 1G --pin 3 --expert-slots 4 --verify always --chunk 3
# Pieces: every matrix and lm_head in row blocks of at most 4 KB, o_proj held
# in pieces while the tensors stored after it are used first, in every --io mode
for io in direct pread mmap; do
    same "--pin 0 --head stream --piece 4K --io $io" --mem 1G --pin 0 --head stream --piece 4K --expert-slots 2 --io $io
done
same "--pin 6 --head stream --piece 8K --chunk 3 --verify always" --mem 1G --pin 6 --head stream --piece 8K --chunk 3 --verify always
"$BIN/krun" "$T/m.kpk" --plan --mem 1G --pin 0 --head stream --piece 4K --ctx 16 --json "$T/p4.json" >/dev/null
python3 - "$T/p4.json" <<'PY' && ok "--piece 4K: lm_head streams, hundreds of pieces per step, more than 2 slots (held pieces)" || notok "--piece 4K plan"
import json, sys
p = json.load(open(sys.argv[1]))
assert p["head_streamed"] and p["ring_pieces"] > 500 and p["ring_slots"] > 2 and p["piece_bytes"] == 4096, p
PY
expect_exit 2 "--head stream without a budget is a usage error" "$BIN/krun" "$T/m.kpk" --ids 1 --head stream
expect_exit 2 "--piece with a bad size is a usage error" "$BIN/krun" "$T/m.kpk" --ids 1 --mem 1G --piece 12Q

# The prediction (run/engine/predict.h) reads a layer's likely experts early: it
# changes which bytes are read when, never the bits.  Forced on with the
# router streaming (read from the file for the guess), in every --io mode, on
# a compressed copy; and off (the default) said explicitly.
for io in direct pread mmap; do
    same "--predict on --pin 0 --expert-slots 2 --io $io" --mem $((minrun + 300000)) --pin 0 --expert-slots 2 --predict on --io $io
done
"$BIN/kpack" convert "$T/m.kpk" "$T/mz.kpk" --compress all --quiet || notok "convert --compress all"
same_bits "$T/mz.kpk" "--predict on --pin 0, compressed blocks" --mem 1G --pin 0 --expert-slots 3 --predict on
same "--predict off" --mem 1G --pin 4 --expert-slots 5 --predict off
expect_exit 2 "--predict on without a budget is a usage error" "$BIN/krun" "$T/m.kpk" --ids 1 --predict on
expect_exit 2 "--predict maybe is a usage error" "$BIN/krun" "$T/m.kpk" --ids 1 --mem 1G --predict maybe

# Reads per decoding step equal the planner's compulsory reads: every
# unpinned trunk extent, plus one expert extent per cache miss; with the
# prediction, a predicted read replaces the miss it was for, and a wrong
# guess is one read more.  Without it, exactly one read per miss.
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen $GEN --mem 1G --pin 4 --expert-slots 5 --predict on --json "$T/s.json" --trace "$T/trace.tsv" --quiet >/dev/null
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen $GEN --mem 1G --pin 4 --expert-slots 5 --json "$T/s0.json" --quiet >/dev/null
python3 - "$T/s.json" "$T/s0.json" <<'PY' && ok "bytes per step = unpinned trunk + (misses - predicted used + predicted) x expert extent - predicted reads cancelled; --predict off: misses x extent" || notok "bytes per step differ from the plan"
import json, sys
for f, predict in ((sys.argv[1], True), (sys.argv[2], False)):
    j = json.load(open(f)); p = j["plan"]
    assert j["steps"], "no steps"
    assert p["predict"] == predict, p
    for s in j["steps"]:
        assert s["bytes_trunk"] == p["trunk_stream_bytes_per_token"], (s, p["trunk_stream_bytes_per_token"])
        reads = s["expert_misses"] - s["experts_predicted_used"] + s["experts_predicted"]
        assert s["bytes_experts"] == reads * p["expert_slot_bytes"] - s["bytes_cancelled"], s
        assert s["bytes_experts"] <= p["expert_read_bytes_per_token_max"], (s, p)
        assert s["expert_hits"] + s["expert_misses"] > 0
        assert predict or s["experts_predicted"] == 0 and s["bytes_router"] == 0 and s["bytes_cancelled"] == 0, s
    if predict:  # decoding steps guess, most guesses are used (the tiny model: > 60%)
        used, made = sum(s["experts_predicted_used"] for s in j["steps"]), sum(s["experts_predicted"] for s in j["steps"])
        assert made > 0 and used > 0.6 * made, (used, made)
PY
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen 3 --mem 1G --pin 0 --predict on --json "$T/s1.json" --quiet >/dev/null
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert all(s["bytes_router"] > 0 for s in j["steps"]), j["steps"]' "$T/s1.json" \
    && ok "--pin 0: the prediction reads each streamed router for its guess (bytes_router, not in the step's bytes)" || notok "bytes_router"
python3 - "$T/trace.tsv" "$T/s.json" <<'PY' && ok "--trace records every streamed read (member, offset, length, start, end)" || notok "--trace"
import json, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().splitlines()[1:]]
j = json.load(open(sys.argv[2]))
assert rows and all(len(r) == 6 and float(r[5]) >= float(r[4]) for r in rows)
# the last read-ahead (the first pieces of a step that never runs) is read but not used
extra = sum(int(r[3]) for r in rows if r[0] in "THEP") - (j["bytes_trunk"] + j["bytes_head"] + j["bytes_experts"])
assert 0 <= extra <= j["plan"]["ring_slots"] * j["plan"]["ring_slot_bytes"], extra
PY
# An output the user asked for that cannot be written is a failed run.
rc=0; "$BIN/krun" "$T/m.kpk" --ids $IDS --gen 1 --mem 1G --pin 4 --trace "$T/no/such/dir/t.tsv" --quiet >/dev/null 2>"$T/tr.err" || rc=$?
[ "$rc" = 2 ] && grep -q "cannot write $T/no/such/dir/t.tsv" "$T/tr.err" && ok "--trace to an unwritable path: named, exit 2" || notok "--trace unwritable: rc=$rc $(cat "$T/tr.err")"
# A cache big enough for everything: later steps hit experts loaded earlier.
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen $GEN --mem 1G --pin 13 --json "$T/h.json" --quiet >/dev/null
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["expert_hits"] > 0 and j["steps"][-1]["resident_hit_rate"] > 0 and j["bytes_trunk"] == 0' "$T/h.json" \
    && ok "with every layer pinned and a large cache: no trunk reads, resident expert hits reported" || notok "hit rate"

# Peak RSS stays under the budget, enforced by a cgroup memory limit (swap off).
[ -n "$NOT_KRUNS_MEMORY" ] && skip "peak RSS under a cgroup limit: $NOT_KRUNS_MEMORY"
for mem in $( [ -z "$NOT_KRUNS_MEMORY" ] && echo $minrun $((minrun * 2)) ); do
    cg_run $mem "$BIN/krun" "$T/m.kpk" --ids $IDS --gen $GEN --mem $mem --json "$T/cg.json" --dump-all-logits "$T/cg.bin" --quiet >/dev/null 2>"$T/cg.err"
    rc=$?
    if [ $rc -eq 99 ]; then skip "cgroup memory limit: no writable cgroup v1/v2 memory controller here"; break; fi
    peak=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["peak_rss_bytes"])' "$T/cg.json" 2>/dev/null || echo 0)
    if [ $rc -eq 0 ] && [ "$peak" -gt 0 ] && [ "$peak" -le $mem ] && cmp -s "$T/ref.bin" "$T/cg.bin"; then
        ok "under a cgroup limit of $mem bytes: completes, peak RSS $peak <= budget, identical logits"
    else
        notok "cgroup limit $mem: rc $rc, peak $peak: $(head -c 300 "$T/cg.err")"
    fi
done

# A warm page cache must not push RSS past the budget (issue 12.4): a model
# whose embedding and lm_head (32 MB each) dominate, its file read into the
# page cache just before each run, at the smallest budget, in every I/O mode.
# (Before: the globals were hashed through the file mapping, 78 MB peak at a
# 56.6 MB budget.)
"$BIN/k3synth" "$T/wv" --geometry tiny --seed 3 --vocab 131072 --quiet >/dev/null 2>"$T/err" && "$BIN/kpack" convert "$T/wv" "$T/wv.kpk" --quiet \
    || notok "k3synth/convert the wide-vocabulary model: $(cat "$T/err")"
rm -rf "$T/wv"
"$BIN/krun" "$T/wv.kpk" --ids $IDS --gen 4 --dump-all-logits "$T/wref.bin" --quiet >/dev/null
"$BIN/krun" "$T/wv.kpk" --ids $IDS --gen 4 --dump-all-logits "$T/x.bin" --mem 4096 --quiet 2>"$T/x.err"
wmin=$(sed -n 's/.*the minimum .* (\([0-9]*\) bytes)$/\1/p' "$T/x.err")
[ -n "$wmin" ] || notok "no minimum in: $(cat "$T/x.err")"
for io in direct pread mmap; do
    [ -n "$NOT_KRUNS_MEMORY" ] && { skip "warm page cache RSS ($io): $NOT_KRUNS_MEMORY"; continue; }
    cat "$T/wv.kpk" >/dev/null
    cg_run $wmin "$BIN/krun" "$T/wv.kpk" --ids $IDS --gen 4 --mem $wmin --io $io --json "$T/w.json" --dump-all-logits "$T/w.bin" --quiet >/dev/null 2>"$T/w.err"
    rc=$?
    if [ $rc -eq 99 ]; then
        # no cgroup here: the run's own peak RSS still has to stay under the budget
        "$BIN/krun" "$T/wv.kpk" --ids $IDS --gen 4 --mem $wmin --io $io --json "$T/w.json" --dump-all-logits "$T/w.bin" --quiet >/dev/null 2>"$T/w.err"
        rc=$?
    fi
    peak=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["peak_rss_bytes"])' "$T/w.json" 2>/dev/null || echo 0)
    [ $rc -eq 0 ] && [ "$peak" -gt 0 ] && [ "$peak" -le $wmin ] && cmp -s "$T/wref.bin" "$T/w.bin" \
        && ok "warm page cache, --io $io, budget $wmin: peak RSS $peak <= budget, identical logits" \
        || notok "warm page cache, --io $io: rc $rc, peak $peak, budget $wmin: $(head -c 300 "$T/w.err")"
done

# A corrupted expert extent: detected the first time it is read, the run
# stops with the extent named and prints no token computed from it.
python3 - "$T/m.kpk" "$T/bad.kpk" "$T/ref.json" <<'PY'
import json, struct, sys
d = bytearray(open(sys.argv[1], "rb").read())
ext_off, ext_n = struct.unpack_from("<QQ", d, 56)
# corrupt every expert of the last layer but two: some step must route to one
for i in range(ext_n):
    kind, codec, member, layer, expert = struct.unpack_from("<BBHII", d, ext_off + 64 * i)
    off, stored = struct.unpack_from("<QQ", d, ext_off + 64 * i + 16)
    if kind == 4 and layer == 12 and expert >= 2:
        d[off + stored // 2] ^= 0x01
open(sys.argv[2], "wb").write(d)
PY
"$BIN/krun" "$T/bad.kpk" --ids $IDS --gen $GEN --mem 1G --pin 2 --expert-slots 4 --print-ids --quiet >"$T/bad.out" 2>"$T/bad.err"
rc=$?
[ $rc -eq 1 ] && grep -qE "layer 12 expert [0-9]+ .*checksum mismatch" "$T/bad.err" && ok "corrupted expert: exit 1, extent named" \
    || notok "corrupted expert: rc $rc: $(cat "$T/bad.err")"
python3 - "$T/bad.out" "$T/ref.json" <<'PY' && ok "no token computed from the corrupt extent was printed" || notok "tokens after corruption"
import json, sys
got = open(sys.argv[1]).read().split()
want = json.load(open(sys.argv[2]))["generated_ids"]
assert len(got) < len(want) and [int(x) for x in got] == want[:len(got)], (got, want)
PY
finish
