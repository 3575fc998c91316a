#!/usr/bin/env bash
# make test-arm64 / make test-arm64-full: the aarch64 build (make
# CROSS=aarch64-linux-gnu-, in $ARM64_BUILD) run under qemu-aarch64-static,
# through the wrappers of tests/arm64/wrap.sh, by tests/run_all.sh.
#   tests/arm64/run.sh        the CI subset (the list below)
#   tests/arm64/run.sh full   every unit and CLI test, then tests/arm64/
# Only correctness means anything under emulation: no test here times anything.
set -u
cd "$(dirname "$0")/../.."
ABUILD=${ARM64_BUILD:-build/aarch64-linux-gnu}
# qemu's own memory counts in every RSS: the RSS-bound checks skip (tests/cli/lib.sh)
export KPK_EMULATED=1
W=$ABUILD/qemu
tests/arm64/wrap.sh "$ABUILD" "$W" || exit 2
W=$(cd "$W" && pwd)
export ARM64_BUILD=$ABUILD X86_BUILD=${X86_BUILD:-build} X86_BIN=${X86_BIN:-bin}
# The x86-64 tools the comparisons run must be this source's (make all).
[ -x "$X86_BIN/krun" ] || { echo "arm64: $X86_BIN/krun is missing (make all)"; exit 2; }

units=("$W"/tests/test_*)
if [ "${1:-}" = full ]; then
    scripts=(tests/cli/test_*.sh tests/arm64/test_*.sh)
    export KPK_SLOW=20 # the tests' timeouts (a terminal session's waits) were set for native speed
    # the clang build's unit tests too (test_fused checks its objects)
    if [ -n "${ARM64_CLANG:-}" ] && [ -x "$ARM64_CLANG/tests/test_kernels" ]; then
        tests/arm64/wrap.sh "$ARM64_CLANG" "$ARM64_CLANG/qemu" || exit 2
        units+=("$(cd "$ARM64_CLANG/qemu" && pwd)"/tests/test_*)
    fi
else
    # The subset CI runs (a few minutes on 2 cores): every unit test, the
    # fused-kernel trap and the disassembly, x86-64 == aarch64 bits, the libm
    # agreement, 16 and 64 KiB pages, the PyTorch oracle, and the numpy
    # reference on test_krun_ref's geometries (its ablations run in the x86
    # suite: the same code).
    scripts=(tests/arm64/test_fused.sh tests/arm64/test_same_bits.sh tests/arm64/test_libm.sh tests/arm64/test_pages.sh
             tests/cli/test_krun_oracle.sh tests/cli/test_krun_ref.sh)
    export KPK_NO_ABLATIONS=1
fi
start=$(date +%s)
BUILD=$W BIN=$W/bin tests/run_all.sh "${units[@]}" "${scripts[@]}"; rc=$?
echo "arm64 (emulated, ${1:-subset}): $(( $(date +%s) - start )) s"
exit $rc
