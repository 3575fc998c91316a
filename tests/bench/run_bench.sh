#!/usr/bin/env bash
# make bench: the long measurements.  Prints figures and ratios; never passes
# or fails on a time (the exit status is non-zero only if a command failed).
#
#   kpack    tests/bench/bench_kpack.sh: convert vs cp, verify and check-source
#            vs sha256sum on a full-width slice; the full-size virtual K3
#            (indexing, plan, sparse convert, verify)
#   codec    tests/bench/bench_codec.sh: compressed blocks (levels, block sizes,
#            stored/raw by kind, conversion time, decode GB/s per core)
#   export   tests/bench/bench_export.sh: export vs cp, export --check vs
#            sha256sum, the virtual K3's files rebuilt and hashed
#   consume  tests/bench/bench_consume.sh: convert vs convert --consume (time,
#            du sampled against the predicted peak), the full checkpoint's figures
#   kernels  tests/bench/bench_kernels.c, built with the line in its header
#   krun     tests/bench/bench_krun.sh, given the virtual .kpk made by kpack;
#            includes the pread pool vs io_uring replay (tests/bench/bench_io.c)
#   seq      tests/bench/bench_seq.sh: MLA attention at 256 / 4,096 / 32,768
#            cached positions, the KDA recurrence step
#   spec     tests/bench/bench_spec.sh: speculative decoding, streaming, bytes
#            and seconds per generated token with and without --spec
#   serve    tests/bench/bench_serve.sh: krun serve's batching (1, 2, 4, 8 concurrent
#            requests) and krun chat's turn two, on a full-width slice
#   prompt   tests/bench/bench_prompt.sh: prompt blocks (--chunk 64 vs auto) on a
#            release-geometry expert pool (BENCH_PROMPT_KPK, or 448 experts top-8
#            made here): bytes, seconds, the union model's prediction
#   prefix   tests/bench/bench_prefix.sh: a conversation through krun serve and the openai
#            client with and without the prefix cache, and across a restart on --cache-dir;
#            needs a release-geometry pool in BENCH_PREFIX_KPK (k3synth --geometry slice
#            --layers 2 --experts 896 --topk 16 --routing flat: 19.8 GB), skipped without
#   batch    tests/bench/bench_batch.sh: krun batch, B = 1, 4, 16, 64 sequences per sweep on a
#            release-geometry pool in BENCH_BATCH_KPK (the same pool; skipped without): bytes and
#            seconds per generated token against the union model's prediction (BENCH_LOCK: a
#            file every measured run holds a flock on, for a disk another bench shares)
#   draft    tests/bench/bench_draft.sh: the EAGLE drafter (issue 30): bytes per pass against its
#            width on the same pool (BENCH_DRAFT_KPK or BENCH_BATCH_KPK), the trained small pair
#            with and without (tests/train/make_pair.sh; python3-torch), the full-scale projection
#
# Everything is generated under a temporary directory in build/ (the repo's
# disk) and deleted at the end.
#
# Env: BENCH_ONLY       a subset of "kpack codec export consume kernels krun seq spec serve prompt prefix batch draft" (default: all)
#      KPK_VIRTUAL_OUT  keep the converted virtual .kpk at this path (the
#                       runtime's scale test uses it); otherwise it is deleted
#      BENCH_RUNS, BENCH_SLICE, BENCH_SETTLE, BENCH_SKIP: see bench_kpack.sh
set -u
cd "$(dirname "$0")/../.." || exit 2
TOP=$PWD
mkdir -p "$TOP/build"
TMP=$(mktemp -d "$TOP/build/bench.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM
ONLY=" ${BENCH_ONLY:-kpack codec export consume kernels krun seq spec serve prompt prefix batch draft} "
VIRT=${KPK_VIRTUAL_OUT:-$TMP/k3-virtual.kpk}
rc=0
start=$(date +%s)

if [[ "$ONLY" == *" kpack "* ]]; then
    echo "################ kpack"
    BENCH_DIR="$TMP/kpack" KPK_VIRTUAL_OUT="$VIRT" bash tests/bench/bench_kpack.sh || rc=1
    echo
fi

for b in codec export consume; do
    if [[ "$ONLY" == *" $b "* ]]; then
        echo "################ $b (tests/bench/bench_$b.sh)"
        BENCH_DIR="$TMP/$b" bash tests/bench/bench_$b.sh || rc=1
        echo
    fi
done

if [[ "$ONLY" == *" kernels "* ]]; then
    echo "################ kernels (tests/bench/bench_kernels.c)"
    if [ ! -f tests/bench/bench_kernels.c ]; then
        echo "(tests/bench/bench_kernels.c is absent: skipped)"
    elif ${CC:-gcc} -std=c11 -O2 -ffp-contract=off -D_GNU_SOURCE -I. -o "$TMP/bench_kernels" \
            tests/bench/bench_kernels.c run/kernels/kernels.c run/kernels/kernels_avx2.c run/kernels/kernels_avx512.c run/util/threadpool.c \
            -lpthread -lm 2>"$TMP/cc.err"; then
        "$TMP/bench_kernels" || { echo "FAILED: bench_kernels"; rc=1; }
    else
        echo "FAILED: building bench_kernels with the line in its header:"
        head -20 "$TMP/cc.err"
        rc=1
    fi
    echo
fi

if [[ "$ONLY" == *" krun "* ]]; then
    echo "################ krun (tests/bench/bench_krun.sh)"
    if [ ! -f tests/bench/bench_krun.sh ]; then
        echo "(tests/bench/bench_krun.sh is absent: skipped)"
    else
        if [ -f "$VIRT" ]; then export KPK_VIRTUAL="$VIRT"; fi
        bash tests/bench/bench_krun.sh || { echo "FAILED: bench_krun.sh"; rc=1; }
    fi
    echo
fi

for part in seq spec; do
    if [[ "$ONLY" == *" $part "* ]]; then
        echo "################ $part (tests/bench/bench_$part.sh)"
        BENCH_DIR="$TMP/$part" bash "tests/bench/bench_$part.sh" || { echo "FAILED: bench_$part.sh"; rc=1; }
        echo
    fi
done
if [[ "$ONLY" == *" serve "* ]]; then
    echo "################ krun serve and krun chat (tests/bench/bench_serve.sh)"
    BENCH_DIR="$TMP/serve" bash tests/bench/bench_serve.sh || { echo "FAILED: bench_serve.sh"; rc=1; }
    echo
fi
if [[ "$ONLY" == *" prompt "* ]]; then
    echo "################ prompt blocks on a release-geometry pool (tests/bench/bench_prompt.sh)"
    BENCH_DIR="$TMP/prompt" bash tests/bench/bench_prompt.sh || { echo "FAILED: bench_prompt.sh"; rc=1; }
    echo
fi
if [[ "$ONLY" == *" prefix "* ]]; then
    echo "################ the prefix cache (tests/bench/bench_prefix.sh)"
    if [ -n "${BENCH_PREFIX_KPK:-}" ]; then
        bash tests/bench/bench_prefix.sh "$BENCH_PREFIX_KPK" || { echo "FAILED: bench_prefix.sh"; rc=1; }
    else
        echo "skipped: set BENCH_PREFIX_KPK to a release-geometry pool"
    fi
    echo
fi

if [[ "$ONLY" == *" batch "* ]]; then
    echo "################ krun batch: sequences per sweep (tests/bench/bench_batch.sh)"
    BENCH_DIR="$TMP/batch" bash tests/bench/bench_batch.sh "${BENCH_BATCH_KPK:-}" || { echo "FAILED: bench_batch.sh"; rc=1; }
    echo
fi

if [[ "$ONLY" == *" draft "* ]]; then
    echo "################ the EAGLE drafter (tests/bench/bench_draft.sh)"
    if [ -f "$VIRT" ]; then export KPK_VIRTUAL="$VIRT"; fi
    BENCH_DIR="$TMP/draft" bash tests/bench/bench_draft.sh || { echo "FAILED: bench_draft.sh"; rc=1; }
    echo
fi

# train (tests/bench/bench_train.sh): the drafter trained for issue 30 and its acceptance; in
# the default run and with BENCH_ONLY=train
if [ -z "${BENCH_ONLY:-}" ] || [[ "$ONLY" == *" train "* ]]; then
    echo "################ the trained drafter (tests/bench/bench_train.sh)"
    BENCH_DIR="$TMP/train" bash tests/bench/bench_train.sh || { echo "FAILED: bench_train.sh"; rc=1; }
    echo
fi

echo "make bench: $(( $(date +%s) - start )) s in all"
exit "$rc"
