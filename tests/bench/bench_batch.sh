#!/usr/bin/env bash
# krun batch on a release-geometry expert pool (make bench; BENCH_ONLY=batch; issue 21,
# docs/BATCH.md "Measured"): B = 1, 4, 16, 64 requests, --max-seqs B, at a budget that streams,
# page cache dropped before every run, rounds in alternating order.  Per B: sweeps, generated
# tokens per decoding sweep, bytes per decoding sweep against the union model's prediction,
# bytes and seconds per generated token (decoding-only sweeps; the prompts' sweep apart), and
# the ratio to B = 1.  Prints figures and ratios, never fails on a time.
#
# The requests: /v1/completions, a prompt of one token id (a different one each), max_tokens
# GEN, temperature 0, ignore_eos: every request starts in the first sweep (its prompt is one
# position) and ends in the last, so each decoding sweep runs B sequences and decoding is what
# is measured.  (The first token of each comes from the prompt's sweep: GEN - 1 decoding sweeps.)
#
# Bytes, two ways: krun's store counters (the --json summary: decoding sweeps' bytes, every
# byte) and the kernel's, /proc/PID/io read_bytes of the process that ran krun batch (read
# after krun exits: a reaped child's I/O is added to its parent's).  krun reads with --io direct
# (O_DIRECT, the default): the page cache never serves a repeated run, and it is dropped anyway.
#
# The prediction (run/session/sweep_model.c, from krun --plan --json at the same budget, B and
# --ctx): streamed trunk + lm_head + MoE layers x N x (1 - (1 - k/N)^B) x expert bytes x the share
# the expert cache does not hold.  At full scale (laptop preset) that is the issue's
# 105 + 1,447 x (1 - (1 - 16/896)^B) GB; on the pool below, one MoE layer of 896 experts.
#
# The pool (19.8 GB; not made here: it takes ~30 min and the disk):
#   bin/k3synth POOL --geometry slice --layers 2 --experts 896 --topk 16 --routing flat \
#       --tokenizer ../shared/fixtures/tokenizer/tiktoken.model && bin/kpack convert POOL POOL.kpk
# Usage: tests/bench/bench_batch.sh [POOL.kpk]   (or BENCH_BATCH_KPK; skipped, exit 0, without)
# Two budgets by default.  At 4G the plan for B = 1 pins the pool's whole trunk (3.19 GB: the
# dense layer 0 and the KDA layer), so one sequence reads only its experts; 64 sequences' state
# (7.6 MB each) leaves room to pin only layer 0.  At 2G nothing is pinned at any B: the trunk
# streams every sweep, as at full scale, where it never fits (105 of the laptop preset's 131 GB
# per token).  What batching saves is the trunk read once for B tokens and the union of experts.
# Env:   BENCH_BATCH_SIZES ("1 4 16 64"), BENCH_BATCH_GEN (tokens per request, 6),
#        BENCH_BATCH_MEM (budgets, "4G 2G"), BENCH_RUNS (rounds, 3), BENCH_SETTLE (s after a drop, 3),
#        BENCH_LOCK (a file: every run, its drop included, holds flock on it, for machines
#        where another bench uses the same disk; with BENCH_LOCK_ROUND=1 one flock a round),
#        BENCH_BATCH_STATES ("resident", or "resident paged": each budget also with the states paged
#        to disk, --state-dir: the same texts, the pager's bytes and its share of the run's bytes),
#        BENCH_DIR (kept; a run whose result is there
#        already is not run again: the same command continues an interrupted bench), BENCH_KEEP.
set -eu
cd "$(dirname "$0")/../.."
. tests/bench/bench_lib.sh
bench_init batch
RUNS=${BENCH_RUNS:-3}
MEMS=${BENCH_BATCH_MEM:-4G 2G}
GEN=${BENCH_BATCH_GEN:-6}
SIZES=${BENCH_BATCH_SIZES:-1 4 16 64}
STATES=${BENCH_BATCH_STATES:-resident}
LOCK=${BENCH_LOCK:-}
PER_RUN=(env)        # the prefix of every run: a flock of its own unless a round holds one
[ -n "$LOCK" ] && [ -z "${BENCH_LOCK_ROUND:-}" ] && PER_RUN=(flock "$LOCK")
KPK=${1:-${BENCH_BATCH_KPK:-}}
CTX=$((GEN + 8))
cleanup() { [ -z "${BENCH_DIR:-}" ] && [ -z "${BENCH_KEEP:-}" ] && rm -rf "$W"; return 0; }
trap cleanup EXIT
if [ -z "$KPK" ] || [ ! -f "$KPK" ]; then
    echo "skipped: no release-geometry pool (give its path, or BENCH_BATCH_KPK; how to make one: the header of $0)"
    exit 0
