#!/usr/bin/env bash
# config.json values out of range are refused by name (issue 12.3): every
# row of the README's table is checked against the code, both bounds
# accepted and a value just past each refused with the field, the value and
# the range; then convert and krun (a re-sealed file whose embedded config
# is out of range) refuse the issue's routed_scaling_factor = 1e308.
. "$(dirname "$0")/lib.sh"

"$BIN/k3synth" "$T/src" --geometry tiny --seed 5 --quiet >/dev/null 2>"$T/synth.err" \
    || { notok "k3synth tiny: $(cat "$T/synth.err")"; finish; exit 1; }

# $T/c is $T/src with its own config.json; variants are written in one go
# (one python for all of them) and copied into place.
mkdir "$T/c" "$T/cfg"
for f in "$T"/src/*; do ln -s "$f" "$T/c/"; done
rm "$T/c/config.json"
# variants KEY=JSON...: $T/cfg/N.json for the N-th pair, in order
variants() {
    python3 - "$T/src/config.json" "$T/cfg" "$@" <<'PY'
import json, sys
base = open(sys.argv[1]).read()
for n, kv in enumerate(sys.argv[3:]):
    key, val = kv.split("=", 1)
    c = json.loads(base); t = c["text_config"]; lin = t["linear_attn_config"]
    (lin if key in lin else t)[key] = json.loads(val)
    json.dump(c, open("%s/%d.json" % (sys.argv[2], n), "w"))
PY
}
use_cfg() { cp "$T/cfg/$1.json" "$T/c/config.json"; }

rows=$(python3 - "$TOP/README.md" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
body = s[s.index("<!-- config-ranges"):s.index("<!-- /config-ranges -->")]
for line in body.splitlines():
    m = re.match(r"\| `(\w+)`[^|]*\| (-?[0-9.e+-]+)\.\.(-?[0-9.e+-]+)", line)
    if m:
        key, lo, hi = m.groups()
        if "." in lo + hi or "e" in lo + hi:   # a real: past each bound by a factor of 2
            l, h = float(lo), float(hi)
            above, below, real = repr(h * 2 if h > 0 else h / 2), repr(l / 2 if l > 0 else l * 2), 1
        else:
            above, below, real = int(hi) + 1, int(lo) - 1, 0
        print(key, lo, hi, above, below, real)
PY
)
n_rows=$(wc -l <<<"$rows")
[ "$n_rows" -ge 25 ] && ok "the README lists $n_rows ranges" || notok "README config table: only $n_rows rows parsed"
pairs=()
while read -r key lo hi above below real; do pairs+=("$key=$above" "$key=$below" "$key=$lo" "$key=$hi"); done <<<"$rows"
variants "${pairs[@]}"

i=0
while read -r key lo hi above below real; do
    bad=""
    for v in "$above" "$below"; do
        use_cfg $i; i=$((i + 1))
        "$BIN/kpack" check-source "$T/c" --quiet >/dev/null 2>"$T/err"; rc=$?
        grep -qE "config: $key = [-0-9.e+]+ is outside the accepted range $lo\.\.$hi " "$T/err" && [ $rc -eq 1 ] \
            || bad="$bad $key=$v: rc $rc: $(head -c 200 "$T/err");"
    done
    for v in "$lo" "$hi"; do
        use_cfg $i; i=$((i + 1))
        "$BIN/kpack" check-source "$T/c" --quiet >/dev/null 2>"$T/err"; rc=$?
        # a size at its bound changes the tensors' shapes (or meets another
        # field's rule), so the check then fails on that; a real at its bound
        # passes outright
        if grep -q "config: $key = .* is outside the accepted range" "$T/err" || { [ "$real" -eq 1 ] && [ $rc -ne 0 ]; }; then
            bad="$bad $key=$v refused: $(head -c 200 "$T/err");"
        fi
    done
    [ -z "$bad" ] && ok "$key: $lo and $hi accepted, $below and $above refused by name" || notok "$key:$bad"
done <<<"$rows"

variants num_experts_per_token=9 first_k_dense_replace=14 routed_expert_hidden_size=48 hidden_size=128.5 \
    routed_scaling_factor='"1.0"' routed_scaling_factor=1e308
cross() { # cross LABEL N PATTERN: variant N is refused, naming the problem
    use_cfg "$2"
    expect_exit 1 "check-source: $1" "$BIN/kpack" check-source "$T/c" --quiet
    expect_err "$3" "$1: named"
}
cross "top-k above the expert count" 0 "num_experts_per_token = 9 must be <= num_experts \(8\)"
cross "more dense layers than layers" 1 "first_k_dense_replace = 14 is outside 0..num_hidden_layers \(13\)"
cross "latent width not a multiple of 32" 2 "routed_expert_hidden_size = 48 is not a multiple of 32"
cross "a fractional size" 3 "hidden_size must be an integer"
cross "a number as a string" 4 "routed_scaling_factor must be a number"

# The issue's case, through every tool.
use_cfg 5
expect_exit 1 "check-source: routed_scaling_factor = 1e308" "$BIN/kpack" check-source "$T/c" --quiet
expect_err "routed_scaling_factor = 1e\+308 is outside the accepted range 0.001..100 \(Kimi K3: 1.0\)" "check-source names field, value, range"
expect_exit 1 "convert: routed_scaling_factor = 1e308" "$BIN/kpack" convert "$T/c" "$T/bad.kpk" --quiet
expect_err "routed_scaling_factor = 1e\+308 is outside" "convert names it"
[ ! -e "$T/bad.kpk" ] && [ ! -e "$T/bad.kpk.partial" ] && ok "convert wrote nothing" || notok "convert wrote output"
"$BIN/kpack" convert "$T/src" "$T/good.kpk" --quiet || notok "convert of the good source"
python3 "$TOP/tests/soak/kpkseal.py" set-config "$T/good.kpk" "$T/sealed.kpk" routed_scaling_factor=1e308 \
    || notok "kpkseal set-config"
expect_exit 1 "krun: a re-sealed file whose config says routed_scaling_factor = 1e308" \
    "$BIN/krun" "$T/sealed.kpk" --ids 1,2,3 --gen 2 --quiet
expect_err "embedded config.json: config: routed_scaling_factor = 1e\+308 is outside" "krun names the field"
[ ! -s "$T/last.out" ] && ok "krun printed no token" || notok "krun printed: $(head -c 100 "$T/last.out")"
finish
