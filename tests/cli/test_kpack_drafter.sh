#!/usr/bin/env bash
# kpack on a drafter checkpoint (K3_EAGLE.md, docs/FORMAT.md §15): k3synth
# writes one in the released layout at any geometry -- at full width exactly
# the release's 20 tensors, 2,128-byte header and 6,031,253,592 bytes, every
# tensor at the offset K3_EAGLE §1.3's table gives (checked against the
# spec's own text, on a sparse file deleted at once); check-source and
# convert accept it, verify, info, cat and kpk.py (the independent reader of
# FORMAT.md) read the drafter file, export gives both files back byte for
# byte; the pinned digests of §1.2 are the spec's, a pinned pair is named and
# recorded, half of one is refused (a mixed download); every roster, dtype,
# shape and config that is not §1.3's is refused naming the tensor or key
# (exit 1), and a drafter file is refused as a model by kpack verify's model
# check and krun.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
KPY="$TOP/tests/ref/kpk.py"
ST="$TOP/tests/cli/st_tool.py"
SPEC="$K3_SHARED/spec/K3_EAGLE.md"

"$BIN/k3synth" "$T/tgt" --single-file --seed 3 --quiet && "$BIN/kpack" convert "$T/tgt" "$T/tgt.kpk" --quiet \
    || { notok "the tiny target"; finish; exit 1; }
"$BIN/k3synth" "$T/d" --drafter --target "$T/tgt" --seed 3 --quiet 2>"$T/err" || { notok "k3synth --drafter: $(cat "$T/err")"; finish; exit 1; }
echo "a model card" > "$T/d/README.md"

# ---- the released layout at full width, against the spec's own table ------------------------------
if "$BIN/k3synth" "$T/rel" --drafter --geometry release --virtual --quiet 2>"$T/err"; then
    "$PY" - "$T/rel/model.safetensors" "$SPEC" <<'PY' >"$T/why" 2>&1 && ok "full width: $(cat "$T/why")" || notok "full width: $(cat "$T/why")"
