#!/usr/bin/env bash
# The EAGLE drafter, measured (make bench; BENCH_ONLY=draft; issue 30 point 7, docs/DRAFTER.md
# "Measured").  Prints figures and ratios, never fails on a time.  Three parts (BENCH_DRAFT_PARTS):
#
# pool  Bytes per verification pass against its width, on a release-geometry expert pool (896
#       experts top-16: BENCH_DRAFT_KPK, else BENCH_BATCH_KPK; skipped without; how to make one:
#       tests/bench/bench_batch.sh's header).  A synthetic drafter for it is made here (k3synth
#       --drafter --target on the pool's own config.json, kpack convert; ~4.7 GB in BENCH_DIR) or
#       given (BENCH_DRAFT_POOL_DRAFTER).  krun streams the trunk (--pin 0) at --mem 5G with
#       --draft-width fixed at each width (lm_head streamed and 16 expert slots in every run, so the
#       runs differ only in their rows); the random drafter is almost never right, so every pass
#       has width + 1 rows and yields one token.  Per pass (the --json steps, page cache dropped
#       before every run): trunk, lm_head and expert bytes, the experts read against the union
#       model's N (1 - (1 - k/N)^rows) (draft.h kdraft_pass_bytes; the expert cache's few hits
#       aside), and the pass's bytes relative to a pass of one row.
# pair  The trained small pair (tests/train/make_pair.sh, t30r: a 12-layer k3synth target whose
#       output head is refitted to text, and an EAGLE-3.1 drafter trained on its own
#       continuations; needs python3-torch; BENCH_DRAFT_PAIR: a directory it made, else made here
#       with --quick unless BENCH_DRAFT_PAIR_FULL=1).  Prompts: held-out text (licences the pair
#       did not train on), as bytes.  Each prompt is run with --draft off --spec 0 and with the
#       drafter, streamed at the planner's minimum budget with nothing pinned and 8 expert slots
#       (the minimum budget's cache would hold this tiny pool's every expert), page cache
#       dropped before every run, rounds alternating; reported: tokens per pass, acceptance per
#       depth, bytes per generated token with and without, and the ratio against the one the
#       acceptance predicts (the union model at this target's geometry); the ids must be equal.
# plan  The full-scale projection: tests/bench/draft_table.sh on the sparse full-size virtual K3
#       (KPK_VIRTUAL, else made here: k3synth --virtual + kpack convert, almost no disk) and the
#       full-size virtual drafter (made here), at the published acceptance and at the pair's.
#
# Env: BENCH_DRAFT_PARTS ("pool pair plan"), BENCH_DRAFT_WIDTHS ("0 1 2 3 5 8"), BENCH_RUNS (3),
#      BENCH_SETTLE (3), BENCH_LOCK (flock file around each run and its drop), BENCH_DIR, BENCH_KEEP.
#      BENCH_DRAFT_PAIR_OPTS: krun options for the pair's runs, e.g. "--temp 0.7 --seed 3"
#      (greedy, the full pair's target falls into a loop of one byte that prompt-lookup drafts
#      take; sampled text measures the drafter).
set -eu
cd "$(dirname "$0")/../.."
. tests/bench/bench_lib.sh
bench_init draft
RUNS=${BENCH_RUNS:-3}
PARTS=" ${BENCH_DRAFT_PARTS:-pool pair plan} "
PY=/usr/bin/python3
LOCKED=(env)
[ -n "${BENCH_LOCK:-}" ] && LOCKED=(flock "$BENCH_LOCK")
cleanup() { [ -z "${BENCH_DIR:-}" ] && [ -z "${BENCH_KEEP:-}" ] && rm -rf "$W"; return 0; }
trap cleanup EXIT
machine
echo "(bytes are exact: krun's store counters; seconds are indicative on a shared machine)"
AM=    # the pair's measured acceptance per depth, for the projection

# dropped_run OUT.json ARGS...: krun after a page-cache drop, under the lock
dropped_run() {
    local out=$1; shift
    "${LOCKED[@]}" bash -c 'sync; [ "$0" = 1 ] && echo 3 > /proc/sys/vm/drop_caches; sleep "$1"; shift; exec "$@"' \
        "$CAN_DROP" "$SETTLE" "$BIN/krun" "$@" --json "$out" >/dev/null 2>"$W/err.tmp" \
        || { echo "FAILED: krun $*: $(tail -c 400 "$W/err.tmp")"; return 1; }
}

