#!/usr/bin/env bash
# kpack convert into stripe sets and a trunk member (FORMAT.md §7): sets of 2
# and 3 members and a split trunk member verify, list and read back every
# tensor identical to the single-file layout, and the independent Python
# reader accepts them; every bad-set case is named (exit 2); kill -9 at
# several points then rerun gives byte-identical members; re-layout from a
# KPK file or set equals a conversion of the shards with the same options.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
KPY="$TOP/tests/ref/kpk.py"
CATALL="$TOP/tests/cli/kpk_cat_all.py"

"$BIN/k3synth" "$T/src" --geometry tiny --shards 3 --seed 13 --quiet >/dev/null 2>"$T/synth.err" \
    || { notok "k3synth tiny: $(cat "$T/synth.err")"; finish; exit 1; }
"$BIN/kpack" convert "$T/src" "$T/single.kpk" --quiet || { notok "single-file conversion"; finish; exit 1; }
S="$T/single.kpk"
# same_set A B: entry files A and B (in their own trees) and every member file are byte-identical
same_set() {
    local a=$1 b=$2 f ra rb
    cmp -s "$a" "$b" || return 1
    for f in $($PY - "$KPY" "$a" <<'PY'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("kpk", sys.argv[1]); kpk = importlib.util.module_from_spec(spec); spec.loader.exec_module(kpk)
for m in kpk.load(sys.argv[2]).members[1:]: print(m["path"])
PY
); do
        cmp -s "$(dirname "$a")/$f" "$(dirname "$b")/$f" || return 1
    done
}
# layout NAME: a fresh directory tree $T/NAME with e/ (the entry), d1 d2 d3 (stripes), fast (trunk)
layout() { rm -rf "$T/$1"; mkdir -p "$T/$1/e" "$T/$1/d1" "$T/$1/d2" "$T/$1/d3" "$T/$1/fast"; }
SET3="--stripe-unit 8K"   # small units: the tiny model's extents cross several

# ---- sets: convert, verify, info, cat, the Python reader -------------------
layout a
expect_exit 0 "convert --stripe (3 members) --trunk-to" "$BIN/kpack" convert "$T/src" "$T/a/e/k3.kpk" \
    --stripe "$T/a/d1,$T/a/d2,$T/a/d3" $SET3 --trunk-to "$T/a/fast" --quiet
[ -f "$T/a/d1/k3.kpk.s0" ] && [ -f "$T/a/d2/k3.kpk.s1" ] && [ -f "$T/a/d3/k3.kpk.s2" ] && [ -f "$T/a/fast/k3.kpk.trunk" ] \
    && [ -z "$(find "$T/a" -name '*.partial' -o -name '*.journal' -o -name '*.lock')" ] \
    && ok "member files named OUT.s0, .s1, .s2 and OUT.trunk; no partial, journal or lock left" || notok "member files: $(find "$T/a" -type f)"
expect_exit 0 "verify the 3-member set with a trunk member" "$BIN/kpack" verify "$T/a/e/k3.kpk" --quiet
expect_exit 0 "kpk.py check accepts the set kpack wrote" $PY "$KPY" check "$T/a/e/k3.kpk"
$PY "$CATALL" "$BIN/kpack" "$S" "$T/a/e/k3.kpk" "3 stripe members + trunk member vs the single file"
expect_exit 0 "info on the set" "$BIN/kpack" info "$T/a/e/k3.kpk"
grep -q "stripe space .* over 3 members in units of 8 KiB" "$T/last.out" && grep -q "plain .* \.\./fast/k3.kpk.trunk" "$T/last.out" \
    && ok "info lists members, roles and stripe geometry" || notok "info: $(cat "$T/last.out")"
