#!/usr/bin/env bash
# Prints the README's "choosing a budget" table from the planner's own output
# for a KPK file (the full-size virtual K3 made by bench_kpack.sh, or the real
# model).  usage: tests/bench/budget_table.sh FILE.kpk [CTX]
set -eu
K=$1; CTX=${2:-4096}
BIN=${BIN:-bin}
echo "| preset | budget | lm_head | pinned trunk layers | trunk ring | expert cache | reads per token: trunk + lm_head + experts (at most) |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for p in 3000000000 laptop desktop workstation server max; do
    case $p in [0-9]*) b="--mem $p";; *) b="--preset $p";; esac
    "$BIN/krun" "$K" --plan $b --ctx "$CTX" --json /tmp/budget.$$.json >/dev/null
    python3 - /tmp/budget.$$.json $p <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); p = sys.argv[2]
gb = lambda b: "%.1f GB" % (b / 1e9)
bud = "%.1f GB" % (j["budget_bytes"] / 1e9) if p[0].isdigit() else "%d GiB" % (j["budget_bytes"] >> 30)
print("| %s | %s | %s | %d (%s) | %s | %d x 17.5 MB = %s | %s + %s + %s |" % (
    "--mem" if p[0].isdigit() else p, bud, "streamed" if j["head_streamed"] else "held", j["pinned_layers"], gb(j["pinned_bytes"]),
    "%d x %s (%d pieces)" % (j["ring_slots"], gb(j["ring_slot_bytes"]), j["ring_pieces"]) if j["ring_slots"] else "none",
    j["expert_slots"], gb(j["expert_slots"] * j["expert_slot_bytes"]),
    gb(j["trunk_stream_bytes_per_token"]), gb(j["head_stream_bytes_per_token"]), gb(j["expert_read_bytes_per_token_max"])))
PY
done
rm -f /tmp/budget.$$.json
"$BIN/krun" "$K" --plan --mem 1T --ctx "$CTX" | sed -n 's/.*(minimum for this model and --ctx: \(.*\))/minimum budget at --ctx '"$CTX"': \1/p'
