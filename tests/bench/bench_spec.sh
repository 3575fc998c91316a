#!/usr/bin/env bash
# Speculative decoding on a full-width slice, streaming (make bench;
# BENCH_ONLY=spec): bytes and seconds per generated token with and without
# --spec, page cache dropped before every run.  Prints figures, never fails
# on a time.
#
# The slice: hidden 7168, one KDA and one MLA layer, 64 experts of 17.5 MB,
# top-4, vocabulary 512 (4.3 GB), at two splits, the same for every run:
#  * the planner's minimum budget with --spec 8: with two layers that pins
#    the trunk (cheaper than a ring of two slots), so a sweep reads the
#    experts its positions chose that are not cached;
#  * the trunk streamed (--pin 0, 16 expert slots): every sweep also reads
#    both trunk layers (1.9 GB), as the full model does at any budget below
#    ~110 GB.
#
# The synthetic model's text is random, and its greedy continuation depends
# chaotically on the whole context: a prompt that merely contains an earlier
# continuation does not make it repeat that continuation.  What repeats is
# the model's own text when it falls into a cycle.  On this slice (seed 9)
# the prompt 122,78,49,93,246,68,90,172 does after ~22 tokens (a 3-token
# cycle; found by searching random prompts, docs/PERFORMANCE.md).  So the
# repeating prompt is that prompt plus the first 30 tokens the model
# generates from it (let it generate once, then feed a prompt containing that
# continuation): by determinism the model goes on exactly as it would have,
# round the cycle, and the history already holds the cycle for prompt lookup.
# The prompt without repetition is 16 spread-out ids.  Both run through krun
# --spec 0 and --spec 8 (the real drafter).  And as a bound on text that
# repeats but is diverse: tests/bench/bench_spec.c decodes the non-repeating
# prompt with krun_session_verify, the drafts being the model's own
# continuation read from the --spec 0 run (every draft comes true), and with
# every 4th draft wrong.
#
# Env: BENCH_SPEC_SPLITS ("min streamed", the default, or one of them), BENCH_DIR, BENCH_KEEP=1, BENCH_RUNS (default 3), BENCH_GEN (default
#      24), BENCH_SPEC_SEED (the slice's seed, default 9), BENCH_SPEC_CYCLE
#      (a prompt whose text falls into a cycle on that slice), BENCH_SPEC_LEAD
#      (tokens of its continuation put in the prompt, default 30).
set -u
cd "$(dirname "$0")/../.."
BIN=${BIN:-bin}
W=${BENCH_DIR:-$(mktemp -d "$PWD/build/bench-spec.XXXXXX")}
mkdir -p "$W"
RUNS=${BENCH_RUNS:-3}
GEN=${BENCH_GEN:-24}
SEED=${BENCH_SPEC_SEED:-9}
CYCLE=${BENCH_SPEC_CYCLE:-122,78,49,93,246,68,90,172}
LEAD=${BENCH_SPEC_LEAD:-30}
CC=${CC:-gcc}
rc=0
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(cannot drop the page cache: not root?)" >&2; sleep 2; }

$CC -std=c11 -O2 -ffp-contract=off -D_GNU_SOURCE -I. -o "$W/bench_spec" tests/bench/bench_spec.c build/libkrun.a \
    build/libkpkformat.a -lzstd -lxxhash -lcrypto -ljansson -lpcre2-8 -lpthread -lm || { echo "FAILED: building bench_spec"; exit 1; }
if [ ! -f "$W/spec.kpk" ]; then
    "$BIN/k3synth" "$W/spec" --geometry slice --layers 2 --experts 64 --topk 4 --vocab 512 --first-dense 0 --seed "$SEED" --quiet &&
        "$BIN/kpack" convert "$W/spec" "$W/spec.kpk" --quiet || { echo "FAILED: making the slice"; exit 1; }
    rm -rf "$W/spec"
