#!/usr/bin/env bash
# krun serve: the OpenAI endpoints with curl and a standard-library Python client (and the
# official openai npm client, tests/node/, when installed): completions and chat, streamed and
# not, equal to krun's own output for the same prompt and sampling; concurrent requests batched
# into shared sweeps with outputs bit-identical to each run alone; auth; every bad input (4xx
# with an OpenAI error object); a full queue (503 + Retry-After); a client that disconnects
# (its sequence freed); SIGTERM with requests in flight (finished, or cancelled after the
# timeout; exit 0); a damaged extent (500 naming it, then 503, health says so, exit 1).
. "$(dirname "$0")/lib.sh"
SC="$TOP/tests/cli/serve_client.py"
export PYTHONPATH="$TOP/tests/cli${PYTHONPATH:+:$PYTHONPATH}"
# sanitizer and emulated builds run several times slower: wait longer, never assert on speed
SLOW=1; [ -n "${KPK_SANITIZED:-}" ] && SLOW=5; [ -n "${KPK_SLOW:-}" ] && SLOW=$KPK_SLOW

"$BIN/k3synth" "$T/m" --geometry tiny --seed 21 --quiet >/dev/null 2>"$T/err" || { notok "k3synth: $(cat "$T/err")"; finish; exit 1; }
"$BIN/kpack" convert "$T/m" "$T/m.kpk" --quiet || { notok "convert"; finish; exit 1; }

. "$(dirname "$0")/serve_lib.sh"

# ---- completions, against krun itself -------------------------------------------------------
start basic "$T/m.kpk" --max-seqs 4 --chunk 16 --ctx 512 || { finish; exit 1; }
grep -q "4 sequences of 512 positions (.* of state each)" "$T/basic.err" \
    && ok "startup says how many sequences it runs, their context and their state" || notok "startup: $(cat "$T/basic.err")"
py <<'PY' && ok "GET /health: status, model, ctx, max_seqs, live sequences, queue, plan, counters" || notok "health"
import sys, serve_client as c
h = c.health(int(sys.argv[1]))
assert h["http_status"] == 200 and h["status"] == "ok" and h["model"] == "m" and h["ctx"] == 512 and h["max_seqs"] == 4, h
assert h["live_sequences"] == 0 and h["queued"] == 0 and h["max_queue"] == 16 and "plan" in h and h["stats"]["requests"] == 0, h
PY
out=$(curl -s "http://127.0.0.1:$PORT/v1/models")
python3 -c 'import json,sys; j=json.loads(sys.argv[1]); assert j["object"]=="list" and j["data"][0]["id"]=="m" and j["data"][0]["object"]=="model"' "$out" \
    && ok "GET /v1/models lists the model by its file name" || notok "models: $out"

IDS=5,80,81,82,200,13,7
for samp in "0 0" "0.8 7"; do
    set -- $samp
    "$BIN/krun" "$T/m.kpk" --ids $IDS --gen 24 --temp $1 --seed $2 --print-ids --quiet >"$T/cli.ids"
    "$BIN/krun" "$T/m.kpk" --ids $IDS --gen 24 --temp $1 --seed $2 --quiet >"$T/cli.txt"
    curl -s "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"model\":\"m\",\"prompt\":[$IDS],\"max_tokens\":24,\"temperature\":$1,\"seed\":$2,\"return_token_ids\":true}" >"$T/c.json"
    curl -sN "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\":[$IDS],\"max_tokens\":24,\"temperature\":$1,\"seed\":$2,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" >"$T/c.sse"
    python3 - "$T" <<'PY' && ok "completion (temperature $1, seed $2), curl: ids and text equal krun's; streamed the same, ending with usage and [DONE]" \
        || notok "completion differs from krun (temperature $1)"
