#!/usr/bin/env bash
# The archive (FORMAT.md §9, issue 13): a checkpoint with non-text tensors,
# gap bytes and metadata in a shard header, extra files (a subdirectory, one
# too large to keep, a broken link) converts; kpack export gives every kept
# file back byte-identical (cmp), resumes after kill -9, refuses to
# overwrite; export --check passes, gives the verdict on deleting the
# download, and fails naming the file when an extent is damaged and
# re-sealed or a --sha256 list disagrees; an HF snapshot comes back as plain
# files; re-layout keeps the archive; a file without an archive says why it
# cannot be exported; the sparse full-size virtual K3 rebuilds its files.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
KPY="$TOP/tests/ref/kpk.py"

"$BIN/k3synth" "$T/src" --geometry tiny --shards 3 --seed 31 --vision --quiet >/dev/null 2>"$T/synth.err" \
    || { notok "k3synth tiny: $(cat "$T/synth.err")"; finish; exit 1; }
# a shard with gap bytes (before its first tensor and between two) and __metadata__,
# as other writers of safetensors make them
$PY - "$T/src/model-00002-of-000004.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
d = open(p, "rb").read()
n = struct.unpack_from("<Q", d, 0)[0]
hdr = json.loads(d[8:8 + n]); data = d[8 + n:]
names = sorted((k for k in hdr if k != "__metadata__"), key=lambda k: hdr[k]["data_offsets"][0])
out, new = bytearray(b"GAP-BEFORE-THE-FIRST-TENSOR"), {"__metadata__": {"format": "pt", "note": "gaps"}}
for i, k in enumerate(names):
    a, b = hdr[k]["data_offsets"]
    if i == len(names) // 2: out += bytes(range(37))        # 37 bytes between two tensors
    new[k] = dict(hdr[k], data_offsets=[len(out), len(out) + b - a])
    out += data[a:b]
js = json.dumps(new, separators=(",", ":")).encode()
js += b" " * (-len(js) % 8)
open(p, "wb").write(struct.pack("<Q", len(js)) + js + out)
PY
echo "# a model card" > "$T/src/README.md"
mkdir -p "$T/src/sub/deeper"
echo '{"max_new_tokens": 64}' > "$T/src/sub/generation_config.json"
printf 'binary\0data' > "$T/src/sub/deeper/blob.bin"
head -c 300000 /dev/urandom > "$T/src/big.bin"
ln -s nowhere "$T/src/dangling"
expect_exit 0 "check-source on a checkpoint with gaps, metadata and vision tensors" "$BIN/kpack" check-source "$T/src" --quiet

# ---- convert: what is kept ------------------------------------------------------
expect_exit 0 "convert (the archive kept by default, --keep-max 200K)" "$BIN/kpack" convert "$T/src" "$T/a.kpk" --keep-max 200K --quiet
expect_exit 0 "verify the file with its archive" "$BIN/kpack" verify "$T/a.kpk" --quiet
expect_exit 0 "kpk.py check accepts it" $PY "$KPY" check "$T/a.kpk"
# the meta extent's files against the download's copies in the archive (issue 34.11): one edited and
# re-sealed is named by verify (before: OK, and krun read the edited file)
for f in tokenizer_config.json config.json; do
    $PY "$KPY" mutate "$T/a.kpk" "$T/meta.kpk" data-flip "meta/$f" >/dev/null
    expect_exit 1 "verify: meta/$f edited and the file re-sealed" "$BIN/kpack" verify "$T/meta.kpk" --quiet
    grep -q "^meta: meta/$f differs from the download's copy in the archive (archive/files/$f)" "$T/last.out" \
        && ok "  ... named against archive/files/$f" || notok "  meta/$f: $(head -c 300 "$T/last.out")"
done
rm -f "$T/meta.kpk"
expect_exit 0 "info" "$BIN/kpack" info "$T/a.kpk"
grep -q "archive:   11 files of the download" "$T/last.out" && grep -qE "not kept: .*big.bin" "$T/last.out" \
    && ok "info lists what is kept (11 files) and what is not (big.bin)" || notok "info archive: $(cat "$T/last.out")"
