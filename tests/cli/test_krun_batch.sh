#!/usr/bin/env bash
# krun batch (docs/BATCH.md): a mixed batch (chat and completions, greedy and sampled, with and
# without seeds, lengths 1..40, stop strings, a request the API refuses, lines that are not
# requests) gives one line per request in input order in vLLM run-batch's shape; every request's
# body equals krun serve's for the same body run alone; the output is the same bytes at any
# --max-seqs and thread count; kill -9 at random moments and the same command continues to the
# same bytes (BATCH_KILLS times; `make soak` runs 30), never leaving a half-written OUT and never
# running a recorded request again; a torn journal tail; a finished OUT (--force); a second
# process (lock); another job's journal, and one of another model of the same size; duplicate custom_ids; a
# damaged model (exit 1, resumable); states paged to disk (--state-dir): the same bytes, a damaged state
# file (exit 1, resumable), paged unasked when the budget holds the states only so, RSS under a cgroup limit.
. "$(dirname "$0")/lib.sh"
BT="$TOP/tests/cli/batch_tool.py"
export PYTHONPATH="$TOP/tests/cli${PYTHONPATH:+:$PYTHONPATH}"
SLOW=1; [ -n "${KPK_SANITIZED:-}" ] && SLOW=5
KILLS=${BATCH_KILLS:-3}

TOK="$K3_SHARED/fixtures/tokenizer/tiktoken.model"
if [ -f "$TOK" ]; then
    SYNTH=(--geometry tiny --layers 3 --experts 4 --topk 2 --tokenizer "$TOK"); SEED=2
    CHAT=chat
else
    skip "chat requests: the real tokenizer $TOK is absent (a byte tokenizer has no chat markers)"
    SYNTH=(--geometry tiny); SEED=21
    CHAT=plain
fi
"$BIN/k3synth" "$T/m" "${SYNTH[@]}" --seed $SEED --quiet >/dev/null 2>"$T/err" || { notok "k3synth: $(cat "$T/err")"; finish; exit 1; }
"$BIN/kpack" convert "$T/m" "$T/m.kpk" --quiet && rm -rf "$T/m" || { notok "convert"; finish; exit 1; }
M="$T/m.kpk"
python3 "$BT" make "$T/in.jsonl" $CHAT
B=("$BIN/krun" batch "$M" "$T/in.jsonl")
COMMON=(--ctx 512 --seed 9 --created 1000)

# ---- one uninterrupted run: shape, order, errors -------------------------------------------------
expect_exit 0 "krun batch on a mixed batch" "${B[@]}" "$T/a.jsonl" "${COMMON[@]}" --max-seqs 4 --json
cp "$T/last.out" "$T/a.summary"
fields=$(python3 "$BT" check "$T/in.jsonl" "$T/a.jsonl" 2>"$T/err") \
    && ok "one line per request, in input order, vLLM run-batch's shape; a bad line's error names its line" \
    || notok "output shape: $(tail -3 "$T/err")"
[ "$fields" = '{"bad-body": "body", "bad-url": "url", "line 6": "", "line 7": "custom_id"}' ] \
    && ok "bad lines name their field (custom_id, url, body; the line that is not JSON has none)" || notok "fields: $fields"
python3 - "$T" <<'PY' && ok "the refused request (max_tokens past --ctx: the message names krun batch's --ctx), stream:true and n:2 get 400 and an error body naming it; penalties, logprobs and a json_schema ran" || notok "refusals"
import json, sys
o = {x["custom_id"]: x for x in map(json.loads, open(sys.argv[1] + "/a.jsonl"))}
assert o["too-long"]["response"]["status_code"] == 400 and o["too-long"]["response"]["body"]["error"]["code"] == "context_length_exceeded"
assert o["too-long"]["response"]["body"]["error"]["message"].endswith("(krun batch --ctx)"), o["too-long"]
assert o["stream"]["response"]["status_code"] == 400 and o["stream"]["response"]["body"]["error"]["param"] == "stream"
assert o["cmpl-n"]["response"]["status_code"] == 400 and o["cmpl-n"]["response"]["body"]["error"]["param"] == "n"
assert o["cmpl-penalties"]["response"]["body"]["choices"][0]["logprobs"]["token_logprobs"], o["cmpl-penalties"]
if "chat-schema" in o:
    assert o["chat-schema"]["response"]["body"]["choices"][0]["message"]["content"].strip() in ('"red"', '"green"', '"blue"'), o["chat-schema"]
