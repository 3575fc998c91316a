#!/usr/bin/env bash
# The prefix cache (docs/RUNTIME.md §9) never changes an answer, and reuses what it should:
#  - a multi-turn conversation through the official openai npm client (every request sends the
#    whole conversation again), cache on vs --no-cache: every request bit-identical; each request's
#    cached_tokens is exactly the longest kept state that prefixes it (the end of an earlier prompt,
#    reply or preamble), and no request re-reads a position an earlier one ran (counted); thinking
#    on and off; a restart in the middle (the entries on disk used);
#  - damaged, truncated, foreign-model and foreign-version entries: one warning each, removed,
#    never used, the answer unchanged;
#  - two requests sharing a system preamble: the second starts at its end (a snapshot taken
#    inside a forward block);
#  - eviction under a tiny --cache-size: the directory stays within it, answers unchanged;
#  - two server processes on one directory, requests with shared prefixes in parallel;
#  - krun and krun chat with --cache-dir: a fixed system prompt across runs is read once.
. "$(dirname "$0")/lib.sh"
export PYTHONPATH="$TOP/tests/cli:$TOP/tests/ref${PYTHONPATH:+:$PYTHONPATH}"
SLOW=1; [ -n "${KPK_SANITIZED:-}" ] && SLOW=5
TOK="$K3_SHARED/fixtures/tokenizer/tiktoken.model"
NODE_CLIENT="$TOP/tests/node/prefix_chat.mjs"
[ -f "$TOK" ] || { skip "the prefix cache tests need the real tokenizer ($TOK)"; finish; exit 0; }
"$BIN/k3synth" "$T/rt" --geometry tiny --seed 2 --layers 3 --experts 4 --topk 2 --tokenizer "$TOK" --quiet >/dev/null \
    && "$BIN/kpack" convert "$T/rt" "$T/rt.kpk" --quiet && rm -rf "$T/rt" || { notok "real-tokenizer model"; finish; exit 1; }
. "$(dirname "$0")/serve_lib.sh"

# health NAME: the server's /health prefix_cache object as JSON, in $T/NAME.health
health() { curl -s "http://127.0.0.1:$PORT/health" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["prefix_cache"]))' >"$T/$1.health"; }
SYS="You are a terse assistant. Answer every question in one short sentence, and never use lists."
# the preamble's length: the system message rendered alone (thinking off: no effort message)
printf '{"messages":[{"role":"system","content":"%s"}],"reasoning_effort":"none"}' "$SYS" >"$T/pre.json"
PRE=$("$BIN/krun" tokenize "$T/rt.kpk" --chat "$T/pre.json" --no-generation-prompt | tr ',' '\n' | wc -l)

# ---- a conversation through the openai npm client: cache on (restarted in the middle) vs off -------------
have_node=0
command -v node >/dev/null && [ -d "$TOP/tests/node/node_modules/openai" ] && have_node=1
if [ $have_node = 1 ]; then
    python3 - "$T" "$SYS" <<'PY'
import json, sys
d, system = sys.argv[1:3]
users = ["Hello, who are you?", "What is the capital of France?", "And of Italy?", "Which one is larger?", "Thanks, goodbye."]
plain = {"system": system, "users": users, "params": {"max_tokens": 6, "temperature": 0, "reasoning_effort": "none"},
         "per_turn": [{}, {}, {"temperature": 0.9, "seed": 7}, {}, {}]}
think = {"users": users[:4], "params": {"max_tokens": 7, "temperature": 0}}
for name, conv in (("on", plain), ("off", plain), ("think_on", think), ("think_off", think)):
    json.dump(conv, open(f"{d}/{name}.conv", "w"))
