#!/usr/bin/env bash
# krun chat: a scripted stdin and a pseudo-terminal (tests/cli/chat_pty.py).  Each turn feeds
# only its new tokens, and every reply equals krun run on the whole history at once; the first
# turn's prompt is the chat rendering (== krun tokenize --chat); multi-line messages ("""
# blocks, \ continuations, bracketed paste); /reset, /save, /load (and refusals that leave the
# conversation as it was); the context bound; --gen; reasoning dimmed on a terminal, hidden in a
# pipe, shown with --show-thinking; Ctrl-C stops a reply and the conversation goes on.
. "$(dirname "$0")/lib.sh"
PTY="$TOP/tests/cli/chat_pty.py"

"$BIN/k3synth" "$T/m" --geometry tiny --seed 21 --quiet >/dev/null 2>"$T/err" || { notok "k3synth: $(cat "$T/err")"; finish; exit 1; }
"$BIN/kpack" convert "$T/m" "$T/m.kpk" --quiet || { notok "convert"; finish; exit 1; }

# ---- plain continuation (a tokenizer without chat markers), stdin scripted ------------------------
printf 'Hello there\nHow are you?\nAnd now?\n' | "$BIN/krun" chat "$T/m.kpk" --gen 20 --json "$T/a.jsonl" >"$T/a.out" 2>"$T/a.err"
rc=$?
[ $rc -eq 0 ] && [ "$(wc -l <"$T/a.jsonl")" -eq 3 ] && ok "three turns from stdin, end of input exits 0" || notok "stdin chat: rc $rc: $(head -c 300 "$T/a.err")"
grep -q "plain-text continuation (no chat markers" "$T/a.err" && ok "says it continues plain text when the tokenizer has no chat markers" || notok "mode message"
python3 - "$T/a.jsonl" <<'PY' && ok "turns two and three run only their new tokens: the last reply token, then the message" || notok "fed tokens"
import json, sys
t = [json.loads(l) for l in open(sys.argv[1])]
# the synthetic tokenizer is one id per byte: "How are you?" is 12 ids
assert len(t[0]["fed_ids"]) == 11 and len(t[1]["fed_ids"]) == 1 + 12 and len(t[2]["fed_ids"]) == 1 + 8, [len(x["fed_ids"]) for x in t]
assert t[1]["fed_ids"][0] == t[0]["reply_ids"][-1] and t[2]["fed_ids"][0] == t[1]["reply_ids"][-1]
assert t[2]["history_tokens"] == 11 + 20 + 12 + 20 + 8 + 20, t[2]
PY
for turn in 2 3; do
    same_as_one_go "$T/m.kpk" "$T/a.jsonl" $turn && ok "turn $turn's reply == krun on the whole history at once" || notok "turn $turn differs from one go"
done
# the same conversation at a streaming budget: the same replies
min=$("$BIN/krun" "$T/m.kpk" --plan --mem 1G --ctx 4096 --json "$T/p.json" >/dev/null && python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["minimum_bytes"])' "$T/p.json")
printf 'Hello there\nHow are you?\nAnd now?\n' | "$BIN/krun" chat "$T/m.kpk" --gen 20 --json "$T/b.jsonl" --mem "$min" --io pread --quiet >/dev/null 2>"$T/b.err"
python3 -c 'import json,sys; a,b=([json.loads(l)["reply_ids"] for l in open(p)] for p in sys.argv[1:3]); assert a==b' "$T/a.jsonl" "$T/b.jsonl" \
    && ok "the same conversation at the minimum budget (--mem $min --io pread): the same replies" || notok "budgeted chat differs: $(head -c 300 "$T/b.err")"

# multi-line messages
printf '"""\nline a\nline b\n"""\ncont\\\ninued\n' | "$BIN/krun" chat "$T/m.kpk" --gen 3 --json "$T/c.jsonl" --quiet >/dev/null 2>"$T/c.err"
python3 - "$T/c.jsonl" <<'PY' && ok 'multi-line messages: a """ block and a \ continuation keep their newlines' || notok "multi-line: $(cat "$T/c.err")"
import json, sys
t = [json.loads(l) for l in open(sys.argv[1])]
order = [chr(c) for c in range(ord("!"), ord("~") + 1)]
def text(ids):   # the synthetic byte tokenizer: GPT-2 byte order ('!'..'~' = 0..93, ' ' = 220, '\n' = 198)
    m = {i: c for i, c in enumerate(order)}; m[220] = " "; m[198] = "\n"
    return "".join(m[i] for i in ids)
