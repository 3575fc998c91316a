#!/usr/bin/env bash
# kpack verify --repair-from SOURCE_DIR (issue 12): three damaged extents
# (a trunk, an expert, the archive) of a plain file, a compressed file and a
# compressed stripe set are made again from the download: the file is then
# byte-identical to the original.  A source that does not match (a changed
# byte, another shard size, another checkpoint, a recorded SHA-256 that
# disagrees) is refused naming the tensor, shard or file, and nothing is
# written.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
KPY="$TOP/tests/ref/kpk.py"

"$BIN/k3synth" "$T/src" --geometry tiny --shards 3 --seed 41 --vision --mxfp4 quantized --quiet >/dev/null 2>"$T/synth.err" \
    || { notok "k3synth tiny: $(cat "$T/synth.err")"; finish; exit 1; }
echo "a file of the download" >"$T/src/README.md"
"$BIN/kpack" convert "$T/src" "$T/plain.kpk" --quiet && "$BIN/kpack" convert "$T/src" "$T/all.kpk" --compress all --quiet \
    || { notok "conversions"; finish; exit 1; }
mkdir -p "$T/d1" "$T/d2"
"$BIN/kpack" convert "$T/src" "$T/set.kpk" --compress trunk --stripe "$T/d1,$T/d2" --stripe-unit 8K --quiet || notok "set conversion"
for f in plain all set; do cp "$T/$f.kpk" "$T/$f.orig"; done
cp "$T/d1/set.kpk.s0" "$T/d1/orig.s0"; cp "$T/d2/set.kpk.s1" "$T/d2/orig.s1"