"$BIN/kpack" info "$T/a.kpk" --json >"$T/info.json"
$PY - "$T/info.json" <<'PY' && ok "the recipe: files sorted, kinds, sizes, no SHA-256 unchecked; not_kept with reasons" || notok "recipe: $(head -c 300 "$T/info.json")"
import json, sys
a = json.load(open(sys.argv[1]))["manifest"]["archive"]
names = [f["name"] for f in a["files"]]
assert names == sorted(names) and "sub/deeper/blob.bin" in names and "model.safetensors.index.json" in names, names
assert sum(f["kind"] == "safetensors" for f in a["files"]) == 4
assert all(f["sha256"] is None for f in a["files"])
nk = {f["name"]: f["reason"] for f in a["not_kept"]}
assert set(nk) == {"big.bin", "dangling"} and "--keep-max" in nk["big.bin"] and "symbolic link" in nk["dangling"], nk
PY

# ---- export: byte-identical files --------------------------------------------------
expect_exit 0 "export" "$BIN/kpack" export "$T/a.kpk" "$T/out" --quiet
diff -r --no-dereference -x big.bin -x dangling "$T/src" "$T/out" >"$T/diff" 2>&1 && [ ! -e "$T/out/.kpack-export.journal" ] \
    && ok "every kept file cmp-identical (shards with gaps, metadata and vision tensors, files in subdirectories); no journal left" \
    || notok "export differs: $(head -5 "$T/diff")"
[ ! -e "$T/out/big.bin" ] && ok "a file not kept is not invented" || notok "big.bin exported"
grep -q "no SHA-256 was recorded" "$T/last.out" && ok "without recorded hashes, export prints each file's SHA-256 to compare" || notok "export output: $(head -3 "$T/last.out")"
expect_exit 2 "export again into the same directory" "$BIN/kpack" export "$T/a.kpk" "$T/out" --quiet
expect_err "already exists; kpack export never overwrites" "it refuses to overwrite, naming the file"
expect_exit 0 "export --only two files" "$BIN/kpack" export "$T/a.kpk" "$T/only" --only model-00002-of-000004.safetensors,sub/generation_config.json --quiet
[ "$(cd "$T/only" && find . -type f | sort | tr '\n' ' ')" = "./model-00002-of-000004.safetensors ./sub/generation_config.json " ] \
    && cmp -s "$T/only/model-00002-of-000004.safetensors" "$T/src/model-00002-of-000004.safetensors" \
    && ok "--only writes those files and nothing else" || notok "--only: $(find "$T/only" -type f)"
expect_exit 2 "--only a file that was not kept" "$BIN/kpack" export "$T/a.kpk" "$T/x" --only big.bin --quiet
expect_err "big.bin: that file was not kept when converting \(larger than --keep-max" "it says why"
# interrupted, then resumed: the same files
KPACK_TEST_EXPORT_KILL_AFTER=3 "$BIN/kpack" export "$T/a.kpk" "$T/res" --quiet 2>/dev/null
rc=$?
printf 'stale bytes of an interrupted write' >"$T/res/model-00002-of-000004.safetensors.partial"
"$BIN/kpack" export "$T/a.kpk" "$T/res" 2>"$T/res.err" >"$T/res.out"
rc2=$?
diff -r --no-dereference -x big.bin -x dangling "$T/src" "$T/res" >/dev/null 2>&1 && [ $rc -eq 137 ] && [ $rc2 -eq 0 ] \
    && grep -q "3 of them were already written by an earlier run" "$T/res.out" \
    && ok "killed after 3 files (and a stale .partial), rerun: every file identical, the 3 not written again" \
    || notok "export resume: rc $rc / $rc2: $(cat "$T/res.err" "$T/res.out" | head -5)"

# ---- export --check ------------------------------------------------------------------
expect_exit 0 "export --check without recorded hashes" "$BIN/kpack" export "$T/a.kpk" --check
grep -q "NOT yet permission to delete the download" "$T/last.out" && grep -q "no SHA-256 was recorded for 11 files" "$T/last.out" \
    && grep -q "2 files of the download were not kept" "$T/last.out" \
    && ok "no recorded hashes and files not kept: the verdict says it is not permission, and why" || notok "check verdict: $(tail -4 "$T/last.out")"
