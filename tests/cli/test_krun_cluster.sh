#!/usr/bin/env bash
# Several machines over MPI (docs/RUNTIME.md §10), on this one machine: mpirun
# --oversubscribe -np 2..4 on localhost.  Ids and every logit bit equal to one
# process's at several budgets, thread counts and rank counts, with the experts
# computed where they are read and trunk layers on other ranks (pipeline
# stages: chosen by the ranks' budgets, or given); speculative decoding, state
# files, krun chat, krun serve and krun batch across stages; the EAGLE drafter; a set laid out for
# two machines (kpack convert --machines), each rank with only its own members;
# the cluster plan; and the faults: a damaged expert read on another rank, a
# rank killed, a failed send, a member on no machine, krun batch resumed after
# the cluster is restarted, krun serve's 503; a krun built without MPI under
# mpirun.  The full-width slice under mpirun: test_krun_slice.sh.
. "$(dirname "$0")/lib.sh"
case ${BUILD:-build} in /*) TB="$BUILD/tests" ;; *) TB="$TOP/${BUILD:-build}/tests" ;; esac

if ! command -v mpirun >/dev/null; then
    skip "several machines: no mpirun here (tests/deps.sh installs openmpi-bin and libopenmpi-dev)"
    finish; exit 0
fi
# (MPI: tests/cli/lib.sh)
export KRUN_CLUSTER_TIMEOUT=5
# rank 0's exit status (mpirun's own does not always carry it): run.sh RC CMD... under mpirun
cat >"$T/run.sh" <<'SH'
#!/bin/sh
rcf=$1; shift
"$@"; rc=$?
[ "${OMPI_COMM_WORLD_RANK:-0}" = 0 ] && echo $rc >"$rcf"
exit $rc
SH
chmod +x "$T/run.sh"
# rank_pid TAG R: the krun of rank R in the mpirun run whose environment has KRUN_TEST_TAG=TAG
rank_pid() {
    local p
    for p in $(pgrep -x krun); do
        tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx "KRUN_TEST_TAG=$1" || continue
        tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$p"; return; }
    done
}

"$BIN/k3synth" "$T/m" --geometry tiny --seed 21 --shards 2 --quiet >/dev/null 2>"$T/err" || { notok "k3synth: $(cat "$T/err")"; finish; exit 1; }
"$BIN/kpack" convert "$T/m" "$T/m.kpk" --quiet || { notok "convert"; finish; exit 1; }
"$BIN/k3synth" "$T/r" --geometry tiny --layers 2 --seed 1 --quiet >/dev/null && "$BIN/kpack" convert "$T/r" "$T/r.kpk" --quiet \
    || { notok "k3synth/convert of the 2-layer model"; finish; exit 1; }

# A krun without MPI says what is missing when mpirun starts it
if [ -x "$TB/krun_nompi" ]; then
    "${MPI[@]}" -np 2 "$T/run.sh" "$T/rc" "$TB/krun_nompi" "$T/m.kpk" --ids 5,6 --gen 2 >"$T/last.out" 2>"$T/last.err"
    [ "$(cat "$T/rc" 2>/dev/null)" = 2 ] && grep -q 'built without MPI: install .*libopenmpi-dev' "$T/last.err" \
        && ok "a krun built without MPI, under mpirun: exit 2, naming what to install" \
        || notok "krun without MPI under mpirun: rc $(cat "$T/rc" 2>/dev/null): $(head -c 300 "$T/last.err")"
    "$TB/krun_nompi" "$T/m.kpk" --ids 5,6 --gen 2 --quiet --print-ids >/dev/null 2>"$T/err" \
        && ok "the same build runs as one process without mpirun" || notok "krun without MPI, one process: $(cat "$T/err")"
else
    skip "a krun built without MPI: not built ($TB/krun_nompi: make unit, where Open MPI is)"
fi
if "${MPI[@]}" -np 2 "$BIN/krun" "$T/m.kpk" --ids 5,6 --gen 1 --quiet 2>&1 | grep -q 'built without MPI'; then
    skip "several machines: this krun was built without MPI (libopenmpi-dev missing when it was built)"
    finish; exit 0
fi

IDS=5,80,81,82,200,13,7,7,7,31,99
GEN=8
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen $GEN --dump-all-logits "$T/ref.bin" --json "$T/ref.json" --quiet >/dev/null \
    || { notok "krun, one process"; finish; exit 1; }

# cluster LABEL CHECK NP ARGS...: mpirun -np NP krun on the tiny model == one process (ids, every logit bit);
# CHECK (python on j, the --json report) must hold
cluster() {
    local label=$1 check=$2 np=$3; shift 3
    if "${MPI[@]}" -np "$np" "$BIN/krun" "$T/m.kpk" --ids $IDS --gen $GEN --dump-all-logits "$T/x.bin" --json "$T/x.json" --quiet "$@" \
            >/dev/null 2>"$T/x.err" && cmp -s "$T/ref.bin" "$T/x.bin" \
        && python3 - "$T/ref.json" "$T/x.json" "$check" <<'PY'
import json, sys
ref, j = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert ref["generated_ids"] == j["generated_ids"]
ranks = j["cluster"]["per_rank"]
layers = [r["layers"] for r in ranks]
assert sum(layers) == 13, layers
assert eval(sys.argv[3]), (sys.argv[3], [(r["layers"], r["experts_served"]) for r in ranks])
PY
    then ok "identical ids and logits bits: $label"
    else notok "$label: $(head -c 400 "$T/x.err")"
    fi
}
served='all(r["experts_served"] > 0 for r in ranks[1:])'
for np in 2 3 4; do
    cluster "$np ranks, in place: every other rank computed experts" "$served" $np
done
staged='any(r["layers"] > 0 for r in ranks[1:]) and ranks[0]["layers"] > 0'
cluster "2 ranks at --mem 16.5M each, 1 thread: trunk layers on rank 1 (stages)" "$staged" 2 --mem 16.5M --ctx 64 --threads 1
cluster "3 ranks at --mem 16.2M, 2 threads: stages" "$staged" 3 --mem 16.2M --ctx 64 --threads 2
cluster "4 ranks at --mem 15M: four stages" 'all(r["layers"] > 0 for r in ranks)' 4 --mem 15M --ctx 64
cluster "3 ranks, --stages off: every layer on rank 0, experts everywhere" 'layers[0] == 13 and '"$served" 3 --mem 16.2M --ctx 64 --stages off
cluster "4 ranks, --stages 2,4,0,7 (given): three stages, rank 2 experts only" 'layers == [2, 4, 0, 7]' 4 --stages 2,4,0,7 --mem 64M
cluster "3 ranks, --predict on: the guesses read where they are computed" 'sum(r["experts_predicted"] for r in ranks[1:]) > 0' 3 \
    --mem 64M --predict on --stages 5,4,4

# speculative decoding across stages: drafts verified in one block, the other rank's layer committed
R_IDS=3,7,11,5,9,100,200,30
"$BIN/krun" "$T/r.kpk" --ids $R_IDS --gen 60 --ignore-eos --print-ids --quiet --dump-gen-logits "$T/s0.bin" --save-state "$T/s0.st" >"$T/s0.ids"
"${MPI[@]}" -np 2 "$BIN/krun" "$T/r.kpk" --ids $R_IDS --gen 60 --ignore-eos --print-ids --quiet --dump-gen-logits "$T/s1.bin" \
    --save-state "$T/s1.st" --spec 8 --stages 1,1 --json "$T/s1.json" >"$T/s1.ids" 2>"$T/err"
cmp -s "$T/s0.ids" "$T/s1.ids" && cmp -s "$T/s0.bin" "$T/s1.bin" && cmp -s "$T/s0.st" "$T/s1.st" \
    && python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["spec"]["accepted"] > 10' "$T/s1.json" \
    && ok "--spec 8 over 2 stages == one process --spec 0: ids, every generated token's logits, the saved state (its layer 1 from rank 1)" \
    || notok "--spec across stages: $(head -c 300 "$T/err")"
"$BIN/krun" "$T/r.kpk" --load-state "$T/s0.st" --ids 9,9 --gen 10 --ignore-eos --dump-gen-logits "$T/c0.bin" --quiet --print-ids >"$T/c0.ids"
"${MPI[@]}" -np 2 "$BIN/krun" "$T/r.kpk" --load-state "$T/s0.st" --ids 9,9 --gen 10 --ignore-eos --dump-gen-logits "$T/c1.bin" --quiet \
    --print-ids --stages 1,1 >"$T/c1.ids" 2>"$T/err"
cmp -s "$T/c0.ids" "$T/c1.ids" && cmp -s "$T/c0.bin" "$T/c1.bin" \
    && ok "--load-state over 2 stages (layer 1 sent to rank 1) continues as one process" || notok "--load-state across stages: $(head -c 300 "$T/err")"

# the EAGLE drafter under mpirun: its taps read the trunk's hidden state on rank 0, so every trunk
# layer stays there (the other ranks compute experts) and the drafts, ids and logits are one process's;
# --stages N,N with a drafter is refused, naming --stages off
"$BIN/k3synth" "$T/dm" --single-file --seed 5 --logit-gain 4 --quiet && "$BIN/kpack" convert "$T/dm" "$T/dm.kpk" --quiet \
    && "$BIN/k3synth" "$T/dd" --drafter --target "$T/dm" --seed 5 --quiet && "$BIN/kpack" convert "$T/dd" "$T/dd.kpk" --quiet \
    || notok "the drafter pair"
D_IDS=3,7,11,5,9,4,4,31,2
"$BIN/krun" "$T/dm.kpk" --ids $D_IDS --gen 40 --ignore-eos --print-ids --quiet --dump-gen-logits "$T/d0.bin" --draft off >"$T/d0.ids"
"${MPI[@]}" -np 2 "$BIN/krun" "$T/dm.kpk" --ids $D_IDS --gen 40 --ignore-eos --print-ids --quiet --dump-gen-logits "$T/d1.bin" \
    --draft "$T/dd.kpk" --spec 4 --json "$T/d1.json" >"$T/d1.ids" 2>"$T/err"
cmp -s "$T/d0.ids" "$T/d1.ids" && cmp -s "$T/d0.bin" "$T/d1.bin" \
    && python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["spec"]["drafted"] > 0, j["spec"]' "$T/d1.json" \
    && ok "--draft over 2 ranks (every trunk layer on rank 0, experts on both) == one process without it: ids and every generated token's logits" \
    || notok "--draft under mpirun: $(head -c 300 "$T/err")"
"${MPI[@]}" -np 2 "$T/run.sh" "$T/rc" "$BIN/krun" "$T/dm.kpk" --ids $D_IDS --gen 4 --quiet --draft "$T/dd.kpk" --spec 4 --stages 3,3 \
    >/dev/null 2>"$T/err"
[ "$(cat "$T/rc" 2>/dev/null)" = 2 ] && grep -q -- "--stages with a drafter.*--stages off" "$T/err" \
    && ok "--draft with --stages 3,3: refused (exit 2), naming --stages off" \
    || notok "--draft with --stages N,N: rc $(cat "$T/rc" 2>/dev/null): $(head -c 300 "$T/err")"

# krun chat, krun serve, krun batch across three stages
printf 'hello there\n/save %s\nhow are you\n/quit\n' "$T/ch0" >"$T/chat0.in"
printf 'hello there\n/save %s\nhow are you\n/quit\n' "$T/ch1" >"$T/chat1.in"
"$BIN/krun" chat "$T/m.kpk" --gen 8 --ctx 256 <"$T/chat0.in" >"$T/chat0.out" 2>/dev/null
"${MPI[@]}" -np 3 "$BIN/krun" chat "$T/m.kpk" --gen 8 --ctx 256 --stages 5,4,4 <"$T/chat1.in" >"$T/chat1.out" 2>"$T/err"
cmp -s "$T/chat0.out" "$T/chat1.out" && cmp -s "$T/ch0" "$T/ch1" \
    && ok "krun chat over 3 stages: the same replies and the same /save file" || notok "krun chat across stages: $(head -c 300 "$T/err")"

python3 -c "
import json
for i,p in enumerate(['The capital','Hello','abc abc abc','zzz','once upon']):
    print(json.dumps({'custom_id':'r%d'%i,'method':'POST','url':'/v1/completions','body':{'model':'m','prompt':p,'max_tokens':10,'temperature':0.7}}))" >"$T/req.jsonl"
"$BIN/krun" batch "$T/m.kpk" "$T/req.jsonl" "$T/b0.jsonl" --max-seqs 3 --ctx 128 --seed 1 --quiet 2>"$T/err"
"${MPI[@]}" -np 3 "$BIN/krun" batch "$T/m.kpk" "$T/req.jsonl" "$T/b1.jsonl" --max-seqs 3 --ctx 128 --seed 1 --quiet --stages 5,4,4 2>>"$T/err"
# same_out A B: two krun batch outputs, identical but for "created" (the time the job began)
same_out() {
    python3 - "$1" "$2" <<'PY'
import json, sys
def lines(p):
    out = []
    for l in open(p):
        j = json.loads(l)
        if (j.get("response") or {}).get("body"): j["response"]["body"].pop("created", None)
        out.append(j)
    return out
assert lines(sys.argv[1]) == lines(sys.argv[2])
PY
}
same_out "$T/b0.jsonl" "$T/b1.jsonl" && ok "krun batch over 3 stages: OUT identical to one process's (but for \"created\")" || notok "krun batch across stages: $(head -c 300 "$T/err")"

serve_texts() { # PORT OUT: four concurrent requests, their texts sorted
    python3 - "$1" >"$2" <<'PY'
import json, sys, threading, urllib.request
port, out = sys.argv[1], []
def one(p):
    req = urllib.request.Request("http://127.0.0.1:%s/v1/completions" % port, data=json.dumps(
        {"model": "m", "prompt": p, "max_tokens": 12, "temperature": 0}).encode(), headers={"Content-Type": "application/json"})
    out.append(json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["text"])
ts = [threading.Thread(target=one, args=(p,)) for p in ("The capital", "Hello", "abc abc abc", "zzz")]
[t.start() for t in ts]; [t.join() for t in ts]
print("\n".join(sorted(map(repr, out))))
PY
}
wait_port() { # LOG: the port krun serve printed
    for _ in $(seq 1 300); do
        p=$(sed -n 's/.*listening on [^ ]*:\([0-9]*\).*/\1/p' "$1" | head -1)
        [ -n "$p" ] && { echo "$p"; return; }
        sleep 0.1
    done
}
"$BIN/krun" serve "$T/m.kpk" --port 0 --max-seqs 4 --ctx 256 >"$T/srv0.log" 2>&1 & SP=$!
P=$(wait_port "$T/srv0.log"); [ -n "$P" ] && serve_texts "$P" "$T/sv0.txt"; kill $SP; wait $SP 2>/dev/null
: >"$T/srv1.log"
KRUN_TEST_TAG=serve1 "${MPI[@]}" -np 3 "$BIN/krun" serve "$T/m.kpk" --port 0 --max-seqs 4 --ctx 256 --stages 5,4,4 >"$T/srv1.log" 2>&1 & SP=$!
P=$(wait_port "$T/srv1.log"); [ -n "$P" ] && serve_texts "$P" "$T/sv1.txt"
R0=$(rank_pid serve1 0)
[ -n "$R0" ] && kill -TERM "$R0"; wait $SP; rc=$?
[ -s "$T/sv0.txt" ] && cmp -s "$T/sv0.txt" "$T/sv1.txt" && [ $rc = 0 ] \
    && ok "krun serve over 3 stages: 4 concurrent requests batched, the same texts as one process; SIGTERM to rank 0: all stop, exit 0" \
    || notok "krun serve across stages: rc $rc: $(tail -c 300 "$T/srv1.log")"