import json, sys
d = sys.argv[1]
cli = [int(x) for x in open(d + "/cli.ids").read().split()]
txt = open(d + "/cli.txt", "rb").read()[:-1].decode("utf-8", "replace")
j = json.load(open(d + "/c.json"))
ch = j["choices"][0]
assert ch["token_ids"] == cli, (ch["token_ids"], cli)
assert ch["text"] == txt, (ch["text"], txt)
assert j["object"] == "text_completion" and j["usage"]["completion_tokens"] == len(cli) and j["usage"]["prompt_tokens"] == 7
assert ch["finish_reason"] == ("length" if len(cli) == 24 else "stop")
ev = open(d + "/c.sse").read().split("\n\n")
assert ev[-1] == "" and ev[-2] == "data: [DONE]", ev[-3:]
chunks = [json.loads(e[6:]) for e in ev[:-2]]
assert all(e.startswith("data: ") for e in ev[:-2])
assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == txt
assert chunks[-1]["usage"]["completion_tokens"] == len(cli) and chunks[-1]["choices"] == []
assert chunks[-2]["choices"][0]["finish_reason"] == ch["finish_reason"]
PY
done
# a text prompt is tokenized as krun --prompt does (special-token strings honoured)
"$BIN/krun" "$T/m.kpk" --prompt "Hello there" --gen 12 --print-ids --quiet >"$T/cli.ids"
py "$T" <<'PY' && ok "completion with a text prompt == krun --prompt (prompt ids and output ids)" || notok "text prompt"
import sys, serve_client as c
s, _, j = c.post(int(sys.argv[1]), "/v1/completions", {"prompt": "Hello there", "max_tokens": 12, "temperature": 0, "return_token_ids": True})
cli = [int(x) for x in open(sys.argv[2] + "/cli.ids").read().split()]
assert s == 200 and "choices" in j, j
assert j["choices"][0]["token_ids"] == cli and len(j["prompt_token_ids"]) == 11, j
PY

# a stop string in a streamed request (issue 25.1: the stop strings were kept by pointer into the
# parsed request, freed when the connection's handler returned: the server crashed); the same
# request not streamed, and with the stop string, gives the same text
py <<'PY' && ok "streamed completion with stop strings: cut before the first, == the same request not streamed; the server lives on" \
    || notok "streamed completion with a stop string"
import sys, serve_client as c
port = int(sys.argv[1])
base = {"prompt": [5, 80, 81, 82, 200, 13, 7], "max_tokens": 40, "temperature": 0, "ignore_eos": True}
s, _, j = c.post(port, "/v1/completions", base)
text = j["choices"][0]["text"]
k = next(i for i in range(8, len(text) - 4) if "\ufffd" not in text[i:i + 3])
stop = text[k:k + 3]
cut = text[:text.find(stop)]
for stream in (False, True):
    for stops in ([stop], ["\u2603\u2603", stop, "zz\u00e9"]):
        body = dict(base, stop=stops)
        if stream:
            s, _, ev = c.sse(port, "/v1/completions", dict(body, stream=True))
            got, _, finish, _, done = c.text_of(ev, False)
            assert done, ev[-2:]
        else:
            s, _, j = c.post(port, "/v1/completions", body)
            got, finish = j["choices"][0]["text"], j["choices"][0]["finish_reason"]
        assert s == 200 and got == cut and finish == "stop", (stream, stops, s, got, cut, finish)
assert c.health(port)["status"] == "ok"
PY

# ---- batching: concurrent requests == each alone ----------------------------------------------
python3 - "$T/reqs.json" <<'PY'
import json, sys
long_prompt = [(7 * i) % 250 + 1 for i in range(150)]
reqs = [
    {"path": "/v1/completions", "body": {"prompt": [5, 80, 81, 82, 200, 13, 7], "max_tokens": 40, "temperature": 0, "ignore_eos": True}},
    {"path": "/v1/completions", "body": {"prompt": "Hello there", "max_tokens": 25, "temperature": 0.9, "seed": 3, "top_p": 0.9}},
    {"path": "/v1/completions", "body": {"prompt": long_prompt, "max_tokens": 30, "temperature": 0.7, "seed": 11, "top_k": 20, "ignore_eos": True}},
    {"path": "/v1/completions", "body": {"prompt": [9, 9, 9], "max_tokens": 35, "temperature": 1.0, "seed": 5, "min_p": 0.05, "stream": True,
                                          "stream_options": {"include_usage": True}, "ignore_eos": True}},
    {"path": "/v1/completions", "body": {"prompt": [100, 101], "max_tokens": 3, "temperature": 0}},
    {"path": "/v1/completions", "body": {"prompt": long_prompt[:70], "max_tokens": 20, "temperature": 1.2, "seed": 99, "stream": True}},
]
json.dump(reqs, open(sys.argv[1], "w"))
PY
python3 "$SC" batch "$PORT" "$T/reqs.json" "6 requests on 4 sequences (2 queue), a 150-token prompt read in 16-position blocks between decoding steps: "
py <<'PY' && ok "after the batch: no live sequence, nothing queued, every request completed" || notok "health after the batch"
import sys, serve_client as c
h = c.health(int(sys.argv[1]))
assert h["live_sequences"] == 0 and h["queued"] == 0 and h["stats"]["completed"] == h["stats"]["requests"] and h["stats"]["failed"] == 0, h
PY

