#!/usr/bin/python3
"""The end-to-end request soak of krun serve (issue 25.1): random valid requests over every field
the server accepts, sent by clients that behave and clients that do not, against the tiny model
with the real tokenizer, under a sanitizer build of krun (`make soak`; a short run in `make test`,
tests/cli/test_serve_soak.sh).  Python standard library only.

What it does, per epoch (a server started, worked, stopped by a signal):
  * W workers send requests drawn by `draw_request` (chat and completions; stream, stop, tools,
    tool_choice, seeds, sampling, max_tokens, return_token_ids, stream_options, ...: every field
    is one entry of FIELDS, so a new field is a new entry) and act out a client behaviour drawn by
    `draw_action`: read the whole answer; half-close after the request and read it; hang up
    before the body is sent, while waiting, in the middle of a stream or of a body (a plain close
    or a reset); two requests on one keep-alive connection.
  * Every whole answer is checked: its status (200; 503 server_busy with Retry-After when the
    queue is full; 503 server_shutting_down while draining; nothing else), its JSON or SSE shape,
    usage against max_tokens, token ids, finish_reason, no stop string in the text -- per choice
    for n > 1 (each choice's index and finish, its tokens within max_tokens, usage the choices'
    sum, one usage chunk and one [DONE] in a stream), with logprobs one entry per token (streamed
    too).  A request with a seed drawn again (a third of the requests repeat an earlier one,
    streamed or not) must give the same text, reasoning, tool calls, finish, logprobs and token
    count for every choice.
  * Hostile clients among them (issue 34; `hostile` below): Anthropic content as thousands of text
    blocks, /tokenize with_pieces of megabytes, bodies without the key on unknown paths and POST
    /health (answered 401/405 before the body is sent), an obfuscated Transfer-Encoding or a
    malformed Content-Length with a request smuggled behind it, a request without Host: each must
    get its answer (one status line, JSON; the refused ones 400 and the connection closed, nothing
    after it).  The server runs with an API key (--api-key), which the other requests carry.
  * A request not answered within --deadline seconds is hung.  The server dying, a sanitizer
    report on its stderr, or an exit status other than 0 is a crash.
  * Before the epoch's signal, /health must show nothing running or queued, every request
    accounted for (requests = completed + failed + cancelled) and no connection busy.
  * The epoch ends with SIGTERM while requests are in flight (they must finish: the drain), or
    SIGINT, or two signals (the rest cancelled: an error event and [DONE], or 503).
  * The last epoch serves a copy of the model, and another model of the same size is copied over it
    while requests run (cp other.kpk live.kpk, issue 34.1): no request sent after that is answered
    200, each gets 500/503 model_damaged naming the file, /health says damaged, and the server exits
    1 on SIGTERM.

Prints the figures (requests, by status, by behaviour, disconnects, seconds, RSS) and, with
--tap, TAP lines for tests/run_all.sh.  Exit 1 if a guarantee broke.

    serve_soak.py --krun KRUN --tools BIN --tokenizer TIKTOKEN [--requests 10000] [--epochs 5]
                  [--workers 10] [--seed S] [--deadline 120] [--work DIR] [--json FILE] [--tap]
"""
import argparse
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

# ---- requests ------------------------------------------------------------------------------------

WORDS = ["the", "fox", "jumps", "over", "a", "lazy", "dog", "Hello", "world", "Kimi", "K3", "2+2", "why", "is", "sky",
         "blue", "\u4f60\u597d", "\u4e16\u754c", "\U0001f98a", "caf\u00e9", "na\u00efve", "\u00fcber", "\n", "?", "!", "<|open|>",
         "```", "{\"a\": 1}", "tab\there", "\u0000", "\u2603", "12345", "e=mc^2", "-->", "\\", "\"quoted\""]
STOPS = [".", " the", "\n", "e", "a", ",", "!", "\u4f60", "zz", "xyz", " ", "th", "ing", "\ufffd", "\U0001f98a", "0", "\"", "}"]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}},
    {"type": "function", "function": {"name": "search-web_2", "description": "Search \u4f60\u597d"}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]


def text(rng, lo=1, hi=12):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def messages(rng):
    ms = []
    if rng.random() < 0.4:
        ms.append({"role": rng.choice(["system", "developer"]), "content": text(rng)})
    for turn in range(rng.choice([1, 1, 1, 2, 3])):
        u = {"role": "user", "content": text(rng)}
        if rng.random() < 0.15:
            u["content"] = [{"type": "text", "text": text(rng)}, {"type": "text", "text": text(rng, 0, 3)}]
        if rng.random() < 0.1:
            u["name"] = "ann"
        ms.append(u)
        if turn == 0 or rng.random() < 0.5:
            continue
    if len([m for m in ms if m["role"] == "user"]) > 1:
        # a history: insert an assistant turn (plain, with reasoning, or a tool call and its result)
        i = max(k for k, m in enumerate(ms) if m["role"] == "user")
        kind = rng.random()
        if kind < 0.4:
            a = [{"role": "assistant", "content": text(rng)}]
        elif kind < 0.7:
            a = [{"role": "assistant", "content": text(rng), "reasoning_content": text(rng)}]
        else:
            cid = "call_%d" % rng.randint(0, 999)
            args = json.dumps({"city": rng.choice(["Paris", "\u5317\u4eac"])}) if rng.random() < 0.8 else {"city": "Oslo"}
            a = [{"role": "assistant", "content": None, "tool_calls": [{"id": cid, "type": "function",
                                                                         "function": {"name": "get_weather", "arguments": args}}]},
                 {"role": "tool", "tool_call_id": cid, "content": text(rng, 1, 4)}]
        ms[i:i] = a
    return ms


def completion_prompt(rng, vocab_hint=160000):
    k = rng.random()
    if k < 0.45:
        return text(rng)
    if k < 0.6:
        return [text(rng)]
    ids = [rng.randrange(0, 100000) for _ in range(rng.randint(1, 40))]
    return ids if k < 0.9 else [ids]


# Every field the server accepts: (name, endpoints, probability it is given, value drawer).  The
# drawer gets (rng, body so far) and returns the value (or the sentinel OMIT): logprobs,
# penalties, response schemas (constrained decoding), speculation, n (1..3) and streamed logprobs included.
OMIT = object()


