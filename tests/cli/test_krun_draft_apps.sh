#!/usr/bin/env bash
# The EAGLE drafter (--draft) in krun chat, krun serve and krun batch: each gives the same
# output, bit for bit, with the drafter and with neither it nor speculation (--draft off
# --spec 0).  chat: three turns' reply ids, greedy and sampled, its --json per-turn "spec".
# serve: requests greedy and sampled (top-k, top-p, min-p), streamed and not, each alone and
# all at once (several sequences' drafter chains in one sweep, beside prompt-lookup drafts on
# text that repeats), in place and streaming; "speculative": 0 drafts nothing; /health's
# speculation.drafter, tokens_per_sweep and bytes_per_generated_token; /metrics' drafter
# counters.  batch: the same OUT.jsonl bytes with the drafter resident and with the states
# paged to disk (--state-dir: a verification's commit waits for the next block, journal.h),
# text drafts accepted there too; --json's spec and tokens_per_sweep; --max-seqs auto weighs
# the drafter.  The drafter here is k3synth's random one (it rarely agrees: --draft-width
# keeps it drafting); the drafter's numbers are tests/unit/probe_draft and test_krun_draft.sh.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
export PYTHONPATH="$TOP/tests/cli${PYTHONPATH:+:$PYTHONPATH}"
SLOW=1; [ -n "${KPK_SANITIZED:-}" ] && SLOW=5

"$BIN/k3synth" "$T/m" --single-file --seed 5 --logit-gain 4 --quiet && "$BIN/kpack" convert "$T/m" "$T/m.kpk" --quiet \
    || { notok "the tiny target"; finish; exit 1; }
"$BIN/k3synth" "$T/d" --drafter --target "$T/m" --seed 5 --rope-theta 10000 --yarn-factor 4 --yarn-orig 256 --quiet \
    && "$BIN/kpack" convert "$T/d" "$T/d.kpk" --quiet && rm -rf "$T/m" "$T/d" || { notok "the drafter"; finish; exit 1; }
M="$T/m.kpk" D="$T/d.kpk"

# ---- krun chat ------------------------------------------------------------------------------------
chat_same() {
    local label=$1; shift
    printf 'Hello there\nHow are you? How are you?\nAnd now?\n' | "$BIN/krun" chat "$M" --gen 30 --json "$T/ca.jsonl" --quiet \
        --draft off --spec 0 "$@" >/dev/null 2>"$T/ca.err"
    printf 'Hello there\nHow are you? How are you?\nAnd now?\n' | "$BIN/krun" chat "$M" --gen 30 --json "$T/cb.jsonl" --quiet \
        --draft "$D" --draft-width 3 "$@" >/dev/null 2>"$T/cb.err"
    python3 - "$T/ca.jsonl" "$T/cb.jsonl" <<'PY' >"$T/why" 2>&1 && ok "chat, $label: $(cat "$T/why")" || notok "chat, $label: $(cat "$T/why") $(head -c 300 "$T/cb.err")"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) == 3, (len(a), len(b))
for x, y in zip(a, b):
    assert x["reply_ids"] == y["reply_ids"] and x["fed_ids"] == y["fed_ids"], (x["reply_ids"], y["reply_ids"])
sp = b[-1]["spec"]
assert sp["drafter_drafted"] > 0 and a[-1]["spec"]["drafted"] == 0, sp
print(f"3 turns' replies and fed ids == --draft off --spec 0; the drafter drafted {sp['drafter_drafted']} in "
      f"{sp['drafter_verifications']} verifications, {sp['drafter_accepted']} kept (--json spec)")
PY
}
chat_same "greedy"
chat_same "temperature 0.8, top-p 0.9, seed 3" --temp 0.8 --top-p 0.9 --seed 3

# ---- krun serve -----------------------------------------------------------------------------------
python3 - "$T/reqs.json" <<'PY'
import json, sys
LOOP = [3, 7, 11, 5, 9, 100, 200, 30, 179, 166, 117, 149, 152, 36, 47, 52, 136, 110, 64, 245, 185, 229, 17, 105, 105, 105, 105, 105]
def c(**b):
    b.setdefault("prompt", LOOP); b.setdefault("max_tokens", 40); b.setdefault("ignore_eos", True)
    return {"path": "/v1/completions", "body": b}
json.dump([c(temperature=0), c(temperature=0.7, seed=3, top_k=40, min_p=0.02), c(temperature=1, seed=3, top_p=0.95, stream=True),
           c(temperature=0, prompt=[9, 8, 7, 6, 5, 4]), c(temperature=0.7, seed=5, prompt=LOOP[:20] * 3)], open(sys.argv[1], "w"))
