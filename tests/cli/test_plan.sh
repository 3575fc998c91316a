#!/usr/bin/env bash
# The memory planner and the ring's cut, through tests/unit/probe_plan.c, on
# k3synth models stored three ways (plain, compressed blocks, a stripe set with
# a trunk member): the cut of every piece size, the fewest ring slots against
# a replay of the use order, the store's buffers as planned == as allocated at
# several budgets and choices, the minimum and one byte less, and the
# planner's order of preference.
. "$(dirname "$0")/lib.sh"
case ${BUILD:-build} in /*) PROBE="$BUILD/tests/probe_plan" ;; *) PROBE="$TOP/${BUILD:-build}/tests/probe_plan" ;; esac
[ -x "$PROBE" ] || { notok "the planner probe $PROBE is missing (make unit)"; finish; exit 1; }

"$BIN/k3synth" "$T/m" --geometry tiny --seed 31 --shards 2 --quiet >/dev/null 2>"$T/err" || { notok "k3synth: $(cat "$T/err")"; finish; exit 1; }
mkdir -p "$T/d1" "$T/d2" "$T/fast"
"$BIN/kpack" convert "$T/m" "$T/plain.kpk" --quiet &&
"$BIN/kpack" convert "$T/m" "$T/blocks.kpk" --compress all --quiet &&
"$BIN/kpack" convert "$T/m" "$T/set.kpk" --stripe "$T/d1,$T/d2" --trunk-to "$T/fast" --stripe-unit 64K --quiet ||
    { notok "convert"; finish; exit 1; }

for f in plain blocks set; do
    "$PROBE" ring "$T/$f.kpk"
    "$PROBE" budget "$T/$f.kpk"
    "$PROBE" prefer "$T/$f.kpk"
    # the store at the minimum, a little above it, with lm_head streamed, small pieces, the
    # prediction's buffers, and a budget that holds everything (--ctx 64 --chunk 4: the probe's)
    min=$("$BIN/krun" "$T/$f.kpk" --plan --mem 1G --ctx 64 --chunk 4 --json "$T/p.json" >/dev/null &&
          python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["minimum_bytes"])' "$T/p.json") ||
        { notok "$f: krun --plan"; continue; }
    "$PROBE" store "$T/$f.kpk" --mem "$min"
    "$PROBE" store "$T/$f.kpk" --mem $((min + 600000))
    "$PROBE" store "$T/$f.kpk" --mem $((min + 1200000)) --head stream
    "$PROBE" store "$T/$f.kpk" --mem $((min + 2000000)) --pin 1 --piece 16K
    "$PROBE" store "$T/$f.kpk" --mem $((min + 1200000)) --predict on
    "$PROBE" store "$T/$f.kpk" --mem 256M
done
finish
