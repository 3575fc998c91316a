#!/usr/bin/env bash
# kpack export (part of `make bench`; figures in docs/PERFORMANCE.md, "The
# archive and kpack export"): prints figures, never passes or fails on a time.
#
#  1. A full-width slice with non-text tensors (k3synth --geometry slice
#     --vision), converted with --sha256: kpack export against cp of the same
#     files (+ sync), and kpack export --check against sha256sum of the
#     files; page cache dropped before every run, the two of a pair in
#     alternating order, medians of BENCH_RUNS runs.
#  2. The sparse full-size virtual K3 (1.56 TB apparent): convert, then
#     export --check of every file (one run; it hashes 1.56 TB of zeros),
#     with the recipe's bookkeeping (headers parsed, pieces listed) timed
#     apart from the reading and hashing.
# Env: BENCH_DIR, BENCH_RUNS (default 5), BENCH_SETTLE, BIN, BENCH_SLICE as in
#      bench_kpack.sh; BENCH_SKIP: "slice" and/or "virtual"
set -u
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=tests/bench/bench_lib.sh
. tests/bench/bench_lib.sh
bench_init export
cleanup() { rm -rf "$W/slice" "$W/out" "$W/cp" "$W/virt" "$W"/*.kpk "$W"/*.tmp; [ -n "${BENCH_DIR:-}" ] || rm -rf "$W"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== machine"
machine
echo
if [[ "$SKIP" != *" slice "* ]]; then
    if [ "$(avail_bytes)" -lt $((18 * 1000 * 1000 * 1000)) ]; then echo "== slice: skipped, less than 18 GB free"; else
    echo "== export of a full-width slice (k3synth --geometry slice $SLICE_OPTS --vision)"
    "$BIN/k3synth" "$W/slice" --geometry slice $SLICE_OPTS --vision --quiet || { echo "FAILED: k3synth"; exit 1; }
    (cd "$W/slice" && sha256sum ./* >"$W/SUMS")
    "$BIN/kpack" convert "$W/slice" "$W/s.kpk" --sha256 "$W/SUMS" --quiet || { echo "FAILED: convert"; exit 1; }
    files=("$W"/slice/*)
    bytes=$(cat "${files[@]}" | wc -c)
    for r in $(seq "$RUNS"); do
        first=cp; [ $((r % 2)) = 0 ] && first=export
        for which in $first $([ $first = cp ] && echo export || echo cp); do
            rm -rf "$W/out" "$W/cp"
            if [ $which = cp ]; then mkdir "$W/cp"; run cp sh -c 'd=$1; shift; cp "$@" "$d"/ && sync "$d"/*' sh "$W/cp" "${files[@]}"
            else run export "$BIN/kpack" export "$W/s.kpk" "$W/out" --quiet; fi
        done
        rm -rf "$W/out" "$W/cp"
        first=sha; [ $((r % 2)) = 0 ] && first=check
        for which in $first $([ $first = sha ] && echo check || echo sha); do
            if [ $which = sha ]; then run sha256sum sha256sum "${files[@]}"
            else run check "$BIN/kpack" export "$W/s.kpk" --check --quiet; fi
        done
    done
    python3 - "$RES" "$bytes" "$RUNS" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    n, w, rss, c = line.split(); rows.setdefault(n, []).append(float(w))
nb, runs = int(sys.argv[2]), sys.argv[3]
print("%.3f GB in %s; %s runs each, page cache dropped before every run" % (nb / 1e9, "the download's files", runs))
def mbps(n): return nb / statistics.median(rows[n]) / 1e6
for label, n in (("cp of the files + sync", "cp"), ("kpack export (fsync each file)", "export"),
                 ("sha256sum of the files", "sha256sum"), ("kpack export --check (all cores)", "check")):
    if n in rows: print("  %-36s %8.2f s %8.0f MB/s   runs: %s" % (label, statistics.median(rows[n]), mbps(n), " ".join("%.2f" % x for x in rows[n])))
if "export" in rows and "cp" in rows: print("  export / cp: %.2fx" % (mbps("export") / mbps("cp")))
if "check" in rows and "sha256sum" in rows: print("  export --check / sha256sum: %.2fx" % (mbps("check") / mbps("sha256sum")))
PY
    fi
    rm -rf "$W/slice" "$W/s.kpk"
    echo
fi
if [[ "$SKIP" != *" virtual "* ]]; then
    echo "== the sparse virtual K3: every file rebuilt and hashed (export --check, one run)"
    "$BIN/k3synth" "$W/virt" --virtual --quiet || { echo "FAILED: k3synth --virtual"; exit 1; }
    /usr/bin/time -f "%e s, peak RSS %M KB" "$BIN/kpack" convert "$W/virt" "$W/v.kpk" --quiet 2>"$W/time.tmp" || FAILED=1
    echo "convert: $(tail -1 "$W/time.tmp")"
    drop
    /usr/bin/time -f "%e s, peak RSS %M KB" "$BIN/kpack" export "$W/v.kpk" --check --json >"$W/check.tmp" 2>"$W/time.tmp" || FAILED=1
    echo "export --check: $(tail -1 "$W/time.tmp")"
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("  %d files, %.1f GB rebuilt and hashed in %.1f s (%.0f MB/s); of that, the bookkeeping (recipe, headers parsed, pieces listed, summed over files): %.2f s; failed %d" % (len(j["files"]), j["bytes"] / 1e9, j["seconds"], j["bytes"] / j["seconds"] / 1e6, j["seconds_bookkeeping"], j["failed"]))' "$W/check.tmp"
    rm -rf "$W/virt" "$W/v.kpk"
fi
exit "$FAILED"
