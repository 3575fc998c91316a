#!/usr/bin/env bash
# krun streaming benchmark (make bench): prints figures, never fails on a time.
#
# 1. A full-width slice checkpoint (hidden 7168, 4 layers incl. the 2.34 GB
#    dense layer 0, 64 experts of 17.5 MB, top-4; ~9 GB), page cache dropped
#    before every run: seconds per decoding step, bytes per step against the
#    planner's compulsory reads, peak RSS, at several budgets and I/O modes.
# 2. krun's reads at the minimum budget replayed through its pread pool and
#    through io_uring (tests/bench/bench_io.c; skipped without liburing-dev).
# 3. With KPK_VIRTUAL=/path/k3-virtual.kpk (the sparse full-size K3 made by
#    bench_kpack.sh), the real shapes at --preset laptop for 2 tokens: peak
#    RSS, bytes per step against the plan.
#
# Env: BENCH_DIR (work directory, default a temp dir on the repo's disk),
#      BENCH_KEEP=1 keeps the slice; KPK_VIRTUAL as above.
set -u
cd "$(dirname "$0")/../.."
BIN=${BIN:-bin}
W=${BENCH_DIR:-$(mktemp -d "$PWD/build/bench-krun.XXXXXX")}
mkdir -p "$W"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(cannot drop the page cache: not root?)" >&2; }

echo "== krun streaming on a full-width slice"
if [ ! -f "$W/slice.kpk" ]; then
    "$BIN/k3synth" "$W/slice" --geometry slice --layers 4 --experts 64 --topk 4 --vocab 32768 --seed 3 --quiet
    "$BIN/kpack" convert "$W/slice" "$W/slice.kpk" --quiet
    rm -rf "$W/slice"
fi
ls -l "$W/slice.kpk" | awk '{printf "slice.kpk: %.2f GB\n", $5/1e9}'
IDS=$(python3 -c 'print(",".join(str(7 * i % 30000 + 11) for i in range(16)))')
GEN=${BENCH_GEN:-5}
"$BIN/krun" "$W/slice.kpk" --plan --mem 64G --ctx 32 | tail -1

run() { # run LABEL ARGS...
    local label=$1; shift
    drop
    /usr/bin/time -f "%M" -o "$W/time.txt" "$BIN/krun" "$W/slice.kpk" --ids "$IDS" --gen "$GEN" --json "$W/r.json" --quiet "$@" >/dev/null 2>"$W/err.txt" \
        || { echo "$label: FAILED: $(head -c 300 "$W/err.txt")"; return; }
    python3 - "$W/r.json" "$label" "$(cat "$W/time.txt")" <<'PY'
import json, statistics, sys
j = json.load(open(sys.argv[1])); label = sys.argv[2]; maxrss_kb = int(sys.argv[3])
st = j["steps"]
p = j.get("plan")
secs = statistics.median(s["seconds"] for s in st)
byt = statistics.median(s["bytes_trunk"] + s["bytes_experts"] + s["bytes_globals"] for s in st)
mbs = statistics.median(s["mb_per_s"] for s in st)
pred = ""
if p:
    ok = all(s["bytes_trunk"] == p["trunk_stream_bytes_per_token"] and s["bytes_experts"] == s["expert_misses"] * p["expert_slot_bytes"] for s in st)
    pred = "  planned %.3f GB trunk + misses x %.1f MB: %s" % (p["trunk_stream_bytes_per_token"] / 1e9, p["expert_slot_bytes"] / 1e6, "equal" if ok else "DIFFERENT")
    hits = sum(s["expert_hits"] for s in st); tot = hits + sum(s["expert_misses"] for s in st)
    pred += "; resident hit rate %.1f%%" % (100.0 * hits / tot if tot else 0)
budget = (" budget %.2f GB" % (p["budget_bytes"] / 1e9)) if p else ""
print("%-34s %6.2f s/step  %6.3f GB/step  %6.0f MB/s  peak RSS %.2f GB%s%s" % (label, secs, byt / 1e9, mbs, maxrss_kb * 1024 / 1e9, budget, pred))
PY
}
min=$("$BIN/krun" "$W/slice.kpk" --ids "$IDS" --gen "$GEN" --mem 4096 --quiet 2>&1 | sed -n 's/.*the minimum .* (\([0-9]*\) bytes)$/\1/p')
echo "minimum budget for this slice: $min bytes"
run "unbudgeted (mapping, all resident)"
run "--mem minimum --io direct" --mem "$min" --io direct
run "--mem minimum --io pread" --mem "$min" --io pread
run "--mem minimum --io mmap" --mem "$min" --io mmap
run "--mem 6G --io direct" --mem 6G --io direct
run "--mem 6G --cache lru" --mem 6G --cache lru
run "--mem 10G --io direct" --mem 10G --io direct
run "--mem 12G (all pinned)" --mem 12G --io direct

