#!/usr/bin/env bash
# The states' paging beside other I/O (issue 34.15; docs/BATCH.md, "States on disk"; make bench,
# BENCH_ONLY=statepage): krun batch with its states paged to disk (--state-dir), the weights
# streamed with O_DIRECT, alone and beside a competing reader (dd iflag=direct over the same
# disk).  Each variant is a krun binary and its --io: given as NAME=KRUN:IO[:VAR=VALUE], e.g.
#   tests/bench/bench_statepage.sh POOL.kpk old-direct=/tmp/krun.main:direct old-pread=/tmp/krun.main:pread new=bin/krun:direct \
#       new-window=bin/krun:direct:KRUN_TEST_STATE_WINDOW_CACHE=1
# (VAR=VALUE: one environment variable for that variant's runs.)
# (default: bin/krun with --io direct and pread).  Rounds alternate the variants' order; every
# run (its page-cache drop included) holds flock on BENCH_LOCK when given.  Per variant and
# competitor: the median run seconds and seconds the forward passes waited for the state file
# (state_wait_seconds of --json), and the ratio to the first variant.  Prints figures, never
# fails on a time.
# Env: BENCH_SP_SEQS (16), BENCH_SP_GEN (6), BENCH_SP_MEM (2G), BENCH_RUNS (3), BENCH_SETTLE (2),
#      BENCH_LOCK, BENCH_SP_DD (the file dd reads; default the model file itself, from its end).
set -eu
cd "$(dirname "$0")/../.."
. tests/bench/bench_lib.sh
bench_init statepage
KPK=${1:-${BENCH_BATCH_KPK:-}}
[ $# -gt 0 ] && shift
VARIANTS=("$@")
[ ${#VARIANTS[@]} -eq 0 ] && VARIANTS=("direct=$BIN/krun:direct" "pread=$BIN/krun:pread")
SEQS=${BENCH_SP_SEQS:-16}
GEN=${BENCH_SP_GEN:-6}
MEMB=${BENCH_SP_MEM:-2G}
RUNS=${BENCH_RUNS:-3}
SETTLE=${BENCH_SETTLE:-2}
LOCK=${BENCH_LOCK:-}
DDF=${BENCH_SP_DD:-$KPK}
cleanup() { [ -n "${DDPID:-}" ] && kill "$DDPID" 2>/dev/null; [ -z "${BENCH_KEEP:-}" ] && rm -rf "$W"; return 0; }
trap cleanup EXIT
if [ -z "$KPK" ] || [ ! -f "$KPK" ]; then
    echo "skipped: no release-geometry pool (give its path, or BENCH_BATCH_KPK; see tests/bench/bench_batch.sh)"
    exit 0
fi
V=$("$BIN/kpack" info "$KPK" | sed -n 's/.*vocab \([0-9]*\).*/\1/p' | head -1)
machine
echo "# $KPK, --mem $MEMB, $SEQS requests of $GEN tokens (--max-seqs $SEQS), --state-dir; $RUNS rounds, alternating"
python3 - "$W/in.jsonl" "$SEQS" "$V" "$GEN" <<'PY'
import json, random, sys
path, n, vocab, gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(34)
with open(path, "w") as f:
    for i in range(n):
        body = {"prompt": [rng.randrange(256, vocab)], "max_tokens": gen, "temperature": 0, "ignore_eos": True}
        f.write(json.dumps({"custom_id": "r%d" % i, "method": "POST", "url": "/v1/completions", "body": body}) + "\n")
PY
SIZE=$(stat -c %s "$DDF")
one() {   # one VARIANT COMPETITOR ROUND
    local name=${1%%=*} spec=${1#*=} comp=$2 r=$3
    local bin=${spec%%:*} io=${spec#*:} env=
    case $io in *:*) env=${io#*:}; io=${io%%:*};; esac
    rm -rf "$W/out.jsonl" "$W/states"
    [ "$CAN_DROP" = 1 ] && { sync; echo 3 >/proc/sys/vm/drop_caches; }
    sleep "$SETTLE"
    if [ "$comp" = dd ]; then
        # from the file's last quarter, so that it does not read what krun reads
        dd if="$DDF" of=/dev/null bs=1M iflag=direct skip=$((SIZE / 4 * 3 / 1048576)) 2>/dev/null & DDPID=$!
    fi
    env ${env:+"$env"} "$bin" batch "$KPK" "$W/in.jsonl" "$W/out.jsonl" --max-seqs "$SEQS" --ctx $((GEN + 8)) --mem "$MEMB" --io "$io" \
        --state-dir "$W/states" --seed 1 --created 1 --quiet --json >"$W/r-$name-$comp-$r.json" 2>"$W/err" || {
        echo "FAILED: $name ($comp): $(tail -c 300 "$W/err")"; }
    if [ -n "${DDPID:-}" ]; then kill "$DDPID" 2>/dev/null; wait "$DDPID" 2>/dev/null || true; DDPID=; fi
    cp "$W/out.jsonl" "$W/out-$name-$comp-$r.jsonl" 2>/dev/null || true
}
for r in $(seq "$RUNS"); do
    for comp in alone dd; do
        order=("${VARIANTS[@]}")
        [ $((r % 2)) -eq 0 ] && order=($(printf '%s\n' "${VARIANTS[@]}" | tac))
        for v in "${order[@]}"; do
            [ -n "$LOCK" ] && { exec 9>>"$LOCK"; flock 9; }
            one "$v" "$comp" "$r"
            [ -n "$LOCK" ] && exec 9>&-
            echo "# round $r, $comp, ${v%%=*}: $(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("%.1f s, %.1f s waiting for the state file, %.0f MB of state read, %.0f MB written" % (j["seconds"], j["state_wait_seconds"], j["state_bytes_read"]/1e6, j["state_bytes_written"]/1e6))' "$W/r-${v%%=*}-$comp-$r.json" 2>/dev/null || echo failed)"
        done
    done
done
python3 - "$W" "$RUNS" "${VARIANTS[@]}" <<'PY'
import json, statistics, sys, glob, os
w, runs, variants = sys.argv[1], int(sys.argv[2]), [v.split("=")[0] for v in sys.argv[3:]]
ref = None
texts = set()
for comp in ("alone", "dd"):
    print("\n## %s" % ("alone" if comp == "alone" else "beside a competing direct dd"))
    print("| variant | runs | seconds (median) | waiting for the state file (median) | ratio to %s |" % variants[0])
    print("|---|---:|---:|---:|---:|")
    base = None
    for v in variants:
        js = []
        for r in range(1, runs + 1):
            p = "%s/r-%s-%s-%d.json" % (w, v, comp, r)
            if os.path.exists(p) and os.path.getsize(p):
                js.append(json.load(open(p)))
            o = "%s/out-%s-%s-%d.jsonl" % (w, v, comp, r)
            if os.path.exists(o):
                texts.add(tuple(json.loads(l)["response"]["body"]["choices"][0]["text"] for l in open(o)))
        if not js:
            print("| %s | 0 | - | - | - |" % v)
            continue
        s = statistics.median(j["seconds"] for j in js)
        sw = statistics.median(j["state_wait_seconds"] for j in js)
        if base is None: base = s
        print("| %s | %d | %.1f | %.1f | %.2f |" % (v, len(js), s, sw, s / base))
print("\noutputs identical across every run: %s" % ("yes" if len(texts) == 1 else "NO (%d different)" % len(texts)))
PY