# ---- bad input: 4xx with an OpenAI error object naming the problem -------------------------------
py <<'PY' && ok "bad requests: 400 malformed JSON / wrong type / bad value, 404 unknown model and path, 405 wrong method, 400 prompt or max_tokens beyond the context" || notok "bad requests"
import sys, serve_client as c
port = int(sys.argv[1])
def expect(method, path, body, status, code=None, param=None, words=None):
    s, h, b = c.request(port, method, path, body)
    import json
    j = json.loads(b)
    e = j["error"]
    assert s == status, (path, body, s, j)
    assert isinstance(e["message"], str) and e["message"] and e["type"] == "invalid_request_error", j
    if code: assert e["code"] == code, (code, j)
    if param: assert e["param"] == param, (param, j)
    if words: assert words in e["message"], (words, j)
    assert h.get("content-type") == "application/json", h
expect("POST", "/v1/completions", "{not json", 400, "invalid_json")
expect("POST", "/v1/chat/completions", "[1,2]", 400, "invalid_json")
expect("POST", "/v1/completions", '{"prompt": 5}', 400, "invalid_type", "prompt")
expect("POST", "/v1/completions", '{"prompt": "x", "max_tokens": "9"}', 400, "invalid_type", "max_tokens")
expect("POST", "/v1/completions", '{"prompt": "x", "temperature": 7}', 400, "invalid_value", "temperature")
expect("POST", "/v1/completions", '{"prompt": [1, 99999]}', 400, None, "prompt", "outside the vocabulary")
expect("POST", "/v1/completions", '{"prompt": "x", "model": "gpt-4"}', 404, "model_not_found", "model")
expect("POST", "/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "model": "nope"}', 404, "model_not_found")
expect("POST", "/v1/chat/completions", '{"messages": [{"role": "wizard", "content": "x"}]}', 400, None, "messages[0].role")
expect("POST", "/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}]}', 400, "chat_unsupported", None, "<|open|>")
expect("POST", "/v1/completions", '{"prompt": [%s]}' % ",".join(["5"] * 513), 400, "context_length_exceeded", "prompt", "513 tokens")
expect("GET", "/v1/nothing", None, 404, "not_found")
expect("GET", "/v1/completions", None, 405, "method_not_allowed")
expect("DELETE", "/health", None, 405)
s, _, j = c.post(port, "/v1/completions", {"prompt": [5, 6], "max_tokens": 511, "temperature": 0})
assert s == 200, j            # exactly the context: 2 + 4095 - 1 positions
# beyond it (agents send a large fixed max_tokens): served up to the context, finish "length", usage as generated
s, _, j = c.post(port, "/v1/completions", {"prompt": [5, 6], "max_tokens": 32000, "temperature": 0, "ignore_eos": True})
assert s == 200 and j["choices"][0]["finish_reason"] == "length" and j["usage"]["completion_tokens"] == 511, j["usage"]
PY
stop
[ "$RC" -eq 0 ] && ok "SIGTERM on an idle server: exit 0" || notok "idle SIGTERM: exit $RC: $(tail -3 "$T/basic.err")"
grep -qE "cmpl-.*: 7 prompt \([0-9]+ cached\) \+ 24 generated tokens, length" "$T/basic.err" && ok "one line per request on stderr (tokens, those the prefix cache held, finish reason, time)" \
    || notok "request log: $(tail -5 "$T/basic.err")"

# ---- body size, auth, queue ----------------------------------------------------------------------
start auth "$T/m.kpk" --api-key s3cret --max-body 2K --max-seqs 1 --max-queue 0 --quiet || { finish; exit 1; }
py <<'PY' && ok "--api-key: 401 (WWW-Authenticate: Bearer) without or with a wrong key, 200 with it; /health open: the status only without the key, everything with it" || notok "auth"
import sys, json, serve_client as c
port = int(sys.argv[1])
body = {"prompt": [1, 2], "max_tokens": 2}
for hdr in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}, {"Authorization": "Bearer s3cre"}):
    s, h, j = c.post(port, "/v1/completions", body, hdr)
    assert s == 401 and j["error"]["code"] == "invalid_api_key" and h.get("www-authenticate") == "Bearer", (hdr, s, j)
