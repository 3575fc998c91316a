#!/usr/bin/env bash
# Compressed blocks (part of `make bench`; figures in docs/PERFORMANCE.md,
# "Compressed blocks"): prints figures, never passes or fails on a time.
#
# On a full-width slice with realistic MXFP4 experts (k3synth --geometry
# slice --mxfp4 quantized):
#  1. explore: the uncompressed file's blocks, sampled per class, encoded at
#     several zstd levels and block sizes: stored/raw, encode MB/s (1 thread),
#     decode GB/s of raw output on 1 thread and on all cores
#     (tests/bench/bench_codec.c explore);
#  2. kpack convert --compress trunk and all with each literal level of
#     BENCH_LEVELS (--zstd-literal-level: the planes' and MXFP4 bytes' level):
#     stored/raw by kind, conversion wall time and MB/s, and the projected
#     time to convert the 1.56 TB checkpoint (from the conversion's MB/s with
#     the page cache dropped);
#  3. the real blocks of the --compress all file decoded on 1 thread and on
#     all cores, page cache warm (tests/bench/bench_codec.c decode).
# Env: BENCH_DIR, BENCH_RUNS (decode runs, default 5), BENCH_SETTLE, BIN as in
#      bench_kpack.sh; BENCH_LEVELS (default "-131072 -1000 -50 1 3"),
#      BENCH_BLOCKS (default "1M,2M,4M"), BENCH_SLICE (default --layers 2 --experts 64)
set -u
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=tests/bench/bench_lib.sh
. tests/bench/bench_lib.sh
bench_init codec
LEVELS=${BENCH_LEVELS:--131072 -1000 -50 1 3}
BLOCKS=${BENCH_BLOCKS:-1M,2M,4M}
cleanup() { rm -rf "$W/slice" "$W"/*.kpk "$W"/*.tmp "$W/bench_codec"; [ -n "${BENCH_DIR:-}" ] || rm -rf "$W"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== machine"
machine
echo
if [ "$(avail_bytes)" -lt $((20 * 1000 * 1000 * 1000)) ]; then echo "== codec: skipped, less than 20 GB free in $W"; exit 0; fi
${CC:-cc} -std=c11 -O2 -D_GNU_SOURCE -I. -o "$W/bench_codec" tests/bench/bench_codec.c build/libkpack.a \
    build/libkpkformat.a -lzstd -lxxhash -lcrypto -ljansson -lpcre2-8 -lpthread -lm 2>"$W/cc.tmp" \
    || { echo "FAILED: building bench_codec: $(head -5 "$W/cc.tmp")"; exit 1; }
echo "== the slice: k3synth --geometry slice $SLICE_OPTS --mxfp4 quantized"
"$BIN/k3synth" "$W/slice" --geometry slice $SLICE_OPTS --mxfp4 quantized --quiet || { echo "FAILED: k3synth"; exit 1; }
bytes=$(cat "$W"/slice/*.safetensors | wc -c)
"$BIN/kpack" convert "$W/slice" "$W/plain.kpk" --quiet || { echo "FAILED: convert"; exit 1; }
echo "$(awk -v b="$bytes" 'BEGIN {printf "%.3f", b / 1e9}') GB of shards"
echo

echo "== 1. levels and block sizes on sampled blocks of each class (bench_codec explore)"
"$W/bench_codec" explore "$W/plain.kpk" --levels "$(echo $LEVELS | tr ' ' ',')" --blocks "$BLOCKS" --threads "$(nproc)" --runs "$RUNS" \
    || FAILED=1
echo

echo "== 2. kpack convert --compress at each --zstd-literal-level (page cache dropped before each)"
printf '%-8s %-6s %9s %9s %9s %9s %8s %9s  %s\n' level mode trunk globals expert all "conv s" "MB/s" "1.56 TB at this speed"
for level in $LEVELS; do
    for mode in trunk all; do
        rm -f "$W/c.kpk"
        if run "convert-$mode$level" "$BIN/kpack" convert "$W/slice" "$W/c.kpk" --compress $mode --zstd-literal-level "$level" --json; then
            wall=$(tail -1 "$RES" | awk '{print $2}')
            "$BIN/kpack" info "$W/c.kpk" --json >"$W/info.tmp"
            python3 - "$W/info.tmp" "$level" "$mode" "$wall" "$bytes" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); level, mode, wall, nbytes = sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
e = j["extents"]
def r(k): return "%.3f" % (e[k]["bytes"] / e[k]["raw_bytes"]) if k in e and e[k]["raw_bytes"] else "-"
tot = sum(v["bytes"] for v in e.values()); raw = sum(v["raw_bytes"] for v in e.values())
h = 1.56e12 / (nbytes / wall) / 3600
print("%-8s %-6s %9s %9s %9s %9.3f %8.1f %9.0f  %.1f h" % (level, mode, r("trunk"), r("globals"), r("expert"), tot / raw, wall,
                                                           nbytes / wall / 1e6, h))
PY
        else FAILED=1; fi
    done
done
for r in 1 2 3; do rm -f "$W/c.kpk"; run "convert-none" "$BIN/kpack" convert "$W/slice" "$W/c.kpk" --json; done
python3 -c 'import statistics,sys; w=[float(l.split()[1]) for l in open(sys.argv[1]) if l.startswith("convert-none ")]; m=statistics.median(w); n=int(sys.argv[2]); print("%-8s %-6s %9s %9s %9s %9s %8.1f %9.0f  %.1f h" % ("-", "none", "1", "1", "1", "1", m, n / m / 1e6, 1.56e12 / (n / m) / 3600))' "$RES" "$bytes"
echo

echo "== 3. decoding the blocks of kpack convert --compress all (default level and block size), page cache warm"
rm -f "$W/c.kpk"
"$BIN/kpack" convert "$W/slice" "$W/c.kpk" --compress all --quiet && "$W/bench_codec" decode "$W/c.kpk" --threads "$(nproc)" --runs "$RUNS" || FAILED=1
exit "$FAILED"
