"""Helpers for tests/cli/test_krun_batch.sh: the mixed batch's input, checks of an output file,
and each request run alone through krun serve."""
import json
import sys


def seed_of(job_seed, line):
    """kbatch_request_seed (run/serve/batch_job.c): splitmix64 of the job seed and the line."""
    m = (1 << 64) - 1
    z = (job_seed + line * 0x9e3779b97f4a7c15) & m
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & m
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & m
    return (z ^ (z >> 31)) & 0x7fffffffffffffff


def make_input(path, chat, scale=1):
    """A mixed batch: chat (with the real tokenizer) and completions, greedy and sampled (with and
    without a seed), lengths from 1 to 40 tokens, stop strings, token ids, one request the API
    refuses, and lines that are not requests.  Returns the lines as written."""
    u = lambda t: [{"role": "user", "content": t}]
    reqs = []
    def req(cid, url, body):
        reqs.append(json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body}))
    for r in range(scale):
        s = "" if r == 0 else "-%d" % r
        req("cmpl-greedy" + s, "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 12 + r, "temperature": 0})
        req("cmpl-ids-seed" + s, "/v1/completions", {"prompt": [5, 80, 81, 82, 200, 13, 7], "max_tokens": 24, "temperature": 0.8,
                                                     "seed": 7 + r, "return_token_ids": True})
        req("cmpl-noseed" + s, "/v1/completions", {"prompt": "once upon a time", "max_tokens": 30, "temperature": 0.9, "top_p": 0.9})
        req("cmpl-one" + s, "/v1/completions", {"prompt": "x", "max_tokens": 1, "temperature": 0})
        req("cmpl-stop" + s, "/v1/completions", {"prompt": "a b c d", "max_tokens": 40, "temperature": 0.7, "seed": 3, "stop": ["e"]})
        if chat:
            req("chat-seed" + s, "/v1/chat/completions", {"messages": u("Hello!"), "max_tokens": 8, "temperature": 0.8, "seed": 1 + r})
            req("chat-greedy" + s, "/v1/chat/completions", {"messages": [{"role": "system", "content": "You are terse."}] + u("Why is the sky blue?"),
                                                           "max_tokens": 40, "temperature": 0, "reasoning_effort": "none"})
            req("chat-noseed" + s, "/v1/chat/completions", {"messages": u("x" * 300), "max_tokens": 6, "temperature": 0.5,
                                                           "reasoning_effort": "high", "return_token_ids": True})
        # the clients' fields (issue 20) through the shared preparation: penalties, logprobs, a schema
        req("cmpl-penalties" + s, "/v1/completions", {"prompt": "a b a b a b", "max_tokens": 16, "temperature": 0.8, "seed": 11 + r,
                                                      "presence_penalty": 0.5, "frequency_penalty": 0.3, "repetition_penalty": 1.2,
                                                      "logprobs": 3})
        req("cmpl-n" + s, "/v1/completions", {"prompt": "z", "max_tokens": 4, "n": 2})
        if chat:
            req("chat-schema" + s, "/v1/chat/completions", {"messages": u("Colours?"), "max_tokens": 40, "temperature": 0.7, "seed": 2 + r,
                                                           "reasoning_effort": "none", "logprobs": True, "top_logprobs": 2,
                                                           "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema":
                                                               {"enum": ["red", "green", "blue"]}}}})
        req("too-long" + s, "/v1/completions", {"prompt": "y", "max_tokens": 100000})
    lines = reqs[:3] + [""] + reqs[3:4] + ["this is not json", json.dumps({"method": "POST", "url": "/v1/completions", "body": {}}),
                                          json.dumps({"custom_id": "bad-url", "method": "POST", "url": "/v1/embeddings", "body": {}}),
                                          json.dumps({"custom_id": "bad-body", "method": "POST", "url": "/v1/completions", "body": "hi"}),
                                          json.dumps({"custom_id": "stream", "method": "POST", "url": "/v1/completions",
                                                      "body": {"prompt": "z", "stream": True}})] + reqs[4:]
    open(path, "w").write("\n".join(lines) + "\n")
    return lines


def check_output(inp, out):
    """OUT has one line per non-blank line of IN, in its order, in vLLM run-batch's shape."""
    lines = open(inp).read().split("\n")
    outs = [json.loads(l) for l in open(out).read().split("\n")[:-1]]
    want = [(i + 1, l) for i, l in enumerate(lines) if l.strip()]
    assert len(outs) == len(want), (len(outs), len(want))
    for (n, l), o in zip(want, outs):
        assert set(o) == {"id", "custom_id", "response", "error"}, o
        try:
            cid = json.loads(l).get("custom_id")
        except ValueError:
            cid = None
        assert o["custom_id"] == cid, (n, o["custom_id"], cid)
        if o["response"] is None:
            e = o["error"]
            assert e["code"] == "invalid_batch_line" and e["line"] == n and e["message"].startswith("line %d: " % n), e
        else:
            r = o["response"]
            assert o["error"] is None and set(r) == {"status_code", "request_id", "body"}, o
            assert (r["status_code"] == 200) == ("error" not in r["body"]), o
            if r["status_code"] == 200:
                assert r["body"]["id"] == r["request_id"], o
    return outs


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "make":
        make_input(sys.argv[2], sys.argv[3] == "chat", int(sys.argv[4]) if len(sys.argv) > 4 else 1)
    elif cmd == "check":
        outs = check_output(sys.argv[2], sys.argv[3])
        fields = {o["custom_id"] or "line %d" % o["error"]["line"]: o["error"]["field"] for o in outs if o["error"]}
        print(json.dumps(fields, sort_keys=True))
    elif cmd == "seed":
        print(seed_of(int(sys.argv[2]), int(sys.argv[3])))


def alone_vs_batch(port, inp, out, job_seed):
    """Every request of IN that ran in the batch, run alone through krun serve (the same body; a
    request without a seed given the one the batch gave it): the same status and the same body
    but for its id and created.  Returns the number compared."""
    import serve_client as c
    lines = open(inp).read().split("\n")
    by_id = {o["custom_id"]: o for o in map(json.loads, open(out).read().split("\n")[:-1]) if o["response"]}
    n = 0
    for i, l in enumerate(lines):
        try:
            q = json.loads(l)
        except ValueError:
            continue
        o = by_id.get(q.get("custom_id"))
        if not o or q["custom_id"] == "stream" or q["custom_id"].startswith("cmpl-n"):
            continue                # refused by krun batch only (stream, n > 1)
        body = dict(q["body"])
        body.setdefault("seed", seed_of(job_seed, i + 1))
        s, _, j = c.post(port, q["url"], body)
        b = o["response"]["body"]
        assert s == o["response"]["status_code"], (q["custom_id"], s, o)
        for x in (j, b):
            x.pop("id", None)
            x.pop("created", None)
        if s != 200:                # an error names the option of the command that set it: krun batch --ctx
            b["error"]["message"] = b["error"]["message"].replace("(krun batch --ctx)", "(krun serve --ctx)")
        assert json.dumps(j, sort_keys=True) == json.dumps(b, sort_keys=True), (q["custom_id"], j, b)
        n += 1
    return n