s, _, j = c.request(port, "GET", "/v1/models")
assert s == 401, s
s, _, j = c.post(port, "/v1/completions", body, {"Authorization": "Bearer s3cret"})
assert s == 200 and j["choices"], j
# /health stays open, but without the key it says only the status (issue 25.8: it showed the model's absolute path)
for hdr in ({}, {"Authorization": "Bearer wrong"}):
    s, h, b = c.request(port, "GET", "/health", None, hdr)
    assert s == 200 and json.loads(b) == {"status": "ok"}, (hdr, s, b)
s, h, b = c.request(port, "GET", "/health", None, {"Authorization": "Bearer s3cret"})
full = json.loads(b)
assert s == 200 and full["status"] == "ok" and full["file"].endswith("/m.kpk") and full["file"].startswith("/") and "plan" in full and "stats" in full, full
PY
py <<'PY' && ok "--max-body 2K: 413 with an error object for a larger body (declared length and chunked), 200 just under" || notok "max body"
import sys, json, http.client, serve_client as c
port = int(sys.argv[1])
auth = {"Authorization": "Bearer s3cret"}
big = json.dumps({"prompt": "x" * 3000})
s, h, b = c.request(port, "POST", "/v1/completions", big, auth)
assert s == 413 and json.loads(b)["error"]["code"] == "request_too_large", (s, b)
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
conn.request("POST", "/v1/completions", body=iter([big[:1500].encode(), big[1500:].encode()]), headers=dict(auth, **{"Content-Type": "application/json"}),
             encode_chunked=True)
r = conn.getresponse()
assert r.status == 413 and json.loads(r.read())["error"]["code"] == "request_too_large", r.status
ok = json.dumps({"prompt": [1], "max_tokens": 1, "padding": "x" * 1900})
s, h, b = c.request(port, "POST", "/v1/completions", ok, auth)
assert s == 200, (s, b)
PY
py <<'PY' && ok "--max-seqs 1 --max-queue 0: a second request while one runs gets 503 server_busy with Retry-After; health shows the live one" || notok "queue full"
import sys, json, threading, time, serve_client as c
port = int(sys.argv[1])
auth = {"Authorization": "Bearer s3cret"}
res = {}
t = threading.Thread(target=lambda: res.update(r=c.post(port, "/v1/completions", {"prompt": [1], "max_tokens": 1000, "ignore_eos": True, "temperature": 0}, auth)))
t.start()
for _ in range(500):
    if c.health(port, auth)["live_sequences"] == 1: break
    time.sleep(0.01)
s, h, j = c.post(port, "/v1/completions", {"prompt": [2], "max_tokens": 2}, auth)
assert s == 503 and j["error"]["code"] == "server_busy" and int(h["retry-after"]) >= 1, (s, h, j)
t.join()
assert res["r"][0] == 200 and res["r"][2]["usage"]["completion_tokens"] == 1000, res["r"][0]
PY
stop

# ---- a client that disconnects frees its sequence ------------------------------------------------------
start disc "$T/m.kpk" --max-seqs 2 --quiet || { finish; exit 1; }
py <<'PY' && ok "a client that disconnects mid-stream, or while waiting for a whole body, frees its sequence (health: 0 live, 2 cancelled) long before its max_tokens" \
    || notok "disconnect"
import sys, json, socket, time, serve_client as c
port = int(sys.argv[1])
def open_request(body):
    s = socket.create_connection(("127.0.0.1", port))
    b = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(b), b))
    return s