import json, os, re, struct, sys
path, spec = sys.argv[1], sys.argv[2]
size = os.path.getsize(path)
with open(path, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    hdr = json.loads(f.read(n))
meta = hdr.pop("__metadata__", None)
rows = {}
if os.path.exists(spec):
    # K3_EAGLE §1.3: | `name` | [shape] | bytes | data offset [X] | role |
    for m in re.finditer(r"^\| `([^`]+)` \| \[([0-9, ]+)\] \| ([0-9,]+) \| ([0-9,]+) \|", open(spec).read(), re.M):
        rows[m.group(1)] = ([int(x) for x in m.group(2).split(",")], int(m.group(3).replace(",", "")), int(m.group(4).replace(",", "")))
    assert len(rows) == 20, "the spec's table has %d rows" % len(rows)
assert len(hdr) == 20, "%d tensors" % len(hdr)
assert n == 2128, "header %d bytes" % n
assert size == 6031253592, "%d bytes" % size
assert meta is not None and "torchspec_version" in meta, meta
for name, v in hdr.items():
    assert v["dtype"] == "BF16", (name, v["dtype"])
    if rows:
        shape, nbytes, off = rows[name]
        assert v["shape"] == shape and v["data_offsets"] == [off, off + nbytes], (name, v, rows[name])
print("20 tensors, a 2,128-byte header, 6,031,253,592 bytes%s" % (", every name, shape and offset as K3_EAGLE.md §1.3's table" if rows else
      " (../shared/spec absent: the table not compared)"))
PY
    rm -rf "$T/rel"
else
    notok "k3synth --drafter --geometry release --virtual: $(cat "$T/err")"
fi

# ---- the pinned digests are the spec's ------------------------------------------------------------
if [ -f "$SPEC" ]; then
    for h in $(grep -oE '`[0-9a-f]{64}`' "$SPEC" | tr -d '`' | sort -u); do
        grep -q "$h" "$TOP/format/k3_eagle.h" || notok "the spec's digest $h is not in format/k3_eagle.h"
    done
    check "format/k3_eagle.h pins the two SHA-256 of K3_EAGLE.md §1.2" test "$(grep -oE '`[0-9a-f]{64}`' "$SPEC" | sort -u | wc -l)" -eq 2
else
    skip "the pinned digests against the spec (../shared/spec absent)"
fi

# ---- check-source, convert, verify, info, cat, the independent reader, export ---------------------
expect_exit 0 "check-source accepts the synthetic drafter" "$BIN/kpack" check-source "$T/d"
grep -q "not the pinned release" "$T/last.out" && ok "it is named as not the pinned release" || notok "not named: $(head -c 300 "$T/last.out")"
"$BIN/kpack" check-source "$T/d" --json >"$T/cs.json" 2>/dev/null
check "check-source --json: kind drafter, 20 tensors, both SHA-256" "$PY" -c '
import json, sys; j = json.load(open(sys.argv[1]))
assert j["kind"] == "drafter" and j["ok"] and j["weights"]["tensors"] == 20 and len(j["weights"]["sha256"]) == 64
assert len(j["drafter"]["config_sha256"]) == 64 and j["drafter"]["pinned"] is None' "$T/cs.json"
expect_exit 0 "convert makes a drafter file" "$BIN/kpack" convert "$T/d" "$T/d.kpk" --quiet
expect_exit 0 "kpack verify: the drafter file" "$BIN/kpack" verify "$T/d.kpk"
"$BIN/kpack" info "$T/d.kpk" >"$T/info.txt" 2>&1
check "kpack info names it a drafter, KPK 1.2" grep -q "KPK 1.2" "$T/info.txt"
check "kpack info: its geometry and taps" grep -q "drafter: .*3 heads.*taps \[2,6,10\]" "$T/info.txt"
"$BIN/kpack" info "$T/d.kpk" --json >"$T/info.json" 2>/dev/null
check "kpack info --json: kind, extents, the manifest's drafter" "$PY" -c '
import json, sys; j = json.load(open(sys.argv[1]))
assert j["kind"] == "drafter" and j["version"] == "1.2" and j["extents"]["drafter"]["count"] == 2 and j["extents"]["globals"]["count"] == 0
assert j["drafter"]["tap_ids"] == [2, 6, 10] and j["manifest"]["format"] == "KPK 1.2" and j["manifest"]["drafter"]["pinned"] is None' "$T/info.json"
if "$PY" "$KPY" check "$T/d.kpk" >"$T/kpy.out" 2>&1; then ok "kpk.py (the independent reader) checks the drafter file"; else notok "kpk.py check: $(head -c 300 "$T/kpy.out")"; fi
bad=0
while read -r name dtype shape a b; do
    "$BIN/kpack" cat "$T/d.kpk" "$name" >"$T/t.bin" 2>/dev/null && "$PY" "$ST" bytes "$T/d/model.safetensors" "$name" | cmp -s - "$T/t.bin" || bad=$((bad + 1))
    "$PY" "$KPY" cat "$T/d.kpk" "$name" 2>/dev/null | cmp -s - "$T/t.bin" || bad=$((bad + 1))
done < <("$PY" "$ST" list "$T/d/model.safetensors")
check "every tensor read back (kpack cat and kpk.py cat) equals the checkpoint's bytes" test "$bad" -eq 0
expect_exit 0 "export --check rebuilds both files (and the README)" "$BIN/kpack" export "$T/d.kpk" --check
expect_exit 0 "export writes them back" "$BIN/kpack" export "$T/d.kpk" "$T/back" --quiet
check "export: model.safetensors, config.json and README.md are byte-identical" sh -c \
    "cmp '$T/back/model.safetensors' '$T/d/model.safetensors' && cmp '$T/back/config.json' '$T/d/config.json' && cmp '$T/back/README.md' '$T/d/README.md'"
"$BIN/kpack" convert "$T/d" "$T/d2.kpk" --quiet && check "converting twice gives identical files" cmp "$T/d.kpk" "$T/d2.kpk"
expect_exit 2 "a drafter converts to one uncompressed file: --compress is refused" "$BIN/kpack" convert "$T/d" "$T/x.kpk" --compress trunk
expect_err "drafter checkpoint" "...naming why"
expect_exit 2 "krun refuses a drafter file as its model" "$BIN/krun" "$T/d.kpk" --ids 1,2 --gen 1
expect_err "is a drafter file" "...saying what it is"
expect_exit 2 "a model file given as a drafter is refused" "$BIN/krun" "$T/tgt.kpk" --draft "$T/tgt.kpk" --ids 1,2 --gen 1
expect_err "not a drafter" "...saying what it is"

# ---- the pinned revision: named when both digests match; half of it is a mixed download ------------
CFG=$(sha256sum "$T/d/config.json" | cut -c1-64)
W=$(sha256sum "$T/d/model.safetensors" | cut -c1-64)
KPACK_TEST_PINNED="$CFG:$W" "$BIN/kpack" check-source "$T/d" >"$T/pin.txt" 2>&1
check "both digests pinned: check-source names the release" grep -q "the pinned lightseekorg/kimi-k3-eagle3.1-mla" "$T/pin.txt"
KPACK_TEST_PINNED="$CFG:$W" "$BIN/kpack" convert "$T/d" "$T/pin.kpk" --quiet
"$BIN/kpack" info "$T/pin.kpk" --json >"$T/pin.json" 2>/dev/null
check "the drafter file records the pinned revision and both SHA-256 (from the pin)" "$PY" -c '
import json, sys; m = json.load(open(sys.argv[1]))["manifest"]
assert m["drafter"]["pinned"] == "lightseekorg/kimi-k3-eagle3.1-mla", m["drafter"]
files = {f["name"]: f for f in m["archive"]["files"]}
assert files["model.safetensors"]["sha256_from"] == "pinned" and files["config.json"]["sha256_from"] == "pinned", files' "$T/pin.json"
expect_exit 0 "export --check of the pinned drafter gives permission to delete the download" "$BIN/kpack" export "$T/pin.kpk" --check
expect_exit 1 "the pinned config with other weights: a damaged or mixed download" env KPACK_TEST_PINNED="$CFG:$(printf '%064d' 0)" "$BIN/kpack" check-source "$T/d"
grep -q "mixed download" "$T/last.out" && ok "...named so" || notok "...named so: $(head -c 300 "$T/last.out")"

# ---- every other roster, dtype, shape or config: refused, the tensor or key named ------------------
bad_src() {
    local label=$1 pat=$2; shift 2
    rm -rf "$T/bad"
    "$PY" "$ST" mutate "$T/d" "$T/bad" "$@" || { notok "mutate $*"; return; }
    expect_exit 1 "check-source refuses $label" "$BIN/kpack" check-source "$T/bad"
    grep -qE -- "$pat" "$T/last.out" "$T/last.err" && ok "...naming it ($pat)" || notok "...naming it ($pat): $(head -c 300 "$T/last.out")"
    expect_exit 1 "convert refuses $label, nothing written" "$BIN/kpack" convert "$T/bad" "$T/bad.kpk" --quiet
    [ ! -e "$T/bad.kpk" ] || notok "...but $T/bad.kpk was written"
}
bad_src "a tensor missing" "tensor lm_head.weight is missing" drop lm_head.weight
bad_src "a draft vocabulary map (d2t)" "tensor d2t is not in the K3 EAGLE-3.1 drafter's roster" add d2t
bad_src "an output gate (the NoPE design's g_proj)" "layers.0.self_attn.g_proj.weight is not in the" add layers.0.self_attn.g_proj.weight
bad_src "a BF16 tensor stored as U8" "is U8 .*the config implies BF16" dtype
bad_src "a tensor of another shape" "the config implies BF16" shape
bad_src "norm_output false (an EAGLE-3 drafter)" "norm_output is not true" config-set "norm_output=false"
bad_src "no fc_norm flag" "fc_norm is missing" config-drop fc_norm
bad_src "two layers" "num_hidden_layers is not 1" config-set "num_hidden_layers=2"
bad_src "a linear rope scaling" "rope_scaling is not YaRN" config-set 'rope_scaling={"type":"linear","factor":2}'
bad_src "YaRN without mscale_all_dim" "rope_scaling.mscale_all_dim is missing" config-set 'rope_scaling={"type":"yarn","factor":32,"original_max_position_embeddings":32768,"beta_fast":32,"beta_slow":1,"mscale":1}'
bad_src "a pruned draft vocabulary" "draft_vocab_size differs" config-set "draft_vocab_size=128"
bad_src "no tap ids" "eagle_config .*is missing" config-drop eagle_config
bad_src "taps out of order" "must ascend" config-set 'eagle_config={"eagle_aux_hidden_state_layer_ids":[6,2,10]}'
rm -rf "$T/bad"; "$PY" "$ST" mutate "$T/d" "$T/bad" truncate
expect_exit 1 "a truncated model.safetensors is refused" "$BIN/kpack" check-source "$T/bad"

# ---- a damaged drafter file: kpack verify names the extent (exit 1) ----------------------------------
"$PY" "$TOP/tests/cli/flip_drafter.py" "$T/d.kpk" "$T/dmg.kpk"
expect_exit 1 "kpack verify: a flipped bit in the drafter's weights" "$BIN/kpack" verify "$T/dmg.kpk"
grep -q "drafter weights" "$T/last.out" "$T/last.err" && ok "...named: drafter weights" || notok "...named: $(head -c 300 "$T/last.err")"

finish
