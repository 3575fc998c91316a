"""What the prefix cache must have done, computed from the conversation alone.

A conversation is the state file of tests/node/prefix_chat.mjs: per request its prompt ids
(return_token_ids), the ids it generated and its usage.  The cache keeps, for every request,
(a) its prompt (with the logits), (b) its prompt and every generated token but the last (the last
is sampled, never run) and (c) its system/tools preamble when that ends inside the prompt.  A
request must start from the longest of those (kept by any earlier request) that is a prefix of its
prompt, and shorter than it (or equal, with the logits): usage.prompt_tokens_details.cached_tokens.

Re-read positions: prompt positions run again although an earlier request had already run that
exact history (the longest common prefix with an earlier request's run history, beyond what the
cache gave).  0 means the request ran only tokens never run before."""
import json


def lcp(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def entries(results, preambles):
    """(tokens, has_logits) of every entry the requests made, in order, per request."""
    out = []
    for r, pre in zip(results, preambles):
        p, g = r["prompt_ids"], r["token_ids"]
        made = [(tuple(p), True)]
        if g:
            made.append((tuple(p + g[:-1]), True))
        if 0 < pre < len(p):
            made.append((tuple(p[:pre]), False))
        out.append(made)
    return out


def expected_cached(results, preambles, start=0, prior=()):
    """cached_tokens each request from `start` on should report, given the entries of every
    earlier request (and `prior`, entries made before these results)."""
    made = entries(results, preambles)
    want = []
    for n, r in enumerate(results):
        p = r["prompt_ids"]
        best = 0
        for tokens, logits in list(prior) + [e for k in range(n) for e in made[k]]:
            m = len(tokens)
            if m <= len(p) and tuple(p[:m]) == tokens and (m < len(p) or logits):
                best = max(best, m)
        if n >= start:
            want.append(best)
    return want


def reread(results):
    """Re-read positions of each request (see above)."""
    out = []
    for n, r in enumerate(results):
        p = r["prompt_ids"]
        ran = max([lcp(p, q["prompt_ids"] + q["token_ids"][:-1]) for q in results[:n]] + [0])
        out.append(max(0, ran - r["usage"]["prompt_tokens_details"]["cached_tokens"]))
    return out


def round_trips(results):
    """For each request but the last: did the next prompt continue with its reply as generated
    (the client's text re-tokenized to the same ids), so that entry (b) serves it?"""
    out = []
    for r, nxt in zip(results, results[1:]):
        run = r["prompt_ids"] + r["token_ids"][:-1]
        out.append(nxt["prompt_ids"][: len(run)] == run)
    return out


def same(a, b):
    """Indexes of the requests whose output differs between two runs of a conversation."""
    keys = ("prompt_ids", "token_ids", "content", "reasoning", "finish")
    bad = [i for i, (x, y) in enumerate(zip(a, b)) if any(x[k] != y[k] for k in keys) or
           x["usage"]["prompt_tokens"] != y["usage"]["prompt_tokens"] or
           x["usage"]["completion_tokens"] != y["usage"]["completion_tokens"]]
    if len(a) != len(b):
        bad.append(min(len(a), len(b)))
    return bad


def load(path):
    return json.load(open(path))
