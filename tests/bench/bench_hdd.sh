#!/usr/bin/env bash
# make bench-hdd (root): krun streaming a full-width slice from modelled HDDs
# (tests/bench/hdd_model.sh: loop devices throttled to HDD_MBPS MiB/s each).
# Prints figures and ratios; never passes or fails on a time (the exit status
# is non-zero only if a command failed).
#
# The slice: k3synth --geometry slice, 4 layers (the 2.34 GB dense layer 0,
# two KDA and one MLA layer), 64 experts of 17.5 MB, top-16 routing as the
# release (~9.6 GB).  For each layout and budget, the page cache is dropped,
# krun generates BENCH_GEN tokens, and the table gives the median decoding
# step: seconds per token, bytes per token, and each drive's MB/s while the
# step streams (krun's per-member bytes / step seconds; the block devices'
# own counters are checked against krun's).
#
#   1 drive        the whole file on one drive
#   2 / 4 drives   stripe sets (entry file on the unthrottled disk)
#   split          trunk member on the unthrottled disk + experts on 4 drives,
#                  against max(trunk bytes / fast-disk speed, expert bytes /
#                  array speed); here the fast disk also backs the 4 drives'
#                  loop files, so (trunk + expert bytes) / its speed is a
#                  bound too.  krun's default there is --predict on (auto);
#                  also run with --predict off at the larger budget.
#   split, RAM     the same with the trunk member in a tmpfs (a fast disk of
#                  its own; when MemAvailable has room), --predict on and off
#   in RAM         the whole slice in a tmpfs, no drives: the compute floor of
#                  the step at that budget (when MemAvailable has room)
#   unit 1M/4M/16M the 4-drive stripe with each stripe unit (kpack's default
#                  --stripe-unit is 4 MiB): which keeps every drive busiest
#   compressed     a smaller slice (2 layers, 16 experts, ~3 GB) converted
#                  with kpack --compress trunk and --compress all against the
#                  same slice uncompressed, on 1 drive, at its minimum budget
#                  and at 3G
#
# Env: BENCH_DIR      work directory on the unthrottled disk (default /var/tmp/kpk-bench-hdd)
#      BENCH_BUDGETS  two budgets (default "2G 6G")
#      BENCH_GEN      tokens generated per run (default 4: 3 decoding steps)
#      BENCH_SKIP     any of "drives units split compressed"
#      HDD_MBPS       per-drive throttle in MiB/s (default 250)
#      BENCH_KEEP=1   keep the slice between runs of the bench
set -u
cd "$(dirname "$0")/../.." || exit 2
TOP=$PWD
BIN=${BIN:-$TOP/bin}
W=${BENCH_DIR:-/var/tmp/kpk-bench-hdd}
BUDGETS=${BENCH_BUDGETS:-"2G 6G"}
GEN=${BENCH_GEN:-4}
SKIP=" ${BENCH_SKIP:-} "
PY=/usr/bin/python3
[ "$(id -u)" = 0 ] || { echo "bench-hdd: needs root (loop devices, mount, cgroups)"; exit 2; }
. tests/bench/hdd_model.sh
mkdir -p "$W"
RES=$W/results.tsv
: >"$RES"
rc=0
RAMFS=""
cleanup() { hdd_down; [ -n "$RAMFS" ] && umount "$RAMFS"; [ -n "${BENCH_KEEP:-}" ] || rm -f "$W/slice.kpk" "$W/small.kpk" "$W/small-trunk.kpk" "$W/small-all.kpk"; rm -rf "$W/fast" "$W/e"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the slices, on the unthrottled disk ------------------------------------------------
make_slice() { # NAME K3SYNTH-OPTIONS...
    local name=$1; shift
    [ -f "$W/$name.kpk" ] && return 0
    rm -rf "$W/src"
    nice -n 10 "$BIN/k3synth" "$W/src" --geometry slice --vocab 32768 --seed 3 --quiet "$@" &&
        nice -n 10 "$BIN/kpack" convert "$W/src" "$W/$name.kpk" --quiet || { echo "FAILED: making $name"; rc=1; return 1; }
    rm -rf "$W/src"
}
make_slice slice --layers 4 --experts 64 --topk 16 || exit 1
GB=$(( ($(stat -c %s "$W/slice.kpk") >> 30) + 2 ))
echo "slice.kpk: $(stat -c %s "$W/slice.kpk" | awk '{printf "%.2f GB", $1/1e9}'); 4 drives of $GB GiB at $HDD_MBPS MiB/s"
hdd_up 4 "$GB" || exit 1
D=$HDD_ROOT
# the unthrottled disk's own speed (O_DIRECT, cache dropped)
hdd_drop
FAST=$(dd if="$W/slice.kpk" of=/dev/null iflag=direct bs=8M count=256 2>&1 | sed -n 's/.*, \([0-9.]*\) s, .*/\1/p' | awk '{printf "%.0f", 2147483648 / $1 / 1e6}')
echo "unthrottled disk: $FAST MB/s (dd O_DIRECT, 2 GiB); each drive: $((HDD_MBPS * 1048576 / 1000000)) MB/s"
IDS=$($PY -c 'print(",".join(str(7 * i % 30000 + 11) for i in range(4)))')

# ---- layouts (written unthrottled), one at a time ----------------------------------------
clear_drives() { rm -rf "$W/e" "$W/fast"; for i in 0 1 2 3; do rm -f "$D/d$i"/*.kpk*; done; }
layout() { # SRC NAME ARGS...: re-lay SRC out as NAME; prints the entry path
    local src=$1 name=$2; shift 2
    clear_drives
    mkdir -p "$W/e" "$W/fast"
    case $name in
        one*) nice -n 10 "$BIN/kpack" convert "$src" "$D/d0/k3.kpk" --quiet "$@" && echo "$D/d0/k3.kpk" ;;
        *) nice -n 10 "$BIN/kpack" convert "$src" "$W/e/k3.kpk" --quiet "$@" && echo "$W/e/k3.kpk" ;;
    esac
    sync
}

# ---- one measurement ---------------------------------------------------------------------
run() { # LABEL KPK BUDGET [krun options...]
    local label=$1 kpk=$2 budget=$3 r=0; shift 3
    hdd_drop
    hdd_reset
    hdd_exec "$BIN/krun" "$kpk" --ids "$IDS" --gen "$GEN" --mem "$budget" --json "$W/r.json" --quiet "$@" >/dev/null 2>"$W/err.txt" || r=$?
    if [ $r -ne 0 ]; then echo "$label $budget: FAILED (exit $r): $(head -c 300 "$W/err.txt")"; rc=1; return; fi
    hdd_stats >"$W/dev.txt"
    "$BIN/kpack" info "$kpk" --json >"$W/info.json" || { echo "FAILED: kpack info"; rc=1; return; }
    $PY - "$W/r.json" "$label" "$budget" "$W/dev.txt" "$D" "$kpk" "$W/info.json" >>"$RES" <<'PY'
import json, os, statistics, sys
j = json.load(open(sys.argv[1])); label, budget, devf, root, kpk = sys.argv[2:7]
info = json.load(open(sys.argv[7]))
steps = j["steps"]
med = lambda f: statistics.median(f(s) for s in steps)
# the drive (d0..d3) each member file is on; "-" for the unthrottled disk
where = []
for m in info["members"]:
    p = os.path.realpath(kpk if m["index"] == 0 else os.path.join(os.path.dirname(kpk), m["path"]))
    d = os.path.relpath(p, os.path.realpath(root)).split(os.sep)[0]
    where.append(d if not d.startswith("..") else "-")
dev = {l.split()[0]: int(l.split()[1]) for l in open(devf)}
rates = []
for m, d in enumerate(where):
    if d == "-" or not sum(s["members"][m]["bytes"] for s in steps): continue
    rates.append("%s:%.0f" % (d, med(lambda s: s["members"][m]["bytes"] / s["seconds"] / 1e6)))
    # krun's bytes for the drive against the block device's (whole run): a check, printed if off by > 2 %
    got = sum(x["bytes"] for x in j["member_bytes"] if where[x["member"]] == d)
    if abs(dev.get(d, 0) - got) > 0.02 * got + (1 << 20):
        print("note: %s: krun read %d bytes, the device %d" % (d, got, dev.get(d, 0)), file=sys.stderr)
print("\t".join([label, budget, "%.3f" % med(lambda s: s["seconds"]),
                 "%.0f" % med(lambda s: s["bytes_trunk"] + s["bytes_head"] + s["bytes_experts"] + s["bytes_globals"]),
                 "%.0f" % med(lambda s: s["bytes_trunk"] + s["bytes_head"]), "%.0f" % med(lambda s: s["bytes_experts"]),
                 " ".join(rates)]))
PY
    tail -1 "$RES" | awk -F'\t' '{printf "  %-18s %-4s %7.2f s/token %6.2f GB/token  MB/s per drive %s\n", $1, $2, $3, $4/1e9, $7}'
}

# ---- 1. drives: 1, stripe 2, stripe 4 ------------------------------------------------------
if [[ "$SKIP" != *" drives "* ]]; then
    echo "== 1, 2 and 4 drives (stripe unit 4 MiB), budgets $BUDGETS"
    for b in $BUDGETS; do
        k=$(layout "$W/slice.kpk" one) && run "1 drive" "$k" "$b"
    done
    k=$(layout "$W/slice.kpk" s2 --stripe "$D/d0,$D/d1" --stripe-unit 4M) && for b in $BUDGETS; do run "2 drives" "$k" "$b"; done
    k=$(layout "$W/slice.kpk" s4 --stripe "$D/d0,$D/d1,$D/d2,$D/d3" --stripe-unit 4M) && for b in $BUDGETS; do run "4 drives" "$k" "$b"; done
fi

# ---- 2. the stripe unit -----------------------------------------------------------------------
if [[ "$SKIP" != *" units "* ]]; then
    echo "== the stripe unit, 4 drives, budget ${BUDGETS%% *}"
    for u in 1M 16M; do
        k=$(layout "$W/slice.kpk" s4u --stripe "$D/d0,$D/d1,$D/d2,$D/d3" --stripe-unit $u) && run "4 drives unit $u" "$k" "${BUDGETS%% *}"
    done
fi

# ---- 3. split: trunk on the unthrottled disk, experts on 4 drives -------------------------------
if [[ "$SKIP" != *" split "* ]]; then
    echo "== split: trunk member on the unthrottled disk, experts striped over 4 drives"
    k=$(layout "$W/slice.kpk" split --stripe "$D/d0,$D/d1,$D/d2,$D/d3" --stripe-unit 4M --trunk-to "$W/fast") &&
        { for b in $BUDGETS; do run "split" "$k" "$b"; done; run "split predict off" "$k" "${BUDGETS##* }" --predict off; }
    # the trunk member in RAM: a fast disk that does not share the drives' backing disk
    avail=$(awk '/MemAvailable/ {printf "%d", $2 * 1024}' /proc/meminfo)
    slice=$(stat -c %s "$W/slice.kpk")
    if [ "$avail" -gt $((slice + (12 << 30))) ]; then
        mkdir -p "$W/ram" && mount -t tmpfs -o size=$(( (slice >> 30) + 2 ))G tmpfs "$W/ram" && RAMFS=$W/ram
        k=$(layout "$W/slice.kpk" split --stripe "$D/d0,$D/d1,$D/d2,$D/d3" --stripe-unit 4M --trunk-to "$W/ram") &&
            for b in $BUDGETS; do run "split, RAM" "$k" "$b"; run "split, RAM predict off" "$k" "$b" --predict off; done
        rm -f "$W/ram"/*
        # the compute floor: the whole slice in RAM, nothing read from a drive
        cp "$W/slice.kpk" "$W/ram/" && for b in $BUDGETS; do run "in RAM" "$W/ram/slice.kpk" "$b"; done
        rm -f "$W/ram"/*
    else
        echo "  (split, RAM and in RAM: skipped, MemAvailable $((avail >> 30)) GiB < slice + 12 GiB)"
    fi
fi

# ---- 4. compressed vs uncompressed, 1 drive ------------------------------------------------------
if [[ "$SKIP" != *" compressed "* ]]; then
    echo "== kpack convert --compress trunk / all vs uncompressed, 1 drive"
    make_slice small --layers 2 --first-dense 0 --experts 16 --topk 16 &&
        for c in trunk all; do
            [ -f "$W/small-$c.kpk" ] || nice -n 10 "$BIN/kpack" convert "$W/small.kpk" "$W/small-$c.kpk" --compress $c --quiet \
                || { echo "FAILED: kpack convert --compress $c"; rc=1; }
        done
    if [ -f "$W/small-all.kpk" ] && [ -f "$W/small-trunk.kpk" ]; then
        echo "small.kpk $(stat -c %s "$W/small.kpk") bytes; --compress trunk $(stat -c %s "$W/small-trunk.kpk"), all $(stat -c %s "$W/small-all.kpk")"
        # the minimum budget of the uncompressed file (the compressed ones need a little more for decode staging)
        "$BIN/krun" "$W/small-all.kpk" --plan --mem 64G --json "$W/plan.json" >/dev/null 2>&1
        MINB=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["minimum_bytes"])' "$W/plan.json" 2>/dev/null)
        # (a re-layout keeps a file's compression only when told: --compress again)
        for b in ${MINB:-1G} 3G; do
            k=$(layout "$W/small.kpk" one) && run "uncompressed" "$k" "$b"
            k=$(layout "$W/small-trunk.kpk" one --compress trunk) && run "compress trunk" "$k" "$b"
            k=$(layout "$W/small-all.kpk" one --compress all) && run "compress all" "$k" "$b"
        done
    fi
fi

# ---- the table ------------------------------------------------------------------------------
echo
$PY - "$RES" "$HDD_MBPS" "${FAST:-0}" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
cap = int(sys.argv[2]) * 1048576 / 1e6
fast = float(sys.argv[3]) or None
print("%-18s %-6s %9s %10s  %s" % ("layout", "budget", "s/token", "GB/token", "MB/s per drive while streaming (% of the throttle)"))
base = {}
for r in rows:
    label, budget, sec, byt = r[0], r[1], float(r[2]), float(r[3])
    drives = [(d, float(v)) for d, v in (x.split(":") for x in r[6].split())] if len(r) > 6 else []
    print("%-18s %-6s %9.2f %10.2f  %s" % (label, budget, sec, byt / 1e9, "  ".join("%s %.0f (%.0f%%)" % (d, v, 100 * v / cap) for d, v in drives)))
    if label == "1 drive": base[budget] = sec
print()
for r in rows:
    if r[0] in ("2 drives", "4 drives") and r[1] in base:
        print("%s, %s: %.2fx the 1-drive speed (goal for 4 drives: >= 3.6x)" % (r[0], r[1], base[r[1]] / float(r[2])))
floor = {r[1]: float(r[2]) for r in rows if r[0] == "in RAM"}
for r in rows:
    if r[0].startswith("split") and fast:
        trunk, experts = float(r[4]), float(r[5])
        ram = "RAM" in r[0]
        pred = experts / (4 * cap * 1e6) if ram else max(trunk / (fast * 1e6), experts / (4 * cap * 1e6))
        print("%s, %s: %.2f s/token against %s = %.2f s: %+.0f%% (goal: within 10%%)"
              % (r[0], r[1], float(r[2]), "experts %.2f GB / %.0f MB/s" % (experts / 1e9, 4 * cap) if ram else
                 "max(trunk %.2f GB / %.0f MB/s, experts %.2f GB / %.0f MB/s)" % (trunk / 1e9, fast, experts / 1e9, 4 * cap),
                 pred, 100 * (float(r[2]) / pred - 1)))
        if not ram:
            print("    (trunk and drives share the disk here: (%.2f + %.2f) GB / %.0f MB/s = %.2f s)"
                  % (trunk / 1e9, experts / 1e9, fast, (trunk + experts) / (fast * 1e6)))
        if r[1] in floor:
            print("    (the same step in RAM, no drives: %.2f s)" % floor[r[1]])
c = {(r[0], r[1]): (float(r[2]), float(r[3])) for r in rows if r[0] in ("compress trunk", "compress all", "uncompressed")}
for b in sorted({k[1] for k in c}):
    for kind in ("compress trunk", "compress all"):
        if (kind, b) in c and ("uncompressed", b) in c:
            (s1, b1), (s0, b0) = c[kind, b], c["uncompressed", b]
            print("%s vs uncompressed, 1 drive, budget %s: %.2f vs %.2f s/token (%.2fx as fast), %.2f vs %.2f GB read per token (%.3f)"
                  % (kind, b, s1, s0, s0 / s1, b1 / 1e9, b0 / 1e9, b1 / b0))
PY
exit $rc
