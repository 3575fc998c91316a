#!/usr/bin/env bash
# The full-scale projection of krun batch on HDDs (README "Batch jobs", docs/BATCH.md): tokens per
# hour for a batch of B sequences per sweep against the same requests one by one, at the laptop
# and desktop presets, from the planner's bytes (krun --plan on the sparse full-size virtual K3,
# or the real model) divided by the drive speed: 262 MB/s per HDD (the HDD model, README
# "Streaming from disk"), 3.99x that for 4 drives (measured there).  Reading only: compute and the
# prompts' sweeps are not counted.
#
# Per sweep (run/session/sweep_model.c): the streamed trunk + lm_head once, plus every routed
# expert's bytes x (1 - (1 - k/N)^B) x the share the expert cache does not hold.  A B whose
# sequences' state does not fit the budget in RAM is planned with the states paged to disk
# (--state-dir: a window of layers in RAM), and the plan's state bytes read and written per sweep
# (at the last position of CTX: the most) are added to the sweep's bytes.
#
# usage: tests/bench/batch_hdd_table.sh MODEL.kpk [CTX]   (CTX: positions per sequence, 4096)
# Env:   BATCH_SIZES ("1 16 64 128 256"), PRESETS ("laptop desktop"), HDD_MBPS (262), BIN (bin)
set -eu
K=$1; CTX=${2:-4096}
BIN=${BIN:-bin}
SIZES=${BATCH_SIZES:-1 16 64 128 256}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
plan() { "$BIN/krun" "$K" --plan --preset "$1" --max-seqs "$2" --ctx "$CTX" --json "$3" >/dev/null 2>&1; }
# the paged plan (a plan only: the state directory is never created)
plan_paged() { "$BIN/krun" "$K" --plan --preset "$1" --max-seqs "$2" --ctx "$CTX" --state-dir "$T/states" --json "$3" >/dev/null 2>&1; }
for p in ${PRESETS:-laptop desktop}; do
    # the largest B whose state fits (bisection; 1 must fit)
    plan "$p" 1 "$T/$p-1.json" || { echo "krun --plan --preset $p --ctx $CTX: no plan for one sequence" >&2; exit 1; }
    lo=1; hi=1024
    while [ $((hi - lo)) -gt 1 ]; do
        mid=$(((lo + hi) / 2))
        if plan "$p" "$mid" "$T/x.json"; then lo=$mid; else hi=$mid; fi
    done
    plan "$p" "$lo" "$T/$p-fit.json"
    echo "$lo" >"$T/$p-fit"
    for b in $SIZES; do
        plan "$p" "$b" "$T/$p-$b.json" || { rm -f "$T/$p-$b.json"; plan_paged "$p" "$b" "$T/$p-$b-paged.json" || rm -f "$T/$p-$b-paged.json"; }
    done
done
python3 - "$T" "$CTX" "${HDD_MBPS:-262}" "${PRESETS:-laptop desktop}" $SIZES <<'PY'
import json, os, sys
t, ctx, mbps, presets, sizes = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4].split(), [int(x) for x in sys.argv[5:]]
def sweep(p, B):
    c = p["cost_model"]
    n = c["moe_layers"] * c["n_experts"]
    cached = min(1.0, p["expert_slots"] / n) if n else 0.0
    return (p["trunk_stream_bytes_per_token"] + p["head_stream_bytes_per_token"] +
            n * p["expert_slot_bytes"] * (1 - (1 - c["topk"] / c["n_experts"]) ** B) * (1 - cached))
def th(bpt, drives):
    return mbps * 1e6 * (1 if drives == 1 else 3.99) * 3600 / bpt
def paging(p):
    return p.get("state_read_bytes_per_sweep", 0) + p.get("state_write_bytes_per_sweep", 0) if p.get("states_paged") else 0
print("| preset (--ctx %d) | B | plan | TB per sweep (weights + states) | state paging share | GB per generated token | vs one by one | tokens/hour, 1 HDD | tokens/hour, 4 HDDs |" % ctx)
print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
for pr in presets:
    fit = int(open("%s/%s-fit" % (t, pr)).read())
    one = None
    for B in sorted(set(sizes + [fit])):
        f = "%s/%s-%d.json" % (t, pr, B)
        if B == fit: f = "%s/%s-fit.json" % (t, pr)
        paged = "%s/%s-%d-paged.json" % (t, pr, B)
        if os.path.exists(f):
            p, how = json.load(open(f)), "in RAM%s" % (" (the most that fit)" if B == fit and B not in sizes else "")
        elif os.path.exists(paged):
            p = json.load(open(paged))
            how = "states paged (window %.2f GB)" % (p["state_window_bytes"] / 1e9)
        else:
            print("| %s | %d | no plan, even paged | | | | | | |" % (pr, B))
            continue
        w, st = sweep(p, B), paging(p)
        s = w + st
        bpt = s / B
        if one is None: one = bpt
        print("| %s | %d | %s | %.2f | %.1f%% | %.1f | 1/%.1f | %.0f | %.0f |" % (pr, B, how, s / 1e12, 100 * st / s, bpt / 1e9, one / bpt, th(bpt, 1), th(bpt, 4)))
PY
