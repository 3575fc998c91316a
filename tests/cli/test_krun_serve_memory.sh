#!/usr/bin/env bash
# krun serve's memory for requests, bounded per request and in all (issue 34.3-5, 34.14; docs/SERVE.md,
# "Memory"): bodies without the key are never read; a body's JSON may take 24 bytes per byte of it;
# every request reserves its share of --request-memory before its body is read.  The shapes that took
# gigabytes before: 2,000 Anthropic text blocks (RSS 138 -> 2,049 MB), /tokenize with_pieces of 8 MB
# (1.73 GB, 1.6 GB kept; 6.35 GB for four), 180 keyless 8 MB bodies (1.6 GB), [{},{},...] (73 bytes of
# tree per byte).  RSS figures are skipped in sanitizer builds (shadow memory).
. "$(dirname "$0")/lib.sh"
export PYTHONPATH="$TOP/tests/cli${PYTHONPATH:+:$PYTHONPATH}"
SLOW=1; [ -n "${KPK_SANITIZED:-}" ] && SLOW=5
export SLOW NOT_KRUNS_MEMORY
TOK="$K3_SHARED/fixtures/tokenizer/tiktoken.model"
[ -f "$TOK" ] || { skip "krun serve memory: the real tokenizer is not in ../shared/fixtures (/tokenize and the chat need it)"; finish; exit 0; }
"$BIN/k3synth" "$T/rt" --geometry tiny --seed 2 --layers 3 --experts 4 --topk 2 --tokenizer "$TOK" --quiet >/dev/null 2>"$T/err" \
    && "$BIN/kpack" convert "$T/rt" "$T/rt.kpk" --quiet && rm -rf "$T/rt" || { notok "model: $(cat "$T/err")"; finish; exit 1; }
. "$(dirname "$0")/serve_lib.sh"
stopped() {
    stop
    if [ "$RC" -eq 0 ] && ! grep -qE "AddressSanitizer|LeakSanitizer|runtime error:" "$T/$1.err"; then ok "$1: exit 0 on SIGTERM, no sanitizer report"
    else notok "$1: exit $RC: $(grep -m3 -E "ERROR|runtime error|SUMMARY" "$T/$1.err")"; fi
}
cat >"$T/mem.py" <<'PY'
import os, socket, threading, json, time
def status(pid, key):
    for l in open("/proc/%d/status" % pid):
        if l.startswith(key + ":"): return int(l.split()[1]) * 1024