def _stop(rng, body):
    k = rng.random()
    if k < 0.3:
        return rng.choice(STOPS)
    return rng.sample(STOPS, rng.randint(1, 4))


def _tool_choice(rng, body):
    if body.get("tools"):
        return rng.choice(["auto", "none", "required"])
    return rng.choice(["auto", "none"])


def _max_tokens(rng, body):
    """Mostly short answers, sometimes longer ones; shorter still when sampling at a temperature
    (the sampler sorts the 163,840-token vocabulary for every token: ~40 ms each, 10 times the
    tiny model's forward pass)."""
    k = rng.random()
    if body.get("temperature", 1) > 0:
        return rng.randint(1, 2) if k < 0.9 else rng.randint(3, 8)
    return rng.randint(1, 6) if k < 0.7 else rng.randint(7, 20) if k < 0.95 else rng.randint(21, 40)


def _stream_options(rng, body):
    return {"include_usage": rng.random() < 0.7} if body.get("stream") else OMIT


FIELDS = [
    ("model", "both", 0.3, lambda rng, b: "rt"),
    ("stream", "both", 0.5, lambda rng, b: rng.random() < 0.8),
    ("stream_options", "both", 0.6, _stream_options),
    ("temperature", "both", 0.9, lambda rng, b: rng.choice([0] * 12 + [0.3, 0.7, 1.0, 1.3, 2.0])),
    ("max_tokens", "both", 0.6, _max_tokens),
    ("max_completion_tokens", "chat", 0.2, _max_tokens),
    ("top_p", "both", 0.3, lambda rng, b: rng.choice([0.1, 0.5, 0.9, 1.0])),
    ("top_k", "both", 0.25, lambda rng, b: rng.choice([-1, 0, 1, 5, 40])),
    ("min_p", "both", 0.2, lambda rng, b: rng.choice([0, 0.01, 0.1, 0.5])),
    ("seed", "both", 0.6, lambda rng, b: rng.randint(-2**40, 2**40)),
    ("stop", "both", 0.4, _stop),
    ("return_token_ids", "both", 0.3, lambda rng, b: rng.random() < 0.7),
    ("ignore_eos", "completions", 0.2, lambda rng, b: rng.random() < 0.7),
    ("tools", "chat", 0.35, lambda rng, b: rng.sample(TOOLS, rng.randint(1, len(TOOLS)))),
    ("tool_choice", "chat", 0.35, _tool_choice),
    ("reasoning_effort", "chat", 0.4, lambda rng, b: rng.choice(["none", "minimal", "low", "medium", "high", "xhigh", "max"])),
    ("chat_template_kwargs", "chat", 0.1, lambda rng, b: {"thinking": rng.random() < 0.5,
                                                         "thinking_effort": rng.choice(["low", "high", "max", None])}),
    ("n", "both", 0.15, lambda rng, b: rng.randint(1, 3)),   # usage sums the choices: check_answer checks each choice and the sum
    ("logprobs", "both", 0.15, lambda rng, b: rng.random() < 0.7 if "messages" in b else rng.randint(0, 5)),
    ("top_logprobs", "chat", 0.5, lambda rng, b: rng.randint(0, 20) if b.get("logprobs") is True else OMIT),
    ("frequency_penalty", "both", 0.1, lambda rng, b: rng.choice([0, -1.5, 0.5, 2])),
    ("presence_penalty", "both", 0.1, lambda rng, b: rng.choice([0, -0.5, 1, 2])),
    ("repetition_penalty", "both", 0.05, lambda rng, b: rng.choice([1, 0.8, 1.3])),
    ("speculative", "both", 0.1, lambda rng, b: rng.choice([True, False, 0, 1, 8, 64])),
    ("logit_bias", "both", 0.03, lambda rng, b: {}),
    ("response_format", "chat", 0.1, lambda rng, b: rng.choice([{"type": "text"}, {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "r", "strict": True, "schema": {"type": "object", "properties": {
            "a": {"type": "string", "maxLength": 8}, "b": {"enum": [1, 2, 3]}}, "required": ["a", "b"], "additionalProperties": False}}}])),
    ("echo", "completions", 0.05, lambda rng, b: False),
    ("best_of", "completions", 0.05, lambda rng, b: 1),
    ("user", "both", 0.05, lambda rng, b: "soak"),            # unknown to krun: ignored
]


def draw_request(rng):
    chat = rng.random() < 0.6
    body = {"messages": messages(rng)} if chat else {"prompt": completion_prompt(rng)}
    for name, where, p, draw in FIELDS:
        if where != "both" and where != ("chat" if chat else "completions"):
            continue
        if rng.random() < p:
            v = draw(rng, body)
            if v is not OMIT:
                body[name] = v
    if not chat and "max_tokens" not in body and rng.random() < 0.8:
        body["max_tokens"] = _max_tokens(rng, body)      # (the default is 16)
    if chat and "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = _max_tokens(rng, body)      # without it a chat may use the whole context
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


def repeat_key(path, body):
    """Requests that must give the same answer: the same body but for how it is delivered.  Only
    with a seed or at temperature 0 (the server seeds the others itself)."""
    if "seed" not in body and body.get("temperature", 1) != 0:
        return None
    b = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "return_token_ids")}
    return path + json.dumps(b, sort_keys=True)


# ---- a client that talks raw HTTP ----------------------------------------------------------------

class Reader:
    """Reads one HTTP response from a socket, incrementally (interim 1xx responses skipped)."""

    def __init__(self, s, deadline):
        self.s, self.deadline, self.buf = s, deadline, b""

    def _more(self):
        left = self.deadline - time.time()
        if left <= 0:
            raise TimeoutError("deadline")
        self.s.settimeout(left)
        d = self.s.recv(65536)
        if not d:
            raise EOFError("closed")
        self.buf += d

    def head(self):
        while True:
            while b"\r\n\r\n" not in self.buf:
                self._more()
            h, self.buf = self.buf.split(b"\r\n\r\n", 1)
            lines = h.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            hdrs = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                hdrs[k.strip().lower()] = v.strip()
            if status >= 200:
                return status, hdrs

    def body(self, hdrs):
        if hdrs.get("transfer-encoding", "").lower() == "chunked":
            out = b""
            for piece in self.chunks():
                out += piece
            return out
        n = int(hdrs.get("content-length", "0"))
        while len(self.buf) < n:
            self._more()
        b, self.buf = self.buf[:n], self.buf[n:]
        return b

    def chunks(self):
        while True:
            while b"\r\n" not in self.buf:
                self._more()
            line, rest = self.buf.split(b"\r\n", 1)
            size = int(line.split(b";")[0], 16)
            while len(rest) < size + 2:
                self._more()
                line, rest = self.buf.split(b"\r\n", 1)
            self.buf = rest[size + 2:]
            if size == 0:
                return
            yield rest[:size]