assert o["cmpl-one"]["response"]["body"]["usage"]["completion_tokens"] == 1
assert o["cmpl-ids-seed"]["response"]["body"]["choices"][0]["token_ids"], o["cmpl-ids-seed"]
assert all(x["response"]["body"]["created"] == 1000 for x in o.values() if x["response"] and x["response"]["status_code"] == 200)
PY
python3 - "$T/a.summary" <<'PY' && ok "--json: requests, done, failed, prompt and generated tokens, sweeps, bytes read, seconds, bytes per token" \
    || notok "--json summary: $(cat "$T/a.summary")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["ok"] and j["requests"] == j["done"] > 0 and j["resumed"] == 0 and j["failed"] >= 6, j
assert j["generated_tokens"] > 0 and j["prompt_tokens"] > 0 and 0 < j["sweeps"] < j["generated_tokens"], j
assert j["bytes_read"] >= 0 and j["seconds"] > 0 and "bytes_per_generated_token" in j, j
PY
[ ! -e "$T/a.jsonl.krun-journal" ] && ok "the journal is removed once OUT is written" || notok "journal left behind"

# bytes per generated token are the decoding sweeps' (a noticed bug counted the prompts' sweep and the
# model's first reads): 6 one-token prompts, 5 tokens each, at a budget that streams: every request
# starts in the first sweep (the engine waits for the batch's burst), then 4 sweeps only decode
if [ "$CHAT" = chat ]; then
    python3 -c 'import json
for i in range(6): print(json.dumps({"custom_id": "r%d" % i, "method": "POST", "url": "/v1/completions",
                                     "body": {"prompt": [100 + i], "max_tokens": 5, "temperature": 0, "ignore_eos": True}}))' >"$T/one.jsonl"
    "$BIN/krun" batch "$M" "$T/one.jsonl" "$T/one.out" --max-seqs 6 --ctx 16 --mem 64M --quiet --json >"$T/one.summary" 2>"$T/err" &&
        python3 - "$T/one.summary" <<'PY' && ok "--json: bytes_per_generated_token is the decoding-only sweeps' (4 sweeps of 6 sequences; the prompts' sweep apart), bytes_per_generated_token_all every byte's" || notok "decode counters: $(cat "$T/one.summary" "$T/err")"
import json, sys
j = json.load(open(sys.argv[1])); d = j["decode"]
assert j["sweeps"] == 5 and j["generated_tokens"] == 30, j
assert d["sweeps"] == 4 and d["generated_tokens"] == 24 and 0 < d["bytes_read"] < j["bytes_read"] and 0 < d["seconds"] <= j["seconds"], j
assert j["bytes_per_generated_token"] == d["bytes_read"] / 24 and j["bytes_per_generated_token_all"] == j["bytes_read"] / 30, j
PY
else
    skip "the decode counters: they are checked on the model with the real tokenizer (its budget)"
fi
grep -q $'\r' "$T/last.err" && notok "progress drawn into a pipe" || ok "no progress line in a pipe"
grep -q "krun batch: .*a.jsonl: [0-9]* of [0-9]* requests written" "$T/last.err" && ok "a summary line on stderr" || notok "summary line: $(cat "$T/last.err")"

# ---- each request as run alone by krun serve ---------------------------------------------------------
. "$(dirname "$0")/serve_lib.sh"
if start solo "$M" --max-seqs 1 --ctx 512 --ctx-strict --quiet; then      # krun batch refuses what exceeds --ctx
    n=$(python3 -c 'import sys, batch_tool as b; print(b.alone_vs_batch(int(sys.argv[1]), sys.argv[2], sys.argv[3], 9))' \
        "$PORT" "$T/in.jsonl" "$T/a.jsonl" 2>"$T/err") \
        && ok "every request ($n) has the body krun serve gives it alone (seeded, seedless with the job's seed, greedy, refused)" \
        || notok "batch differs from serve alone: $(tail -5 "$T/err")"
    stop
fi
ids=$(python3 -c 'import json,sys; print(",".join(map(str, [l for l in map(json.loads, open(sys.argv[1])) if l["custom_id"]=="cmpl-ids-seed"][0]["response"]["body"]["choices"][0]["token_ids"])))' "$T/a.jsonl")
[ "$ids" = "$("$BIN/krun" "$M" --ids 5,80,81,82,200,13,7 --gen 24 --temp 0.8 --seed 7 --print-ids --quiet --ignore-eos | head -c ${#ids} | tr ' \n' ',,' | sed 's/,$//')" ] \
    && ok "a sampled completion's ids equal krun's for the same prompt, temperature and seed" || notok "ids differ from krun: $ids"