fi
[ "$CAN_DROP" = 1 ] || echo "NOTE: the page cache cannot be dropped (not root): krun still reads with O_DIRECT"
V=$("$BIN/kpack" info "$KPK" | sed -n 's/.*vocab \([0-9]*\).*/\1/p' | head -1)
[ -n "$V" ] || { echo "FAILED: kpack info $KPK"; exit 1; }
machine
echo "# $KPK, --io direct --ctx $CTX, $GEN tokens per request (a one-token prompt), $RUNS rounds in alternating order${LOCK:+, each run under flock $LOCK}"

# the requests
for b in $SIZES; do
    python3 - "$W/in$b.jsonl" "$b" "$V" "$GEN" <<'PY'
import json, random, sys
path, n, vocab, gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(21)
with open(path, "w") as f:
    for i in range(n):
        body = {"prompt": [rng.randrange(256, vocab)], "max_tokens": gen, "temperature": 0, "ignore_eos": True}
        f.write(json.dumps({"custom_id": "r%d" % i, "method": "POST", "url": "/v1/completions", "body": body}) + "\n")
PY
done

# one run: drop the page cache, krun batch, then the kernel's read_bytes of the shell that ran it
cat >"$W/one.sh" <<'SH'
set -eu
w=$1; drop=$2; settle=$3; shift 3
if [ "$drop" = 1 ]; then sync; echo 3 >/proc/sys/vm/drop_caches; fi
sleep "$settle"
"$@" >"$w/sum.tmp" 2>"$w/err"
sed -n 's/^read_bytes: //p' /proc/$$/io >"$w/io.tmp"
SH
for MEMB in $MEMS; do
for ST in $STATES; do
# MEM names the runs of a budget and a state mode (the paged ones: 2G-paged)
MEM=$MEMB; PAGE=()
[ "$ST" = paged ] && { MEM=$MEMB-paged; PAGE=(--state-dir "$W/states"); }
echo
echo "## --mem $MEMB${PAGE[*]:+ ${PAGE[*]}}"
for b in $SIZES; do
    "$BIN/krun" "$KPK" --plan --mem "$MEMB" --max-seqs "$b" --ctx "$CTX" "${PAGE[@]}" --json "$W/plan$b-$MEM.json" >/dev/null 2>"$W/err" ||
        { echo "FAILED: krun --plan --mem $MEM --max-seqs $b: $(head -c 300 "$W/err")"; exit 1; }
done
rc=0
order=$SIZES
for r in $(seq "$RUNS"); do
    # BENCH_LOCK_ROUND: one flock for a whole round (its runs, each with its drop), not one per run
    [ -n "$LOCK" ] && [ -n "${BENCH_LOCK_ROUND:-}" ] && { exec 9>>"$LOCK"; flock 9; }
    for b in $order; do
        if [ -f "$W/r$b-$MEM-$r.json" ]; then echo "# round $r, B = $b: kept from an earlier run in $W"; continue; fi
        rm -f "$W/out$b.jsonl"
        if "${PER_RUN[@]}" bash "$W/one.sh" "$W" "$CAN_DROP" "$SETTLE" \
                "$BIN/krun" batch "$KPK" "$W/in$b.jsonl" "$W/out$b.jsonl" --max-seqs "$b" --ctx "$CTX" --mem "$MEMB" --io direct \
                "${PAGE[@]}" --seed 1 --created 1 --quiet --json; then
            python3 - "$W/sum.tmp" "$(cat "$W/io.tmp")" "$W/out$b.jsonl" >"$W/r$b-$MEM-$r.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["proc_read_bytes"] = int(sys.argv[2])
j["texts"] = [json.loads(l)["response"]["body"]["choices"][0]["text"] for l in open(sys.argv[3])]
print(json.dumps(j))
PY
            echo "# round $r, B = $b: $(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); d=j["decode"]; print("%d sweeps (%d decoding), %.2f GB read (/proc: %.2f), decoding %.2f GB for %d tokens in %.1f s" % (j["sweeps"], d["sweeps"], j["bytes_read"]/1e9, j["proc_read_bytes"]/1e9, d["bytes_read"]/1e9, d["generated_tokens"], d["seconds"]))' "$W/r$b-$MEM-$r.json")"
        else
            echo "FAILED: krun batch, B = $b: $(tail -c 400 "$W/err")"
            rc=1
        fi
    done
    [ -n "$LOCK" ] && [ -n "${BENCH_LOCK_ROUND:-}" ] && exec 9>&-
    order=$(echo "$order" | tr ' ' '\n' | tac | tr '\n' ' ')
done
[ "$rc" = 0 ] || exit 1

python3 - "$W" "$RUNS" "$MEM" $SIZES <<'PY'
import json, os, statistics, sys
w, runs, mem, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3], [int(x) for x in sys.argv[4:]]
med = statistics.median
def q(a, b): return a / b if b else float("nan")
def predict(p, B):       # run/session/sweep_model.c, from the plan
    c = p["cost_model"]
    n = c["moe_layers"] * c["n_experts"]
    cached = min(1.0, p["expert_slots"] / n) if n else 0.0
    return (p["trunk_stream_bytes_per_token"] + p["head_stream_bytes_per_token"] +
            n * p["expert_slot_bytes"] * (1 - (1 - c["topk"] / c["n_experts"]) ** B) * (1 - cached))