PY
    chat() { PREFIX_TIMEOUT_S=$((120 * SLOW)) node "$NODE_CLIENT" "http://127.0.0.1:$PORT/v1" rt "$@" 2>>"$T/node.err"; }
    start on "$T/rt.kpk" --max-seqs 2 --ctx 1024 --chunk 16 --cache-dir "$T/dir" && {
        chat "$T/on.conv" 3 && chat "$T/think_on.conv" 4
        stop
        [ "$RC" -eq 0 ] || notok "the first server: exit $RC: $(tail -3 "$T/on.err")"
    }
    # a restart in the middle: the new process has only what the first left on disk
    start on2 "$T/rt.kpk" --max-seqs 2 --ctx 1024 --chunk 16 --cache-dir "$T/dir" && {
        chat "$T/on.conv" 2 --stream-last
        health on2
        stop
    }
    start off "$T/rt.kpk" --max-seqs 2 --ctx 1024 --chunk 16 --no-cache && {
        chat "$T/off.conv" 5 --stream-last && chat "$T/think_off.conv" 4
        health off
        stop
    }
    python3 - "$T" "$PRE" <<'PY' && ok "openai npm client, 5 turns (thinking off, one at temperature 0.9), the server restarted after turn 3: every request bit-identical with and without the cache (ids, text, finish, usage)" \
        || notok "the conversation differs with the cache"
import sys, prefix_check as pc
d = sys.argv[1]
on, off = pc.load(f"{d}/on.conv"), pc.load(f"{d}/off.conv")
bad = pc.same(on["results"], off["results"])
assert not bad and len(on["results"]) == 5, ("differ at", bad)
assert on["streamed_again"]["content"] == off["streamed_again"]["content"] == on["results"][-1]["content"]
PY
    python3 - "$T" "$PRE" <<'PY' && ok "cached_tokens == the longest kept state that prefixes each prompt (end of a prompt, of a reply, of the preamble), across the restart; 0 re-read positions on every turn; the log lines say the same" \
        || notok "cached_tokens or re-read positions"
import json, sys, prefix_check as pc
d, pre = sys.argv[1], int(sys.argv[2])
on, off = pc.load(f"{d}/on.conv"), pc.load(f"{d}/off.conv")
r = on["results"]
got = [x["usage"]["prompt_tokens_details"]["cached_tokens"] for x in r]
want = pc.expected_cached(r, [pre] * len(r))
assert got == want, (got, want)
assert all(x["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 for x in off["results"]), "--no-cache reported cached tokens"
assert pc.reread(r) == [0] * len(r), pc.reread(r)
# what served each turn: (b) where the reply came back as generated, else (a)
rt = pc.round_trips(r)
kinds = ["(b) reply" if rt[n - 1] else "(a) prompt" for n in range(1, len(r))]
print("# turns 2..5 started from:", kinds, "cached", got[1:], "of", [x["usage"]["prompt_tokens"] for x in r[1:]])
assert any(rt), "no reply came back as generated: the (b) path was not exercised"
s = on["streamed_again"]["usage"]
assert s["prompt_tokens_details"]["cached_tokens"] == s["prompt_tokens"] == r[-1]["usage"]["prompt_tokens"], s
h = json.load(open(f"{d}/on2.health"))
assert h["hits_disk"] >= 1 and h["damaged"] == 0 and h["dir"], h
# the request log lines say the same: "N prompt (M cached)", in order, across both servers
import re
logged = [tuple(map(int, m)) for f in ("on", "on2") for m in re.findall(r"(\d+) prompt \((\d+) cached\)", open(f"{d}/{f}.err").read())]
conv = [(x["usage"]["prompt_tokens"], x["usage"]["prompt_tokens_details"]["cached_tokens"]) for x in r]
assert logged[:3] == conv[:3] and logged[-3:-1] == conv[3:], (logged, conv)
PY
    python3 - "$T" <<'PY' && ok "thinking on (reasoning_content dropped by the client): bit-identical with and without the cache; each turn starts at the end of the previous prompt; 0 re-read positions" \
        || notok "thinking-mode conversation"
import sys, prefix_check as pc
d = sys.argv[1]
on, off = pc.load(f"{d}/think_on.conv"), pc.load(f"{d}/think_off.conv")
r = on["results"]
assert not pc.same(r, off["results"]), pc.same(r, off["results"])
got = [x["usage"]["prompt_tokens_details"]["cached_tokens"] for x in r]
assert got == pc.expected_cached(r, [0] * len(r)), got
assert all(g > 0 for g in got[1:]) and pc.reread(r) == [0] * len(r), (got, pc.reread(r))
PY
else
    skip "the openai npm client is not installed (npm ci --prefix tests/node): the conversation through it"
fi

# ---- damaged entries: warned once, removed, never used ------------------------------------------------------
# The request: a conversation's prompt that the cache holds whole (its entry HASH-N-l.krs), asked of a
# fresh server (nothing in RAM), after the entry file was damaged in one of four ways.
python3 - "$T" "$SYS" <<'PY'
import json, sys
d, system = sys.argv[1:3]
req = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "Name three rivers in Europe."}],
       "max_tokens": 8, "temperature": 0, "reasoning_effort": "none", "return_token_ids": True}
