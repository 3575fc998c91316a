#!/usr/bin/env bash
# krun serve and krun chat on a full-width slice at its minimum (streaming) budget, page cache
# dropped before every run (make bench; BENCH_ONLY=serve).  Prints figures and ratios; never
# fails on a time.
#
# 1. Batching: B = 1, 2, 4, 8 concurrent completion requests (4-token prompts, BENCH_SERVE_GEN
#    tokens each, greedy, ignore_eos) on one server (--max-seqs 8); aggregate tokens/s (all
#    generated tokens / wall time from the first request to the last reply) and bytes read per
#    generated token (the server's /health counters).  A fresh server per run, warmed with one
#    1-token request (the resident parts are read once per process); runs alternate the order
#    of B; medians of BENCH_RUNS.  Two memory configurations: the minimum budget (the trunk
#    streamed, 4 expert slots), and the trunk streamed with 64 expert slots (one layer's).
# 2. krun chat, turn two: the conversation kept (turn two runs only its new tokens) against
#    re-sending it whole (the same text as one message after /reset, in the same warm process).
#
# Env: BENCH_DIR (work directory; the slice is kept there with BENCH_KEEP=1), BENCH_RUNS (3),
#      BENCH_SERVE_GEN (8), BENCH_SETTLE (seconds after a cache drop, 3), BENCH_SERVE_SYNTH (the
#      k3synth geometry options; e.g. "--geometry tiny" to try the script in seconds).
set -u
cd "$(dirname "$0")/../.."
TOP=$PWD
BIN=${BIN:-bin}
W=${BENCH_DIR:-$(mktemp -d "$TOP/build/bench-serve.XXXXXX")}
RUNS=${BENCH_RUNS:-3}
GEN=${BENCH_SERVE_GEN:-8}
mkdir -p "$W"
export PYTHONPATH="$TOP/tests/cli${PYTHONPATH:+:$PYTHONPATH}"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(cannot drop the page cache: not root?)" >&2; sleep "${BENCH_SETTLE:-3}"; }

if [ ! -f "$W/slice.kpk" ]; then
    "$BIN/k3synth" "$W/slice" ${BENCH_SERVE_SYNTH:---geometry slice --layers 4 --experts 64 --topk 4 --vocab 32768} --seed 3 --quiet || exit 2
    "$BIN/kpack" convert "$W/slice" "$W/slice.kpk" --quiet || exit 2
    rm -rf "$W/slice"
fi
ls -l "$W/slice.kpk" | awk -v g="${BENCH_SERVE_SYNTH:---geometry slice --layers 4 --experts 64 --topk 4 --vocab 32768}" '{printf "slice.kpk: %.2f GB (k3synth %s)\n", $5/1e9, g}'
"$BIN/krun" "$W/slice.kpk" --plan --mem 64G --ctx 64 --max-seqs 8 --spec 8 --json "$W/plan.json" >/dev/null || exit 2
MIN=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["minimum_bytes"])' "$W/plan.json")
echo "minimum budget with 8 sequences of 64 positions: $MIN bytes"

