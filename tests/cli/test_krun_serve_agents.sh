#!/usr/bin/env bash
# krun serve for agents (issue 31), one server on a tiny model with the real tokenizer whose replies end
# (k3synth --end-weight): the grammar of every format and of zod's patterns against ajv + ajv-formats
# (tests/node/grammar_cases.mjs, test_constrain --cases), and random walks of it checked by ajv
# (test_constrain --walks); the Responses event stream, CORS, Ollama's
# NDJSON, GET /v1/models/ID, Anthropic's new fields and error paths, quiet client aborts, with curl and
# python; the client libraries (tests/node/agents.mjs); and one turn of each coding-agent CLI
# (tests/agents: Codex on the Responses API, Claude Code on the Messages API, opencode on chat
# completions), each configured against the server with no other network.
. "$(dirname "$0")/lib.sh"
SLOW=1; [ -n "${KPK_SANITIZED:-}" ] && SLOW=5
. "$(dirname "$0")/serve_lib.sh"

TOK="$K3_SHARED/fixtures/tokenizer/tiktoken.model"
if [ ! -f "$TOK" ]; then skip "the real tokenizer $TOK is absent"; finish; exit 0; fi
NODE_DIR="$TOP/tests/node"
HAVE_NODE=; command -v node >/dev/null && [ -d "$NODE_DIR/node_modules/ajv-formats" ] && HAVE_NODE=1

# ---- the grammar against ajv ---------------------------------------------------------------------------
if [ -n "$HAVE_NODE" ]; then
    node "$NODE_DIR/grammar_cases.mjs" "$T/cases.jsonl" >"$T/cases.out" 2>&1 && grep '^#' "$T/cases.out"
    "$BUILD/tests/test_constrain" --cases "$T/cases.jsonl" 2>&1 | grep -E '^(ok|not ok|#)' || notok "test_constrain --cases"
    # constrained outputs that finish: random walks of the same schemas' grammars, each document checked by ajv
    "$BUILD/tests/test_constrain" --walks "$T/cases.jsonl" "$T/walks.jsonl" 2>&1 | grep -E '^(ok|not ok|#)' | grep -v '^ok - write' || notok "test_constrain --walks"
    node "$NODE_DIR/grammar_cases.mjs" --check "$T/walks.jsonl" 2>&1 | grep -E '^(ok|not ok)' || notok "grammar_cases.mjs --check"
else
    skip "the grammar against ajv: node or tests/node/node_modules absent (npm ci --prefix tests/node)"
fi

"$BIN/k3synth" "$T/rt" --geometry tiny --seed 2 --layers 3 --experts 4 --topk 2 --tokenizer "$TOK" --end-weight 2 --quiet >/dev/null \
    && "$BIN/kpack" convert "$T/rt" "$T/rt.kpk" --quiet && rm -rf "$T/rt" || { notok "real-tokenizer model"; finish; exit 1; }
start agents "$T/rt.kpk" --ctx 16384 --api-key k-9 --reasoning-effort none --cors-origin http://app.example --responses-store 64 || { finish; exit 1; }
URL="http://127.0.0.1:$PORT"
export PYTHONPATH="$(dirname "$0")${PYTHONPATH:+:$PYTHONPATH}"

# ---- the Responses API on the wire --------------------------------------------------------------------
py <<'PY' && ok "POST /v1/responses streamed: 'event: T' and data.type agree, sequence_number 0, 1, 2, ..., created and in_progress first, every item added then done, response.completed last with the output streamed, no [DONE]; GET /v1/responses/ID and /input_items give it back, DELETE removes it" || notok "responses on the wire"
import json, socket, sys, serve_client as c
port = int(sys.argv[1]); auth = {"Authorization": "Bearer k-9"}
body = json.dumps({"model": "rt", "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hello"}]}], "stream": True,
                   "max_output_tokens": 60, "instructions": "Be brief.", "metadata": {"k": "v"}})