(cd "$T/src" && find . -type f ! -name big.bin | sed 's|^\./||' | sort | xargs sha256sum) >"$T/sums"
expect_exit 0 "export --check --sha256 with the published list" "$BIN/kpack" export "$T/a.kpk" --check --sha256 "$T/sums" --json
$PY -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["failed"] == 0 and j["unconfirmed"] == 0 and all(f["confirmed"] for f in j["files"]) and not j["permission_to_delete_download"], j' "$T/last.out" \
    && ok "--check --sha256: every file confirmed; still no permission (2 files not kept)" || notok "check --sha256: $(head -c 300 "$T/last.out")"
sed '3s/^\(.\)/\1/;3s/^[0-9a-f]/0/' "$T/sums" >"$T/sums.bad"; cmp -s "$T/sums" "$T/sums.bad" && sed -i '3s/^0/1/' "$T/sums.bad"
bad=$(sed -n 3p "$T/sums" | awk '{print $2}')
expect_exit 1 "export --check with a list that disagrees" "$BIN/kpack" export "$T/a.kpk" --check --sha256 "$T/sums.bad"
grep -q "^FAILED  $bad: SHA-256 .* differs from the .* of the --sha256 list" "$T/last.out" && grep -q "do NOT delete the download" "$T/last.out" \
    && ok "the file the list disagrees on is named; do not delete" || notok "bad list: $(cat "$T/last.out" | head -5)"

# recorded at conversion (--sha256): the verdict is permission
rm -f "$T/src/big.bin" "$T/src/dangling"
expect_exit 0 "convert --sha256 (every file of the list hashed and recorded)" "$BIN/kpack" convert "$T/src" "$T/s.kpk" --sha256 "$T/sums" --quiet
expect_exit 0 "export --check of it" "$BIN/kpack" export "$T/s.kpk" --check
grep -q "^OK: every file of the download rebuilds bit for bit" "$T/last.out" && grep -q "You may delete the download" "$T/last.out" \
    && ok "every hash recorded and matching, nothing left out: permission to delete the download" || notok "verdict: $(tail -3 "$T/last.out")"
$PY "$KPY" mutate "$T/s.kpk" "$T/flip.kpk" data-flip >"$T/what"
expect_exit 0 "a tensor's byte flipped and every checksum re-sealed: verify cannot tell" "$BIN/kpack" verify "$T/flip.kpk" --quiet
expect_exit 1 "export --check of it" "$BIN/kpack" export "$T/flip.kpk" --check
grep -q "^FAILED  model-00001-of-000004.safetensors: SHA-256 .* differs from the .* recorded when converting" "$T/last.out" && grep -q "do NOT delete" "$T/last.out" \
    && ok "the shard the flipped byte belongs to is named ($(cat "$T/what"))" || notok "flip: $(cat "$T/last.out" | grep -v '^OK' | head -4)"
expect_exit 1 "export of it refuses the file that does not rebuild" "$BIN/kpack" export "$T/flip.kpk" "$T/flipout" --quiet
[ ! -e "$T/flipout/model-00001-of-000004.safetensors" ] && [ ! -e "$T/flipout/model-00001-of-000004.safetensors.partial" ] \
    && ok "... and leaves no wrong file behind" || notok "a wrong file was left: $(ls "$T/flipout")"

# ---- an HF cache snapshot comes back as plain files -----------------------------------
mkdir -p "$T/hf/blobs" "$T/hf/snapshots/rev"
for f in $(cd "$T/src" && find . -type f | sed 's|^\./||'); do
    h=$(sha256sum "$T/src/$f" | cut -d' ' -f1)
    mkdir -p "$(dirname "$T/hf/snapshots/rev/$f")"
    cp "$T/src/$f" "$T/hf/blobs/$h"
    ln -s "$(realpath --relative-to="$(dirname "$T/hf/snapshots/rev/$f")" "$T/hf/blobs")/$h" "$T/hf/snapshots/rev/$f"
done
expect_exit 0 "convert an HF snapshot (blob names are SHA-256: checked and recorded)" "$BIN/kpack" convert "$T/hf/snapshots/rev" "$T/hf.kpk" --quiet
expect_exit 0 "export it" "$BIN/kpack" export "$T/hf.kpk" "$T/hfout" --quiet
[ -z "$(find "$T/hfout" -type l)" ] && diff -r "$T/src" "$T/hfout" >/dev/null 2>&1 \
    && ok "plain files (no links), each identical to the snapshot's" || notok "HF export: $(find "$T/hfout" | head)"
