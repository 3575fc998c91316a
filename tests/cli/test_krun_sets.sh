#!/usr/bin/env bash
# krun on member files and compressed blocks: stripe sets of 2 and 3 members
# and a trunk member (written by kpack), and codec-2 files (written by the
# independent tests/ref/kpk.py, blocks of all three methods), give every
# logit bit of the single uncompressed file at several budgets -- held,
# streamed whole, streamed in small pieces with lm_head streaming -- in every
# --io mode and thread count; reads per step equal the plan; every member
# of a set is read, and --json says how much from each; a damaged block is
# named (extent and block), exit 1, no token printed; --io direct falls back
# to buffered reads, with one notice, on a file system that refuses O_DIRECT.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
KPY="$TOP/tests/ref/kpk.py"

"$BIN/k3synth" "$T/src" --geometry tiny --seed 31 --shards 2 --quiet >/dev/null 2>"$T/err" || { notok "k3synth: $(cat "$T/err")"; finish; exit 1; }
"$BIN/kpack" convert "$T/src" "$T/m.kpk" --quiet || { notok "convert"; finish; exit 1; }
IDS=3,7,11,5,9,100,200,30
GEN=6
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen $GEN --dump-all-logits "$T/ref.bin" --json "$T/ref.json" --quiet >/dev/null \
    || { notok "reference run"; finish; exit 1; }

# the layouts: kpack's sets, kpk.py's compressed files (plain and striped)
mkdir -p "$T/s2/e" "$T/s2/d1" "$T/s2/d2" "$T/s3/e" "$T/s3/d1" "$T/s3/d2" "$T/s3/d3" "$T/s3/fast" "$T/cs/e" "$T/cs/d1" "$T/cs/d2" "$T/cs/fast"
"$BIN/kpack" convert "$T/src" "$T/s2/e/k3.kpk" --stripe "$T/s2/d1,$T/s2/d2" --stripe-unit 8K --quiet || notok "convert a set of 2"
"$BIN/kpack" convert "$T/src" "$T/s3/e/k3.kpk" --stripe "$T/s3/d1,$T/s3/d2,$T/s3/d3" --stripe-unit 4K --trunk-to "$T/s3/fast" --quiet \
    || notok "convert a set of 3 + a trunk member"
$PY "$KPY" relayout "$T/m.kpk" "$T/c.kpk" --codec2 all --block-size 4096 || notok "kpk.py relayout --codec2 all"
$PY "$KPY" relayout "$T/m.kpk" "$T/cs/e/k3.kpk" --codec2 all --block-size 8192 --stripe "$T/cs/d1,$T/cs/d2" --unit 8192 \
    --trunk-to "$T/cs/fast" || notok "kpk.py relayout: compressed, striped, trunk member"
$PY - "$KPY" "$T/c.kpk" <<'PY' && ok "the compressed file has RAW, ZSTD and SPLIT2 blocks in globals, trunk and expert extents" || notok "compressed file's blocks"
import importlib.util, sys
spec = importlib.util.spec_from_file_location("kpk", sys.argv[1]); kpk = importlib.util.module_from_spec(spec); spec.loader.exec_module(kpk)
k = kpk.load(sys.argv[2])
assert {b["method"] for b in k.blocks} == {0, 1, 2}
assert {x["kind"] for x in k.extents if x["codec"] == 2} >= {2, 3, 4}
PY