PY
# serve_same LABEL ARGS...: the requests alone and at once, on a server with neither the drafter nor
# speculation and on one with the drafter: the same outcomes; the latter's /health and /metrics kept
serve_same() {
    local label=$1; shift
    for s in plain draft; do
        if [ $s = plain ]; then start "$label.$s" "$M" --max-seqs 4 --ctx 512 --chunk 16 --draft off --spec 0 --quiet "$@" || return
        else start "$label.$s" "$M" --max-seqs 4 --ctx 512 --chunk 16 --draft "$D" --draft-width 3 --quiet "$@" || return; fi
        py "$T/reqs.json" "$T/$label.$s.json" <<'PY' 2>"$T/err.py" || notok "serve, $label: $s run: $(tail -c 300 "$T/err.py")"
import json, sys, serve_client as c
port, reqs = int(sys.argv[1]), json.load(open(sys.argv[2]))
alone, together, sweeps, tokens = c.batch(port, reqs)
metrics = c.request(port, "GET", "/metrics")[2].decode()
json.dump({"alone": alone, "together": together, "sweeps": sweeps, "tokens": tokens, "health": c.health(port), "metrics": metrics},
          open(sys.argv[3], "w"))
PY
        stop
    done
    python3 - "$T/$label.plain.json" "$T/$label.draft.json" <<'PY' >"$T/why" 2>&1 && ok "serve, $label: $(cat "$T/why")" || notok "serve, $label: $(cat "$T/why")"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
n = len(a["alone"])
for k in range(n):
    assert a["alone"][k]["status"] == 200, a["alone"][k]
    assert b["alone"][k] == a["alone"][k], ("alone: with the drafter differs", k, b["alone"][k], a["alone"][k])
    assert b["together"][k] == a["together"][k] == a["alone"][k], ("at once: with the drafter differs", k)
sp = b["health"]["stats"]["speculation"]
d = sp["drafter"]
assert d and d["file"].endswith("d.kpk") and d["drafted"] > 0 and d["verifications"] > 0 and sp["drafted"] >= d["drafted"], sp
assert sp["tokens_per_sweep"] > 0 and sp["bytes_per_generated_token"] >= 0 and a["health"]["stats"]["speculation"]["drafter"] is None, sp
for name in ("speculation_drafter_verifications_total", "speculation_drafter_drafted_total", "speculation_drafter_accepted_total",
             "tokens_per_sweep", "bytes_per_generated_token"):
    assert name in b["metrics"], name
print(f"{n} requests alone and {n} at once == --draft off --spec 0; the drafter drafted {d['drafted']} ({d['accepted']} kept) in "
      f"{d['verifications']} verifications, all drafts {sp['drafted']} ({sp['accepted']} kept); /health and /metrics carry them")
PY
}
serve_same "in place"
serve_same "streaming, nothing pinned" --mem 1G --pin 0 --expert-slots 2

# "speculative": 0 drafts nothing; several sequences' chains in one sweep
start field "$M" --max-seqs 4 --ctx 512 --draft "$D" --draft-width 2 --quiet && {
    py <<'PY' >"$T/field.out" 2>&1 && ok "serve: $(cat "$T/field.out")" || notok "serve: $(tail -c 600 "$T/field.out")"
import json, sys, threading, serve_client as c
port = int(sys.argv[1])
dr = lambda: c.health(port)["stats"]["speculation"]["drafter"]
b = lambda **kw: dict({"prompt": [9, 8, 7, 6, 5, 4], "max_tokens": 12, "temperature": 0, "ignore_eos": True}, **kw)
d0 = dr()
s, _, j = c.post(port, "/v1/completions", b(speculative=0))
assert s == 200 and dr()["drafted"] == d0["drafted"], (d0, dr())
s, _, j = c.post(port, "/v1/completions", b(speculative=1))
d1 = dr()
assert s == 200 and 0 < d1["drafted"] - d0["drafted"] <= d1["verifications"] - d0["verifications"], (d0, d1)
h0 = c.health(port)["stats"]
ts = [threading.Thread(target=c.post, args=(port, "/v1/completions", b(prompt=[9 + i, 8, 7, 6], max_tokens=20))) for i in range(4)]
for t in ts: t.start()
for t in ts: t.join()
h1 = c.health(port)["stats"]
sweeps = h1["sweeps"] - h0["sweeps"]
ver = h1["speculation"]["drafter"]["verifications"] - h0["speculation"]["drafter"]["verifications"]
assert ver > sweeps, (ver, sweeps)
print(f'"speculative": 0 drafted nothing, 1 at most one a verification; 4 requests at once: {ver} drafter verifications in {sweeps} sweeps')
PY
    stop
}