expect_exit 0 "export --check of the HF conversion" "$BIN/kpack" export "$T/hf.kpk" --check --json
$PY -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["permission_to_delete_download"] and j["unconfirmed"] == 0, j' "$T/last.out" \
    && ok "the blob names were recorded as checked hashes: permission" || notok "HF check: $(head -c 300 "$T/last.out")"

# ---- re-layout keeps the archive; compressed archive extents ---------------------------
mkdir -p "$T/d1" "$T/d2"
expect_exit 0 "re-layout into a compressed stripe set" "$BIN/kpack" convert "$T/s.kpk" "$T/set.kpk" --compress all --stripe "$T/d1,$T/d2" --quiet
expect_exit 0 "export --check of the set" "$BIN/kpack" export "$T/set.kpk" --check
grep -q "^OK: every file" "$T/last.out" && ok "the archive and its recorded hashes survive re-layout and compression" || notok "set check: $(tail -3 "$T/last.out")"
expect_exit 0 "export from the compressed set" "$BIN/kpack" export "$T/set.kpk" "$T/setout" --quiet
diff -r "$T/src" "$T/setout" >/dev/null 2>&1 && ok "... every file identical" || notok "export from the set differs"

# ---- files without an archive -------------------------------------------------------------
expect_exit 0 "convert --no-archive" "$BIN/kpack" convert "$T/src" "$T/na.kpk" --no-archive --quiet
expect_exit 2 "export of a file without an archive" "$BIN/kpack" export "$T/na.kpk" "$T/naout"
expect_err "has no archive \(it was written by kpack [0-9.]+, without one\): it holds the model only .* cannot be rebuilt" "it says why it cannot rebuild the originals"
expect_exit 2 "export --check of it" "$BIN/kpack" export "$T/na.kpk" --check
expect_exit 0 "krun runs a file with an archive (the archive is never read)" "$BIN/krun" "$T/s.kpk" --ids 3,7 --gen 2 --quiet
if $PY "$KPY" relayout "$T/na.kpk" "$T/v10.kpk" --minor 0 2>/dev/null; then
    expect_exit 0 "a KPK 1.0 file still verifies" "$BIN/kpack" verify "$T/v10.kpk" --quiet
    expect_exit 0 "... and runs" "$BIN/krun" "$T/v10.kpk" --ids 3,7 --gen 2 --quiet
    expect_exit 2 "export of a KPK 1.0 file" "$BIN/kpack" export "$T/v10.kpk" "$T/v10out"
    expect_err "has no archive" "... says why"
else
    skip "a KPK 1.0 file: kpk.py cannot write minor 0"
fi

# ---- every safetensors dtype, odd shapes, trailing bytes (issue 25.9) ------------------------
# Non-text tensors are bytes to the archive: each of the 22 safetensors dtypes (sub-byte F4/F6
# too), a 0-dim scalar, an empty tensor, a 5-D tensor, a gap, and bytes after the last tensor;
# convert, verify and export give every byte back; a text tensor keeps its strict dtype rule.
"$BIN/k3synth" "$T/dt" --geometry tiny --shards 2 --seed 33 --vision --quiet >/dev/null 2>&1 || notok "k3synth for dtypes"
$PY - "$T/dt" <<'PY' || notok "building the dtype shard"
import json, os, random, struct, sys
d = sys.argv[1]
idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
fn = sorted(set(idx["weight_map"].values()))[-1]
p = os.path.join(d, fn)
b = open(p, "rb").read()
n = struct.unpack_from("<Q", b, 0)[0]
hdr = json.loads(b[8:8 + n]); data = b[8 + n:]
r = random.Random(5)
BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
        "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32,
        "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}
out = bytearray(data)
new = dict(hdr)
def add(name, dt, shape):
    numel = 1
    for x in shape: numel *= x
    nb = numel * BITS[dt] // 8
    new[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(out), len(out) + nb]}
    out.extend(r.randbytes(nb))
    idx["weight_map"][name] = fn
for dt in sorted(BITS):
    add("vision_tower.dtypes.%s" % dt.lower(), dt, [3, 8] if BITS[dt] >= 8 else [4, 6])
