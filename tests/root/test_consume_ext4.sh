#!/usr/bin/env bash
# `make test-root`: kpack convert --consume on real filesystems (issue 36).
# A loop-mounted ext4 holding the download, with free space for "the KPK plus
# one shard" and no more: without --consume the conversion is refused before
# it writes anything (and told that --consume fits); with it, it completes,
# identical to a conversion elsewhere, every shard deleted, and export gives
# them back.  du is sampled during the run.  A stripe member on a second
# filesystem: space is checked per filesystem (no shard is deleted there, so
# it needs its whole share).  A source on a read-only mount is refused.
# Needs root (mkfs, mount).
. "$(dirname "$0")/../cli/lib.sh"
if [ "$(id -u)" -ne 0 ]; then skip "--consume on ext4: needs root (mount)"; finish; exit 0; fi
for tool in mkfs.ext4 fallocate; do
    command -v $tool >/dev/null || { skip "--consume on ext4: $tool is missing"; finish; exit 0; }
done
PY=/usr/bin/python3
O="$T/orig"
"$BIN/k3synth" "$O" --geometry tiny --seed 43 --vision --quiet >/dev/null 2>"$T/synth.err" \
    || { notok "k3synth tiny: $(cat "$T/synth.err")"; finish; exit 1; }
"$BIN/kpack" convert "$O" "$T/ref.kpk" --quiet || { notok "reference conversion failed"; finish; exit 1; }
M="$T/m1"; M2="$T/m2"; mkdir "$M" "$M2"
mkfs() { truncate -s "$2" "$T/$1.img" && mkfs.ext4 -q -F -m 0 -b 4096 "$T/$1.img" && mount -o loop "$T/$1.img" "$3"; }
mkfs fs1 24M "$M" || { skip "--consume on ext4: cannot mount a loop device here"; finish; exit 0; }
trap 'umount "$M" "$M2" "$T/ro" 2>/dev/null' EXIT
avail() { df -B1 --output=avail "$1" | tail -1 | tr -d ' '; }
# leave exactly $2 bytes free on the filesystem of $1 (a filler file takes the rest)
leave_free() {
    rm -f "$1/filler"; sync
    local want=$2 have; have=$(avail "$1")
    [ "$have" -gt "$want" ] && fallocate -l $((have - want)) "$1/filler"
    sync
}
shard_bytes=$(du -B1 -c "$O"/model-*.safetensors | tail -1 | cut -f1)
largest=$(ls -S "$O"/model-*.safetensors | head -1); largest_bytes=$(du -B1 "$largest" | cut -f1)
kpk_bytes=$(du -B1 "$T/ref.kpk" | cut -f1)
cp -a "$O" "$M/src"
shards() { ls "$M/src" | grep -c '\.safetensors$'; }
# the filesystem holds the download (its shards) and room for the rest of "the KPK and one shard"
free=$((kpk_bytes + largest_bytes - shard_bytes))
leave_free "$M" $free
free=$(avail "$M")

expect_exit 2 "without --consume, on a disk with room for the KPK + one shard ($free bytes free)" "$BIN/kpack" convert "$M/src" "$M/x.kpk" --quiet
expect_err "not enough free space for .*x.kpk: need .* available, on the filesystem of .*With --consume .* which fits: add --consume" \
    "refused before starting, naming both figures and that --consume fits"
[ "$(shards)" = 15 ] && [ -z "$(ls "$M" | grep x.kpk)" ] && ok "nothing written, nothing deleted" || notok "leftovers: $(ls "$M")"

read base extra end < <(KPACK_TEST_DELAY_MS=3 $PY "$TOP/tests/cli/consume_check.py" peak "$M" -- \
    "$BIN/kpack" convert "$M/src" "$M/x.kpk" --consume --quiet)
if cmp -s "$M/x.kpk" "$T/ref.kpk" && [ "$(shards)" = 0 ] && "$BIN/kpack" verify "$M/x.kpk" --quiet >/dev/null; then
    ok "with --consume it completes in the same space, identical, every shard deleted (du sampled: $extra bytes at most beyond the download, $free were free)"
else
    notok "--consume on the small filesystem: extra $extra, free $free: $(ls "$M" "$M/src")"
fi
rm -rf "$T/exp"
"$BIN/kpack" export "$M/x.kpk" "$T/exp" --quiet >/dev/null 2>&1 && diff -r "$O" "$T/exp" >/dev/null \
    && ok "export gives back every deleted shard, bit for bit" || notok "export differs"

# a stripe member on a second filesystem: it gets no credit, the first needs only its peak
mkfs fs2 16M "$M2" || { notok "cannot mount the second filesystem"; finish; exit 1; }
rm -rf "$M/src" "$M/x.kpk"
"$BIN/kpack" convert "$O" "$M/x.kpk" --stripe "$M2" --stripe-unit 16K --quiet && mkdir "$T/setref" \
    && mv "$M/x.kpk" "$M2/x.kpk.s0" "$T/setref/" || { notok "set reference"; finish; exit 1; }
share=$(du -B1 "$T/setref/x.kpk.s0" | cut -f1)
cp -a "$O" "$M/src"
leave_free "$M" $((kpk_bytes + largest_bytes - shard_bytes))
leave_free "$M2" $((share - 65536))
expect_exit 2 "--consume with the stripe member's filesystem 64 KiB short of its share" \
    "$BIN/kpack" convert "$M/src" "$M/x.kpk" --stripe "$M2" --stripe-unit 16K --consume --quiet
expect_err "not enough free space for .*m2/x.kpk.s0 with --consume .*on the filesystem of .*m2" "refused, naming the second filesystem"
[ "$(shards)" = 15 ] && ok "nothing deleted" || notok "shards deleted: $(shards)"
leave_free "$M2" $((share + 65536))
"$BIN/kpack" convert "$M/src" "$M/x.kpk" --stripe "$M2" --stripe-unit 16K --consume --quiet 2>"$T/set.err"
if [ $? -eq 0 ] && cmp -s "$M/x.kpk" "$T/setref/x.kpk" && cmp -s "$M2/x.kpk.s0" "$T/setref/x.kpk.s0" && [ "$(shards)" = 0 ]; then
    ok "with room for its share there, a set across two filesystems converts with --consume: identical"
else notok "set across filesystems: $(cat "$T/set.err")"; fi

# a source on a read-only mount
mkdir "$T/ro" "$T/src2" && cp -a "$O/." "$T/src2/"
if mount --bind "$T/src2" "$T/ro" && mount -o remount,ro,bind "$T/ro"; then
    expect_exit 2 "--consume of a source on a read-only mount" "$BIN/kpack" convert "$T/ro" "$T/y.kpk" --consume --quiet
    expect_err "is on a read-only filesystem \(ext4, mounted read-only" "refused, saying why"
    [ ! -e "$T/y.kpk.partial" ] && ok "nothing written" || notok "a partial file was written"
    umount "$T/ro"
else
    skip "read-only source: cannot bind-mount read-only here"
fi
umount "$M" "$M2"; trap - EXIT
finish