# the smallest budget of a file: every layer and lm_head stream in pieces
minimum() { "$BIN/krun" "$1" --ids $IDS --gen $GEN --mem 4096 --dump-all-logits "$T/x.bin" --quiet 2>&1 >/dev/null | sed -n 's/.*the minimum .* (\([0-9]*\) bytes)$/\1/p'; }
for f in "$T/s2/e/k3.kpk" "$T/s3/e/k3.kpk" "$T/c.kpk" "$T/cs/e/k3.kpk"; do
    name=${f#"$T/"}
    min=$(minimum "$f")
    [ -n "$min" ] || { notok "$name: no minimum"; continue; }
    same_bits "$f" "$name in place (no budget)"
    for io in direct pread mmap; do
        same_bits "$f" "$name --mem minimum (all streamed, lm_head too) --io $io" --mem "$min" --io $io
        same_bits "$f" "$name --pin 0 --piece 4K (row blocks, held tensors) --io $io" --mem 1G --pin 0 --piece 4K --expert-slots 3 --io $io
        same_bits "$f" "$name --mem 1G (held) --io $io" --mem 1G --io $io
    done
done
same_bits "$T/c.kpk" "compressed --threads 1 --io-threads 1 --piece 8K" --mem 1G --pin 2 --piece 8K --threads 1 --io-threads 1
same_bits "$T/c.kpk" "compressed --threads 2 --verify always --chunk 3" --mem 1G --pin 0 --piece 16K --threads 2 --verify always --chunk 3
same_bits "$T/cs/e/k3.kpk" "compressed set --io-threads 1 --verify off" --mem 1G --pin 0 --piece 4K --io-threads 1 --verify off

# reads per step == the plan; every member read; --json per member (--predict off: its
# reads have their own rule, cli/test_krun_stream)
"$BIN/krun" "$T/s3/e/k3.kpk" --ids $IDS --gen $GEN --mem 1G --pin 0 --piece 8K --expert-slots 4 --predict off --json "$T/s.json" --quiet >/dev/null
$PY - "$T/s.json" <<'PY' && ok "set of 3 + trunk: bytes per step = the plan's pieces + expert misses, every step" || notok "set: bytes per step differ from the plan"
import json, sys
j = json.load(open(sys.argv[1])); p = j["plan"]
assert p["head_streamed"] is False or p["head_stream_bytes_per_token"] > 0
assert j["steps"]
for s in j["steps"]:
    assert s["bytes_trunk"] == p["trunk_stream_bytes_per_token"], (s["bytes_trunk"], p["trunk_stream_bytes_per_token"])
    assert s["bytes_head"] == p["head_stream_bytes_per_token"], s
    assert s["bytes_experts"] == s["expert_misses"] * p["expert_slot_bytes"], s
PY
$PY - "$T/s.json" <<'PY' && ok "set of 3 + trunk: --json gives bytes and MB/s per member per step; the stripes and the trunk member are all read" || notok "per-member statistics"
import json, sys
j = json.load(open(sys.argv[1])); p = j["plan"]
tot = [m["bytes"] for m in j["member_bytes"]]
assert len(tot) == 5, tot
assert tot[1] > 0 and all(t > 0 for t in tot[2:]), tot          # the trunk member and every stripe
assert tot[0] == 0, tot                                          # the entry holds only meta: krun reads nothing from it
used = j["bytes_trunk"] + j["bytes_head"] + j["bytes_experts"] + j["bytes_resident"] + j["bytes_globals"]
# what was read but not used: the read-ahead of a step that never ran
assert used <= sum(tot) <= used + p["ring_slots"] * p["ring_slot_bytes"], (sum(tot), used)
for s in j["steps"]:
    assert len(s["members"]) == 5 and all("mb_per_s" in m for m in s["members"])
    assert sum(m["bytes"] for m in s["members"][2:]) > 0
PY

# --predict auto (the default): on where the trunk has a member of its own (s3, cs), off on a
# stripe set without one (s2) and on a single file; off when only the plan without it fits
predict_of() { # FILE ARGS... -> "plan.predict experts_predicted"
    local f=$1; shift
    "$BIN/krun" "$f" --ids $IDS --gen $GEN "$@" --json "$T/p.json" --quiet >/dev/null 2>"$T/p.err" || { echo "failed: $(head -c 200 "$T/p.err")"; return; }
    $PY -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["plan"]["predict"], j["experts_predicted"])' "$T/p.json"
}
r1=$(predict_of "$T/s3/e/k3.kpk" --mem 1G --pin 0 --piece 8K --expert-slots 4)
r2=$(predict_of "$T/cs/e/k3.kpk" --mem 1G --pin 0 --piece 8K --expert-slots 4)
r3=$(predict_of "$T/s2/e/k3.kpk" --mem 1G --pin 0 --piece 8K --expert-slots 4)
r4=$(predict_of "$T/c.kpk" --mem 1G --pin 0 --piece 8K --expert-slots 4)
r5=$(predict_of "$T/s3/e/k3.kpk" --mem 1G --pin 0 --piece 8K --expert-slots 4 --predict off)
r6=$(predict_of "$T/s2/e/k3.kpk" --mem 1G --pin 0 --piece 8K --expert-slots 4 --predict on)
min3=$(minimum "$T/s3/e/k3.kpk")
r7=$(predict_of "$T/s3/e/k3.kpk" --mem "$min3")
case "$r1|$r2|$r3|$r4|$r5|$r6|$r7" in
    "True "[1-9]*"|True "[1-9]*"|False 0|False 0|False 0|True "[1-9]*"|False 0")
        ok "--predict auto: on for the trunk-member layouts ($r1, $r2), off for a plain stripe set and a single file, off at the minimum budget; on/off override it" ;;
    *) notok "--predict auto: split $r1, compressed split $r2, stripe $r3, file $r4, split off $r5, stripe on $r6, split at the minimum $r7" ;;