assert text(t[0]["fed_ids"]) == "line a\nline b", text(t[0]["fed_ids"])
assert text(t[1]["fed_ids"][1:]) == "cont\ninued", text(t[1]["fed_ids"][1:])
PY

# /save, /reset, /load, and refusals
printf 'Hello there\nHow are you?\n/save %s\n' "$T/s1" | "$BIN/krun" chat "$T/m.kpk" --gen 20 --quiet >/dev/null 2>"$T/d.err"
[ -s "$T/s1" ] && [ -s "$T/s1.json" ] && grep -q "saved 63 positions to $T/s1 and the conversation to $T/s1.json" "$T/d.err" \
    && ok "/save writes the state and the conversation (FILE.json)" || notok "/save: $(cat "$T/d.err")"
printf 'Something else\n/reset\nHello there\n/load %s\nAnd now?\n' "$T/s1" | "$BIN/krun" chat "$T/m.kpk" --gen 20 --json "$T/e.jsonl" --quiet >/dev/null 2>"$T/e.err"
python3 - "$T/a.jsonl" "$T/e.jsonl" <<'PY' && ok "/reset starts over (its turn == a first turn); /load continues the saved conversation (the next reply == turn three of one session)" \
    || notok "/reset or /load: $(cat "$T/e.err")"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
e = [json.loads(l) for l in open(sys.argv[2])]
assert e[1]["fed_ids"] == a[0]["fed_ids"] and e[1]["reply_ids"] == a[0]["reply_ids"], "reset"
assert e[2]["fed_ids"] == a[2]["fed_ids"] and e[2]["reply_ids"] == a[2]["reply_ids"] and e[2]["history_tokens"] == a[2]["history_tokens"], "load"
PY
cp "$T/s1.json" "$T/s2.json"; printf 'x\n' | "$BIN/krun" chat "$T/m.kpk" --gen 2 --quiet >/dev/null 2>&1 </dev/null
printf 'Other words\n/save %s\n' "$T/s2" | "$BIN/krun" chat "$T/m.kpk" --gen 20 --quiet >/dev/null 2>&1
cp "$T/s1.json" "$T/s2.json"        # s2's state with s1's conversation
# s3: s1 with one byte of its payload's end (the logits) changed: its conversation, a damaged state
cp "$T/s1" "$T/s3"; cp "$T/s1.json" "$T/s3.json"
python3 -c 'import sys; b = bytearray(open(sys.argv[1], "rb").read()); b[-20] ^= 1; open(sys.argv[1], "wb").write(b)' "$T/s3"
printf 'Hello there\n/load %s\n/load %s\n/load %s\n/load %s\nHow are you?\n' "$T/s2" "$T/nope" "$T/m.kpk" "$T/s3" | \
    "$BIN/krun" chat "$T/m.kpk" --gen 20 --json "$T/f.jsonl" --quiet >/dev/null 2>"$T/f.err"
rc=$?
grep -q "does not hold the conversation of $T/s2.json" "$T/f.err" && grep -q "cannot read $T/nope" "$T/f.err" && grep -qi "$T/m.kpk.*\(magic\|not a\)" "$T/f.err" \
    && grep -q "$T/s3: not a usable krun state file: payload checksum mismatch" "$T/f.err" \
    && ok "/load refuses a state that is not its conversation's, a missing file, a file that is no state and a damaged state, naming each" \
    || notok "bad /load messages: $(cat "$T/f.err")"
python3 - "$T/a.jsonl" "$T/f.jsonl" <<'PY' && [ $rc -eq 0 ] && ok "after a refused /load the conversation goes on unchanged (turn two == turn two of one session)" \
    || notok "refused /load changed the conversation (rc $rc)"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