# damage KPK KINDS: flip one byte in the middle of the stored bytes of the
# first trunk, the last expert and the first archive extent, through the
# member files and the stripe mapping; prints what it hit
damage() {
    $PY - "$KPY" "$1" "$2" <<'PY'
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("kpk", sys.argv[1]); kpk = importlib.util.module_from_spec(spec); spec.loader.exec_module(kpk)
k = kpk.load(sys.argv[2]); base = os.path.dirname(os.path.abspath(sys.argv[2])); hit = []
for kind in sys.argv[3].split(","):
    kid = {"trunk": 3, "expert": 4, "archive": 5}[kind]
    i = [i for i, x in enumerate(k.extents) if x["kind"] == kid][-1 if kind == "expert" else 0]
    x = k.extents[i]; pos = x["offset"] + x["stored_len"] // 2
    if x["member"] == kpk.STRIPED:
        U, N, A = k.sb["stripe_unit"], k.sb["stripe_count"], k.sb["align"]
        u, inside = divmod(pos, U)
        path, off = os.path.join(base, k.members[k.stripe_member[u % N]]["path"]), A + (u // N) * U + inside
    else:
        path, off = (os.path.join(base, k.members[x["member"]]["path"]) if x["member"] else sys.argv[2]), pos
    with open(path, "r+b") as f:
        f.seek(off); b = f.read(1); f.seek(off); f.write(bytes([b[0] ^ 0x24]))
    hit.append(kpk.describe(x))
print(", ".join(hit))
PY
}

for f in plain all set; do
    what=$(damage "$T/$f.kpk" trunk,expert,archive)
    expect_exit 1 "$f: verify finds the 3 damaged extents ($what)" "$BIN/kpack" verify "$T/$f.kpk" --quiet
    [ "$(grep -c -E '^(layer [0-9]+ (trunk|expert [0-9]+)|archive): ' "$T/last.out")" -eq 3 ] && ok "$f: all three named" || notok "$f: $(cat "$T/last.out")"
    expect_exit 0 "$f: verify --repair-from the download" "$BIN/kpack" verify "$T/$f.kpk" --repair-from "$T/src" --quiet
    grep -q "repaired from .*: every extent checks again" "$T/last.out" && ok "$f: it says the repair checked out" || notok "$f: $(tail -2 "$T/last.out")"
    same=0
    if [ $f = set ]; then cmp -s "$T/set.kpk" "$T/set.orig" && cmp -s "$T/d1/set.kpk.s0" "$T/d1/orig.s0" && cmp -s "$T/d2/set.kpk.s1" "$T/d2/orig.s1" && same=1
    else cmp -s "$T/$f.kpk" "$T/$f.orig" && same=1; fi
    [ $same = 1 ] && ok "$f: the repaired file is byte-identical to the original" || notok "$f: repaired file differs"
done
expect_exit 0 "repair of an intact file does nothing" "$BIN/kpack" verify "$T/plain.kpk" --repair-from "$T/src" --quiet
grep -q "nothing to repair" "$T/last.out" && cmp -s "$T/plain.kpk" "$T/plain.orig" && ok "... and says so" || notok "intact repair: $(cat "$T/last.out")"

# ---- a source that does not match: refused, named, nothing written -----------------------
refused() { # LABEL FILE SOURCE PATTERN
    cp "$2" "$T/before"
    expect_exit 1 "$1: refused" "$BIN/kpack" verify "$2" --repair-from "$3" --quiet
    expect_err "$4" "$1: named"
    cmp -s "$2" "$T/before" && ok "$1: nothing was written" || notok "$1: the file changed"
}
cp -r "$T/src" "$T/changed"
$PY - "$T/changed/model-00001-of-000004.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; d = bytearray(open(p, "rb").read())
n = struct.unpack_from("<Q", d, 0)[0]; h = json.loads(d[8:8 + n])
b, e = h["language_model.model.layers.0.self_attn.q_proj.weight"]["data_offsets"]
d[8 + n + (b + e) // 2] ^= 1
open(p, "wb").write(d)
PY
damage "$T/plain.kpk" trunk >/dev/null
refused "a changed byte, uncompressed trunk" "$T/plain.kpk" "$T/changed" \
    "layer 0 trunk: the bytes read from model-00001-of-000004.safetensors do not reproduce its checksum"
damage "$T/all.kpk" trunk >/dev/null
refused "a changed byte, compressed trunk" "$T/all.kpk" "$T/changed" \
    "layer 0 trunk, block [0-9]+ \(tensor language_model.model.layers.0.self_attn.q_proj.weight\): the bytes read from model-00001-of-000004.safetensors are not the ones this file holds"
cp -r "$T/src" "$T/longer"; printf 'x' >>"$T/longer/model-00002-of-000004.safetensors"
refused "a shard of another size" "$T/plain.kpk" "$T/longer" "model-00002-of-000004.safetensors has [0-9]+ bytes, the file was converted from [0-9]+"
"$BIN/k3synth" "$T/other" --geometry tiny --shards 3 --seed 42 --vision --quiet >/dev/null
echo "a file of the download" >"$T/other/README.md"
refused "another checkpoint of the same shape" "$T/plain.kpk" "$T/other" "layer 0 trunk: the bytes read from model-00001-of-000004.safetensors do not reproduce its checksum"
# with SHA-256 recorded at conversion, a shard that changed elsewhere is caught before any extent is made
(cd "$T/src" && sha256sum model-*.safetensors README.md) >"$T/sums"
"$BIN/kpack" convert "$T/src" "$T/sha.kpk" --sha256 "$T/sums" --quiet
damage "$T/sha.kpk" trunk >/dev/null
refused "a recorded SHA-256 that the source no longer has" "$T/sha.kpk" "$T/changed" \
    "model-00001-of-000004.safetensors: SHA-256 mismatch: got .*, expected .* \(from the file's manifest\)"
# a source that cannot be read is an I/O error (exit 2, "fix the cause and rerun"), not a mismatch
need_shim
cp "$T/sha.kpk" "$T/before"
for c in "read|while hashing" "pread|while copying"; do
    IFS='|' read -r call when <<<"$c"
    [ $call = pread ] && { cp "$T/plain.orig" "$T/plain.kpk"; damage "$T/plain.kpk" trunk >/dev/null; f="$T/plain.kpk"; } || f="$T/sha.kpk"
    cp "$f" "$T/before"
    env KFAULT_CALLS=$call KFAULT_NTH=2 'KFAULT_PATH=*/src/model-*.safetensors' KFAULT_LOG="$T/fault.log" LD_PRELOAD="$SHIM" \
        "$BIN/kpack" verify "$f" --repair-from "$T/src" --quiet >"$T/last.out" 2>"$T/last.err"; rc=$?
    [ $rc = 2 ] && [ -s "$T/fault.log" ] && grep -q "Input/output error" "$T/last.err" "$T/last.out" && cmp -s "$f" "$T/before" \
        && ok "EIO reading the source $when: exit 2, named, nothing written" \
        || notok "EIO reading the source $when: exit $rc: $(head -c 300 "$T/last.err")"
    rm -f "$T/fault.log"
done
expect_exit 0 "... and the right source repairs it" "$BIN/kpack" verify "$T/sha.kpk" --repair-from "$T/src" --quiet
finish
