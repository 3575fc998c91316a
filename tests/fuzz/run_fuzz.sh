#!/usr/bin/env bash
# `make fuzz`: runs every libFuzzer harness built in $FUZZ_BUILD/fuzz/, one
# after the other (two cores are shared), and prints per harness the
# executions, coverage (edges, features), corpus size and crashes.  Figures,
# never pass/fail on time; it exits non-zero only if a harness crashed.
#
#   FUZZ_SECONDS=N    seconds per harness (default 60)
#   FUZZ_RUNS=N       executions per harness instead (e.g. 10000000)
#   FUZZ_ONLY=a,b     only these harnesses
#   FUZZ_NICE=N       niceness (default 15)
#   FUZZ_EXTRA="..."  more libFuzzer flags, after the harness's own (the
#                     last of a flag wins): e.g. -timeout=1800 when the runs
#                     will be paused (SIGSTOP) for benchmarks -- libFuzzer's
#                     timeout is wall-clock, so a pause reads as a hang
#
# Corpora grow in $FUZZ_BUILD/corpus/NAME (kept between runs), seeded from
# tests/fuzz/corpus/NAME and the generated seeds; crash inputs land in
# $FUZZ_BUILD/crashes/NAME/: copy each into tests/fuzz/regress/NAME/ once it
# is fixed, and the replay test keeps it fixed.  Per-harness libFuzzer
# options: tests/fuzz/NAME.options (one line), e.g. -max_len=4096.
set -u
cd "$(dirname "$0")/../.."
FB=${FUZZ_BUILD:-build/fuzz}
SECONDS_EACH=${FUZZ_SECONDS:-60}
NICE=${FUZZ_NICE:-15}
SEEDS="$FB/seeds"
# (regenerated when older than a harness that needs its state/ seeds)
[ -d "$SEEDS/state" ] || tests/fuzz/make_seeds.sh "${BIN:-bin}" "$SEEDS" || { echo "fuzz: cannot generate seeds"; exit 2; }
# fuzz_state's model: the one its seed states were saved with
export KPK_FUZZ_STATE_MODEL="$SEEDS/kpk/layer-major.kpk"
names=$(ls tests/fuzz/fuzz_*.c | sed 's|.*/fuzz_||; s|\.c$||')
[ -n "${FUZZ_ONLY:-}" ] && names=$(tr ',' '\n' <<<"$FUZZ_ONLY")
budget="-max_total_time=$SECONDS_EACH"
[ -n "${FUZZ_RUNS:-}" ] && budget="-runs=$FUZZ_RUNS"

rows=(); crashed=0
for h in $names; do
    bin="$FB/fuzz/fuzz_$h"
    [ -x "$bin" ] || { echo "fuzz: $bin not built"; exit 2; }
    mkdir -p "$FB/corpus/$h" "$FB/crashes/$h" "$FB/logs"
    opts=$(cat "tests/fuzz/$h.options" 2>/dev/null || true)
    seeds=()
    [ -d "tests/fuzz/corpus/$h" ] && seeds+=("tests/fuzz/corpus/$h")
    [ -d "$SEEDS/$h" ] && seeds+=("$SEEDS/$h")
    [ -d "tests/fuzz/regress/$h" ] && seeds+=("tests/fuzz/regress/$h")
    log="$FB/logs/$h.log"
    before=$(ls "$FB/crashes/$h" | wc -l)
    echo "fuzz: $h ($budget $opts) ..." >&2
    start=$(date +%s)
    # shellcheck disable=SC2086
    nice -n "$NICE" "$bin" "$FB/corpus/$h" "${seeds[@]}" $budget $opts ${FUZZ_EXTRA:-} -print_final_stats=1 \
        -artifact_prefix="$FB/crashes/$h/" >"$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$log" | tail -1)
    crashes=$(( $(ls "$FB/crashes/$h" | wc -l) - before ))
    [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ] && crashes="? (exit $rc, see $log)"
    [ "$rc" -ne 0 ] && crashed=1
    rows+=("$(printf '%-16s %12s %8s %8s %7s %6s  %s' "$h" "${execs:-?}" \
        "$(awk '{print $2}' <<<"$cov")" "$(awk '{print $4}' <<<"$cov")" "$(awk '{print $6}' <<<"$cov")" "$secs" "$crashes")")
done
printf '%-16s %12s %8s %8s %7s %6s  %s\n' harness executions edges features corpus secs crashes
printf '%s\n' "${rows[@]}"
[ "$crashed" -eq 0 ] || { echo "fuzz: crash inputs are in $FB/crashes/ (logs in $FB/logs/)"; exit 1; }