f = [json.loads(l) for l in open(sys.argv[2])]
assert f[1]["fed_ids"] == a[1]["fed_ids"] and f[1]["reply_ids"] == a[1]["reply_ids"]
PY
"$BIN/k3synth" "$T/m2" --geometry tiny --seed 22 --quiet >/dev/null && "$BIN/kpack" convert "$T/m2" "$T/m2.kpk" --quiet
printf '/load %s\n' "$T/s1" | "$BIN/krun" chat "$T/m2.kpk" --quiet >/dev/null 2>"$T/g.err"
grep -q "saved with another model file" "$T/g.err" && ok "/load of another model's conversation is refused" || notok "foreign /load: $(cat "$T/g.err")"
printf '/bogus\n//hi\n' | "$BIN/krun" chat "$T/m.kpk" --gen 2 --json "$T/h.jsonl" --quiet >/dev/null 2>"$T/h.err"
grep -q "unknown command /bogus" "$T/h.err" && python3 -c 'import json,sys; t=json.loads(open(sys.argv[1]).readline()); assert t["fed_ids"]==[14,71,72]' "$T/h.jsonl" \
    && ok "an unknown command is named; // sends a message starting with /" || notok "commands: $(cat "$T/h.err")"

# the context bound and --gen
printf 'Hello there\nA longer second message that does not fit\n' | "$BIN/krun" chat "$T/m.kpk" --ctx 80 --gen 100 --json "$T/i.jsonl" >/dev/null 2>"$T/i.err"
rc=$?
python3 - "$T/i.jsonl" <<'PY' && grep -q "this message needs .* more, with room for a reply; the context is 80" "$T/i.err" && [ $rc -eq 0 ] \
    && ok "--ctx 80: a reply stops before the context is full; a message that does not fit is refused, named, and the session goes on" \
    || notok "context bound (rc $rc): $(cat "$T/i.err")"
import json, sys
t = [json.loads(l) for l in open(sys.argv[1])]
assert len(t) == 1 and t[0]["finish"] == "context full" and t[0]["history_tokens"] == 80 - 32, t
PY

# ---- the chat format, with the real tokenizer ------------------------------------------------------
TOK="$K3_SHARED/fixtures/tokenizer/tiktoken.model"
if [ ! -f "$TOK" ]; then
    skip "chat format: the real tokenizer $TOK is absent"
    finish; exit
fi
"$BIN/k3synth" "$T/rt" --geometry tiny --seed 2 --layers 3 --experts 4 --topk 2 --tokenizer "$TOK" --quiet >/dev/null \
    && "$BIN/kpack" convert "$T/rt" "$T/rt.kpk" --quiet && rm -rf "$T/rt" || notok "real-tokenizer model"
for think in "" --no-think; do
    printf 'What is 2+2?\nAnd 3+3? <|open|>\n' | "$BIN/krun" chat "$T/rt.kpk" --system "Be brief." $think --effort high --gen 12 --json "$T/r.jsonl" \
        >"$T/r.out" 2>"$T/r.err"
    python3 - "$T/r.json" "$think" <<'PY'
import json, sys
req = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
       "reasoning_effort": "none" if sys.argv[2] else "high"}
json.dump(req, open(sys.argv[1], "w"))
PY
    "$BIN/krun" tokenize "$T/rt.kpk" --chat "$T/r.json" >"$T/r.ids"
    python3 -c 'import json,sys; t=json.loads(open(sys.argv[1]).readline()); assert ",".join(map(str,t["fed_ids"]))==open(sys.argv[2]).read().strip()' "$T/r.jsonl" "$T/r.ids" \
        && ok "chat format${think:+ $think}: turn one feeds the rendered conversation (== krun tokenize --chat)" || notok "turn one ids${think:+ $think}"
    same_as_one_go "$T/rt.kpk" "$T/r.jsonl" 2 && ok "chat format${think:+ $think}: turn two feeds only the closing of reply one and the new message; its reply == one go" \
        || notok "turn two${think:+ $think} differs from one go"
    python3 - "$T/r.jsonl" "$BIN/krun" "$T/rt.kpk" <<'PY' && ok "chat format${think:+ $think}: turn two's feed is the pending token, the closing tokens and render_continue (a user message with <|open|> typed as text)" \
        || notok "turn two's feed${think:+ $think}"
import json, subprocess, sys
t = [json.loads(l) for l in open(sys.argv[1])]
fed = t[1]["fed_ids"]
dec = subprocess.run([sys.argv[2], "tokenize", sys.argv[3], "--decode", ",".join(map(str, fed[1:]))], capture_output=True, text=True, check=True).stdout
assert fed[0] == t[0]["reply_ids"][-1]
# the closing of a reply cut short, then the new user message and the generation prompt
assert dec.startswith("<|close|>") and ('<|close|>message<|sep|><|end_of_msg|><|open|>message role="user"<|sep|>And 3+3? <|open|>'
                                        '<|close|>message<|sep|><|end_of_msg|><|open|>message role="assistant"<|sep|><|open|>') in dec, dec
