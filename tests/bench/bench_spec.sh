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
# At temperature 0.7 the same prompts, sampled (seed 4: the text stays in
# the cycle; seed 3: it leaves the cycle after 9 tokens, so drafts are
# rejected and the rest is text without repetition).  The slice is made
# with --logit-gain 4 (lm_head 4x: a peaked next-token distribution, as a
# trained model's on repetitive text; the greedy text is that of gain 1, as
# the argmax of 4x the logits is the same token).
#
# Then krun serve (BENCH_SPEC_SERVE=0 skips it): 4 concurrent requests at
# temperature 0.7, two on the repeating prompt (seeds 4 and 3) and two
# without repetition, on a server with --spec 0 and one with --spec 8 (the
# default), the first split, page cache dropped before each server: sweeps,
# bytes (the server's /health) and wall seconds per generated token, and the
# ids of every request compared.
#
# Env: BENCH_SPEC_CLI=0 (only the server run), BENCH_SPEC_SPLITS ("min streamed", the default, or one of them), BENCH_DIR, BENCH_KEEP=1, BENCH_RUNS (default 3), BENCH_GEN (default
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
    "$BIN/k3synth" "$W/spec" --geometry slice --layers 2 --experts 64 --topk 4 --vocab 512 --first-dense 0 --seed "$SEED" \
        --logit-gain 4 --quiet &&
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
[ "${BENCH_SPEC_CLI:-1}" != 0 ] && for SPLIT in "${SPLITS[@]}"; do
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
    # temperature 0.7
    cli trep0 "$REPEAT" --spec 0 --temp 0.7 --seed 4
    cli trep8 "$REPEAT" --spec 8 --temp 0.7 --seed 4
    cli tdep0 "$REPEAT" --spec 0 --temp 0.7 --seed 3
    cli tdep8 "$REPEAT" --spec 8 --temp 0.7 --seed 3
    cli tnorep0 "$NOREP" --spec 0 --temp 0.7 --seed 4
    cli tnorep8 "$NOREP" --spec 8 --temp 0.7 --seed 4
done
python3 - "$W" "$RUNS" <<'PY'
import json, os, statistics, sys
w, runs = sys.argv[1], int(sys.argv[2])
# (key, label, the --spec 0 run it is compared with)
rows = [("rep0", "repeating text (a cycle), --spec 0", "rep0"), ("rep8", "repeating text (a cycle), --spec 8", "rep0"),
        ("norep0", "no repetition, --spec 0", "norep0"), ("norep8", "no repetition, --spec 8", "norep0"),
        ("true8", "no repetition, drafts that come true (bound)", "norep0"),
        ("miss8", "the same, every 4th draft wrong", "norep0"),
        ("trep0", "temp 0.7 seed 4, repeating, --spec 0", "trep0"), ("trep8", "temp 0.7 seed 4, repeating, --spec 8", "trep0"),
        ("tdep0", "temp 0.7 seed 3, leaves the cycle, --spec 0", "tdep0"),
        ("tdep8", "temp 0.7 seed 3, leaves the cycle, --spec 8", "tdep0"),
        ("tnorep0", "temp 0.7, no repetition, --spec 0", "tnorep0"), ("tnorep8", "temp 0.7, no repetition, --spec 8", "tnorep0")]
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
    same = ""
    if key.endswith("8") and ref != key and ref in base and key not in ("true8", "miss8"):
        js0 = [json.load(open(f"{w}/{ref}.{r}.json")) for r in range(1, runs + 1) if os.path.exists(f"{w}/{ref}.{r}.json")]
        same = "  ids == --spec 0" if all(j["generated_ids"] == js0[0]["generated_ids"] for j in js + js0) else "  IDS DIFFER"
    print("%-46s %7d %8d %9d %12.3f %10.2f   (x%.2f bytes, x%.2f time vs --spec 0)%s" % (
        label, d[0]["sweeps"], s["drafted"], s["accepted"], gb, sec, gb / b[0], sec / b[1], same))
PY
done

