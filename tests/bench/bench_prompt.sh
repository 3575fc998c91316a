#!/usr/bin/env bash
# Prompt blocks on a release-geometry expert pool (make bench; BENCH_ONLY=prompt;
# issue 19, docs/PERFORMANCE.md "Prompt blocks"): prompts of 256 and 1,024 tokens
# at --chunk 64 and --chunk auto, page cache dropped before every run, in
# alternating order: expert reads, bytes, prompt seconds (medians), the ids
# (the same for every block), and the expert reads the union model predicts:
#   uniform   N (1 - (1 - k/N)^B) per block and MoE layer (the planner's model,
#             the right one for the release, whose routing is balanced);
#   measured  from the run's own routing histogram (--json "routing": c_e, the
#             times expert e was chosen over the P prompt positions), each
#             block's positions drawn from the prompt's:
#             sum_e 1 - C(P - c_e, B) / C(P, B).
# Prints figures and ratios, never fails on a time.
#
# The pool: BENCH_PROMPT_KPK (e.g. k3synth --geometry slice --layers 2
# --experts 896 --topk 16 --routing flat, 19.8 GB, converted), or else one made
# here with the same k/N = 1/56 at half the disk: 448 experts top-8 (~10 GB,
# deleted at the end).
#
# Env: BENCH_PROMPT_KPK, BENCH_PROMPT_TOKENS (default "256 1024"),
#      BENCH_PROMPT_MEM (default 4G), BENCH_PROMPT_CHUNKS (default "64 auto"),
#      BENCH_RUNS (default 3), BENCH_DIR (kept), BENCH_KEEP, BENCH_SETTLE.
set -u
cd "$(dirname "$0")/../.."
. tests/bench/bench_lib.sh
bench_init prompt
RUNS=${BENCH_RUNS:-3}
MEM=${BENCH_PROMPT_MEM:-4G}
CHUNKS=${BENCH_PROMPT_CHUNKS:-64 auto}
KPK=${BENCH_PROMPT_KPK:-}
MADE=
# the pool made here always goes; the work directory too unless it is the caller's (BENCH_DIR) or BENCH_KEEP
cleanup() {
    [ -n "$MADE" ] && rm -rf "$W/pool" "$W/pool.kpk"
    [ -z "${BENCH_DIR:-}" ] && [ -z "${BENCH_KEEP:-}" ] && rm -rf "$W"
    return 0
}
trap cleanup EXIT
if [ -z "$KPK" ]; then
    MADE=1
    echo "# the pool: k3synth --geometry slice --layers 2 --experts 448 --topk 8 --routing flat (k/N = 1/56, as the release's 16/896)"
    "$BIN/k3synth" "$W/pool" --geometry slice --layers 2 --experts 448 --topk 8 --routing flat --seed 5 --quiet >/dev/null &&
        "$BIN/kpack" convert "$W/pool" "$W/pool.kpk" --quiet || { echo "FAILED: making the pool"; exit 1; }
    rm -rf "$W/pool"
    KPK=$W/pool.kpk
fi
echo "# $KPK, --mem $MEM, page cache dropped before each run (CAN_DROP=$CAN_DROP), $RUNS rounds in alternating order"
V=$("$BIN/kpack" info "$KPK" | sed -n 's/.*vocab \([0-9]*\).*/\1/p' | head -1)
[ -n "$V" ] || { echo "FAILED: kpack info $KPK"; exit 1; }
rc=0
for P in ${BENCH_PROMPT_TOKENS:-256 1024}; do
    python3 -c 'import random, sys; random.seed(int(sys.argv[1])); print(",".join(str(random.randrange(1, int(sys.argv[2]))) for _ in range(int(sys.argv[1]))))' "$P" "$V" >"$W/ids$P"
    order=$CHUNKS
    for r in $(seq "$RUNS"); do
        for c in $order; do
            drop
            "$BIN/krun" "$KPK" --ids "$(cat "$W/ids$P")" --gen 1 --mem "$MEM" --chunk "$c" --json "$W/p$P-c$c-r$r.json" --quiet >/dev/null \
                2>"$W/err" || { echo "FAILED: krun --chunk $c, $P tokens: $(head -c 300 "$W/err")"; rc=1; }
        done
        order=$(echo "$order" | tr ' ' '\n' | tac | tr '\n' ' ')
    done
    python3 - "$W" "$P" "$RUNS" $CHUNKS <<'PY' || rc=1
import json, statistics, sys
from math import comb
w, P, runs, chunks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
print("\n| %d tokens, `--chunk` | blocks | expert reads | predicted: uniform | predicted: measured loads | expert GB | GB read | prompt s (median) | ids |" % P)
print("|---|---|---:|---:|---:|---:|---:|---:|---|")
base = None
for c in chunks:
    js = [json.load(open("%s/p%d-c%s-r%d.json" % (w, P, c, r))) for r in range(1, runs + 1)]
    j, pl, q = js[0], js[0]["plan"], js[0]["prompt_plan"]
    B, nb = q["block"], q["blocks"]
    full, rem = divmod(P, B)
    def hyper(b, cnt):
        return sum(1 - comb(P - x, b) / comb(P, b) for x in cnt) if b else 0.0
    meas = sum(full * hyper(B, h["counts"]) + hyper(rem, h["counts"]) for h in j["routing"])
    uni = q["expert_bytes"] / pl["expert_slot_bytes"]
    miss = j["expert_misses"]
    secs = statistics.median(x["prefill_seconds"] for x in js)
    same = len({tuple(x["generated_ids"]) for x in js}) == 1 and len({x["bytes_experts"] for x in js}) == 1
    print("| %s | %d x %d (%s layout) | %d | %.0f (%+.1f%%) | %.0f (%+.1f%%) | %.2f | %.2f | %.1f (%s) | %s%s |" % (
        c, nb, B, q["layout"], miss, uni, 100 * (uni / miss - 1), meas, 100 * (meas / miss - 1), j["bytes_experts"] / 1e9,
        j["bytes_read"] / 1e9, secs, ", ".join("%.1f" % x["prefill_seconds"] for x in js), j["generated_ids"],
        "" if same else " (differs between rounds!)"))
    if base is None:
        base = (j["bytes_experts"], secs, j["generated_ids"])
    else:
        print("|   vs `--chunk %s` | | | | | %.2fx | | %.2fx | %s |" % (chunks[0], j["bytes_experts"] / base[0], secs / base[1],
              "same" if j["generated_ids"] == base[2] else "DIFFERENT"))
PY
done
exit $rc
