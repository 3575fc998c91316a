#!/usr/bin/env bash
# kpack end to end: synth (sharded) -> check-source -> convert -> verify -> info
# -> cat == source; determinism; orders and alignments; the oracle fixture.
. "$(dirname "$0")/lib.sh"
ST="$TOP/tests/cli/st_tool.py"

"$BIN/k3synth" "$T/src" --geometry tiny --shards 3 --seed 7 --quiet >/dev/null 2>"$T/synth.err" \
    || { notok "k3synth tiny: $(cat "$T/synth.err")"; finish; exit 1; }

expect_exit 0 "check-source on a good sharded checkpoint" "$BIN/kpack" check-source "$T/src" --quiet
grep -q "verdict: OK" "$T/last.out" && ok "check-source says OK" || notok "check-source verdict: $(tail -3 "$T/last.out")"
[ "$(grep -c '^  OK ' "$T/last.out")" -eq 3 ] && ok "a verdict per shard (3)" || notok "per-shard verdicts: $(cat "$T/last.out")"
expect_exit 0 "check-source --json" "$BIN/kpack" check-source "$T/src" --json
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["ok"] and len(j["shards"])==3 and j["tensors"]["missing"]==0' "$T/last.out" \
    && ok "check-source --json is valid and complete" || notok "check-source --json content"

# SHA-256 via a sums file: good, then one wrong line
(cd "$T/src" && sha256sum model-*.safetensors) > "$T/sums"
expect_exit 0 "check-source --sha256 with correct sums" "$BIN/kpack" check-source "$T/src" --sha256 "$T/sums" --threads 2 --quiet
grep -q "sha256 ok" "$T/last.out" && ok "sha256 verdicts printed" || notok "no sha256 verdicts"
sed '2s/^./0/;2s/^0\(.\)/f\1/' "$T/sums" > "$T/sums.bad"
cmp -s "$T/sums" "$T/sums.bad" && sed -i '2s/^\(.\)/\1/;2s/^[0-9a-f]/e/' "$T/sums.bad"
expect_exit 1 "check-source --sha256 with a wrong hash" "$BIN/kpack" check-source "$T/src" --sha256 "$T/sums.bad" --quiet
grep -q "SHA-256 mismatch" "$T/last.out" && ok "the mismatching shard is named" || notok "no SHA mismatch message: $(cat "$T/last.out")"

