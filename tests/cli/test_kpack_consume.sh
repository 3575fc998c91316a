#!/usr/bin/env bash
# kpack convert --consume (issue 36): each source shard deleted once what the
# KPK needs of it is durable.  On a tiny checkpoint whose third shard also has
# gap bytes, __metadata__, a non-text tensor and bytes after its last tensor
# (so its archive part is staged through the consume log): the KPK is
# byte-identical to a plain conversion; every deletion traced (the fault
# shim's I/O trace) against the journal and the syncs; a kill just before and
# just after each deletion, and a few at random, resume to the identical file;
# export rebuilds every consumed file with its original SHA-256; a damaged
# partial file stops the deletion, and so does a bit flipped on a read of the
# source (with --sha256); a deletion the filesystem refuses midway; a kill
# after OUT is published, before its log is removed; a resume that would need a deleted shard
# stops and says what to put back; the rails (a Hugging Face snapshot without
# --consume-blobs, links, hard links, permissions, OUT on a source file);
# confirmation on a terminal; the free-space check with its peak, and du
# sampled during the run against it; stripe sets, a trunk member, compressed
# blocks.  The loop-mounted filesystem version is tests/root/.
. "$(dirname "$0")/lib.sh"
need_shim
PY=/usr/bin/python3
CHK="$PY $TOP/tests/cli/consume_check.py"
O="$T/orig"

"$BIN/k3synth" "$O" --geometry tiny --seed 36 --vision --quiet >/dev/null 2>"$T/synth.err" \
    || { notok "k3synth tiny: $(cat "$T/synth.err")"; finish; exit 1; }
$PY - "$O" <<'PY'
import json, os, struct, sys
d = sys.argv[1]
p = os.path.join(d, "model-00003-of-000015.safetensors")
b = open(p, "rb").read()
n = struct.unpack_from("<Q", b, 0)[0]
hdr, data = json.loads(b[8:8 + n]), b[8 + n:]
names = sorted((k for k in hdr if k != "__metadata__"), key=lambda k: hdr[k]["data_offsets"][0])
out, new = bytearray(b"GAP-BEFORE"), {"__metadata__": {"format": "pt"}}
for i, k in enumerate(names):
    a, e = hdr[k]["data_offsets"]
    if i == len(names) // 2:
        out += bytes(range(37))
    new[k] = dict(hdr[k], data_offsets=[len(out), len(out) + e - a])
    out += data[a:e]
new["vision_tower.consume_test.weight"] = {"dtype": "BF16", "shape": [8, 4], "data_offsets": [len(out), len(out) + 64]}
out += bytes((i * 7) & 255 for i in range(64)) + b"TAIL"
js = json.dumps(new, separators=(",", ":")).encode()
js += b" " * (-len(js) % 8)
open(p, "wb").write(struct.pack("<Q", len(js)) + js + out)
ip = os.path.join(d, "model.safetensors.index.json")
idx = json.load(open(ip))
idx["weight_map"]["vision_tower.consume_test.weight"] = "model-00003-of-000015.safetensors"
json.dump(idx, open(ip, "w"), indent=2)
PY
(cd "$O" && find . -type f -printf '%P\n' | sort | xargs sha256sum) > "$T/SUMS"
"$BIN/kpack" convert "$O" "$T/ref.kpk" --quiet && "$BIN/kpack" convert "$O" "$T/refs.kpk" --sha256 "$T/SUMS" --quiet \
    || { notok "reference conversions failed"; finish; exit 1; }
IDX="$O/model.safetensors.index.json"
S="$T/src"
X="$T/x.kpk"
fresh() { rm -rf "$S" "$X" "$X".* "$T"/e?/x.kpk.* "$T/exp"; cp -a "$O" "$S"; }
shards() { ls "$S" | grep -c '\.safetensors$'; }
leftovers() { ls "$X".* 2>/dev/null | tr '\n' ' '; }
exported_same() { # exported_same LABEL: export X, every file of the download back with its original SHA-256
    rm -rf "$T/exp"
    if "$BIN/kpack" export "$X" "$T/exp" --quiet >/dev/null 2>"$T/exp.err" && (cd "$T/exp" && sha256sum -c --quiet "$T/SUMS") \
        && diff -r "$O" "$T/exp" >/dev/null; then ok "$1: export gives back every consumed shard with its original SHA-256, and every other file"
    else notok "$1: export: $(head -c 300 "$T/exp.err")"; fi
}