def send(port, method, path, body, headers=b"", timeout=300):
    """One request on its own connection (Connection: close); (status, body)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(b"%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
              % (method.encode(), path.encode(), len(body), headers))
    try: s.sendall(body)
    except OSError: pass                        # answered and closed before the body was read: what we want
    parts = []
    try:
        while True:
            b = s.recv(1 << 20)
            if not b: break
            parts.append(b)
    except OSError: pass
    s.close()
    data = b"".join(parts)
    head, _, rest = data.partition(b"\r\n\r\n")
    st = int(head.split(b" ")[1]) if head.startswith(b"HTTP/") else 0
    if b"transfer-encoding: chunked" in head.lower():
        out, at = [], 0
        while True:
            nl = rest.index(b"\r\n", at); n = int(rest[at:nl], 16)
            if not n: break
            out.append(rest[nl + 2:nl + 2 + n]); at = nl + 2 + n + 2
        rest = b"".join(out)
    return st, rest
def parallel(n, fn):
    out = [None] * n
    def one(i): out[i] = fn(i)
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts: t.start()
    for t in ts: t.join()
    return out
PY
export MEMPY="$T/mem.py"

# ---- without the key: no body is read (issue 34.5) ------------------------------------------------
start keyless "$T/rt.kpk" --quiet --api-key sekrit || { finish; exit 1; }
SPID=$PID py <<'PY' && ok "60 keyless connections each sending 8 MB to an unknown path, POST /health and /v1/completions: 401 or 405 at once, no body read (RSS grew < 64 MB)" \
    || notok "keyless bodies"
import sys, os, time; sys.path.insert(0, os.path.dirname(os.environ["MEMPY"])); import mem
port, pid = int(sys.argv[1]), int(os.environ["SPID"])
big = b"x" * (8 << 20)
before = mem.status(pid, "VmHWM")
paths = ["/nope", "/health", "/v1/completions"]
t0 = time.time()
got = mem.parallel(60, lambda i: mem.send(port, "POST", paths[i % 3], big)[0])
grew = mem.status(pid, "VmHWM") - before
print("# statuses %s in %.1f s; peak RSS grew %.1f MB" % (sorted(set(got)), time.time() - t0, grew / 1e6))
assert set(got) <= {401, 405} and got.count(405) == 20, got
assert os.environ.get("NOT_KRUNS_MEMORY") or grew < 64 << 20, grew
PY
stopped keyless

# ---- one request, bounded (issue 34.3, 34.4, 34.14) -------------------------------------------------
start one "$T/rt.kpk" --quiet --ctx 4096 || { finish; exit 1; }
SPID=$PID py <<'PY' && ok "2,000 Anthropic text blocks of 1,000 characters: answered (400: the prompt exceeds --ctx) in seconds, peak RSS +< 200 MB (was 2 GB); 8,000 blocks too" \
    || notok "Anthropic text blocks"
import sys, os, time, json; sys.path.insert(0, os.path.dirname(os.environ["MEMPY"])); import mem
port, pid = int(sys.argv[1]), int(os.environ["SPID"])
before = mem.status(pid, "VmHWM")
for n in (2000, 8000):
    body = json.dumps({"model": "rt", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "text", "text": "a" * 1000}] * n}]}).encode()
    t0 = time.time()
    st, out = mem.send(port, "POST", "/v1/messages", body)
    e = json.loads(out)["error"]
    assert st == 400 and "more than the context" in e["message"], (st, out[:300])
    print("# %d blocks (%.1f MB): %d in %.1f s" % (n, len(body) / 1e6, st, time.time() - t0))
grew = mem.status(pid, "VmHWM") - before
print("# peak RSS grew %.1f MB" % (grew / 1e6))
assert os.environ.get("NOT_KRUNS_MEMORY") or grew < 200 << 20, grew
PY
SPID=$PID py <<'PY' && ok "/tokenize with_pieces on an 8 MB body: every piece right, peak RSS +< 400 MB (was 1.73 GB), < 64 MB kept afterwards (was 1.6 GB)" \
    || notok "/tokenize with_pieces"
import sys, os, json; sys.path.insert(0, os.path.dirname(os.environ["MEMPY"])); import mem
port, pid = int(sys.argv[1]), int(os.environ["SPID"])
rss0, before = mem.status(pid, "VmRSS"), mem.status(pid, "VmHWM")
text = "a!b?" * ((8 << 20) // 4 - 64)
st, out = mem.send(port, "POST", "/tokenize", json.dumps({"content": text, "with_pieces": True}).encode())
assert st == 200, (st, out[:200])
toks = json.loads(out)["tokens"]
assert "".join(t["piece"] for t in toks) == text and all(isinstance(t["id"], int) for t in toks), len(toks)
st, out = mem.send(port, "POST", "/tokenize", json.dumps({"content": "a\u0001\"\\\n<|end_of_msg|>é", "with_pieces": True}).encode())
assert st == 200 and "".join(t["piece"] for t in json.loads(out)["tokens"]) == "a\u0001\"\\\n<|end_of_msg|>é", out
grew, kept = mem.status(pid, "VmHWM") - before, mem.status(pid, "VmRSS") - rss0
print("# %d tokens; peak RSS grew %.1f MB, %.1f MB kept" % (len(toks), grew / 1e6, kept / 1e6))
assert os.environ.get("NOT_KRUNS_MEMORY") or (grew < 400 << 20 and kept < 64 << 20), (grew, kept)
PY
SPID=$PID py <<'PY' && ok "an 8 MB body of [{},{},...] (73 bytes of JSON tree per byte): 413 request_too_complex, peak RSS +< 300 MB; the same JSON as text within its share is fine" \
    || notok "a body too complex"
import sys, os, json; sys.path.insert(0, os.path.dirname(os.environ["MEMPY"])); import mem
port, pid = int(sys.argv[1]), int(os.environ["SPID"])
before = mem.status(pid, "VmHWM")
body = b'{"prompt":[' + b"{}," * ((8 << 20) // 3 - 8) + b'{}]}'
st, out = mem.send(port, "POST", "/v1/completions", body)
assert st == 413 and json.loads(out)["error"]["code"] == "request_too_complex", (st, out[:300])
grew = mem.status(pid, "VmHWM") - before
print("# peak RSS grew %.1f MB" % (grew / 1e6))
assert os.environ.get("NOT_KRUNS_MEMORY") or grew < 300 << 20, grew
st, out = mem.send(port, "POST", "/v1/completions", json.dumps({"prompt": "[{},{}]" * 1000, "max_tokens": 1}).encode())
assert st == 200, (st, out[:200])
PY
py <<'PY' && ok "max_tokens 2^31 in /v1/messages: \"must be at most 2147483647\" (was \"must be at least 1\"); a key twice in one object: 400 naming it, in both APIs and /tokenize" \
    || notok "max_tokens, duplicate keys"
import sys, json, serve_client as c
port = int(sys.argv[1])
st, _, b = c.request(port, "POST", "/v1/messages", {"model": "rt", "max_tokens": 2 ** 31, "messages": [{"role": "user", "content": "hi"}]})
assert st == 400 and "max_tokens: must be at most 2147483647" in json.loads(b)["error"]["message"], b
for path, body in (("/v1/completions", '{"prompt": "a", "max_tokens": 1, "max_tokens": 2}'),
                   ("/v1/messages", '{"model": "rt", "max_tokens": 1, "messages": [{"role": "user", "content": "a", "content": "b"}]}'),
                   ("/tokenize", '{"content": "a", "content": "b"}')):
    st, _, b = c.request(port, "POST", path, body.encode())
    assert st == 400 and "a key twice in one object" in b.decode(), (path, st, b)
PY
stopped one

# ---- in all: --request-memory (issue 34.5) ----------------------------------------------------------
start total "$T/rt.kpk" --quiet --max-body 1M --request-memory 40M --request-timeout 5 || { finish; exit 1; }
SPID=$PID py <<'PY' && ok "--request-memory 40M, --max-body 1M: 48 parallel 1 MB bodies that inflate (tree, pieces, blocks): each 200/400/413 or 503 server_busy, none lost, peak RSS +< 40 MB + slack; /health counts what waited" \
    || notok "--request-memory in all"
import sys, os, json, time; sys.path.insert(0, os.path.dirname(os.environ["MEMPY"])); import mem
port, pid = int(sys.argv[1]), int(os.environ["SPID"])
before = mem.status(pid, "VmHWM")
L = (1 << 20) - 64
shapes = [("/v1/completions", b'{"prompt":[' + b"{}," * (L // 3 - 8) + b'{}]}'),
          ("/tokenize", json.dumps({"content": "a!b?" * (L // 4 - 16), "with_pieces": True}).encode()),
          ("/v1/messages", json.dumps({"model": "rt", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * (L // 30)}]}).encode())]
got = mem.parallel(48, lambda i: mem.send(port, "POST", shapes[i % 3][0], shapes[i % 3][1])[0])
grew = mem.status(pid, "VmHWM") - before
h = json.loads(mem.send(port, "GET", "/health", b"")[1])["request_memory"]
print("# statuses %s; peak RSS grew %.1f MB; request_memory %s" % ({s: got.count(s) for s in set(got)}, grew / 1e6, h))
assert set(got) <= {200, 400, 413, 503} and 0 not in got, got
assert h["limit"] == 40 << 20 and h["peak"] <= 40 << 20 and h["reserved"] == 0, h
assert os.environ.get("NOT_KRUNS_MEMORY") or grew < (40 + 40) << 20, grew
PY
stopped total
expect_exit 2 "--request-memory smaller than one --max-body request's share is refused" "$BIN/krun" serve "$T/rt.kpk" --max-body 8M --request-memory 64M
finish
