#!/usr/bin/env bash
# The KPK 1.1 reader against the independent Python implementation of
# FORMAT.md (tests/ref/kpk.py): files it writes in every 1.1 shape (codec-2
# blocks of every method, stripe sets, a trunk member, archive extents, a
# newer minor version) are accepted, verified and read back tensor for tensor;
# each re-sealed mutation is refused with its own message and exit code, and
# the Python reader's verdict agrees; every bad-set case of §7.4 is named.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
KPY="$TOP/tests/ref/kpk.py"
CATALL="$TOP/tests/cli/kpk_cat_all.py"
command -v zstd >/dev/null || { skip "KPK 1.1 reader tests: the zstd command line tool is not installed (make deps)"; finish; exit 0; }

"$BIN/k3synth" "$T/src" --geometry tiny --shards 3 --seed 7 --quiet >/dev/null 2>"$T/synth.err" \
    || { notok "k3synth tiny: $(cat "$T/synth.err")"; finish; exit 1; }
# without an archive: kpk.py relayout --archive adds one of its own
"$BIN/kpack" convert "$T/src" "$T/s.kpk" --no-archive --quiet || { notok "convert"; finish; exit 1; }
S="$T/s.kpk"

# ---- the Python reader accepts what kpack writes ---------------------------
expect_exit 0 "kpk.py check accepts a file kpack wrote (every checksum, every zero byte)" $PY "$KPY" check "$S"

# ---- valid 1.1 shapes: accepted, verified, every tensor identical ----------
mkdir -p "$T/d1" "$T/d2" "$T/d3" "$T/fast"
variant() { # NAME LABEL RELAYOUT-ARGS...
    local name=$1 label=$2; shift 2
    if ! $PY "$KPY" relayout "$S" "$T/$name.kpk" "$@" 2>"$T/py.err"; then notok "kpk.py relayout $label: $(tail -2 "$T/py.err")"; return 1; fi
    expect_exit 0 "verify: $label" "$BIN/kpack" verify "$T/$name.kpk" --quiet
    expect_exit 0 "info: $label" "$BIN/kpack" info "$T/$name.kpk"
}
variant blocks "codec-2 blocks of every method (raw, zstd, split2 with each plane coded or raw)" --codec2 all --block-size 8192 \
    && $PY "$CATALL" "$BIN/kpack" "$S" "$T/blocks.kpk" "codec-2 blocks" \
    && { grep -q "stored / decoded" "$T/last.out" && ok "info shows stored / decoded by kind" || notok "info ratios: $(cat "$T/last.out")"; }
variant trunkblocks "codec-2 trunk extents, blocks of 3000 bytes cut on rows, 64K alignment" --codec2 trunk --block-size 3000 --align 65536
variant set3 "a set: 3 stripe members (8 KiB units) and a trunk member" --stripe "$T/d1,$T/d2,$T/d3" --unit 8192 --trunk-to "$T/fast" \
    && $PY "$CATALL" "$BIN/kpack" "$S" "$T/set3.kpk" "3-member stripe set + trunk member" \
    && { grep -q "stripe space .* over 3 members in units of 8 KiB" "$T/last.out" && grep -q "plain .*fast/set3.kpk.trunk" "$T/last.out" \
         && ok "info lists the members and the stripe geometry" || notok "info on a set: $(cat "$T/last.out")"; }
variant set2 "a set: 2 stripe members (4 KiB units) with codec-2 experts" --stripe "$T/d1,$T/d2" --unit 4096 --codec2 expert \
    && $PY "$CATALL" "$BIN/kpack" "$S" "$T/set2.kpk" "2-member stripe set with codec-2 experts"
variant arch "archive extents (kind 5), codec-2 archive" --archive --codec2 archive \
    && { grep -q "archive:   1 file of the download" "$T/last.out" && ok "info shows what the archive keeps" || notok "info archive: $(cat "$T/last.out")"; } \
    && { "$BIN/kpack" cat "$T/arch.kpk" archive/files/README.md | grep -q "a file of the download" \
         && ok "cat reads an archive tensor" || notok "cat of an archive tensor"; }
