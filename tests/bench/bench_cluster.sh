#!/usr/bin/env bash
# make bench-cluster (root): krun over 1, 2 and 4 ranks on this machine, each rank owning one
# modelled HDD (tests/bench/hdd_model.sh: a loop device throttled to HDD_MBPS MiB/s), in
# expert-bound decoding.  Prints figures and ratios; never passes or fails on a time (the exit
# status is non-zero only if a command failed).
#
# The slice: k3synth --geometry slice, 2 MoE layers (a KDA and an MLA layer, no dense layer),
# 48 experts of 17.5 MB, top-16 as the release, flat routing (~4.7 GB).  For N ranks it is laid
# out for N machines (kpack convert --machines N --stripe d0,..,d(N-1) --trunk-to T): machine r's
# experts whole on its one drive d<r>, the globals and the trunk in a member on the unthrottled
# disk (the SSD beside each machine), pinned in rank 0's RAM (--stages off), so that a decoding
# step reads only experts from the drives.  Each rank opens the set from a directory of its own
# that holds the entry file, the trunk member and only its own drive: it can read only its
# machine's experts, as on N machines.  Rank 0 caches BENCH_SLOTS experts (--expert-slots);
# the others have budgets of BENCH_FOLLOWER_MEM (few expert slots), so that the steps stay bound
# by the drives rather than by caches that grow with the rank count.
#
# Then the same rank counts with each rank's drive holding a whole copy of the experts (the set
# without --stripe, its trunk member on the unthrottled disk): every rank can read every expert,
# and each layer's experts are dealt evenly over the ranks (BENCH_NO_COPIED=1 leaves it out,
# BENCH_NO_PARTITIONED=1 runs only it, 1 rank included).
#
# BENCH_REPS runs per rank count, the page cache dropped before each; per run
# the median decoding step (the first step, which pins the trunk, left out).  The table: per
# rank count the median of the runs' medians, the expert bytes each step read from the drives
# (all ranks; krun's own counts, checked against the block devices'), the busiest drive's share,
# and the speed-up over one rank.
#
# Env: BENCH_DIR  work directory on the unthrottled disk (default /var/tmp/kpk-bench-cluster)
#      BENCH_RANKS ("1 2 4"), BENCH_REPS (3), BENCH_GEN (tokens per run, 10), BENCH_SLOTS (16),
#      BENCH_MEM (rank 0's budget, 3.3G), BENCH_FOLLOWER_MEM (350M: just above their minimum), HDD_MBPS (250), BENCH_KEEP=1
set -u
cd "$(dirname "$0")/../.." || exit 2
TOP=$PWD
BIN=${BIN:-$TOP/bin}
W=${BENCH_DIR:-/var/tmp/kpk-bench-cluster}
RANKS=${BENCH_RANKS:-"1 2 4"}
REPS=${BENCH_REPS:-3}
GEN=${BENCH_GEN:-10}
SLOTS=${BENCH_SLOTS:-16}
MEM0=${BENCH_MEM:-3.3G}
MEMF=${BENCH_FOLLOWER_MEM:-350M}
PY=/usr/bin/python3
[ "$(id -u)" = 0 ] || { echo "bench-cluster: needs root (loop devices, mount, cgroups)"; exit 2; }
command -v mpirun >/dev/null || { echo "bench-cluster: no mpirun (tests/deps.sh installs openmpi-bin)"; exit 2; }
MPI=(mpirun --oversubscribe --allow-run-as-root)
mkdir -p "$W"
HDD_ROOT=$W/hdd
. tests/bench/hdd_model.sh
RES=$W/results.tsv
: >"$RES"
rc=0
cleanup() { hdd_down; rm -rf "$W/hdd" "$W"/view* "$W/src"; [ -n "${BENCH_KEEP:-}" ] || rm -f "$W/slice.kpk"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ ! -f "$W/slice.kpk" ]; then
    rm -rf "$W/src"
    nice -n 10 "$BIN/k3synth" "$W/src" --geometry slice --layers 2 --first-dense 0 --full-attn 2 --experts 48 --topk 16 \
        --routing flat --vocab 32768 --seed 3 --quiet &&
        nice -n 10 "$BIN/kpack" convert "$W/src" "$W/slice.kpk" --quiet || { echo "FAILED: making the slice"; exit 1; }
    rm -rf "$W/src"