# link_shards STORE DIR: a copy of $T/src in DIR whose shards are symlinks to
# STORE/<their sha256> (the layout of a Hugging Face cache when STORE is blobs/)
link_shards() {
    local store=$1 dir=$2 f b h
    mkdir -p "$store" "$dir"
    for f in "$T"/src/*; do
        b=$(basename "$f")
        case "$b" in
            *.safetensors) h=$(sha256sum "$f" | cut -d' ' -f1); cp "$f" "$store/$h"; ln -s "$(realpath --relative-to="$dir" "$store")/$h" "$dir/$b";;
            *) cp "$f" "$dir/$b";;
        esac
    done
}

# A Hugging Face cache snapshot: symlinks into blobs/<sha256>
link_shards "$T/hf/blobs" "$T/hf/snapshots/abc"
expect_exit 0 "check-source on an HF snapshot verifies blob hashes" "$BIN/kpack" check-source "$T/hf/snapshots/abc" --quiet
[ "$(grep -c 'sha256 ok' "$T/last.out")" -eq 3 ] && ok "HF blob names used as SHA-256" || notok "HF hashes: $(cat "$T/last.out")"
expect_exit 0 "check-source --json on an HF snapshot" "$BIN/kpack" check-source "$T/hf/snapshots/abc" --json
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["layout"]=="hf-snapshot", j["layout"]' "$T/last.out" \
    && ok "an HF snapshot is reported as one" || notok "HF layout: $(head -c 300 "$T/last.out")"
# The published list stays the reference: a blob name that disagrees with it is named.
expect_exit 1 "an HF blob name that disagrees with --sha256" "$BIN/kpack" check-source "$T/hf/snapshots/abc" --sha256 "$T/sums.bad" --quiet
grep -q "Hugging Face blob name says SHA-256" "$T/last.out" && ok "the disagreement is named" || notok "blob vs --sha256: $(cat "$T/last.out")"
h=$(ls "$T/hf/blobs" | head -1); printf 'X' | dd of="$T/hf/blobs/$h" bs=1 seek=100 conv=notrunc 2>/dev/null
expect_exit 1 "a corrupted HF blob is caught" "$BIN/kpack" check-source "$T/hf/snapshots/abc" --quiet
rm -rf "$T/hf"
# Symlinks that are not into a blobs/ directory: a plain sharded download, no hash implied.
link_shards "$T/ln/store" "$T/ln/model"
expect_exit 0 "check-source on symlinked shards outside an HF cache" "$BIN/kpack" check-source "$T/ln/model" --json
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["layout"]=="sharded", j["layout"]' "$T/last.out" \
    && ok "symlinks outside blobs/ are not taken for an HF cache" || notok "symlink layout: $(head -c 300 "$T/last.out")"
rm -rf "$T/ln"

# convert, dry run first
expect_exit 0 "convert --dry-run" "$BIN/kpack" convert "$T/src" "$T/a.kpk" --dry-run
grep -q "largest extent" "$T/last.out" && [ ! -e "$T/a.kpk" ] && ok "dry run prints the plan and writes nothing" || notok "dry run"
expect_exit 0 "convert" "$BIN/kpack" convert "$T/src" "$T/a.kpk" --quiet
[ ! -e "$T/a.kpk.partial" ] && [ ! -e "$T/a.kpk.journal" ] && ok "no partial or journal left behind" || notok "leftovers after convert"
expect_exit 0 "verify a fresh file" "$BIN/kpack" verify "$T/a.kpk" --quiet
expect_exit 0 "info" "$BIN/kpack" info "$T/a.kpk"
grep -q "13 layers" "$T/last.out" && grep -q "expert" "$T/last.out" && ok "info shows config and extents" || notok "info: $(cat "$T/last.out")"
expect_exit 0 "info --json" "$BIN/kpack" info "$T/a.kpk" --json
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["extents"]["expert"]["count"]==12*8 and j["order"]=="layer-major" and j["manifest"]["producer"].startswith("kpack")' "$T/last.out" \
    && ok "info --json: 96 expert extents, order, provenance" || notok "info --json content"
python3 "$TOP/tests/cli/cat_compare.py" "$BIN/kpack" "$T/src" "$T/a.kpk"
expect_exit 2 "cat of an unknown tensor" "$BIN/kpack" cat "$T/a.kpk" no.such.tensor
expect_err "no tensor named no.such.tensor" "cat names the missing tensor"

# determinism: same input twice -> same bytes; refuses to overwrite without --force
expect_exit 2 "convert refuses to overwrite" "$BIN/kpack" convert "$T/src" "$T/a.kpk" --quiet
expect_err "already exists" "the refusal says why"
expect_exit 0 "convert again to another name" "$BIN/kpack" convert "$T/src" "$T/b.kpk" --quiet
cmp -s "$T/a.kpk" "$T/b.kpk" && ok "converting twice gives identical files" || notok "two conversions differ"
cp "$T/a.kpk" "$T/keep.kpk"
expect_exit 0 "convert --force replaces" "$BIN/kpack" convert "$T/src" "$T/a.kpk" --quiet --force
cmp -s "$T/a.kpk" "$T/keep.kpk" && ok "--force result identical" || notok "--force result differs"

# layout properties, checked independently in python
python3 - "$T/a.kpk" <<'PY' && ok "extents page-aligned and layer-major, tensors 64-byte aligned, backup superblock equals primary" || notok "layout check"
import struct, sys
d = open(sys.argv[1], "rb").read()
assert d[:8] == b"\x89KPK\r\n\x1a\n" and len(d) % 4096 == 0
assert d[:4096] == d[-4096:]
(ext_off, ext_n) = struct.unpack_from("<QQ", d, 56)
prev = None
order = []
for i in range(ext_n):
    r = d[ext_off + 64 * i: ext_off + 64 * (i + 1)]
    kind, codec, member, layer, expert = struct.unpack_from("<BBHII", r, 0)
    off, stored = struct.unpack_from("<QQ", r, 16)
    assert off % 4096 == 0 and codec == 0
    order.append((kind, layer, expert))
kinds = [k for k, _, _ in order]
assert kinds[0] == 1 and kinds[1] == 2
# layer-major: trunk L then experts of L, in id order
seen = [(k, l, e) for k, l, e in order[2:]]
for j in range(1, len(seen)):
    a, b = seen[j - 1], seen[j]
    if b[0] == 3: assert b[1] == (a[1] + 1 if a[0] == 4 or a[0] == 3 else 0) or (a[0] == 3 and b[1] == a[1] + 1)
    if b[0] == 4: assert b[1] == a[1] and (b[2] == 0 if a[0] == 3 else b[2] == a[2] + 1)
(t_off, t_n) = struct.unpack_from("<QQ", d, 80)
for i in range(t_n):
    (o,) = struct.unpack_from("<Q", d, t_off + 64 * i + 16)
    assert o % 64 == 0
PY

expect_exit 0 "convert --order trunk-first --align 64K" "$BIN/kpack" convert "$T/src" "$T/tf.kpk" --order trunk-first --align 64K --quiet
expect_exit 0 "verify trunk-first" "$BIN/kpack" verify "$T/tf.kpk" --quiet
python3 - "$T/tf.kpk" <<'PY' && ok "trunk-first: all trunks before all experts, 64K alignment" || notok "trunk-first layout"
import struct, sys
d = open(sys.argv[1], "rb").read()
(align,) = struct.unpack_from("<I", d, 24)
assert align == 65536
(ext_off, ext_n) = struct.unpack_from("<QQ", d, 56)
kinds = []
for i in range(ext_n):
    kind = d[ext_off + 64 * i]
    (off,) = struct.unpack_from("<Q", d, ext_off + 64 * i + 16)
    assert off % 65536 == 0
    kinds.append(kind)
last_trunk = max(i for i, k in enumerate(kinds) if k == 3)
first_exp = min(i for i, k in enumerate(kinds) if k == 4)
assert last_trunk < first_exp
PY
python3 "$TOP/tests/cli/cat_compare.py" "$BIN/kpack" "$T/src" "$T/tf.kpk" | sed 's/kpack cat:/trunk-first: kpack cat:/'

# The external oracle fixture: single file, flat config
ORACLE="$K3_SHARED/fixtures/k3-tiny-oracle"
if [ -f "$ORACLE/model.safetensors" ]; then
    expect_exit 0 "check-source on the oracle fixture" "$BIN/kpack" check-source "$ORACLE" --quiet
    expect_exit 0 "convert the oracle fixture" "$BIN/kpack" convert "$ORACLE" "$T/oracle.kpk" --quiet
    expect_exit 0 "verify the oracle KPK" "$BIN/kpack" verify "$T/oracle.kpk" --quiet
    python3 "$TOP/tests/cli/cat_compare.py" "$BIN/kpack" "$ORACLE" "$T/oracle.kpk" | sed 's/kpack cat:/oracle: kpack cat:/'
else
    skip "oracle fixture conversion: $ORACLE is absent"
fi

expect_exit 0 "kpack --help" "$BIN/kpack" --help
for c in check-source convert verify info cat; do
    "$BIN/kpack" $c --help | grep -q "^usage: kpack $c" && ok "kpack $c --help" || notok "kpack $c --help"
done
expect_exit 2 "unknown command" "$BIN/kpack" frobnicate
finish
