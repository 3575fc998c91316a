#!/usr/bin/env bash
# Runs the fast suite (or the scripts given) and prints one summary line:
# "N passed, N failed".
#
# Every test (a unit binary in $BUILD/tests/ or a script in tests/cli/) prints
# TAP-like lines: "ok - what", "not ok - what", "skip - what (why)".  A test that
# exits non-zero counts as one more failure even if it printed no "not ok".
#
# TEST_JOBS tests run at once (default: the number of CPUs, at most 2): most of
# the suite's wall time is processes waiting (fsync, kills and restarts, servers
# starting, mpirun), so two at a time on two cores take ~60% of the serial time.
# Every test has its own directory under KPK_TEST_TMP, its own ports and files;
# TEST_JOBS=1 runs them one after another, as before.  Each test's line is
# printed when it ends, the failures' details with it.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
export BUILD BIN
export KPK_TEST_TMP=${KPK_TEST_TMP:-$(mktemp -d /tmp/kpk-test.XXXXXX)}
# The shared fixtures live next to the checkout; tests skip visibly without them.
export K3_SHARED=${K3_SHARED:-$(cd .. && pwd)/shared}
JOBS=${TEST_JOBS:-$(n=$(nproc 2>/dev/null || echo 1); [ "$n" -gt 2 ] && n=2; echo "$n")}
OUTS=$(mktemp -d "$KPK_TEST_TMP/out.XXXXXX") || exit 2

pass=0; fail=0; skip=0; failed_names=()
# run_one NAME CMD...: runs CMD, its output and status into $OUTS/NAME.{out,rc,time}
run_one() {
    local name=$1; shift
    local f="$OUTS/${name//\//_}" start end
    start=$(date +%s.%N)
    "$@" >"$f.out" 2>&1; echo $? >"$f.rc"
    end=$(date +%s.%N)
    echo "$end - $start" | bc >"$f.time"
}
# report NAME: the summary line of a test that ended, and its failures
report() {
    local name=$1 f="$OUTS/${1//\//_}" out rc p fl s
    out=$(cat "$f.out"); rc=$(cat "$f.rc" 2>/dev/null || echo 1)
    p=$(grep -c '^ok ' <<<"$out"); fl=$(grep -c '^not ok ' <<<"$out"); s=$(grep -c '^skip ' <<<"$out")
    if [ "$rc" -ne 0 ] && [ "$fl" -eq 0 ]; then fl=1; out+=$'\n'"not ok - $name exited with status $rc"; fi
    pass=$((pass + p)); fail=$((fail + fl)); skip=$((skip + s))
    printf '%-38s %4d ok %3d failed %3d skipped  %6.1fs\n' "$name" "$p" "$fl" "$s" "$(cat "$f.time" 2>/dev/null || echo 0)"
    if [ "$fl" -gt 0 ]; then
        failed_names+=("$name")
        grep -E '^(not ok|#)' <<<"$out" | head -40 | sed 's/^/    /'
        [ "$rc" -ne 0 ] && tail -20 <<<"$out" | sed 's/^/    | /'
    fi
    grep '^skip ' <<<"$out" | sed 's/^/    /'
}

names=(); cmds=()
add() { names+=("$1"); shift; cmds+=("$(printf '%q ' "$@")"); }
if [ $# -gt 0 ]; then # given scripts only (make test-root)
    for t in "$@"; do add "$(basename "$(dirname "$t")")/$(basename "$t" .sh)" bash "$t"; done
else
    for t in "$BUILD"/tests/test_*; do
        [ -x "$t" ] || continue
        case "$t" in *.d|*.o) continue;; esac
        add "unit/$(basename "$t")" "$t"
    done
    for t in tests/cli/test_*.sh; do
        [ -f "$t" ] || continue
        add "cli/$(basename "$t" .sh)" bash "$t"
    done
fi

declare -A running=()          # pid -> name
reap() {                       # waits for one test to end and reports it
    local pid=
    wait -n -p pid "${!running[@]}"
    [ -n "$pid" ] && [ -n "${running[$pid]+x}" ] || { echo "run_all.sh: lost track of a test (wait -n)" >&2; exit 2; }
    report "${running[$pid]}"
    unset "running[$pid]"
}
for i in "${!names[@]}"; do
    while [ "${#running[@]}" -ge "$JOBS" ]; do reap; done
    eval "run_one \"\${names[$i]}\" ${cmds[$i]}" &
    running[$!]=${names[$i]}
done
while [ "${#running[@]}" -gt 0 ]; do reap; done

[ -n "${KEEP_TEST_TMP:-}" ] || rm -rf "$KPK_TEST_TMP"
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
[ "$skip" -gt 0 ] && echo "$skip checks skipped (see 'skip' lines above)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