fi
NMAX=0; for n in $RANKS; do [ "$n" -gt "$NMAX" ] && NMAX=$n; done
GB=$(( ($(stat -c %s "$W/slice.kpk") >> 30) / 2 + 2 ))
hdd_up "$NMAX" "$GB" || exit 1
IDS=$($PY -c 'print(",".join(str(7 * i % 30000 + 11) for i in range(4)))')

# layout N: the slice laid out for N machines of one drive each; view r: rank r's directory
layout() {
    local n=$1 i r s=""
    rm -rf "$HDD_ROOT/e" "$HDD_ROOT/t" "$W"/view*
    for ((i = 0; i < NMAX; i++)); do rm -f "$HDD_ROOT/d$i"/k.kpk*; done
    for ((i = 0; i < n; i++)); do s+="${s:+,}$HDD_ROOT/d$i"; done
    mkdir -p "$HDD_ROOT/e" "$HDD_ROOT/t"
    nice -n 10 "$BIN/kpack" convert "$W/slice.kpk" "$HDD_ROOT/e/k.kpk" --stripe "$s" --machines "$n" --trunk-to "$HDD_ROOT/t" --quiet ||
        { echo "FAILED: kpack convert --machines $n"; rc=1; return 1; }
    for ((r = 0; r < n; r++)); do
        mkdir -p "$W/view$r/e"
        ln "$HDD_ROOT/e/k.kpk" "$W/view$r/e/k.kpk" && ln -s "$HDD_ROOT/t" "$W/view$r/t" && ln -s "$HDD_ROOT/d$r" "$W/view$r/d$r" || return 1
    done
    sync
}
# run N REP: one run of N ranks in the throttled cgroup; a line of results.tsv
run() {
    local n=$1 rep=$2 tag=${3:-} r=0 cmd
    cmd=("$BIN/krun" k.kpk --ids "$IDS" --gen "$GEN" --mem "$MEM0" --expert-slots "$SLOTS" --stages off --ctx 256 --json "$W/r.json" --quiet)
    if [ "$n" -gt 1 ]; then
        local i args=(-np 1 -wdir "$W/view0/e" "${cmd[@]}")
        for ((i = 1; i < n; i++)); do args+=(: -np 1 -wdir "$W/view$i/e" "$BIN/krun" k.kpk --mem "$MEMF"); done
        cmd=("${MPI[@]}" "${args[@]}")
    fi
    hdd_drop
    hdd_reset
    (cd "$W/view0/e" && hdd_exec "${cmd[@]}") >/dev/null 2>"$W/err.txt" || r=$?
    if [ $r -ne 0 ]; then echo "$n ranks: FAILED (exit $r): $(head -c 300 "$W/err.txt")"; rc=1; return; fi
    hdd_stats >"$W/dev.txt"
    $PY - "$W/r.json" "$n" "$rep" "$W/dev.txt" "$GEN" "$tag" >>"$RES" <<'PY'
import json, statistics, sys
j = json.load(open(sys.argv[1])); n, rep, gen = int(sys.argv[2]), sys.argv[3], int(sys.argv[5])
dev = {l.split()[0]: int(l.split()[1]) for l in open(sys.argv[4])}
steps = j["steps"][1:]
sec = statistics.median(s["seconds"] for s in steps)
drives = [dev.get("d%d" % r, 0) for r in range(n)]
ranks = (j.get("cluster") or {}).get("per_rank", [])
served = [r.get("experts_served", 0) for r in ranks]
# krun's bytes from the drive members (all but the entry and the trunk member) against the devices'
drive = (lambda m: m == 0) if sys.argv[6] == "c" else (lambda m: m >= 2)
got = sum(sum(b for m, b in enumerate(r["member_bytes"]) if drive(m)) for r in ranks) if ranks else \
    sum(x["bytes"] for x in j["member_bytes"] if drive(x["member"]))
if abs(sum(drives) - got) > 0.02 * got + (4 << 20):
    print("note: %d ranks: krun read %d bytes from the drives, the devices %d" % (n, got, sum(drives)), file=sys.stderr)
print("\t".join([str(n) + sys.argv[6], rep, "%.3f" % sec, "%.0f" % (sum(drives) / gen), "%.3f" % (max(drives) / max(1, sum(drives))), " ".join(map(str, served))]))
PY
    tail -1 "$RES" | awk -F'\t' '{printf "  %s ranks%s (round %s): %6.2f s/token  drives %6.0f MB/token, busiest drive %.0f%%  experts served per rank %s\n", $1, (index($1, "c") ? ", copied" : ""), $2, $3, $4/1e6, $5*100, $6}'
}

