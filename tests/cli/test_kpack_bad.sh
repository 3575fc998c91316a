#!/usr/bin/env bash
# Bad input: every case gets a clear error naming what is wrong, a non-zero
# exit, and nothing of the user's is overwritten; never a crash.
. "$(dirname "$0")/lib.sh"
ST="$TOP/tests/cli/st_tool.py"

"$BIN/k3synth" "$T/src" --geometry tiny --shards 3 --seed 3 --quiet >/dev/null 2>"$T/synth.err" \
    || { notok "k3synth tiny: $(cat "$T/synth.err")"; finish; exit 1; }

# bad_source KIND ARG PATTERN: mutate a copy; check-source and convert must both refuse.
bad_source() {
    local kind=$1 arg=$2 pat=$3 d="$T/bad-$1"
    rm -rf "$d"
    python3 "$ST" mutate "$T/src" "$d" "$kind" ${arg:+"$arg"} || { notok "mutation $kind failed"; return; }
    expect_exit 1 "check-source: $kind" "$BIN/kpack" check-source "$d" --quiet
    if grep -qE -- "$pat" "$T/last.out" "$T/last.err"; then ok "check-source names the problem ($kind)"
    else notok "check-source $kind: wanted /$pat/, got: $(cat "$T/last.out" "$T/last.err" | grep -E 'BAD|-|error' | head -5)"; fi
    expect_exit 1 "convert refuses: $kind" "$BIN/kpack" convert "$d" "$T/out-$kind.kpk" --quiet
    [ ! -e "$T/out-$kind.kpk" ] && [ ! -e "$T/out-$kind.kpk.partial" ] && ok "nothing written for $kind" || notok "convert wrote output for $kind"
}

bad_source truncate ""        "truncated: .* bytes on disk, the header describes"
bad_source header-len ""      "header length .* runs past the end"
bad_source bad-json ""        "malformed header JSON"
bad_source offset-range ""    "truncated: .*tensor .* cut off"
bad_source overlap ""         "overlap"
bad_source dtype ""           "dtype U8, expected F32/BF16/F16"
bad_source shape ""           "shape \[[0-9,]+\], expected \[[0-9,]+\]"
bad_source drop "language_model.model.layers.5.block_sparse_moe.experts.3.w2.weight_scale" \
                              "missing tensor language_model.model.layers.5.block_sparse_moe.experts.3.w2.weight_scale"
bad_source extra ""           "extra unknown tensor language_model.model.layers.0.self_attn.bogus.weight"
bad_source config-drop "num_experts_per_token" "required field.* missing: num_experts_per_token"
bad_source metadata '[1, 2]'  "__metadata__ is not a JSON object"
bad_source metadata '{"format": 1}' "__metadata__ entry format is not a string"
# the released shards carry {"format": "pt"}: still accepted
rm -rf "$T/meta-ok"; python3 "$ST" mutate "$T/src" "$T/meta-ok" metadata '{"format": "pt"}'
expect_exit 0 "check-source: a __metadata__ map of strings is accepted" "$BIN/kpack" check-source "$T/meta-ok" --quiet
rm -rf "$T/two"; python3 "$ST" mutate "$T/src" "$T/two" config-drop "full_attn_layers" && \
    python3 - "$T/two/config.json" <<'PY'
import json, sys
p = sys.argv[1]; c = json.load(open(p)); c["text_config"].pop("vocab_size", None); json.dump(c, open(p, "w"))
PY
expect_exit 1 "check-source: two config fields missing" "$BIN/kpack" check-source "$T/two" --quiet
expect_err "2 required fields missing: vocab_size, full_attn_layers" "every missing field is listed"

# a shard listed by the index but absent
rm -rf "$T/gone"; cp -r "$T/src" "$T/gone"; rm "$T/gone/$(ls "$T/gone" | grep safetensors$ | sed -n 2p)"
expect_exit 1 "check-source: a shard is missing" "$BIN/kpack" check-source "$T/gone" --quiet
grep -q "missing: the index names this shard" "$T/last.out" && ok "the missing shard is named" || notok "missing shard: $(cat "$T/last.out")"
expect_exit 2 "check-source on a directory that does not exist" "$BIN/kpack" check-source "$T/nope" --quiet

