#!/usr/bin/env bash
# Runs the fast suite (or the scripts given) and prints one summary line:
# "N passed, N failed".
#
# Every test (a unit binary in $BUILD/tests/ or a script in tests/cli/) prints
# TAP-like lines: "ok - what", "not ok - what", "skip - what (why)".  A test that
# exits non-zero counts as one more failure even if it printed no "not ok".
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
export BUILD BIN
export KPK_TEST_TMP=${KPK_TEST_TMP:-$(mktemp -d /tmp/kpk-test.XXXXXX)}
# The shared fixtures live next to the checkout; tests skip visibly without them.
export K3_SHARED=${K3_SHARED:-$(cd .. && pwd)/shared}

pass=0; fail=0; skip=0; failed_names=()
run_one() {
    local name=$1; shift
    local out rc start end
    start=$(date +%s.%N)
    out=$("$@" 2>&1); rc=$?
    end=$(date +%s.%N)
    local p f s
    p=$(grep -c '^ok ' <<<"$out"); f=$(grep -c '^not ok ' <<<"$out"); s=$(grep -c '^skip ' <<<"$out")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; out+=$'\n'"not ok - $name exited with status $rc"; fi
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
    printf '%-38s %4d ok %3d failed %3d skipped  %6.1fs\n' "$name" "$p" "$f" "$s" "$(echo "$end - $start" | bc)"
    if [ "$f" -gt 0 ]; then
        failed_names+=("$name")
        grep -E '^(not ok|#)' <<<"$out" | head -40 | sed 's/^/    /'
        [ "$rc" -ne 0 ] && tail -20 <<<"$out" | sed 's/^/    | /'
    fi
    grep '^skip ' <<<"$out" | sed 's/^/    /'
}

if [ $# -gt 0 ]; then # given scripts only (make test-root)
    for t in "$@"; do run_one "$(basename "$(dirname "$t")")/$(basename "$t" .sh)" bash "$t"; done
else
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.d|*.o) continue;; esac
    run_one "unit/$(basename "$t")" "$t"
done
for t in tests/cli/test_*.sh; do
    [ -f "$t" ] || continue
    run_one "cli/$(basename "$t" .sh)" bash "$t"
done
fi

[ -n "${KEEP_TEST_TMP:-}" ] || rm -rf "$KPK_TEST_TMP"
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
[ "$skip" -gt 0 ] && echo "$skip checks skipped (see 'skip' lines above)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