variant minor3 "a newer minor version (3) whose reserved superblock bytes are set: ignored" --minor 3 --codec2 globals
variant archplain "archive extents without blocks" --archive
expect_exit 0 "kpk.py check accepts the 3-member set" $PY "$KPY" check "$T/set3.kpk"
"$BIN/kpack" verify "$T/blocks.kpk" --json >"$T/v.json"
$PY -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["ok"] and j["deep"], j' "$T/v.json" \
    && ok "verify --json: deep by default" || notok "verify --json: $(cat "$T/v.json")"

# ---- mutations, re-sealed: each refused by its rule ------------------------
# Each line: NAME BASE C-EXIT PY-EXIT PATTERN.  kpack verify exits C-EXIT and
# names the problem (PATTERN, grep -E on its output); kpk.py check exits
# PY-EXIT.  The last five are the model's rules (the K3 schema check krun
# makes, in kpack verify); kpk.py checks the container only.
B="$T/blocks.kpk"; M="$T/set3.kpk"; P="$T/archplain.kpk"
cat >"$T/mutations" <<'EOF'
drop-meta        S 1 1 no meta extent
drop-globals     S 1 1 no globals extent
two-globals      S 1 1 a second globals extent
name-wrong-layer S 1 1 layers.4095.input_layernorm.weight: its name does not belong in the layer 0 trunk extent
expert-in-trunk  S 1 1 its name does not belong in the layer 0 trunk extent
meta-unknown     S 1 1 tensor meta/evil.sh: the meta extent holds only meta/config.json, meta/tiktoken.model and meta/tokenizer_config.json
grow-extent      S 1 1 layer [0-9]+ trunk \(extent [0-9]+\): [0-9]+ decoded bytes, but its tensors end at
grow-strings     S 1 1 the string pool has [0-9]+ bytes, its names and paths take
reserved-sb      S 1 1 superblock: reserved bytes 216..4087 are not zero
reserved-tensor  S 1 1 reserved bytes 10..11 of its record are not zero
reserved-block   B 1 1 block record 0: reserved bytes are not zero
reserved-member  M 1 1 member table record 1: reserved bytes are not zero
overlap          S 1 1 overlaps the previous extent
data-bytes       S 1 1 extent sizes add up to [0-9]+ bytes, the superblock says
block-untiled    B 1 1 block [0-9]+ starts at raw [0-9]+ / stored [0-9]+, where the previous one ended at
block-row        B 1 1 block 0 ends at [0-9]+, inside a row of tensor
feature-unused   S 1 1 the ARCHIVE feature bit is set but no extent uses
stripe-index     M 1 1 stripe index 0 is out of range .* or taken twice
gap-nonzero      S 1 1 non-zero byte at decoded offset [0-9]+, between tensors
manifest-garbage S 1 1 ^manifest: not a JSON object
block-tamper     B 1 1 block [0-9]+: (zstd|decoded)
raw-block-flip   B 1 1 block [0-9]+: decoded checksum mismatch
unknown-kind     S 2 2 unsupported: newer format \(unknown kind 7\)
unknown-codec    S 2 2 unsupported: newer format \(unknown codec 3\)
unknown-dtype    S 2 2 unsupported: newer format \(unknown dtype 9\)
unknown-method   B 2 2 unsupported: newer format \(unknown method 3\)
unknown-incompat S 2 2 unsupported: newer format .*incompat flags 0x100
unknown-role     M 2 2 unsupported: newer format \(member 1 has role 3\)
newer-and-damaged S 2 2 unsupported: newer format \(unknown kind 7\)
minor0-features  P 1 1 a version 1.0 file \(minor 0\) with 1.1 feature bits
member-path-dot  M 1 1 member 1: path \./.* has an empty or '\.' component
member-path-empty M 1 1 member 1: path .*//.* has an empty or '\.' component
recipe-size      P 1 1 ^archive: README.md: its pieces add up to [0-9]+ bytes, the recipe says
layer-beyond     S 1 0 ^model: layer 13 trunk \(extent [0-9]+\): the config has 13 layers
expert-beyond    S 1 0 ^model: layer 12 expert 8 .*fewer routed experts
dtype-swap       S 1 0 ^model: tensor .* is F16 but .* is BF16: a checkpoint uses one 16-bit float type
shape-swap       S 1 0 ^model: tensor language_model.model.embed_tokens.weight has dtype BF16 and a shape other than the config implies
grow-tensor      S 1 0 ^model: tensor .* a shape other than the config implies
EOF
for base in S B M P; do
    eval "src=\$$base"
    $PY "$KPY" mutate-many "$src" "$T/mut" $(awk -v b=$base '$2 == b {print $1}' "$T/mutations") >>"$T/what" 2>"$T/py.err" \
        || notok "kpk.py mutate-many on $base: $(tail -2 "$T/py.err")"
