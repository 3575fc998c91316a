#!/usr/bin/env bash
# krun serve with speculation (on by default, --spec 8) against --spec 0: the same requests give
# the same token ids, text and finish reasons, one at a time and all at once (batched sweeps in
# which one sequence verifies drafts while others decode or read their prompts), at temperature
# 0, 0.7 and 1 with top-p, top-k and min-p, streamed and not, in place and at a streaming budget,
# on text that repeats (drafts
# accepted and rejected) and on text that does not (nothing drafted); a request's
# "speculative" field turns it off or lowers it; drafts come from another live conversation
# (a request continuing text another request holds in its prompt) and from the conversations the
# prefix cache keeps (nothing live); /health and the request log
# line carry the acceptance statistics.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
SC="$TOP/tests/cli/serve_client.py"
export PYTHONPATH="$TOP/tests/cli${PYTHONPATH:+:$PYTHONPATH}"
SLOW=1; [ -n "${KPK_SANITIZED:-}" ] && SLOW=5

# a peaked next-token distribution (as a trained model's: sampled text repeats, with departures)
"$BIN/k3synth" "$T/g" --geometry tiny --layers 2 --seed 1 --logit-gain 4 --quiet >/dev/null && "$BIN/kpack" convert "$T/g" "$T/g.kpk" --quiet \
    && rm -rf "$T/g" || { notok "k3synth/convert of the peaked model"; finish; exit 1; }
# the random tiny model: its text does not repeat
"$BIN/k3synth" "$T/m" --geometry tiny --seed 21 --quiet >/dev/null && "$BIN/kpack" convert "$T/m" "$T/m.kpk" --quiet \
    && rm -rf "$T/m" || { notok "k3synth/convert of the tiny model"; finish; exit 1; }

python3 - "$T/reqs.json" <<'PY'
import json, sys
LOOP = [3, 7, 11, 5, 9, 100, 200, 30, 179, 166, 117, 149, 152, 36, 47, 52, 136, 110, 64, 245, 185, 229, 17, 105, 105, 105, 105, 105]
def c(**b):
    b.setdefault("prompt", LOOP); b.setdefault("max_tokens", 60); b.setdefault("ignore_eos", True)
    return {"path": "/v1/completions", "body": b}
reqs = [
    c(temperature=0),
    c(temperature=0.7, seed=3, top_k=40, min_p=0.02),
    c(temperature=1, seed=3),
    c(temperature=1, seed=3, top_p=0.95, stream=True, stream_options={"include_usage": True}),
    c(temperature=1.3, seed=3, max_tokens=40),
    c(temperature=0.7, seed=5, top_p=0.9, prompt=LOOP[:20] * 3),
]
json.dump(reqs, open(sys.argv[1], "w"))
PY

# same_as_plain LABEL MODEL REQS ARGS...: each request alone and all at once on a server with ARGS
# and on one with ARGS --spec 0: every outcome identical; the speculative server's /health counts
# are left in $T/LABEL.spec.json
same_as_plain() {
    local label=$1 kpk=$2 reqs=$3; shift 3
    for s in plain spec; do
        if [ $s = plain ]; then start "$label.$s" "$kpk" --max-seqs 4 --ctx 512 --chunk 16 "$@" --spec 0 --quiet || return
        else start "$label.$s" "$kpk" --max-seqs 4 --ctx 512 --chunk 16 "$@" || return; fi
        py "$reqs" "$T/$label.$s.json" <<'PY' 2>"$T/err.py" || notok "$label: $s run: $(tail -c 300 "$T/err.py")"
import json, sys, serve_client as c
port, reqs = int(sys.argv[1]), json.load(open(sys.argv[2]))
alone, together, sweeps, tokens = c.batch(port, reqs)
json.dump({"alone": alone, "together": together, "sweeps": sweeps, "tokens": tokens, "health": c.health(port)}, open(sys.argv[3], "w"))
PY
        stop
    done
    python3 - "$T/$label.plain.json" "$T/$label.spec.json" <<'PY' >"$T/why" 2>&1 && ok "$label: $(cat "$T/why")" || notok "$label: $(cat "$T/why")"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
n = len(a["alone"])
for k in range(n):
    assert a["alone"][k]["status"] == 200, a["alone"][k]
    assert a["alone"][k] == a["together"][k], ("--spec 0: batched differs from alone", k)
    assert b["alone"][k] == a["alone"][k], ("alone: speculative differs from --spec 0", k, b["alone"][k], a["alone"][k])
    assert b["together"][k] == a["together"][k], ("batched: speculative differs from --spec 0", k)
sp = b["health"]["stats"]["speculation"]
print(f'{n} requests alone and {n} at once: ids, text, finish and usage == --spec 0; {sp["accepted"]} of {sp["drafted"]} drafts '
      f'accepted in {sp["verifications"]} verifications; concurrent phase {b["sweeps"]} sweeps for {b["tokens"]} tokens '
      f'(--spec 0: {a["sweeps"]} for {a["tokens"]})')
PY
}

