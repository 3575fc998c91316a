#!/usr/bin/env bash
# kpack benchmarks (part of `make bench`): prints figures and ratios, never
# passes or fails on a time.  Exits non-zero only if a command itself fails.
#
# 1. A full-width slice checkpoint (k3synth --geometry slice, ~5.2 GB): kpack
#    convert against cp of the same shards (+ fsync of the copies, as convert
#    ends with fdatasync/fsync), kpack verify against sha256sum of the .kpk,
#    kpack check-source --sha256 against sha256sum of the shards, and plain
#    reads of the shards (cat, and dd with O_DIRECT) for the disk's speed.
#    The page cache is dropped before every run; the tools of a pair run side
#    by side in alternating order; medians of BENCH_RUNS runs.  "page cache"
#    is how much the page cache grew during a run (other work on the machine
#    counts too).
# 2. The full-size virtual K3 (k3synth --virtual: 96 shards, 1.56 TB apparent,
#    real headers, holes for data): generation, check-source indexing (all 96
#    headers, 497,220 tensors), convert --dry-run and its plan, a full convert
#    into a sparse .kpk (wall, apparent vs allocated size, peak RSS), and a
#    verify of it (one run: it reads 1.56 TB of holes).
#
# Env: BENCH_DIR        work directory (default: a new one under build/, on the
#                       repo's disk); everything generated in it is deleted
#      BENCH_RUNS       runs per figure (default 5; at least 3 for a median)
#      BENCH_SLICE      k3synth options of the slice (default: --layers 2 --experts 64)
#      BENCH_SETTLE     seconds to wait after dropping the page cache (default 3;
#                       lets a VM's free-page reporting finish so every run starts alike)
#      BENCH_SKIP       sections to skip: any of "slice virtual virtual-verify"
#      KPK_VIRTUAL_OUT  keep the converted virtual .kpk at this path (krun's
#                       scale test uses it); otherwise it is deleted
#      BIN              where kpack and k3synth are (default bin)
set -u
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=tests/bench/bench_lib.sh
. tests/bench/bench_lib.sh
bench_init kpack
cleanup() {
    rm -rf "$W/slice" "$W/slice.kpk" "$W/cp" "$W/virt" "$W/virt.kpk" "$W/virt.kpk.partial" "$W/virt.kpk.journal" "$W"/*.tmp
    [ -n "${BENCH_DIR:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for t in kpack k3synth; do
    [ -x "$BIN/$t" ] || { echo "bench_kpack: $BIN/$t is not built (run make)"; exit 2; }
done
[ -x /usr/bin/time ] || { echo "bench_kpack: /usr/bin/time is needed (apt-get install time)"; exit 2; }

echo "== machine"
machine
echo

# ---------------------------------------------------------------- 1. slice
if [[ "$SKIP" != *" slice "* ]]; then
    if [ "$(avail_bytes)" -lt $((14 * 1000 * 1000 * 1000)) ]; then
        echo "== slice: skipped, less than 14 GB free in $W"
    else
        echo "== kpack on a full-width slice (k3synth --geometry slice $SLICE_OPTS)"
        /usr/bin/time -f "%e" -o "$W/time.tmp" "$BIN/k3synth" "$W/slice" --geometry slice $SLICE_OPTS --quiet \
            || { echo "FAILED: k3synth"; exit 1; }
        shards=("$W"/slice/*.safetensors)
        bytes=$(stat -c %s "${shards[@]}" | awk '{s += $1} END {printf "%.0f", s}')
        echo "generated ${#shards[@]} shards, $(awk -v b="$bytes" 'BEGIN {printf "%.3f", b / 1e9}') GB, in $(cat "$W/time.tmp") s"
        if [ "$(avail_bytes)" -lt $((bytes * 11 / 10 + 1000000000)) ]; then
            echo "not enough free space for a copy of the shards next to them; slice measurements skipped"
        else
            (cd "$W/slice" && sha256sum ./*.safetensors >"$W/SUMS") # expected sums for check-source (not timed)
            for r in $(seq "$RUNS"); do
                run "read-shards" sh -c 'cat "$@" >/dev/null' sh "${shards[@]}"
                run "read-shards-direct" sh -c 'for f; do dd if="$f" of=/dev/null bs=16M iflag=direct status=none || exit 1; done' sh "${shards[@]}"
                first="cp"; [ $((r % 2)) = 0 ] && first="convert"
                for which in $first $([ $first = cp ] && echo convert || echo cp); do
                    if [ "$which" = cp ]; then
                        rm -rf "$W/cp" && mkdir "$W/cp"
                        run "cp" sh -c 'd=$1; shift; cp "$@" "$d"/ && sync "$d"/*' sh "$W/cp" "${shards[@]}"
                        rm -rf "$W/cp"
                    else
                        rm -f "$W/slice.kpk"
                        run "convert" "$BIN/kpack" convert "$W/slice" "$W/slice.kpk" --json \
                            && python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print("convert-copy", j["copy_seconds"], 0, 0)' "$W/out.tmp" >>"$RES"
                    fi
                done
                first="sha"; [ $((r % 2)) = 0 ] && first="check"
                for which in $first $([ $first = sha ] && echo check || echo sha); do
                    if [ "$which" = sha ]; then run "sha256sum-shards" sha256sum "${shards[@]}"
                    else run "check-source-sha" "$BIN/kpack" check-source "$W/slice" --sha256 "$W/SUMS" --quiet; fi
                done
                run "check-source-sha-1" "$BIN/kpack" check-source "$W/slice" --sha256 "$W/SUMS" --threads 1 --quiet
                first="sha"; [ $((r % 2)) = 0 ] && first="verify"
                for which in $first $([ $first = sha ] && echo verify || echo sha); do
                    if [ "$which" = sha ]; then run "sha256sum-kpk" sha256sum "$W/slice.kpk"
                    else run "verify" "$BIN/kpack" verify "$W/slice.kpk" --quiet; fi
                done
            done
            kpk_bytes=$(stat -c %s "$W/slice.kpk")
            python3 - "$RES" "$bytes" "$kpk_bytes" "$RUNS" <<'PY'
import statistics, sys
res, src_bytes, kpk_bytes, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rows = {}
for line in open(res):
    name, wall, rss, cache = line.split()
    rows.setdefault(name, []).append((float(wall), int(rss), int(cache)))
def med(name, i=0):
    return statistics.median(r[i] for r in rows[name]) if name in rows else float("nan")
def mbps(name, nbytes):
    return nbytes / med(name) / 1e6 if name in rows else float("nan")
print("%.3f GB of shards in, %.3f GB .kpk out; %s runs each, page cache dropped before every run"
      % (src_bytes / 1e9, kpk_bytes / 1e9, runs))
print()
print("%-52s %9s %9s %10s %12s  %s" % ("", "median s", "MB/s", "peak RSS", "page cache", "runs (s)"))
def row(label, name, nbytes):
    if name not in rows:
        print("%-52s %9s" % (label, "FAILED")); return
    print("%-52s %9.2f %9.0f %8.0f MB %+9.0f MB  %s" % (label, med(name), mbps(name, nbytes), med(name, 1) / 1024, med(name, 2),
          " ".join("%.2f" % r[0] for r in rows[name])))
row("read the shards (cat > /dev/null)", "read-shards", src_bytes)
row("read the shards, O_DIRECT (dd bs=16M iflag=direct)", "read-shards-direct", src_bytes)
row("cp the shards + sync (fsync) the copies", "cp", src_bytes)
row("kpack convert (whole command)", "convert", src_bytes)
if "convert-copy" in rows:
    print("%-52s %9.2f %9.0f" % ("  of which the copy phase (kpack's own clock)", med("convert-copy"), mbps("convert-copy", src_bytes)))
row("sha256sum of the shards", "sha256sum-shards", src_bytes)
row("kpack check-source --sha256 (all cores)", "check-source-sha", src_bytes)
row("kpack check-source --sha256 --threads 1", "check-source-sha-1", src_bytes)
row("sha256sum of the .kpk", "sha256sum-kpk", kpk_bytes)
row("kpack verify (all cores)", "verify", kpk_bytes)
print()
def ratio(a, na, b, nb, text):
    if a in rows and b in rows:
        print("  %-70s %6.2fx" % (text, mbps(a, na) / mbps(b, nb)))
print("ratios of medians (MB/s over MB/s; > 1 means kpack is faster):")
ratio("convert", src_bytes, "cp", src_bytes, "kpack convert / cp + sync")
ratio("convert", src_bytes, "read-shards", src_bytes, "kpack convert / cat of the shards (read through the page cache)")
ratio("convert", src_bytes, "read-shards-direct", src_bytes, "kpack convert / O_DIRECT read of the shards (no page cache)")
ratio("check-source-sha", src_bytes, "sha256sum-shards", src_bytes, "kpack check-source --sha256 / sha256sum")
ratio("check-source-sha-1", src_bytes, "sha256sum-shards", src_bytes, "kpack check-source --sha256 --threads 1 / sha256sum")
ratio("verify", kpk_bytes, "sha256sum-kpk", kpk_bytes, "kpack verify (XXH3, all cores) / sha256sum of the .kpk")
PY
            rm -f "$W/slice.kpk"
        fi
        rm -rf "$W/slice" "$W/cp"
    fi
    echo
fi

# ---------------------------------------------------------------- 2. virtual
if [[ "$SKIP" != *" virtual "* ]]; then
    echo "== the full-size virtual K3 (k3synth --virtual: 96 shards, 1.56 TB apparent, real headers, holes for data)"
    : >"$RES"
    ok=1
    for r in $(seq "$RUNS"); do
        rm -rf "$W/virt"
        run "gen" "$BIN/k3synth" "$W/virt" --virtual --quiet || { ok=0; break; }
    done
    if [ "$ok" = 1 ]; then
        echo "apparent $(du -s --apparent-size -B1 "$W/virt" | cut -f1) bytes, allocated $(du -s -B1 "$W/virt" | cut -f1) bytes"
        for r in $(seq "$RUNS"); do
            run "check-source" "$BIN/kpack" check-source "$W/virt" --json \
                && python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print("index", j["index_seconds"], 0, 0)' "$W/out.tmp" >>"$RES"
        done
        for r in $(seq "$RUNS"); do run "dry-run" "$BIN/kpack" convert "$W/virt" "$W/virt.kpk" --dry-run; done
        echo "kpack convert --dry-run:"
        sed 's/^/  /' "$W/out.tmp"
        for r in $(seq "$RUNS"); do
            rm -f "$W/virt.kpk"
            run "convert" "$BIN/kpack" convert "$W/virt" "$W/virt.kpk" --json \
                && python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print("convert-copy", j["copy_seconds"], j["bytes_read"], j["bytes_written"])' "$W/out.tmp" >>"$RES"
        done
        if [ -f "$W/virt.kpk" ]; then
            echo "convert output: apparent $(stat -c %s "$W/virt.kpk") bytes, allocated (du) $(du -B1 "$W/virt.kpk" | cut -f1) bytes"
            if [[ "$SKIP" != *" virtual-verify "* ]]; then
                echo "(verify of the virtual file: one run; it reads 1.56 TB of holes and takes minutes)"
                run "verify" "$BIN/kpack" verify "$W/virt.kpk" --quiet
            fi
        fi
        python3 - "$RES" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, a, b, c = line.split()
    rows.setdefault(name, []).append((float(a), float(b), float(c)))
def med(name, i=0): return statistics.median(r[i] for r in rows[name])
def row(label, name, extra=""):
    if name not in rows:
        print("%-52s %9s" % (label, "FAILED / not run")); return
    print("%-52s %9.2f %9.0f MB  %s%s" % (label, med(name), med(name, 1) / 1024, " ".join("%.2f" % r[0] for r in rows[name]), extra))
print()
print("%-52s %9s %12s  %s" % ("", "median s", "peak RSS", "runs (s)"))
row("k3synth --virtual (generation)", "gen")
row("kpack check-source (cold cache; whole command)", "check-source")
if "index" in rows:
    print("%-52s %9.2f" % ("  of which indexing: 96 headers, 497,220 tensors", med("index")))
row("kpack convert --dry-run (plan only)", "dry-run")
row("kpack convert into a sparse .kpk (whole command)", "convert")
if "convert-copy" in rows:
    print("%-52s %9.2f     (read %.1f MB from the shards, wrote %.1f MB of extents)" % (
        "  of which the copy phase", med("convert-copy"), med("convert-copy", 1) / 1e6, med("convert-copy", 2) / 1e6))
row("kpack verify of the virtual .kpk (1 run)", "verify")
PY
        if [ -f "$W/virt.kpk" ] && [ -n "${KPK_VIRTUAL_OUT:-}" ]; then
            mkdir -p "$(dirname "$KPK_VIRTUAL_OUT")"
            mv "$W/virt.kpk" "$KPK_VIRTUAL_OUT" && echo "kept the virtual .kpk at $KPK_VIRTUAL_OUT"
        fi
    fi
    rm -rf "$W/virt" "$W/virt.kpk"
    echo
fi
exit "$FAILED"