# io_uring against the pread pool, on the reads krun made at the minimum budget
# (tests/bench/bench_io.c replays them; built only where liburing is installed).
echo
echo "== the same reads through krun's pread pool and through io_uring (tests/bench/bench_io.c)"
if ! echo '#include <liburing.h>' | ${CC:-gcc} -E -x c - >/dev/null 2>&1; then
    echo "(liburing-dev is not installed: skipped; apt-get install liburing-dev)"
elif ${CC:-gcc} -std=c11 -O2 -Wall -Wextra -Werror -Wvla -D_GNU_SOURCE -I. -o "$W/bench_io" tests/bench/bench_io.c run/store/iopool.c \
        "${BUILD:-build}/libkpkformat.a" -luring -lzstd -lxxhash -lcrypto -ljansson -lpthread 2>"$W/cc.err"; then
    drop
    "$BIN/krun" "$W/slice.kpk" --ids "$IDS" --gen "$GEN" --quiet --mem "$min" --io direct --trace "$W/reads.tsv" >/dev/null 2>"$W/err.txt" \
        || echo "trace run FAILED: $(head -c 300 "$W/err.txt")"
    "$W/bench_io" "$W/slice.kpk" "$W/reads.tsv" "${BENCH_RUNS:-5}" 8 32 || echo "FAILED: bench_io"
else
    echo "FAILED: building bench_io:"; head -20 "$W/cc.err"
fi

if [ -n "${KPK_VIRTUAL:-}" ] && [ -f "$KPK_VIRTUAL" ]; then
    echo
    echo "== the full-size virtual K3 ($KPK_VIRTUAL), real shapes, all-zero weights"
    for p in laptop desktop workstation server max; do "$BIN/krun" "$KPK_VIRTUAL" --plan --preset $p --ctx 4096 | sed -n '1p;$p'; done
    drop
    /usr/bin/time -f "%M %e" -o "$W/time.txt" "$BIN/krun" "$KPK_VIRTUAL" --preset laptop --ids 3,4,5,6,7 --gen 2 --json "$W/v.json" --quiet >/dev/null 2>"$W/err.txt" \
        || echo "virtual laptop run FAILED: $(head -c 300 "$W/err.txt")"
    python3 - "$W/v.json" "$(cat "$W/time.txt")" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); rss_kb, wall = sys.argv[2].split()
p = j["plan"]
print("preset laptop: plan total %.2f GB, pinned %d layers, %d expert slots" % (p["total_bytes"] / 1e9, p["pinned_layers"], p["expert_slots"]))
print("peak RSS %.2f GB (budget %.2f GB); wall %s s; prefill %.1f s" % (int(rss_kb) * 1024 / 1e9, p["budget_bytes"] / 1e9, wall, j["prefill_seconds"]))
for i, s in enumerate(j["steps"]):
    print("step %d: %.1f s, read trunk %.2f GB + experts %.2f GB (planned trunk %.2f GB, experts %d misses x %.1f MB = %.2f GB), %.0f MB/s"
          % (i + 1, s["seconds"], s["bytes_trunk"] / 1e9, s["bytes_experts"] / 1e9, p["trunk_stream_bytes_per_token"] / 1e9,
             s["expert_misses"], p["expert_slot_bytes"] / 1e6, s["expert_misses"] * p["expert_slot_bytes"] / 1e9, s["mb_per_s"]))
PY
else
    echo "(set KPK_VIRTUAL=/path/k3-virtual.kpk for the full-size run)"
fi
[ -n "${BENCH_KEEP:-}" ] || rm -rf "$W"