# ---- a consuming conversion --------------------------------------------------------
fresh
expect_exit 0 "convert --consume" "$BIN/kpack" convert "$S" "$X" --consume --json
cmp -s "$X" "$T/ref.kpk" && ok "the KPK is byte-identical to a conversion without --consume" || notok "the KPK differs"
[ "$(shards)" = 0 ] && [ -e "$S/config.json" ] && [ -e "$IDX" ] && [ -z "$(leftovers)" ] \
    && ok "every shard deleted; the small files kept; no partial, journal, lock or consume log left" \
    || notok "after --consume: $(ls "$S" | tr '\n' ' ') / $(leftovers)"
$PY -c 'import json,sys; c=json.load(open(sys.argv[1]))["consume"]; assert c["deleted"]==c["shards"]==15 and c["deleted_by_this_run"]==15 and c["bytes_freed"]>=3700000, c' "$T/last.out" \
    && ok "--json reports the 15 shards deleted and the bytes freed" || notok "--json: $(head -c 400 "$T/last.out")"
exported_same "no SHA-256 known"
fresh
expect_exit 0 "convert --consume --sha256 (each shard rebuilt from the output and its SHA-256 compared before it goes)" \
    "$BIN/kpack" convert "$S" "$X" --consume --sha256 "$T/SUMS"
cmp -s "$X" "$T/refs.kpk" && grep -q 'deleted the 15 shards of .* freed' "$T/last.err" \
    && ok "identical to a plain --sha256 conversion; the summary says what was freed" || notok "--sha256: $(cat "$T/last.err")"
"$BIN/kpack" export "$X" --check >"$T/check.out" 2>&1 && grep -q "You may delete" "$T/check.out" \
    && ok "export --check: every consumed file rebuilds with its recorded SHA-256" || notok "export --check: $(tail -3 "$T/check.out")"
exported_same "--sha256"

# ---- every deletion traced against the journal and the syncs ----------------------------
fresh
KFAULT_TRACE="$T/trace" KFAULT_PATH="$T*" LD_PRELOAD="$SHIM" "$BIN/kpack" convert "$S" "$X" --consume --quiet 2>"$T/tr.err"
if [ $? -eq 0 ] && $CHK trace "$T/ref.kpk" "$IDX" "$T/trace" "$T" >"$T/tr.out" && cmp -s "$X" "$T/ref.kpk"; then
    ok "trace: $(tail -1 "$T/tr.out") (each after the journal's record of its last extent and every write was synced, before any later extent)"
else notok "trace: $(cat "$T/tr.out" "$T/tr.err" | head -12)"; fi

# ---- killed just before, and just after, each deletion --------------------------------
bad=0; k=0
for k in $(seq 1 15); do
    fresh
    KFAULT_CALLS=unlink KFAULT_NTH=$k KFAULT_ERR=KILL KFAULT_PATH='*.safetensors' KFAULT_LOG="$T/kill.log" LD_PRELOAD="$SHIM" \
        "$BIN/kpack" convert "$S" "$X" --consume --quiet 2>/dev/null
    rc=$?
    victim=$(sed -n 's/.*unlink #[0-9]* on \(.*\): SIGKILL/\1/p' "$T/kill.log" | tail -1); rm -f "$T/kill.log"
    if [ $rc -ne 137 ] || [ ! -e "$victim" ] || [ "$(shards)" -ne $((16 - k)) ] \
        || ! $CHK killed "$T/ref.kpk" "$IDX" "$X" "$(basename "$victim")" >"$T/k.out"; then
        notok "killed before deletion $k: rc $rc, $victim, $(shards) shards, $(cat "$T/k.out")"; bad=1; continue
    fi
    "$BIN/kpack" convert "$S" "$X" --consume --quiet 2>"$T/k.err"
    if [ $? -ne 0 ] || ! cmp -s "$X" "$T/ref.kpk" || [ "$(shards)" -ne 0 ] || [ -n "$(leftovers)" ]; then
        notok "rerun after the kill before deletion $k: $(cat "$T/k.err")"; bad=1
    fi