fi
NOREP=$(python3 -c 'print(",".join(str(37 * i % 500 + 3) for i in range(16)))')
# the repeating prompt: the cycle prompt and the first LEAD tokens the model generates from it
"$BIN/krun" "$W/spec.kpk" --ids "$CYCLE" --gen "$LEAD" --ignore-eos --print-ids --quiet >"$W/lead.txt" || { echo "FAILED: the lead"; exit 1; }
REPEAT="$CYCLE,$(tr ' ' ',' <"$W/lead.txt")"
echo "repeating prompt: $REPEAT"
"$BIN/krun" "$W/spec.kpk" --plan --mem 64G --ctx $((8 + LEAD + GEN)) --spec 8 --json "$W/plan.json" >/dev/null
MIN=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["minimum_bytes"])' "$W/plan.json")
echo "== speculative decoding, full-width slice (seed $SEED, $(ls -l "$W/spec.kpk" | awk '{printf "%.2f GB", $5/1e9}')), $GEN tokens"

cli() { # cli LABEL IDS ARGS...: one krun run, its --json kept as $W/LABEL.N.json
    local label=$1 ids=$2; shift 2
    drop
    "$BIN/krun" "$W/spec.kpk" --ids "$ids" --gen "$GEN" --ignore-eos $SPLIT --quiet --json "$W/$label.$r.json" "$@" \
        >/dev/null 2>"$W/err" || { echo "FAILED: $label: $(head -c 300 "$W/err")"; rc=1; }
}
oracle() { # oracle LABEL REF ARGS...: bench_spec with the same split
    local label=$1 ref=$2; shift 2
    drop
    "$W/bench_spec" "$W/spec.kpk" --ref "$ref" $SPLIT --json "$W/$label.$r.json" "$@" >/dev/null 2>"$W/err" \
        || { echo "FAILED: $label: $(head -c 300 "$W/err")"; rc=1; }
}
# BENCH_SPEC_SPLITS: "min", "streamed" or both (default)
SPLITS=()
[[ " ${BENCH_SPEC_SPLITS:-min streamed} " == *" min "* ]] && SPLITS+=("--mem $MIN")
[[ " ${BENCH_SPEC_SPLITS:-min streamed} " == *" streamed "* ]] && SPLITS+=("--mem 6G --pin 0 --expert-slots 16")
for SPLIT in "${SPLITS[@]}"; do
echo
echo "-- $SPLIT"
rm -f "$W"/*.[0-9]*.json
for r in $(seq 1 "$RUNS"); do
    echo "-- round $r"
    cli norep0 "$NOREP" --spec 0
    cli norep8 "$NOREP" --spec 8
    oracle true8 "$W/norep0.$r.json" --drafts 8
    oracle miss8 "$W/norep0.$r.json" --drafts 8 --wrong 4
    cli rep0 "$REPEAT" --spec 0
    cli rep8 "$REPEAT" --spec 8
done
python3 - "$W" "$RUNS" <<'PY'
import json, os, statistics, sys
w, runs = sys.argv[1], int(sys.argv[2])
# (key, label, the --spec 0 run it is compared with)
rows = [("rep0", "repeating text (a cycle), --spec 0", "rep0"), ("rep8", "repeating text (a cycle), --spec 8", "rep0"),
        ("norep0", "no repetition, --spec 0", "norep0"), ("norep8", "no repetition, --spec 8", "norep0"),
        ("true8", "no repetition, drafts that come true (bound)", "norep0"),
        ("miss8", "the same, every 4th draft wrong", "norep0")]
print("%-46s %7s %8s %9s %12s %10s" % ("", "sweeps", "drafted", "accepted", "GB / token", "s / token"))
base = {}
for key, label, ref in rows:
    js = [json.load(open(f"{w}/{key}.{r}.json")) for r in range(1, runs + 1) if os.path.exists(f"{w}/{key}.{r}.json")]
    if not js:
        continue
    d = [j["decode"] for j in js]
    s = js[0].get("spec") or {"drafted": 0, "accepted": 0}
    gb = statistics.median(x["bytes_per_token"] for x in d) / 1e9
    sec = statistics.median(x["seconds_per_token"] for x in d)
    base[key] = (gb, sec)
    b = base[ref]
    print("%-46s %7d %8d %9d %12.3f %10.2f   (x%.2f bytes, x%.2f time vs --spec 0)" % (
        label, d[0]["sweeps"], s["drafted"], s["accepted"], gb, sec, gb / b[0], sec / b[1]))
PY
done
[ -n "${BENCH_KEEP:-}" ] || rm -f "$W/spec.kpk"
exit $rc