done
$PY "$KPY" check-many "$T"/mut/*.kpk >"$T/pycheck" 2>&1
while read -r name base cx px pat; do
    out="$T/mut/$name.kpk"; what=$(awk -F'\t' -v n="$name" '$1 == n {print $2}' "$T/what")
    [ -f "$out" ] || { notok "mutation $name was not written"; continue; }
    "$BIN/kpack" verify "$out" --quiet >"$T/last.out" 2>"$T/last.err"; rc=$?
    if [ $rc -eq "$cx" ] && grep -qE -- "$pat" "$T/last.out" "$T/last.err"; then ok "verify refuses $name (exit $rc): $what"
    else notok "verify on $name: exit $rc (wanted $cx), wanted /$pat/: $(cat "$T/last.out" "$T/last.err" | head -3)"; fi
    rc=$(awk -F'\t' -v f="$out" '$1 == f {print $2}' "$T/pycheck")
    [ "$rc" = "$px" ] && ok "kpk.py check agrees on $name (exit $rc)" || notok "kpk.py check on $name: exit '$rc', wanted $px: $(grep "/$name.kpk" "$T/pycheck")"
done <"$T/mutations"
# a tampered block passes a shallow check (its stored checksum was re-sealed) and fails the deep one
$PY "$KPY" mutate "$B" "$T/tamper.kpk" block-tamper >/dev/null
expect_exit 0 "verify --shallow checks stored bytes only: a re-sealed tampered block passes" "$BIN/kpack" verify "$T/tamper.kpk" --shallow --quiet
expect_exit 1 "cat of a tensor in the tampered extent refuses" "$BIN/kpack" cat "$T/tamper.kpk" language_model.model.embed_tokens.weight

# ---- superblock damage (§3) ------------------------------------------------
cp "$S" "$T/nomagic.kpk"; printf '\0\0\0\0\0\0\0\0' | dd of="$T/nomagic.kpk" conv=notrunc 2>/dev/null
expect_exit 1 "verify: the primary's magic zeroed, backup intact: damage, not 'not a KPK file'" "$BIN/kpack" verify "$T/nomagic.kpk" --quiet
grep -q "primary superblock damaged .*opened with the backup copy" "$T/last.out" && ok "the damaged primary is named" || notok "nomagic: $(cat "$T/last.out")"
expect_exit 0 "info opens it with the backup" "$BIN/kpack" info "$T/nomagic.kpk"

# magic only, a file under 12 bytes, a flipped bit in the primary's major field (§3 steps 1-2, issue 25.10-11)
printf '\211KPK\r\n\032\n' >"$T/magic8.kpk"
expect_exit 1 "verify: a file of the 8 magic bytes only is truncated (damage), not a version 0.0" "$BIN/kpack" verify "$T/magic8.kpk" --quiet
expect_err "truncated KPK file: 8 bytes, the file ends before its version number" "the 8-byte file is named truncated"
printf '\211KPK\r\n\032\n\001\000' >"$T/magic10.kpk"
expect_exit 1 "verify: magic + major, 10 bytes: truncated" "$BIN/kpack" verify "$T/magic10.kpk" --quiet
printf '\211KPK\r' >"$T/magic5.kpk"
expect_exit 2 "verify: 5 bytes of the magic: not a KPK file" "$BIN/kpack" verify "$T/magic5.kpk" --quiet
expect_err "not a KPK file" "a file shorter than the magic is not a KPK file"
{ printf '\211KPK\r\n\032\n\002\000\000\000'; head -c 100 /dev/zero; } >"$T/major2.kpk"
expect_exit 2 "verify: a short file of major version 2: unsupported, before any size rule" "$BIN/kpack" verify "$T/major2.kpk" --quiet
expect_err "version 2.0 is not supported" "the newer major is named"
for f in magic8 magic10 magic5 major2; do
    want=$([ $f = magic8 ] || [ $f = magic10 ] && echo 1 || echo 2)
    $PY "$KPY" check "$T/$f.kpk" >/dev/null 2>&1; rc=$?
    [ $rc -eq "$want" ] && ok "kpk.py check agrees on $f (exit $rc)" || notok "kpk.py check on $f: exit $rc, wanted $want"
done
cp "$S" "$T/majorflip.kpk"; printf '\003' | dd of="$T/majorflip.kpk" bs=1 seek=8 conv=notrunc 2>/dev/null
expect_exit 1 "verify: the primary's major flipped to 3, backup intact: damage (the backup is used), not a newer format" \
    "$BIN/kpack" verify "$T/majorflip.kpk" --quiet
grep -q "primary superblock damaged (its major version reads 3; the intact backup says 1); opened with the backup copy" \
    "$T/last.out" && ok "the flipped major is named" || notok "majorflip: $(cat "$T/last.out" "$T/last.err")"
expect_exit 0 "info opens it with the backup" "$BIN/kpack" info "$T/majorflip.kpk"
expect_exit 1 "kpk.py check agrees: damage" $PY "$KPY" check "$T/majorflip.kpk"
sz=$(stat -c %s "$T/majorflip.kpk"); printf '\003' | dd of="$T/majorflip.kpk" bs=1 seek=$((sz - 4096 + 8)) conv=notrunc 2>/dev/null
expect_exit 2 "verify: both copies say major 3: a newer format" "$BIN/kpack" verify "$T/majorflip.kpk" --quiet
expect_exit 2 "kpk.py check agrees: a newer format" $PY "$KPY" check "$T/majorflip.kpk"

# ---- the archive's recipe (§9.2, issue 25.6): verify refuses what export would --
# each name a rebuild must not write; verify, export and kpk.py refuse it (damage)
for bad in ../README.md /tmp/README.md a//README.md ./README.md README.md/ a/./b a/../../b .. ""; do
    $PY "$KPY" mutate "$P" "$T/rn.kpk" recipe-name "$bad" >/dev/null 2>"$T/py.err" || { notok "mutate recipe-name '$bad': $(tail -1 "$T/py.err")"; continue; }
    "$BIN/kpack" verify "$T/rn.kpk" --quiet >"$T/last.out" 2>&1; rc=$?
    [ $rc -eq 1 ] && grep -qF "files[0] \"$bad\": a file name that is not a relative path inside the directory" "$T/last.out" \
        && ok "verify refuses the recipe name '$bad' (exit 1)" || notok "verify on recipe name '$bad': exit $rc: $(head -3 "$T/last.out")"
    rm -rf "$T/rnx"; "$BIN/kpack" export "$T/rn.kpk" "$T/rnx" --quiet >/dev/null 2>&1; rc=$?
    [ $rc -eq 1 ] && [ ! -e "$T/rnx/README.md" ] && ok "export refuses it too (exit 1)" || notok "export of recipe name '$bad': exit $rc"
    $PY "$KPY" check "$T/rn.kpk" >/dev/null 2>&1; rc=$?
    [ $rc -eq 1 ] && ok "kpk.py check agrees on '$bad' (exit 1)" || notok "kpk.py check on recipe name '$bad': exit $rc"
done
expect_exit 0 "the intact recipe verifies" "$BIN/kpack" verify "$P" --quiet
expect_exit 0 "and exports" "$BIN/kpack" export "$P" "$T/pexp" --quiet

# ---- sets: every member problem of §7.4 (exit 2, named) --------------------
# fresh copies of the 3-member set + trunk member, in its own directory tree
mkset() { rm -rf "$T/set"; mkdir -p "$T/set/e" "$T/set/d1" "$T/set/d2" "$T/set/d3" "$T/set/fast"
    $PY "$KPY" relayout "$S" "$T/set/e/m.kpk" --stripe "$T/set/d1,$T/set/d2,$T/set/d3" --unit ${UNIT:-8192} ${NOTRUNK:---trunk-to "$T/set/fast"} "$@"; }
E="$T/set/e/m.kpk"
setcase() { # WHAT PATTERN [EXIT]
    expect_exit "${3:-2}" "set: $1" "$BIN/kpack" verify "$E" --quiet
    grep -qE -- "$2" "$T/last.err" "$T/last.out" && ok "set: $1 is named" || notok "set: $1: wanted /$2/: $(cat "$T/last.err" "$T/last.out" | head -2)"
}
mkset; rm "$T/set/d3/m.kpk.s2"
setcase "a missing member" "member 4 \(\.\./d3/m\.kpk\.s2\): No such file or directory \(missing member file\)"
expect_exit 2 "info on a set with a missing member" "$BIN/kpack" info "$E"
expect_exit 2 "cat from a set with a missing member" "$BIN/kpack" cat "$E" meta/config.json
mkset; truncate -s -4096 "$T/set/d2/m.kpk.s1"
setcase "a truncated member" "member 3 \(\.\./d2/m\.kpk\.s1\): truncated or extended: the set records [0-9]+ bytes, the file has"
mkset; truncate -s +4096 "$T/set/fast/m.kpk.trunk"
setcase "an extended member" "member 1 \(\.\./fast/m\.kpk\.trunk\): truncated or extended"
mkset; rm "$T/set/d2/m.kpk.s1"; ln -s ../d1/m.kpk.s0 "$T/set/d2/m.kpk.s1"
setcase "the same member twice (a symlink)" "member 3 \(\.\./d2/m\.kpk\.s1\): duplicated: this is the same file as member 2"
mkset; mv "$T/set/d1/m.kpk.s0" "$T/x"; mv "$T/set/d2/m.kpk.s1" "$T/set/d1/m.kpk.s0"; mv "$T/x" "$T/set/d2/m.kpk.s1"
setcase "two members swapped" "member 2 \(\.\./d1/m\.kpk\.s0\): renamed or swapped: the file at this path is member 3"
"$BIN/k3synth" "$T/src8" --geometry tiny --shards 3 --seed 8 --quiet >/dev/null && "$BIN/kpack" convert "$T/src8" "$T/s8.kpk" --quiet
mkdir -p "$T/other/e" "$T/other/d1" "$T/other/d2" "$T/other/d3" "$T/other/fast"
$PY "$KPY" relayout "$T/s8.kpk" "$T/other/e/m.kpk" --stripe "$T/other/d1,$T/other/d2,$T/other/d3" --unit 8192 --trunk-to "$T/other/fast"
mkset; cp "$T/other/d3/m.kpk.s2" "$T/set/d3/m.kpk.s2"
setcase "a member of another set" "member 4 \(\.\./d3/m\.kpk\.s2\): belongs to another set"
mkdir -p "$T/v2/e" "$T/v2/d1" "$T/v2/d2" "$T/v2/d3" "$T/v2/fast"
$PY "$KPY" relayout "$S" "$T/v2/e/m.kpk" --stripe "$T/v2/d1,$T/v2/d2,$T/v2/d3" --unit 8192 --trunk-to "$T/v2/fast" --minor 3
mkset; cp "$T/v2/d1/m.kpk.s0" "$T/set/d1/m.kpk.s0"
setcase "a member that does not match the set (same set id, another minor version)" "member 2 \(\.\./d1/m\.kpk\.s0\): does not match the set: its minor version differs"
mkset; expect_exit 2 "opening a member file directly" "$BIN/kpack" verify "$T/set/d2/m.kpk.s1" --quiet
expect_err "this is member 3 of a set of 5 files; open the set's entry file" "a member opened directly says which it is"
expect_exit 0 "verify the intact set" "$BIN/kpack" verify "$E" --quiet
# the set moved as a whole still opens (paths are relative to the entry)
mv "$T/set" "$T/moved" && expect_exit 0 "verify a set moved as a whole" "$BIN/kpack" verify "$T/moved/e/m.kpk" --quiet; rm -rf "$T/moved"
# opened through a symlink to the entry: member paths are relative to the entry's real directory
mkset; ln -s "$E" "$T/link.kpk"; expect_exit 0 "verify a set through a symlink to its entry" "$BIN/kpack" verify "$T/link.kpk" --quiet
# damage inside members: named (exit 1)
mkset; printf 'X' | dd of="$T/set/d1/m.kpk.s0" bs=1 seek=100 conv=notrunc 2>/dev/null
setcase "a member's primary superblock damaged" "member 2 \(\.\./d1/m\.kpk\.s0\): primary superblock damaged" 1
NOTRUNK=" " UNIT=65536 mkset; $PY - "$KPY" "$E" >"$T/where" <<'PY'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("kpk", sys.argv[1]); kpk = importlib.util.module_from_spec(spec); spec.loader.exec_module(kpk)
k = kpk.load(sys.argv[2])
def place(pos):  # stripe-space position -> (member path, offset)
    U, N, A = k.sb["stripe_unit"], k.sb["stripe_count"], k.sb["align"]
    u, inside = divmod(pos, U)
    m = k.stripe_member[u % N]
    return k.members[m]["path"], A + (u // N) * U + inside
x = next(x for x in k.extents if x["kind"] == 4 and x["member"] == kpk.STRIPED and x["stored_len"] > 6000)
p, o = place(x["offset"] + x["stored_len"] - 10)
print("flip", p, o, kpk.describe(x))
reg = next(r for r in k.zero_regions() if r[0] == kpk.STRIPED)
p, o = place(reg[1])
print("stripe", p, o, reg[1])
PY
read -r _ fp fo fdesc < <(grep '^flip' "$T/where"); read -r _ sp so _ < <(grep '^stripe' "$T/where")
printf '\x01' | dd of="$T/set/e/$fp" bs=1 seek="$fo" conv=notrunc 2>/dev/null
setcase "a bit flip in a striped extent" "^$fdesc: checksum mismatch" 1
NOTRUNK=" " UNIT=65536 mkset; printf '\x01' | dd of="$T/set/e/$sp" bs=1 seek="$so" conv=notrunc 2>/dev/null
setcase "a byte in unused stripe space" "^stripe space: unused space after the last extent: non-zero bytes" 1

# ---- krun reads a set (tests/cli/test_krun_sets.sh runs it at every budget and --io mode)
mkset
if "$BIN/krun" "$S" --ids 3,7,11 --gen 4 --print-ids --quiet >"$T/a.ids" 2>"$T/a.err" \
   && "$BIN/krun" "$E" --ids 3,7,11 --gen 4 --print-ids --quiet >"$T/b.ids" 2>"$T/b.err" && cmp -s "$T/a.ids" "$T/b.ids"; then
    ok "krun on a set of 5 members gives the same ids as on the single file"
else notok "krun on a set: $(cat "$T/a.err" "$T/b.err" | head -3)"; fi
# krun runs codec-2 trunk and expert extents (mapped, decoded block by block
# through the reader) with the same output
$PY "$KPY" relayout "$S" "$T/te.kpk" --codec2 trunk,expert --block-size 4096
if "$BIN/krun" "$S" --ids 3,7,11 --gen 4 --print-ids --quiet >"$T/a.ids" 2>"$T/a.err" \
   && "$BIN/krun" "$T/te.kpk" --ids 3,7,11 --gen 4 --print-ids --quiet >"$T/b.ids" 2>"$T/b.err" && cmp -s "$T/a.ids" "$T/b.ids"; then
    ok "krun on codec-2 trunk and expert extents gives the same ids as on the plain file"
else notok "krun codec-2: $(cat "$T/a.err" "$T/b.err" | head -3)"; fi
finish