json.dump(req, open(f"{d}/dreq.json", "w"))
PY
ask() {   # ask NAME: the request of $T/dreq.json to the server, the reply in $T/NAME.json
    curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d @"$T/dreq.json" >"$T/$1.json"
}
start dref "$T/rt.kpk" --max-seqs 2 --ctx 1024 --chunk 16 --no-cache && { ask ref; stop; }
start dmake "$T/rt.kpk" --max-seqs 2 --ctx 1024 --chunk 16 --cache-dir "$T/ddir" && { ask made; stop; }
for how in flip truncate foreign-model foreign-version; do
    # (tests/ref/kpk.py's XXH3, which needs Debian's numpy: /usr/bin/python3)
    /usr/bin/python3 - "$T" "$how" <<'PY' || notok "damaging the entry ($how)"
import glob, json, os, struct, sys
from kpk import xxh3
d, how = sys.argv[1:3]
ids = json.load(open(f"{d}/ref.json"))["prompt_token_ids"]
name = "%016x-%d-l.krs" % (xxh3(struct.pack("<%di" % len(ids), *ids)), len(ids))
path = glob.glob(f"{d}/ddir/k3-*/{name}")[0]       # the entry's name is the XXH3 of its ids (docs/RUNTIME.md §9)
b = bytearray(open(path, "rb").read())
if how == "flip":
    b[len(b) // 2] ^= 0x10                       # a bit of the layers: the payload checksum fails
elif how == "truncate":
    b = b[: len(b) - 100]
else:
    if how == "foreign-model":
        b[16] ^= 1                               # set_id: another model file
    else:
        b[8:10] = struct.pack("<H", 2)           # major 2
    b[152:160] = struct.pack("<Q", xxh3(bytes(b[:152])))   # a header that is whole
open(path, "wb").write(b)
open(f"{d}/victim", "w").write(path)
open(f"{d}/victim.bytes", "wb").write(b)
PY
    start "d_$how" "$T/rt.kpk" --max-seqs 2 --ctx 1024 --chunk 16 --cache-dir "$T/ddir" && { ask "$how"; health "d_$how"; stop; }
    python3 - "$T" "$how" <<'PY' && ok "a $how entry: warned once, removed, never used; the answer is the same" || notok "a $how entry"
import json, os, sys
d, how = sys.argv[1:3]
ref, got = json.load(open(f"{d}/ref.json")), json.load(open(f"{d}/{how}.json"))
victim = open(f"{d}/victim").read()
log = open(f"{d}/d_{how}.err").read()
warns = [l for l in log.splitlines() if "prefix cache:" in l]
assert len(warns) == 1 and os.path.basename(victim) in warns[0] and "removed, never used" in warns[0], warns
why = {"flip": "checksum mismatch", "truncate": "bytes where an entry", "foreign-model": "another model file",
       "foreign-version": "version 2"}[how]
assert why in warns[0], warns[0]
assert got["choices"][0]["token_ids"] == ref["choices"][0]["token_ids"] and got["choices"][0]["message"] == ref["choices"][0]["message"]
n = len(ref["prompt_token_ids"])
assert got["usage"]["prompt_tokens_details"]["cached_tokens"] < n, got["usage"]
h = json.load(open(f"{d}/d_{how}.health"))
assert h["damaged"] == 1, h
# removed: the request made the entry again, whole (the next variant loads it), where a file left in
# place would have stayed as it was (an entry is never rewritten)
assert open(victim, "rb").read() != open(f"{d}/victim.bytes", "rb").read()
PY
done
grep -h "prefix cache:" "$T"/d_*.err | head -4 | sed 's/^/# /'

# ---- two requests sharing a preamble; eviction under a tiny --cache-size --------------------------------------
# The requests (thinking off, the same long system message, then different questions), each asked of
# a --no-cache server first for the reference.
python3 - "$T" "$SYS" <<'PY'
import json, sys
d, system = sys.argv[1:3]
qs = ["Why is the sky blue?", "How far away is the Moon?", "What is a prime number?", "Who wrote Hamlet?",
      "How do bees make honey?", "What is the speed of light?", "Why do cats purr?", "What is rust made of?"]
reqs = [{"path": "/v1/chat/completions", "body": {"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
         "max_tokens": 6, "temperature": 0, "reasoning_effort": "none", "return_token_ids": True}} for q in qs]
json.dump(reqs, open(f"{d}/shared.json", "w"))
PY
# run_reqs NAME: the requests of $T/shared.json one after another; replies in $T/NAME.out (a JSON list);
# with a directory to watch, its entries' bytes after each request in $T/NAME.sizes
run_reqs() {
    python3 - "$PORT" "$T/shared.json" "$T/$1.out" "${2:-}" <<'PY'
import glob, json, os, sys, serve_client as c
port, reqs, out, watch = int(sys.argv[1]), json.load(open(sys.argv[2])), sys.argv[3], sys.argv[4]
res, sizes = [], []
for r in reqs:
    s, _, j = c.post(port, r["path"], r["body"])
    res.append(j)
    if watch:
        # (the server's writer thread may evict a file between the listing and its size: it counts 0)
        size = 0
        for f in glob.glob(watch + "/k3-*/*.krs"):
            try:
                size += os.path.getsize(f)
            except FileNotFoundError:
                pass
        sizes.append(size)
json.dump({"replies": res, "sizes": sizes}, open(out, "w"))
PY
}
start sref "$T/rt.kpk" --max-seqs 2 --ctx 1024 --chunk 16 --no-cache && { run_reqs sref; stop; }
start shared "$T/rt.kpk" --max-seqs 3 --ctx 1024 --chunk 16 && { run_reqs shared; health shared; stop; }
python3 - "$T" "$PRE" <<'PY' && ok "requests sharing a system preamble ($PRE tokens, ending inside a 16-position block): each after the first starts at its end, bit-identical to --no-cache" \
    || notok "shared preamble"
import json, sys
d, pre = sys.argv[1], int(sys.argv[2])
ref, got = json.load(open(f"{d}/sref.out"))["replies"], json.load(open(f"{d}/shared.out"))["replies"]
for a, b in zip(ref, got):
    assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"] and a["prompt_token_ids"] == b["prompt_token_ids"], (a, b)
cached = [b["usage"]["prompt_tokens_details"]["cached_tokens"] for b in got]
assert cached == [0] + [pre] * (len(got) - 1), (cached, pre)
assert pre % 16 != 0, "the preamble ends a block: the snapshot inside a block is not exercised"
h = json.load(open(f"{d}/shared.health"))
assert h["hits"] == len(got) - 1 and h["positions_reused"] == pre * (len(got) - 1) and h["dir"] is None, h
assert 0 < h["entries_ram"] <= 3 and h["bytes_ram"] > 0 and h["entries_disk"] == 0, h      # in the 3 slots, nowhere else
PY
# eviction: room for about two entries
ENTRY=$(python3 -c 'import glob,os,sys; print(max(os.path.getsize(f) for f in glob.glob(sys.argv[1] + "/k3-*/*.krs")))' "$T/ddir")
SIZE=$((ENTRY * 5 / 2))
start evict "$T/rt.kpk" --max-seqs 2 --ctx 1024 --chunk 16 --cache-dir "$T/edir" --cache-size $SIZE && { run_reqs evict "$T/edir"; health evict; stop; }
python3 - "$T" "$SIZE" <<'PY' && ok "--cache-size $SIZE (about 2.5 entries): the directory stays within it after every request, the least recently used out; answers unchanged" \
    || notok "eviction"
import json, sys
d, size = sys.argv[1], int(sys.argv[2])
ref, got = json.load(open(f"{d}/sref.out"))["replies"], json.load(open(f"{d}/evict.out"))
for a, b in zip(ref, got["replies"]):
    assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"], (a, b)
assert got["sizes"] and max(got["sizes"]) <= size and min(got["sizes"]) > 0, (got["sizes"], size)
h = json.load(open(f"{d}/evict.health"))
assert h["evicted"] >= 3 and h["bytes_disk"] <= size and h["write_failed"] == 0 and h["damaged"] == 0, h
PY
# which files stayed: least recently USED out, not least recently written -- the preamble's entry,
# written by the first request, is used by every later one and stays; the first request's prompt
# entry goes; the last request's stays
/usr/bin/python3 - "$T" "$PRE" <<'PY' && ok "eviction is by last use: the preamble's entry (written first, used by every request) stays, the first prompt's goes, the last prompt's stays" \
    || notok "eviction order"
import glob, json, os, struct, sys
from kpk import xxh3
d, pre = sys.argv[1], int(sys.argv[2])
name = lambda ids, l: "%016x-%d%s.krs" % (xxh3(struct.pack("<%di" % len(ids), *ids)), len(ids), "-l" if l else "")
have = {os.path.basename(f) for f in glob.glob(f"{d}/edir/k3-*/*.krs")}
ids = [r["prompt_token_ids"] for r in json.load(open(f"{d}/evict.out"))["replies"]]
assert name(ids[0][:pre], 0) in have, ("the preamble's entry was evicted", have)
assert name(ids[0], 1) not in have and name(ids[-1], 1) in have, have
PY

# ---- the directory replaced under a running server (issue 34.10) ---------------------------------------------
# Entries are written beneath the directory opened at start, never through its path: a symbolic link put in
# the path's place, or the directory removed and made again, gets nothing, and the old directory stays
# within --cache-size.  Before: 24 files, 17 MB went to the link's target with --cache-size 1500K, 0 evicted.
for how in symlink remake; do
    rm -rf "$T/rdir" "$T/rdir.old" "$T/elsewhere"; mkdir -p "$T/elsewhere"
    start "r_$how" "$T/rt.kpk" --max-seqs 2 --ctx 1024 --chunk 16 --cache-dir "$T/rdir" --cache-size $SIZE && {
        T="$T" SIZE=$SIZE HOW=$how py <<'PY' && ok "the cache directory replaced under krun serve ($how): 12 requests write nothing where its path now leads; the directory opened at start stays within --cache-size" \
            || notok "cache directory replaced ($how)"
import sys, os, glob, json, time, serve_client as c
port, d = int(sys.argv[1]), os.environ["T"]
def ask(i):
    st, _, b = c.request(port, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Question %d: what is %d + %d?" % (i, i, i)}],
                                                                 "max_tokens": 3, "temperature": 0, "reasoning_effort": "none"})
    assert st == 200, (st, b)
ask(0)
time.sleep(0.5)
sub = os.path.basename(glob.glob(d + "/rdir/k3-*")[0])      # the model's directory in it, made again where the path now leads
if os.environ["HOW"] == "symlink":
    os.rename(d + "/rdir", d + "/rdir.old"); os.symlink(d + "/elsewhere", d + "/rdir"); os.mkdir(d + "/elsewhere/" + sub)
else:
    os.rename(d + "/rdir", d + "/rdir.old"); os.mkdir(d + "/rdir"); os.mkdir(d + "/rdir/" + sub)
for i in range(1, 13): ask(i)
time.sleep(1)
h = c.health(port)["prefix_cache"]
stray = [f for f in glob.glob(d + "/elsewhere/**", recursive=True) + glob.glob(d + "/rdir/**", recursive=True) if os.path.isfile(f)]
kept = sum(os.path.getsize(f) for f in glob.glob(d + "/rdir.old/k3-*/*.krs"))
assert not stray, stray
assert h["written"] >= 12 and h["evicted"] >= 8 and kept <= int(os.environ["SIZE"]) and h["bytes_disk"] == kept, (h, kept)
PY
        stop
    }