# ---- bad KPK files --------------------------------------------------------
"$BIN/kpack" convert "$T/src" "$T/good.kpk" --quiet || { notok "convert of the good source failed"; finish; exit 1; }
offset_of() { # offset of the extent described by python expr on (kind, layer, expert)
python3 - "$1" "$2" <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read()
want = eval(sys.argv[2])
ext_off, ext_n = struct.unpack_from("<QQ", d, 56)
for i in range(ext_n):
    kind, codec, member, layer, expert = struct.unpack_from("<BBHII", d, ext_off + 64 * i)
    off, stored = struct.unpack_from("<QQ", d, ext_off + 64 * i + 16)
    if (kind, layer, expert) == want:
        print(off, stored); break
PY
}
flip() { # flip one bit of FILE at OFFSET
python3 - "$1" "$2" <<'PY'
import sys
p, off = sys.argv[1], int(sys.argv[2])
with open(p, "r+b") as f:
    f.seek(off); b = f.read(1); f.seek(off); f.write(bytes([b[0] ^ 0x10]))
PY
}
read -r eoff elen < <(offset_of "$T/good.kpk" "(4, 7, 5)")
cp "$T/good.kpk" "$T/flip.kpk"; flip "$T/flip.kpk" $((eoff + elen / 2))
expect_exit 1 "verify: a bit flip inside an expert extent" "$BIN/kpack" verify "$T/flip.kpk" --quiet
grep -q "^layer 7 expert 5: checksum mismatch" "$T/last.out" && ok "verify names it: layer 7 expert 5" || notok "verify output: $(cat "$T/last.out")"
expect_exit 1 "verify --json on the flipped file" "$BIN/kpack" verify "$T/flip.kpk" --json
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert not j["ok"] and j["problems"][0]["what"]=="layer 7 expert 5"' "$T/last.out" \
    && ok "verify --json names the extent" || notok "verify --json"
expect_exit 1 "cat from the damaged extent refuses" "$BIN/kpack" cat "$T/flip.kpk" language_model.model.layers.7.block_sparse_moe.experts.5.w1.weight_packed
read -r toff tlen < <(offset_of "$T/good.kpk" "(3, 2, 0xFFFFFFFF)")
cp "$T/good.kpk" "$T/pad.kpk"; flip "$T/pad.kpk" $((toff + tlen + 1))
if [ $(( (tlen + 4095) / 4096 * 4096 )) -gt $((tlen + 1)) ]; then
    expect_exit 1 "verify: a bit flip in an extent's zero padding" "$BIN/kpack" verify "$T/pad.kpk" --quiet
    grep -q "layer 2 trunk: non-zero padding" "$T/last.out" && ok "padding damage is named" || notok "padding: $(cat "$T/last.out")"