done
[ $bad = 0 ] && ok "killed just before each of the 15 deletions: the shard still there, its extents journaled and identical to the reference, its record logged; the rerun deletes it and finishes identical"
bad=0
for k in 1 2 8 15; do
    fresh
    KFAULT_CALLS=fsync KFAULT_NTH=$k KFAULT_ERR=KILL KFAULT_PATH="$S" LD_PRELOAD="$SHIM" \
        "$BIN/kpack" convert "$S" "$X" --consume --quiet 2>/dev/null
    rc=$?
    [ $rc -eq 137 ] && [ "$(shards)" -eq $((15 - k)) ] || { notok "kill after deletion $k: rc $rc, $(shards) shards"; bad=1; continue; }
    "$BIN/kpack" convert "$S" "$X" --consume --quiet 2>"$T/k.err" && cmp -s "$X" "$T/ref.kpk" && [ "$(shards)" = 0 ] \
        || { notok "rerun after the kill after deletion $k: $(cat "$T/k.err")"; bad=1; }
done
[ $bad = 0 ] && ok "killed right after deletions 1, 2, 8 and 15 (before the directory sync): the rerun never needs them, finishes identical"

# ---- kill -9 at random moments, and the resume ------------------------------------------
size=$(stat -c %s "$T/ref.kpk")
kills=0; bad=0
for seed in 1 2 3; do
    fresh
    n=$(( (RANDOM * 32768 + RANDOM) % (size * 9 / 10) + 1 ))
    KPACK_SYNC_BYTES=$((seed == 2 ? 1 : 65536)) KFAULT_KILL_AFTER_BYTES=$n KFAULT_PATH="$X*" LD_PRELOAD="$SHIM" \
        "$BIN/kpack" convert "$S" "$X" --consume --quiet 2>/dev/null
    if [ $? -eq 137 ]; then kills=$((kills + 1)); "$BIN/kpack" convert "$S" "$X" --consume --quiet 2>"$T/k.err"; fi
    cmp -s "$X" "$T/ref.kpk" && [ "$(shards)" = 0 ] || { notok "kill after $n bytes: $(cat "$T/k.err")"; bad=1; }
done
fresh
KPACK_TEST_DELAY_MS=8 "$BIN/kpack" convert "$S" "$X" --consume --quiet 2>/dev/null & pid=$!
sleep 0.$((3 + RANDOM % 5)); kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
if [ $? -eq 137 ]; then kills=$((kills + 1)); "$BIN/kpack" convert "$S" "$X" --consume --quiet 2>"$T/k.err"; fi
cmp -s "$X" "$T/ref.kpk" && [ "$(shards)" = 0 ] || { notok "external kill: $(cat "$T/k.err")"; bad=1; }
[ $bad = 0 ] && ok "$kills kill -9 at random moments (inside a write at a random byte of the output, its journal or log; from outside): every rerun identical"
exported_same "after the kills"

# killed, then finished without --consume: what is left is kept
fresh
KPACK_SYNC_BYTES=1 KPACK_TEST_KILL_AFTER=40 "$BIN/kpack" convert "$S" "$X" --consume --quiet 2>/dev/null
left=$(shards)
"$BIN/kpack" convert "$S" "$X" --quiet 2>"$T/k.err" && cmp -s "$X" "$T/ref.kpk" && [ "$(shards)" = "$left" ] && [ "$left" -gt 0 ] \
    && [ "$left" -lt 15 ] && [ -z "$(leftovers)" ] \
    && ok "a --consume run killed midway finishes without --consume: identical, the $left shards still there are kept" \
    || notok "resume without --consume: $left, $(shards), $(cat "$T/k.err")"