s1 = open_request({"prompt": [1, 2, 3], "max_tokens": 4000, "ignore_eos": True, "stream": True})
got = b""
while got.count(b"data: ") < 3:
    more = s1.recv(4096)
    assert more and b"HTTP/1.1 200" in got + more, got + more
    got += more
s2 = open_request({"prompt": [4, 5], "max_tokens": 4000, "ignore_eos": True})
for _ in range(500):
    if c.health(port)["live_sequences"] == 2: break
    time.sleep(0.01)
assert c.health(port)["live_sequences"] == 2
t0 = time.time()
s1.close(); s2.close()
for _ in range(3000):
    h = c.health(port)
    if h["live_sequences"] == 0: break
    time.sleep(0.01)
assert h["live_sequences"] == 0 and h["stats"]["cancelled"] == 2, h
assert h["stats"]["generated_tokens"] < 6000, h      # stopped early, not run to max_tokens
print("# freed %.2f s after the disconnect; %d tokens generated in all" % (time.time() - t0, h["stats"]["generated_tokens"]))
PY
stop INT
[ "$RC" -eq 0 ] && ok "SIGINT after the disconnects: exit 0" || notok "SIGINT: exit $RC"

# ---- SIGTERM with requests in flight -----------------------------------------------------------------------
for mode in finish cancel; do
    # a slow build (KPK_SLOW: emulated) takes longer than the default 30 s for 600 tokens
    if [ $mode = finish ]; then start term "$T/m.kpk" --max-seqs 2 ${KPK_SLOW:+--shutdown-timeout $((30 * SLOW))}
    else start term "$T/m.kpk" --max-seqs 2 --shutdown-timeout 0; fi || continue
    python3 - "$PORT" "$T/term.res" <<'PY' &
import sys, json, serve_client as c
port = int(sys.argv[1])
s, ctype, ev = c.sse(port, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 600, "ignore_eos": True, "stream": True, "temperature": 0})
json.dump({"status": s, "events": ev}, open(sys.argv[2], "w"))
PY
    CLIENT=$!
    py <<'PY'
import sys, time, serve_client as c
for _ in range(1000):
    if c.health(int(sys.argv[1]))["live_sequences"] == 1: break
    time.sleep(0.01)
PY
    stop TERM
    wait $CLIENT
    if [ $mode = finish ]; then
        python3 - "$T/term.res" <<'PY' && [ "$RC" -eq 0 ] && ok "SIGTERM with a request in flight: it finishes (600 tokens, finish length, [DONE]), then exit 0" \
            || notok "SIGTERM (finish): exit $RC: $(tail -3 "$T/term.err")"
import sys, json, serve_client as c
r = json.load(open(sys.argv[1]))
text, _, finish, _, done = c.text_of(r["events"], False)
assert r["status"] == 200 and finish == "length" and done and len(r["events"]) > 400, (r["status"], finish, done, len(r["events"]))
PY
        grep -q "SIGTERM: taking no new requests" "$T/term.err" && ok "the server says it is draining" || notok "no drain message"
    else
        python3 - "$T/term.res" <<'PY' && [ "$RC" -eq 0 ] && ok "SIGTERM with --shutdown-timeout 0: the running stream ends with an error event (server_shutting_down) and [DONE]; exit 0" \
            || notok "SIGTERM (cancel): exit $RC: $(tail -3 "$T/term.err")"
import sys, json
r = json.load(open(sys.argv[1]))
ev = r["events"]
assert r["status"] == 200 and ev[-1] == "[DONE]" and ev[-2]["error"]["code"] == "server_shutting_down" and len(ev) < 600, ev[-2:]
PY
    fi
done

# ---- a damaged extent met while serving ---------------------------------------------------------------------
corrupt_experts "$T/m.kpk" "$T/bad.kpk"
start bad "$T/bad.kpk" --quiet && {
    py <<'PY' && ok "a damaged extent: the request fails with 500 naming it (no text); later ones 503 naming it; health 503 damaged" || notok "damage"
import sys, re, serve_client as c
port = int(sys.argv[1])
s, _, j = c.post(port, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 5})
assert s == 500 and j["error"]["code"] == "model_damaged" and re.search(r"layer \d+ expert \d+", j["error"]["message"]), (s, j)
assert "choices" not in j
s, ctype, ev = c.sse(port, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 5, "stream": True})
assert s == 503 and re.search(r"layer \d+ expert \d+", ev[0]["error"]["message"]), (s, ev)
h = c.health(port)
assert h["http_status"] == 503 and h["status"] == "damaged" and re.search(r"layer \d+ expert \d+.*checksum", h["damage"]), h
PY
    stop
    [ "$RC" -eq 1 ] && ok "a server that met a damaged extent exits 1 on SIGTERM" || notok "damaged server exit $RC"
}

