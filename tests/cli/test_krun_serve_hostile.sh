#!/usr/bin/env bash
# krun serve against clients that do not behave (issue 25): conflicting framing over raw sockets
# (400 and the connection closed, nothing smuggled behind it is answered); clients that half-close
# after their request (they get their whole answer) and clients that really leave (their sequence
# is freed); sockets that connect and say nothing, or trickle a byte a second, by the hundred
# (a normal request and /health still answered within a second; the request deadline closes them).
. "$(dirname "$0")/lib.sh"
export PYTHONPATH="$TOP/tests/cli${PYTHONPATH:+:$PYTHONPATH}"
# sanitizer builds run several times slower: wait longer, never assert on speed
SLOW=1; [ -n "${KPK_SANITIZED:-}" ] && SLOW=5
export SLOW

"$BIN/k3synth" "$T/m" --geometry tiny --seed 21 --quiet >/dev/null 2>"$T/err" || { notok "k3synth: $(cat "$T/err")"; finish; exit 1; }
"$BIN/kpack" convert "$T/m" "$T/m.kpk" --quiet || { notok "convert"; finish; exit 1; }
rm -rf "$T/m"

# start NAME ARGS...: krun serve in the background on a free port; sets PORT and PID
start() {
    local name=$1; shift
    "$BIN/krun" serve "$@" --port 0 >"$T/$name.out" 2>"$T/$name.err" &
    PID=$!; PORT=
    for _ in $(seq $((100 * SLOW))); do
        PORT=$(sed -n 's/.*listening on http:\/\/.*:\([0-9]*\)$/\1/p; s/.*listening on port \([0-9]*\)$/\1/p' "$T/$name.err" 2>/dev/null)
        [ -n "$PORT" ] && return 0
        kill -0 $PID 2>/dev/null || break
        sleep 0.1
    done
    notok "krun serve $* did not start: $(head -c 400 "$T/$name.err")"
    kill -9 $PID 2>/dev/null; PID=0; PORT=0
    return 1
}
stop() {
    kill -"${1:-TERM}" $PID 2>/dev/null
    wait $PID; RC=$?
}
py() { python3 - "$PORT" "$@"; }

# ---- framing (issue 25.3, RFC 9112 6.3) ----------------------------------------------------------
start framing "$T/m.kpk" --quiet || { finish; exit 1; }
py <<'PY' && ok "conflicting framing: two Content-Length values, chunked with Content-Length, chunked not last or twice, Transfer-Encoding in HTTP/1.0: 400 (501 for gzip), the connection closed, the request smuggled behind it never answered" \
    || notok "framing"
import sys, json, serve_client as c
port = int(sys.argv[1])
body = b'{"prompt":[1,2],"max_tokens":1,"temperature":0}'
n = len(body)
chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (n, body)
smuggled = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
def req(fields, payload, version=b"1.1"):
    return b"POST /v1/completions HTTP/" + version + b"\r\nHost: x\r\nContent-Type: application/json\r\n" + fields + b"\r\n" + payload