"$BIN/kpack" info "$T/a/e/k3.kpk" --json >"$T/info.json"
$PY - "$T/info.json" <<'PY' && ok "info --json: members, stripe, options in the manifest" || notok "info --json: $(head -c 400 "$T/info.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert [m["role"] for m in j["members"]] == ["entry", "plain", "stripe", "stripe", "stripe"], j["members"]
assert j["stripe"] == {"members": 3, "unit": 8192, "length": j["stripe"]["length"]} and j["stripe"]["length"] % (3 * 8192) == 0
o = j["manifest"]["options"]
assert o["stripe"] == {"members": 3, "unit": 8192} and o["trunk_member"] == 1 and o["compress"] == "none", o
assert j["manifest"]["format"] == "KPK 1.1"
PY
# where the extents went (§7.1): meta in the entry, globals and trunks in the trunk member, experts striped
$PY - "$KPY" "$T/a/e/k3.kpk" <<'PY' && ok "meta and archive in the entry, globals and trunks in the trunk member, experts striped" || notok "placement"
import importlib.util, sys
spec = importlib.util.spec_from_file_location("kpk", sys.argv[1]); kpk = importlib.util.module_from_spec(spec); spec.loader.exec_module(kpk)
k = kpk.load(sys.argv[2])
want = {1: 0, 2: 1, 3: 1, 4: kpk.STRIPED, 5: 0}
assert all(x["member"] == want[x["kind"]] for x in k.extents)
PY
layout b
expect_exit 0 "convert --stripe (2 members), default unit" "$BIN/kpack" convert "$T/src" "$T/b/e/k3.kpk" --stripe "$T/b/d1,$T/b/d2" --quiet
expect_exit 0 "verify the 2-member set" "$BIN/kpack" verify "$T/b/e/k3.kpk" --quiet
$PY "$CATALL" "$BIN/kpack" "$S" "$T/b/e/k3.kpk" "2 stripe members vs the single file"
layout c
expect_exit 0 "convert --trunk-to alone (experts stay in the entry)" "$BIN/kpack" convert "$T/src" "$T/c/e/k3.kpk" --trunk-to "$T/c/fast" --quiet
expect_exit 0 "verify the trunk-member set" "$BIN/kpack" verify "$T/c/e/k3.kpk" --quiet
$PY "$CATALL" "$BIN/kpack" "$S" "$T/c/e/k3.kpk" "trunk member vs the single file"
# the same options twice: the same bytes
layout a2
"$BIN/kpack" convert "$T/src" "$T/a2/e/k3.kpk" --stripe "$T/a2/d1,$T/a2/d2,$T/a2/d3" $SET3 --trunk-to "$T/a2/fast" --quiet
same_set "$T/a/e/k3.kpk" "$T/a2/e/k3.kpk" && ok "converting to a set twice gives identical member files" || notok "two set conversions differ"

# ---- the dry run, refusals ---------------------------------------------------
layout d
expect_exit 0 "convert --dry-run of a set" "$BIN/kpack" convert "$T/src" "$T/d/e/k3.kpk" --stripe "$T/d/d1,$T/d/d2,$T/d/d3" $SET3 --trunk-to "$T/d/fast" --dry-run
grep -q "5 member files (3 striped in units of 8 KiB)" "$T/last.out" && [ "$(grep -c '^    stripe ' "$T/last.out")" -eq 3 ] \
    && [ -z "$(find "$T/d" -type f)" ] && ok "the dry run prints each member file's size and writes nothing" || notok "dry run: $(cat "$T/last.out")"
"$BIN/kpack" convert "$T/src" "$T/d/e/k3.kpk" --stripe "$T/d/d1,$T/d/d2,$T/d/d3" $SET3 --trunk-to "$T/d/fast" --dry-run --json >"$T/dry.json"
$PY - "$T/dry.json" "$T/a" <<'PY' && ok "the dry run's sizes are the sizes written" || notok "dry-run sizes: $(cat "$T/dry.json" | head -c 300)"
import json, os, sys
j = json.load(open(sys.argv[1]))
got = [os.path.getsize(os.path.join(sys.argv[2], m["path"].split("/d/", 1)[1])) for m in j["members"]]
assert got == [m["bytes"] for m in j["members"]], (got, j["members"])
PY
touch "$T/a/d1/other.kpk.s0"
expect_exit 2 "a member file that exists is not overwritten" "$BIN/kpack" convert "$T/src" "$T/a/e/other.kpk" --stripe "$T/a/d1" --quiet
expect_err "other.kpk.s0 already exists; use --force" "the existing member file is named"
[ ! -s "$T/a/d1/other.kpk.s0" ] && [ ! -e "$T/a/e/other.kpk" ] && ok "nothing of the user's was changed" || notok "an existing member file was touched"
expect_exit 2 "--stripe with a directory that does not exist" "$BIN/kpack" convert "$T/src" "$T/x.kpk" --stripe "$T/a/d1,$T/nope" --quiet
expect_err "nope: No such file or directory" "the missing directory is named"
expect_exit 2 "--stripe-unit not a multiple of the alignment" "$BIN/kpack" convert "$T/src" "$T/x.kpk" --stripe "$T/a/d1" --stripe-unit 8K --align 64K --quiet
expect_exit 2 "--stripe-unit not a power of two" "$BIN/kpack" convert "$T/src" "$T/x.kpk" --stripe "$T/a/d1" --stripe-unit 12K --quiet
# free space is checked per filesystem; members on one filesystem add up
layout f
KPACK_TEST_FREE_BYTES=100000 expect_exit 2 "not enough free space for a set (simulated)" "$BIN/kpack" convert "$T/src" "$T/f/e/k3.kpk" \
    --stripe "$T/f/d1,$T/f/d2" --trunk-to "$T/f/fast" --quiet