# ---- startup errors -------------------------------------------------------------------------------------------
expect_exit 2 "krun serve on a model without a tokenizer" "$BIN/krun" serve "$K3_SHARED/fixtures/k3-tiny-oracle/model.safetensors" --port 0
expect_exit 2 "--temp is refused: sampling comes from each request" "$BIN/krun" serve "$T/m.kpk" --temp 1
expect_err "takes sampling from each request" "says where sampling comes from"
start inuse "$T/m.kpk" --quiet && {
    expect_exit 2 "a port in use" "$BIN/krun" serve "$T/m.kpk" --port "$PORT" --quiet
    expect_err "cannot listen on 127.0.0.1 port $PORT: Address already in use \(pick another --port" "names the address and what to do"
    stop
}
expect_exit 0 "krun serve --help" "$BIN/krun" serve --help
grep -q "^usage: krun serve MODEL.kpk" "$T/last.out" && ok "--help shows the usage" || notok "--help"

# ---- chat, with the real tokenizer ------------------------------------------------------------------------------
TOK="$K3_SHARED/fixtures/tokenizer/tiktoken.model"
if [ -f "$TOK" ]; then
    "$BIN/k3synth" "$T/rt" --geometry tiny --seed 2 --layers 3 --experts 4 --topk 2 --tokenizer "$TOK" --quiet >/dev/null \
        && "$BIN/kpack" convert "$T/rt" "$T/rt.kpk" --quiet && rm -rf "$T/rt" || notok "real-tokenizer model"
    start chat "$T/rt.kpk" --max-seqs 4 --ctx 1024 --quiet && {
        printf '{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"What is 2+2? <|open|>"}],"reasoning_effort":"low"}' >"$T/chat.json"
        "$BIN/krun" tokenize "$T/rt.kpk" --chat "$T/chat.json" >"$T/chat.ids"
        curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
            -d '{"model":"rt","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"What is 2+2? <|open|>"}],"reasoning_effort":"low","max_tokens":20,"temperature":0.6,"seed":4,"return_token_ids":true}' >"$T/chat.out"
        ids=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompt_token_ids"])))' "$T/chat.out")
        [ "$ids" = "$(cat "$T/chat.ids")" ] && ok "chat, curl: the prompt is the request rendered in K3's chat format (== krun tokenize --chat)" \
            || notok "chat prompt ids differ from krun tokenize --chat"
        "$BIN/krun" "$T/rt.kpk" --ids "$ids" --gen 20 --temp 0.6 --seed 4 --print-ids --quiet --ignore-eos >"$T/cli.ids"
        python3 - "$T" <<'PY' && ok "chat, curl: output ids == krun on the rendered prompt with the same sampling; reasoning_content, usage, finish" \
            || notok "chat output"
import json, sys
d = sys.argv[1]
j = json.load(open(d + "/chat.out"))
cli = [int(x) for x in open(d + "/cli.ids").read().split()]
ch = j["choices"][0]
assert ch["token_ids"] == cli[:len(ch["token_ids"])] and (len(ch["token_ids"]) == 20 or ch["finish_reason"] == "stop"), (ch, cli)
assert j["object"] == "chat.completion" and ch["message"]["role"] == "assistant" and "reasoning_content" in ch["message"], j
assert j["usage"]["completion_tokens"] == len(ch["token_ids"]) and ch["finish_reason"] in ("length", "stop"), j
PY
        python3 - "$T/chatreqs.json" <<'PY'
import json, sys
u = lambda t: [{"role": "user", "content": t}]
reqs = [
    {"path": "/v1/chat/completions", "body": {"messages": u("Hello!"), "max_tokens": 8, "temperature": 0.8, "seed": 1}},
    {"path": "/v1/chat/completions", "body": {"messages": u("Tell me a story about a fox."), "max_tokens": 25, "temperature": 0,
                                               "reasoning_effort": "none", "stream": True}},
    {"path": "/v1/chat/completions", "body": {"messages": [{"role": "system", "content": "You are terse."}] + u("Why is the sky blue?"),
                                               "max_tokens": 40, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}},
    {"path": "/v1/chat/completions", "body": {"messages": u("x" * 300), "max_tokens": 6, "temperature": 0.5, "seed": 2, "reasoning_effort": "high"}},
    {"path": "/v1/completions", "body": {"prompt": "The capital of France is", "max_tokens": 15, "temperature": 0}},
]
json.dump(reqs, open(sys.argv[1], "w"))
PY
        python3 "$SC" batch "$PORT" "$T/chatreqs.json" "real tokenizer, chat and completions mixed: "
        py <<'PY' && ok "chat streamed: role first, reasoning_content then content deltas, finish chunk, [DONE]; reasoning_effort none: no reasoning" \
            || notok "chat stream shape"
import sys, serve_client as c
port = int(sys.argv[1])
s, ctype, ev = c.sse(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0, "stream": True})
assert s == 200 and ctype == "text/event-stream" and ev[-1] == "[DONE]", (s, ctype, ev[-1])
assert ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""} and ev[0]["object"] == "chat.completion.chunk", ev[0]
content, reasoning, finish, usage, done = c.text_of(ev, True)
assert finish in ("length", "stop") and done and len(set(e["id"] for e in ev[:-1])) == 1
s, ctype, ev = c.sse(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0,
                                                    "reasoning_effort": "none", "stream": True})