fi
size=$(stat -c %s "$T/good.kpk")
cp "$T/good.kpk" "$T/dir.kpk"; flip "$T/dir.kpk" $((size - 4096 - 10))
expect_exit 1 "verify: a bit flip in the directory padding" "$BIN/kpack" verify "$T/dir.kpk" --quiet
cp "$T/good.kpk" "$T/sb.kpk"; flip "$T/sb.kpk" 200
expect_exit 1 "verify: primary superblock damaged (backup intact)" "$BIN/kpack" verify "$T/sb.kpk" --quiet
grep -q "primary superblock damaged" "$T/last.out" && ok "superblock damage is named" || notok "superblock: $(cat "$T/last.out")"
read -r ext_tab < <(python3 -c 'import struct,sys; print(struct.unpack_from("<Q", open(sys.argv[1],"rb").read(), 56)[0])' "$T/good.kpk")
cp "$T/good.kpk" "$T/tab.kpk"; flip "$T/tab.kpk" $((ext_tab + 70))
expect_exit 1 "verify: a bit flip in the extent table" "$BIN/kpack" verify "$T/tab.kpk" --quiet
expect_err "extent table checksum mismatch" "the damaged table is named"
truncate -s $((size - 8192)) "$T/trunc.kpk" 2>/dev/null; cp "$T/good.kpk" "$T/trunc.kpk"; truncate -s $((size - 8192)) "$T/trunc.kpk"
expect_exit 1 "verify: truncated file" "$BIN/kpack" verify "$T/trunc.kpk" --quiet
expect_err "truncated" "truncation is named"
cp "$T/good.kpk" "$T/odd.kpk"; truncate -s $((size - 100)) "$T/odd.kpk"
expect_exit 1 "verify: file cut mid-block" "$BIN/kpack" verify "$T/odd.kpk" --quiet
# no magic at either end: not a KPK file
head -c 100000 /dev/urandom > "$T/magic.kpk"
expect_exit 2 "verify: no magic at either end" "$BIN/kpack" verify "$T/magic.kpk" --quiet
expect_err "not a KPK file" "wrong magic is named"
# a KPK file behind 15 other bytes: its end is a KPK superblock, so it is a damaged KPK file (§3 step 1)
printf 'GGUF\0\0\0\0garbage' > "$T/shifted.kpk"; cat "$T/good.kpk" >> "$T/shifted.kpk"
expect_exit 1 "verify: KPK bytes shifted by a prefix" "$BIN/kpack" verify "$T/shifted.kpk" --quiet
expect_err "truncated or torn" "the shifted file is damage, not 'not a KPK file'"
# a newer major version: both copies say so (only the primary saying it, with an intact backup of
# major 1, is a flipped bit: damage, test_kpk_reader)
cp "$T/good.kpk" "$T/v2.kpk"; printf '\x02\x00' | dd of="$T/v2.kpk" bs=1 seek=8 conv=notrunc 2>/dev/null
printf '\x02\x00' | dd of="$T/v2.kpk" bs=1 seek=$(($(stat -c %s "$T/v2.kpk") - 4096 + 8)) conv=notrunc 2>/dev/null
expect_exit 2 "verify: newer major version" "$BIN/kpack" verify "$T/v2.kpk" --quiet
expect_err "version 2\.[0-9]+ is not supported" "the version is named"
expect_exit 2 "info: newer major version" "$BIN/kpack" info "$T/v2.kpk"
expect_exit 2 "verify: missing file" "$BIN/kpack" verify "$T/none.kpk" --quiet

# ---- output problems ----------------------------------------------------
expect_exit 2 "convert: output directory does not exist" "$BIN/kpack" convert "$T/src" "$T/no/such/dir/x.kpk" --quiet
expect_err "cannot create .*No such file or directory" "the unwritable path is named"
echo "precious" > "$T/mine.kpk"
expect_exit 2 "convert: output exists" "$BIN/kpack" convert "$T/src" "$T/mine.kpk" --quiet
[ "$(cat "$T/mine.kpk")" = "precious" ] && ok "the user's file is untouched" || notok "the user's file was changed"
KPACK_TEST_FREE_BYTES=1000 expect_exit 2 "convert: not enough free space (simulated)" "$BIN/kpack" convert "$T/src" "$T/space.kpk" --quiet
expect_err "not enough free space for .*need .* available" "both numbers are given"
if [ "$(id -u)" -eq 0 ] && mkdir -p "$T/small" && mount -t tmpfs -o size=1m tmpfs "$T/small" 2>/dev/null; then
    expect_exit 2 "convert: not enough free space (1 MB tmpfs)" "$BIN/kpack" convert "$T/src" "$T/small/x.kpk" --quiet
    expect_err "not enough free space" "real statvfs check"
    umount "$T/small"
else
    skip "real free-space check: cannot mount a small tmpfs here"
fi
finish