expect_err "not enough free space for .*k3.kpk, .*fast/k3.kpk.trunk, .*d1/k3.kpk.s0, .*d2/k3.kpk.s1: need .* \([0-9]+ bytes\), .* \(100000 bytes\) available, on the filesystem of" \
    "one filesystem: the members' needs are added, both numbers and the filesystem named"
[ -z "$(find "$T/f" -type f)" ] && ok "nothing written when space is short" || notok "files written despite no space"

# ---- bad sets (§7.4): exit 2, the member named ------------------------------
badset() { # WHAT PATTERN: on a fresh copy of set a in $T/bad, after the caller's damage
    expect_exit 2 "$1" "$BIN/kpack" verify "$T/bad/e/k3.kpk" --quiet
    expect_err "$2" "$1: named"
}
fresh() { rm -rf "$T/bad"; cp -a "$T/a" "$T/bad"; }
fresh; rm "$T/bad/d2/k3.kpk.s1"
badset "a missing member" "member 3 \(\.\./d2/k3\.kpk\.s1\): No such file or directory"
fresh; truncate -s -4096 "$T/bad/d3/k3.kpk.s2"
badset "a truncated member" "member 4 \(\.\./d3/k3\.kpk\.s2\): truncated or extended"
fresh; rm "$T/bad/d3/k3.kpk.s2"; ln -s "$T/bad/d1/k3.kpk.s0" "$T/bad/d3/k3.kpk.s2"
badset "the same member twice through a symlink" "member 4 \(\.\./d3/k3\.kpk\.s2\): duplicated: this is the same file as member 2"
fresh; mv "$T/bad/d1/k3.kpk.s0" "$T/bad/x"; mv "$T/bad/d3/k3.kpk.s2" "$T/bad/d1/k3.kpk.s0"; mv "$T/bad/x" "$T/bad/d3/k3.kpk.s2"
badset "two members renamed into each other's place" "member 2 \(\.\./d1/k3\.kpk\.s0\): renamed or swapped: the file at this path is member 4"
layout o
"$BIN/k3synth" "$T/src2" --geometry tiny --shards 2 --seed 14 --quiet >/dev/null
"$BIN/kpack" convert "$T/src2" "$T/o/e/k3.kpk" --stripe "$T/o/d1,$T/o/d2,$T/o/d3" $SET3 --trunk-to "$T/o/fast" --quiet
fresh; cp "$T/o/d2/k3.kpk.s1" "$T/bad/d2/k3.kpk.s1"
badset "a member of another conversion" "member 3 \(\.\./d2/k3\.kpk\.s1\): belongs to another set"
# krun reads what kpack wrote (tests/cli/test_krun_sets.sh: every budget and --io mode)
if "$BIN/krun" "$S" --ids 3,7,11 --gen 4 --print-ids --quiet >"$T/ka.ids" 2>"$T/ka.err" \
   && "$BIN/krun" "$T/a/e/k3.kpk" --ids 3,7,11 --gen 4 --print-ids --mem 64M --quiet >"$T/kb.ids" 2>"$T/kb.err" && cmp -s "$T/ka.ids" "$T/kb.ids"; then
    ok "krun on kpack's set (3 stripes + trunk) gives the same ids as on the single file"
else notok "krun on kpack's set: $(cat "$T/ka.err" "$T/kb.err" | head -3)"; fi

