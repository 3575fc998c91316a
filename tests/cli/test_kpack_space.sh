#!/usr/bin/env bash
# Out of space, then "rerun the same command to resume" (issue 12.1): the
# rerun counts the blocks the partial file already holds, which it rewrites,
# as space it has.  The disk fills mid-write (the fault shim makes the N-th
# write of the partial file fail with ENOSPC), space is freed (the test's
# free-space figure), the rerun completes to the identical file.  The real
# filesystem version (loop-mounted ext4 and a filler file) is in
# tests/root/, run by `make test-root`.
. "$(dirname "$0")/lib.sh"
need_shim

"$BIN/k3synth" "$T/src" --geometry tiny --shards 3 --seed 31 --quiet >/dev/null 2>"$T/synth.err" \
    || { notok "k3synth tiny: $(cat "$T/synth.err")"; finish; exit 1; }
"$BIN/kpack" convert "$T/src" "$T/ref.kpk" --quiet || { notok "reference conversion failed"; finish; exit 1; }
size=$(stat -c %s "$T/ref.kpk")
clean() { rm -f "$T"/x.kpk "$T"/x.kpk.partial "$T"/x.kpk.journal "$T"/x.kpk.lock "$T/fault.log"; }
fill_disk() { # fill_disk SYNC_BYTES: the 80th write of the partial file finds the disk full
    KPACK_SYNC_BYTES=$1 KFAULT_CALLS=pwrite KFAULT_NTH=80 KFAULT_COUNT=0 KFAULT_ERR=ENOSPC KFAULT_PATH='*/x.kpk.partial' \
        KFAULT_LOG="$T/fault.log" LD_PRELOAD="$SHIM" "$BIN/kpack" convert "$T/src" "$T/x.kpk" --quiet 2>"$T/full.err"
}
alloc() { echo $(( $(stat -c '%b * %B' "$T/x.kpk.partial") )); }

for sync in default 1; do
    clean
    if [ $sync = default ]; then fill_disk $((1 << 30)); else fill_disk 1; fi
    rc=$?
    if [ $rc -eq 2 ] && grep -q "No space left on device" "$T/full.err" && grep -q "rerun the same command to resume" "$T/full.err" \
        && [ -s "$T/fault.log" ] && [ ! -e "$T/x.kpk" ]; then ok "disk full mid-write (journal sync $sync): exit 2, ENOSPC named, nothing published"
    else notok "disk full (sync $sync): rc $rc, $(cat "$T/full.err") $(cat "$T/fault.log" 2>/dev/null)"; continue; fi
    held=$(alloc)
    # less free space than the whole file, but enough with what the partial holds
    KPACK_TEST_FREE_BYTES=$((size - held + 65536)) "$BIN/kpack" convert "$T/src" "$T/x.kpk" --quiet 2>"$T/resume.err"
    rc=$?
    if [ $rc -eq 0 ] && cmp -s "$T/x.kpk" "$T/ref.kpk"; then
        ok "after space is freed, the rerun counts the $held bytes the partial file holds and completes identical (sync $sync)"
    else notok "rerun after ENOSPC (sync $sync, $held bytes held, $((size - held + 65536)) free): rc $rc: $(cat "$T/resume.err")"; fi
done

# The check still refuses what cannot fit, naming both figures and the reuse.
clean
fill_disk $((1 << 30))
held=$(alloc)
KPACK_TEST_FREE_BYTES=$((size - held - (1 << 20))) expect_exit 2 "a rerun 1 MiB short of space is still refused" \
    "$BIN/kpack" convert "$T/src" "$T/x.kpk" --quiet
expect_err "not enough free space for .*x.kpk: need .* available plus .* \($held bytes\) that .*x.kpk.partial holds and this run rewrites" \
    "the message counts the partial file's $held bytes"
[ -e "$T/x.kpk.partial" ] && ok "the partial file is kept for a later rerun" || notok "the partial file was removed"
clean
finish