s = socket.create_connection(("127.0.0.1", port))
s.sendall(("POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k-9\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)).encode())
raw = b""
while True:
    d = s.recv(65536)
    if not d: break
    raw += d
head, _, rest = raw.partition(b"\r\n\r\n")
assert b" 200 " in head.split(b"\r\n")[0] and b"text/event-stream" in head, head
# de-chunk
out = b""
while rest:
    n, _, rest = rest.partition(b"\r\n")
    n = int(n, 16)
    if not n: break
    out += rest[:n]; rest = rest[n + 2:]
events = []
for block in out.decode().split("\n\n"):
    if not block.strip(): continue
    lines = block.split("\n")
    assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
    d = json.loads(lines[1][6:])
    assert d["type"] == lines[0][7:], (d["type"], lines[0])
    events.append(d)
assert [e["sequence_number"] for e in events] == list(range(len(events)))
assert events[0]["type"] == "response.created" and events[1]["type"] == "response.in_progress" and events[-1]["type"] in ("response.completed", "response.incomplete")
added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
done = [e["output_index"] for e in events if e["type"] == "response.output_item.done"]
assert added == done == list(range(len(added))) and added, (added, done)
final = events[-1]["response"]
text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
assert final["output"][-1]["content"][0]["text"] == text and final["instructions"] == "Be brief." and final["metadata"] == {"k": "v"}, final
s, _, j = c.request(port, "GET", "/v1/responses/" + final["id"], None, auth)
assert s == 200 and json.loads(j)["output"] == final["output"], (s, j[:200])
s, _, j = c.request(port, "GET", "/v1/responses/" + final["id"] + "/input_items", None, auth)
j = json.loads(j)
assert s == 200 and j["object"] == "list" and j["data"][0]["content"][0]["text"] == "Hello", j
s, _, j = c.request(port, "DELETE", "/v1/responses/" + final["id"], None, auth)
assert s == 200 and json.loads(j)["deleted"] is True
s, _, j = c.request(port, "GET", "/v1/responses/" + final["id"], None, auth)
assert s == 404, s
s, _, j = c.request(port, "PUT", "/v1/responses/" + final["id"], None, auth)
assert s == 405, s
# refused: what krun cannot do, named
for bad, param in (({"input": "x", "tools": [{"type": "computer"}]}, "tools[0].type"), ({"input": "x", "background": True}, "background"),
                   ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
                   ({"input": "x", "include": ["file_search_call.results"]}, "include[0]"), ({"input": "x", "top_logprobs": 2}, "top_logprobs")):
    s, _, j = c.post(port, "/v1/responses", bad, auth)
    assert s == 400 and j["error"]["param"] == param, (bad, s, j)
# hosted tools are accepted, not offered; a namespace's function comes back with its namespace
s, _, j = c.post(port, "/v1/responses", {"input": "x", "max_output_tokens": 200, "tool_choice": "required", "tools": [{"type": "web_search"},
                 {"type": "namespace", "name": "ns", "description": "d", "tools": [{"type": "function", "name": "f", "strict": True,
                  "parameters": {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": False}}]}]}, auth)
call = [i for i in j["output"] if i["type"] == "function_call"]
assert s == 200 and call and call[0]["name"] == "f" and call[0]["namespace"] == "ns" and [t["type"] for t in j["tools"]] == ["namespace"], j
PY

# ---- CORS ----------------------------------------------------------------------------------------------
H=$(curl -s -D - -o /dev/null -X OPTIONS "$URL/v1/chat/completions" -H 'Origin: http://app.example' -H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: authorization, content-type')
echo "$H" | grep -q '^HTTP/1.1 204' && echo "$H" | grep -qi '^Access-Control-Allow-Origin: http://app.example' && echo "$H" | grep -qi '^Access-Control-Allow-Headers: authorization, content-type' \
    && echo "$H" | grep -qi '^Access-Control-Allow-Methods: .*POST' && ok "--cors-origin: a preflight from the origin answered 204 without a key (origin, methods, headers)" || notok "preflight: $H"
H=$(curl -s -D - -o /dev/null "$URL/v1/models" -H 'Authorization: Bearer k-9' -H 'Origin: http://app.example')
echo "$H" | grep -qi '^Access-Control-Allow-Origin: http://app.example' && echo "$H" | grep -qi '^Vary: Origin' && ok "--cors-origin: the origin's requests carry Access-Control-Allow-Origin" || notok "CORS header: $H"
H=$(curl -s -D - -o /dev/null -X OPTIONS "$URL/v1/chat/completions" -H 'Origin: http://evil.example' -H 'Access-Control-Request-Method: POST')
! echo "$H" | grep -q '^HTTP/1.1 204' && ! echo "$H" | grep -qi '^Access-Control' && ok "another origin: its preflight not answered, no CORS headers (as for every origin with CORS off, the default)" || notok "other origin: $H"

# ---- Ollama's API on the wire --------------------------------------------------------------------------
curl -s -D "$T/o.head" "$URL/api/chat" -H 'Authorization: Bearer k-9' -d '{"model":"rt:latest","messages":[{"role":"user","content":"Hi"}],"options":{"num_predict":30,"seed":1}}' >"$T/o.ndjson"
python3 - "$T/o.ndjson" "$T/o.head" <<'PY' && ok "/api/chat streams NDJSON (application/x-ndjson): one object a line, the last done with done_reason, counts and durations; rt:latest names the model" || notok "ollama ndjson: $(head -c 400 "$T/o.ndjson")"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert "application/x-ndjson" in open(sys.argv[2]).read()
objs = [json.loads(l) for l in lines]
assert all(o["model"] == "rt:latest" and o["created_at"].endswith("Z") for o in objs)
assert all(not o["done"] for o in objs[:-1]) and objs[-1]["done"] and objs[-1]["done_reason"] in ("stop", "length")
assert objs[-1]["eval_count"] > 0 and objs[-1]["prompt_eval_count"] > 0 and objs[-1]["total_duration"] > 0
PY
s=$(curl -s -o "$T/o.err" -w '%{http_code}' "$URL/api/chat" -H 'Authorization: Bearer k-9' -d '{"model":"llama3","messages":[{"role":"user","content":"Hi"}]}')
[ "$s" = 404 ] && python3 -c 'import json,sys; assert set(json.load(open(sys.argv[1]))) == {"error"}' "$T/o.err" && ok "/api/chat for another model: 404 {\"error\": ...} (Ollama's shape)" || notok "ollama 404: $s $(cat "$T/o.err")"
s=$(curl -s -o "$T/o.err" -w '%{http_code}' "$URL/api/generate" -H 'Authorization: Bearer k-9' -d '{"model":"rt","prompt":"x","images":["aGk="]}')
[ "$s" = 400 ] && grep -q 'images' "$T/o.err" && ok "/api/generate with images: 400 naming them" || notok "ollama images: $s $(cat "$T/o.err")"
# a body that is not JSON, whose error message quotes it cut inside a character (found by fuzz_ollama:
# the reply could not be built): 400 with Ollama's {"error"}, the bytes as U+FFFD
printf '{"model":"rt","prompt":"x","format":{"OO\\\\\\\xce\xa3\xa3"}}' >"$T/o.bad"
s=$(curl -s -o "$T/o.err" -w '%{http_code}' "$URL/api/generate" -H 'Authorization: Bearer k-9' --data-binary @"$T/o.bad")
[ "$s" = 400 ] && python3 -c 'import json,sys; e = json.load(open(sys.argv[1]))["error"]; assert "not valid JSON" in e, e' "$T/o.err" \
    && ok "/api/generate with a body not JSON, quoted cut inside a character: 400 {\"error\"}" || notok "ollama invalid utf-8 error: $s $(head -c 300 "$T/o.err")"
s=$(curl -s -o "$T/o.err" -w '%{http_code}' "$URL/api/tags")
[ "$s" = 401 ] && ok "/api/ needs the key like /v1/" || notok "/api/tags without key: $s"

# ---- GET /v1/models/ID, the Anthropic API's new fields and errors ---------------------------------------
py <<'PY' && ok "GET /v1/models/ID (and 404 model_not_found for another); /v1/messages: system messages among the others, thinking display omitted (a thinking block without text), a no-op context_management, others refused naming them; count_tokens' errors in Anthropic's names" || notok "models/ID, Anthropic"
import json, sys, serve_client as c
port = int(sys.argv[1]); auth = {"Authorization": "Bearer k-9"}; ak = {"x-api-key": "k-9"}
s, _, j = c.request(port, "GET", "/v1/models/rt", None, auth)
assert s == 200 and json.loads(j)["id"] == "rt", j
s, _, j = c.request(port, "GET", "/v1/models/gpt-9", None, auth)
assert s == 404 and json.loads(j)["error"]["code"] == "model_not_found", j
base = {"model": "rt", "max_tokens": 12}
s, _, j = c.post(port, "/v1/messages", dict(base, messages=[{"role": "user", "content": "x"}, {"role": "system", "content": [{"type": "text", "text": "env"}]},
                 {"role": "user", "content": "y"}]), ak)
assert s == 200, j
s, _, j = c.post(port, "/v1/messages", dict(base, messages=[{"role": "user", "content": "x"}], thinking={"type": "adaptive", "display": "omitted"},
                 context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}), ak)
assert s == 200 and j["content"][0]["type"] == "thinking" and j["content"][0]["thinking"] == "", j
s, _, j = c.post(port, "/v1/messages", dict(base, messages=[{"role": "user", "content": "x"}], context_management={"edits": [{"type": "clear_tool_uses_20250919"}]}), ak)
assert s == 400 and j["type"] == "error" and "context_management.edits.0" in j["error"]["message"], j
s, _, j = c.post(port, "/v1/messages/count_tokens", {"model": "rt", "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "tool", "name": "t"},
                 "tools": [{"name": "t", "input_schema": {"type": "object", "properties": {"x": {"not": {}}}}}]}, ak)
assert s == 200, j      # counted: the constraint is the reply's, not the prompt's
s, _, j = c.post(port, "/v1/messages", dict(base, messages=[{"role": "user", "content": "x"}], output_config={"format": {"type": "json_schema",
                 "schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?!x)"}}}}}), ak)
assert s == 400 and "output_config.format.schema.properties.a.pattern" in j["error"]["message"] and "response_format" not in j["error"]["message"], j
PY

# ---- a reply begun (prefill) ---------------------------------------------------------------------------
py <<'PY' && ok "a reply begun: chat's continue_final_message and Anthropic's final assistant message continue it (the prompt: the generation prompt and the prefix's tokens; no reasoning, even at reasoning_effort high); without the flag a final assistant message is a finished turn; continue_final_message with add_generation_prompt, or after a user message: 400" || notok "prefill"
import json, sys, serve_client as c
port = int(sys.argv[1]); auth = {"Authorization": "Bearer k-9"}
user = [{"role": "user", "content": "Say it."}]; begun = user + [{"role": "assistant", "content": "The answer is"}]
s, _, j = c.post(port, "/v1/chat/completions", {"messages": user, "max_tokens": 1}, auth)
p0 = j["usage"]["prompt_tokens"]
s, _, t = c.post(port, "/tokenize", {"content": "The answer is"}, auth)
n = len(t["tokens"])
s, _, j = c.post(port, "/v1/chat/completions", {"messages": begun, "max_tokens": 4, "continue_final_message": True, "reasoning_effort": "none"}, auth)
assert s == 200 and j["usage"]["prompt_tokens"] == p0 + n, (p0, n, j)
s, _, j = c.post(port, "/v1/chat/completions", {"messages": begun, "max_tokens": 4, "continue_final_message": True, "reasoning_effort": "high"}, auth)
m = j["choices"][0]["message"]
assert s == 200 and not m.get("reasoning_content") and j["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0, j
s, _, j = c.post(port, "/v1/chat/completions", {"messages": begun, "max_tokens": 1}, auth)
assert s == 200 and j["usage"]["prompt_tokens"] > p0 + n, (p0, n, j["usage"])            # a finished turn, then a new one
s, _, j = c.post(port, "/v1/messages", {"model": "rt", "max_tokens": 4, "messages": begun}, {"x-api-key": "k-9"})
assert s == 200 and j["usage"]["input_tokens"] + j["usage"]["cache_read_input_tokens"] == p0 + n and j["content"][0]["type"] == "text", (p0, n, j)
s, _, j = c.post(port, "/v1/chat/completions", {"messages": begun, "continue_final_message": True, "add_generation_prompt": True}, auth)
assert s == 400 and j["error"]["param"] == "continue_final_message", j
s, _, j = c.post(port, "/v1/chat/completions", {"messages": user, "continue_final_message": True}, auth)
assert s == 400 and "continue" in j["error"]["message"], j
PY

# ---- quiet client aborts --------------------------------------------------------------------------------
py <<'PY'
import json, socket, struct, sys, time
port = int(sys.argv[1])
for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 3000, "ignore_eos": False}),
                   ("/v1/responses", {"input": "hi", "stream": True, "max_output_tokens": 3000})):
    b = json.dumps(body)
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k-9\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (path, len(b), b)).encode())
    s.recv(1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    time.sleep(0.5)
PY
sleep 1
grep -qi 'application reported\|internal error' "$T/agents.err" && notok "a client abort logged as an error: $(grep -i 'application\|internal' "$T/agents.err" | head -2)" \
    || ok "clients that hang up mid-stream (chat, responses): no 'application error' in the log"

# ---- the client libraries -------------------------------------------------------------------------------
if [ -n "$HAVE_NODE" ] && [ -d "$NODE_DIR/node_modules/@openai/agents" ]; then
    node "$NODE_DIR/agents.mjs" "$URL/v1" k-9 rt >"$T/node.out" 2>&1 || notok "agents.mjs exited non-zero"
    cat "$T/node.out"
else
    skip "client libraries: node or tests/node/node_modules absent (npm ci --prefix tests/node)"
fi

# ---- the coding-agent CLIs, one turn each ---------------------------------------------------------------
AGENTS="$TOP/tests/agents/node_modules/.bin"
metric() { curl -s -H 'Authorization: Bearer k-9' "$URL/metrics" | sed -n "s|^krun_responses_total{endpoint=\"$1\",status=\"2xx\"} ||p"; }
# (each CLI's own start-up is most of this test's time, opencode's above all: the turns run once, in make
# test's gcc build and under make asan, not again for make test-clang -- the compiler changes no byte of the
# protocol, and the curl, python and node checks above still run there)
case "${BUILD:-build}" in *clang*) CLI_SKIP="the coding-agent CLIs: run in make test's build (not again for the clang build)";; *) CLI_SKIP=;; esac
if [ -n "$CLI_SKIP" ]; then
    skip "$CLI_SKIP"
elif [ -x "$AGENTS/codex" ] && [ -x "$AGENTS/claude" ] && [ -x "$AGENTS/opencode" ]; then
    mkdir -p "$T/work" "$T/codex" "$T/claude" "$T/opencode"
    cat >"$T/codex/config.toml" <<EOF
model = "rt"
model_provider = "krun"
check_for_update_on_startup = false
[model_providers.krun]
name = "krun"
base_url = "$URL/v1"
env_key = "KRUN_KEY"
wire_api = "responses"
[analytics]
enabled = false
[feedback]
enabled = false
EOF
    b=$(metric /v1/responses)
    (cd "$T/work" && CODEX_HOME="$T/codex" HOME="$T/codex" KRUN_KEY=k-9 timeout 600 "$AGENTS/codex" exec --skip-git-repo-check -s read-only "Say hello." \
        >"$T/codex.out" 2>"$T/codex.err" </dev/null)
    rc=$?; a=$(metric /v1/responses)
    [ "$rc" = 0 ] && [ "${a:-0}" -gt "${b:-0}" ] && ! grep -q '^ERROR' "$T/codex.err" \
        && ok "Codex CLI $("$AGENTS/codex" --version | tail -1) (codex exec, wire_api responses, streamed, store false, function and namespace tools, web_search): a turn completed ($((a - ${b:-0})) responses)" \
        || notok "Codex CLI: exit $rc: $(grep -v '^$' "$T/codex.err" | tail -3)"
    b=$(metric /v1/messages)
    (cd "$T/work" && HOME="$T/claude" ANTHROPIC_BASE_URL="$URL" ANTHROPIC_API_KEY=k-9 ANTHROPIC_MODEL=rt ANTHROPIC_SMALL_FAST_MODEL=rt \
        ANTHROPIC_DEFAULT_HAIKU_MODEL=rt DISABLE_TELEMETRY=1 DISABLE_AUTOUPDATER=1 DISABLE_ERROR_REPORTING=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
        timeout 600 "$AGENTS/claude" -p "Say hello." --output-format json >"$T/claude.out" 2>"$T/claude.err" </dev/null)
    rc=$?; a=$(metric /v1/messages)
    [ "$rc" = 0 ] && python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert not j["is_error"] and j["subtype"] == "success", j' "$T/claude.out" 2>/dev/null \
        && ok "Claude Code $("$AGENTS/claude" --version 2>/dev/null | head -1) (claude -p, streamed Messages, adaptive thinking, output_config.effort, system messages, 32000 max_tokens): a turn completed ($((a - ${b:-0})) messages)" \
        || notok "Claude Code: exit $rc: $(head -c 600 "$T/claude.out") $(tail -3 "$T/claude.err")"
    cat >"$T/work/opencode.json" <<EOF
{"\$schema": "https://opencode.ai/config.json", "model": "krun/rt", "autoupdate": false, "share": "disabled",
 "provider": {"krun": {"npm": "@ai-sdk/openai-compatible", "name": "krun", "options": {"baseURL": "$URL/v1", "apiKey": "k-9"}, "models": {"rt": {"name": "rt"}}}}}
EOF
    b=$(metric /v1/chat/completions)
    (cd "$T/work" && HOME="$T/opencode" XDG_CONFIG_HOME="$T/opencode/c" XDG_DATA_HOME="$T/opencode/d" XDG_CACHE_HOME="$T/opencode/k" XDG_STATE_HOME="$T/opencode/s" \
        OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_MODELS_FETCH=1 timeout 600 "$AGENTS/opencode" run "Say hello." --model krun/rt \
        >"$T/opencode.out" 2>"$T/opencode.err" </dev/null)
    rc=$?; a=$(metric /v1/chat/completions)
    [ "$rc" = 0 ] && [ "${a:-0}" -gt "${b:-0}" ] \
        && ok "opencode $("$AGENTS/opencode" --version 2>/dev/null | tail -1) (opencode run, @ai-sdk/openai-compatible: streamed chat completions with tools): a turn completed ($((a - ${b:-0})) requests)" \
        || notok "opencode: exit $rc: $(tail -3 "$T/opencode.err")"
else
    skip "the coding-agent CLIs: not installed (bash tests/agents/install.sh; .ci/run does it)"
fi

stop
[ "$RC" = 0 ] && ok "the server exits 0" || notok "the server exited $RC"
finish
