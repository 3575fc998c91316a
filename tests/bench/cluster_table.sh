#!/usr/bin/env bash
# The full-scale projection of krun over several machines (README "Several machines",
# docs/RUNTIME.md §10): 1, 2, 4 and 8 machines of the laptop and desktop presets, each with 4
# HDDs, from the cluster plan (krun --plan --ranks N: N machines like this one, each rank's own
# memory plan for its pipeline stage, the experts given to ranks as the runtime gives them over
# random top-k draws, each MoE layer at the pace of its slowest disk).  Reading and sending
# only: compute is not counted.
#
# Two layouts of the same file, made here from MODEL.kpk:
#   copied       a 4-drive stripe set (kpack convert --stripe D0,D1,D2,D3) with every member on
#                every machine: every rank can read every expert, each layer's experts are dealt
#                evenly over the machines, each read from all 4 of its drives
#   partitioned  kpack convert --machines N over 4N directories: each machine holds only its own
#                members, whole experts dealt over every drive; a layer's experts are read where
#                they are, so the busiest drive of the cluster sets the layer's pace
# Per row: seconds per token for one sequence (and what crosses the network per token, its share
# of the time at 1 and 10 Gbit/s), and krun batch's tokens/hour for B sequences per sweep
# (B = BATCH, or the largest that fits every rank's budget at --ctx CTX).
#
# usage: tests/bench/cluster_table.sh MODEL.kpk [CTX]   (MODEL: the sparse full-size virtual K3 --
#        k3synth --virtual, converted -- so that the layouts cost no disk; CTX 4096)
# Env:   MACHINES ("1 2 4 8"), PRESETS ("laptop desktop"), BATCH (64), HDD_MBPS (262), BIN (bin),
#        CLUSTER_DIR (a directory for the layouts; default a temporary one)
set -eu
K=$(realpath "$1"); CTX=${2:-4096}
BIN=$(realpath "${BIN:-bin}")
MACHINES=${MACHINES:-1 2 4 8}
PRESETS=${PRESETS:-laptop desktop}
BATCH=${BATCH:-64}
MBPS=${HDD_MBPS:-262}
W=${CLUSTER_DIR:-$(mktemp -d)}
mkdir -p "$W"
trap 'rm -rf "$W"/copied "$W"/part* "$W"/*.json; rmdir "$W" 2>/dev/null' EXIT
# dirs PREFIX N: PREFIX/d0,...,PREFIX/d(N-1), made
dirs() { local i s=""; for ((i = 0; i < $2; i++)); do mkdir -p "$1/d$i"; s+="${s:+,}$1/d$i"; done; echo "$s"; }
convert() { # OUT ARGS...
    local out=$1; shift
    [ -f "$out" ] && return 0
    mkdir -p "$(dirname "$out")"
    nice -n 10 "$BIN/kpack" convert "$K" "$out" --quiet "$@"
}
convert "$W/copied/e/k.kpk" --stripe "$(dirs "$W/copied" 4)"
for n in $MACHINES; do convert "$W/part$n/e/k.kpk" --stripe "$(dirs "$W/part$n" $((4 * n)))" --machines "$n"; done
# plan KPK PRESET N SEQS OUT: the cluster plan as JSON (fails when a rank's budget cannot hold it)
plan() { "$BIN/krun" "$1" --plan --preset "$2" --ranks "$3" --max-seqs "$4" --ctx "$CTX" --disk-mbps "$MBPS" --net-mbps 1000 --json "$5" >/dev/null 2>&1; }
for p in $PRESETS; do
    for n in $MACHINES; do
        for lay in copied part; do
            k=$W/$lay/e/k.kpk
            [ $lay = part ] && k=$W/part$n/e/k.kpk
            tag=$p-$n-$lay
            plan "$k" "$p" "$n" 1 "$W/$tag-1.json" || { echo "no plan: $tag" >&2; continue; }
            b=$BATCH
            if ! plan "$k" "$p" "$n" "$b" "$W/$tag-b.json"; then
                lo=1; hi=$b               # the largest B that fits: [lo fits, hi does not)
                while [ $((hi - lo)) -gt 1 ]; do
                    mid=$(((lo + hi) / 2))
                    if plan "$k" "$p" "$n" "$mid" "$W/x.json"; then lo=$mid; else hi=$mid; fi
                done
                plan "$k" "$p" "$n" "$lo" "$W/$tag-b.json"
            fi
        done
    done
done
# each machine's disk: the main file and the members it holds (the largest machine's)
python3 - "$W" "$MBPS" "$CTX" "$PRESETS" $MACHINES <<'PY'
import glob, json, os, re, sys
w, mbps, ctx, presets, machines = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(), [int(x) for x in sys.argv[5:]]
def disk(lay, n):
    if lay == "copied":
        return sum(os.path.getsize(f) for f in glob.glob(w + "/copied/*/k.kpk*"))
    main = os.path.getsize(w + "/part%d/e/k.kpk" % n)
    per = {}
    for f in glob.glob(w + "/part%d/d*/k.kpk.m*" % n):
        m = int(re.search(r"\.m(\d+)\.\d+$", f).group(1))
        per[m] = per.get(m, 0) + os.path.getsize(f)
    return main + max(per.values())
print("| preset | machines | layout (disk per machine) | trunk: pinned layers / streamed per token | s/token (trunk + experts + network at 1 Gbit/s) "
      "| network per token | its share at 1 Gbit/s | at 10 Gbit/s | krun batch: B | tokens/hour |")
print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
for p in presets:
    for n in machines:
        for lay in ("copied", "part"):
            tag = "%s/%s-%d-%s" % (w, p, n, lay)
            if not os.path.exists(tag + "-1.json"):
                print("| %s | %d | %s | no plan | | | | | | |" % (p, n, lay)); continue
            a = json.load(open(tag + "-1.json"))
            b = json.load(open(tag + "-b.json")) if os.path.exists(tag + "-b.json") else None
            pinned = sum(r["pinned"] for r in a["per_rank"])
            layers = sum(r["layers"] for r in a["per_rank"])
            s1 = a["seconds_trunk"] + a["seconds_experts"]
            net = a["net_bytes"]
            t1, t10 = net * 8 / 1e9, net * 8 / 1e10
            print("| %s | %d | %s (%.2f TB) | %d of %d / %.1f GB | %.2f (%.2f + %.2f + %.2f) | %.1f MB | %.1f%% | %.2f%% | %s | %s |" % (
                p, n, "copied" if lay == "copied" else "partitioned", disk(lay, n) / 1e12, pinned, layers, a["trunk_bytes"] / 1e9,
                s1 + t1, a["seconds_trunk"], a["seconds_experts"], t1, net / 1e6, 100 * t1 / (s1 + t1), 100 * t10 / (s1 + t10),
                b["seqs"] if b else "-", "%.0f" % b["tokens_per_hour"] if b else "-"))
PY