refused = [
    ("two Content-Length, the real one first", req(b"Content-Length: %d\r\nContent-Length: 0\r\n" % n, body), 400),
    ("two Content-Length, the real one last", req(b"Content-Length: 0\r\nContent-Length: %d\r\n" % n, body), 400),
    ("two Content-Length, other cases", req(b"content-length: %d\r\nCONTENT-LENGTH: 3\r\n" % n, body), 400),
    ("chunked then Content-Length", req(b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n" % n, chunked), 400),
    ("Content-Length then chunked", req(b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % len(chunked), chunked), 400),
    ("chunked twice", req(b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", chunked), 400),
    ("chunked, identity", req(b"Transfer-Encoding: chunked, identity\r\n", chunked), 400),
    ("identity", req(b"Transfer-Encoding: identity\r\n", body), 400),
    ("gzip, chunked", req(b"Transfer-Encoding: gzip, chunked\r\n", chunked), 501),
    ("chunked in HTTP/1.0", req(b"Transfer-Encoding: chunked\r\n", chunked, b"1.0"), 400),
]
for what, data, status in refused:
    rs, rest, closed = c.raw(port, data + smuggled, timeout=10)
    assert len(rs) == 1 and rs[0][0] == status and closed and not rest, (what, rs, rest, closed)
    e = json.loads(rs[0][2])["error"]
    assert e["code"] in ("bad_framing", "unsupported_transfer_encoding") and "RFC 9112" in e["message"] or status == 501, (what, e)
    assert rs[0][1].get("connection", "").lower() == "close", (what, rs[0][1])
# the same pipelines with sound framing: both requests answered (so the test can tell)
accepted = [
    ("one Content-Length", req(b"Content-Length: %d\r\n" % n, body)),
    ("two equal Content-Length", req(b"Content-Length: %d\r\nContent-Length: %d\r\n" % (n, n), body)),
    ("chunked", req(b"Transfer-Encoding: chunked\r\n", chunked)),
]
for what, data in accepted:
    rs, rest, closed = c.raw(port, data + smuggled, timeout=30)
    assert [r[0] for r in rs] == [200, 200] and closed, (what, rs, rest)
    assert json.loads(rs[0][2])["choices"] and json.loads(rs[1][2])["object"] == "list", (what, rs)
h = c.health(port)
assert h["status"] == "ok" and h["stats"]["requests"] == 3, h     # only the three sound ones reached the engine
PY
stop

# ---- half-close and hang-ups (issue 25.4) --------------------------------------------------------
# A client may shut its writing side down once its request is sent (nc -N, socat, shutdown(SHUT_WR))
# and still read the answer: only a reset or a failed write means it left.
start halfclose "$T/m.kpk" --max-seqs 2 --quiet || { finish; exit 1; }
py <<'PY' && ok "a client that half-closes after its request gets its whole answer: not streamed (600 tokens), streamed (600 tokens, [DONE]), and with a keep-alive request before it" \
    || notok "half-close"
import sys, json, serve_client as c
port = int(sys.argv[1])
def req(body, close=False):
    b = json.dumps(body).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n"
            % (b"Connection: close\r\n" if close else b"", len(b)) + b)
long = {"prompt": [1, 2, 3], "max_tokens": 600, "ignore_eos": True, "temperature": 0}
rs, rest, closed = c.raw(port, req(long), timeout=120, shut_wr=True)
assert [r[0] for r in rs if r[0] >= 200] == [200] and closed, (rs[:1], rest[:200], closed)
j = json.loads(rs[-1][2])
assert j["usage"]["completion_tokens"] == 600 and j["choices"][0]["finish_reason"] == "length", j["usage"]
assert rs[0][0] == 100, "the server checked the half-closed client with an interim 100 Continue"
rs, rest, closed = c.raw(port, req(dict(long, stream=True)), timeout=120, shut_wr=True)
final = [r for r in rs if r[0] >= 200]
assert len(final) == 1 and final[0][0] == 200 and closed, (rs[:1], rest[:200])
events = [e for e in final[0][2].split(b"\n\n") if e and not e.startswith(b":")]
assert final[0][2].count(b"\n:\n\n") == 1, "the server checked the half-closed client once, with an SSE comment"
assert events[-1] == b"data: [DONE]" and json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length", events[-3:]
text = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1])
assert text == j["choices"][0]["text"], "the stream says what the body said"
# two requests on one connection, the second half-closed: both answered
rs, rest, closed = c.raw(port, req({"prompt": [4], "max_tokens": 3}) + req(dict(long, max_tokens=300)), timeout=120, shut_wr=True)
final = [r for r in rs if r[0] >= 200]
assert [r[0] for r in final] == [200, 200] and json.loads(final[1][2])["usage"]["completion_tokens"] == 300 and closed, final
h = c.health(port)
assert h["stats"]["cancelled"] == 0 and h["stats"]["completed"] == h["stats"]["requests"], h["stats"]
PY
py <<'PY' && ok "a client that closes its socket while its request runs (with nothing unread: no reset) or waits in the queue (streamed), or that resets a running stream: its sequence or place is freed, far from its max_tokens" \
    || notok "hang-ups"
import sys, os, json, socket, time, serve_client as c
port = int(sys.argv[1])
slow = int(os.environ.get("SLOW", "1"))
def send(body):
    s = socket.create_connection(("127.0.0.1", port))
    b = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(b), b))
    return s
def wait_for(cond, seconds):
    t0 = time.time()
    while time.time() - t0 < seconds:
        h = c.health(port)
        if cond(h): return h, time.time() - t0
        time.sleep(0.01)
    return c.health(port), None
big = {"prompt": [1, 2, 3], "max_tokens": 4000, "ignore_eos": True}
# two running (one streamed), one streamed request queued behind them
c0 = c.health(port)["stats"]["cancelled"]
a, b, q = send(big), send(dict(big, stream=True)), send(dict(big, stream=True))
h, _ = wait_for(lambda h: h["live_sequences"] == 2 and h["queued"] == 1, 30 * slow)
assert h["live_sequences"] == 2 and h["queued"] == 1, h
q.close()
h, tq = wait_for(lambda h: h["queued"] == 0 and h["stats"]["cancelled"] == c0 + 1, 5 * slow)
assert tq is not None and h["live_sequences"] == 2, h
# a (not streamed) has nothing unread: its close is a plain end of input; b's stream has output
# waiting unread, so closing it sends a reset
a.close(); b.close()
h, t = wait_for(lambda h: h["live_sequences"] == 0, 10 * slow)
assert t is not None and h["stats"]["cancelled"] == c0 + 3 and h["stats"]["generated_tokens"] < 6000, h
print("# queued request dropped %.2f s after its client closed; running ones freed %.2f s after theirs" % (tq, t))
assert t < 1.5 * slow and tq < 1.5 * slow, (t, tq)
PY
stop
[ "$RC" -eq 0 ] && ok "after the half-closes and hang-ups the server exits 0 on SIGTERM" || notok "exit $RC: $(tail -3 "$T/halfclose.err")"

finish