# ---- what a resume cannot do without a deleted shard ----------------------------------------
fresh
KPACK_SYNC_BYTES=1 KPACK_TEST_KILL_AFTER=40 "$BIN/kpack" convert "$S" "$X" --consume --quiet 2>/dev/null
cp "$X.partial" "$T/partial.before"
mv "$X.journal" "$T/journal.saved"
expect_exit 2 "the journal gone after shards were consumed: the rerun stops" "$BIN/kpack" convert "$S" "$X" --consume --quiet
expect_err "cannot resume .*x.kpk without [0-9]+ shards that an earlier run of --consume deleted \(model-0000.*the journal .*x.kpk.journal is missing.*Put those files back into .*src" \
    "it names the deleted shards it needs and says to put them back"
cmp -s "$X.partial" "$T/partial.before" && ok "nothing was changed: the partial file holds the deleted shards' bytes as before" || notok "the partial file changed"
for f in "$O"/model-*.safetensors; do [ -e "$S/$(basename "$f")" ] || cp "$f" "$S/"; done
"$BIN/kpack" convert "$S" "$X" --consume --quiet 2>"$T/k.err" && cmp -s "$X" "$T/ref.kpk" && [ "$(shards)" = 0 ] \
    && ok "the shards put back (new copies: other mtimes), the rerun converts again and consumes them: identical" \
    || notok "after putting the shards back: $(cat "$T/k.err")"
fresh
KPACK_SYNC_BYTES=1 KPACK_TEST_KILL_AFTER=40 "$BIN/kpack" convert "$S" "$X" --consume --quiet 2>/dev/null
expect_exit 2 "rerun with other options after shards were consumed" "$BIN/kpack" convert "$S" "$X" --consume --compress trunk --quiet
expect_err "were deleted by an earlier .kpack convert --consume. into .*x.kpk, which was planned with other options.*kpack convert .*src .*x.kpk --consume --quiet.*Rerun that command" \
    "it refuses to start over and names the command that began the conversion"
"$BIN/kpack" convert "$S" "$X" --consume --quiet 2>"$T/k.err" && cmp -s "$X" "$T/ref.kpk" \
    && ok "that command then finishes identical" || notok "finish: $(cat "$T/k.err")"

# ---- a partial file that does not read back as written: the shard kept, the extent written again ----
for mode in plain sha256; do
    fresh
    extra=(); [ $mode = sha256 ] && extra=(--sha256 "$T/SUMS")
    ref=$T/ref.kpk; [ $mode = sha256 ] && ref=$T/refs.kpk
    KPACK_SYNC_BYTES=1 KPACK_TEST_KILL_AFTER=40 "$BIN/kpack" convert "$S" "$X" "${extra[@]}" --quiet 2>/dev/null
    $PY - "$X.partial" "$T/ref.kpk" <<'PY'