out.extend(b"a gap between two tensors")
add("vision_tower.scalar", "I64", [])
add("vision_tower.empty", "BOOL", [0, 5])
add("vision_tower.five_d", "F32", [1, 2, 1, 2, 3])
add("mm_projector.bias", "BF16", [7])
out.extend(b"bytes after the last tensor, which no header entry describes\n")
js = json.dumps(new, separators=(",", ":")).encode()
js += b" " * (-len(js) % 8)
open(p, "wb").write(struct.pack("<Q", len(js)) + js + out)
json.dump(idx, open(os.path.join(d, "model.safetensors.index.json"), "w"), indent=1)
PY
expect_exit 0 "check-source accepts non-text tensors of every safetensors dtype and bytes after the last tensor" \
    "$BIN/kpack" check-source "$T/dt" --quiet
expect_exit 0 "convert it" "$BIN/kpack" convert "$T/dt" "$T/dt.kpk" --quiet
expect_exit 0 "verify it" "$BIN/kpack" verify "$T/dt.kpk" --quiet
expect_exit 0 "kpk.py check accepts it (recipe included)" $PY "$KPY" check "$T/dt.kpk"
$PY "$KPY" tensors "$T/dt.kpk" >"$T/dt.tensors"
grep -qP "^vision_tower.dtypes.i64\tBYTES\t192\t" "$T/dt.tensors" && grep -qP "^vision_tower.dtypes.bf16\tBF16\t3,8\t" "$T/dt.tensors" \
    && grep -qP "^vision_tower.dtypes.f4\tBYTES\t12\t" "$T/dt.tensors" && grep -qP "^vision_tower.five_d\tBYTES\t48\t" "$T/dt.tensors" \
    && grep -qP "^vision_tower.scalar\tBYTES\t8\t" "$T/dt.tensors" \
    && ok "archived as FORMAT.md §9.1 says: F32/BF16/F16/U8 in 1-4 dimensions keep dtype and shape, the rest are BYTES [nbytes]" \
    || notok "archive tensors: $(grep -E 'dtypes|scalar|five_d' "$T/dt.tensors" | head -5)"
expect_exit 0 "export it" "$BIN/kpack" export "$T/dt.kpk" "$T/dtout" --quiet
diff -r "$T/dt" "$T/dtout" >/dev/null 2>&1 && ok "every file back bit for bit: 22 dtypes, a scalar, an empty and a 5-D tensor, a gap, trailing bytes" \
    || notok "dtype export differs: $(diff -rq "$T/dt" "$T/dtout" | head -3)"