done

# ---- two server processes on one directory ------------------------------------------------------------------------
# Both share $T/pdir (room for about four entries, so both evict), and the requests -- two rounds of
# the shared-preamble questions, in parallel, alternating between the servers -- share prefixes.
SIZE2=$((ENTRY * 4))
start p1 "$T/rt.kpk" --max-seqs 2 --ctx 1024 --chunk 16 --cache-dir "$T/pdir" --cache-size $SIZE2 && { P1=$PORT; PID1=$PID; }
start p2 "$T/rt.kpk" --max-seqs 2 --ctx 1024 --chunk 16 --cache-dir "$T/pdir" --cache-size $SIZE2 && { P2=$PORT; PID2=$PID; }
if [ -n "${P1:-}" ] && [ -n "${P2:-}" ]; then
    python3 - "$P1" "$P2" "$T" <<'PY' && ok "two servers on one --cache-dir, 16 requests in parallel (shared prefixes, both evicting): every answer == --no-cache" \
        || notok "two processes on one directory"
import json, sys, threading, serve_client as c
p1, p2, d = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
reqs = json.load(open(f"{d}/shared.json")) * 2
ref = json.load(open(f"{d}/sref.out"))["replies"] * 2
got = [None] * len(reqs)
def go(i):
    got[i] = c.post(p1 if i % 2 else p2, reqs[i]["path"], reqs[i]["body"])[2]
