#!/usr/bin/env bash
# krun serve for every mainstream client (issue 20), on a tiny model with the real tokenizer:
# the client libraries (tests/node/clients.mjs: the openai client, LangChain, the AI SDK, the
# Anthropic SDK; structured output checked with ajv on many seeds, logprobs, penalties, n), when
# installed; and with curl and python: logprobs against krun --dump-logits on the same prompt,
# /tokenize and /detokenize against krun tokenize, /metrics in Prometheus' text format, the
# Anthropic endpoints' auth (x-api-key) and errors, the new fields refused with a 400 naming them.
. "$(dirname "$0")/lib.sh"
SLOW=1; [ -n "${KPK_SANITIZED:-}" ] && SLOW=5
. "$(dirname "$0")/serve_lib.sh"

TOK="$K3_SHARED/fixtures/tokenizer/tiktoken.model"
if [ ! -f "$TOK" ]; then skip "the real tokenizer $TOK is absent"; finish; exit 0; fi
"$BIN/k3synth" "$T/rt" --geometry tiny --seed 2 --layers 3 --experts 4 --topk 2 --tokenizer "$TOK" --quiet >/dev/null \
    && "$BIN/kpack" convert "$T/rt" "$T/rt.kpk" --quiet && rm -rf "$T/rt" || { notok "real-tokenizer model"; finish; exit 1; }

start clients "$T/rt.kpk" --max-seqs 4 --ctx 2048 --api-key k-9 --quiet || { finish; exit 1; }
URL="http://127.0.0.1:$PORT"
H=(-H 'Authorization: Bearer k-9' -H 'Content-Type: application/json')

