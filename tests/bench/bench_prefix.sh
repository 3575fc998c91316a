#!/usr/bin/env bash
# The prefix cache on a streaming budget: a multi-turn conversation through krun serve with the
# official openai npm client (tests/node/prefix_chat.mjs: every request sends the whole history
# again, the replies as the server wrote them), three ways, page cache dropped before each server
# start:
#   off      --no-cache: every turn prefills its whole prompt
#   ram      the cache in idle session slots (the default)
#   restart  --cache-dir: the server is stopped after turn RESTART_AT, the page cache dropped,
#            a new server started on the same directory: the next turn starts from the file
# Per turn: prompt tokens, the turn's new tokens (the prompt less its longest common prefix with
# the previous prompt + reply ids: what a perfect cache leaves to run), positions prefilled
# (prompt - cached_tokens) and re-read positions (prefilled - new: 0 when the turn starts where the
# previous one ended), seconds (the client's wall time) and bytes the server read from storage
# (/proc/PID/io read_bytes).  ROUNDS rounds, the variants' order alternating from round to round;
# medians over the rounds per turn.
#
# Usage: tests/bench/bench_prefix.sh MODEL.kpk   (root: drops the page cache)
# Env:   MEM (default 4G), TURNS (6), ROUNDS (1), RESTART_AT (3), MAX_TOKENS (4), CHUNK (auto),
#        VARIANTS ("off ram restart"), BENCH_LOCK (a file: each variant's run, its page-cache
#        drops and servers, holds flock on it, so benchmarks sharing a disk never overlap),
#        OUT (a directory to keep the per-run JSON in; default a temporary one, deleted)
set -u
cd "$(dirname "$0")/../.." || exit 2
TOP=$PWD
KPK=${1:?usage: bench_prefix.sh MODEL.kpk}
MEM=${MEM:-4G}; TURNS=${TURNS:-6}; ROUNDS=${ROUNDS:-1}; RESTART_AT=${RESTART_AT:-3}
MAX_TOKENS=${MAX_TOKENS:-4}; CHUNK=${CHUNK:-auto}; VARIANTS=${VARIANTS:-off ram restart}
BENCH_SETTLE=${BENCH_SETTLE:-3}
lock() { [ -n "${BENCH_LOCK:-}" ] || return 0; exec 9>>"$BENCH_LOCK" && flock 9; }
unlock() { [ -n "${BENCH_LOCK:-}" ] || return 0; exec 9>&-; }
lock                           # bench_lib.sh drops the page cache to see whether it can
. tests/bench/bench_lib.sh     # drop (CAN_DROP, SETTLE), bench_serve_start
unlock
SETTLE=$BENCH_SETTLE
BIN=${BIN:-$TOP/bin}
[ -d "$TOP/tests/node/node_modules/openai" ] || { echo "bench_prefix: npm ci --prefix tests/node first" >&2; exit 2; }
T=$(mktemp -d "$TOP/build/bench_prefix.XXXXXX")
OUT=${OUT:-}
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$T"' EXIT
[ -n "$OUT" ] && mkdir -p "$OUT"

[ "$CAN_DROP" = 1 ] || echo "# (the page cache could not be dropped: not root; every figure is with a warm cache)"
PID=; PORT=
start() {   # start NAME ARGS...: a server on the pool (the lock's descriptor not inherited)
    local name=$1; shift
    local pid port
    bench_serve_start "$T/$name.err" "$BIN/krun" serve "$KPK" --mem "$MEM" --max-seqs 2 --ctx 2048 --chunk "$CHUNK" "$@" --port 0 9>&- || {
        echo "bench_prefix: krun serve did not start: $(tail -3 "$T/$name.err")" >&2
        exit 1
    }
    PID=$pid; PORT=$port
}
stop() { kill -TERM "$PID"; wait "$PID"; }
chat() {    # chat CONV TURNS
    PREFIX_TIMEOUT_S=7200 KRUN_PID=$PID node "$TOP/tests/node/prefix_chat.mjs" "http://127.0.0.1:$PORT/v1" "$(basename "$KPK" .kpk)" "$1" "$2" || { echo "bench_prefix: the client failed" >&2; exit 1; }
}

python3 - "$T/conv" "$TURNS" "$MAX_TOKENS" <<'PY'
import json, sys
users = ["Hello, who are you?", "What is the capital of France, and why is it famous?", "And what about Italy and Rome?",
         "Which of the two cities is larger, and by how much?", "Name a river that flows through each of them.",
         "Thanks. Summarize what we said in one sentence."]
json.dump({"system": "You are a terse assistant. Answer every question in one short sentence.",
           "users": users[: int(sys.argv[2])],
           "params": {"max_tokens": int(sys.argv[3]), "temperature": 0, "reasoning_effort": "none"}}, open(sys.argv[1], "w"))
PY