# ---- text that repeats: drafts accepted and rejected, alone and batched -------------------------
same_as_plain repeat "$T/g.kpk" "$T/reqs.json"
python3 - "$T/repeat.spec.json" "$T/repeat.plain.json" <<'PY' && ok "repeating text: drafts accepted and rejected, fewer sweeps batched than --spec 0" \
    || notok "repeating text: the speculation did not happen as it should"
import json, sys
b, a = (json.load(open(p)) for p in sys.argv[1:3])
sp = b["health"]["stats"]["speculation"]
assert sp["max_drafts"] == 8 and 0 < sp["accepted"] < sp["drafted"], sp
assert a["health"]["stats"]["speculation"]["drafted"] == 0 and a["health"]["stats"]["speculation"]["max_drafts"] == 0
assert b["sweeps"] < a["sweeps"] and b["tokens"] == a["tokens"], (b["sweeps"], a["sweeps"])
assert sp["acceptance"] == sp["accepted"] / sp["drafted"]
PY
grep -qE "speculation [0-9]+ of [0-9]+ drafts accepted in [0-9]+ verifications" "$T/repeat.spec.err" \
    && ok "the request log line says how many drafts were accepted" || notok "no speculation in the log line: $(head -c 300 "$T/repeat.spec.err")"
# a small journal (--spec 3: 4 positions, 2 sequences a sweep): the verifications of a batch share it
same_as_plain shared "$T/g.kpk" "$T/reqs.json" --spec 3 --quiet
# streaming: no trunk layer pinned, two expert slots (both servers at the same budget)
same_as_plain streamed "$T/g.kpk" "$T/reqs.json" --mem 1G --pin 0 --expert-slots 2 --quiet

# ---- text that does not repeat: nothing drafted, the same sweeps ------------------------------
python3 - "$T/flat.json" <<'PY'
import json, sys
P = [3, 7, 11, 5, 9, 100, 200, 30]
json.dump([{"path": "/v1/completions", "body": {"prompt": P[i:] + P[:i], "max_tokens": 40, "temperature": t, "seed": 4, "ignore_eos": True}}
           for i, t in enumerate((0, 0.7, 1))], open(sys.argv[1], "w"))
PY
# (without the prefix cache: its entries of the "alone" run would be evidence for the "at once" one)
same_as_plain flat "$T/m.kpk" "$T/flat.json" --quiet --no-cache
python3 - "$T/flat.spec.json" <<'PY' && ok "no repetition: nothing drafted" || notok "no repetition: drafts were made"
import json, sys
b = json.load(open(sys.argv[1]))
assert b["health"]["stats"]["speculation"]["drafted"] == 0, b["health"]["stats"]
PY

