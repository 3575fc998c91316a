#!/usr/bin/env bash
# `make test-root`: out of space on a real filesystem (issue 12.1).  A
# conversion into a small loop-mounted ext4 runs out of space when a filler
# file takes the rest of the disk mid-write; then part of the space is freed
# (less than the whole output, more than what is left to write) and the rerun
# completes to the identical file.  Needs root (mkfs, mount).
. "$(dirname "$0")/../cli/lib.sh"
if [ "$(id -u)" -ne 0 ]; then skip "out of space on ext4: needs root (mount)"; finish; exit 0; fi
for tool in mkfs.ext4 fallocate; do
    command -v $tool >/dev/null || { skip "out of space on ext4: $tool is missing"; finish; exit 0; }
done
"$BIN/k3synth" "$T/src" --geometry tiny --shards 3 --seed 41 --quiet >/dev/null 2>"$T/synth.err" \
    || { notok "k3synth tiny: $(cat "$T/synth.err")"; finish; exit 1; }
"$BIN/kpack" convert "$T/src" "$T/ref.kpk" --quiet || { notok "reference conversion failed"; finish; exit 1; }
size=$(stat -c %s "$T/ref.kpk")
M="$T/mnt"; mkdir "$M"
truncate -s 32M "$T/fs.img" && mkfs.ext4 -q -F -m 0 "$T/fs.img" && mount -o loop "$T/fs.img" "$M" \
    || { skip "out of space on ext4: cannot mount a loop device here"; finish; exit 0; }
trap 'umount "$M" 2>/dev/null' EXIT
avail() { df -B1 --output=avail "$M" | tail -1 | tr -d ' '; }
held() { echo $(( $(stat -c '%b * %B' "$M/x.kpk.partial") )); }

# The conversion starts with room enough; the filler takes the rest once it has written half.
KPACK_TEST_DELAY_MS=25 "$BIN/kpack" convert "$T/src" "$M/x.kpk" --quiet 2>"$T/full.err" &
pid=$!
for _ in $(seq 400); do [ -f "$M/x.kpk.partial" ] && [ "$(held)" -ge $((size / 2)) ] && break; sleep 0.02; done
fallocate -l "$(avail)" "$M/filler" 2>/dev/null
while [ "$(avail)" -gt 0 ] && fallocate -o "$(stat -c %s "$M/filler")" -l 4096 "$M/filler" 2>/dev/null; do :; done
wait $pid; rc=$?
if [ $rc -eq 2 ] && grep -q "No space left on device" "$T/full.err" && [ ! -e "$M/x.kpk" ]; then
    ok "ext4 full mid-conversion: exit 2, ENOSPC named, nothing published ($(held) of $size bytes held)"
else
    notok "ext4 full: rc $rc: $(cat "$T/full.err")"; finish; exit 1
fi

# Free less than the whole output needs, but more than what is left to write.
h=$(held)
want=$((size - h + (1 << 20)))
[ "$want" -lt "$size" ] || { notok "the partial file holds too little ($h bytes) to show the point"; finish; exit 1; }
truncate -s $(( $(stat -c %s "$M/filler") - want + $(avail) )) "$M/filler"
free=$(avail)
"$BIN/kpack" convert "$T/src" "$M/x.kpk" --quiet 2>"$T/resume.err"; rc=$?
if [ $rc -eq 0 ] && cmp -s "$M/x.kpk" "$T/ref.kpk" && "$BIN/kpack" verify "$M/x.kpk" --quiet >/dev/null; then
    ok "with $free bytes free for a $size-byte file, the rerun reuses the $h bytes held and completes identical"
else
    notok "rerun with $free bytes free ($h held, $size needed): rc $rc: $(cat "$T/resume.err")"
fi
umount "$M"; trap - EXIT
finish