KEY = "soak-key"
AUTH = b"Authorization: Bearer %s\r\n" % KEY.encode()


def request_bytes(path, body, close=False):
    b = json.dumps(body).encode()
    return (b"POST %s HTTP/1.1\r\nHost: soak\r\n%sContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n"
            % (path.encode(), AUTH, b"Connection: close\r\n" if close else b"", len(b)) + b)


def reset_close(s):
    """Close with a reset (SO_LINGER 0) rather than a plain end."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    s.close()


# ---- checking an answer --------------------------------------------------------------------------

class Bad(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Bad(what)


# well-formed answers checked, by kind (the summary prints them): n > 1, streamed with logprobs
CHECKED = {"n > 1": 0, "n > 1 streamed": 0, "streamed logprobs": 0}
CHECKED_LOCK = threading.Lock()


def wants_logprobs(body):
    v = body.get("logprobs")
    return v is True or (isinstance(v, int) and not isinstance(v, bool))


def choice_state():
    return {"content": "", "reasoning": "", "calls": {}, "finish": None, "ids": None, "lps": None}


def summarize_stream(path, body, raw):
    """The SSE body as what it says: ([per choice {content, reasoning, calls, finish, ids, lps}], usage, error)."""
    chat = path.endswith("chat/completions")
    n = body.get("n", 1)
    events = [e for e in raw.split(b"\n\n") if e]
    check(events and events[-1] == b"data: [DONE]", "a stream ends with [DONE]: %r" % raw[-200:])
    check(events.count(b"data: [DONE]") == 1, "one [DONE]")
    chs = [choice_state() for _ in range(n)]
    usage, error, ids = None, None, set()
    for e in events[:-1]:
        if e.startswith(b":"):
            continue                       # a comment (sent to a client whose input ended)
        check(e.startswith(b"data: "), "an SSE event is a data line: %r" % e[:100])
        o = json.loads(e[6:])
        if "error" in o:
            error = o["error"]
            continue
        check(o["object"] == ("chat.completion.chunk" if chat else "text_completion"), "chunk object %r" % o.get("object"))
        ids.add(o["id"])
        if o.get("usage"):
            check(usage is None and o["choices"] == [], "one usage chunk, without choices")
            usage = o["usage"]
            continue
        check(usage is None, "usage is the last chunk")
        for ch in o.get("choices", []):
            check(0 <= ch["index"] < n, "choice index %r of n %d" % (ch["index"], n))
            c = chs[ch["index"]]
            check(c["finish"] is None, "nothing after a choice's finish_reason")
            if chat:
                d = ch["delta"]
                c["content"] += d.get("content") or ""
                c["reasoning"] += d.get("reasoning_content") or ""
                for tc in d.get("tool_calls") or []:
                    x = c["calls"].setdefault(tc["index"], {"name": "", "arguments": ""})
                    f = tc.get("function", {})
                    x["name"] += f.get("name") or ""
                    x["arguments"] += f.get("arguments") or ""
            else:
                c["content"] += ch["text"]
            lp = ch.get("logprobs")
            if lp is not None:
                check(wants_logprobs(body), "logprobs only when asked for")
                c["lps"] = (c["lps"] or []) + ([t["logprob"] for t in lp["content"]] if chat else lp["token_logprobs"])
                if not chat:
                    check(len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]),
                          "a completions chunk's logprobs lists are one per token")
            if ch.get("finish_reason"):
                c["finish"] = ch["finish_reason"]
    check(len(ids) <= 1, "one id for the stream's chunks: %r" % ids)
    if error is None:
        for i, c in enumerate(chs):
            check(c["finish"] is not None, "choice %d of %d has its finish_reason" % (i, n))
            c["calls"] = [c["calls"][k] for k in sorted(c["calls"])]
            if wants_logprobs(body) and c["lps"] is None:
                c["lps"] = []
    return chs, usage, error


def summarize_body(path, body, raw):
    chat = path.endswith("chat/completions")
    o = json.loads(raw)
    check(o["object"] == ("chat.completion" if chat else "text_completion"), "object %r" % o.get("object"))
    n = body.get("n", 1)
    check([ch["index"] for ch in o["choices"]] == list(range(n)), "choices 0..n-1 in order")
    chs = []
    for ch in o["choices"]:
        c = choice_state()
        if chat:
            m = ch["message"]
            check(m["role"] == "assistant", "role assistant")
            c["calls"] = [{"name": x["function"]["name"], "arguments": x["function"]["arguments"]} for x in m.get("tool_calls") or []]
            c["content"], c["reasoning"] = m.get("content") or "", m.get("reasoning_content") or ""
        else:
            c["content"], c["calls"] = ch["text"], []
        c["ids"] = ch.get("token_ids")
        if body.get("return_token_ids"):
            check(isinstance(c["ids"], list) and isinstance(o.get("prompt_token_ids"), list), "return_token_ids: the ids")
        lp = ch.get("logprobs")
        check((lp is not None) == wants_logprobs(body), "logprobs when asked for, only then")
        if lp is not None:
            c["lps"] = [t["logprob"] for t in lp["content"]] if chat else lp["token_logprobs"]
        c["finish"] = ch["finish_reason"]
        chs.append(c)
    return chs, o["usage"], None


def check_answer(path, body, status, hdrs, raw, phase):
    """Returns the outcome to compare between repeats, or None.  Raises Bad."""
    if status == 503:
        e = json.loads(raw)["error"]
        if e.get("code") == "server_busy":
            check(int(hdrs.get("retry-after", "0")) >= 1, "503 server_busy has Retry-After")
            return None
        check(e.get("code") == "server_shutting_down" and phase != "serving", "503 %r while %s" % (e, phase))
        return None
    check(status == 200, "status %d: %r" % (status, raw[:300]))
    stream = body.get("stream")
    check(hdrs.get("content-type") == ("text/event-stream" if stream else "application/json"), "content-type %r" % hdrs.get("content-type"))
    summ = summarize_stream if stream else summarize_body
    chs, usage, error = summ(path, body, raw)
    if error is not None:
        check(error.get("code") == "server_shutting_down" and phase == "cancelling", "an error event while %s: %r" % (phase, error))
        return None
    n = len(chs)
    mt = body.get("max_completion_tokens", body.get("max_tokens", 16))   # 16: the completions default
    counts = []                          # each choice's tokens, where the answer says (token ids, logprobs; n 1: usage)
    for c in chs:
        check(c["finish"] in ("stop", "length", "tool_calls"), "finish_reason %r" % c["finish"])
        k = len(c["ids"]) if c["ids"] is not None else len(c["lps"]) if c["lps"] is not None else None
        if c["ids"] is not None and c["lps"] is not None:
            check(len(c["ids"]) == len(c["lps"]), "one logprob per token id")
        if k is None and n == 1 and usage is not None:
            k = usage["completion_tokens"]
        counts.append(k)
        if k is not None:
            check(1 <= k <= mt, "a choice's %d tokens within max_tokens %d" % (k, mt))
            check(c["finish"] != "length" or k == mt, "finish length at max_tokens")
        stops = body.get("stop")
        for s in ([stops] if isinstance(stops, str) else stops or []):
            check(s not in c["content"], "stop string %r not in the text" % s)
        if c["finish"] == "tool_calls":
            check(c["calls"], "finish tool_calls with calls")
    if usage is not None:
        check(usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], "usage adds up")
        check(n <= usage["completion_tokens"] <= n * mt, "completion_tokens %d within n %d x max_tokens %d" % (usage["completion_tokens"], n, mt))
        if None not in counts:
            check(sum(counts) == usage["completion_tokens"], "usage.completion_tokens %d is the choices' sum %r" % (usage["completion_tokens"], counts))
    else:
        check(stream and not (body.get("stream_options") or {}).get("include_usage"), "usage when asked for")
    with CHECKED_LOCK:
        CHECKED["n > 1"] += n > 1
        CHECKED["n > 1 streamed"] += n > 1 and bool(stream)
        CHECKED["streamed logprobs"] += bool(stream) and wants_logprobs(body)
    # what a repeat must say again, streamed or not: each choice's text, calls, finish, logprobs and (where known) tokens
    return {"choices": [{"content": c["content"], "reasoning": c["reasoning"], "calls": c["calls"], "finish": c["finish"],
                         "lps": c["lps"]} for c in chs],
            "tokens": usage and usage["completion_tokens"]}


# ---- hostile clients (issue 34) ------------------------------------------------------------------

SMUGGLED = b"GET /v1/models HTTP/1.1\r\nHost: soak\r\n" + AUTH + b"\r\n"


def _framed(fields, payload):
    return b"POST /v1/completions HTTP/1.1\r\nHost: soak\r\n" + AUTH + fields + b"\r\n" + payload + SMUGGLED


def _body(rng):
    return json.dumps({"prompt": text(rng), "max_tokens": 1}).encode()


def _chunked(b):
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(b), b)


# Each: (name, function of rng -> request bytes); all refused with one 400 and the connection closed.
REFUSED = [
    ("te-space-colon", lambda rng: (lambda c: _framed(b"Transfer-Encoding : chunked\r\nContent-Length: %d\r\n" % (len(c) + len(SMUGGLED)),
                                                      c + SMUGGLED))(_chunked(_body(rng)))),
    ("te-tab-colon", lambda rng: (lambda c: _framed(b"Transfer-Encoding\t: chunked\r\nContent-Length: %d\r\n" % len(c), c))(_chunked(_body(rng)))),
    ("te-chunked-comma", lambda rng: _framed(b"Transfer-Encoding: chunked,\r\n", _chunked(_body(rng)))),
    ("te-list", lambda rng: _framed(b"Transfer-Encoding: identity, chunked\r\nTransfer-Encoding: chunked\r\n", _chunked(_body(rng)))),
    ("cl-plus", lambda rng: (lambda b: _framed(b"Content-Length: +%d\r\n" % len(b), b))(_body(rng))),
    ("cl-hex", lambda rng: (lambda b: _framed(b"Content-Length: 0x%x\r\n" % len(b), b))(_body(rng))),
    ("cl-two", lambda rng: (lambda b: _framed(b"Content-Length: %d 0\r\n" % len(b), b))(_body(rng))),
    ("cl-empty", lambda rng: _framed(b"Content-Length: \r\n", _body(rng))),
    ("cl-list", lambda rng: (lambda b: _framed(b"Content-Length: %d, %d\r\n" % (len(b), len(b)), b))(_body(rng))),
    ("cl-differ", lambda rng: (lambda b: _framed(b"Content-Length: %d\r\nContent-Length: %d\r\n" % (len(b), len(b) + 1), b))(_body(rng))),
    ("no-host", lambda rng: b"GET /v1/models HTTP/1.1\r\n" + AUTH + b"\r\n" + SMUGGLED),
]
HOSTILE = ["many_blocks", "pieces", "keyless", "refused"]
ASCII_WORDS = [w for w in WORDS if w.isascii()]


def read_all(s, deadline):
    out = b""
    while True:
        left = deadline - time.time()
        if left <= 0:
            raise TimeoutError("deadline")
        s.settimeout(left)
        try:
            d = s.recv(1 << 20)
        except ConnectionResetError:
            return out
        if not d:
            return out
        out += d


def hostile(rng, s, deadline, phase):
    """One hostile client's request on socket s and the check of its answer; its kind.  Raises Bad."""
    kind = rng.choice(HOSTILE)
    if kind == "refused":
        name, make = rng.choice(REFUSED)
        s.sendall(make(rng))
        raw = read_all(s, deadline)
        head, _, rest = raw.partition(b"\r\n\r\n")
        m = re.search(rb"\r\ncontent-length: *(\d+)(?:\r\n|$)", head, re.I)
        check(m and int(m.group(1)) == len(rest), "%s: one answer, nothing after its body: %r" % (name, raw[:400]))
        check(head.startswith(b"HTTP/1.1 400 ") or (head.startswith(b"HTTP/1.1 503 ") and phase != "serving"), "%s: 400: %r" % (name, raw[:300]))
        check(b"connection: close" in head.lower(), "%s: the connection closed after the answer" % name)
        e = json.loads(rest)["error"]
        check(e["code"] in ("bad_framing", "bad_request", "server_shutting_down"), "%s: %r" % (name, e))
        return "refused " + name
    if kind == "keyless":
        # a large body declared, only its start sent: the answer comes before the rest would be read
        path = rng.choice(["/nope", "/health", "/v1/completions", "/v1/messages", "/tokenize"])
        n = rng.randint(1 << 20, 4 << 20)
        s.sendall(b"POST %s HTTP/1.1\r\nHost: soak\r\nContent-Length: %d\r\n\r\n" % (path.encode(), n) + b"x" * 4096)
        r = Reader(s, deadline)
        status, hdrs = r.head()
        raw = r.body(hdrs)
        want = 405 if path == "/health" else 401
        check(status == want or (status == 503 and phase != "serving"), "keyless %s: %d, not %d: %r" % (path, status, want, raw[:200]))
        check("close" in hdrs.get("connection", ""), "keyless %s: the connection closed, its body never read" % path)
        json.loads(raw)
        return "keyless"
    if kind == "many_blocks":
        n = rng.randint(500, 4000)
        body = {"model": "rt", "max_tokens": 1, "messages": [{"role": "user", "content": [
            {"type": "text", "text": text(rng, 1, 3)} for _ in range(n)]}]}
        s.sendall(request_bytes("/v1/messages", body, close=True).replace(AUTH, b"x-api-key: %s\r\n" % KEY.encode()))
        r = Reader(s, deadline)
        status, hdrs = r.head()
        o = json.loads(r.body(hdrs))
        if status == 200:
            check(o["type"] == "message" and o["usage"]["output_tokens"] == 1, "many blocks: %r" % o)
        elif phase == "changed" and status in (500, 503):
            check(o["type"] == "error" and "changed while it was in use" in o["error"]["message"], "many blocks: %r" % o)
        else:
            check(status in (400, 503) and o["type"] == "error", "many blocks: %d %r" % (status, o))
            check(status == 503 or "context" in o["error"]["message"], "many blocks: %r" % o)
        return "many_blocks"
    # /tokenize with_pieces of up to 2 MB: the pieces are the text (ASCII words: a piece that is part
    # of a UTF-8 sequence is sent as U+FFFD)
    t = "".join(rng.choice(ASCII_WORDS) + " " for _ in range(rng.randint(20000, 300000)))
    s.sendall(request_bytes("/tokenize", {"content": t, "with_pieces": True}, close=True))
    r = Reader(s, deadline)
    status, hdrs = r.head()
    raw = r.body(hdrs)
    if status == 503:
        check(json.loads(raw)["error"]["code"] in ("server_busy", "server_shutting_down"), "pieces: %r" % raw[:200])
        return "pieces"
    check(status == 200, "pieces: %d %r" % (status, raw[:200]))
    check("".join(p["piece"] for p in json.loads(raw)["tokens"]) == t, "pieces: the pieces are the text")
    return "pieces"


