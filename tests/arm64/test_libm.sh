#!/usr/bin/env bash
# krun's own kmath_expf and kmath_tanhf, and the C library's exp (the one
# transcendental krun still takes from it), give the same bits on x86-64 and
# aarch64: tests/arm64/libm_probe.c built for both, the aarch64 one (under
# qemu) comparing with the x86-64 output.
. "$(dirname "$0")/../cli/lib.sh"
X86_PROBE=${X86_BUILD:-$TOP/build}/tests/libm_probe
case $X86_PROBE in /*) ;; *) X86_PROBE="$TOP/$X86_PROBE";; esac
[ -x "$X86_PROBE" ] && [ -x "$BUILD/tests/libm_probe" ] || { notok "libm_probe is not built for both architectures (make test-arm64)"; finish; exit 1; }
"$X86_PROBE" write "$T/x86.bin" || { notok "the x86-64 libm_probe failed"; finish; exit 1; }
"$BUILD/tests/libm_probe" compare "$T/x86.bin" || FAILS=$((FAILS + 1))
finish