# ---- 1. batching ---------------------------------------------------------------------------------
# batching LABEL SERVE-ARGS...: the table for one memory configuration
batching() {
    local label=$1; shift
    echo
    echo "== krun serve $* --max-seqs 8 --ctx 64 --io direct ($label): B concurrent requests of $GEN tokens"
    : >"$W/serve.jsonl"
    for round in $(seq "$RUNS"); do
        if [ $((round % 2)) -eq 1 ]; then order="1 2 4 8"; else order="8 4 2 1"; fi
        for B in $order; do
            drop
            bench_serve_start "$W/serve.err" "$BIN/krun" serve "$W/slice.kpk" "$@" --max-seqs 8 --ctx 64 --io direct --port 0 --quiet
            if [ -z "$port" ]; then echo "server did not start: $(head -c 300 "$W/serve.err")"; kill $pid 2>/dev/null; wait $pid; continue; fi
            python3 - "$port" "$B" "$GEN" "$round" >>"$W/serve.jsonl" <<'PY' || echo "run B=$B failed"
import json, sys, threading, time, serve_client as c
port, B, gen, rnd = (int(x) for x in sys.argv[1:5])
s, _, j = c.post(port, "/v1/completions", {"prompt": [11, 12, 13, 14], "max_tokens": 1, "temperature": 0})   # warm-up
assert s == 200, j
h0 = c.health(port)
res = [None] * B
go = threading.Barrier(B + 1)
def one(i):
    go.wait()
    res[i] = c.post(port, "/v1/completions", {"prompt": [100 + 7 * i, 200 + i, 31 * i + 5, 17], "max_tokens": gen,
                                              "temperature": 0, "ignore_eos": True})
ts = [threading.Thread(target=one, args=(i,)) for i in range(B)]
for t in ts: t.start()
go.wait()
t0 = time.time()
for t in ts: t.join()
wall = time.time() - t0
h1 = c.health(port)
assert all(r[0] == 200 and r[2]["usage"]["completion_tokens"] == gen for r in res), res
d = lambda k: h1["stats"][k] - h0["stats"][k]
print(json.dumps({"round": rnd, "B": B, "wall": wall, "tokens": d("generated_tokens"), "bytes": d("bytes_read"), "sweeps": d("sweeps"),
                  "sweep_seconds": d("sweep_seconds")}))
PY
            kill -TERM $pid; wait $pid
        done
    done
    python3 - "$W/serve.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows: by.setdefault(r["B"], []).append(r)
if 1 not in by: sys.exit("no B=1 runs")
base = statistics.median(r["tokens"] / r["wall"] for r in by[1])
print("| concurrent requests | aggregate tokens/s (median) | vs one | bytes read per generated token | sweeps | s per sweep | runs (tokens/s) |")
print("|---:|---:|---:|---:|---:|---:|---|")
for B in sorted(by):
    rs = by[B]
    tps = statistics.median(r["tokens"] / r["wall"] for r in rs)
    bpt = statistics.median(r["bytes"] / r["tokens"] for r in rs)
    sw = statistics.median(r["sweeps"] for r in rs)
    sps = statistics.median(r["sweep_seconds"] / r["sweeps"] for r in rs)
    print("| %d | %.3f | %.2fx | %.2f GB | %d | %.2f | %s |" % (B, tps, tps / base, bpt / 1e9, sw, sps,
                                                              ", ".join("%.3f" % (r["tokens"] / r["wall"]) for r in rs)))
PY
}
batching "the minimum budget: 4 expert slots, a sweep's experts are read 4 at a time" --mem "$MIN"
# the trunk still streamed (--pin 0), with room for one layer's 64 experts
"$BIN/krun" "$W/slice.kpk" --plan --mem 64G --pin 0 --expert-slots 64 --ctx 64 --max-seqs 8 --spec 8 --json "$W/plan64.json" >/dev/null || exit 2
MEM64=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["total_bytes"])' "$W/plan64.json")
batching "the trunk streamed, 64 expert slots" --mem "$MEM64" --pin 0 --expert-slots 64

