# Shared helpers for the CLI tests (sourced, not run).  Each check prints one
# TAP-like line for tests/run_all.sh.
set -u
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${BIN:-bin}
case "$BIN" in /*) ;; *) BIN="$TOP/$BIN";; esac
K3_SHARED=${K3_SHARED:-$TOP/../shared}
T=$(mktemp -d "${KPK_TEST_TMP:-/tmp}/cli.XXXXXX")
FAILS=0
# Why the memory of a process under test is not krun's alone, when it is not:
# the RSS and address-space checks skip then.
NOT_KRUNS_MEMORY=""
[ -n "${KPK_SANITIZED:-}" ] && NOT_KRUNS_MEMORY="sanitizer builds carry shadow memory"
[ -n "${KPK_EMULATED:-}" ] && NOT_KRUNS_MEMORY="the build runs under an emulator, whose own memory counts"
ok()     { echo "ok - $*"; }
notok()  { echo "not ok - $*"; FAILS=$((FAILS + 1)); }
skip()   { echo "skip - $*"; }
check()  { local what=$1; shift; if "$@" >/dev/null 2>&1; then ok "$what"; else notok "$what"; fi; }
# expect_exit CODE WHAT CMD...: the command exits with CODE.  Its stderr is kept
# in $T/last.err for message checks.
expect_exit() {
    local code=$1 what=$2; shift 2
    "$@" >"$T/last.out" 2>"$T/last.err"; local rc=$?
    if [ "$rc" -eq "$code" ]; then ok "$what (exit $rc)"; else notok "$what: exit $rc, wanted $code: $(head -c 300 "$T/last.err")"; fi
}
# expect_err PATTERN WHAT: the last command's stderr matches PATTERN (grep -E).
expect_err() {
    if grep -qE -- "$1" "$T/last.err"; then ok "$2"; else notok "$2: stderr was: $(head -c 300 "$T/last.err")"; fi
}
finish() { rm -rf "$T"; [ "$FAILS" -eq 0 ]; }

# same_bits KPK LABEL ARGS...: krun on KPK with $IDS / $GEN and ARGS gives the
# generated ids and every logit bit of the reference run ($T/ref.json, $T/ref.bin).
same_bits() {
    local kpk=$1 label=$2; shift 2
    if "$BIN/krun" "$kpk" --ids $IDS --gen $GEN --dump-all-logits "$T/x.bin" --json "$T/x.json" --quiet "$@" >/dev/null 2>"$T/x.err" \
        && cmp -s "$T/ref.bin" "$T/x.bin" \
        && python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["generated_ids"]==json.load(open(sys.argv[2]))["generated_ids"]' "$T/ref.json" "$T/x.json"; then
        ok "identical ids and logits bits: $label"
    else
        notok "results differ: $label: $(head -c 300 "$T/x.err")"
    fi
}

# need_shim: $SHIM is the fault-injection shim (tests/fault/kfault.c) of this
# build, or the test stops.  A sanitized binary must let it be preloaded
# ahead of the sanitizer runtime.
need_shim() {
    SHIM=${BUILD:-build}/tests/libkfault.so
    case $SHIM in /*) ;; *) SHIM="$TOP/$SHIM";; esac
    [ -f "$SHIM" ] || { notok "fault shim $SHIM not built (make unit)"; finish; exit 1; }
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
}

# MPI: the mpirun command of the tests (ranks on this machine, root allowed).  In a sanitizer
# build the ranks get the sanitizer's options: Open MPI never frees what MPI_Init allocates for itself
# and its plugins (unloaded before the leak check, so a fast unwinder names no frame of theirs), so
# those leaks are suppressed by library and entry point (tests/cli/openmpi.supp) with full
# unwinding, which names them; a leak of krun's own is still reported.
# MPI_ENV is those options alone, for each further app context of an MPMD line (`A : B`).
MPI_ENV=()
if [ -n "${KPK_SANITIZED:-}" ]; then
    # (verify_asan_link_order=0: the MPI fault shim is preloaded ahead of the runtime, as need_shim's)
    MPI_ENV=(-x "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0:verify_asan_link_order=0"
             -x "LSAN_OPTIONS=${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$TOP/tests/cli/openmpi.supp:print_suppressions=0")
fi
MPI=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && MPI+=(--allow-run-as-root)
MPI+=(${MPI_ENV[@]+"${MPI_ENV[@]}"})

# corrupt_experts IN.kpk OUT.kpk: a copy of IN with one bit flipped inside every routed expert
# extent, so whichever expert is routed to first is damaged.
corrupt_experts() {
    python3 - "$1" "$2" <<'PY'
import struct, sys
d = bytearray(open(sys.argv[1], "rb").read())
ext_off, ext_n = struct.unpack_from("<QQ", d, 56)
for i in range(ext_n):
    kind, codec, member, layer, expert = struct.unpack_from("<BBHII", d, ext_off + 64 * i)
    off, stored = struct.unpack_from("<QQ", d, ext_off + 64 * i + 16)
    if kind == 4:
        d[off + stored // 3] ^= 0x40
open(sys.argv[2], "wb").write(d)
PY
}

# cg_run LIMIT CMD...: run CMD in a fresh memory cgroup (v1 or v2) limited to LIMIT bytes, swap
# off; its exit status, or 99 when no writable memory cgroup is here.
cg_run() {
    local limit=$1; shift
    local v1=/sys/fs/cgroup/memory v2=/sys/fs/cgroup d rc
    if [ -d "$v1" ] && [ -w "$v1" ]; then
        d="$v1/kpk-test-$$-$RANDOM"; mkdir "$d" || return 99
        echo "$limit" > "$d/memory.limit_in_bytes" || { rmdir "$d"; return 99; }
        [ -e "$d/memory.memsw.limit_in_bytes" ] && echo "$limit" > "$d/memory.memsw.limit_in_bytes" 2>/dev/null
        echo 0 > "$d/memory.swappiness" 2>/dev/null
        (echo $BASHPID > "$d/cgroup.procs" && exec "$@"); rc=$?
        rmdir "$d" 2>/dev/null
        return $rc
    elif [ -e "$v2/cgroup.controllers" ] && grep -qw memory "$v2/cgroup.controllers" && [ -w "$v2" ]; then
        d="$v2/kpk-test-$$-$RANDOM"; mkdir "$d" || return 99
        echo "$limit" > "$d/memory.max" || { rmdir "$d"; return 99; }
        echo 0 > "$d/memory.swap.max" 2>/dev/null
        (echo $BASHPID > "$d/cgroup.procs" && exec "$@"); rc=$?
        rmdir "$d" 2>/dev/null
        return $rc
    fi
    return 99
}

# same_as_one_go KPK JSONL TURN [ARGS]: in a krun chat --json JSONL, the reply of TURN (1-based)
# == krun on the whole history before it at once
same_as_one_go() {
    python3 - "$BIN/krun" "$@" <<'PY'
import json, subprocess, sys
krun, kpk, jl, turn = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
extra = sys.argv[5:]
t = [json.loads(l) for l in open(jl)]
hist = []
for x in t[:turn - 1]:
    hist += x["fed_ids"] + x["reply_ids"][:-1]      # the last reply token is run with the next turn (fed_ids[0])
hist += t[turn - 1]["fed_ids"]
want = t[turn - 1]["reply_ids"]
out = subprocess.run([krun, kpk, "--ids", ",".join(map(str, hist)), "--gen", str(len(want)), "--print-ids", "--quiet", "--ignore-eos"] + extra,
                     capture_output=True, text=True, check=True).stdout.split()
assert [int(x) for x in out] == want, (out, want)
PY
}