# ---- logprobs == the log-softmax of krun --dump-logits on the same prompt -------------------------
printf '{"messages":[{"role":"user","content":"Name a colour."}],"chat_template_kwargs":{"thinking":false}}' >"$T/lp.json"
"$BIN/krun" tokenize "$T/rt.kpk" --chat "$T/lp.json" >"$T/lp.ids"
"$BIN/krun" "$T/rt.kpk" --ids "$(cat "$T/lp.ids")" --gen 0 --dump-logits "$T/lp.logits" --quiet >/dev/null
curl -s "${H[@]}" "$URL/v1/chat/completions" -d '{"messages":[{"role":"user","content":"Name a colour."}],"chat_template_kwargs":{"thinking":false},"max_tokens":1,"logprobs":true,"top_logprobs":20,"temperature":0.7,"seed":3,"return_token_ids":true}' >"$T/lp.out"
python3 - "$T" <<'PY' && ok "logprobs: the token's and the top 20 == log-softmax of krun --dump-logits on the same prompt (1e-9)" || notok "logprobs vs --dump-logits"
import json, math, struct, sys
d = sys.argv[1]
j = json.load(open(d + "/lp.out"))
assert ",".join(map(str, j["prompt_token_ids"])) == open(d + "/lp.ids").read().strip()
raw = open(d + "/lp.logits", "rb").read()
l = struct.unpack("<%df" % (len(raw) // 4), raw)
m = max(l)
z = math.log(math.fsum(math.exp(x - m) for x in l))
lp = [(x - m) - z for x in l]
c = j["choices"][0]["logprobs"]["content"][0]
tid = j["choices"][0]["token_ids"][0]
assert abs(c["logprob"] - lp[tid]) < 1e-9, (c["logprob"], lp[tid])
order = sorted(range(len(l)), key=lambda i: (-l[i], i))[:20]
got = [t["logprob"] for t in c["top_logprobs"]]
assert len(got) == 20 and all(abs(a - lp[i]) < 1e-9 for a, i in zip(got, order)), (got[:3], [lp[i] for i in order[:3]])
PY
# logprobs and n do not change what is sampled: the same request without them, the same tokens
a=$(curl -s "${H[@]}" "$URL/v1/completions" -d '{"prompt":"Once","max_tokens":12,"seed":8,"temperature":0.9,"return_token_ids":true}')
b=$(curl -s "${H[@]}" "$URL/v1/completions" -d '{"prompt":"Once","max_tokens":12,"seed":8,"temperature":0.9,"return_token_ids":true,"logprobs":5,"n":2}')
python3 -c 'import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"] and len(b["choices"]) == 2' "$a" "$b" \
    && ok "logprobs and n leave choice 0's tokens as the plain request's" || notok "logprobs/n changed the tokens: $a / $b"

# ---- /tokenize, /detokenize ----------------------------------------------------------------------
printf 'Hello, world! Grüße <|open|>' >"$T/text"
"$BIN/krun" tokenize "$T/rt.kpk" --no-special --file "$T/text" >"$T/text.ids"
tk=$(curl -s "${H[@]}" "$URL/tokenize" -d "$(python3 -c 'import json,sys; print(json.dumps({"content": open(sys.argv[1]).read()}))' "$T/text")")
python3 - "$tk" "$T/text.ids" <<'PY' && ok "/tokenize: llama-server's shape, the ids of krun tokenize (special text stays text)" || notok "/tokenize: $tk"
import json, sys
got = json.loads(sys.argv[1])["tokens"]
want = [int(x) for x in open(sys.argv[2]).read().replace(",", " ").split()]
assert got == want, (got, want)
PY
dt=$(curl -s "${H[@]}" "$URL/detokenize" -d "{\"tokens\":$(python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1])["tokens"]))' "$tk")}")
python3 -c 'import json,sys; assert json.loads(sys.argv[1])["content"] == open(sys.argv[2]).read()' "$dt" "$T/text" \
    && ok "/detokenize: the text back" || notok "/detokenize: $dt"
s=$(curl -s -o /dev/null -w '%{http_code}' "${H[@]}" "$URL/detokenize" -d '{"tokens":[1,99999999]}')
[ "$s" = 400 ] && ok "/detokenize: an id outside the vocabulary: 400" || notok "/detokenize bad id: $s"
s=$(curl -s -o /dev/null -w '%{http_code}' "$URL/tokenize" -d '{"content":"x"}')
[ "$s" = 401 ] && ok "/tokenize needs the key" || notok "/tokenize without the key: $s"

# ---- /metrics ---------------------------------------------------------------------------------------
curl -s "${H[@]}" "$URL/v1/chat/completions" -d '{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"string","not":{"const":"a"}}}}}' >"$T/bad.out"
grep -q '"param":"response_format.json_schema.schema.not"' "$T/bad.out" && ok "an unsupported keyword (not): 400 naming it" || notok "not: $(cat "$T/bad.out")"
s=$(curl -s -o /dev/null -w '%{http_code}' "$URL/metrics")
[ "$s" = 401 ] && ok "/metrics needs the key" || notok "/metrics without the key: $s"
curl -s -D "$T/m.head" "${H[@]}" "$URL/metrics" >"$T/metrics"
python3 - "$T/metrics" "$T/m.head" <<'PY' && ok "/metrics: Prometheus text (HELP, TYPE, samples): responses by endpoint and status, tokens, sweeps, seconds, bytes by kind, queue, sequences" || notok "/metrics: $(head -c 600 "$T/metrics")"
import re, sys
text = open(sys.argv[1]).read()
assert "text/plain; version=0.0.4" in open(sys.argv[2]).read()
samples = {}
for line in text.splitlines():
    if line.startswith("#"):
        assert re.match(r"# (HELP|TYPE) krun_[a-z_]+ ", line), line
        continue
    m = re.match(r'^(krun_[a-z_]+)(\{[^}]*\})? (\S+)$', line)
    assert m, line
    samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
assert samples['krun_responses_total{endpoint="/v1/chat/completions",status="2xx"}'] == 1
assert samples['krun_responses_total{endpoint="/v1/chat/completions",status="4xx"}'] == 1
assert samples['krun_responses_total{endpoint="/tokenize",status="4xx"}'] == 1
assert samples['krun_responses_total{endpoint="/v1/completions",status="2xx"}'] == 2
assert samples["krun_requests_total"] == 4 and samples["krun_generated_tokens_total"] == 1 + 12 + 24
for k in ("krun_sweeps_total", "krun_prefill_seconds_total", "krun_decode_seconds_total"):
    assert samples[k] > 0, k
assert sum(v for k, v in samples.items() if k.startswith("krun_bytes_read_total{")) > 0
assert samples["krun_queue_depth"] == 0 and samples["krun_live_sequences"] == 0
PY

# ---- the Anthropic endpoints with curl: auth, errors, count_tokens ------------------------------------
s=$(curl -s -o "$T/a.out" -w '%{http_code}' -H 'x-api-key: k-9' "$URL/v1/messages/count_tokens" -d '{"model":"rt","messages":[{"role":"user","content":"hi"}]}')
[ "$s" = 200 ] && grep -q '"input_tokens":' "$T/a.out" && ok "/v1/messages/count_tokens with x-api-key" || notok "count_tokens: $s $(cat "$T/a.out")"
s=$(curl -s -o "$T/a.out" -w '%{http_code}' "$URL/v1/messages" -d '{"model":"rt","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}')
[ "$s" = 401 ] && grep -q '"type":"error"' "$T/a.out" && grep -q '"authentication_error"' "$T/a.out" \
    && ok "/v1/messages without a key: 401 in Anthropic's error shape" || notok "messages auth: $s $(cat "$T/a.out")"
s=$(curl -s -o "$T/a.out" -w '%{http_code}' -H 'x-api-key: k-9' "$URL/v1/messages" -d '{"model":"rt","messages":[{"role":"user","content":"hi"}]}')
[ "$s" = 400 ] && grep -q '"invalid_request_error"' "$T/a.out" && grep -q 'max_tokens' "$T/a.out" \
    && ok "/v1/messages without max_tokens: 400 naming it" || notok "messages max_tokens: $s $(cat "$T/a.out")"

# ---- streamed logprobs: OpenAI's streamed shapes, together the non-streamed list -----------------------
export PYTHONPATH="$(dirname "$0")${PYTHONPATH:+:$PYTHONPATH}"
python3 - "$PORT" <<'PY' && ok "streamed logprobs: every chunk in OpenAI's streamed shape (chat: logprobs.content per delta; completions: tokens, token_logprobs, top_logprobs, text_offset), together == the non-streamed request's, same tokens" || notok "streamed logprobs"
import json, sys, serve_client as c
port = int(sys.argv[1]); auth = {"Authorization": "Bearer k-9"}
for chat in (1, 0):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    req = ({"messages": [{"role": "user", "content": "Tell me a story."}], "logprobs": True, "top_logprobs": 3} if chat
           else {"prompt": "Once upon a time", "logprobs": 3})
    req.update({"max_tokens": 40, "seed": 11, "temperature": 0.8, "return_token_ids": True})
    s, _, one = c.post(port, path, req, auth)
    assert s == 200, one
    s, ctype, ev = c.sse(port, path, dict(req, stream=True, stream_options={"include_usage": True}), auth)
    assert s == 200 and ev[-1] == "[DONE]", (s, ev[-2:])
    got = [] if chat else {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in ev[:-1]:
        if not e["choices"]:
            assert e["usage"]["completion_tokens"] == one["usage"]["completion_tokens"], e
            continue
        ch = e["choices"][0]
        assert ch["index"] == 0 and "logprobs" in ch, ch
        lp = ch["logprobs"]
        if lp is None:
            continue
        if chat:
            assert set(lp) == {"content"} and isinstance(lp["content"], list) and lp["content"], lp
            for t in lp["content"]:
                assert set(t) == {"token", "logprob", "bytes", "top_logprobs"} and len(t["top_logprobs"]) == 3, t
            got += lp["content"]
        else:
            assert set(lp) == set(got) and all(len(lp[k]) == len(lp["tokens"]) >= 1 for k in got), lp
            for k in got:
                got[k] += lp[k]
    want = one["choices"][0]["logprobs"]
    assert got == (want["content"] if chat else want), (chat, len(got), json.dumps(want)[:300])
    n = len(got if chat else got["tokens"])
    assert n == one["usage"]["completion_tokens"] == len(one["choices"][0]["token_ids"]), n
PY

# ---- echo with prompt logprobs (lm-evaluation-harness's loglikelihood) == log-softmax of krun --dump-all-logits
python3 -c 'print(" ".join(["The quick brown fox jumps over the lazy dog, and then it runs far away."] * 4))' >"$T/echo.txt"
"$BIN/krun" tokenize "$T/rt.kpk" --no-special --file "$T/echo.txt" >"$T/echo.ids"
"$BIN/krun" "$T/rt.kpk" --ids "$(cat "$T/echo.ids")" --gen 0 --dump-all-logits "$T/echo.logits" --quiet >/dev/null
python3 - "$PORT" "$T" <<'PY' && ok "echo + logprobs 5 (max_tokens 0, 1; ids and text; streamed; twice: no prefix cache): the prompt echoed, its first token null, every other token's logprob and top 5 == log-softmax of krun --dump-all-logits (1e-9), over two blocks; n 3 copies the prompt and its entries" || notok "echo with prompt logprobs"
import heapq, json, math, struct, sys, serve_client as c
port, d = int(sys.argv[1]), sys.argv[2]
auth = {"Authorization": "Bearer k-9"}
ids = [int(x) for x in open(d + "/echo.ids").read().replace(",", " ").split()]
text = open(d + "/echo.txt").read()
assert 64 < len(ids) < 2 * 64, len(ids)    # two of the engine's echo blocks (SRV_ECHO_ROWS)
raw = open(d + "/echo.logits", "rb").read()
V = len(raw) // 4 // len(ids)
L = struct.unpack("<%df" % (len(raw) // 4), raw)
want = [None]                              # per prompt position p >= 1: (logprob of ids[p], the top 5's logprobs)
for p in range(1, len(ids)):
    row = L[(p - 1) * V:p * V]
    m = max(row); z = math.log(math.fsum([math.exp(x - m) for x in row]))
    top = heapq.nsmallest(5, range(V), key=lambda i: (-row[i], i))
    want.append(((row[ids[p]] - m) - z, [(row[i] - m) - z for i in top]))
def check(lp, gen):
    assert lp["tokens"][0] is not None and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None, lp["token_logprobs"][:2]
    assert len(lp["tokens"]) == len(ids) + gen, (len(lp["tokens"]), len(ids), gen)
    for p in range(1, len(ids)):
        assert abs(lp["token_logprobs"][p] - want[p][0]) < 1e-9, (p, lp["token_logprobs"][p], want[p][0])
        alts = sorted(lp["top_logprobs"][p].values(), reverse=True)
        assert len(alts) <= 5 and all(abs(v - w) < 1e-9 for v, w in zip(alts, want[p][1])), (p, alts, want[p][1])
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"]), lp["text_offset"][:5]
for prompt in (ids, text, text):           # the same text twice: the second is not served from the prefix cache
    for mt in (0, 1):
        s, _, j = c.post(port, "/v1/completions", {"prompt": prompt, "echo": True, "max_tokens": mt, "logprobs": 5, "temperature": 0}, auth)
        assert s == 200, j
        ch = j["choices"][0]
        assert ch["text"].startswith(text) and len(ch["text"]) > len(text) if mt else ch["text"] == text, (mt, ch["text"][-40:])
        check(ch["logprobs"], mt)
        assert j["usage"]["prompt_tokens"] == len(ids) and j["usage"]["completion_tokens"] == mt and j["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, j["usage"]
        assert ch["finish_reason"] == "length", ch["finish_reason"]
        if mt == 1:
            first = ch
# lm-eval's loglikelihood: sum(token_logprobs[ctxlen:-1]) and is_greedy from top_logprobs
s, ctype, ev = c.sse(port, "/v1/completions", {"prompt": ids, "echo": True, "max_tokens": 1, "logprobs": 5, "temperature": 0, "stream": True}, auth)
assert s == 200 and ev[-1] == "[DONE]", (s, ev[-2:])
acc = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
txt = ""
for e in ev[:-1]:
    ch = e["choices"][0]; txt += ch["text"]
    for k in acc:
        acc[k] += (ch["logprobs"] or {}).get(k, [])
assert acc == first["logprobs"] and txt == first["text"], "streamed echo differs"
# n 3 with echo and logprobs: choices 1 and 2 copy choice 0's state and its prompt entries; each == seed + i alone
alone = [c.post(port, "/v1/completions", {"prompt": ids, "echo": True, "max_tokens": 3, "logprobs": 2, "seed": 50 + i}, auth)[2]["choices"][0] for i in range(3)]
h0 = c.health(port, auth)["stats"]["copied_tokens"]
s, _, j = c.post(port, "/v1/completions", {"prompt": ids, "echo": True, "max_tokens": 3, "logprobs": 2, "seed": 50, "n": 3}, auth)
assert s == 200 and all(j["choices"][i]["text"] == alone[i]["text"] and j["choices"][i]["logprobs"] == alone[i]["logprobs"] for i in range(3)), j
assert c.health(port, auth)["stats"]["copied_tokens"] - h0 == 2 * len(ids)
# echo without logprobs, and echo refused where it cannot be: max_tokens 0 without echo
s, _, j = c.post(port, "/v1/completions", {"prompt": "Hello there", "echo": True, "max_tokens": 2, "seed": 1}, auth)
assert s == 200 and j["choices"][0]["text"].startswith("Hello there") and j["choices"][0]["logprobs"] is None, j
s, _, j = c.post(port, "/v1/completions", {"prompt": "Hello there", "max_tokens": 0}, auth)
assert s == 400 and j["error"]["param"] == "max_tokens", j
s, _, j = c.post(port, "/v1/completions", {"prompt": "Hello there", "echo": "yes"}, auth)
assert s == 400 and j["error"]["param"] == "echo", j
PY

# ---- n > 1: streamed and not, chat and completions: choice i == the request with seed + i alone; the prompt run once
python3 - "$PORT" <<'PY' && ok "n 3 (chat and completions, streamed and not): choice i == the same request with seed + i alone (text, token ids, logprobs); streamed choices interleaved by index, each with its finish_reason, usage once at the end (prompt once, completions summed); the prompt prefilled once (copied_tokens)" || notok "n > 1"
import json, sys, serve_client as c
port = int(sys.argv[1]); auth = {"Authorization": "Bearer k-9"}
for chat in (1, 0):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    base = ({"messages": [{"role": "user", "content": "Write a poem about the sea, please."}], "logprobs": True, "top_logprobs": 2,
             "chat_template_kwargs": {"thinking": False}} if chat else {"prompt": "The sea is", "logprobs": 2})
    base.update({"max_tokens": 24, "temperature": 1.0, "return_token_ids": True})
    alone = []
    for i in range(3):
        s, _, j = c.post(port, path, dict(base, seed=70 + i), auth)
        assert s == 200, j
        alone.append(j)
    key = lambda ch: (ch["message"]["content"] if chat else ch["text"], ch["token_ids"], ch["logprobs"], ch["finish_reason"])
    h0 = c.health(port, auth)["stats"]
    s, _, j = c.post(port, path, dict(base, seed=70, n=3), auth)
    assert s == 200 and [ch["index"] for ch in j["choices"]] == [0, 1, 2], j
    for i in range(3):
        assert key(j["choices"][i]) == key(alone[i]["choices"][0]), (chat, i)
    assert j["usage"]["prompt_tokens"] == alone[0]["usage"]["prompt_tokens"], j["usage"]
    assert j["usage"]["completion_tokens"] == sum(a["usage"]["completion_tokens"] for a in alone), j["usage"]
    h1 = c.health(port, auth)["stats"]
    s, ctype, ev = c.sse(port, path, dict(base, seed=70, n=3, stream=True, stream_options={"include_usage": True}), auth)
    h2 = c.health(port, auth)["stats"]
    assert s == 200 and ev[-1] == "[DONE]" and ev.count("[DONE]") == 1, ev[-3:]
    cnt = lambda u: (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"])    # (cached_tokens: whatever the cache held then)
    assert ev[-2]["choices"] == [] and cnt(ev[-2]["usage"]) == cnt(j["usage"]), (ev[-2], j["usage"])
    assert all(e == "[DONE]" or "usage" not in e or e is ev[-2] for e in ev), "usage before the end"
    ids = {e["id"] for e in ev[:-1]}
    assert len(ids) == 1, ids
    order = [e["choices"][0]["index"] for e in ev[:-2]]
    assert sorted(set(order)) == [0, 1, 2], order
    for i in range(3):
        text, lp, fin, n_fin = "", [], None, 0
        for e in ev[:-2]:
            ch = e["choices"][0]
            if ch["index"] != i:
                continue
            text += (ch["delta"].get("content") or "") if chat else ch["text"]
            if ch["logprobs"]:
                lp += ch["logprobs"]["content"] if chat else ch["logprobs"]["token_logprobs"]
            if ch["finish_reason"]:
                fin = ch["finish_reason"]; n_fin += 1
        a = alone[i]["choices"][0]
        assert text == (a["message"]["content"] if chat else a["text"]) and fin == a["finish_reason"] and n_fin == 1, (chat, i, text, fin)
        assert lp == (a["logprobs"]["content"] if chat else a["logprobs"]["token_logprobs"]), (chat, i)
    P = alone[0]["usage"]["prompt_tokens"]
    for hb, ha in ((h0, h1), (h1, h2)):
        assert ha["copied_tokens"] - hb["copied_tokens"] == 2 * P, (ha["copied_tokens"], hb["copied_tokens"], P)
        assert ha["prompt_tokens"] - hb["prompt_tokens"] == P, (ha["prompt_tokens"], hb["prompt_tokens"])
PY

# ---- /v1/messages: count_tokens beyond --ctx; refusals in Anthropic's shape -------------------------
python3 - "$PORT" <<'PY' && ok "/v1/messages/count_tokens counts a prompt longer than --ctx (which /v1/messages refuses with a 400)" || notok "count_tokens over ctx"
import sys, serve_client as c
port = int(sys.argv[1]); h = {"x-api-key": "k-9"}
long = {"model": "rt", "messages": [{"role": "user", "content": "word " * 3000}]}
s, _, j = c.post(port, "/v1/messages/count_tokens", long, h)
assert s == 200 and j["input_tokens"] > 2048, (s, j)
s, _, j = c.post(port, "/v1/messages", dict(long, max_tokens=4), h)
assert s == 400 and j["type"] == "error" and j["error"]["type"] == "invalid_request_error", (s, j)
PY

# ---- the client libraries --------------------------------------------------------------------------
NODE_DIR="$TOP/tests/node"
if ! command -v node >/dev/null; then
    skip "client libraries: node is not installed"
elif [ ! -d "$NODE_DIR/node_modules/@anthropic-ai/sdk" ]; then
    skip "client libraries: not installed (npm ci --prefix tests/node; .ci/run does it)"
else
    node "$NODE_DIR/clients.mjs" "$URL/v1" k-9 rt "${CLIENT_SEEDS:-8}" >"$T/node.out" 2>&1 || notok "clients.mjs exited non-zero"
    grep -v '^LOGPROB0 ' "$T/node.out"
fi
stop
[ "$RC" = 0 ] && ok "the server exits 0" || notok "the server exited $RC"

# ---- a busy server: /v1/messages answers 503 in Anthropic's error shape (overloaded_error) -------------
start busy "$T/rt.kpk" --max-seqs 1 --max-queue 0 --ctx 2048 --quiet --no-cache || { finish; exit 1; }
python3 - "$PORT" <<'PY' && ok "--max-seqs 1 --max-queue 0: /v1/messages while a request runs: 503 {type: error, error: {type: overloaded_error}} with Retry-After; /v1/completions the same in OpenAI's shape" || notok "busy /v1/messages"
import sys, threading, time, serve_client as c
port = int(sys.argv[1])
res = {}
t = threading.Thread(target=lambda: res.update(r=c.post(port, "/v1/completions", {"prompt": [1], "max_tokens": 400, "ignore_eos": True, "temperature": 0})))
t.start()
for _ in range(500):
    if c.health(port)["live_sequences"] == 1: break
    time.sleep(0.01)
s, h, j = c.post(port, "/v1/messages", {"model": "rt", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
assert s == 503 and j["type"] == "error" and j["error"]["type"] == "overloaded_error" and int(h["retry-after"]) >= 1, (s, h, j)
s, h, j = c.post(port, "/v1/completions", {"prompt": [2], "max_tokens": 2})
assert s == 503 and j["error"]["code"] == "server_busy", (s, j)
t.join()
assert res["r"][0] == 200, res["r"][0]
PY
stop
finish