expect_exit 0 "convert --compress all" "$BIN/kpack" convert "$T/dt" "$T/dtz.kpk" --compress all --quiet
expect_exit 0 "export of the compressed file" "$BIN/kpack" export "$T/dtz.kpk" "$T/dtzout" --quiet
diff -r "$T/dt" "$T/dtzout" >/dev/null 2>&1 && ok "... every file back bit for bit" || notok "compressed dtype export differs"
expect_exit 0 "convert --no-archive drops them" "$BIN/kpack" convert "$T/dt" "$T/dtn.kpk" --no-archive --quiet
# bytes after the last tensor alone (the shard longer than its header describes)
"$BIN/k3synth" "$T/tr" --geometry tiny --shards 2 --seed 34 --quiet >/dev/null 2>&1 || notok "k3synth for trailing bytes"
sh1=$(ls "$T/tr"/model-00001-of-*.safetensors)
[ -f "$sh1" ] || notok "no first shard in $T/tr"
printf 'trailing bytes no tensor covers' >>"$sh1"
expect_exit 0 "check-source accepts a shard with bytes after its last tensor" "$BIN/kpack" check-source "$T/tr" --quiet
expect_exit 0 "convert it" "$BIN/kpack" convert "$T/tr" "$T/tr.kpk" --quiet
expect_exit 0 "export it" "$BIN/kpack" export "$T/tr.kpk" "$T/trout" --quiet
diff -r "$T/tr" "$T/trout" >/dev/null 2>&1 && ok "the trailing bytes come back" || notok "trailing bytes: $(diff -rq "$T/tr" "$T/trout" | head -3)"
rm -rf "$T/tr" "$T/trout" "$T/tr.kpk"
# relabel DIR TENSOR DTYPE: the tensor's header entry gets DTYPE, its shape the same bytes in 8-byte
# elements (the header rewritten whole, the data untouched)
relabel() {
    $PY - "$@" <<'PY'
import json, os, struct, sys
d, name, dt = sys.argv[1:4]
idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
p = os.path.join(d, idx["weight_map"][name])
b = open(p, "rb").read()
n = struct.unpack_from("<Q", b, 0)[0]
hdr = json.loads(b[8:8 + n])
e = hdr[name]
nb = e["data_offsets"][1] - e["data_offsets"][0]
assert nb % 8 == 0, nb
e["dtype"], e["shape"] = dt, [nb // 8]
js = json.dumps(hdr, separators=(",", ":")).encode()
js += b" " * (-len(js) % 8)
open(p, "wb").write(struct.pack("<Q", len(js)) + js + b[8 + n:])
PY
}
# a text tensor keeps its dtype rule: a text tensor relabelled I64 (same bytes) is refused, named
cp -r "$T/dt" "$T/dtbad"
relabel "$T/dtbad" language_model.model.layers.0.input_layernorm.weight I64
expect_exit 1 "check-source refuses a text tensor of dtype I64" "$BIN/kpack" check-source "$T/dtbad"
grep -q "tensor language_model.model.layers.0.input_layernorm.weight: dtype I64, expected F32/BF16/F16" "$T/last.out" "$T/last.err" \
    && ok "the text tensor and its dtype are named" || notok "text I64: $(cat "$T/last.out" "$T/last.err" | head -3)"
# a dtype no safetensors writer has: refused, named
rm -rf "$T/dtbad"; cp -r "$T/dt" "$T/dtbad"
relabel "$T/dtbad" vision_tower.dtypes.i64 Q4_K
expect_exit 1 "check-source refuses a dtype that is not a safetensors dtype" "$BIN/kpack" check-source "$T/dtbad"
grep -q "tensor vision_tower.dtypes.i64: dtype Q4_K is not a safetensors dtype" "$T/last.out" "$T/last.err" \
    && ok "the tensor and the dtype are named" || notok "Q4_K: $(cat "$T/last.out" "$T/last.err" | head -3)"
rm -rf "$T/dt" "$T/dtout" "$T/dtzout" "$T/dtbad" "$T/dt.kpk" "$T/dtz.kpk" "$T/dtn.kpk"

# ---- the sparse full-size virtual K3 -------------------------------------------------------
"$BIN/k3synth" "$T/virt" --virtual --quiet >/dev/null 2>&1 || notok "k3synth --virtual"
t0=$(date +%s.%N)
expect_exit 0 "convert the virtual 1.56 TB checkpoint (sparse)" "$BIN/kpack" convert "$T/virt" "$T/virt.kpk" --quiet
t1=$(date +%s.%N)
some=model-00001-of-000096.safetensors,model-00095-of-000096.safetensors,model-00096-of-000096.safetensors,model.safetensors.index.json,config.json
expect_exit 0 "export --check of the virtual's vision shards, layer 0 and the index" "$BIN/kpack" export "$T/virt.kpk" --check --only $some --json
$PY -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["failed"] == 0 and len(j["files"]) == 5, j; print("# %.1f GB rebuilt and hashed in %.2f s (bookkeeping %.3f s)" % (j["bytes"] / 1e9, j["seconds"], j["seconds_bookkeeping"]))' "$T/last.out" \
    && ok "virtual: 5 files rebuilt and hashed" || notok "virtual check: $(head -c 300 "$T/last.out")"
expect_exit 0 "export of those files" "$BIN/kpack" export "$T/virt.kpk" "$T/virtout" --only $some --quiet
same=1; for f in ${some//,/ }; do cmp -s "$T/virt/$f" "$T/virtout/$f" || same=0; done
[ $same = 1 ] && [ "$(du -sk "$T/virtout" | cut -f1)" -lt 200000 ] \
    && ok "virtual: each cmp-identical to the source, and sparse (holes stay holes)" || notok "virtual export: $(du -sh "$T/virtout")"
echo "# virtual: convert $(echo "$t1 - $t0" | bc) s"
finish