# ---- kill -9 and resume: identical members ----------------------------------
n_ext=$("$BIN/kpack" info "$S" --json | $PY -c 'import json,sys; j=json.load(sys.stdin); print(sum(v["count"] for v in j["extents"].values()))')
for sync in 1 40000; do
    for n in 1 37 $((n_ext - 1)); do
        layout k
        KPACK_SYNC_BYTES=$sync KPACK_TEST_KILL_AFTER=$n "$BIN/kpack" convert "$T/src" "$T/k/e/k3.kpk" \
            --stripe "$T/k/d1,$T/k/d2,$T/k/d3" $SET3 --trunk-to "$T/k/fast" --quiet 2>/dev/null
        rc=$?
        [ $rc -eq 137 ] && [ -e "$T/k/d1/k3.kpk.s0.partial" ] && [ ! -e "$T/k/e/k3.kpk" ] \
            || { notok "kill after extent $n (sync $sync): rc $rc"; continue; }
        "$BIN/kpack" convert "$T/src" "$T/k/e/k3.kpk" --stripe "$T/k/d1,$T/k/d2,$T/k/d3" $SET3 --trunk-to "$T/k/fast" \
            2>"$T/resume.err" >/dev/null
        rc=$?
        if [ $rc -eq 0 ] && same_set "$T/a/e/k3.kpk" "$T/k/e/k3.kpk"; then
            ok "set killed after extent $n (journal every $sync bytes), rerun: identical members ($(grep -o '[0-9]* of [0-9]* extents' "$T/resume.err" || echo 'from the start'))"
        else notok "set killed after extent $n (sync $sync): rerun rc $rc: $(cat "$T/resume.err")"; fi
        [ -z "$(find "$T/k" -name '*.partial' -o -name '*.journal')" ] || notok "leftovers after the resumed set conversion"
    done
done
# a journaled extent damaged in a stripe member is re-verified and redone:
# the newest journaled extent is a striped expert, x
x=$($PY - "$KPY" "$T/a/e/k3.kpk" <<'PY'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("kpk", sys.argv[1]); kpk = importlib.util.module_from_spec(spec); spec.loader.exec_module(kpk)
print(next(i for i, x in enumerate(kpk.load(sys.argv[2]).extents) if i >= 30 and x["member"] == kpk.STRIPED))
PY
)
layout k
KPACK_SYNC_BYTES=1 KPACK_TEST_KILL_AFTER=$((x + 1)) "$BIN/kpack" convert "$T/src" "$T/k/e/k3.kpk" --stripe "$T/k/d1,$T/k/d2,$T/k/d3" $SET3 \
    --trunk-to "$T/k/fast" --quiet 2>/dev/null