# ---- the same bytes at any batching and thread count ----------------------------------------------------
for v in "--max-seqs 1" "--max-seqs 3 --threads 1" "--max-seqs 8 --chunk 5"; do
    rm -f "$T/b.jsonl"
    "${B[@]}" "$T/b.jsonl" "${COMMON[@]}" $v --quiet 2>"$T/err" && cmp -s "$T/a.jsonl" "$T/b.jsonl" \
        && ok "byte-identical OUT with $v" || notok "OUT differs with $v: $(head -c 300 "$T/err")"
done

# ---- states paged to disk (--state-dir; docs/BATCH.md, "States on disk") -------------------------------------
for v in "--max-seqs 4" "--max-seqs 3 --threads 1 --chunk 5" "--max-seqs 4 --mem 1G --io pread"; do
    rm -rf "$T/b.jsonl" "$T/sd"
    "${B[@]}" "$T/b.jsonl" "${COMMON[@]}" $v --state-dir "$T/sd" --json >"$T/b.summary" 2>"$T/err" && cmp -s "$T/a.jsonl" "$T/b.jsonl" \
        && grep -q "paged to $T/sd/krun-states" "$T/err" \
        && python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["state_bytes_read"] > 0 and j["state_bytes_written"] > 0, j' "$T/b.summary" \
        && ok "--state-dir ($v): the states read and written each sweep, OUT byte-identical to resident states" \
        || notok "--state-dir $v: $(head -c 400 "$T/err")"
done
[ ! -e "$T/sd" ] && ok "  the state file and the directory it made are removed at the end" || notok "state dir left: $(ls -la "$T/sd")"
# the bounded write-back of a state file too large to stay cached (issue 34.15; forced by the test hook): the
# same bytes (that paging's writes never wait behind other I/O: tests/root/test_statepage_io.sh)
rm -rf "$T/b.jsonl" "$T/sd"
KRUN_TEST_STATE_WINDOW_CACHE=1 "${B[@]}" "$T/b.jsonl" "${COMMON[@]}" --max-seqs 4 --state-dir "$T/sd" --quiet 2>"$T/err" && cmp -s "$T/a.jsonl" "$T/b.jsonl" \
    && ok "--state-dir, a window's worth of write-back at most (its oldest regions waited for and dropped): OUT byte-identical" \
    || notok "--state-dir, bounded write-back: $(head -c 400 "$T/err")"
# a killed run's stale file is scratch: truncated and reused
mkdir -p "$T/sd"; head -c 300000 /dev/urandom >"$T/sd/krun-states"
rm -f "$T/b.jsonl"
"${B[@]}" "$T/b.jsonl" "${COMMON[@]}" --max-seqs 4 --state-dir "$T/sd" --quiet 2>"$T/err" && cmp -s "$T/a.jsonl" "$T/b.jsonl" && [ -d "$T/sd" ] && [ ! -e "$T/sd/krun-states" ] \
    && ok "  a stale state file (a killed run's) is overwritten safely: the same bytes; the file removed, the user's directory kept" \
    || notok "stale state file: $(head -c 300 "$T/err")"
: >"$T/sd/krun-states"
flock "$T/sd/krun-states" sleep 60 & LOCKER=$!
for _ in $(seq $((200 * SLOW))); do flock -n "$T/sd/krun-states" true || break; sleep 0.05; done
expect_exit 2 "  a second krun on the same state file is refused" "${B[@]}" "$T/b2.jsonl" "${COMMON[@]}" --max-seqs 4 --state-dir "$T/sd"
expect_err "another krun is using this state file" "  and the message says so"
kill $LOCKER 2>/dev/null; wait $LOCKER 2>/dev/null
rm -rf "$T/sd" "$T/b2.jsonl.krun-journal"
# a byte of the state file flipped mid-run (the test hook): an error naming the file, slot and layer;
# nothing computed from it is recorded; the same command then finishes with the bytes of a clean run
rm -f "$T/i.jsonl" "$T/i.jsonl.krun-journal"
KRUN_TEST_STATE_FLIP=60 "${B[@]}" "$T/i.jsonl" "${COMMON[@]}" --max-seqs 4 --state-dir "$T/sd" >"$T/last.out" 2>"$T/last.err"; rc=$?
[ $rc -eq 1 ] && ok "a damaged state file stops the job (exit $rc)" || notok "damaged state file: exit $rc: $(head -c 300 "$T/last.err")"
expect_err "the sequences' state file is damaged: .*sd/krun-states: the state of session slot [0-9]+, layer [0-9]+, does not match its checksum" "  naming the state file (not the model), the slot and the layer"
[ ! -e "$T/i.jsonl" ] && [ -e "$T/i.jsonl.krun-journal" ] && ! grep -q "model_damaged\|checksum" "$T/i.jsonl.krun-journal" \
    && ok "  OUT not written; the journal keeps only requests computed before it, none from the damaged state" || notok "damaged state: OUT or journal"
