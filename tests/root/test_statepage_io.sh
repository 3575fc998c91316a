#!/usr/bin/env bash
# `make test-root`: the states' paging never waits for its own writes (issue 34.15; statepage.h).
# krun batch --io direct --state-dir with the state directory on a loop-mounted ext4 whose writes
# are throttled for krun's cgroup (blkio write_bps_device, v1; io.max wbps, v2) to 128 kB/s: a disk
# that takes its time with krun's writes, as one busy with other readers does (mq-deadline serves
# reads first).  States written with O_DIRECT (before) made the forward pass wait for each one: the
# job waited at least as long as the disk took for them (24.6 s of 26 s needed).  Written through
# the page cache with the write-back started at once, the forward pass does not wait for the disk:
# its waits stay under half what the throttled disk needs for the bytes written, and OUT is the
# same bytes as a run on an unthrottled disk.  Needs root (mount, cgroups).
. "$(dirname "$0")/../cli/lib.sh"
if [ "$(id -u)" -ne 0 ]; then skip "states paged beside a slow disk: needs root (mount, cgroups)"; finish; exit 0; fi
command -v mkfs.ext4 >/dev/null || { skip "states paged beside a slow disk: mkfs.ext4 is missing"; finish; exit 0; }
RATE=131072
TOK="$K3_SHARED/fixtures/tokenizer/tiktoken.model"
if [ -f "$TOK" ]; then SYNTH=(--geometry tiny --layers 3 --experts 4 --topk 2 --tokenizer "$TOK"); KIND=chat
else SYNTH=(--geometry tiny); KIND=plain; fi
"$BIN/k3synth" "$T/m" "${SYNTH[@]}" --seed 2 --quiet >/dev/null 2>"$T/err" && "$BIN/kpack" convert "$T/m" "$T/m.kpk" --quiet \
    || { notok "the model: $(cat "$T/err")"; finish; exit 1; }
rm -rf "$T/m"
python3 "$TOP/tests/cli/batch_tool.py" make "$T/in.jsonl" $KIND
M="$T/mnt"; mkdir "$M"
truncate -s 64M "$T/fs.img" && mkfs.ext4 -q -F -m 0 "$T/fs.img" && mount -o loop "$T/fs.img" "$M" \
    || { skip "states paged beside a slow disk: cannot mount a loop device here"; finish; exit 0; }
CG=
cleanup() { umount "$M" 2>/dev/null; [ -n "$CG" ] && rmdir "$CG" 2>/dev/null; }
trap cleanup EXIT
dev=$(lsblk -no MAJ:MIN "$(findmnt -n -o SOURCE "$M")" | tr -d ' ')
if [ -d /sys/fs/cgroup/blkio ] && [ -w /sys/fs/cgroup/blkio ]; then
    CG=/sys/fs/cgroup/blkio/kpk-test-$$-$RANDOM
    mkdir "$CG" && echo "$dev $RATE" >"$CG/blkio.throttle.write_bps_device" || CG=
elif [ -e /sys/fs/cgroup/cgroup.controllers ] && grep -qw io /sys/fs/cgroup/cgroup.controllers && [ -w /sys/fs/cgroup ]; then
    CG=/sys/fs/cgroup/kpk-test-$$-$RANDOM
    mkdir "$CG" && echo "$dev wbps=$RATE" >"$CG/io.max" || CG=
fi
[ -n "$CG" ] || { skip "states paged beside a slow disk: no writable blkio (v1) or io (v2) cgroup here"; finish; exit 0; }

RUN=(batch "$T/m.kpk" "$T/in.jsonl")
ARGS=(--ctx 512 --seed 9 --created 1000 --max-seqs 4 --mem 200M --io direct --json --quiet)
"$BIN/krun" "${RUN[@]}" "$T/ref.jsonl" "${ARGS[@]}" --state-dir "$T/sd" >"$T/ref.json" 2>"$T/err" \
    || { notok "the unthrottled run: $(head -c 300 "$T/err")"; finish; exit 1; }
(echo $BASHPID >"$CG/cgroup.procs" && exec "$BIN/krun" "${RUN[@]}" "$T/slow.jsonl" "${ARGS[@]}" --state-dir "$M/sd") >"$T/slow.json" 2>"$T/err"; rc=$?
if [ $rc -ne 0 ]; then
    notok "the run beside a slow disk: exit $rc: $(head -c 300 "$T/err")"
else
    cmp -s "$T/ref.jsonl" "$T/slow.jsonl" && ok "states on a disk that writes krun's bytes at 128 kB/s: OUT byte-identical" \
        || notok "OUT differs on the slow disk"
    python3 - "$T/slow.json" "$RATE" <<'PY' && ok "  the forward passes did not wait for the disk: $(cat "$T/why")" || notok "  waited for the disk: $(cat "$T/why")"
import json, sys, os
j, rate = json.load(open(sys.argv[1])), int(sys.argv[2])
need = j["state_bytes_written"] / rate
why = "%.1f s waiting for the state file, %.2f MB written, which the disk takes %.1f s for at least (job %.1f s)" % (
    j["state_wait_seconds"], j["state_bytes_written"] / 1e6, need, j["seconds"])
open(os.path.join(os.path.dirname(sys.argv[1]), "why"), "w").write(why)
assert need > 8, why           # enough bytes that waiting for them would show
assert j["state_wait_seconds"] < need / 2, why
PY
fi
cleanup; trap - EXIT
finish