def changed_refusal(status, raw, stream):
    """True if an answer is krun serve's refusal to serve from a model file that changed (issue 34.1)."""
    if status == 200 and stream:
        errs = [json.loads(l[5:])["error"] for l in raw.decode(errors="replace").split("\n")
                if l.startswith("data:") and l[5:].strip().startswith("{") and "error" in json.loads(l[5:])]
        return bool(errs) and all(e.get("code") == "model_damaged" and LIVE_NAME in e.get("message", "") for e in errs)
    if status not in (500, 503):
        return False
    e = json.loads(raw)["error"]
    return e.get("code") == "model_damaged" and LIVE_NAME in e.get("message", "")


LIVE_NAME = "live/rt.kpk"      # the changed epoch's copy of the model (its name stays "rt")


# ---- the soak --------------------------------------------------------------------------------------

def die_with_parent():
    """In the server's process before exec: SIGKILL it if the soak dies (Linux prctl
    PR_SET_PDEATHSIG), so an interrupted soak leaves no server behind."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass

ACTIONS = [  # (name, weight)
    ("full", 70), ("half_close", 8), ("drop_before_body", 3), ("drop_waiting", 6), ("drop_mid_stream", 6),
    ("drop_mid_read", 3), ("keepalive", 4), ("hostile", 5)]


def draw_action(rng, body):
    while True:
        name = rng.choices([a for a, _ in ACTIONS], [w for _, w in ACTIONS])[0]
        if name == "drop_mid_stream" and not body.get("stream"):
            continue
        return name


class Soak:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.lock = threading.Lock()
        self.n = 0                            # requests sent (all epochs)
        self.by_status, self.by_action = {}, {}
        self.disconnects = self.half_closes = 0
        self.failures, self.hung, self.crashes, self.sanitizer = [], 0, [], 0
        self.seen = {}                        # repeat key -> outcome
        self.repeats = self.repeat_checked = 0
        self.history = []                     # (path, body) of requests with a repeat key
        self.rss = []                         # (epoch, MB)
        self.refused_after_signal = self.lost_after_signal = 0
        self.signal_time = None
        self.hostile = {}                     # hostile kind -> answers checked
        self.changed = None                   # the last epoch's model change: what was seen

    def count(self, d, k):
        d[k] = d.get(k, 0) + 1

    def fail(self, what):
        with self.lock:
            self.failures.append(what)
            if len(self.failures) <= 20:
                print("# FAILURE: %s" % what[:600], flush=True)

    def next_request(self, rng):
        with self.lock:
            if self.history and rng.random() < 0.33:
                path, body = rng.choice(self.history)
                body = dict(body)
                body["stream"] = rng.random() < 0.5
                body.pop("stream_options", None)
                if body["stream"] and rng.random() < 0.7:
                    body["stream_options"] = {"include_usage": True}
                return path, body, True
        path, body = draw_request(rng)
        return path, body, False

    def record(self, path, body, outcome, repeated):
        k = repeat_key(path, body)
        if outcome is None or k is None:
            return
        with self.lock:
            if k in self.seen:
                self.repeat_checked += 1
                was = self.seen[k]
                if was["tokens"] is None or outcome["tokens"] is None:   # a stream without usage does not say
                    was = dict(was, tokens=None)
                    outcome = dict(outcome, tokens=None)
                    if self.seen[k]["tokens"] is None:
                        self.seen[k]["tokens"] = outcome["tokens"]
                if was != outcome:
                    self.failures.append("a repeated request answered differently: %s %s: %r vs %r" % (
                        path, json.dumps(body)[:300], was, outcome))
                    print("# FAILURE: %s" % self.failures[-1][:800], flush=True)
            else:
                self.seen[k] = outcome
                if len(self.history) < 2000:
                    self.history.append((path, body))

    def one(self, rng, port, phase_of):
        path, body, repeated = self.next_request(rng)
        action = draw_action(rng, body)
        phase = phase_of()
        deadline = time.time() + self.a.deadline
        data = request_bytes(path, body, close=action != "keepalive")
        t_sent = None
        with self.lock:
            self.n += 1
            self.count(self.by_action, action)
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError as e:
            if phase_of() != "serving":
                with self.lock:
                    self.refused_after_signal += 1
                return
            self.fail("connect: %s" % e)
            return
        try:
            if action == "hostile":
                kind = hostile(rng, s, deadline, phase_of())
                with self.lock:
                    self.count(self.hostile, kind)
                return
            if action == "drop_before_body":
                s.sendall(data[:rng.randint(1, len(data) - 1)])
                time.sleep(rng.random() * 0.02)
                (reset_close if rng.random() < 0.5 else socket.socket.close)(s)
                with self.lock:
                    self.disconnects += 1
                return
            s.sendall(data)
            t_sent = time.time()
            if action == "drop_waiting":
                time.sleep(rng.random() * 0.05)
                (reset_close if rng.random() < 0.5 else socket.socket.close)(s)
                with self.lock:
                    self.disconnects += 1
                return
            if action == "half_close":
                s.shutdown(socket.SHUT_WR)
            r = Reader(s, deadline)
            status, hdrs = r.head()
            if action == "drop_mid_read" or (action == "drop_mid_stream" and status != 200):
                time.sleep(rng.random() * 0.01)
                (reset_close if rng.random() < 0.5 else socket.socket.close)(s)
                with self.lock:
                    self.disconnects += 1
                    self.count(self.by_status, status)
                return
            if action == "drop_mid_stream":
                want = rng.randint(1, 8)
                got = 0
                for piece in r.chunks():
                    got += piece.count(b"\n\n")
                    if got >= want:
                        break
                (reset_close if rng.random() < 0.5 else socket.socket.close)(s)
                with self.lock:
                    self.disconnects += 1
                    self.count(self.by_status, status)
                return
            raw = r.body(hdrs)
            with self.lock:
                self.count(self.by_status, status)
                self.half_closes += action == "half_close"
            if phase_of() == "changed":
                # another model is being copied over the file: an answer is refused (500/503, or a
                # stream's error event: model_damaged, naming the file) or, for a request sent before
                # the copy ended, a whole answer from the first model (the repeats compare it)
                refused = changed_refusal(status, raw, body.get("stream"))
                after = self.changed["at"] is not None and t_sent > self.changed["at"]
                check(refused or not after, "after the model file changed: %d %r" % (status, raw[:300]))
                if refused:
                    with self.lock:
                        self.changed["refused"] += 1
                        self.changed["refused_after"] += after
                    return
            outcome = check_answer(path, body, status, hdrs, raw, phase_of())
            self.record(path, body, outcome, repeated)
            if status == 503:
                # a client backs off as Retry-After says (jittered), so busy answers stay a minority
                time.sleep(float(hdrs.get("retry-after", "1")) * (0.5 + rng.random()))
            if action == "keepalive" and status == 200 and "close" not in hdrs.get("connection", "") and phase_of() != "changed":
                # a second request on the same connection
                path2, body2 = draw_request(rng)
                s.sendall(request_bytes(path2, body2, close=True))
                t_sent = time.time()          # (a second request sent just before the server exits may be cut)
                status2, hdrs2 = r.head()
                raw2 = r.body(hdrs2)
                with self.lock:
                    self.n += 1
                    self.count(self.by_status, status2)
                if phase_of() == "changed" and changed_refusal(status2, raw2, body2.get("stream")):
                    # the model file began to change while this second request ran: its refusal is
                    # the answer it must get (the first request was answered before the change)
                    with self.lock:
                        self.changed["refused"] += 1
                    return
                self.record(path2, body2, check_answer(path2, body2, status2, hdrs2, raw2, phase_of()), False)
        except TimeoutError:
            with self.lock:
                self.hung += 1
            self.fail("hung: no answer within %g s: %s %s (%s)" % (self.a.deadline, path, json.dumps(body)[:300], action))
        except (EOFError, ConnectionError, OSError) as e:
            # while serving, a lost connection is a failure; after a signal, a request the server had
            # for a while (sent half a second before the signal) must still be answered (the drain),
            # unless the requests were cancelled (a second signal)
            t_signal = self.signal_time
            if phase_of() == "serving" or (phase_of() == "draining" and t_sent is not None and t_signal and t_sent < t_signal - 0.5):
                self.fail("connection lost (%s: %s) %s: %s %s (%s)" % (type(e).__name__, e, phase_of(), path, json.dumps(body)[:300], action))
            else:
                with self.lock:
                    self.lost_after_signal += 1
        except (Bad, ValueError, KeyError, IndexError, TypeError) as e:
            self.fail("bad answer (%s: %s): %s %s (%s)" % (type(e).__name__, e, path, json.dumps(body)[:300], action))
        finally:
            try:
                s.close()
            except OSError:
                pass

    # -- the server --

    def start_server(self, name, extra, model=None):
        err = open(os.path.join(self.a.work, name + ".err"), "wb+")
        env = dict(os.environ)
        env.setdefault("ASAN_OPTIONS", "")
        p = subprocess.Popen([self.a.krun, "serve", model or self.model, "--port", "0", "--quiet", "--ctx", "2048", "--api-key", KEY] + extra,
                             stdout=subprocess.DEVNULL, stderr=err, env=env, preexec_fn=die_with_parent)
        port = None
        t0 = time.time()
        while time.time() - t0 < 120 and port is None:
            err.seek(0)
            for line in err.read().decode(errors="replace").splitlines():
                if "listening on port " in line:
                    port = int(line.rsplit(" ", 1)[1])
            if p.poll() is not None:
                break
            time.sleep(0.05)
        if port is None:
            p.kill()
            p.wait()
            err.seek(0)
            raise SystemExit("krun serve did not start: %s" % err.read().decode(errors="replace")[-2000:])
        return p, port, err

    def end_server(self, p, err, what, want_rc=0):
        """Wait for the server to exit; a sanitizer report or an exit status other than want_rc is a crash."""
        try:
            rc = p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = "hung at exit"
        err.seek(0)
        log = err.read().decode(errors="replace")
        err.close()
        san = [ln for ln in log.splitlines() if "Sanitizer" in ln or "runtime error:" in ln]
        if san:
            self.sanitizer += 1
            self.crashes.append("%s: sanitizer: %s" % (what, " | ".join(san[:6])))
        elif rc != want_rc:
            self.crashes.append("%s: krun serve exited %s: %s" % (what, rc, log[-1500:]))
        return rc

    def rss_mb(self, pid):
        try:
            for line in open("/proc/%d/status" % pid):
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return None

    def health(self, port):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: soak\r\n" + AUTH + b"Connection: close\r\n\r\n")
        r = Reader(s, time.time() + 30)
        st, h = r.head()
        j = json.loads(r.body(h))
        s.close()
        return j

    def epoch(self, k, n_requests, end):
        seqs, queue = self.rng.choice([(1, 2), (2, 4), (3, 6), (4, 16)])
        workers = min(self.a.workers, seqs + queue + 1)     # one beyond what it takes: some 503s
        extra = ["--max-seqs", str(seqs), "--max-queue", str(queue), "--shutdown-timeout", "30" if end != "cancel" else "0.5"]
        name = "epoch%d" % k
        self.signal_time = None
        p, port, err = self.start_server(name, extra)
        phase = ["serving"]
        sent = [0]
        sent_lock = threading.Lock()
        rss = []

        def worker(seed):
            rng = random.Random(seed)
            while True:
                with sent_lock:
                    if sent[0] >= n_requests or p.poll() is not None:
                        return
                    sent[0] += 1
                self.one(rng, port, lambda: phase[0])

        t0 = time.time()
        before = dict(self.by_status)
        ws = [threading.Thread(target=worker, args=(self.rng.random(),)) for _ in range(workers)]
        for w in ws:
            w.start()
        # the signal comes while the last requests are in flight
        while any(w.is_alive() for w in ws):
            with sent_lock:
                done = sent[0] >= n_requests
            r = self.rss_mb(p.pid)
            if r:
                rss.append(r)
            if p.poll() is not None:
                break
            if done:
                break
            time.sleep(0.2)
        alive = p.poll() is None
        if alive:
            # accounting with the last requests still running is checked after they end; the signal first
            phase[0] = "draining" if end != "cancel" else "cancelling"
            self.signal_time = time.time()
            p.send_signal(signal.SIGINT if end == "sigint" else signal.SIGTERM)
            if end == "cancel":
                time.sleep(0.05)
                p.send_signal(signal.SIGTERM)
        for w in ws:
            w.join()
        rc = self.end_server(p, err, "epoch %d" % k)
        secs = time.time() - t0
        if rss:
            self.rss.append((k, rss[0], max(rss), rss[-1]))
        print("# epoch %d: --max-seqs %d --max-queue %d, %d workers, ended by %s: %d requests (%s), %.1f s, exit %s, RSS %s" % (
            k, seqs, queue, workers, end, sent[0], ", ".join("%s: %d" % (st, n - before.get(st, 0)) for st, n in sorted(self.by_status.items())),
            secs, rc, "%.0f..%.0f MB" % (min(rss), max(rss)) if rss else "?"), flush=True)
        return secs

    def accounting_epoch(self):
        """An epoch ended without a signal, to check that everything is accounted for."""
        t0 = time.time()
        p, port, err = self.start_server("accounting", ["--max-seqs", "2", "--max-queue", "2"])
        ws = []
        each = max(4, min(20, self.a.requests // (4 * self.a.workers)))
        for i in range(self.a.workers):
            rng = random.Random(self.rng.random())
            ws.append(threading.Thread(target=lambda rng=rng: [self.one(rng, port, lambda: "serving") for _ in range(each)]))
        for w in ws:
            w.start()
        for w in ws:
            w.join()
        ok, h = False, None
        for _ in range(200):
            try:
                h = self.health(port)
            except (OSError, ValueError, EOFError) as e:
                h = {"error": str(e)}
                break                                   # the server died: end_server says how
            st = h["stats"]
            if h["live_sequences"] == 0 and h["queued"] == 0 and st["requests"] == st["completed"] + st["failed"] + st["cancelled"] \
                    and h["connections"]["busy"] <= 1:
                ok = True
                break
            time.sleep(0.05)
        if not ok:
            self.fail("after the requests: not everything accounted for: %s" % json.dumps(
                {k: h[k] for k in ("live_sequences", "queued", "stats", "connections", "error") if k in (h or {})}))
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        self.end_server(p, err, "accounting epoch")
        print("# accounting epoch: %d workers x %d requests, then every request accounted for: %s; %.1f s" % (
            self.a.workers, each, "yes" if ok else "NO", time.time() - t0), flush=True)
        return ok

    def changed_epoch(self, n_requests):
        """Another model of the same size copied over the served file while requests run (issue 34.1)."""
        live = os.path.join(self.a.work, LIVE_NAME)
        os.makedirs(os.path.dirname(live), exist_ok=True)
        subprocess.run(["cp", self.model, live], check=True)
        t0 = time.time()
        p, port, err = self.start_server("changed", ["--max-seqs", "2", "--max-queue", "4"], model=live)
        phase = ["serving"]
        sent = [0]
        stop = [False]
        sent_lock = threading.Lock()

        def worker(seed):
            rng = random.Random(seed)
            while True:
                with sent_lock:
                    if stop[0] or p.poll() is not None:
                        return
                    sent[0] += 1
                self.one(rng, port, lambda: phase[0])

        ws = [threading.Thread(target=worker, args=(self.rng.random(),)) for _ in range(min(4, self.a.workers))]
        for w in ws:
            w.start()
        while True:
            with sent_lock:
                if sent[0] >= n_requests // 3:
                    break
            time.sleep(0.05)
        phase[0] = "changed"
        self.changed = {"at": None, "refused": 0, "refused_after": 0}
        with open(self.model + ".other", "rb") as src, open(live, "r+b") as dst:   # in place, as cp does
            shutil.copyfileobj(src, dst)
        self.changed["at"] = time.time()
        with sent_lock:
            until = sent[0] + n_requests * 2 // 3          # as many again after the copy ended
        while time.time() < self.changed["at"] + 120:
            with sent_lock:
                if sent[0] >= until:
                    break
            time.sleep(0.05)
        stop[0] = True
        for w in ws:
            w.join()
        h = self.health(port) if p.poll() is None else {"status": "(the server died)"}
        if h.get("status") != "damaged" or LIVE_NAME not in h.get("damage", ""):
            self.fail("after the model file changed, /health says %r" % {k: h.get(k) for k in ("status", "damage")})
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        rc = self.end_server(p, err, "the epoch whose model changed", want_rc=1)
        print("# model changed under the server: %d requests, %d refused (model_damaged), %d of them sent after the copy ended "
              "(each refused); /health %s; exit %s; %.1f s" % (sent[0], self.changed["refused"], self.changed["refused_after"],
                                                               h.get("status"), rc, time.time() - t0), flush=True)
        if not self.changed["refused_after"]:
            self.fail("no request was sent after the model file changed")

    def build_model(self):
        d = os.path.join(self.a.work, "rt")
        kpk = os.path.join(self.a.work, "rt.kpk")
        self.model = kpk
        for seed, out in (("2", kpk), ("3", kpk + ".other")):   # .other: the same size, other weights
            if os.path.exists(out):
                continue                                 # made by an earlier run in this --work
            subprocess.run([os.path.join(self.a.tools, "k3synth"), d, "--geometry", "tiny", "--seed", seed, "--layers", "3",
                            "--experts", "4", "--topk", "2", "--tokenizer", self.a.tokenizer, "--quiet"], check=True, stdout=subprocess.DEVNULL)
            subprocess.run([os.path.join(self.a.tools, "kpack"), "convert", d, out, "--quiet"], check=True)
            subprocess.run(["rm", "-rf", d], check=True)
        if os.path.getsize(kpk) != os.path.getsize(kpk + ".other"):
            raise SystemExit("the two models differ in size")

    def run(self):
        a = self.a
        self.build_model()
        t0 = time.time()
        ends = ["cancel", "sigint", "sigterm"]          # the last epoch ends with SIGTERM, whatever their number
        per = a.requests // a.epochs
        accounted = self.accounting_epoch()
        for k in range(a.epochs):
            end = ends[k % len(ends)] if k < a.epochs - 1 else "sigterm"
            self.epoch(k, per if k < a.epochs - 1 else a.requests - per * (a.epochs - 1), end)
        self.changed_epoch(max(24, per // 4))
        secs = time.time() - t0
        return secs, accounted


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--krun", required=True, help="the krun to serve with (a sanitizer build for the soak)")
    ap.add_argument("--tools", required=True, help="the directory with k3synth and kpack")
    ap.add_argument("--tokenizer", required=True, help="the real tokenizer's rank file (tiktoken.model)")
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=10)
    ap.add_argument("--deadline", type=float, default=120)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--work")
    ap.add_argument("--json")
    ap.add_argument("--tap", action="store_true", help="TAP lines for tests/run_all.sh")
    a = ap.parse_args()
    own_work = not a.work
    a.work = a.work or tempfile.mkdtemp(prefix="serve-soak.")
    os.makedirs(a.work, exist_ok=True)
    soak = Soak(a)
    print("# serve soak: seed %d, %d requests, %d epochs, %d workers, krun %s" % (a.seed, a.requests, a.epochs, a.workers, a.krun), flush=True)
    secs, accounted = soak.run()
    by_status = ", ".join("%s: %d" % (k, v) for k, v in sorted(soak.by_status.items()))
    by_action = ", ".join("%s: %d" % (k, v) for k, v in sorted(soak.by_action.items()))
    rss = "; ".join("epoch %d %.0f -> %.0f MB (max %.0f)" % (k, s, e, m) for k, s, m, e in soak.rss)
    print("serve soak: %d requests in %.0f s (seed %d): by status {%s}" % (soak.n, secs, a.seed, by_status))
    print("  behaviours {%s}: %d disconnects, %d half-closed answered whole; after a signal: %d refused (listening closed), %d cut"
          % (by_action, soak.disconnects, soak.half_closes, soak.refused_after_signal, soak.lost_after_signal))
    print("  answers checked: %s" % ", ".join("%s: %d" % kv for kv in CHECKED.items()))
    print("  %d answers compared with an earlier identical request, %d differed" % (
        soak.repeat_checked, sum("repeated request" in f for f in soak.failures)))
    print("  RSS: %s" % rss)
    print("  hostile clients answered as they must: {%s}" % ", ".join("%s: %d" % kv for kv in sorted(soak.hostile.items())))
    print("  %d crashes, %d sanitizer reports, %d hung requests, %d bad answers; accounting %s" % (
        len(soak.crashes), soak.sanitizer, soak.hung, len(soak.failures) - soak.hung, "exact" if accounted else "BROKEN"))
    for c in soak.crashes:
        print("# CRASH: %s" % c[:2000])
    if a.json:
        json.dump({"seed": a.seed, "requests": soak.n, "seconds": secs, "by_status": soak.by_status, "by_action": soak.by_action,
                   "disconnects": soak.disconnects, "half_closes": soak.half_closes, "repeat_checked": soak.repeat_checked,
                   "rss": soak.rss, "hostile": soak.hostile, "changed": soak.changed, "crashes": soak.crashes, "sanitizer_reports": soak.sanitizer, "hung": soak.hung,
                   "failures": soak.failures[:100]}, open(a.json, "w"), indent=1)
    good = not soak.crashes and not soak.failures and accounted
    if a.tap:
        print("%s - request soak: %d random requests (chat and completions, streamed or not, every field), %d disconnects, "
              "%d half-closes, %d epochs ended by signals, %d hostile clients (issue 34's shapes), a model file changed under it: "
              "no crash, no sanitizer report, no hung request, every answer well formed, %d repeats identical, every request "
              "accounted for" % ("ok" if good else "not ok", soak.n, soak.disconnects, soak.half_closes, a.epochs,
                                 sum(soak.hostile.values()), soak.repeat_checked))
    if own_work and good:
        subprocess.run(["rm", "-rf", a.work])
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