"${B[@]}" "$T/i.jsonl" "${COMMON[@]}" --max-seqs 4 --state-dir "$T/sd" --quiet 2>"$T/err" && cmp -s "$T/a.jsonl" "$T/i.jsonl" \
    && ok "  the same command finishes, to the bytes of a run that was never damaged" || notok "after state damage: $(head -c 300 "$T/err")"
# paging only when needed: 8 layers (a window of 3 KDA + 1 MLA of 8), --ctx 65536 (MLA rows weigh), a budget between
"$BIN/k3synth" "$T/m8" --geometry tiny --seed 2 --layers 8 --experts 4 --topk 2 ${TOK:+--tokenizer "$TOK"} --quiet >/dev/null 2>&1 \
    && "$BIN/kpack" convert "$T/m8" "$T/m8.kpk" --quiet && rm -rf "$T/m8" || notok "k3synth 8 layers"
P8=(--ctx 65536 --seed 9 --created 1000 --max-seqs 4)
"$BIN/krun" "$T/m8.kpk" --plan --mem 4G --ctx 65536 --max-seqs 4 --json "$T/p.json" >/dev/null
res=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["minimum_bytes"])' "$T/p.json")
"$BIN/krun" "$T/m8.kpk" --plan --mem 4G --ctx 65536 --max-seqs 4 --state-dir "$T/nothing" --json "$T/p.json" >/dev/null
pag=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["states_paged"] and j["state_window_bytes"] > 0 and j["state_read_bytes_per_sweep"] > 0; print(j["minimum_bytes"])' "$T/p.json")
mid=$(( (res + pag) / 2 ))
[ "${pag:-0}" -gt 0 ] && [ "$pag" -lt "${res:-0}" ] && [ ! -e "$T/nothing" ] && ok "--plan --state-dir: paged states need less memory ($pag < $res bytes); --json gives the window and the bytes per sweep" \
    || notok "plan with paging: $pag vs $res"
"$BIN/krun" batch "$T/m8.kpk" "$T/in.jsonl" "$T/r8.jsonl" "${P8[@]}" --mem 4G --quiet 2>"$T/err" || notok "8 layers resident: $(head -c 300 "$T/err")"
"$BIN/krun" batch "$T/m8.kpk" "$T/in.jsonl" "$T/p8.jsonl" "${P8[@]}" --mem $mid --json >"$T/p8.summary" 2>"$T/err" \
    && grep -q "paged to $T/p8.jsonl.krun-states/krun-states" "$T/err" && cmp -s "$T/r8.jsonl" "$T/p8.jsonl" && [ ! -e "$T/p8.jsonl.krun-states" ] \
    && ok "a budget that holds 4 states only paged ($mid bytes): paged beside OUT unasked, the same bytes as resident, removed at the end" \
    || notok "paging when needed: $(grep -v '^  ' "$T/err" | head -c 500)"
if [ -z "$NOT_KRUNS_MEMORY" ]; then
    rm -f "$T/p8.jsonl"
    cg_run $mid "$BIN/krun" batch "$T/m8.kpk" "$T/in.jsonl" "$T/p8.jsonl" "${P8[@]}" --mem $mid --quiet --json >"$T/p8.summary" 2>"$T/err"; rc=$?
    if [ $rc -eq 99 ]; then skip "cgroup memory limit: no writable cgroup v1/v2 memory controller here"
    else
        peak=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["peak_rss_bytes"])' "$T/p8.summary" 2>/dev/null || echo 0)
        [ $rc -eq 0 ] && [ "$peak" -gt 0 ] && [ "$peak" -le $mid ] && cmp -s "$T/r8.jsonl" "$T/p8.jsonl" \
            && ok "  under a cgroup memory limit of the budget: completes, peak RSS $peak <= $mid, the same bytes" \
            || notok "paged under a cgroup limit: exit $rc, peak $peak: $(head -c 300 "$T/err")"
    fi
