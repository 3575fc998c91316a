#!/usr/bin/env bash
# krun's session API and what the CLI builds on it: planned bytes == allocated
# bytes, nothing allocated per decoding step, several sessions in one block ==
# each alone, requests continued from the prefix cache == each alone, saved conversations (--save-state / --load-state) that continue
# bit-identically and refuse foreign or damaged files, non-finite logits
# stopped, prompts bounded by the context, long prompts announced, and out of
# memory named with its own exit code.
. "$(dirname "$0")/lib.sh"
case ${BUILD:-build} in /*) PROBE="$BUILD/tests/probe_session" ;; *) PROBE="$TOP/${BUILD:-build}/tests/probe_session" ;; esac

"$BIN/k3synth" "$T/m" --geometry tiny --seed 21 --shards 2 --quiet >/dev/null 2>"$T/err" || { notok "k3synth: $(cat "$T/err")"; finish; exit 1; }
"$BIN/kpack" convert "$T/m" "$T/m.kpk" --quiet || { notok "convert"; finish; exit 1; }

# ---- the session API, through the probe -------------------------------------------
if [ -x "$PROBE" ]; then
    for mem in "" "--mem 1G"; do
        for c in memory allocs batch sampler copy mark pcache; do "$PROBE" $c "$T/m.kpk" $mem; done
    done
    # a streaming budget that holds almost nothing: every step reads trunk and experts
    min=$("$BIN/krun" "$T/m.kpk" --plan --mem 1G --ctx 64 --chunk 4 --max-seqs 3 --json "$T/p.json" >/dev/null && \
          python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["minimum_bytes"])' "$T/p.json")
    "$PROBE" allocs "$T/m.kpk" --mem "$min"
    "$PROBE" batch "$T/m.kpk" --mem "$min"
    "$PROBE" copy "$T/m.kpk" --mem "$min"
else
    notok "the session probe $PROBE is missing (make unit)"
fi

# --plan budgets --max-seqs sessions and says how many would fit
"$BIN/krun" "$T/m.kpk" --plan --mem 64M --ctx 256 --max-seqs 4 --json "$T/p4.json" >"$T/p4.out"
"$BIN/krun" "$T/m.kpk" --plan --mem 64M --ctx 256 --json "$T/p1.json" >/dev/null
python3 - "$T/p1.json" "$T/p4.json" <<'PY' && ok "--plan --max-seqs 4: state = 4 x one session's; sessions_fit reported" || notok "--plan --max-seqs"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert b["max_seqs"] == 4 and b["state_bytes"] == 4 * a["session_bytes"] == 4 * a["state_bytes"], (a, b)
assert a["sessions_fit"] >= 4 and b["sessions_fit"] == a["sessions_fit"], (a["sessions_fit"], b["sessions_fit"])
PY
grep -qE "state .* 4 sessions x .* would fit" "$T/p4.out" && ok "the plan prints the sessions it budgets and how many fit" || notok "plan output: $(cat "$T/p4.out")"

# ---- saved conversations ----------------------------------------------------------
A=5,80,81,82,200,13,7
B=31,99,4,4
"$BIN/krun" "$T/m.kpk" --ids $A --gen 5 --save-state "$T/s1" --json "$T/t1.json" --quiet >/dev/null \
    && [ -s "$T/s1" ] && ok "--save-state writes the conversation" || notok "--save-state"
g1=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["generated_ids"])))' "$T/t1.json")
"$BIN/krun" "$T/m.kpk" --load-state "$T/s1" --ids $B --gen 6 --dump-all-logits "$T/t2.bin" --dump-logits "$T/t2l.bin" \
    --json "$T/t2.json" --save-state "$T/s2" --quiet >/dev/null || notok "--load-state run"
"$BIN/krun" "$T/m.kpk" --ids $A,$g1,$B --gen 6 --dump-all-logits "$T/r.bin" --dump-logits "$T/rl.bin" --json "$T/r.json" --quiet >/dev/null
V=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["text_config"]["vocab_size"])' "$T/m/config.json" 2>/dev/null || echo 256)
python3 - "$T" "$V" <<'PY' && ok "turn two after --load-state == the whole conversation in one go: ids, last logits, and every logit row of the positions it ran" || notok "turn two differs from one go"
import json, sys
d, V = sys.argv[1], int(sys.argv[2])
t2, r = json.load(open(f"{d}/t2.json")), json.load(open(f"{d}/r.json"))
assert t2["generated_ids"] == r["generated_ids"], (t2["generated_ids"], r["generated_ids"])
assert open(f"{d}/t2l.bin", "rb").read() == open(f"{d}/rl.bin", "rb").read()
a, b = open(f"{d}/t2.bin", "rb").read(), open(f"{d}/r.bin", "rb").read()
# turn two ran the pending last token of turn one, then B (4 tokens): the last 5 rows
assert len(a) == 5 * V * 4 and b.endswith(a), (len(a), len(b))
PY
# a third turn, chained, and with a budget
"$BIN/krun" "$T/m.kpk" --load-state "$T/s2" --ids 8,9 --gen 4 --json "$T/t3.json" --mem 1G --pin 2 --expert-slots 3 --quiet >/dev/null
g2=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["generated_ids"])))' "$T/t2.json")
"$BIN/krun" "$T/m.kpk" --ids $A,$g1,$B,$g2,8,9 --gen 4 --json "$T/r3.json" --quiet >/dev/null
python3 -c 'import json,sys; a,b=(json.load(open(p))["generated_ids"] for p in sys.argv[1:3]); assert a==b, (a,b)' "$T/t3.json" "$T/r3.json" \
    && ok "turn three (chained states, streaming budget) == one go" || notok "turn three differs"
# no prompt: continue generating where the conversation stopped
"$BIN/krun" "$T/m.kpk" --load-state "$T/s1" --gen 3 --json "$T/c.json" --quiet >/dev/null
"$BIN/krun" "$T/m.kpk" --ids $A --gen 8 --json "$T/c8.json" --quiet >/dev/null
python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["generated_ids"]; b=json.load(open(sys.argv[2]))["generated_ids"]; assert a==b[5:], (a,b)' \
    "$T/c.json" "$T/c8.json" && ok "--load-state without a prompt continues the generation: 5 then 3 tokens == 8 in one go" || notok "continue without prompt"
# sampling: the draw for a position depends on (seed, position) only and the state keeps the
# seed and where the reply began, so a sampled conversation continued without --seed equals
# the whole of it in one run with that seed (penalties included); --seed replaces the saved one
SAMP="--temp 0.9 --top-p 0.95 --repetition-penalty 1.3 --presence-penalty 0.5 --frequency-penalty 0.3"
"$BIN/krun" "$T/m.kpk" --ids $A --gen 3 $SAMP --seed 5 --save-state "$T/ss" --json "$T/s1.json" --quiet >/dev/null
"$BIN/krun" "$T/m.kpk" --load-state "$T/ss" --ids $B --gen 6 $SAMP --print-ids --quiet >"$T/sa"
"$BIN/krun" "$T/m.kpk" --load-state "$T/ss" --ids $B --gen 6 $SAMP --seed 99 --print-ids --quiet >"$T/sc"
g1s=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["generated_ids"])))' "$T/s1.json")
"$BIN/krun" "$T/m.kpk" --ids $A,$g1s,$B --gen 6 $SAMP --seed 5 --print-ids --quiet >"$T/sb"
cmp -s "$T/sa" "$T/sb" && ! cmp -s "$T/sa" "$T/sc" \
    && ok "sampling after --load-state (temp, top-p, penalties) == the conversation in one run with the saved seed (--seed replaces it)" \
    || notok "sampling after load: $(cat "$T/sa") vs one go $(cat "$T/sb") (--seed 99: $(cat "$T/sc"))"
# no prompt: the reply goes on (its start saved): 3 then 5 sampled tokens == 8 in one run
"$BIN/krun" "$T/m.kpk" --load-state "$T/ss" --gen 5 $SAMP --print-ids --quiet >"$T/sd"
"$BIN/krun" "$T/m.kpk" --ids $A --gen 8 $SAMP --seed 5 --print-ids --quiet >"$T/se"
python3 -c 'import sys; a=open(sys.argv[1]).read().split(); b=open(sys.argv[2]).read().split(); assert a==b[3:], (a,b)' "$T/sd" "$T/se" \
    && ok "sampled, penalized, continued without a prompt: 3 then 5 tokens == 8 in one run (the reply start is saved)" \
    || notok "sampled continuation without a prompt: $(cat "$T/sd") vs $(cat "$T/se")"

# bad and foreign state files: a clear error naming the file, exit 2, nothing printed
sz=$(stat -c %s "$T/s1")
for cut in 0 100 159 160 $((sz / 2)) $((sz - 1)); do
    head -c $cut "$T/s1" >"$T/bad"
    expect_exit 2 "state truncated to $cut of $sz bytes is refused" "$BIN/krun" "$T/m.kpk" --load-state "$T/bad" --ids $B --gen 2 --print-ids --quiet
done
expect_err "$T/bad" "the error names the state file"
for at in 3 20 100 170 $((sz / 2)) $((sz - 3)); do
    python3 -c 'import sys; d=bytearray(open(sys.argv[1],"rb").read()); d[int(sys.argv[3])]^=0x10; open(sys.argv[2],"wb").write(d)' "$T/s1" "$T/bad" $at
    expect_exit 2 "state with a bit flipped at byte $at is refused" "$BIN/krun" "$T/m.kpk" --load-state "$T/bad" --ids $B --gen 2 --print-ids --quiet
    [ -s "$T/last.out" ] && notok "tokens printed from a damaged state: $(cat "$T/last.out")"
done
expect_err "checksum|magic|version|not a usable" "a damaged state says why"
cat "$T/s1" /dev/null > "$T/bad"; printf 'x' >> "$T/bad"
expect_exit 2 "state with a byte appended is refused" "$BIN/krun" "$T/m.kpk" --load-state "$T/bad" --ids $B --gen 2 --quiet
"$BIN/k3synth" "$T/m2" --geometry tiny --seed 22 --quiet >/dev/null && "$BIN/kpack" convert "$T/m2" "$T/m2.kpk" --quiet
expect_exit 2 "a state of another model (same geometry, other weights) is refused" "$BIN/krun" "$T/m2.kpk" --load-state "$T/s1" --ids $B --gen 2 --quiet
expect_err "saved with another model file" "says it is another model's"
"$BIN/k3synth" "$T/m3" --geometry tiny --seed 21 --layers 6 --quiet >/dev/null && "$BIN/kpack" convert "$T/m3" "$T/m3.kpk" --quiet
expect_exit 2 "a state of another geometry is refused" "$BIN/krun" "$T/m3.kpk" --load-state "$T/s1" --ids $B --gen 2 --quiet
expect_exit 2 "--ctx smaller than the saved position is refused" "$BIN/krun" "$T/m.kpk" --load-state "$T/s1" --ids $B --gen 2 --ctx 8 --quiet
expect_err "give --ctx|do not fit the context" "says to give a larger --ctx"
expect_exit 2 "a KPK file as a state file is refused" "$BIN/krun" "$T/m.kpk" --load-state "$T/m.kpk" --ids $B --gen 2 --quiet
expect_exit 2 "a missing state file is refused" "$BIN/krun" "$T/m.kpk" --load-state "$T/nope" --ids $B --gen 2 --quiet
expect_exit 2 "--save-state to an unwritable path fails the run" "$BIN/krun" "$T/m.kpk" --ids $A --gen 2 --save-state "$T/no/such/dir/s" --quiet
expect_err "cannot write" "names the path it cannot write"

# ---- non-finite logits (issue 12.3): a real checkpoint whose final norm weights
# are the largest BF16 (3.39e38): every logit overflows.  Stop, exit 1, no token.
cp -r "$T/m" "$T/mnan"
python3 - "$T/mnan" "$TOP/tests/cli/st_tool.py" <<'PY'
import glob, subprocess, sys
d, tool = sys.argv[1], sys.argv[2]
for f in glob.glob(d + "/*.safetensors"):
    for line in subprocess.run([sys.executable, tool, "list", f], capture_output=True, text=True).stdout.splitlines():
        name, dtype, shape, b, e = line.split()
        if name == "language_model.model.norm.weight":
            data = bytearray(open(f, "rb").read())
            unit = {"BF16": b"\x7f\x7f", "F32": b"\xff\xff\x7f\x7f", "F16": b"\xff\x7b"}[dtype]
            data[int(b):int(e)] = unit * ((int(e) - int(b)) // len(unit))
            open(f, "wb").write(data)
PY
"$BIN/kpack" convert "$T/mnan" "$T/mnan.kpk" --quiet && ok "a checkpoint with extreme (finite) final norm weights converts" || notok "convert mnan"
expect_exit 1 "non-finite logits stop the run" "$BIN/krun" "$T/mnan.kpk" --ids $A --gen 4 --print-ids --quiet
expect_err "logits at position 6 are not finite" "the error says the logits are not finite, and where"
[ ! -s "$T/last.out" ] && ok "no token was printed from non-finite logits" || notok "tokens printed: $(cat "$T/last.out")"
expect_exit 1 "non-finite logits stop a budgeted run too" "$BIN/krun" "$T/mnan.kpk" --ids $A --gen 4 --mem 1G --pin 1 --quiet

# ---- prompts bounded by the context (issue 12.5) ----------------------------------
head -c 641 /dev/zero | tr '\0' 'a' >"$T/big.txt"
expect_exit 2 "a prompt file larger than --ctx x 64 bytes is refused before tokenizing" "$BIN/krun" "$T/m.kpk" --prompt-file "$T/big.txt" --ctx 10 --gen 1 --quiet
expect_err "641 bytes is more than a context of 10 positions" "says the file is too large for the context"
python3 -c 'print("ab " * 100000)' >"$T/long.txt"
expect_exit 2 "a prompt beyond 262144 positions without --ctx is refused with its token count" "$BIN/krun" "$T/m.kpk" --prompt-file "$T/long.txt" --gen 1 --quiet
expect_err "the prompt is [0-9]+ tokens, more than 262144 without --ctx" "names the token count"
expect_exit 2 "a prompt longer than --ctx is refused" "$BIN/krun" "$T/m.kpk" --ids $A,$B --gen 1 --ctx 8 --quiet
expect_err "the prompt \(11 tokens\) and --gen 1 do not fit the context of 8" "names the token count and the context"

# ---- long prompts are announced; progress only on a terminal -------------------------
"$BIN/krun" "$T/m.kpk" --ids $A,$B,$A --chunk 4 --gen 1 --mem 1G >/dev/null 2>"$T/lp.err"
grep -q "the prompt is 18 tokens: 5 blocks of up to 4 positions (the decoding layout), reading about .* (trunk .*, experts .*: [0-9]* expected reads)" "$T/lp.err" \
    && grep -q "the first block took" "$T/lp.err" \
    && ok "a prompt of several blocks is announced with its size, the bytes the cost model expects and a time estimate" || notok "announce: $(cat "$T/lp.err")"
grep -q "prefill:" "$T/lp.err" && notok "progress drawn into a pipe" || ok "no progress line in a pipe"
if command -v script >/dev/null; then
    script -qec "$BIN/krun $T/m.kpk --ids $A,$B,$A --chunk 4 --gen 1 --print-ids" /dev/null >"$T/tty.out" 2>&1
    grep -q "prefill: .*positions/s, ETA" "$T/tty.out" && ok "on a terminal the prefill shows positions, positions/s and ETA" || notok "no progress on a tty: $(head -c 300 "$T/tty.out")"
else
    skip "prefill progress on a terminal: no script(1)"
fi

# ---- loading a state stays within the budget -------------------------------------------------------
# A state of 30,000 positions (19 MB, written by grow_state.py, independently of krun) at the smallest
# budget for that context, under a memory cgroup of that size: --load-state, and the prefix cache
# loading it as a disk entry (krun --cache-dir, the code a server runs), read it straight into the
# session the plan counts.  Loading through a copy of the file peaked 13 MB above the budget here
# (47.1 MB at a 34.3 MB budget; 28.7 MB read straight in).
if [ -n "$NOT_KRUNS_MEMORY" ]; then
    skip "state loads within the budget: $NOT_KRUNS_MEMORY"
else
    "$BIN/krun" "$T/m.kpk" --ids 1,2,3 --gen 0 --save-state "$T/small.krs" --quiet >/dev/null &&
        python3 "$TOP/tests/cli/grow_state.py" "$T/small.krs" "$T/big.krs" 30000 >"$T/big.ids" || notok "grow_state.py"
    BIG=$(cat "$T/big.ids")
    # the reference: the continuation from that state, without a limit
    "$BIN/krun" "$T/m.kpk" --load-state "$T/big.krs" --gen 2 --ctx 30016 --print-ids --quiet >"$T/big.ref" 2>"$T/big.err" || notok "--load-state of 30,000 positions: $(head -c 300 "$T/big.err")"
    "$BIN/krun" "$T/m.kpk" --ids $BIG,5,6 --gen 2 --ctx 30016 --mem 4096 --cache-dir "$T/bigc" --quiet >/dev/null 2>"$T/bigm.err"
    lim=$(sed -n 's/.*the minimum .* (\([0-9]*\) bytes)$/\1/p' "$T/bigm.err")
    # the entry as the prefix cache names it: the XXH3-64 of its ids, its positions, its logits
    name=$(python3 -c '
import ctypes, struct, sys
x = ctypes.CDLL("libxxhash.so.0"); x.XXH3_64bits.restype = ctypes.c_uint64; x.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
ids = [int(t) for t in open(sys.argv[1]).read().split(",")]; b = struct.pack(f"<{len(ids)}I", *ids)
print("%016x-%d-l.krs" % (x.XXH3_64bits(b, len(b)), len(ids)))' "$T/big.ids")
    "$BIN/krun" "$T/m.kpk" --ids 1,2,3 --gen 0 --cache-dir "$T/bigc" --quiet >/dev/null && d=$(echo "$T"/bigc/k3-*) && [ -d "$d" ] \
        && cp "$T/big.krs" "$d/$name" || notok "the cache directory"
    big_run() {   # NAME ARGS...: krun under a cgroup of $lim bytes at --mem $lim; ok when within it
        local what=$1 rc peak; shift
        cg_run $lim "$BIN/krun" "$T/m.kpk" "$@" --gen 2 --ctx 30016 --mem $lim --json "$T/bigr.json" --print-ids --quiet >"$T/bigr.out" 2>"$T/bigr.err"
        rc=$?
        [ $rc -eq 99 ] && { skip "$what within the budget: no writable cgroup v1/v2 memory controller here"; return; }
        peak=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["peak_rss_bytes"])' "$T/bigr.json" 2>/dev/null || echo 0)
        [ $rc -eq 0 ] && [ "$peak" -gt 0 ] && [ "$peak" -le "$lim" ] && cmp -s "$T/big.ref" "$T/bigr.out" && python3 - "$T/bigr.json" <<'PY' \
            && ok "$what, a 19 MB state, under a cgroup limit of $lim bytes: peak RSS $peak <= --mem, the ids == the state loaded without a limit" \
            || notok "$what within the budget: rc $rc, peak $peak, limit $lim: $(head -c 300 "$T/bigr.err")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["prefix_cache"] is None or j["prefix_cache"]["cached_positions"] == 30000, j["prefix_cache"]
PY
    }
    big_run "--load-state" --load-state "$T/big.krs"
    big_run "a prefix-cache entry on disk" --ids $BIG --cache-dir "$T/bigc"
    # a server started on that directory: its first request (the 30,000 ids as a completions prompt)
    # starts from the file; the server's peak RSS (VmHWM) stays within --mem
    SLOW=1; . "$(dirname "$0")/serve_lib.sh"
    "$BIN/krun" serve "$T/m.kpk" --mem 4096 --ctx 30016 --max-seqs 1 --cache-dir "$T/bigc" --port 0 >/dev/null 2>"$T/bigsm.err"
    lim=$(sed -n 's/.*the minimum .* (\([0-9]*\) bytes)$/\1/p' "$T/bigsm.err")
    if start bigserve "$T/m.kpk" --mem $lim --ctx 30016 --max-seqs 1 --cache-dir "$T/bigc"; then
        py "$T/big.ids" "$T/big.ref" <<'PY' >"$T/bigs.out" 2>&1
import json, sys, urllib.request
port, ids = sys.argv[1], [int(t) for t in open(sys.argv[2]).read().split(",")]
want = [int(t) for t in open(sys.argv[3]).read().split()]
body = {"model": "m", "prompt": ids, "max_tokens": 2, "temperature": 0, "return_token_ids": True, "ignore_eos": True}
r = json.load(urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                                          {"Content-Type": "application/json"}), timeout=300))
u = r["usage"]
assert u["prompt_tokens_details"]["cached_tokens"] == 30000 and u["prompt_tokens"] == 30000, u
PY
        rc=$?
        hwm=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB$/\1/p' /proc/$PID/status 2>/dev/null); hwm=$((${hwm:-0} * 1024))
        stop
        [ $rc -eq 0 ] && [ "$hwm" -gt 0 ] && [ "$hwm" -le "$lim" ] \
            && ok "krun serve on that directory: the first request starts from the 19 MB entry (30,000 positions cached); peak RSS $hwm <= --mem $lim" \
            || notok "krun serve loading the entry: rc $rc, VmHWM $hwm, --mem $lim: $(head -c 300 "$T/bigs.out") $(tail -c 300 "$T/bigserve.err")"
    fi
fi

# ---- out of memory: its own message and exit code -----------------------------------
if [ -n "$NOT_KRUNS_MEMORY" ]; then
    skip "out of memory under an address-space limit: $NOT_KRUNS_MEMORY"
else
    (ulimit -v 1500000; exec "$BIN/krun" "$T/m.kpk" --ids $A --gen 2 --ctx 100000000 --quiet) >"$T/oom.out" 2>"$T/oom.err"
    rc=$?
    [ $rc -eq 3 ] && grep -q "out of memory" "$T/oom.err" && ! grep -qi "damaged" "$T/oom.err" \
        && ok "out of memory: exit 3 and says so ($(head -c 120 "$T/oom.err"))" || notok "out of memory: rc $rc: $(cat "$T/oom.err")"
fi
finish