# The cluster plan: under mpirun, and for N machines like this one
"${MPI[@]}" -np 3 "$BIN/krun" "$T/m.kpk" --plan --mem 16.2M --ctx 64 --disk-mbps 262 --net-mbps 1000 --json "$T/p.json" >"$T/p.out" 2>"$T/err"
"$BIN/krun" "$T/m.kpk" --plan --mem 16.2M --ctx 64 --ranks 3 --disk-mbps 262 --net-mbps 1000 --json "$T/q.json" >"$T/q.out" 2>>"$T/err"
python3 - "$T/p.json" "$T/q.json" <<'PY' && grep -q '^cluster plan: 3 ranks' "$T/p.out" \
    && ok "--plan under mpirun: the cluster plan (3 ranks: layers, reads and sends per sweep, seconds per token); --ranks 3 gives the same placement" \
    || notok "cluster --plan: $(head -c 300 "$T/err")"
import json, sys
p, q = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert p["ranks"] == 3 and not p["hypothetical"] and q["hypothetical"]
assert sum(r["layers"] for r in p["per_rank"]) == 13 and [r["layers"] for r in p["per_rank"]] == [r["layers"] for r in q["per_rank"]]
assert p["seconds_per_token"] > 0 and p["net_bytes"] > 0 and p["hops"] >= 2
PY

