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
curl -s "${H[@]}" "$URL/v1/chat/completions" -d '{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"string","format":"email"}}}}' >"$T/bad.out"
grep -q '"param":"response_format.json_schema.schema.format"' "$T/bad.out" && ok "an unsupported keyword (format): 400 naming it" || notok "format: $(cat "$T/bad.out")"
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
finish