assert fed.count(163587) == dec.count("<|open|>") - 1, fed      # the <|open|> the user typed is text, not the marker
PY
done
grep -q "^<think>" "$T/r.out" && notok "reasoning shown in a pipe without --show-thinking" || ok "in a pipe the reasoning is hidden by default"
printf 'Hi\n' | "$BIN/krun" chat "$T/rt.kpk" --gen 8 --show-thinking >"$T/s.out" 2>/dev/null
grep -q "^<think>" "$T/s.out" && ok "--show-thinking shows it in a pipe, between <think> lines" || notok "--show-thinking: $(head -c 200 "$T/s.out")"

# ---- on a terminal: dimmed reasoning, Ctrl-C, bracketed paste ----------------------------------------
python3 - "$T/pty1.json" <<'PY'
import json, sys
json.dump([{"wait": "> "}, {"send": "Tell me a long story\r"}, {"wait": "\x1b[2m"}, {"wait_count": " ", "n": 40},
           {"send": "\x03"}, {"wait": "interrupted"}, {"wait": "> "},
           {"send": "\x1b[200~first pasted line\rsecond pasted line\x1b[201~\r"}, {"wait": "> "},
           {"send": "\x04"}], open(sys.argv[1], "w"))
PY
python3 "$PTY" "$T/pty1.out" "$T/pty1.json" -- "$BIN/krun" chat "$T/rt.kpk" --json "$T/p.jsonl" --ctx 400
rc=$?
python3 - "$T/p.jsonl" "$T/pty1.out" <<'PY' && [ $rc -eq 0 ] && ok "on a terminal: reasoning dimmed; Ctrl-C stops the reply (finish interrupted), the next message gets its reply, Ctrl-D exits 0" \
    || notok "pty session: rc $rc: $(tail -c 300 "$T/pty1.out" | tr -d '\033')"
import json, sys
t = [json.loads(l) for l in open(sys.argv[1])]
out = open(sys.argv[2], "rb").read()
assert b"\x1b[2m" in out and b"\x1b[?2004h" in out, "dim / bracketed paste mode"
assert len(t) == 2 and t[0]["finish"] == "interrupted" and 0 < len(t[0]["reply_ids"]) < 300, [x["finish"] for x in t]
PY
same_as_one_go "$T/rt.kpk" "$T/p.jsonl" 2 && ok "after Ctrl-C the reply was closed: the next turn == one go of the whole history" || notok "turn after Ctrl-C"
python3 - "$T/p.jsonl" "$BIN/krun" "$T/rt.kpk" <<'PY' && ok "a bracketed paste of two lines is one message, its newline kept" || notok "bracketed paste"
import json, subprocess, sys
t = [json.loads(l) for l in open(sys.argv[1])]
# bytes, not text: turn 2 first feeds the interrupted reply's last token, which may be part of a
# UTF-8 sequence (where Ctrl-C lands is a matter of timing)
dec = subprocess.run([sys.argv[2], "tokenize", sys.argv[3], "--decode", ",".join(map(str, t[1]["fed_ids"]))], capture_output=True, check=True).stdout
assert b"<|sep|>first pasted line\nsecond pasted line<|close|>" in dec, dec
PY
python3 - "$T/pty2.json" <<'PY'
import json, sys
json.dump([{"wait": "> "}, {"send": "Hi\r"}, {"wait": "> "}, {"send": "\x04"}], open(sys.argv[1], "w"))
PY
python3 "$PTY" "$T/pty2.out" "$T/pty2.json" -- "$BIN/krun" chat "$T/rt.kpk" --gen 10 --hide-thinking
grep -q $'\033\[2m' "$T/pty2.out" && notok "--hide-thinking still shows reasoning" || ok "--hide-thinking: no reasoning on a terminal"

expect_exit 2 "krun chat on a model without a tokenizer" "$BIN/krun" chat "$K3_SHARED/fixtures/k3-tiny-oracle/model.safetensors"
expect_exit 2 "--effort medium is refused" "$BIN/krun" chat "$T/rt.kpk" --effort medium
expect_exit 0 "krun chat --help" "$BIN/krun" chat --help
grep -q "^usage: krun chat MODEL.kpk" "$T/last.out" && ok "--help shows the usage" || notok "--help"
finish