# A set laid out for two machines: each rank (its own directory, as its own machine) has the main
# file and its own members only
mkdir -p "$T/set/e" "$T/set/a0" "$T/set/a1" "$T/set/b0" "$T/set/b1"
"$BIN/kpack" convert "$T/m.kpk" "$T/set/e/k.kpk" --stripe "$T/set/a0,$T/set/a1,$T/set/b0,$T/set/b1" --machines 2 --quiet \
    && "$BIN/kpack" verify "$T/set/e/k.kpk" --quiet >/dev/null || notok "kpack convert --machines 2"
for mach in A:a B:b; do
    d=$T/${mach%%:*}; x=${mach##*:}
    mkdir -p "$d/e" "$d/${x}0" "$d/${x}1"
    ln "$T/set/e/k.kpk" "$d/e/k.kpk" && ln "$T/set/${x}0/"* "$d/${x}0/" && ln "$T/set/${x}1/"* "$d/${x}1/"
done
two() { # RC-FILE RANK0-ARGS... : mpirun, rank 0 in machine A's directory, rank 1 in B's
    local rcf=$1; shift
    "${MPI[@]}" -np 1 -wdir "$T/A/e" "$T/run.sh" "$rcf" "$BIN/krun" k.kpk --ids $IDS --gen $GEN "$@" : \
        ${MPI_ENV[@]+"${MPI_ENV[@]}"} -np 1 -wdir "$T/B/e" "$BIN/krun" k.kpk --mem 16M
}
two "$T/rc" --dump-all-logits "$T/x.bin" --json "$T/x.json" --quiet --mem 16M --ctx 64 >/dev/null 2>"$T/err"
cmp -s "$T/ref.bin" "$T/x.bin" && python3 - "$T/x.json" <<'PY' \
    && ok "a set laid out for 2 machines (kpack convert --machines 2), each rank with its own members: identical bits; each read only its own disks, and computed its machine's share of the trunk" \
    || notok "--machines 2 layout: $(head -c 400 "$T/err")"
import json, sys
j = json.load(open(sys.argv[1]))
r0, r1 = j["cluster"]["per_rank"]
assert r0["member_bytes"][3] == r0["member_bytes"][4] == 0 and r1["member_bytes"][1] == r1["member_bytes"][2] == 0, (r0, r1)
assert sum(r0["member_bytes"]) > 0 and sum(r1["member_bytes"]) > 0 and r0["layers"] > 0 and r1["layers"] > 0
assert r0["experts_served"] > 0 and r1["experts_served"] > 0
PY
# its plan for 2 machines (--ranks 2, all members here) gives each machine only its own members:
# the same placement, reads and sends as the plan under mpirun with the members really apart
"${MPI[@]}" -np 1 -wdir "$T/A/e" "$BIN/krun" k.kpk --plan --mem 16M --ctx 64 --disk-mbps 262 --net-mbps 1000 --json "$T/p.json" : \
    ${MPI_ENV[@]+"${MPI_ENV[@]}"} -np 1 -wdir "$T/B/e" "$BIN/krun" k.kpk --mem 16M >/dev/null 2>"$T/err"
"$BIN/krun" "$T/set/e/k.kpk" --plan --mem 16M --ctx 64 --ranks 2 --disk-mbps 262 --net-mbps 1000 --json "$T/q.json" >/dev/null 2>>"$T/err"
python3 - "$T/p.json" "$T/q.json" <<'PY' \
    && ok "--plan --ranks 2 of a set laid out for 2 machines: each machine with its own members, as under mpirun (layers, expert bytes, sends)" \
    || notok "--plan --ranks of a --machines set: $(head -c 300 "$T/err")"
import json, sys
p, q = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
key = lambda j: [(r["layers"], r["expert_bytes"], r["sent"], r["received"]) for r in j["per_rank"]]
assert not p["hypothetical"] and q["hypothetical"] and key(p) == key(q), (key(p), key(q))
assert p["seconds_experts"] == q["seconds_experts"] and p["net_bytes"] == q["net_bytes"]
PY
mv "$T/A/a1/k.kpk.m0.1" "$T/held"
two "$T/rc" --quiet >/dev/null 2>"$T/last.err"
[ "$(cat "$T/rc")" = 2 ] && grep -q 'member 2 (.*k.kpk.m0.1), which no rank has' "$T/last.err" \
    && ok "a member on no machine: exit 2 before anything runs, the member named" || notok "member on no rank: rc $(cat "$T/rc"): $(head -c 300 "$T/last.err")"
mv "$T/held" "$T/A/a1/k.kpk.m0.1"
# a damaged expert on machine B (its own copy of its members): found where it is read, named, exit 1, no token printed
for x in 0 1; do rm "$T/B/b$x/k.kpk.m1.$x"; cp "$T/set/b$x/k.kpk.m1.$x" "$T/B/b$x/"; done
python3 - "$T/set/e/k.kpk" "$T/B" <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read()
ext_off, ext_n = struct.unpack_from("<QQ", d, 56)
for i in range(ext_n):
    kind, codec, member, layer, expert = struct.unpack_from("<BBHII", d, ext_off + 64 * i)
    off, stored = struct.unpack_from("<QQ", d, ext_off + 64 * i + 16)
    if kind == 4 and member in (3, 4):
        path = "%s/b%d/k.kpk.m1.%d" % (sys.argv[2], member - 3, member - 3)
        with open(path, "r+b") as f:
            f.seek(off + stored // 3); b = f.read(1); f.seek(off + stored // 3); f.write(bytes([b[0] ^ 0x40]))
PY
two "$T/rc" --print-ids --quiet --mem 16M --ctx 64 >"$T/last.out" 2>"$T/last.err"
[ "$(cat "$T/rc")" = 1 ] && [ ! -s "$T/last.out" ] && grep -qE 'rank 1 .*expert [0-9]+.*checksum mismatch' "$T/last.err" \
    && ok "a damaged expert read on rank 1: exit 1, the rank and the extent named, no token printed" \
    || notok "damaged expert on another rank: rc $(cat "$T/rc"), out $(head -c 80 "$T/last.out"): $(head -c 300 "$T/last.err")"

# Faults: a rank killed (mpirun --enable-recovery keeps the others: rank 0 says which rank was lost)
KRUN_TEST_TAG=kill KRUN_CLUSTER_TIMEOUT=3 "${MPI[@]}" --enable-recovery -np 3 "$T/run.sh" "$T/rc" "$BIN/krun" "$T/m.kpk" --ids $IDS --gen 3000 --ignore-eos \
    --ctx 3100 --print-ids --quiet --mem 64M >"$T/k.out" 2>"$T/k.err" &
MP=$!
for _ in $(seq 1 100); do [ -s "$T/k.out" ] && break; sleep 0.1; done
victim=$(rank_pid kill 1); [ -n "$victim" ] && kill -9 "$victim"
wait $MP 2>/dev/null
ngot=$(wc -w <"$T/k.out")
"$BIN/krun" "$T/m.kpk" --ids $IDS --gen "$ngot" --ignore-eos --ctx 3100 --print-ids --quiet >"$T/k.ref"
python3 - "$T/k.out" "$T/k.ref" <<'PY' && [ "$(cat "$T/rc")" = 2 ] && grep -q "rank 1 (host .*) stopped answering" "$T/k.err" \
    && ok "rank 1 killed -9 mid-run: rank 0 exits 2 naming it; every token printed before is one process's" \
    || notok "a killed rank: rc $(cat "$T/rc" 2>/dev/null): $(grep -v '^\[' "$T/k.err" | head -c 400)"
import sys
got, ref = open(sys.argv[1]).read().split(), open(sys.argv[2]).read().split()
assert 0 < len(got) < 3000 and got == ref, (len(got), len(ref))
PY
# a failed send (the network): tests/fault/kmpifault.c makes rank 0's 30th message send fail, then rank 1's
if [ -f "$TB/libkmpifault.so" ]; then
    for who in 0 1; do
        KMPIFAULT_RANK=$who KMPIFAULT_AFTER=30 KRUN_CLUSTER_TIMEOUT=3 "${MPI[@]}" -np 3 -x LD_PRELOAD="$TB/libkmpifault.so" -x KMPIFAULT_RANK \
            -x KMPIFAULT_AFTER -x KRUN_CLUSTER_TIMEOUT "$T/run.sh" "$T/rc" "$BIN/krun" "$T/m.kpk" --ids $IDS --gen $GEN --print-ids --quiet \
            >"$T/last.out" 2>"$T/last.err"
        want='cluster: sending with rank [0-9] .* failed'
        [ $who = 1 ] && want='rank 1 \(host .*\) stopped answering'
        [ "$(cat "$T/rc")" = 2 ] && grep -qE "^krun: .*$want" "$T/last.err" \
            && ok "a failed send on rank $who: rank 0 exits 2 naming the rank" \
            || notok "failed send on rank $who: rc $(cat "$T/rc"): $(grep -v '^\[' "$T/last.err" | head -c 300)"
    done
else
    skip "a failed send: tests/fault/kmpifault.c not built (make unit)"
fi
# krun batch: the cluster killed mid-job (a rank killed: mpirun ends the others), the same command continues
python3 -c "
import json
for i in range(48):
    print(json.dumps({'custom_id':'r%d'%i,'method':'POST','url':'/v1/completions','body':{'model':'m','prompt':'n %d'%i,'max_tokens':16,'temperature':0.5}}))" >"$T/many.jsonl"
"$BIN/krun" batch "$T/m.kpk" "$T/many.jsonl" "$T/m0.jsonl" --max-seqs 2 --ctx 128 --seed 3 --quiet 2>"$T/err"
KRUN_TEST_TAG=batch "${MPI[@]}" -np 3 "$BIN/krun" batch "$T/m.kpk" "$T/many.jsonl" "$T/m1.jsonl" --max-seqs 2 --ctx 128 --seed 3 --mem 16M --quiet >/dev/null 2>&1 &
MP=$!
# killed once the journal has recorded some requests (it grows by one record each; 48 requests, so
# that a loaded machine's slower start still leaves most of them to do)
for _ in $(seq 1 400); do [ -s "$T/m1.jsonl.krun-journal" ] && break; sleep 0.02; done
j0=$(stat -c %s "$T/m1.jsonl.krun-journal" 2>/dev/null || echo 0)
for _ in $(seq 1 400); do [ "$(stat -c %s "$T/m1.jsonl.krun-journal" 2>/dev/null || echo 0)" -gt $((j0 + 1000)) ] && break; sleep 0.02; done
victim=$(rank_pid batch 2); [ -n "$victim" ] && kill -9 "$victim"
wait $MP 2>/dev/null
if [ -e "$T/m1.jsonl" ]; then
    skip "krun batch resumed after the cluster stopped: the job ended before the kill"
else
    "${MPI[@]}" -np 3 "$BIN/krun" batch "$T/m.kpk" "$T/many.jsonl" "$T/m1.jsonl" --max-seqs 2 --ctx 128 --seed 3 --mem 16M --json \
        >"$T/m1.sum" 2>>"$T/err"
    same_out "$T/m0.jsonl" "$T/m1.jsonl" && python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["resumed"] > 0' "$T/m1.sum" \
        && ok "krun batch: a rank killed -9 ends the job; the same mpirun command continues from the journal, OUT identical to one process's" \
        || notok "krun batch resume on a cluster: $(head -c 300 "$T/err")"
fi
# krun serve: a rank lost while serving: 503 naming it, /health unavailable
: >"$T/srv2.log"
KRUN_TEST_TAG=serve2 KRUN_CLUSTER_TIMEOUT=3 "${MPI[@]}" --enable-recovery -np 3 "$BIN/krun" serve "$T/m.kpk" --port 0 --max-seqs 2 --ctx 256 --mem 16M \
    >"$T/srv2.log" 2>&1 &
SP=$!
P=$(wait_port "$T/srv2.log")
victim=$(rank_pid serve2 1); [ -n "$victim" ] && kill -9 "$victim"
python3 - "$P" <<'PY' && ok "krun serve: a rank killed: the request fails with 503 naming the rank, later ones too, /health says unavailable" \
    || notok "krun serve with a lost rank: $(tail -c 300 "$T/srv2.log")"
import json, sys, urllib.request, urllib.error
port = sys.argv[1]
def post():
    req = urllib.request.Request("http://127.0.0.1:%s/v1/completions" % port, data=json.dumps(
        {"model": "m", "prompt": "hi", "max_tokens": 4}).encode(), headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=60); return 200, ""
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
c1, b1 = post(); c2, b2 = post()
assert c1 == 503 and "rank 1" in b1 and "cluster_unavailable" in b1, (c1, b1)
assert c2 == 503 and "cluster_unavailable" in b2, (c2, b2)
try:
    urllib.request.urlopen("http://127.0.0.1:%s/health" % port, timeout=10)
    assert False
except urllib.error.HTTPError as e:
    assert e.code == 503 and json.loads(e.read())["status"] == "unavailable"
PY
R0=$(rank_pid serve2 0); [ -n "$R0" ] && kill -TERM "$R0"
wait $SP 2>/dev/null
finish