# ---------------------------------------------------------------------------------------------- pool
if [[ "$PARTS" == *" pool "* ]]; then
    echo
    echo "## Bytes per verification pass against its width: a release-geometry pool"
    POOL=${BENCH_DRAFT_KPK:-${BENCH_BATCH_KPK:-}}
    if [ -z "$POOL" ] || [ ! -f "$POOL" ]; then
        echo "skipped: no release-geometry pool (BENCH_DRAFT_KPK or BENCH_BATCH_KPK)"
    else
        PD=${BENCH_DRAFT_POOL_DRAFTER:-}
        if [ -z "$PD" ]; then
            PD="$W/pool.draft.kpk"
            if [ ! -f "$PD" ]; then
                rm -rf "$W/poolcfg" "$W/pooldraft"
                "$BIN/kpack" export "$POOL" "$W/poolcfg" --only config.json --quiet
                "$BIN/k3synth" "$W/pooldraft" --drafter --target "$W/poolcfg" --quiet
                "$BIN/kpack" convert "$W/pooldraft" "$PD" --quiet
                rm -rf "$W/pooldraft"
            fi
        fi
        for r in $(seq "$RUNS"); do
            for w in ${BENCH_DRAFT_WIDTHS:-0 1 2 3 5 8}; do
                o="$W/pool-w$w-r$r.json"
                [ -f "$o" ] && continue
                if [ "$w" = 0 ]; then d=(--draft off --spec 0); else d=(--draft "$PD" --draft-width "$w"); fi
                dropped_run "$o" "$POOL" --ids 11,22,33,44,55,66,77,88 --gen $((4 + w)) --ignore-eos --quiet \
                    --mem 5G --pin 0 --head stream --expert-slots 16 "${d[@]}" || FAILED=1
            done
        done
        "$PY" - "$W" <<'PY'
import glob, json, os, statistics as st, sys
w = sys.argv[1]
by = {}                                        # rows -> [(trunk, head, experts, misses, seconds)]
plan = None
for f in sorted(glob.glob(os.path.join(w, "pool-w*-r*.json"))):
    j = json.load(open(f))
    plan = plan or j["plan"]
    for s in j["steps"]:
        rows = s.get("drafted", 0) + 1
        by.setdefault(rows, []).append((s["bytes_trunk"], s["bytes_head"], s["bytes_experts"], s["expert_misses"], s["seconds"]))
c = plan["cost_model"]
N, k, e = c["n_experts"], c["topk"], c["expert_bytes"]
print("pool: %d MoE layer(s) of %d experts top-%d, %.1f MB an expert; --mem 5G, trunk streamed (%.2f GB), lm_head streamed (%.2f GB), %d expert slots"
      % (c["moe_layers"], N, k, e / 1e6, plan["trunk_stream_bytes_per_token"] / 1e9, plan["head_stream_bytes_per_token"] / 1e9, plan["expert_slots"]))
print()
print("| rows a pass (drafts + 1) | passes | GB a pass (median) | experts read a pass | union model | vs 1 row | s a pass (median) |")
print("|---:|---:|---:|---:|---:|---:|---:|")
one = None
for rows in sorted(by):
    v = by[rows]
    tot = st.median(a + b + x for a, b, x, _, _ in v)
    one = one or (tot if rows == 1 else None)
    pred = c["moe_layers"] * N * (1 - (1 - k / N) ** rows)
    print("| %d | %d | %.2f | %.1f | %.1f | %s | %.1f |" % (rows, len(v), tot / 1e9, st.median(x / e for _, _, x, _, _ in v), pred,
          "%.3fx" % (tot / one) if one else "-", st.median(s for *_, s in v)))
PY
    fi
fi

