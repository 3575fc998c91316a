#!/usr/bin/env bash
# The prefix cache on a streaming budget: a multi-turn conversation through krun serve with the
# official openai npm client (tests/node/prefix_chat.mjs: every request sends the whole history
# again, the replies as the server wrote them), three ways, page cache dropped before each:
#   off      --no-cache: every turn prefills its whole prompt
#   ram      the cache in idle session slots (the default)
#   restart  --cache-dir: the server is stopped after turn RESTART_AT, the page cache dropped,
#            a new server started on the same directory: the next turn starts from the file
# Per turn: prompt tokens, positions prefilled (prompt - cached_tokens), seconds (the client's
# wall time) and bytes the server read from storage (/proc/PID/io read_bytes).  ROUNDS rounds,
# the variants' order alternating from round to round; medians over the rounds per turn.
#
# Usage: tests/bench/bench_prefix.sh MODEL.kpk   (root: drops the page cache)
# Env:   MEM (default 4G), TURNS (4), ROUNDS (3), RESTART_AT (2), MAX_TOKENS (4), CHUNK (64),
#        OUT (a directory to keep the per-run JSON in; default a temporary one, deleted)
set -u
cd "$(dirname "$0")/../.." || exit 2
TOP=$PWD
KPK=${1:?usage: bench_prefix.sh MODEL.kpk}
MEM=${MEM:-4G}; TURNS=${TURNS:-4}; ROUNDS=${ROUNDS:-3}; RESTART_AT=${RESTART_AT:-2}
MAX_TOKENS=${MAX_TOKENS:-4}; CHUNK=${CHUNK:-64}
BIN=${BIN:-$TOP/bin}
[ -d "$TOP/tests/node/node_modules/openai" ] || { echo "bench_prefix: npm ci --prefix tests/node first" >&2; exit 2; }
T=$(mktemp -d "$TOP/build/bench_prefix.XXXXXX")
OUT=${OUT:-}
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$T"' EXIT
[ -n "$OUT" ] && mkdir -p "$OUT"

drop() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || echo "# (the page cache could not be dropped: not root)"; }
PID=; PORT=
start() {   # start NAME ARGS...
    local name=$1; shift
    "$BIN/krun" serve "$KPK" --mem "$MEM" --max-seqs 2 --ctx 2048 --chunk "$CHUNK" "$@" --port 0 >"$T/$name.out" 2>"$T/$name.err" &
    PID=$!; PORT=
    for _ in $(seq 6000); do
        PORT=$(sed -n 's/.*listening on http:\/\/.*:\([0-9]*\)$/\1/p; s/.*listening on port \([0-9]*\)$/\1/p' "$T/$name.err")
        [ -n "$PORT" ] && return 0
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "bench_prefix: krun serve did not start: $(tail -3 "$T/$name.err")" >&2
    exit 1
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
    [ -n "$OUT" ] && cp "$conv" "$OUT/"
    python3 - "$conv" "$v" "$r" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
for n, x in enumerate(c["results"], 1):
    u = x["usage"]; cached = u["prompt_tokens_details"]["cached_tokens"]
    print("# round %s %-7s turn %d: prompt %4d, prefilled %4d, %6.1f s, %6.2f GB read" %
          (sys.argv[3], sys.argv[2], n, u["prompt_tokens"], u["prompt_tokens"] - cached, x["seconds"], x["read_bytes"] / 1e9), flush=True)
PY
}

echo "# bench_prefix: $KPK, --mem $MEM --chunk $CHUNK, $TURNS turns of at most $MAX_TOKENS tokens, $ROUNDS rounds (load: $(cut -d' ' -f1-3 /proc/loadavg))"
orders=("off ram restart" "restart ram off")
for r in $(seq "$ROUNDS"); do
    for v in ${orders[$(((r - 1) % 2))]}; do run "$v" "$r"; done
done

python3 - "$T" "$ROUNDS" "$TURNS" <<'PY'
import json, statistics as st, sys
d, rounds, turns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
runs = {v: [json.load(open(f"{d}/{v}.{r}.json"))["results"] for r in range(1, rounds + 1)] for v in ("off", "ram", "restart")}
med = lambda v, n, f: st.median(f(run[n]) for run in runs[v])
ids = {v: [[x["token_ids"] for x in run] for run in runs[v]] for v in runs}
same = all(run == ids["off"][0] for v in ids for run in ids[v])
print("| turn | prompt | prefilled off / ram / restart | s off | s ram | s restart | GB off | GB ram | GB restart |")
print("|---|---|---|---|---|---|---|---|---|")
tot = {v: [0, 0] for v in runs}
for n in range(turns):
    row = [str(n + 1), str(runs["off"][0][n]["usage"]["prompt_tokens"])]
    row.append(" / ".join(str(int(med(v, n, lambda x: x["usage"]["prompt_tokens"] - x["usage"]["prompt_tokens_details"]["cached_tokens"])))
                          for v in runs))
    for k, f in (("s", lambda x: x["seconds"]), ("GB", lambda x: x["read_bytes"] / 1e9)):
        for v in runs:
            m = med(v, n, f)
            row.append("%.1f" % m if k == "s" else "%.2f" % m)
            tot[v][k == "GB"] += m
    print("| " + " | ".join(row) + " |")
print("| all | | | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f |" % (tot["off"][0], tot["ram"][0], tot["restart"][0], tot["off"][1], tot["ram"][1], tot["restart"][1]))
print("# every run's ids identical to the first --no-cache run: %s" % ("yes" if same else "NO"))
sys.exit(0 if same else 1)
PY