# ---- krun serve: 4 concurrent requests at temperature 0.7, two repeating --------------------------
if [ "${BENCH_SPEC_SERVE:-1}" != 0 ]; then
SPLIT=${SPLITS[0]}
export PYTHONPATH="$PWD/tests/cli${PYTHONPATH:+:$PYTHONPATH}"
echo
echo "== krun serve $SPLIT --max-seqs 4: 4 concurrent requests of $GEN tokens at temperature 0.7 (2 repeating)"
: >"$W/serve.jsonl"
for r in $(seq 1 "$RUNS"); do
    if [ $((r % 2)) -eq 1 ]; then order="0 8"; else order="8 0"; fi
    for sp in $order; do
        drop
        bench_serve_start "$W/serve.err" "$BIN/krun" serve "$W/spec.kpk" $SPLIT --max-seqs 4 --ctx $((8 + LEAD + GEN + 8)) --spec "$sp" --port 0
        if [ -z "$port" ]; then echo "FAILED: the server did not start: $(head -c 300 "$W/serve.err")"; rc=1; kill $pid 2>/dev/null; wait $pid; continue; fi
        python3 - "$port" "$sp" "$r" "$GEN" "$REPEAT" "$NOREP" >>"$W/serve.jsonl" <<'PY' || { echo "FAILED: serve --spec $sp"; rc=1; }
import json, sys, threading, time, serve_client as c
port, sp, rnd, gen = (int(x) for x in sys.argv[1:5])
rep, norep = ([int(x) for x in a.split(",")] for a in sys.argv[5:7])
reqs = [(rep, 4), (rep, 3), (norep, 4), (norep[8:] + norep[:8], 5)]
h0 = c.health(port)
res = [None] * len(reqs)
go = threading.Barrier(len(reqs) + 1)
took = [None] * len(reqs)
def one(i):
    go.wait()
    p, seed = reqs[i]
    t = time.time()
    res[i] = c.post(port, "/v1/completions", {"prompt": p, "max_tokens": gen, "temperature": 0.7, "seed": seed, "ignore_eos": True,
                                              "return_token_ids": True})
    took[i] = time.time() - t
ts = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
for t in ts: t.start()
go.wait()
t0 = time.time()
for t in ts: t.join()
wall = time.time() - t0
h1 = c.health(port)
assert all(x[0] == 200 for x in res), res
d = lambda k: h1["stats"][k] - h0["stats"][k]
sp1, sp0 = h1["stats"]["speculation"], h0["stats"]["speculation"]
print(json.dumps({"round": rnd, "spec": sp, "wall": wall, "tokens": d("generated_tokens"), "bytes": d("bytes_read"), "sweeps": d("sweeps"),
                  "drafted": sp1["drafted"] - sp0["drafted"], "accepted": sp1["accepted"] - sp0["accepted"],
                  "took": took, "ids": [x[2]["choices"][0]["token_ids"] for x in res]}))
PY
        kill -TERM $pid; wait $pid
    done
done
python3 - "$W/serve.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {0: [r for r in rows if r["spec"] == 0], 8: [r for r in rows if r["spec"] == 8]}
if not by[0] or not by[8]: sys.exit("missing runs")
same = all(r["ids"] == by[0][0]["ids"] for r in rows)
print("| server | sweeps | drafted | accepted | GB / token | s / token | vs --spec 0 |")
print("|---|---:|---:|---:|---:|---:|---|")
base = None
for sp in (0, 8):
    rs = by[sp]
    gb = statistics.median(r["bytes"] / r["tokens"] for r in rs) / 1e9
    sec = statistics.median(r["wall"] / r["tokens"] for r in rs)
    if base is None: base = (gb, sec)
    print("| --spec %d | %d | %d | %d | %.3f | %.3f | %s |" % (sp, statistics.median(r["sweeps"] for r in rs), rs[0]["drafted"],
          rs[0]["accepted"], gb, sec, "" if sp == 0 else "%.2fx bytes, %.2fx time" % (gb / base[0], sec / base[1])))
print("every request's ids identical with and without speculation: %s (%d tokens a run)" % ("yes" if same else "NO", rows[0]["tokens"]))
for sp in (0, 8):
    took = [statistics.median(r["took"][i] for r in by[sp]) for i in range(4)]
    print("--spec %d: seconds until each reply (repeating seed 4, repeating seed 3, no repetition, no repetition): %s"
          % (sp, ", ".join("%.1f" % t for t in took)))
PY
fi
[ -n "${BENCH_KEEP:-}" ] || rm -f "$W/spec.kpk"
exit $rc
