#!/usr/bin/env bash
# kpack convert --consume (part of `make bench`, issue 36): figures and
# ratios, never pass/fail on a time.
#
# 1. A full-width slice with one layer per shard (BENCH_CONSUME_SLICE, default
#    3 MoE layers of 16 experts and a small vocabulary: 4.3 GB in 4 shards, the
#    largest 1.54 GB): convert and convert --consume side by side, alternating,
#    page cache dropped before each (the source made again by k3synth before
#    every --consume run: it is deleted); the same with --sha256 (every shard
#    hashed first; --consume rebuilds each shard from the output and compares
#    its SHA-256 before deleting it).  Medians of BENCH_RUNS.  The outputs'
#    SHA-256 must agree.  Then one --consume run with the allocated blocks of
#    the source and output directory sampled every millisecond or two (as du
#    counts them): its peak beyond the download, against --dry-run's
#    prediction, the largest shard and a plain conversion's need.
# 2. The full-size virtual K3 (k3synth --virtual, 96 shards as released):
#    --dry-run --json's figures for the real checkpoint, with and without
#    --consume (exact for an uncompressed conversion: the plan is).
#
# Env: see bench_kpack.sh (BIN, BENCH_RUNS, BENCH_SETTLE, BENCH_DIR, BENCH_LOCK).
set -u
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=tests/bench/bench_lib.sh
. tests/bench/bench_lib.sh
bench_init consume
SLICE=${BENCH_CONSUME_SLICE:---geometry slice --layers 3 --experts 16 --topk 4 --first-dense 0 --full-attn 3 --vocab 4096 --seed 5}
PY=/usr/bin/python3
cleanup() {
    rm -rf "$W/src" "$W/out.kpk"* "$W/virt" "$W/sums"
    [ -n "${BENCH_DIR:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
machine
make_src() { rm -rf "$W/src"; "$BIN/k3synth" "$W/src" $SLICE --quiet >/dev/null; }
# run under BENCH_LOCK (the drop and the timed command), so a bench sharing the disk waits
locked_run() {
    local r
    if [ -n "${BENCH_LOCK:-}" ]; then exec 9>>"$BENCH_LOCK"; flock 9; fi
    run "$@"; r=$?
    if [ -n "${BENCH_LOCK:-}" ]; then flock -u 9; exec 9>&-; fi
    return $r
}
median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
make_src || { echo "FAILED: k3synth $SLICE"; exit 1; }
(cd "$W/src" && sha256sum model-*.safetensors) >"$W/sums"
echo "source: $(du -sb "$W/src" | cut -f1) bytes in $(ls "$W/src" | grep -c safetensors) shards; largest $(ls -lS "$W/src"/model-* | head -1 | awk '{print $5}')"
echo
echo "1. convert vs convert --consume, alternating, medians of $RUNS (seconds measured on a shared machine: indicative)"
for sha in "" "--sha256 $W/sums"; do
    for i in $(seq "$RUNS"); do
        make_src
        locked_run "plain${sha:+-sha}" "$BIN/kpack" convert "$W/src" "$W/out.kpk" $sha --quiet || break
        sha256sum "$W/out.kpk" | cut -c1-64 >"$W/plain.sum"; rm -f "$W/out.kpk"
        locked_run "consume${sha:+-sha}" "$BIN/kpack" convert "$W/src" "$W/out.kpk" --consume $sha --quiet || break
        [ "$(sha256sum "$W/out.kpk" | cut -c1-64)" = "$(cat "$W/plain.sum")" ] || { echo "FAILED: --consume gave another file"; FAILED=1; }
        rm -f "$W/out.kpk"
    done
done
for k in plain consume plain-sha consume-sha; do
    printf "  %-12s %8.1f s  (runs: %s)\n" "$k" "$(awk -v k=$k '$1 == k {print $2}' "$RES" | median)" "$(awk -v k=$k '$1 == k {printf "%s ", $2}' "$RES")"
done
for s in "" -sha; do
    awk -v a="plain$s" -v b="consume$s" '$1 == a {x[++n] = $2} $1 == b {y[++m] = $2}
        END {for (i = 1; i <= n && i <= m; i++) printf "%.3f\n", y[i] / x[i]}' "$RES" | median |
        xargs printf "  --consume / plain%s: %s (median of the per-pair ratios)\n" "${s:+ with --sha256}"
done
echo
echo "2. du sampled during one --consume run (the source and the output in one directory)"
make_src
"$BIN/kpack" convert "$W/src" "$W/out.kpk" --consume --dry-run --json >"$W/dry.json"
read -r base extra end < <($PY tests/cli/consume_check.py peak "$W" -- "$BIN/kpack" convert "$W/src" "$W/out.kpk" --consume --quiet)
$PY - "$W/dry.json" "$base" "$extra" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); s = j["space"][0]; c = j["consume"]
base, extra = int(sys.argv[2]), int(sys.argv[3])
print("  the download (and the bench's small files): %d bytes allocated; at most %d beyond it during the run (du sampled)" % (base, extra))
print("  predicted by --dry-run: %d at the peak (%s); the largest shard: %d (%s)" % (s["consume_peak_bytes"], s["consume_peak_when"],
      c["largest_shard_bytes"], c["largest_shard"]))
print("  without --consume: %d more (the whole output); measured peak / plain need: %.3f" % (s["need_bytes"], extra / s["need_bytes"]))
PY
rm -rf "$W/src" "$W/out.kpk"
echo
echo "3. the full-size checkpoint (the virtual K3: 96 shards as released), from --dry-run"
"$BIN/k3synth" "$W/virt" --virtual --quiet >/dev/null && "$BIN/kpack" convert "$W/virt" "$W/out.kpk" --consume --dry-run --json >"$W/vdry.json" \
    && $PY - "$W/vdry.json" "$(du -sb --apparent-size "$W/virt" | cut -f1)" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); s = j["space"][0]; c = j["consume"]; dl = int(sys.argv[2])
print("  download %d bytes; KPK %d" % (dl, j["output_bytes"]))
print("  without --consume: %d more on the disk (%d in all)" % (s["need_apparent_bytes"], dl + s["need_apparent_bytes"]))
print("  with --consume:    %d more at the peak (%d in all); the largest shard %s is %d" % (s["consume_peak_apparent_bytes"],
      dl + s["consume_peak_apparent_bytes"], c["largest_shard"], c["largest_shard_bytes"]))
PY
[ $? -eq 0 ] || { echo "FAILED: the virtual K3's dry run"; FAILED=1; }
exit $FAILED