else
    skip "paged under a cgroup limit: $NOT_KRUNS_MEMORY"
fi
rm -f "$T/m8.kpk"

# ---- --max-seqs auto (the default): the fewest bytes per generated token within the budget ----------------------
rm -f "$T/b.jsonl"
"${B[@]}" "$T/b.jsonl" "${COMMON[@]}" --mem 64M 2>"$T/err" >/dev/null && cmp -s "$T/a.jsonl" "$T/b.jsonl" \
    && grep -qE "krun batch: [0-9]+ sequences per sweep \(--max-seqs auto, .*a decoding sweep reads ~.* per generated token \(one at a time: " "$T/err" \
    && ok "--max-seqs auto with a budget: says how many sequences and the bytes per sweep and per token; the same bytes" \
    || notok "--max-seqs auto: $(head -c 600 "$T/err")"
n=$(sed -n 's/^krun batch: \([0-9]*\) sequences per sweep.*/\1/p' "$T/err")
[ "${n:-0}" -gt 1 ] && ok "  it batches ($n sequences: a sweep's cost is shared)" || notok "auto chose ${n:-nothing}"

# ---- a finished OUT, --force, a second process, another job's journal, duplicates ---------------------------
expect_exit 2 "a finished OUT is not overwritten without --force" "${B[@]}" "$T/a.jsonl" "${COMMON[@]}"
expect_err "exists .*--force" "  and the message says --force"
cp "$T/a.jsonl" "$T/c.jsonl"
expect_exit 0 "--force replaces it" "${B[@]}" "$T/c.jsonl" "${COMMON[@]}" --force --quiet
cmp -s "$T/a.jsonl" "$T/c.jsonl" && ok "  with the same bytes" || notok "--force output differs"
: >"$T/d.jsonl.krun-journal"
flock "$T/d.jsonl.krun-journal" sleep 60 & LOCKER=$!
for _ in $(seq $((200 * SLOW))); do flock -n "$T/d.jsonl.krun-journal" true || break; sleep 0.05; done   # until it holds the lock
expect_exit 2 "a second krun batch on the same OUT is refused (its journal is locked)" "${B[@]}" "$T/d.jsonl" "${COMMON[@]}"
expect_err "being written by another krun batch" "  and the message says so"
kill $LOCKER 2>/dev/null; wait $LOCKER 2>/dev/null
rm -f "$T/d.jsonl.krun-journal"
printf 'krun-batch-journal 1 key=0123456789abcdef seed=1 created=1\n' >"$T/e.jsonl.krun-journal"
expect_exit 2 "a journal of another job is refused" "${B[@]}" "$T/e.jsonl" "${COMMON[@]}"
expect_err "belongs to another job.*--force" "  and the message says what to do"
expect_exit 0 "  --force starts this job over" "${B[@]}" "$T/e.jsonl" "${COMMON[@]}" --force --quiet
cmp -s "$T/a.jsonl" "$T/e.jsonl" && ok "  to the same bytes" || notok "restarted output differs"
head -3 "$T/in.jsonl" >"$T/dup.jsonl"; sed -n 2p "$T/in.jsonl" >>"$T/dup.jsonl"; sed -n 8p "$T/in.jsonl" | sed "s/bad-url/cmpl-greedy/" >>"$T/dup.jsonl"
expect_exit 2 "duplicate custom_ids are refused before anything runs" "$BIN/krun" batch "$M" "$T/dup.jsonl" "$T/dup.out"
expect_err 'custom_id "cmpl-greedy" is on lines 1, 5; .*\(2 lines repeat an earlier one\)' "  naming the id and its lines, a bad line's custom_id included"
[ ! -e "$T/dup.out" ] && [ ! -e "$T/dup.out.krun-journal" ] && ok "  and nothing is written" || notok "duplicates wrote something"
expect_exit 2 "krun batch without its arguments" "$BIN/krun" batch "$M"
expect_exit 2 "a sampling option is refused (sampling is each request's)" "${B[@]}" "$T/f.jsonl" --temp 0.5
expect_exit 0 "krun batch --help" "$BIN/krun" batch --help
grep -q "^usage: krun batch MODEL.kpk IN.jsonl OUT.jsonl" "$T/last.out" && grep -q "^Exit: 0" "$T/last.out" \
    && ok "--help: usage and exit codes" || notok "--help"

