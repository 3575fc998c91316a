#!/usr/bin/env bash
# Streaming at full K3 widths: a small slice checkpoint (hidden 7168, 96 heads,
# real 17.5 MB MXFP4 experts; 2 layers, 8 experts, ~2.4 GB) run at four
# budgets and three I/O modes gives the same bits, and stays under a cgroup
# memory limit at the smallest budget; speculative decoding at full width;
# over several ranks (mpirun on this machine: experts on the other ranks, a
# layer on another).
. "$(dirname "$0")/lib.sh"

avail=$(df -Pk "$T" | awk 'NR==2 {print $4}')
if [ "${avail:-0}" -lt $((8 * 1024 * 1024)) ]; then
    skip "full-width slice streaming: less than 8 GB free in $T"
    finish; exit 0
fi
"$BIN/k3synth" "$T/sl" --geometry slice --layers 2 --experts 8 --topk 2 --vocab 512 --first-dense 0 --seed 5 --quiet >/dev/null 2>"$T/err" \
    || { notok "k3synth slice: $(cat "$T/err")"; finish; exit 1; }
"$BIN/kpack" convert "$T/sl" "$T/sl.kpk" --quiet || { notok "convert slice"; finish; exit 1; }
rm -rf "$T/sl"
IDS=11,400,23,7,300
GEN=3
"$BIN/krun" "$T/sl.kpk" --ids $IDS --gen $GEN --dump-all-logits "$T/ref.bin" --json "$T/ref.json" --quiet >/dev/null \
    || { notok "krun on the slice"; finish; exit 1; }
"$BIN/krun" "$T/sl.kpk" --ids $IDS --gen $GEN --dump-all-logits "$T/x.bin" --mem 4096 --quiet 2>"$T/x.err"
minrun=$(sed -n 's/.*the minimum .* (\([0-9]*\) bytes)$/\1/p' "$T/x.err")
[ -n "$minrun" ] || { notok "no minimum in: $(cat "$T/x.err")"; finish; exit 1; }

same() { same_bits "$T/sl.kpk" "slice: $1" "${@:2}"; }
same "--mem $minrun (the minimum)" --mem $minrun
same "--mem 3G --pin 0 --expert-slots 2 --io direct" --mem 3G --pin 0 --expert-slots 2 --io direct
same "--mem 3G --pin 0 --expert-slots 3 --io pread --cache lfu" --mem 3G --pin 0 --expert-slots 3 --io pread --cache lfu
same "--mem 3G --pin 1 --expert-slots 5 --io mmap" --mem 3G --pin 1 --expert-slots 5 --io mmap
same "--mem 8G (all pinned, all experts cached)" --mem 8G
# Small pieces: every matrix larger than 4 MB (q/k/v/g/o_proj 176 MB, the shared
# expert, the MoE projections, lm_head) streams in row blocks, o_proj (stored
# before the tensors used first) is held in pieces while they are used.
same "--pin 0 --head stream --piece 4M (row blocks of every large tensor and lm_head, o_proj held)" --mem 3G --pin 0 --head stream --piece 4M --expert-slots 2
same "--pin 0 --piece 48M --io pread --verify always" --mem 3G --pin 0 --piece 48M --expert-slots 2 --io pread --verify always
"$BIN/krun" "$T/sl.kpk" --plan --mem 3G --pin 0 --head stream --piece 4M --expert-slots 2 --ctx 16 --json "$T/p4.json" >/dev/null
python3 - "$T/p4.json" <<'PY' && ok "slice --piece 4M: lm_head streams in pieces, hundreds of pieces per step, more than 2 slots (held pieces)" || notok "slice --piece 4M plan"
import json, sys
p = json.load(open(sys.argv[1]))
assert p["head_streamed"] and p["ring_pieces"] > 500 and p["ring_slots"] > 40, p
PY
python3 - "$T/x.json" <<'PY' && ok "slice: bytes per step match the plan" || notok "slice: bytes per step"
import json, sys
j = json.load(open(sys.argv[1])); p = j["plan"]
for s in j["steps"]:
    assert s["bytes_trunk"] == p["trunk_stream_bytes_per_token"] and s["bytes_experts"] == s["expert_misses"] * p["expert_slot_bytes"]
PY

