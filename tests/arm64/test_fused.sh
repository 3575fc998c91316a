#!/usr/bin/env bash
# No fused multiply-add anywhere, and the tests would see one:
#  - the disassembly of every object of the aarch64 build (gcc, and clang when
#    it was built) has no fmadd/fmsub/fnmadd/fnmsub/fmla/fmls, and the x86-64
#    build's none of vfmadd/vfmsub/vfnmadd/vfnmsub: -ffp-contract=off and the
#    kernels' own pragmas hold whatever the compiler would otherwise fuse;
#  - the kernel tests linked with NEON kernels built to fuse
#    (KERN_NEON_FMA_TRAP: vfmaq_f32 for every multiply-add) fail, under qemu,
#    for every kernel family.
. "$(dirname "$0")/../cli/lib.sh"
ABUILD=${ARM64_BUILD:-$TOP/build/aarch64-linux-gnu}
case $ABUILD in /*) ;; *) ABUILD="$TOP/$ABUILD";; esac
X86_BUILD=${X86_BUILD:-$TOP/build}
case $X86_BUILD in /*) ;; *) X86_BUILD="$TOP/$X86_BUILD";; esac
OBJDUMP=${OBJDUMP:-aarch64-linux-gnu-objdump}
QEMU=${QEMU:-qemu-aarch64-static}

# OBJDUMP PATTERN FILES...: the fused instructions in FILES, counted per
# object, except in kmath_expf (and its x86-64 FMA build, expf_fma, and its
# other build, kmath_expf_nofma): their 4 fma() calls are written out (one
# correctly rounded operation each, the same on every machine;
# run/kernels/kmath.c), and counted apart as "kmath_expf N": 4 where
# kmath_expf_nofma has no instruction of its own (x86-64: it calls the C
# library's fma; gcc on aarch64 folds it into a branch to kmath_expf), 8
# where the compiler keeps both copies.
fused() {
    local od=$1 pat=$2; shift 2
    "$od" -d "$@" 2>/dev/null | awk -v pat="$pat" '
        /^[^ \t].*:[ \t]+file format/ { obj = $1 }
        /^[0-9a-f]+ <[^>]+>:$/ { fn = $2 }
        $0 ~ pat { if (fn == "<kmath_expf>:" || fn == "<expf_fma>:" || fn == "<kmath_expf_nofma>:") kexp++; else n[obj]++ }
        END { for (o in n) printf "%s %d\n", o, n[o]; if (kexp) printf "kmath_expf %d\n", kexp }'
}
ARM_PAT=$'\t(fmadd|fmsub|fnmadd|fnmsub|fmla|fmls)[ \t]'
X86_PAT=$'\tvf(n)?m(add|sub)[0-9a-z]*[ \t]'
for b in "$ABUILD" "$TOP/build/aarch64-clang"; do
    [ -f "$b/libkrun.a" ] || continue
    objs=("$b"/libkrun.a "$b"/libkpack.a "$b"/libkpkformat.a "$b"/run/cli/main.o "$b"/pack/main.o)
    found=$(fused "$OBJDUMP" "$ARM_PAT" "${objs[@]}")
    n=$("$OBJDUMP" -d "${objs[@]}" | grep -cE $'\t(fadd|fmul)[ \t]')
    { [ "$found" = "kmath_expf 4" ] || [ "$found" = "kmath_expf 8" ]; } && [ "$n" -gt 0 ] \
        && ok "$(basename "$b"): no fused multiply-add in any object ($n fmul/fadd instructions) but kmath_expf's written fma() ($found)" \
        || notok "$(basename "$b"): fused multiply-adds: $found"
done
if [ -f "$X86_BUILD/libkrun.a" ]; then
    found=$(fused objdump "$X86_PAT" "$X86_BUILD"/libkrun.a "$X86_BUILD"/libkpack.a "$X86_BUILD"/libkpkformat.a)
    [ "$found" = "kmath_expf 4" ] && ok "x86-64 build: no vfmadd/vfmsub in any object but kmath_expf's 4 written fma()" \
        || notok "x86-64 build: fused multiply-adds: $found"
fi

F=$ABUILD/fmatrap
[ -x "$F/tests/test_kernels" ] && [ -x "$F/tests/test_kernels_seq" ] || { notok "the fused-NEON test build is missing (make test-arm64)"; finish; exit 1; }
n=$(fused "$OBJDUMP" "$ARM_PAT" $(find "$F" -name "*.o") | awk '{ s += $2 } END { print s + 0 }')
[ "$n" -gt 0 ] && ok "the trap build's NEON kernels fuse ($n fmla)" || notok "the trap build has no fmla: it tests nothing"
"$QEMU" "$F/tests/test_kernels" >"$T/k.out" 2>&1; rc1=$?
"$QEMU" "$F/tests/test_kernels_seq" >"$T/s.out" 2>&1; rc2=$?
[ $rc1 -ne 0 ] && [ $rc2 -ne 0 ] && ok "the kernel tests fail with fused NEON kernels ($(grep -c '^not ok' "$T/k.out") + $(grep -c '^not ok' "$T/s.out") failed checks)" \
    || notok "fused NEON kernels pass the kernel tests (exit $rc1, $rc2)"
for fam in "kdot_f32" "kdot_bf16" "kdot_f16" "kdot_mxfp4" "kmatmul f32" "kmatmul bf16" "kmatmul f16" "kmatmul mxfp4" \
           "kmatvec_t f32" "kmatvec_t bf16" "kmatvec_t f16" "neon: KDA two passes" "neon: MLA weighted sums"; do
    grep -h '^not ok' "$T/k.out" "$T/s.out" | grep -qF "$fam" && ok "caught: $fam" || notok "not caught: $fam"
done
# and the scalar level of the same binaries still passes (the trap is only in NEON)
grep -qE '^not ok - (.*\[scalar\]|scalar:)' "$T/k.out" "$T/s.out" && notok "the scalar path failed in the trap build" \
    || ok "the scalar path passes in the trap build"
finish