# ---- what is not a batch input, duplicate keys, the journal's trust boundary (issue 34.13) ---------------------------
expect_exit 2 "/dev/zero as the input is refused (it was: exit 0, an empty OUT)" "$BIN/krun" batch "$M" /dev/zero "$T/z.jsonl"
expect_err "/dev/zero is a character device, not a batch input" "  naming what it is"
: >"$T/empty.jsonl"; printf '\n  \n' >"$T/blank.jsonl"; printf '{"custom_id":"a"}\0\n' >"$T/nul.jsonl"
for f in empty blank nul; do
    expect_exit 2 "an input that is $f is refused" "$BIN/krun" batch "$M" "$T/$f.jsonl" "$T/z.jsonl"
done
expect_exit 2 "a directory as the input is refused" "$BIN/krun" batch "$M" "$T" "$T/z.jsonl"
[ ! -e "$T/z.jsonl" ] && [ ! -e "$T/z.jsonl.krun-journal" ] && ok "  and nothing is written for any of them" || notok "a refused input wrote something"
python3 - "$T/dk.jsonl" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write('{"custom_id": "dup-in-body", "method": "POST", "url": "/v1/completions", "body": {"prompt": "a", "max_tokens": 1, "max_tokens": 2}}\n')
    f.write('{"custom_id": "x", "custom_id": "y", "method": "POST", "url": "/v1/completions", "body": {"prompt": "a", "max_tokens": 1}}\n')
    f.write('{"custom_id": "fine", "method": "POST", "url": "/v1/completions", "body": {"prompt": "a", "max_tokens": 1}}\n')
PY
rm -f "$T/dk.out"
"$BIN/krun" batch "$M" "$T/dk.jsonl" "$T/dk.out" --quiet 2>"$T/err"
python3 - "$T/dk.out" <<'PY' && ok "a key twice in one object: the line's error says so (krun serve's rule), and keeps its custom_id when that appears once (it was: custom_id null)" \
    || notok "duplicate keys in a batch line: $(cat "$T/err")"
import json, sys
o = [json.loads(l) for l in open(sys.argv[1])]
assert o[0]["custom_id"] == "dup-in-body" and o[0]["response"] is None and "a key twice in one object" in o[0]["error"]["message"], o[0]
assert o[1]["custom_id"] is None and o[1]["error"], o[1]
assert o[2]["custom_id"] == "fine" and o[2]["response"]["status_code"] == 200, o[2]
PY
# the journal: whoever could write it could put outputs into OUT that the job never computed (a record's
# checksum finds damage, not forgery), so it is the owner's alone (0600), and one others can write is refused
rm -f "$T/tj.jsonl" "$T/tj.jsonl.krun-journal"
"${B[@]}" "$T/tj.jsonl" "${COMMON[@]}" --max-seqs 2 --quiet 2>/dev/null & pid=$!
for _ in $(seq 400); do [ "$(grep -c '' "$T/tj.jsonl.krun-journal" 2>/dev/null || echo 0)" -ge 2 ] && break; sleep 0.01; done
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
if [ -e "$T/tj.jsonl.krun-journal" ] && [ ! -e "$T/tj.jsonl" ]; then
    [ "$(stat -c %a "$T/tj.jsonl.krun-journal")" = 600 ] && ok "the journal is made writable by its owner alone (0600)" || notok "journal mode $(stat -c %a "$T/tj.jsonl.krun-journal")"
    chmod 666 "$T/tj.jsonl.krun-journal"
    expect_exit 2 "a journal its group or others can write is refused" "${B[@]}" "$T/tj.jsonl" "${COMMON[@]}" --max-seqs 2
    expect_err "writable by its group or others: anyone who can write a job's journal can put outputs into OUT .*chmod go-w" "  saying why and what to do"
    if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
        chmod 600 "$T/tj.jsonl.krun-journal"; chown nobody "$T/tj.jsonl.krun-journal"
        expect_exit 2 "a journal owned by another user is refused" "${B[@]}" "$T/tj.jsonl" "${COMMON[@]}" --max-seqs 2
        expect_err "tj.jsonl.krun-journal is owned by another user" "  saying so"
        chown 0 "$T/tj.jsonl.krun-journal"
    else
        skip "a journal owned by another user: not root here (chown)"
    fi
    chmod 600 "$T/tj.jsonl.krun-journal"
    "${B[@]}" "$T/tj.jsonl" "${COMMON[@]}" --max-seqs 2 --quiet 2>"$T/err" && cmp -s "$T/a.jsonl" "$T/tj.jsonl" \
        && ok "  made the owner's alone again, the same command continues to the same bytes" || notok "journal resume: $(head -c 300 "$T/err")"