# ---- 2. krun chat: turn two with the conversation kept, against re-sending it ------------------------------
echo
"$BIN/krun" "$W/slice.kpk" --plan --mem 64G --ctx 2048 --json "$W/plan1.json" >/dev/null || exit 2
CMIN=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["minimum_bytes"])' "$W/plan1.json")
echo "== krun chat --mem $CMIN --ctx 2048 (its minimum): turn two kept vs re-sent (in the chat format: a turn feeds its own rendering, the previous reply's close, the message and the reply prompt)"
python3 - "$W" <<'PY'
import random, sys
random.seed(5)
words = "the a of to and in is was for on that with as by at from it an be this which or are have had not but".split()
text = lambda n: " ".join(random.choice(words) for _ in range(n))
open(sys.argv[1] + "/turn1.txt", "w").write(text(150))
open(sys.argv[1] + "/turn2.txt", "w").write(" " + text(10))
PY
T1=$("$BIN/krun" tokenize "$W/slice.kpk" --file "$W/turn1.txt" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["count"])')
T2=$("$BIN/krun" tokenize "$W/slice.kpk" --file "$W/turn2.txt" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["count"])')
echo "turn one: $T1 tokens of text, 4 generated; turn two: $T2 tokens, 4 generated"
: >"$W/chat.jsonl"
for round in $(seq "$RUNS"); do
    for how in kept resent; do
        drop
        if [ $how = kept ]; then
            { tr '\n' ' ' <"$W/turn1.txt"; echo; tr '\n' ' ' <"$W/turn2.txt"; echo; } >"$W/in.txt"
            "$BIN/krun" chat "$W/slice.kpk" --mem "$CMIN" --ctx 2048 --gen 4 --json "$W/c.jsonl" --quiet <"$W/in.txt" >"$W/c.out" 2>"$W/c.err" || { echo "chat failed: $(head -c 300 "$W/c.err")"; continue; }
            python3 -c 'import json,sys; t=[json.loads(l) for l in open(sys.argv[1])]; x=t[1]; print(json.dumps({"how": "kept", "round": int(sys.argv[2]), "fed": len(x["fed_ids"]), "prefill_seconds": x["prefill_seconds"], "bytes": x["prefill_bytes_read"], "reply_seconds": x["reply_seconds"]}))' \
                "$W/c.jsonl" "$round" >>"$W/chat.jsonl"
            # the whole conversation as text, for the re-sent run: turn one, the reply, turn two
            python3 -c 'import json,sys; t=[json.loads(l) for l in open(sys.argv[1])]; print(",".join(map(str, t[0]["reply_ids"])))' "$W/c.jsonl" >"$W/reply1.ids"
            "$BIN/krun" tokenize "$W/slice.kpk" --decode "$(cat "$W/reply1.ids")" >"$W/reply1.txt"
        else
            { echo "warm up"; echo "/reset"; { cat "$W/turn1.txt" "$W/reply1.txt" "$W/turn2.txt"; } | tr '\n' ' '; echo; } >"$W/in.txt"
            "$BIN/krun" chat "$W/slice.kpk" --mem "$CMIN" --ctx 2048 --gen 4 --json "$W/c.jsonl" --quiet <"$W/in.txt" >"$W/c.out" 2>"$W/c.err" || { echo "chat failed: $(head -c 300 "$W/c.err")"; continue; }
            python3 -c 'import json,sys; t=[json.loads(l) for l in open(sys.argv[1])]; x=t[1]; print(json.dumps({"how": "resent", "round": int(sys.argv[2]), "fed": len(x["fed_ids"]), "prefill_seconds": x["prefill_seconds"], "bytes": x["prefill_bytes_read"], "reply_seconds": x["reply_seconds"]}))' \
                "$W/c.jsonl" "$round" >>"$W/chat.jsonl"
        fi
    done
done
python3 - "$W/chat.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| turn two | positions run | prefill s (median) | bytes read by the prefill | reply s (4 tokens) | runs (prefill s) |")
print("|---|---:|---:|---:|---:|---|")
for how, label in (("kept", "kept state (krun chat, second message)"), ("resent", "re-sent whole (one message after /reset)")):
    rs = [r for r in rows if r["how"] == how]
    if not rs: continue
    print("| %s | %d | %.1f | %.2f GB | %.1f | %s |" % (label, rs[0]["fed"], statistics.median(r["prefill_seconds"] for r in rs),
          statistics.median(r["bytes"] for r in rs) / 1e9, statistics.median(r["reply_seconds"] for r in rs),
          ", ".join("%.1f" % r["prefill_seconds"] for r in rs)))
PY
[ -n "${BENCH_KEEP:-}" ] || rm -rf "$W"