ts = [threading.Thread(target=go, args=(i,)) for i in range(len(reqs))]
for t in ts: t.start()
for t in ts: t.join()
bad = [i for i in range(len(reqs)) if got[i]["choices"][0]["token_ids"] != ref[i]["choices"][0]["token_ids"]]
assert not bad, bad
print("# cached per request:", [g["usage"]["prompt_tokens_details"]["cached_tokens"] for g in got])
PY
    PORT=$P1; health p1; PORT=$P2; health p2
    PID=$PID1; stop; RC1=$RC; PID=$PID2; stop
    python3 - "$T" "$SIZE2" <<'PY' && ok "two servers on one directory: no entry was ever found damaged, both wrote and evicted, within --cache-size when done" \
        || notok "two processes: $(grep -h 'prefix cache' "$T/p1.err" "$T/p2.err" | head -3)"
import glob, json, os, sys
d, size = sys.argv[1], int(sys.argv[2])
h = [json.load(open(f"{d}/p{i}.health")) for i in (1, 2)]
assert all(x["damaged"] == 0 and x["write_failed"] == 0 for x in h), h
assert sum(x["written"] for x in h) >= 4 and sum(x["evicted"] for x in h) >= 1, h
assert sum(os.path.getsize(f) for f in glob.glob(f"{d}/pdir/k3-*/*.krs")) <= size
assert not glob.glob(f"{d}/pdir/k3-*/*.tmp-*"), "temporary files left"
for i in (1, 2):
    assert "prefix cache:" not in open(f"{d}/p{i}.err").read()