esac

# A damaged block: named by extent and block, exit 1, no token computed from
# it printed.  kpk.py damages the first block of its kind: in the globals, or
# (without compressed globals) in layer 0's trunk.
$PY "$KPY" relayout "$T/m.kpk" "$T/cg.kpk" --codec2 globals,trunk,expert --block-size 4096
$PY "$KPY" relayout "$T/m.kpk" "$T/ct.kpk" --codec2 trunk,expert --block-size 4096
for src in cg ct; do
    for mut in block-tamper raw-block-flip; do
        $PY "$KPY" mutate "$T/$src.kpk" "$T/$src-$mut.kpk" $mut >"$T/mut.txt" 2>&1 || notok "kpk.py mutate $mut: $(cat "$T/mut.txt")"
    done
done
# two more on layer 0's trunk: a zstd block that is no zstd frame (its magic
# changed), and one whose frame says another decoded length (its content
# size field changed); kpk.py re-seals the stored checksums around them
$PY - "$KPY" "$T/ct.kpk" "$T/ct-bad-frame.kpk" "$T/ct-bad-length.kpk" <<'PY' || notok "crafting a bad frame and a wrong length"
import importlib.util, sys
spec = importlib.util.spec_from_file_location("kpk", sys.argv[1]); kpk = importlib.util.module_from_spec(spec); spec.loader.exec_module(kpk)
for out, what in ((sys.argv[3], "magic"), (sys.argv[4], "length")):
    p = kpk.from_kpk(kpk.load(sys.argv[2]))
    i = next(i for i, x in enumerate(p.extents) if x["kind"] == kpk.TRUNK)
    fb = sum(e.get("nblocks", 0) for e in p.extents[:i])
    b = next(b for b in p.blocks[fb:fb + p.extents[i]["nblocks"]] if b["method"] == kpk.ZSTD and b["stored_len"] > 40)
    s = bytearray(p.stored[i]); o = b["stored_off"]
    if what == "magic":
        s[o] ^= 0xFF
    else:  # the frame header's Frame_Content_Size, one more than the block's raw length
        fhd = s[o + 4]; single = fhd >> 5 & 1
        at = o + 5 + (0 if single else 1) + [0, 1, 2, 4][fhd & 3]
        size = [1 if single else 0, 2, 4, 8][fhd >> 6]
        assert size, "no content size in the frame"
        v = int.from_bytes(s[at:at + size], "little") + 1
        assert v < 1 << (8 * size)
        s[at:at + size] = v.to_bytes(size, "little")
    p.stored[i] = bytes(s)
    kpk.serialize(p, out)
