#!/usr/bin/env bash
# krun's EAGLE drafter (run/draft) against the independent float64 reference
# (tests/ref/eagle_ref.py) on k3synth targets and drafters in the released
# layout at tiny geometry: the committed KV rows, the pending row's fused g,
# every chain step's logits and the drafts (tolerances justified in
# tests/cli/compare_draft_ref.py and docs/DRAFTER.md), then the ablations:
# every deliberately broken drafter (one per K3_EAGLE.md §7 trap, make ablate)
# must fail these checks.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
CMP="$TOP/tests/cli/compare_draft_ref.py"
case ${BUILD:-build} in /*) B="$BUILD" ;; *) B="$TOP/${BUILD:-build}" ;; esac
PROBE="$B/tests/probe_draft"
ABL_PROBE="$B/ablate/tests/probe_draft"
ABL_KRUN="$B/ablate/bin/krun"
if ! $PY -c "import numpy" 2>/dev/null; then
    skip "drafter reference: /usr/bin/python3 has no numpy (python3-numpy)"; finish; exit 0
fi
mkdir -p "$T/refcache"
ids() { $PY -c "import random; r=random.Random($1); print(','.join(str(r.randrange(256)) for _ in range($2)))"; }

# target name | seed | k3synth options
TARGETS=(
  "k13|1|--geometry tiny --single-file"
  "k7|2|--geometry tiny --layers 7 --full-attn 2,5,7 --attn-res-block 2 --experts 16 --topk 4"
  "k11|12|--geometry tiny --single-file --layers 11"
)
# drafter name | its target | k3synth --drafter options.  Every width differs from the
# others (a transposed view fails); YaRN with a ramp that matters below 100 positions, and
# plain RoPE; taps at the first and the last layer; the rope part wider than the nope part.
DRAFTERS=(
  "d13|k13|--heads 3 --q-lora 48 --kv-lora 40 --nope 16 --rope 8 --v-head 24 --inter 160 --taps 2,6,10 --rope-theta 10000 --yarn-factor 4 --yarn-orig 256"
  "d13plain|k13|--heads 2 --q-lora 40 --kv-lora 24 --nope 8 --rope 16 --v-head 12 --inter 96 --taps 1,7,13 --rope-theta 500 --yarn-factor 0"
  "d7|k7|--taps 2,4,6 --rope-theta 10000 --yarn-factor 8 --yarn-orig 64"
  "d11|k11|--taps 1,5,11 --rope-theta 10000 --yarn-factor 4 --yarn-orig 128"
)
# drafter | prompt (seed:length) | the token after it | drafts.  100 positions: two prompt
# blocks in probe_draft (64 a block), positions past the YaRN ramp.
CASES=(
  "d13|3:40|77|6"
  "d13|4:100|5|8"
  "d13plain|4:100|200|8"
  "d7|3:40|1|8"
  "d7|5:9|1|4"
  "d11|12:60|9|8"
)
declare -A TGT_OF SEED_OF
for t in "${TARGETS[@]}"; do
    IFS='|' read -r name seed opts <<<"$t"
    SEED_OF[$name]=$seed
    "$BIN/k3synth" "$T/$name" --seed "$seed" $opts --quiet >/dev/null 2>"$T/err" && "$BIN/kpack" convert "$T/$name" "$T/$name.kpk" --quiet 2>>"$T/err" \
        || notok "target $name: $(head -c 300 "$T/err")"
done
for d in "${DRAFTERS[@]}"; do
    IFS='|' read -r name tgt opts <<<"$d"
    # the target's seed: the drafter's embedding is the target's (K3_EAGLE §1.3)
    "$BIN/k3synth" "$T/$name" --drafter --target "$T/$tgt" --seed "${SEED_OF[$tgt]}" $opts --quiet >/dev/null 2>"$T/err" \
        && "$BIN/kpack" convert "$T/$name" "$T/$name.kpk" --quiet 2>>"$T/err" || notok "drafter $name: $(head -c 300 "$T/err")"
    TGT_OF[$name]=$tgt
done
cmp_case() {   # cmp_case PROBE CASE [compare_draft_ref.py options]
    local probe=$1 c=$2; shift 2
    local dr pr nx k tgt
    IFS='|' read -r dr pr nx k <<<"$c"
    tgt=${TGT_OF[$dr]}
    $PY "$CMP" "$probe" "$T/$tgt" "$T/$dr" "$T/$tgt.kpk" "$T/$dr.kpk" --ids "$(ids "${pr%%:*}" "${pr##*:}")" --next "$nx" --drafts "$k" \
        --ref-cache "$T/refcache" --label "$tgt/$dr ${pr##*:} positions, $k drafts" "$@"
}
for c in "${CASES[@]}"; do cmp_case "$PROBE" "$c"; done

# Ablations: each drafter trap of K3_EAGLE.md §7, compiled into the test-only build
# (run/util/ablate.h, DRAFT_*), must be caught by the comparison on one of the cases.
if [ -n "${KPK_NO_ABLATIONS:-}" ]; then
    skip "ablations: KPK_NO_ABLATIONS is set (make test-arm64 runs the comparisons only; make test runs the ablations)"
elif [ ! -x "$ABL_PROBE" ] || [ ! -x "$ABL_KRUN" ]; then
    notok "the ablation build $ABL_PROBE is missing (make ablate)"
else
    n=0
    for abl in $("$ABL_KRUN" --list-ablations | grep '^DRAFT_'); do
        n=$((n + 1))
        caught=""
        for c in "${CASES[@]}"; do
            if KRUN_ABLATE=$abl cmp_case "$ABL_PROBE" "$c" --expect-fail >"$T/abl.out" 2>&1; then
                caught=$(sed 's/^ok - //' "$T/abl.out" | cut -c1-140)
                break
            fi
        done
        if [ -n "$caught" ]; then ok "ablation $abl is caught ($caught)"; else notok "ablation $abl passes every check"; fi
    done
    want=$(grep -c '^ *ABL_DRAFT_' "$TOP/run/util/ablate.h")
    [ "$n" -eq "$want" ] && ok "every drafter ablation of run/util/ablate.h was tried ($n)" || notok "$n drafter ablations listed, run/util/ablate.h has $want"
fi
finish