PY
else
    notok "two servers on one directory: they did not start"
    [ -n "${PID1:-}" ] && kill $PID1 2>/dev/null; [ -n "${PID2:-}" ] && kill $PID2 2>/dev/null
fi

# ---- krun and krun chat with --cache-dir ---------------------------------------------------------------------------
A=5,80,81,82,200,13,7,9,9,9,40,41
# kN: the ids, the last prompt position's logits (.lg) and every generated token's (.gl)
kr() { local n=$1; shift; "$BIN/krun" "$T/rt.kpk" "$@" --json "$T/k$n.json" --dump-logits "$T/k$n.lg" --dump-gen-logits "$T/k$n.gl" --quiet >/dev/null; }
kr 0 --ids $A --gen 8
kr 1 --ids $A --gen 8 --cache-dir "$T/kdir"
kr 2 --ids $A --gen 8 --cache-dir "$T/kdir"
G=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["generated_ids"])))' "$T/k0.json")
kr 3 --ids $A,$G,1,2,3 --gen 5
kr 4 --ids $A,$G,1,2,3 --gen 5 --cache-dir "$T/kdir"
python3 - "$T" <<'PY' && ok "krun --cache-dir: the same prompt again runs none of it (the logits kept); a prompt that continues a run starts after its last generated token; ids and every logit (the prompt's last, each generated token's) bit-identical" \
    || notok "krun --cache-dir"
