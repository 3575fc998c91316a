#!/usr/bin/env bash
# usage: tests/bench/ab_kpack.sh OLD_KPACK [NEW_KPACK]
#
# Before/after: two kpack binaries side by side on the same checkpoints, the
# order rotating every round, the page cache dropped before every run,
# medians; checks that both write byte-identical files.  Not part of
# `make bench`; this is how docs/PERFORMANCE.md's before/after figures were
# taken (OLD_KPACK built from the previous commit).
#
#   slice:   cp + sync (reference), convert old, convert new; check-source
#            --sha256 old/new with all cores and with --threads 1
#   virtual: check-source old/new (indexing 497,220 tensors), convert old/new
#            into a sparse .kpk (wall, peak RSS)
#
# Env: BENCH_DIR, BENCH_RUNS (default 5), BENCH_VIRTUAL_RUNS (default 3),
#      BENCH_SLICE, BENCH_SETTLE, BENCH_SKIP ("slice", "virtual"), as in bench_kpack.sh
set -u
[ $# -ge 1 ] || { sed -n '2,16p' "$0"; exit 2; }
OLD=$(realpath "$1")
cd "$(dirname "$0")/../.." || exit 2
TOP=$PWD
NEW=$(realpath "${2:-bin/kpack}")
SYNTH="$TOP/bin/k3synth"
RUNS=${BENCH_RUNS:-5}
VRUNS=${BENCH_VIRTUAL_RUNS:-3}
SETTLE=${BENCH_SETTLE:-3}
SLICE_OPTS=${BENCH_SLICE:---layers 2 --experts 64}
SKIP=" ${BENCH_SKIP:-} "
for t in "$OLD" "$NEW" "$SYNTH"; do [ -x "$t" ] || { echo "ab_kpack: $t is not an executable"; exit 2; }; done
mkdir -p "$TOP/build"
W=${BENCH_DIR:-$(mktemp -d "$TOP/build/ab-kpack.XXXXXX")}
mkdir -p "$W"
W=$(cd "$W" && pwd)
RES="$W/results.txt"
: >"$RES"
FAILED=0
cleanup() {
    rm -rf "$W/slice" "$W/cp" "$W/virt" "$W"/*.kpk "$W"/*.kpk.partial "$W"/*.kpk.journal "$W"/*.tmp
    [ -n "${BENCH_DIR:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# shellcheck source=tests/bench/bench_lib.sh
. tests/bench/bench_lib.sh

echo "== before/after: old $OLD, new $NEW"
machine
echo

# rotate R WORDS...: the words, starting at position R mod count
rotate() { local r=$1; shift; local a=("$@") n=$#; for i in $(seq 0 $((n - 1))); do echo "${a[$(((r + i) % n))]}"; done; }

report() { # report TITLE BYTES: medians and new/old ratios of every NAME-old / NAME-new pair in $RES
    python3 - "$RES" "$2" "$1" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, wall, rss, cache = line.split()
    rows.setdefault(name, []).append((float(wall), int(rss), int(cache)))
nbytes, title = int(sys.argv[2]), sys.argv[3]
med = lambda n, i=0: statistics.median(r[i] for r in rows[n])
print(title)
print("%-34s %9s %9s %10s %12s  %s" % ("", "median s", "MB/s", "peak RSS", "page cache", "runs (s)"))
for n in rows:
    print("%-34s %9.2f %9s %7.0f MB %+9.0f MB  %s" % (n, med(n), "%.0f" % (nbytes / med(n) / 1e6) if nbytes else "-", med(n, 1) / 1024,
          med(n, 2), " ".join("%.2f" % r[0] for r in rows[n])))
print("speed-up new over old (ratio of median times), and peak RSS new / old:")
for n in rows:
    if n.endswith("-old") and n[:-4] + "-new" in rows:
        m = n[:-4]
        print("  %-32s %6.2fx faster   RSS %.2fx" % (m, med(n) / med(m + "-new"), med(m + "-new", 1) / med(n, 1)))
if "cp" in rows:
    for v in ("old", "new"):
        if "convert-" + v in rows:
            print("  convert-%s vs cp + sync: %.2fx the speed of cp" % (v, med("cp") / med("convert-" + v)))
PY
}

if [[ "$SKIP" != *" slice "* ]]; then
    "$SYNTH" "$W/slice" --geometry slice $SLICE_OPTS --quiet || { echo "FAILED: k3synth"; exit 1; }
    shards=("$W"/slice/*.safetensors)
    bytes=$(stat -c %s "${shards[@]}" | awk '{s += $1} END {printf "%.0f", s}')
    (cd "$W/slice" && sha256sum ./*.safetensors >"$W/SUMS")
    same=1
    for r in $(seq "$RUNS"); do
        for which in $(rotate "$r" cp old new); do
            case $which in
            cp) rm -rf "$W/cp" && mkdir "$W/cp"
                run "cp" sh -c 'd=$1; shift; cp "$@" "$d"/ && sync "$d"/*' sh "$W/cp" "${shards[@]}"
                rm -rf "$W/cp" ;;
            old) rm -f "$W/old.kpk"; run "convert-old" "$OLD" convert "$W/slice" "$W/old.kpk" --quiet ;;
            new) rm -f "$W/new.kpk"; run "convert-new" "$NEW" convert "$W/slice" "$W/new.kpk" --quiet ;;
            esac
        done
        cmp -s "$W/old.kpk" "$W/new.kpk" || { same=0; echo "DIFFERENT: the slice .kpk files of old and new differ"; FAILED=1; }
        rm -f "$W/old.kpk" "$W/new.kpk"
        for which in $(rotate "$r" old new); do
            k=$OLD; [ "$which" = new ] && k=$NEW
            run "check-source-sha-$which" "$k" check-source "$W/slice" --sha256 "$W/SUMS" --quiet
            run "check-source-sha-t1-$which" "$k" check-source "$W/slice" --sha256 "$W/SUMS" --threads 1 --quiet
        done
    done
    [ "$same" = 1 ] && echo "slice: old and new wrote byte-identical files in every round (cmp)"
    report "slice: $(awk -v b="$bytes" 'BEGIN {printf "%.3f", b / 1e9}') GB of shards (k3synth --geometry slice $SLICE_OPTS), $RUNS rounds" "$bytes"
    rm -rf "$W/slice"
    : >"$RES"
    echo
fi

if [[ "$SKIP" != *" virtual "* ]]; then
    "$SYNTH" "$W/virt" --virtual --quiet || { echo "FAILED: k3synth --virtual"; exit 1; }
    for r in $(seq "$RUNS"); do
        for which in $(rotate "$r" old new); do
            k=$OLD; [ "$which" = new ] && k=$NEW
            run "check-source-$which" "$k" check-source "$W/virt" --quiet
        done
    done
    for r in $(seq "$VRUNS"); do
        for which in $(rotate "$r" old new); do
            k=$OLD; [ "$which" = new ] && k=$NEW
            rm -f "$W/$which.kpk"
            run "convert-$which" "$k" convert "$W/virt" "$W/$which.kpk" --quiet
        done
    done
    python3 tests/bench/sparse_cmp.py "$W/old.kpk" "$W/new.kpk" | sed 's/^/virtual: old and new .kpk: /' || FAILED=1
    report "virtual: 1.56 TB apparent (k3synth --virtual), $RUNS rounds of check-source, $VRUNS of convert" 0
    rm -rf "$W/virt" "$W/old.kpk" "$W/new.kpk"
fi
exit "$FAILED"