content2, reasoning2, finish2, _, _ = c.text_of(ev, True)
assert reasoning2 == "" and not any("reasoning_content" in e["choices"][0]["delta"] for e in ev[:-1] if e["choices"]), ev
PY
        # a stop string taken from a reply: that reply, cut before it, finish stop
        py <<'PY' && ok "chat stop string: the content is cut before it, finish stop, fewer tokens; streamed the same" || notok "chat stop"
import sys, serve_client as c
port = int(sys.argv[1])
base = {"messages": [{"role": "user", "content": "Count"}], "max_tokens": 60, "temperature": 0, "reasoning_effort": "none", "return_token_ids": True}
s, _, j = c.post(port, "/v1/chat/completions", base)
text = j["choices"][0]["message"]["content"]
assert len(text) > 12, j
stop = text[6:10]
cut = text[:text.find(stop)]
s, _, k = c.post(port, "/v1/chat/completions", dict(base, stop=[stop]))
assert k["choices"][0]["message"]["content"] == cut and k["choices"][0]["finish_reason"] == "stop", (stop, cut, k)
assert k["usage"]["completion_tokens"] < j["usage"]["completion_tokens"]
# streamed (issue 25.1: this crashed the server), then an end id only (no stop strings)
s, _, ev = c.sse(port, "/v1/chat/completions", dict(base, stop=[stop], stream=True))
content, _, finish, _, done = c.text_of(ev, True)
assert s == 200 and content == cut and finish == "stop" and done, (s, content, cut, finish)
s, _, ev = c.sse(port, "/v1/chat/completions", dict(base, stream=True))
content, _, finish, _, done = c.text_of(ev, True)
assert s == 200 and content == text and done, (content, text)
assert c.health(port)["status"] == "ok"
PY
        stop
    }
    # the official openai npm client
    NODE_DIR="$TOP/tests/node"
    if ! command -v node >/dev/null; then
        skip "openai npm client: node is not installed"
    elif [ ! -d "$NODE_DIR/node_modules/openai" ]; then
        skip "openai npm client: not installed (npm ci --prefix tests/node; .ci/run does it)"
    else
        start node "$T/rt.kpk" --max-seqs 4 --ctx 1024 --api-key k-123 --quiet && {
            node "$NODE_DIR/openai_client.mjs" "http://127.0.0.1:$PORT/v1" k-123 rt
            stop
        }
    fi
else
    skip "chat endpoints: the real tokenizer $TOK is absent"
fi
finish