# ---- the request field, and drafts from another live conversation ------------------------------
start other "$T/m.kpk" --max-seqs 4 --ctx 512 --chunk 16 && {
    py "$BIN/krun" "$T/m.kpk" "$T/other.err" <<'PY' >"$T/other.out" 2>&1 && ok "$(cat "$T/other.out")" || notok "$(tail -c 600 "$T/other.out")"
import http.client, json, re, subprocess, sys, serve_client as c
port, krun, kpk, logf = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
Q = [3, 7, 11, 5, 9, 100, 200, 30]
G = [int(x) for x in subprocess.run([krun, kpk, "--ids", ",".join(map(str, Q)), "--gen", "40", "--ignore-eos", "--print-ids", "--quiet"],
                                    capture_output=True, text=True, check=True).stdout.split()]
spec = lambda: c.health(port)["stats"]["speculation"]
def b(**kw):
    r = {"prompt": Q, "max_tokens": 40, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    r.update(kw)
    return r
# alone: its own history has no evidence (nothing drafted)
s, _, j = c.post(port, "/v1/completions", b())
assert s == 200 and j["choices"][0]["token_ids"] == G, j
assert spec()["drafted"] == 0, spec()
# bad values of the field: 400 naming it
for v in (-1, 65, "yes", 1.5):
    s, _, j = c.post(port, "/v1/completions", b(speculative=v))
    assert s == 400 and j["error"]["param"] == "speculative", (v, s, j)
# another request holds the continuation in its prompt and stays live (a long stream): drafts come from it
# (and are all accepted: the same model, greedy); with "speculative": false or 0, none; 3: at most 3 a verification
def live_stream():
    h = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    h.request("POST", "/v1/completions", json.dumps({"prompt": Q + G, "max_tokens": 400, "temperature": 0, "ignore_eos": True,
                                                     "stream": True}), {"Content-Type": "application/json"})
    r = h.getresponse()
    assert r.status == 200 and r.fp.readline()     # its prompt has run: it is decoding
    return h
for field in (None, False, 0, 3):
    live = live_stream()
    kw = {} if field is None else {"speculative": field}
    s, _, j = c.post(port, "/v1/completions", b(**kw))
    live.close()
    assert s == 200 and j["choices"][0]["token_ids"] == G, (field, j)
# the log line of each request of Q (alone, then the four above)
# ("8 prompt (N cached) + ...": the prefix cache serves the repeats of Q)
lines = [l for l in open(logf) if re.search(r"8 prompt \(\d+ cached\) \+ 40 generated tokens", l)]
assert len(lines) == 5, lines
def stats(l):
    m = re.search(r"speculation (\d+) of (\d+) drafts accepted in (\d+) verifications", l)
    return tuple(map(int, m.groups())) if m else (0, 0, 0)
out = [stats(l) for l in lines]
assert out[0] == (0, 0, 0) and out[2] == (0, 0, 0) and out[3] == (0, 0, 0), out
a, d, v = out[1]
assert a >= 20 and a == d, out                 # greedy continuation of the other's prompt: every draft stands
a3, d3, v3 = out[4]
assert d3 > 0 and d3 <= 3 * v3, out
# nothing live now: the conversations the prefix cache keeps in RAM are the evidence (Q + G among them)
import time
for _ in range(200):
    if c.health(port)["live_sequences"] == 0: break
    time.sleep(0.05)
assert c.health(port)["live_sequences"] == 0
h0 = spec()
s, _, j = c.post(port, "/v1/completions", b())
h1 = spec()
assert s == 200 and j["choices"][0]["token_ids"] == G, j
dc, ac = h1["drafted"] - h0["drafted"], h1["accepted"] - h0["accepted"]
assert dc >= 20 and ac == dc, (dc, ac)
# /metrics says what /health says
h = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
h.request("GET", "/metrics")
mt = h.getresponse().read().decode()
mv = {l.split()[0]: float(l.split()[1]) for l in mt.splitlines() if l.startswith("krun_")}
sp, hs = spec(), c.health(port)
assert mv["krun_speculation_drafted_total"] == sp["drafted"] and mv["krun_speculation_accepted_total"] == sp["accepted"] \
    and mv["krun_speculation_verifications_total"] == sp["verifications"], (mv, sp)
assert mv["krun_cached_prompt_tokens_total"] == hs["stats"]["cached_tokens"] > 0, (mv, hs["stats"])
assert mv["krun_prefix_cache_hits_total"] == hs["prefix_cache"]["hits"] > 0, (mv, hs.get("prefix_cache"))
print(f'drafts from another live conversation: {a} of {d} accepted in {v} verifications (alone: none drafted); '
      f'"speculative": false and 0 draft nothing, 3 at most 3 a verification ({d3} in {v3}); bad values 400; ids == krun; '
      f'from the prefix cache\'s conversations, nothing live: {ac} of {dc} accepted; /metrics == /health')
PY
    stop
}

# ---- constrained decoding and logprobs: the same bytes with and without speculation --------------
# a grammar's mask is asked for at each draft position as plain decoding asks (a function of the
# history), so a constrained request drafts and keeps the bits; a request with logprobs drafts
# nothing (docs/SERVE.md, Speculation) and keeps the bits; the whole bodies are compared
TOK="$K3_SHARED/fixtures/tokenizer/tiktoken.model"
if [ ! -f "$TOK" ]; then skip "constrained/logprobs with speculation: the real tokenizer $TOK is absent"; else
"$BIN/k3synth" "$T/rt" --geometry tiny --seed 2 --layers 2 --logit-gain 4 --tokenizer "$TOK" --quiet >/dev/null \
    && "$BIN/kpack" convert "$T/rt" "$T/rt.kpk" --quiet && rm -rf "$T/rt" || notok "real-tokenizer model"
python3 - "$T/creqs.json" <<'PY'
import json, sys
S = "the red fox and " * 12
FREE = {"type": "object", "properties": {"c": {"type": "array", "items": {"enum": ["red", "green", "blue"]}}},
        "required": ["c"], "additionalProperties": False}
def chat(schema=None, **b):
    b.setdefault("messages", [{"role": "user", "content": S}]); b.setdefault("max_tokens", 60)
    b.setdefault("chat_template_kwargs", {"thinking": False})
    if schema: b["response_format"] = {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}
    return ("/v1/chat/completions", b)
# the schemas whose text repeats (drafts made, accepted and rejected under the mask), a free one, json_object
reqs = [
    chat({"enum": [S]}, temperature=0.7, seed=3),
    chat({"enum": [S]}, temperature=1, seed=3),
    chat({"type": "object", "properties": {"a": {"enum": [S]}}, "required": ["a"], "additionalProperties": False}, temperature=0.7, seed=4),
    chat(FREE, temperature=0.7, seed=3),
    chat(temperature=1, seed=4, response_format={"type": "json_object"}),
    chat(temperature=0.7, seed=3, logprobs=True, top_logprobs=3),
    ("/v1/completions", {"prompt": S, "max_tokens": 40, "temperature": 0.7, "seed": 5, "logprobs": 4, "ignore_eos": True}),
]
json.dump(reqs, open(sys.argv[1], "w"))
PY
for s in plain spec; do
    if [ $s = plain ]; then start "c.$s" "$T/rt.kpk" --max-seqs 4 --ctx 1024 --spec 0 --quiet || break
    else start "c.$s" "$T/rt.kpk" --max-seqs 4 --ctx 1024 --quiet || break; fi
    py "$T/creqs.json" "$T/c.$s.json" <<'PY' 2>"$T/err.py" || notok "constrained/logprobs: $s run: $(tail -c 300 "$T/err.py")"
import json, sys, threading, serve_client as c
port, reqs = int(sys.argv[1]), json.load(open(sys.argv[2]))
def body(path, b):
    s, _, j = c.post(port, path, b)
    assert s == 200, (s, j)
    j.pop("id", None); j.pop("created", None)
    # how much of the prompt the prefix cache served depends on what ran before: the rest may not
    (j.get("usage") or {}).pop("prompt_tokens_details", None)
    return j
out = {"alone": [], "drafted": [], "accepted": []}
for path, b in reqs:
    h0 = c.health(port)["stats"]["speculation"]
    out["alone"].append(body(path, b))
    h1 = c.health(port)["stats"]["speculation"]
    out["drafted"].append(h1["drafted"] - h0["drafted"])
    out["accepted"].append(h1["accepted"] - h0["accepted"])
together = [None] * len(reqs)
bar = threading.Barrier(len(reqs))
def go(i):
    bar.wait()
    together[i] = body(*reqs[i])
ts = [threading.Thread(target=go, args=(i,)) for i in range(len(reqs))]
for t in ts: t.start()
for t in ts: t.join()
out["together"] = together
json.dump(out, open(sys.argv[3], "w"))
PY
    stop
done
python3 - "$T/c.plain.json" "$T/c.spec.json" <<'PY' >"$T/why" 2>&1 && ok "constrained and logprobs requests: $(cat "$T/why")" || notok "constrained/logprobs with speculation: $(cat "$T/why")"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for k in range(len(a["alone"])):
    assert a["alone"][k] == a["together"][k], ("--spec 0: batched differs from alone", k)
    assert b["alone"][k] == a["alone"][k], ("alone: speculative differs from --spec 0", k, b["alone"][k], a["alone"][k])
    assert b["together"][k] == a["together"][k], ("batched: speculative differs from --spec 0", k)
for k in range(3):
    assert "the red fox and the red" in a["alone"][k]["choices"][0]["message"]["content"], a["alone"][k]   # the schema's text
assert a["alone"][5]["choices"][0]["logprobs"]["content"] and a["alone"][6]["choices"][0]["logprobs"]["token_logprobs"]
d, acc = b["drafted"], b["accepted"]
assert d[5] == 0 and d[6] == 0, ("a logprobs request drafted", d)
assert sum(acc[:3]) > 0 and sum(acc[:3]) < sum(d[:3]), ("the constrained requests' drafts were not both kept and rejected", d, acc)
print(f"json_schema (3 whose text repeats, 1 free), json_object, chat and completion logprobs, alone and 7 at once: bodies == --spec 0; "
      f"constrained alone: {sum(acc[:5])} of {sum(d[:5])} drafts accepted; logprobs: none drafted")
PY
fi
finish