else
    skip "the journal's mode: the job ended before it could be killed (a fast machine)"
fi

# ---- kill -9 at random moments: the same command continues to the same bytes --------------------------------
python3 "$BT" make "$T/big.jsonl" $CHAT 2
rm -f "$T/g.jsonl"
"$BIN/krun" batch "$M" "$T/big.jsonl" "$T/g.jsonl" "${COMMON[@]}" --max-seqs 2 --quiet --json >"$T/g.summary" 2>"$T/err" \
    || notok "uninterrupted big batch: $(cat "$T/err")"
t_full=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["seconds"])' "$T/g.summary")
bad=0; kills=0; runs=0; recomputed=0; torn=0
for i in $(seq "$KILLS"); do
    rm -f "$T/k.jsonl" "$T/k.jsonl.krun-journal"
    # every other job pages its states to disk: a kill leaves a stale state file, which the
    # continuing run reuses (the states are scratch: unfinished requests run again from the journal)
    KPAGE=(); [ $((i % 2)) -eq 0 ] && KPAGE=(--state-dir "$T/ksd")
    while :; do
        runs=$((runs + 1))
        before=$( [ -f "$T/k.jsonl.krun-journal" ] && grep -c '' "$T/k.jsonl.krun-journal" | awk '{print $1 - 1}' || echo 0)
        # a torn tail, as a power cut mid-append leaves it: cut off when the journal is opened
        if [ $((runs % 5)) -eq 0 ] && [ -s "$T/k.jsonl.krun-journal" ]; then printf '7 0123456789abcdef {"id":"half' >>"$T/k.jsonl.krun-journal"; torn=$((torn + 1)); fi
        "$BIN/krun" batch "$M" "$T/big.jsonl" "$T/k.jsonl" "${COMMON[@]}" --max-seqs 2 "${KPAGE[@]}" --quiet --json >"$T/k.summary" 2>"$T/k.err" &
        pid=$!
        sleep "$(python3 -c "import random; print(round(random.uniform(0.02, $t_full * 1.1 + 0.1), 3))")"
        if kill -9 $pid 2>/dev/null; then
            wait $pid 2>/dev/null
            kills=$((kills + 1))
            # OUT never exists half-written: absent, or complete
            if [ -e "$T/k.jsonl" ] && ! cmp -s "$T/g.jsonl" "$T/k.jsonl"; then bad=$((bad + 1)); fi
            [ -e "$T/k.jsonl" ] && [ ! -e "$T/k.jsonl.krun-journal" ] && break   # killed after the end
            continue
        fi
        wait $pid; rc=$?
        [ $rc -eq 0 ] || { bad=$((bad + 1)); echo "# run failed (exit $rc): $(head -c 300 "$T/k.err")"; break; }
        resumed=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["resumed"])' "$T/k.summary")
        [ "$resumed" -ge "$before" ] || recomputed=$((recomputed + 1))
        break
    done
    cmp -s "$T/g.jsonl" "$T/k.jsonl" || bad=$((bad + 1))
    ls "$T" | grep -q '^k.jsonl.tmp-' && bad=$((bad + 1))
done
[ $bad -eq 0 ] && [ $recomputed -eq 0 ] \
    && ok "$KILLS jobs killed -9 at random moments, every other one with its states paged ($kills kills, $runs runs, $torn torn journal tails): the same command continues; OUT byte-identical to the uninterrupted run, never half-written, no recorded request run again" \
    || notok "kill -9 and resume: $bad bad outcomes, $recomputed runs read back fewer records than the journal held ($kills kills)"

# ---- on a terminal: the progress line; SIGINT: stops, exit 130, the same command continues -------------------
printf '[{"wait": "requests, ", "timeout": %d}]' $((60 * SLOW)) >"$T/pty.json"
rm -f "$T/p.jsonl"
python3 "$TOP/tests/cli/chat_pty.py" "$T/pty.bin" "$T/pty.json" -- "$BIN/krun" batch "$M" "$T/big.jsonl" "$T/p.jsonl" "${COMMON[@]}" --max-seqs 2 \
    && python3 - "$T/pty.bin" <<'PY' && ok "on a terminal: a progress line (done/total requests, tokens/s, bytes/token, ETA), cleared at the end" \
    || notok "progress on a terminal: $(tr -d '\033' <"$T/pty.bin" | head -c 400)"