PY
for bad in cg-block-tamper cg-raw-block-flip ct-block-tamper ct-raw-block-flip ct-bad-frame ct-bad-length; do
    for args in "" "--mem 1G --pin 0 --piece 4K" "--mem 1G --io mmap"; do
        rc=0; "$BIN/krun" "$T/$bad.kpk" --ids $IDS --gen $GEN --print-ids --quiet $args >"$T/bad.out" 2>"$T/bad.err" || rc=$?
        if [ $rc -eq 1 ] && grep -qE "(layer [0-9]+ (trunk|expert [0-9]+)|globals).*block [0-9]+: (decoded checksum mismatch|zstd|not a zstd frame|zstd frame says)" "$T/bad.err" \
            && [ ! -s "$T/bad.out" ]; then
            ok "damaged block ($bad${args:+, $args}): exit 1, extent and block named, no token printed"
        else
            notok "damaged block ($bad${args:+, $args}): rc $rc, out $(head -c 80 "$T/bad.out"): $(head -c 300 "$T/bad.err")"
        fi
    done
done

# --io direct on file systems that may refuse O_DIRECT: tmpfs (accepted by
# Linux >= 6.6, refused before) and ramfs (always refused)
odirect_case() { # LABEL FILE
    local rc=0
    "$BIN/krun" "$2" --ids $IDS --gen $GEN --dump-all-logits "$T/x.bin" --mem 1G --pin 0 --piece 8K --io direct --print-ids --json "$T/o.json" \
        >/dev/null 2>"$T/o.err" || rc=$?
    if [ $rc -eq 0 ] && cmp -s "$T/ref.bin" "$T/x.bin"; then ok "$1: --io direct runs, identical logits"; else notok "$1: rc $rc: $(head -c 300 "$T/o.err")"; fi
}
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
    SHM=$(mktemp -d /dev/shm/kpk-sets.XXXXXX)
    cp "$T/m.kpk" "$SHM/m.kpk"
    odirect_case "tmpfs" "$SHM/m.kpk"
    n=$(grep -c "refuses O_DIRECT" "$T/o.err")
    if $PY -c 'import json,sys; n=json.load(open(sys.argv[1]))["notice"]; sys.exit(0 if n is None or "refuses O_DIRECT" in n else 1)' "$T/o.json" && [ "$n" -le 1 ]; then
        ok "tmpfs: at most one notice ($n: this kernel's tmpfs $([ "$n" = 0 ] && echo accepts || echo refuses) O_DIRECT), and --json carries it"
    else notok "tmpfs notice: $n lines: $(head -c 300 "$T/o.err")"; fi
    rm -rf "$SHM"
else
    skip "O_DIRECT on tmpfs: no writable /dev/shm"
fi
RAMFS=$T/ramfs
if [ "$(id -u)" = 0 ] && mkdir -p "$RAMFS" && mount -t ramfs ramfs "$RAMFS" 2>/dev/null; then
    # the set's trunk member and one stripe on ramfs, the rest where it was
    rm -rf "$T/r"; cp -r "$T/s3" "$T/r"
    mv "$T/r/fast" "$RAMFS/fast" && ln -s "$RAMFS/fast" "$T/r/fast"
    mv "$T/r/d2" "$RAMFS/d2" && ln -s "$RAMFS/d2" "$T/r/d2"
    odirect_case "ramfs (refuses O_DIRECT): 2 of 5 members" "$T/r/e/k3.kpk"
    n=$(grep -c "refuses O_DIRECT" "$T/o.err")
    if [ "$n" = 1 ] && grep -q "member 1 (.*fast/k3.kpk.trunk)" "$T/o.err" && grep -q "member 3 (.*d2/k3.kpk.s1)" "$T/o.err" \
        && ! grep -q "member 2 (" "$T/o.err"; then
        ok "ramfs: one notice naming exactly the two members on ramfs"
    else notok "ramfs notice: $n lines: $(grep -i direct "$T/o.err" | head -c 400)"; fi
    umount "$RAMFS"
else
    skip "O_DIRECT fallback on ramfs: needs root (mount -t ramfs)"
fi
finish