rows = []
for B in sizes:
    js = [json.load(open(f)) for f in ("%s/r%d-%s-%d.json" % (w, B, mem, r) for r in range(1, runs + 1)) if os.path.exists(f)]
    if not js: continue
    plan = json.load(open("%s/plan%d-%s.json" % (w, B, mem)))
    d = [j["decode"] for j in js]
    bpt = [x["bytes_read"] / x["generated_tokens"] for x in d]
    spt = [x["seconds"] / x["generated_tokens"] for x in d]
    sweep = [x["bytes_read"] / x["sweeps"] for x in d]
    tps = [x["generated_tokens"] / x["sweeps"] for x in d]
    same = len({tuple(j["texts"]) for j in js}) == 1
    rows.append(dict(B=B, sweeps="%d + %d" % (js[0]["sweeps"] - d[0]["sweeps"], d[0]["sweeps"]), tps=med(tps), sweep=med(sweep),
                     pred=predict(plan, B), bpt=med(bpt), bpt_all=med(j["bytes_per_generated_token_all"] for j in js), spt=med(spt),
                     spts=spt, pre_b=med(j["bytes_read"] - j["decode"]["bytes_read"] for j in js),
                     pre_s=med(j["seconds"] - j["decode"]["seconds"] for j in js),
                     store=med(j["bytes_read"] for j in js), proc=med(j["proc_read_bytes"] for j in js), same=same,
                     slots=plan["expert_slots"], pinned=plan["pinned_layers"],
                     state=(med(j.get("state_bytes_read", 0) for j in js), med(j.get("state_bytes_written", 0) for j in js),
                            med(j.get("state_wait_seconds", 0) for j in js)) if plan.get("states_paged") else None))
one = rows[0] if rows[0]["B"] == 1 else None
print("\n| --mem %s, B | sweeps" % mem + " (prompt + decoding) | tokens per decoding sweep | GB per decoding sweep | predicted (union model) | "
      "MB per generated token | vs B = 1 | s per generated token (median; rounds) | vs B = 1 | prompt sweep: GB, s | "
      "all bytes / tokens, MB | GB read: krun, /proc | same text every round |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|")
for x in rows:
    print("| %d | %s | %.1f | %.2f | %.2f (%+.1f%%) | %.0f | %s | %.2f (%s) | %s | %.2f, %.1f | %.0f | %.2f, %.2f | %s |" % (
        x["B"], x["sweeps"], x["tps"], x["sweep"] / 1e9, x["pred"] / 1e9, 100 * (q(x["sweep"], x["pred"]) - 1), x["bpt"] / 1e6,
        "1/%.2f" % q(one["bpt"], x["bpt"]) if one else "-", x["spt"], ", ".join("%.2f" % s for s in x["spts"]),
        "1/%.2f" % q(one["spt"], x["spt"]) if one else "-", x["pre_b"] / 1e9, x["pre_s"], x["bpt_all"] / 1e6,
        x["store"] / 1e9, x["proc"] / 1e9, "yes" if x["same"] else "NO"))
if one:
    for x in rows:
        if x["B"] > 1:
            print("B = %d: bytes per generated token %.3f of B = 1's (predicted %.3f: %.2f / %d over %.2f GB)" % (
                x["B"], q(x["bpt"], one["bpt"]), q(x["pred"] / x["B"], one["pred"]), x["pred"] / 1e9, x["B"], one["pred"] / 1e9))
for x in rows:
    if x["state"]:
        print("B = %d: states paged, %.3f GB read + %.3f GB written (%.1f%% of the run's bytes), the forward waited %.2f s for them" % (
            x["B"], x["state"][0] / 1e9, x["state"][1] / 1e9, 100 * (x["state"][0] + x["state"][1]) / (x["store"] + x["state"][0] + x["state"][1]), x["state"][2]))
print("(plans at this budget: expert cache slots %s, pinned trunk layers %s, for B = %s)" % (
    " / ".join(str(x["slots"]) for x in rows), " / ".join(str(x["pinned"]) for x in rows), " / ".join(str(x["B"]) for x in rows)))
PY
done
done

# every request's text at every B and budget: the same (request i is the same in every input)
python3 - "$W" <<'PY'
import glob, json, sys
texts = {}
for f in sorted(glob.glob(sys.argv[1] + "/r*-*-*.json")):
    for i, t in enumerate(json.load(open(f))["texts"]):
        texts.setdefault(i, set()).add(t)
bad = [i for i, t in texts.items() if len(t) != 1]
print("\nbit-identity: request i's text is %s at every B, budget and round (%d requests, %d runs)" % (
    "the same" if not bad else "DIFFERENT for %d of them" % len(bad), len(texts), len(glob.glob(sys.argv[1] + "/r*-*-*.json"))))
PY