$PY - "$KPY" "$T/a/e/k3.kpk" "$T/k" "$x" <<'PY'
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("kpk", sys.argv[1]); kpk = importlib.util.module_from_spec(spec); spec.loader.exec_module(kpk)
k = kpk.load(sys.argv[2])
x = k.extents[int(sys.argv[4])]
assert x["member"] == kpk.STRIPED
U, N, A = k.sb["stripe_unit"], k.sb["stripe_count"], k.sb["align"]
u, inside = divmod(x["offset"] + x["stored_len"] // 2, U)
path = os.path.join(sys.argv[3], "e", k.members[k.stripe_member[u % N]]["path"]) + ".partial"
with open(path, "r+b") as f:
    f.seek(A + (u // N) * U + inside); b = f.read(1); f.seek(A + (u // N) * U + inside); f.write(bytes([b[0] ^ 1]))
PY
"$BIN/kpack" convert "$T/src" "$T/k/e/k3.kpk" --stripe "$T/k/d1,$T/k/d2,$T/k/d3" $SET3 --trunk-to "$T/k/fast" 2>"$T/resume.err" >/dev/null \
    && same_set "$T/a/e/k3.kpk" "$T/k/e/k3.kpk" && grep -q "resuming .*: $x of" "$T/resume.err" \
    && ok "a damaged journaled extent in a stripe member is re-hashed and redone (resumed at $x)" || notok "damaged stripe partial: $(cat "$T/resume.err")"
# a real kill -9 from outside, several times, then let it finish
layout k
kills=0
for i in 1 2 3; do
    KPACK_SYNC_BYTES=1 KPACK_TEST_DELAY_MS=15 "$BIN/kpack" convert "$T/src" "$T/k/e/k3.kpk" --stripe "$T/k/d1,$T/k/d2,$T/k/d3" $SET3 \
        --trunk-to "$T/k/fast" --quiet 2>/dev/null &
    pid=$!
    sleep 0.$((3 + i))
    kill -9 $pid 2>/dev/null && kills=$((kills + 1))
    wait $pid 2>/dev/null
done
"$BIN/kpack" convert "$T/src" "$T/k/e/k3.kpk" --stripe "$T/k/d1,$T/k/d2,$T/k/d3" $SET3 --trunk-to "$T/k/fast" --quiet 2>"$T/resume.err"
same_set "$T/a/e/k3.kpk" "$T/k/e/k3.kpk" && ok "$kills external kill -9 during a set conversion, then rerun: identical members" \
    || notok "external kill -9 on a set: $(cat "$T/resume.err")"
# a changed option (another stripe unit) does not reuse the partial members
layout k
KPACK_SYNC_BYTES=1 KPACK_TEST_KILL_AFTER=30 "$BIN/kpack" convert "$T/src" "$T/k/e/k3.kpk" --stripe "$T/k/d1,$T/k/d2,$T/k/d3" $SET3 \
    --trunk-to "$T/k/fast" --quiet 2>/dev/null
"$BIN/kpack" convert "$T/src" "$T/k/e/k3.kpk" --stripe "$T/k/d1,$T/k/d2,$T/k/d3" --stripe-unit 16K --trunk-to "$T/k/fast" 2>"$T/resume.err" >/dev/null
layout k2
"$BIN/kpack" convert "$T/src" "$T/k2/e/k3.kpk" --stripe "$T/k2/d1,$T/k2/d2,$T/k2/d3" --stripe-unit 16K --trunk-to "$T/k2/fast" --quiet
same_set "$T/k2/e/k3.kpk" "$T/k/e/k3.kpk" && grep -q "another source or with other options.*starting over" "$T/resume.err" \
    && ok "a partial set from another stripe unit is discarded, not mixed in" || notok "changed unit: $(cat "$T/resume.err")"

# ---- one writer per output (issue 12.2), for sets ---------------------------
layout l
KPACK_SYNC_BYTES=1 KPACK_TEST_DELAY_MS=30 "$BIN/kpack" convert "$T/src" "$T/l/e/k3.kpk" --stripe "$T/l/d1,$T/l/d2" $SET3 --quiet 2>"$T/first.err" &
pid=$!
for _ in $(seq 200); do [ -e "$T/l/d2/k3.kpk.s1.partial" ] && break; sleep 0.05; done
expect_exit 2 "a second conversion of the same set while the first runs" "$BIN/kpack" convert "$T/src" "$T/l/e/k3.kpk" --stripe "$T/l/d1,$T/l/d2" $SET3 --quiet
expect_err "k3.kpk is being converted by another kpack \(pid $pid, lock" "it names the first's pid"
mkdir -p "$T/l/e2"
expect_exit 2 "another output of the same name striped into the same directories meanwhile" "$BIN/kpack" convert "$T/src" "$T/l/e2/k3.kpk" --stripe "$T/l/d1,$T/l/d2" $SET3 --quiet
expect_err "k3.kpk.s0.partial is being written by another kpack" "the shared member file is named"
wait $pid; rc=$?
[ $rc -eq 0 ] && "$BIN/kpack" verify "$T/l/e/k3.kpk" --quiet >/dev/null && ok "the first completes intact (exit 0, verify OK)" \
    || notok "the first conversion: rc $rc: $(cat "$T/first.err")"

# ---- re-layout from a KPK file or set == conversion of the shards ----------
layout r
expect_exit 0 "convert single.kpk into a set (no shards needed)" "$BIN/kpack" convert "$S" "$T/r/e/k3.kpk" \
    --stripe "$T/r/d1,$T/r/d2,$T/r/d3" $SET3 --trunk-to "$T/r/fast" --quiet
same_set "$T/a/e/k3.kpk" "$T/r/e/k3.kpk" && ok "re-laid out from the .kpk == converted from the shards (every member byte-identical)" \
    || notok "re-layout from .kpk differs from the shard conversion"
expect_exit 0 "convert the set back into one file" "$BIN/kpack" convert "$T/a/e/k3.kpk" "$T/back.kpk" --quiet
cmp -s "$T/back.kpk" "$S" && ok "set -> single file == the shard conversion" || notok "set -> single differs"
"$BIN/kpack" convert "$T/src" "$T/tf.kpk" --order trunk-first --align 64K --quiet
expect_exit 0 "re-layout with --order and --align" "$BIN/kpack" convert "$T/a/e/k3.kpk" "$T/tf2.kpk" --order trunk-first --align 64K --quiet
cmp -s "$T/tf.kpk" "$T/tf2.kpk" && ok "set -> trunk-first, 64K alignment == the shard conversion with those options" || notok "re-layout with options differs"
$PY - "$S" "$T/r/e/k3.kpk" <<'PY' && ok "the source provenance and the archive recipe of the old manifest are kept" || notok "provenance"
import json, struct, sys
def manifest(p):
    d = open(p, "rb").read(); off, n = struct.unpack_from("<QQ", d, 128); return json.loads(d[off:off + n])
a, b = manifest(sys.argv[1]), manifest(sys.argv[2])
assert a["source"] == b["source"] and a["archive"] == b["archive"] and b["source"]["layout"] == "sharded"
PY
# from files the Python writer made: codec-2 blocks of every method, archive extents
$PY "$KPY" relayout "$S" "$T/blocks.kpk" --codec2 all --block-size 8192
expect_exit 0 "re-layout of a file with compressed blocks (decoded while copied)" "$BIN/kpack" convert "$T/blocks.kpk" "$T/unblocked.kpk" --quiet
cmp -s "$T/unblocked.kpk" "$S" && ok "... == the shard conversion" || notok "re-layout of a codec-2 file differs"
"$BIN/kpack" convert "$T/src" "$T/noarch.kpk" --no-archive --quiet
$PY "$KPY" relayout "$T/noarch.kpk" "$T/arch.kpk" --archive
expect_exit 0 "re-layout of a file with an archive" "$BIN/kpack" convert "$T/arch.kpk" "$T/arch2.kpk" --stripe "$T/a/d1,$T/a/d2" --quiet --force
expect_exit 0 "verify it" "$BIN/kpack" verify "$T/arch2.kpk" --quiet
"$BIN/kpack" info "$T/arch2.kpk" >"$T/info.txt"
grep -q "archive:   1 file of the download" "$T/info.txt" && [ "$("$BIN/kpack" cat "$T/arch2.kpk" archive/files/README.md | head -c 6)" = "# a fi" ] \
    && ok "the archive is kept (extents and recipe)" || notok "archive after re-layout: $(cat "$T/info.txt")"
# a source laid out otherwise (tensors of its trunks spread apart): copied tensor by tensor,
# each such source extent checked whole first
$PY "$KPY" mutate "$S" "$T/spread.kpk" spread >/dev/null
expect_exit 0 "a valid KPK file whose trunk tensors are spread apart verifies" "$BIN/kpack" verify "$T/spread.kpk" --quiet
expect_exit 0 "re-layout of it" "$BIN/kpack" convert "$T/spread.kpk" "$T/unspread.kpk" --quiet
cmp -s "$T/unspread.kpk" "$S" && ok "... == the shard conversion (canonical layout again)" || notok "re-layout of a spread file differs"
$PY - "$T/spread.kpk" <<'PY'
import struct, sys
p = sys.argv[1]; d = bytearray(open(p, "rb").read())
eo, n = struct.unpack_from("<QQ", d, 56)
for i in range(n):
    kind, = struct.unpack_from("<B", d, eo + 64 * i)
    off, stored = struct.unpack_from("<QQ", d, eo + 64 * i + 16)
    if kind == 3: d[off + stored // 2] ^= 2; break
open(p, "wb").write(d)
PY
expect_exit 1 "re-layout of a damaged source copied tensor by tensor" "$BIN/kpack" convert "$T/spread.kpk" "$T/unspread2.kpk" --quiet
expect_err "the source is damaged: .*layer 0 trunk .*checksum mismatch" "the damaged source extent is named"
# a damaged source is caught while it is read (exit 1), nothing published
cp "$S" "$T/bad.kpk"
$PY - "$T/bad.kpk" <<'PY'
import struct, sys
p = sys.argv[1]; d = bytearray(open(p, "rb").read())
eo, n = struct.unpack_from("<QQ", d, 56)
for i in range(n):
    kind, = struct.unpack_from("<B", d, eo + 64 * i)
    off, stored = struct.unpack_from("<QQ", d, eo + 64 * i + 16)
    if kind == 4: d[off + stored // 2] ^= 4; break
open(p, "wb").write(d)
PY
expect_exit 1 "re-layout of a damaged KPK file" "$BIN/kpack" convert "$T/bad.kpk" "$T/frombad.kpk" --quiet
expect_err "the source is damaged: its layer [0-9]+ expert [0-9]+ does not match its checksum" "the damaged source extent is named"
[ ! -e "$T/frombad.kpk" ] && ok "nothing published from a damaged source" || notok "published from a damaged source"
expect_exit 2 "--sha256 with a KPK source" "$BIN/kpack" convert "$S" "$T/y.kpk" --sha256 /dev/null --quiet
finish
