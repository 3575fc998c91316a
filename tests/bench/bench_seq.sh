#!/usr/bin/env bash
# The sequential parts at full width (make bench; BENCH_ONLY=seq): prints
# figures, never fails on a time.
#
# 1. MLA attention at long contexts: tests/bench/bench_attn.c on a resident
#    full-width slice (hidden 7168, 96 MLA heads, kv_lora 512; one KDA and one
#    MLA layer, 8 experts), the MLA cache given S pseudo-random rows without
#    running them: ms per decoding step at S = 256, 4,096, 32,768, and the
#    logits of each S (two builds must agree: BENCH_OLD_BUILD below).
# 2. The KDA recurrence step, D = 128: the four passes kda.c made before
#    against the two passes of run/kernels/kernels_seq.c on each SIMD level
#    (tests/bench/bench_kda.c).
#
# Env: BENCH_DIR (work directory), BENCH_KEEP=1 keeps the slice,
#      BENCH_OLD_BUILD=DIR: also run bench_attn built against DIR's
#      libkrun.a / libkpkformat.a and headers (a checkout built with make),
#      alternating old and new, and compare their logits.
#      BENCH_STEPS (default 5), BENCH_ROUNDS (default 3).
set -u
cd "$(dirname "$0")/../.."
BIN=${BIN:-bin}
W=${BENCH_DIR:-$(mktemp -d "$PWD/build/bench-seq.XXXXXX")}
mkdir -p "$W"
STEPS=${BENCH_STEPS:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CC=${CC:-gcc}
LIBS="-lzstd -lxxhash -lcrypto -ljansson -lpcre2-8 -lpthread -lm"
rc=0

build_attn() { # build_attn OUT TREE BUILDDIR
    $CC -std=c11 -O2 -ffp-contract=off -D_GNU_SOURCE -I"$2" -o "$1" tests/bench/bench_attn.c \
        "$3/libkrun.a" "$3/libkpkformat.a" $LIBS
}

echo "== MLA attention at long contexts (tests/bench/bench_attn.c)"
# --no-archive: a file that a build from before KPK 1.1's archive (BENCH_OLD_BUILD) can open
if [ ! -f "$W/slice.kpk" ]; then
    "$BIN/k3synth" "$W/slice" --geometry slice --layers 2 --experts 8 --topk 2 --vocab 512 --first-dense 0 --seed 5 --quiet &&
        "$BIN/kpack" convert "$W/slice" "$W/slice.kpk" --no-archive --quiet || { echo "FAILED: making the slice"; exit 1; }
    rm -rf "$W/slice"
fi
build_attn "$W/bench_attn" . build || { echo "FAILED: building bench_attn"; exit 1; }
if [ -n "${BENCH_OLD_BUILD:-}" ]; then
    build_attn "$W/bench_attn_old" "$BENCH_OLD_BUILD" "$BENCH_OLD_BUILD/build" ||
        { echo "FAILED: building bench_attn against $BENCH_OLD_BUILD"; rc=1; }
fi
for r in $(seq 1 "$ROUNDS"); do
    for v in old new; do
        b="$W/bench_attn"
        if [ $v = old ]; then [ -x "$W/bench_attn_old" ] || continue; b="$W/bench_attn_old"; fi
        echo "-- round $r, $v"
        "$b" "$W/slice.kpk" --steps "$STEPS" --dump "$W/logits.$v" 256 4096 32768 || { echo "FAILED: bench_attn ($v)"; rc=1; }
    done
done
if [ -x "$W/bench_attn_old" ]; then
    cmp -s "$W/logits.old" "$W/logits.new" && echo "old and new builds: the same logits bits at every S" \
        || { echo "old and new builds: DIFFERENT logits"; rc=1; }
fi

echo
echo "== The KDA recurrence (tests/bench/bench_kda.c)"
$CC -std=c11 -O2 -ffp-contract=off -D_GNU_SOURCE -I. -o "$W/bench_kda" tests/bench/bench_kda.c run/kernels/kernels_seq.c run/kernels/kernels.c \
    run/kernels/kernels_avx2.c run/kernels/kernels_avx512.c run/util/threadpool.c -lpthread -lm && "$W/bench_kda" || { echo "FAILED: bench_kda"; rc=1; }

[ -n "${BENCH_KEEP:-}" ] || rm -f "$W/slice.kpk"
exit $rc