# ---------------------------------------------------------------------------------------------- pair
if [[ "$PARTS" == *" pair "* ]]; then
    echo
    echo "## The trained small pair: tokens per pass and bytes per generated token, with and without"
    PAIR=${BENCH_DRAFT_PAIR:-}
    if [ -z "$PAIR" ]; then
        if [ ! -x tests/train/make_pair.sh ]; then
            echo "skipped: tests/train/make_pair.sh is absent"
        elif ! "$PY" -c 'import torch' 2>/dev/null; then
            echo "skipped: no python3-torch (apt-get install python3-torch)"
        else
            PAIR="$W/pair"
            [ -f "$PAIR/TARGET.kpk" ] || tests/train/make_pair.sh "$PAIR" $([ -n "${BENCH_DRAFT_PAIR_FULL:-}" ] || echo --quick) >"$W/pair.log" 2>&1 \
                || { echo "FAILED: make_pair.sh: $(tail -c 400 "$W/pair.log")"; FAILED=1; PAIR=; }
        fi
    fi
    if [ -n "$PAIR" ]; then
        PK="$W/pair.draft.kpk"
        [ -f "$PK" ] || "$BIN/kpack" convert "$PAIR/drafter" "$PK" --quiet
        MIN=$("$BIN/krun" "$PAIR/TARGET.kpk" --plan --mem 1G --draft "$PK" --json "$W/pair-plan.json" >/dev/null 2>&1;
              "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["minimum_bytes"])' "$W/pair-plan.json")
        MIN=$((MIN + MIN / 8))
        i=0
        for lic in BSD Artistic CC0-1.0 GFDL-1.3; do
            f=/usr/share/common-licenses/$lic
            [ -f "$f" ] || continue
            i=$((i + 1))
            ids=$(head -c 2000 "$f" | tail -c 240 | od -An -v -tu1 | tr -s ' \n' ',' | sed 's/^,//; s/,$//')
            for r in $(seq "$RUNS"); do
                for d in off on; do
                    o="$W/pair-$i-$d-r$r.json"
                    [ -f "$o" ] && continue
                    if [ "$d" = off ]; then a=(--draft off --spec 0); else a=(--draft "$PK"); fi
                    dropped_run "$o" "$PAIR/TARGET.kpk" --ids "$ids" --gen 160 --ignore-eos --quiet --mem "$MIN" --pin 0 --expert-slots 8 ${BENCH_DRAFT_PAIR_OPTS:-} "${a[@]}" || FAILED=1
                done
            done
        done
        AM=$("$PY" - "$W" "$MIN" <<'PY'
import glob, json, os, statistics as st, sys
w, mem = sys.argv[1], int(sys.argv[2])
out = sys.stderr
rows, depth_try, depth_ok = [], {}, {}
for f in sorted(glob.glob(os.path.join(w, "pair-*-on-r1.json"))):
    p = os.path.basename(f).split("-")[1]
    on = [json.load(open(x)) for x in sorted(glob.glob(os.path.join(w, "pair-%s-on-r*.json" % p)))]
    off = [json.load(open(x)) for x in sorted(glob.glob(os.path.join(w, "pair-%s-off-r*.json" % p)))]
    same = all(x["generated_ids"] == off[0]["generated_ids"] for x in on + off)
    a = on[0]
    for dr, ac in a["spec"]["rounds"]:             # per verification: drafts, accepted (a prefix)
        for j in range(min(dr, ac + 1)):           # depth j was judged: the j drafts before it were right
            depth_try[j] = depth_try.get(j, 0) + 1
            depth_ok[j] = depth_ok.get(j, 0) + (j < ac)
    sw = a["decode"]["sweeps"]
    tpp = a["decode"]["tokens"] / sw
    bon = st.median(x["decode"]["bytes"] / x["decode"]["tokens"] for x in on)
    boff = st.median(x["decode"]["bytes"] / x["decode"]["tokens"] for x in off)
    pl = a["plan"]
    c = pl["cost_model"]
    c0 = pl["trunk_stream_bytes_per_token"] + pl["head_stream_bytes_per_token"]
    n = c["moe_layers"] * c["n_experts"]
    cached = min(1.0, pl["expert_slots"] / n)      # the expert cache's share, as sweep_model.c counts it
    def pb(r): return c0 + n * (1 - (1 - c["topk"] / c["n_experts"]) ** r) * c["expert_bytes"] * (1 - cached)
    rws = [dr + 1 for dr, _ in a["spec"]["rounds"]] + [1] * (sw - len(a["spec"]["rounds"]))
    pred = sum(pb(r) for r in rws) / a["decode"]["tokens"] / pb(1)
    rows.append((p, a["decode"]["tokens"], sw, tpp, a["spec"]["drafter"]["acceptance"], boff, bon, bon / boff, pred, same))
print("| prompt | tokens | passes | tokens a pass | acceptance a draft | MB/token without | MB/token with | ratio | predicted by its passes | ids equal |", file=out)
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|", file=out)
for p, t, sw, tpp, acc, boff, bon, r, pred, same in rows:
    print("| %s | %d | %d | %.2f | %.2f | %.1f | %.1f | %.3fx | %.3fx (%+.1f%%) | %s |" % (p, t, sw, tpp, acc, boff / 1e6, bon / 1e6, r, pred, 100 * (r / pred - 1), "yes" if same else "NO"), file=out)
print("(budget %d bytes, the planner's minimum + 1/8; nothing pinned, 8 expert slots: the experts stream as at full scale; medians of the runs)" % mem, file=out)
print(",".join("%.3f" % (depth_ok[j] / depth_try[j]) for j in sorted(depth_try) if depth_try[j] >= 8) or "")
PY
) || FAILED=1
        echo "acceptance at depths 1, 2, ... (given the drafts before it, depths verified >= 8 times): ${AM:-none}"
    fi
fi

# ---------------------------------------------------------------------------------------------- plan
if [[ "$PARTS" == *" plan "* ]]; then
    echo
    echo "## The full-scale projection (krun --plan on the sparse virtual K3 and drafter)"
    V=${KPK_VIRTUAL:-}
    if [ -z "$V" ] || [ ! -f "$V" ]; then
        V="$W/k3.kpk"
        if [ ! -f "$V" ]; then
            "$BIN/k3synth" "$W/virt" --virtual --quiet && "$BIN/kpack" convert "$W/virt" "$V" --quiet && rm -rf "$W/virt"
        fi
    fi
    VD="$W/k3.draft.kpk"
    if [ ! -f "$VD" ]; then
        "$BIN/k3synth" "$W/drel" --drafter --geometry release --virtual --quiet && "$BIN/kpack" convert "$W/drel" "$VD" --quiet && rm -rf "$W/drel"
    fi
    BIN="$BIN" tests/bench/draft_table.sh "$V" "$VD" "$AM" "the trained small pair's acceptance" || FAILED=1
fi
exit "$FAILED"