import json, sys
d = sys.argv[1]
k = [json.load(open(f"{d}/k{i}.json")) for i in range(5)]
assert k[0]["generated_ids"] == k[1]["generated_ids"] == k[2]["generated_ids"] and k[3]["generated_ids"] == k[4]["generated_ids"]
raw = lambda i, x: open(f"{d}/k{i}.{x}", "rb").read()
for x in ("lg", "gl"):
    assert raw(0, x) and raw(0, x) == raw(1, x) == raw(2, x), ("logits differ", x)
    assert raw(3, x) and raw(3, x) == raw(4, x), ("logits differ", x)
assert k[0]["prefix_cache"] is None and k[1]["prefix_cache"]["cached_positions"] == 0, k[1]["prefix_cache"]
assert k[2]["prefix_cache"] == {"cached_positions": 12, "prefilled_positions": 0}, k[2]["prefix_cache"]
assert k[4]["prefix_cache"] == {"cached_positions": 12 + 8 - 1, "prefilled_positions": 4}, k[4]["prefix_cache"]
PY
expect_exit 2 "krun --cache-dir with --load-state is refused" "$BIN/krun" "$T/rt.kpk" --ids 1,2 --cache-dir "$T/kdir" --load-state "$T/k0.json"
expect_exit 2 "--cache-size without --cache-dir is refused" "$BIN/krun" "$T/rt.kpk" --ids 1,2 --cache-size 1G
mkfile() { : >"$T/notadir"; }; mkfile
expect_exit 2 "a --cache-dir that cannot be a directory is refused, named" "$BIN/krun" "$T/rt.kpk" --ids 1,2 --cache-dir "$T/notadir"
expect_err "notadir" "  ... the message names it"
# krun chat: a fixed system prompt across runs is read once
SYS2="You are a pirate who answers every question in rhyme, with at least one nautical word."
for run in 1 2 3; do
    msg=$([ $run = 2 ] && echo "Where is the treasure?" || echo "Hello there")
    printf '%s\nAnd then?\n' "$msg" | "$BIN/krun" chat "$T/rt.kpk" --system "$SYS2" --gen 6 --cache-dir "$T/cdir" --json "$T/c$run.json" --quiet >"$T/c$run.out" 2>/dev/null
    printf '%s\nAnd then?\n' "$msg" | "$BIN/krun" chat "$T/rt.kpk" --system "$SYS2" --gen 6 --json "$T/n$run.json" --quiet >"$T/n$run.out" 2>/dev/null
done
printf '{"messages":[{"role":"system","content":"%s"}]}' "$SYS2" >"$T/pre2.json"
PRE2=$("$BIN/krun" tokenize "$T/rt.kpk" --chat "$T/pre2.json" --no-generation-prompt | tr ',' '\n' | wc -l)
python3 - "$T" "$PRE2" <<'PY' && ok "krun chat --cache-dir: a later run with the same --system starts its first turn at the end of the system part ($PRE2 positions, read once), the same conversation again at the end of its first prompt; every reply == without the cache" \
    || notok "krun chat --cache-dir"
import json, sys
d, pre = sys.argv[1], int(sys.argv[2])
for run in (1, 2, 3):
    a, b = [list(map(json.loads, open(f"{d}/{x}{run}.json"))) for x in ("c", "n")]
    assert [t["reply_ids"] for t in a] == [t["reply_ids"] for t in b] and len(a) == 2, (run, a, b)
    assert open(f"{d}/c{run}.out").read() == open(f"{d}/n{run}.out").read()
c = [[t["cached_positions"] for t in map(json.loads, open(f"{d}/c{run}.json"))] for run in (1, 2, 3)]
first = len(json.loads(open(f"{d}/c1.json").readline())["fed_ids"])
assert c == [[0, 0], [pre, 0], [first, 0]], (c, pre, first)
PY

finish