import re, sys
t = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
assert re.search(r"\r\x1b\[Kkrun batch: \d+/\d+ requests, \d+ tokens, [0-9.]+ tokens/s, ([0-9.]+ [kMG]?B|-)/token, ETA ", t), t[-600:]
PY
cmp -s "$T/g.jsonl" "$T/p.jsonl" && ok "  and the same OUT" || notok "OUT on a terminal differs"
rm -f "$T/s.jsonl"
"$BIN/krun" batch "$M" "$T/big.jsonl" "$T/s.jsonl" "${COMMON[@]}" --max-seqs 2 >/dev/null 2>"$T/s.err" &
pid=$!
# interrupt once 3 requests are recorded (the header + 3 lines): on a loaded machine that may take
# far longer than usual, so wait for it (up to 60 s x SLOW) rather than for a fixed time
for _ in $(seq $((1200 * SLOW))); do [ "$(grep -c '' "$T/s.jsonl.krun-journal" 2>/dev/null || echo 0)" -ge 4 ] && break; sleep 0.05; done
kill -INT $pid; wait $pid; rc=$?
[ $rc -eq 130 ] && grep -q "SIGINT: interrupted" "$T/s.err" && grep -q "the same command continues" "$T/s.err" && [ ! -e "$T/s.jsonl" ] \
    && ok "SIGINT stops the job: exit 130, says the same command continues, no OUT" || notok "SIGINT: exit $rc: $(cat "$T/s.err")"
# the journal names the model by its identity (set_id, config hash), not its size: another model of
# the same geometry (another seed: the same size, the same file name) is another job
mkdir -p "$T/other"
"$BIN/k3synth" "$T/other/m" "${SYNTH[@]}" --seed $((SEED + 1)) --quiet >/dev/null 2>"$T/err" &&
    "$BIN/kpack" convert "$T/other/m" "$T/other/m.kpk" --quiet && rm -rf "$T/other/m" || notok "the second model: $(cat "$T/err")"
cp "$T/s.jsonl.krun-journal" "$T/s.journal"
[ "$(stat -c %s "$M")" = "$(stat -c %s "$T/other/m.kpk")" ] && ! cmp -s "$M" "$T/other/m.kpk" \
    && ok "  (another model of the same size and name: $(stat -c %s "$M") bytes)" || notok "the second model's size differs: the case below proves nothing"
expect_exit 2 "  the same command on another model of the same size is refused (the journal is another model's)" \
    "$BIN/krun" batch "$T/other/m.kpk" "$T/big.jsonl" "$T/s.jsonl" "${COMMON[@]}" --max-seqs 2
expect_err "belongs to another job" "  and says so"
cmp -s "$T/s.journal" "$T/s.jsonl.krun-journal" && [ ! -e "$T/s.jsonl" ] && ok "  the journal untouched, no OUT" || notok "the refused run changed the journal"
"$BIN/krun" batch "$M" "$T/big.jsonl" "$T/s.jsonl" "${COMMON[@]}" --max-seqs 2 --quiet --json >"$T/s.summary" 2>"$T/s.err" && cmp -s "$T/g.jsonl" "$T/s.jsonl" \
    && python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["resumed"] >= 3, j' "$T/s.summary" \
    && ok "  the same command continues from the journal to the same bytes" || notok "resume after SIGINT: $(cat "$T/s.err")"

# ---- a damaged model: exit 1, nothing written, the journal kept; the same command finishes with a good file ----
corrupt_experts "$M" "$T/bad.kpk"
cp "$M" "$T/good.kpk"
cp "$T/bad.kpk" "$T/x.kpk"
expect_exit 1 "a damaged model stops the job (exit 1)" "$BIN/krun" batch "$T/x.kpk" "$T/in.jsonl" "$T/h.jsonl" "${COMMON[@]}" --model-name m
expect_err "damaged" "  naming the damage"
[ ! -e "$T/h.jsonl" ] && [ -e "$T/h.jsonl.krun-journal" ] && ok "  OUT not written, the journal kept" || notok "damaged: OUT or journal"
cp "$T/good.kpk" "$T/x.kpk"
expect_exit 0 "  the same command with a good file finishes" "$BIN/krun" batch "$T/x.kpk" "$T/in.jsonl" "$T/h.jsonl" "${COMMON[@]}" --model-name m
cmp -s "$T/a.jsonl" "$T/h.jsonl" && ok "  to the bytes of a run that was never damaged" || notok "output after damage differs"

finish