# planned bytes == allocated bytes at full width, at several ctx / chunk / max_seqs
case ${BUILD:-build} in /*) PROBE="$BUILD/tests/probe_session" ;; *) PROBE="$TOP/${BUILD:-build}/tests/probe_session" ;; esac
tag() { sed -e "s/^ok - /ok - $1: /" -e "s/^not ok - /not ok - $1: /" -e "s/^skip - /skip - $1: /"; }
if [ -x "$PROBE" ]; then
    "$PROBE" memory "$T/sl.kpk" | tag slice
    "$PROBE" memory "$T/sl.kpk" --mem 3G | tag "slice --mem 3G"
else
    notok "the session probe $PROBE is missing (make unit)"
fi

# speculative decoding at full width (docs/RUNTIME.md §7): verification blocks
# with a wrong draft in the middle, and with none, == plain decoding (ids,
# logits, the saved state), in place (greedy) and streaming at the minimum
# budget (sampling at temperature 0.8, top-p 0.95)
if [ -x "$PROBE" ]; then
    specmin=$("$BIN/krun" "$T/sl.kpk" --plan --mem 8G --ctx 64 --chunk 3 --spec 3 --json "$T/ps.json" >/dev/null && \
              python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["minimum_bytes"])' "$T/ps.json")
    "$PROBE" spec "$T/sl.kpk" --spec 3 --quick | tag "slice"
    "$PROBE" spec "$T/sl.kpk" --spec 3 --quick --mem "$specmin" --temp 0.8 --top-p 0.95 --seed 5 | tag "slice streaming"
fi
# and through the CLI on text that does not repeat: nothing drafted, the same
# bytes read and the same sweeps as without --spec (the same split)
for sp in 0 4; do
    "$BIN/krun" "$T/sl.kpk" --ids $IDS --gen 6 --mem 3G --pin 0 --expert-slots 2 --spec $sp --ignore-eos --print-ids --quiet \
        --dump-gen-logits "$T/g$sp.bin" --json "$T/g$sp.json" >"$T/g$sp.ids" 2>"$T/g$sp.err"
done
cmp -s "$T/g0.ids" "$T/g4.ids" && cmp -s "$T/g0.bin" "$T/g4.bin" && python3 - "$T/g0.json" "$T/g4.json" <<'PY' \
    && ok "slice, streaming: --spec 4 on text without repetition == --spec 0 (ids, logits), nothing drafted, the same sweeps and bytes" \
    || notok "slice --spec 4 without repetition: $(head -c 300 "$T/g4.err")"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert b["spec"]["drafted"] == 0 and a["decode"]["sweeps"] == b["decode"]["sweeps"] == 5, (a["decode"], b["decode"])
assert a["decode"]["bytes"] == b["decode"]["bytes"] > 0, (a["decode"], b["decode"])
PY

# the smallest budget under a real memory cgroup (v1 or v2), swap off
limit=$minrun
d=""
if [ -d /sys/fs/cgroup/memory ] && [ -w /sys/fs/cgroup/memory ]; then
    d=/sys/fs/cgroup/memory/kpk-slice-$$
    mkdir "$d" && echo $limit > "$d/memory.limit_in_bytes" && echo 0 > "$d/memory.swappiness" || d=""
elif [ -e /sys/fs/cgroup/cgroup.controllers ] && [ -w /sys/fs/cgroup ]; then
    d=/sys/fs/cgroup/kpk-slice-$$
    mkdir "$d" && echo $limit > "$d/memory.max" && { echo 0 > "$d/memory.swap.max" 2>/dev/null; true; } || d=""
fi
if [ -n "$NOT_KRUNS_MEMORY" ]; then
    [ -n "$d" ] && rmdir "$d"
    skip "slice cgroup limit: $NOT_KRUNS_MEMORY"
elif [ -n "$d" ]; then
    (echo $BASHPID > "$d/cgroup.procs" && exec "$BIN/krun" "$T/sl.kpk" --ids $IDS --gen $GEN --mem $limit --dump-all-logits "$T/cg.bin" --json "$T/cg.json" --quiet) >/dev/null 2>"$T/cg.err"
    rc=$?
    rmdir "$d" 2>/dev/null
    peak=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["peak_rss_bytes"])' "$T/cg.json" 2>/dev/null || echo 0)
    [ $rc -eq 0 ] && [ "$peak" -gt 0 ] && [ "$peak" -le $limit ] && cmp -s "$T/ref.bin" "$T/cg.bin" \
        && ok "slice under a cgroup limit of $limit bytes: peak RSS $peak, identical logits" \
        || notok "slice cgroup: rc $rc peak $peak limit $limit: $(head -c 300 "$T/cg.err")"
else
    skip "slice cgroup limit: no writable memory cgroup"
fi

# Several machines at full width (the rest is test_krun_cluster.sh): mpirun on this machine, the
# experts computed by the other ranks, layer 1 on rank 1 (--stages 1,1), streaming budgets
# (MPI: tests/cli/lib.sh)
if ! command -v mpirun >/dev/null; then
    skip "slice over several ranks: no mpirun here (tests/deps.sh installs openmpi-bin and libopenmpi-dev)"
elif "${MPI[@]}" -np 2 "$BIN/krun" "$T/sl.kpk" --ids 5 --gen 1 --quiet 2>&1 | grep -q 'built without MPI'; then
    skip "slice over several ranks: this krun was built without MPI"
else
    for v in "2|--mem 3G --pin 0 --expert-slots 2" "3|--mem 4G --stages 1,1,0 --threads 1"; do
        KRUN_CLUSTER_TIMEOUT=60 "${MPI[@]}" -np "${v%%|*}" "$BIN/krun" "$T/sl.kpk" --ids $IDS --gen $GEN --dump-all-logits "$T/x.bin" \
            --json "$T/x.json" --quiet ${v#*|} >/dev/null 2>"$T/x.err"
        cmp -s "$T/ref.bin" "$T/x.bin" && python3 - "$T/ref.json" "$T/x.json" <<'PY' \
            && ok "slice over ${v%%|*} ranks (${v#*|}): identical ids and logits bits, experts computed on the other ranks" \
            || notok "slice over ${v%%|*} ranks (${v#*|}): $(head -c 300 "$T/x.err")"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["generated_ids"] == b["generated_ids"]
assert sum(r["experts_served"] for r in b["cluster"]["per_rank"][1:]) > 0, b["cluster"]
PY
    done
fi
finish