run() {     # run VARIANT ROUND
    local v=$1 r=$2 conv="$T/$1.$2.json"
    cp "$T/conv" "$conv"
    lock
    drop
    case $v in
        off) start "$v$r" --no-cache; chat "$conv" "$TURNS"; stop ;;
        ram) start "$v$r"; chat "$conv" "$TURNS"; stop ;;
        restart)
            rm -rf "$T/dir"
            start "$v$r" --cache-dir "$T/dir"; chat "$conv" "$RESTART_AT"; stop
            drop
            start "$v$r.b" --cache-dir "$T/dir"; chat "$conv" $((TURNS - RESTART_AT)); stop
            rm -rf "$T/dir" ;;
    esac
    unlock
    [ -n "$OUT" ] && cp "$conv" "$OUT/"
    PYTHONPATH="$TOP/tests/cli" python3 - "$conv" "$v" "$r" <<'PY'
import json, sys, prefix_check as pc
c = json.load(open(sys.argv[1]))["results"]
rr = pc.reread(c)
for n, x in enumerate(c, 1):
    u = x["usage"]; cached = u["prompt_tokens_details"]["cached_tokens"]
    print("# round %s %-7s turn %d: prompt %4d, prefilled %4d (re-read %d), %6.1f s, %6.2f GB read" %
          (sys.argv[3], sys.argv[2], n, u["prompt_tokens"], u["prompt_tokens"] - cached, rr[n - 1], x["seconds"], x["read_bytes"] / 1e9), flush=True)
PY
}

echo "# bench_prefix: $KPK, --mem $MEM --max-seqs 2 --ctx 2048 --chunk $CHUNK, $TURNS turns of at most $MAX_TOKENS tokens, thinking off, $ROUNDS rounds of $VARIANTS (load: $(cut -d' ' -f1-3 /proc/loadavg))"
order=$VARIANTS
for r in $(seq "$ROUNDS"); do
    for v in $order; do run "$v" "$r"; done
    order=$(echo "$order" | tr ' ' '\n' | tac | tr '\n' ' ')
done

PYTHONPATH="$TOP/tests/cli" python3 - "$T" "$ROUNDS" "$TURNS" $VARIANTS <<'PY'
import json, statistics as st, sys, prefix_check as pc
d, rounds, turns, vs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
runs = {v: [json.load(open(f"{d}/{v}.{r}.json"))["results"] for r in range(1, rounds + 1)] for v in vs}
med = lambda v, n, f: st.median(f(run[n]) for run in runs[v])
ids = {v: [[(x["prompt_ids"], x["token_ids"]) for x in run] for run in runs[v]] for v in vs}
first = ids[vs[0]][0]
same = all(run == first for v in vs for run in ids[v])
ref = runs[vs[0]][0]
# a turn's new tokens: its prompt less the longest prefix some earlier request had run
# (prompt + reply but its last, sampled token): what a perfect cache leaves to prefill
new = [len(x["prompt_ids"]) - max([pc.lcp(x["prompt_ids"], q["prompt_ids"] + q["token_ids"][:-1]) for q in ref[:n]] + [0])
       for n, x in enumerate(ref)]
rr = {v: [max(pc.reread(run)[n] for run in runs[v]) for n in range(turns)] for v in vs}
pre = lambda x: x["usage"]["prompt_tokens"] - x["usage"]["prompt_tokens_details"]["cached_tokens"]
print("| turn | prompt | new tokens | prefilled: %s | re-read: %s | %s | %s |" % (" / ".join(vs), " / ".join(vs),
      " | ".join("s " + v for v in vs), " | ".join("GB " + v for v in vs)))
print("|---:|---:|---:|---|---|" + "---:|" * (2 * len(vs)))
tot = {v: [0, 0, 0] for v in vs}
for n in range(turns):
    row = [str(n + 1), str(ref[n]["usage"]["prompt_tokens"]), str(new[n])]
    row.append(" / ".join(str(int(med(v, n, pre))) for v in vs))
    row.append(" / ".join(str(rr[v][n]) for v in vs))
    for v in vs: tot[v][2] += med(v, n, pre)
    for k, f in (("s", lambda x: x["seconds"]), ("GB", lambda x: x["read_bytes"] / 1e9)):
        for v in vs:
            m = med(v, n, f)
            row.append("%.1f" % m if k == "s" else "%.2f" % m)
            tot[v][k == "GB"] += m
    print("| " + " | ".join(row) + " |")
print("| all | | %d | %s | | %s | %s |" % (sum(new), " / ".join("%d" % tot[v][2] for v in vs), " | ".join("%.1f" % tot[v][0] for v in vs),
      " | ".join("%.2f" % tot[v][1] for v in vs)))
for v in vs[1:]:
    print("# %s vs %s: %.2fx the bytes, %.2fx the seconds, %.2fx the positions prefilled" %
          (v, vs[0], tot[v][1] / tot[vs[0]][1], tot[v][0] / tot[vs[0]][0], tot[v][2] / tot[vs[0]][2]))
print("# every run's prompt and generated ids identical to the first %s run: %s" % (vs[0], "yes" if same else "NO"))
sys.exit(0 if same else 1)
PY