echo "slice: $(stat -c %s "$W/slice.kpk" | awk '{printf "%.2f GB", $1/1e9}'); ranks $RANKS, one drive of $HDD_MBPS MiB/s each; $REPS rounds, $GEN tokens a run"
# one layout at a time on the drives (re-laying one out takes a minute): each rank count's runs
# back to back, the rank counts one after the other
for n in $RANKS; do
    [ -z "${BENCH_NO_PARTITIONED:-}" ] || break
    layout "$n" || continue
    for ((rep = 1; rep <= REPS; rep++)); do run "$n" "$rep"; done
done
# copied: each rank's drive holds a whole copy of the experts (the set without --stripe: the
# experts in the entry file, the trunk in its member on the unthrottled disk); every rank can read
# every expert, and each layer's experts are dealt evenly over the ranks
copied() {
    local n=$1 r
    rm -rf "$HDD_ROOT/e" "$W"/view*
    for ((r = 0; r < NMAX; r++)); do rm -rf "$HDD_ROOT/d$r"/k.kpk* "$HDD_ROOT/d$r/t"; [ "$r" = 0 ] || rm -rf "$HDD_ROOT/d$r/e"; done
    mkdir -p "$HDD_ROOT/d0/e"
    ln -s "$HDD_ROOT/t" "$HDD_ROOT/d0/t"
    if [ ! -f "$HDD_ROOT/d0/e/k.kpk" ]; then
        rm -rf "$HDD_ROOT/t"; mkdir -p "$HDD_ROOT/t"
        nice -n 10 "$BIN/kpack" convert "$W/slice.kpk" "$HDD_ROOT/d0/e/k.kpk" --trunk-to "$HDD_ROOT/d0/t" --quiet ||
            { echo "FAILED: kpack convert --trunk-to"; rc=1; return 1; }
        [ -n "${BENCH_KEEP:-}" ] || rm -f "$W/slice.kpk"
    fi
    for ((r = 0; r < n; r++)); do
        mkdir -p "$HDD_ROOT/d$r/e" "$W/view$r"
        [ "$r" = 0 ] || { cp "$HDD_ROOT/d0/e/k.kpk" "$HDD_ROOT/d$r/e/k.kpk" && ln -s "$HDD_ROOT/t" "$HDD_ROOT/d$r/t"; } || return 1
        ln -s "$HDD_ROOT/d$r/e" "$W/view$r/e" || return 1
    done
    sync
}
if [ -z "${BENCH_NO_COPIED:-}" ]; then
    for n in $RANKS; do
        [ "$n" -gt 1 ] || [ -n "${BENCH_NO_PARTITIONED:-}" ] || continue
        copied "$n" || continue
        for ((rep = 1; rep <= REPS; rep++)); do run "$n" "$rep" c; done
    done
fi
$PY - "$RES" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows: by.setdefault(r[0], []).append(r)
order = sorted(by, key=lambda k: (k.endswith("c"), int(k.rstrip("c"))))
print("\n| ranks (one drive each) | s/token (median of %s runs) | MB read from the drives per token (the prompt's included) | busiest drive's share | speed-up over 1 rank |" %
      ",".join(str(len(by[k])) for k in order))
print("|---:|---:|---:|---:|---:|")
one = "1" if "1" in by else "1c"
base = statistics.median(float(r[2]) for r in by[one]) if one in by else 0
for n in order:
    s = statistics.median(float(r[2]) for r in by[n])
    print("| %s | %.2f | %.0f | %.0f%% | %.2fx |" % (n.rstrip("c") + (" (each a whole copy)" if n.endswith("c") else " (--machines)"), s, statistics.median(float(r[3]) for r in by[n]) / 1e6,
          100 * statistics.median(float(r[4]) for r in by[n]), base / s if s else 0))
PY
exit $rc