# ---- krun batch -----------------------------------------------------------------------------------
python3 - "$T/in.jsonl" <<'PY'
import json, sys
LOOP = [3, 7, 11, 5, 9, 100, 200, 30, 179, 166, 117, 149, 152, 36, 47, 52, 136, 110, 64, 245, 185, 229, 17, 105, 105, 105, 105, 105]
def c(i, **b):
    b.setdefault("prompt", LOOP); b.setdefault("max_tokens", 40); b.setdefault("ignore_eos", True)
    return {"custom_id": "r%d" % i, "method": "POST", "url": "/v1/completions", "body": b}
reqs = [c(0, temperature=0), c(1, temperature=0.7, seed=3, top_k=40, min_p=0.02), c(2, temperature=1, seed=3),
        c(3, temperature=0, prompt=LOOP[:20] * 3), c(4, temperature=0.7, seed=5, top_p=0.9, prompt=LOOP[:20] * 3),
        c(5, temperature=0, prompt=[9, 8, 7, 6, 5, 4], max_tokens=30), c(6, temperature=0, prompt=LOOP[5:] * 2, max_tokens=60)]
open(sys.argv[1], "w").write("".join(json.dumps(r) + "\n" for r in reqs))
PY
BA=("$BIN/krun" batch "$M" "$T/in.jsonl")
COMMON=(--ctx 512 --seed 9 --created 1000 --quiet --json)
"${BA[@]}" "$T/ba.jsonl" "${COMMON[@]}" --max-seqs 4 --draft off --spec 0 >"$T/ba.sum" 2>"$T/ba.err" || notok "batch without: $(head -c 300 "$T/ba.err")"
batch_same() {
    local label=$1 out=$2; shift 2
    "${BA[@]}" "$T/$out.jsonl" "${COMMON[@]}" "$@" >"$T/$out.sum" 2>"$T/$out.err" || { notok "batch, $label: $(head -c 300 "$T/$out.err")"; return; }
    cmp -s "$T/ba.jsonl" "$T/$out.jsonl" && python3 - "$T/$out.sum" "${WANT:-drafter}" <<'PY' >"$T/why" 2>&1 \
        && ok "batch, $label: OUT.jsonl byte-identical to --draft off --spec 0; $(cat "$T/why")" || notok "batch, $label: $(cat "$T/why")"
import json, sys
j = json.loads(open(sys.argv[1]).read().splitlines()[-1])
sp = j["spec"]
if sys.argv[2] == "drafter":
    assert sp["drafter"] and sp["drafter"]["drafted"] > 0, sp
else:
    assert sp["accepted"] > 0 and sp["drafted"] > sp["accepted"], sp
assert j["tokens_per_sweep"] > 0
print(f"{sp['accepted']} of {sp['drafted']} drafts kept (the drafter's: {sp['drafter'] and sp['drafter']['drafted']}), "
      f"{j['tokens_per_sweep']:.2f} tokens per decoding sweep, state file {j['state_bytes_read']} bytes read")
PY
}
batch_same "the drafter, resident" bb --max-seqs 4 --draft "$D" --draft-width 3
batch_same "the drafter, states paged to disk" bc --max-seqs 3 --draft "$D" --draft-width 2 --state-dir "$T/sd"
"${BA[@]}" "$T/bf.jsonl" --ctx 512 --seed 9 --created 1000 --mem 1G --draft "$D" --draft-accept 0.9 >/dev/null 2>"$T/bf.err"
grep -q "sequences per sweep (--max-seqs auto" "$T/bf.err" && grep -qi "drafter" "$T/bf.err" && cmp -s "$T/ba.jsonl" "$T/bf.jsonl" \
    && ok "batch, --max-seqs auto under --mem with the drafter planned: the same bytes; the plan names the drafter" \
    || notok "batch --max-seqs auto with a drafter: $(head -c 600 "$T/bf.err")"
# text that repeats (a 2-layer peaked model): prompt-lookup drafts accepted and rejected, paged
"$BIN/k3synth" "$T/g" --geometry tiny --layers 2 --seed 1 --logit-gain 4 --quiet && "$BIN/kpack" convert "$T/g" "$T/g.kpk" --quiet \
    && rm -rf "$T/g" || notok "the 2-layer model"
BA=("$BIN/krun" batch "$T/g.kpk" "$T/in.jsonl")
"${BA[@]}" "$T/ba.jsonl" "${COMMON[@]}" --max-seqs 4 --draft off --spec 0 --force >"$T/ba.sum" 2>"$T/ba.err" || notok "batch without: $(head -c 300 "$T/ba.err")"
WANT=text batch_same "prompt-lookup drafts accepted and rejected, states paged to disk" bd --max-seqs 4 --draft off --spec 8 --state-dir "$T/sd"
WANT=text batch_same "the same at --spec 3 (a journal shared by fewer rows), paged, one thread" be --max-seqs 3 --draft off --spec 3 \
    --state-dir "$T/sd" --threads 1
finish