import struct, sys
ref = open(sys.argv[2], "rb").read()
ext_off, = struct.unpack_from("<Q", ref, 56)
off, stored = struct.unpack_from("<QQ", ref, ext_off + 64 * 5 + 16)   # extent 5: layer 1, shard 2
with open(sys.argv[1], "r+b") as f:
    f.seek(off + stored // 2); b = f.read(1); f.seek(off + stored // 2); f.write(bytes([b[0] ^ 1]))
PY
    expect_exit 0 "a flipped bit in journaled extent 5 (shard 2), then --consume ($mode)" "$BIN/kpack" convert "$S" "$X" --consume "${extra[@]}"
    pat="layer 1 expert 1 as written in .*x.kpk.partial does not match the checksum computed when it was read"
    [ $mode = sha256 ] && pat="rebuilt from what .*x.kpk.partial holds, it has SHA-256 [0-9a-f]+\.\.\., not [0-9a-f]+\.\.\. \(--sha256\)"
    grep -qE "model-00002-of-000015.safetensors was not deleted: .*($pat).*writing it and what follows again" "$T/last.err" \
        && cmp -s "$X" "$ref" && [ "$(shards)" = 0 ] \
        && ok "$mode: the damage found before shard 2 went, said, the extent and what follows written again: identical, then every shard deleted" \
        || notok "$mode: $(cat "$T/last.err")"
done

# ---- the source read back other bytes than its SHA-256 says: the shard kept, read again ----------------
fresh
KFAULT_CALLS=pread KFAULT_NTH=6 KFAULT_ERR=FLIP KFAULT_PATH='*/model-00002-of-000015.safetensors' KFAULT_LOG="$T/flip.log" \
    LD_PRELOAD="$SHIM" "$BIN/kpack" convert "$S" "$X" --consume --sha256 "$T/SUMS" --quiet 2>"$T/flip.err"
rc=$?
if [ $rc -eq 2 ] && grep -q "a bit flipped" "$T/flip.log" && [ -e "$S/model-00002-of-000015.safetensors" ] \
    && grep -qE "model-00002-of-000015.safetensors was not deleted: rebuilt from .*, although every extent holding it reads back as written: the bytes read from .*model-00002-of-000015.safetensors during the conversion are not those whose SHA-256 was checked" "$T/flip.err"; then
    ok "a bit flipped by the source's disk on a read (after the SHA-256 check): the shard is kept, and the message blames the source's read, not the output"
else notok "source read flipped: rc $rc, $(cat "$T/flip.log" "$T/flip.err" 2>/dev/null | head -c 500)"; fi
"$BIN/kpack" convert "$S" "$X" --consume --sha256 "$T/SUMS" --quiet 2>"$T/k.err" && cmp -s "$X" "$T/refs.kpk" && [ "$(shards)" = 0 ] \
    && ok "the rerun reads the shard again: identical, every shard deleted" || notok "rerun after the flipped read: $(cat "$T/k.err")"

# ---- a deletion the filesystem refuses midway (a network or FUSE mount may, whatever access(2) said) ----
fresh
KFAULT_CALLS=unlink KFAULT_NTH=3 KFAULT_ERR=EACCES KFAULT_PATH='*.safetensors' LD_PRELOAD="$SHIM" \
    "$BIN/kpack" convert "$S" "$X" --consume --quiet 2>"$T/del.err"
rc=$?
[ $rc -eq 2 ] && [ "$(shards)" = 13 ] \
    && grep -qE "cannot delete .*\.safetensors: Permission denied\. Its bytes are safe in the output: make it deletable and rerun the same command, or finish without --consume" "$T/del.err" \
    && ok "a deletion refused by the filesystem stops the run (exit 2), says the bytes are safe and what to do" \
    || notok "refused deletion: rc $rc, $(shards) shards: $(cat "$T/del.err")"
"$BIN/kpack" convert "$S" "$X" --quiet 2>"$T/k.err" && cmp -s "$X" "$T/ref.kpk" && [ "$(shards)" = 13 ] && [ -z "$(leftovers)" ] \
    && ok "finished without --consume: identical, the 13 shards still there kept, the consume log removed" \
    || notok "finish without --consume after a refused deletion: $(shards) shards, $(leftovers): $(cat "$T/k.err")"

# ---- killed after publishing OUT, before removing the consume log ---------------------------------------
fresh
KFAULT_CALLS=unlink KFAULT_ERR=KILL KFAULT_PATH='*/x.kpk.consumed' LD_PRELOAD="$SHIM" "$BIN/kpack" convert "$S" "$X" --consume --quiet 2>/dev/null
rc=$?
expect_exit 2 "the same command after a kill between publishing OUT and removing OUT.consumed" "$BIN/kpack" convert "$S" "$X" --consume --quiet
[ $rc -eq 137 ] && cmp -s "$X" "$T/ref.kpk" && [ "$(shards)" = 0 ] \
    && grep -q "x.kpk already exists" "$T/last.err" && grep -qE "x.kpk was written by .kpack convert --consume., which was stopped after it renamed the file into place and before it removed .*x.kpk.consumed: the conversion finished. Check it with .kpack verify" "$T/last.err" \
    && ok "OUT is complete and identical; the rerun refuses to overwrite it and says the conversion finished and what is left to delete" \
    || notok "killed before removing the log: rc $rc: $(tr '\n' ' ' < "$T/last.err")"

# ---- the rails ----------------------------------------------------------------------------------
fresh
rail() { # rail WHAT PATTERN CMD...: refused (exit 2), said so, nothing written or deleted
    local what=$1 pat=$2; shift 2
    expect_exit 2 "$what" "$@"
    if grep -qE -- "$pat" "$T/last.err" && [ "$(shards)" = 15 ] && [ -z "$(leftovers)" ]; then ok "$what: said why; nothing written or deleted"
    else notok "$what: $(head -c 300 "$T/last.err") / $(shards) shards / $(leftovers)"; fi
}
rail "--consume with --no-archive" "needs the archive" "$BIN/kpack" convert "$S" "$X" --consume --no-archive --quiet
"$BIN/kpack" convert "$O" "$T/plain.kpk" --quiet
rail "--consume of a KPK source" "is a KPK file" "$BIN/kpack" convert "$T/plain.kpk" "$X" --consume --quiet
rail "OUT is a source shard" "would be the source file .*model-00003" "$BIN/kpack" convert "$S" "$S/model-00003-of-000015.safetensors" --consume --force --quiet
mv "$S/model-00004-of-000015.safetensors" "$T/elsewhere.safetensors"; ln -s "$T/elsewhere.safetensors" "$S/model-00004-of-000015.safetensors"
rail "a shard that is a symbolic link" "model-00004.* is a symbolic link: deleting it would free nothing" "$BIN/kpack" convert "$S" "$X" --consume --quiet
fresh
ln "$S/model-00005-of-000015.safetensors" "$T/second-name"
rail "a shard with a second hard link" "has 2 names \(hard links\)" "$BIN/kpack" convert "$S" "$X" --consume --quiet
rm -f "$T/second-name"
if [ "$(id -u)" -ne 0 ]; then
    chmod a-w "$S"
    rail "a source directory this user may not change" "may not be changed by this user" "$BIN/kpack" convert "$S" "$X" --consume --quiet
    chmod u+w "$S"
elif command -v chattr >/dev/null && chattr +i "$S/model-00006-of-000015.safetensors" 2>/dev/null; then
    rail "an immutable shard (chattr +i: not even root deletes it)" "is immutable \(chattr \+i\)" "$BIN/kpack" convert "$S" "$X" --consume --quiet
    chattr -i "$S/model-00006-of-000015.safetensors"
else
    skip "a shard --consume may not delete: root deletes anything and this filesystem has no chattr +i"
fi
# a Hugging Face cache: blobs/<sha256> and snapshots/REV/NAME -> ../../blobs/<sha256>
hf_cache() { # hf_cache DIR REV...: every file of orig as a blob, linked from each revision
    rm -rf "$1"; mkdir -p "$1/blobs"
    for f in $(cd "$O" && find . -type f | sed 's|^\./||'); do
        h=$(sha256sum "$O/$f" | cut -c1-64); cp "$O/$f" "$1/blobs/$h"
        for rev in "${@:2}"; do mkdir -p "$1/snapshots/$rev"; ln -sf "../../blobs/$h" "$1/snapshots/$rev/$f"; done
    done
}
hf_cache "$T/hf" rev
"$BIN/kpack" convert "$T/hf/snapshots/rev" "$T/hfref.kpk" --quiet
hfshards() { ls "$T/hf/snapshots/rev" | grep -c '\.safetensors$'; }
expect_exit 2 "a Hugging Face snapshot with --consume" "$BIN/kpack" convert "$T/hf/snapshots/rev" "$X" --consume --quiet
expect_err "is a Hugging Face cache snapshot: its shards are symbolic links .* deleting them frees nothing. To consume the blobs themselves .* add --consume-blobs" \
    "refused: deleting the links frees nothing, and it says how to consume the blobs"
nblobs=$(ls "$T/hf/blobs" | wc -l)
expect_exit 0 "--consume-blobs" "$BIN/kpack" convert "$T/hf/snapshots/rev" "$X" --consume-blobs --quiet
[ "$(hfshards)" = 0 ] && [ "$(ls "$T/hf/blobs" | wc -l)" = $((nblobs - 15)) ] && cmp -s "$X" "$T/hfref.kpk" \
    && [ -e "$T/hf/snapshots/rev/config.json" ] \
    && ok "--consume-blobs: each shard's blob and link deleted, the other files left, identical to converting the snapshot" \
    || notok "--consume-blobs: $(hfshards) links, $(ls "$T/hf/blobs" | wc -l) of $nblobs blobs"
rm -rf "$T/exp"; "$BIN/kpack" export "$X" "$T/exp" --quiet >/dev/null 2>&1 && diff -r "$O" "$T/exp" >/dev/null \
    && ok "export gives the snapshot's files back as plain files, identical" || notok "export of the consumed snapshot"
rm -f "$X"
hf_cache "$T/hf" rev other
expect_exit 2 "--consume-blobs when another revision uses the blobs" "$BIN/kpack" convert "$T/hf/snapshots/rev" "$X" --consume-blobs --quiet
expect_err "is also used by .*snapshots/other/model-.* \(another snapshot of the cache\)" "the other snapshot is named"
[ "$(hfshards)" = 15 ] && ok "nothing deleted" || notok "blobs deleted although shared"
rm -rf "$T/hf"

# ---- asked on a terminal ----------------------------------------------------------------------
fresh
echo '[{"wait": "[y/N]"}, {"send": "n\r"}]' > "$T/no.json"
$PY "$TOP/tests/cli/chat_pty.py" "$T/pty.out" "$T/no.json" -- "$BIN/kpack" convert "$S" "$X" --consume
rc=$?
[ $rc -eq 2 ] && grep -q "deletes the 15 shards of .*src" "$T/pty.out" && grep -q "nothing was written or deleted" "$T/pty.out" \
    && [ "$(shards)" = 15 ] && [ -z "$(leftovers)" ] && ok "on a terminal it asks first; answered no: exit 2, nothing written or deleted" \
    || notok "asked, answered no: rc $rc: $(tr -d '\r' < "$T/pty.out" | head -c 400)"
echo '[{"wait": "[y/N]"}, {"send": "y\r"}]' > "$T/yes.json"
KPACK_TEST_DELAY_MS=4 $PY "$TOP/tests/cli/chat_pty.py" "$T/pty.out" "$T/yes.json" -- "$BIN/kpack" convert "$S" "$X" --consume
rc=$?
[ $rc -eq 0 ] && cmp -s "$X" "$T/ref.kpk" && [ "$(shards)" = 0 ] && ok "answered yes: converted, identical, every shard deleted" \
    || notok "answered yes: rc $rc: $(tr -d '\r' < "$T/pty.out" | tail -c 300)"
grep -qE 'freed [0-9.]+ [kM]B \([0-9]+ of 15 shards\)' "$T/pty.out" && ok "the progress line reports the space freed so far" \
    || notok "progress line: $(tr '\r' '\n' < "$T/pty.out" | grep -m3 convert)"
fresh
echo '[]' > "$T/none.json"
$PY "$TOP/tests/cli/chat_pty.py" "$T/pty.out" "$T/none.json" -- "$BIN/kpack" convert "$S" "$X" --consume --yes
[ $? -eq 0 ] && ! grep -q '\[y/N\]' "$T/pty.out" && cmp -s "$X" "$T/ref.kpk" && ok "--yes: no question on a terminal" \
    || notok "--yes on a terminal: $(tr -d '\r' < "$T/pty.out" | head -c 300)"

# ---- free space: the peak, checked first; du sampled during the run -----------------------------
fresh
"$BIN/kpack" convert "$S" "$X" --consume --dry-run --json >"$T/dry.json"
read need peak < <($PY -c 'import json,sys; s=json.load(open(sys.argv[1]))["space"][0]; print(s["need_bytes"], s["consume_peak_bytes"])' "$T/dry.json")
"$BIN/kpack" convert "$S" "$X" --consume --dry-run >"$T/dry.txt"
grep -qE "without --consume: .*MB" "$T/dry.txt" && grep -qE "with --consume: .* at its peak" "$T/dry.txt" \
    && ok "--dry-run says both: $need bytes without --consume, $peak at the peak with it" || notok "dry run: $(cat "$T/dry.txt")"
KPACK_TEST_FREE_BYTES=$((peak + 4096)) expect_exit 2 "plain convert with room for the peak only" "$BIN/kpack" convert "$S" "$X" --quiet
expect_err "not enough free space for .*x.kpk: need .*With --consume .* it needs .* at its peak, which fits: add --consume" \
    "refused before starting, and told that --consume would fit"
[ -z "$(leftovers)" ] && [ "$(shards)" = 15 ] && ok "nothing written" || notok "written: $(leftovers)"
KPACK_TEST_FREE_BYTES=$((peak - 4096)) expect_exit 2 "--consume 4 KiB short of its peak" "$BIN/kpack" convert "$S" "$X" --consume --quiet
expect_err "not enough free space for .*x.kpk with --consume \(at its peak" "refused, naming the peak"
read base extra end < <(KPACK_TEST_DELAY_MS=3 KPACK_TEST_FREE_BYTES=$((peak + 4096)) $CHK peak "$T" -- "$BIN/kpack" convert "$S" "$X" --consume --quiet)
if cmp -s "$X" "$T/ref.kpk" && [ "$extra" -le "$peak" ]; then
    ok "with room for the peak only it completes identical; du sampled during it: $extra bytes at most beyond the start, predicted $peak (without --consume: $need)"
else notok "peak: extra $extra, predicted $peak, $(ls "$T")"; fi

# ---- sets, a trunk member, compressed blocks ------------------------------------------------------
mkdir -p "$T/e1" "$T/e2" "$T/e3" "$T/setref"
set_opts=(--stripe "$T/e1,$T/e2" --trunk-to "$T/e3" --stripe-unit 16K --compress trunk)
set_files() { echo "$X" "$T/e1/x.kpk.s0" "$T/e2/x.kpk.s1" "$T/e3/x.kpk.trunk"; }
rm -f $(set_files)
"$BIN/kpack" convert "$O" "$X" "${set_opts[@]}" --quiet && cp $(set_files) "$T/setref/" && rm -f $(set_files)
fresh
KPACK_SYNC_BYTES=1 KPACK_TEST_KILL_AFTER=30 "$BIN/kpack" convert "$S" "$X" "${set_opts[@]}" --consume --quiet 2>/dev/null
"$BIN/kpack" convert "$S" "$X" "${set_opts[@]}" --consume --quiet 2>"$T/k.err"
rc=$?; same=1
for f in $(set_files); do cmp -s "$f" "$T/setref/$(basename "$f")" || same=0; done
if [ $rc -eq 0 ] && [ $same = 1 ] && [ "$(shards)" = 0 ]; then
    ok "a stripe set of 2 with a trunk member and compressed trunks, killed and resumed: every member identical, every shard deleted"
else notok "set: rc $rc, same $same: $(cat "$T/k.err")"; fi
exported_same "a set"
for extra in "" "--sha256 $T/SUMS"; do
    rm -f "$T/cref.kpk"; "$BIN/kpack" convert "$O" "$T/cref.kpk" --compress all $extra --quiet
    fresh
    "$BIN/kpack" convert "$S" "$X" --compress all --consume $extra --quiet 2>"$T/k.err" && cmp -s "$X" "$T/cref.kpk" && [ "$(shards)" = 0 ] \
        && ok "--compress all ${extra:+--sha256 }--consume: identical (each block decoded and checked before its shard goes)" \
        || notok "--compress all $extra: $(cat "$T/k.err")"
done

# ---- one consuming conversion of a source at a time ----------------------------------------------
fresh
KPACK_TEST_DELAY_MS=20 "$BIN/kpack" convert "$S" "$X" --consume --quiet 2>/dev/null & pid=$!
for _ in $(seq 100); do [ -e "$X.journal" ] && break; sleep 0.02; done
expect_exit 2 "another conversion of a source being consumed" "$BIN/kpack" convert "$S" "$T/y.kpk" --quiet
expect_err "is being consumed \(deleted as it is converted\) by another kpack convert --consume" "it names why"
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
finish
