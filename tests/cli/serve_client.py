"""A small HTTP client for krun serve's tests (Python standard library only).

Requests, server-sent-event streams read back as a client would, and the batching check: the
same requests run one at a time and then all at once must give identical text and token ids.
Run as a script: `serve_client.py batch PORT REQUESTS.json` prints TAP-like lines."""
import http.client
import json
import socket
import sys
import threading
import time


def request(port, method, path, body=None, headers=None, timeout=120):
    """(status, headers as a dict with lower-case names, body bytes)"""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    hdrs = {k.lower(): v for k, v in r.getheaders()}
    c.close()
    return r.status, hdrs, data


def post(port, path, obj, headers=None):
    """(status, headers, parsed JSON body)"""
    s, h, b = request(port, "POST", path, obj, headers)
    try:
        return s, h, json.loads(b)
    except ValueError:
        return s, h, {"unparsed": b.decode("utf-8", "replace")}


def health(port, headers=None):
    """GET /health (with --api-key, give the key to see more than the status)"""
    s, _, b = request(port, "GET", "/health", None, headers)
    j = json.loads(b)
    j["http_status"] = s
    return j


def sse(port, path, obj, headers=None):
    """(status, content-type, events): each event the parsed JSON of a data line, or "[DONE]"."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    c.request("POST", path, body=json.dumps(obj), headers=h)
    r = c.getresponse()
    ctype = r.getheader("Content-Type")
    events = []
    if r.status != 200:
        events.append(json.loads(r.read()))
        c.close()
        return r.status, ctype, events
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if ev.startswith(b":"):
                continue        # a comment (krun sends one to a client whose input ended)
            assert ev.startswith(b"data: "), ev
            d = ev[6:].decode()
            events.append("[DONE]" if d == "[DONE]" else json.loads(d))
    c.close()
    assert not buf, buf
    return r.status, ctype, events


def text_of(events, chat):
    """What a stream said: (content or text, reasoning, finish_reason, usage, done last)."""
    content, reasoning, finish, usage = "", "", None, None
    for e in events:
        if e == "[DONE]":
            continue
        if "error" in e:
            finish = "error"
            continue
        if e.get("usage"):
            usage = e["usage"]
        for ch in e.get("choices", []):
            if chat:
                d = ch.get("delta", {})
                content += d.get("content") or ""
                reasoning += d.get("reasoning_content") or ""
            else:
                content += ch.get("text", "")
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
    return content, reasoning, finish, usage, bool(events) and events[-1] == "[DONE]"


def parse_responses(data):
    """HTTP/1.1 responses in data, in order: [(status, headers as a dict with lower-case names,
    body bytes)], and the bytes left over (an incomplete response).  1xx interim responses are
    listed too (they have no body)."""
    out = []
    while True:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            return out, data
        head = data[:end].decode("latin-1").split("\r\n")
        status = int(head[0].split()[1])
        hdrs = {}
        for line in head[1:]:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        rest = data[end + 4:]
        if 100 <= status < 200:
            out.append((status, hdrs, b""))
            data = rest
            continue
        if hdrs.get("transfer-encoding", "").lower() == "chunked":
            body, pos = b"", 0
            while True:
                nl = rest.find(b"\r\n", pos)
                if nl < 0:
                    return out, data
                size = int(rest[pos:nl].split(b";")[0], 16)
                if len(rest) < nl + 2 + size + 2:
                    return out, data
                body += rest[nl + 2:nl + 2 + size]
                pos = nl + 2 + size + 2
                if size == 0:
                    break
            out.append((status, hdrs, body))
            data = rest[pos:]
        else:
            n = int(hdrs.get("content-length", "0"))
            if len(rest) < n:
                return out, data
            out.append((status, hdrs, rest[:n]))
            data = rest[n:]


def raw(port, data, timeout=10, shut_wr=False, host="127.0.0.1", source=None):
    """Send data on a new connection (then shut its writing side down if shut_wr), read until the
    server closes it or timeout seconds pass.  Returns (responses as parse_responses gives them,
    leftover bytes, closed: the server closed the connection)."""
    s = socket.create_connection((host, port), timeout=timeout, source_address=(source, 0) if source else None)
    s.settimeout(timeout)
    s.sendall(data)
    if shut_wr:
        s.shutdown(socket.SHUT_WR)
    got, closed = b"", False
    try:
        while True:
            d = s.recv(65536)
            if not d:
                closed = True
                break
            got += d
    except socket.timeout:
        pass
    s.close()
    responses, rest = parse_responses(got)
    return responses, rest, closed


class Swarm:
    """n sockets that hold connections open: silent ones (connect, say nothing) or tricklers
    (send one byte of a request every `every` seconds; body=True: the headers at once, then the
    body a byte at a time).  A thread keeps them going; those the server closes are counted, and
    reopened at the next tick when reconnect is set.  source: the address to connect from (127.0.0.2 is another
    client than 127.0.0.1 to the server, on the same machine)."""

    def __init__(self, port, n, trickle=True, every=1.0, body=False, reconnect=False, source=None):
        import select
        self.select = select
        self.port, self.trickle, self.every, self.body, self.reconnect, self.source = port, trickle, every, body, reconnect, source
        payload = b'{"prompt": [1, 2, 3], "max_tokens": 1}'
        self.request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                        % len(payload) + payload)
        self.head = self.request.index(b"\r\n\r\n") + 4
        self.socks = {}             # socket -> [bytes sent, time opened]
        self.opened = self.closed = self.refused = 0
        self.lifetimes = []         # seconds each connection the server closed was open
        self.stop_flag = False
        self.reopen = 0
        for _ in range(n):
            self._open()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _open(self):
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5,
                                         source_address=(self.source, 0) if self.source else None)
        except OSError:
            self.refused += 1
            return
        s.setblocking(False)
        sent = 0
        if self.trickle and self.body:
            try:
                sent = s.send(self.request[:self.head])
            except OSError:
                pass
        self.socks[s] = [sent, time.time()]
        self.opened += 1

    def _drop(self, s):
        self.lifetimes.append(time.time() - self.socks[s][1])
        del self.socks[s]
        s.close()
        self.closed += 1

    def _run(self):
        next_tick = time.time()
        while not self.stop_flag:
            # the server closing a socket: readable with nothing to read (or an error)
            r, _, _ = self.select.select(list(self.socks), [], [], 0.05)
            for s in r:
                try:
                    gone = s.recv(4096) == b""
                except OSError:
                    gone = True
                if gone:
                    self._drop(s)
                    self.reopen += self.reconnect
            if time.time() >= next_tick:
                next_tick += self.every
                while self.reopen:
                    self.reopen -= 1
                    self._open()
                for s, st in list(self.socks.items()):
                    if not self.trickle or st[0] >= len(self.request) - 1:
                        continue            # never the last byte: the request never arrives
                    try:
                        st[0] += s.send(self.request[st[0]:st[0] + 1])
                    except OSError:
                        self._drop(s)
                        self.reopen += self.reconnect

    def stop(self):
        self.stop_flag = True
        self.thread.join()
        for s in list(self.socks):
            s.close()
        self.socks.clear()


def timed(port, method, path, body=None, headers=None, timeout=60):
    """(seconds, status) of one request on a new connection."""
    t0 = time.time()
    s, _, _ = request(port, method, path, body, headers, timeout)
    return time.time() - t0, s


def run_one(port, req):
    """The outcome of one request: what a test compares between solo and batched runs."""
    path = req["path"]
    chat = path.endswith("chat/completions")
    body = dict(req["body"])
    if body.get("stream"):
        s, _, ev = sse(port, path, body)
        content, reasoning, finish, usage, done = text_of(ev, chat)
        return {"status": s, "text": content, "reasoning": reasoning, "finish": finish, "done": done,
                "completion_tokens": usage and usage["completion_tokens"]}
    body["return_token_ids"] = True
    s, _, j = post(port, path, body)
    ch = j["choices"][0]
    return {"status": s, "text": ch["message"]["content"] if chat else ch["text"],
            "reasoning": ch["message"].get("reasoning_content") if chat else None,
            "finish": ch["finish_reason"], "ids": ch["token_ids"], "prompt_ids": j["prompt_token_ids"],
            "completion_tokens": j["usage"]["completion_tokens"]}


def batch(port, reqs):
    """Each request alone, then all at once: identical outcomes.  Returns (alone, together, sweeps
    of the concurrent phase, tokens it generated)."""
    alone = [run_one(port, r) for r in reqs]
    h0 = health(port)
    together = [None] * len(reqs)
    start = threading.Barrier(len(reqs))

    def go(i):
        start.wait()
        together[i] = run_one(port, reqs[i])
    ts = [threading.Thread(target=go, args=(i,)) for i in range(len(reqs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    h1 = health(port)
    sweeps = h1["stats"]["sweeps"] - h0["stats"]["sweeps"]
    tokens = h1["stats"]["generated_tokens"] - h0["stats"]["generated_tokens"]
    return alone, together, sweeps, tokens


def main():
    if sys.argv[1] == "batch":
        port, reqs = int(sys.argv[2]), json.load(open(sys.argv[3]))
        label = sys.argv[4] if len(sys.argv) > 4 else ""
        alone, together, sweeps, tokens = batch(port, reqs)
        bad = [i for i in range(len(reqs)) if alone[i] != together[i] or alone[i]["status"] != 200]
        if bad:
            for i in bad:
                print("# request %d alone:    %s" % (i, json.dumps(alone[i])[:400]))
                print("# request %d together: %s" % (i, json.dumps(together[i])[:400]))
            print("not ok - %s%d concurrent requests differ from the same requests run alone: %s" % (label, len(reqs), bad))
        else:
            print("ok - %s%d concurrent requests: text, token ids, finish reasons and usage identical to each run alone"
                  % (label, len(reqs)))
        if tokens and sweeps < tokens:
            print("ok - %sthey were batched: %d tokens generated in %d sweeps" % (label, tokens, sweeps))
        else:
            print("not ok - %snot batched: %d tokens generated in %d sweeps" % (label, tokens, sweeps))
        return 0
    raise SystemExit("usage: serve_client.py batch PORT REQUESTS.json [LABEL]")


if __name__ == "__main__":
    sys.exit(main())
