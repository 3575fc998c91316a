#!/usr/bin/env bash
# krun tokenize: text <-> ids with the tokenizer embedded in a KPK file, --json / --jsonl,
# --chat rendering (the 11 chat vectors with the real tokenizer), and bad input.
. "$(dirname "$0")/lib.sh"

"$BIN/k3synth" "$T/m" --geometry tiny --seed 5 --layers 2 --experts 2 --topk 1 --quiet >/dev/null 2>"$T/err" \
    || { notok "k3synth: $(cat "$T/err")"; finish; exit 1; }
"$BIN/kpack" convert "$T/m" "$T/m.kpk" --quiet || { notok "convert"; finish; exit 1; }
K="$T/m.kpk"

# Byte-level synthetic tokenizer: every byte is one id, in GPT-2 order ('!' = 0, ' ' = 220)
out=$("$BIN/krun" tokenize "$K" "!! a")
[ "$out" = "0,0,220,64" ] && ok "tokenize TEXT: ids on one line, comma-separated (\"!! a\" -> $out)" || notok "tokenize TEXT: got $out"
out=$("$BIN/krun" tokenize "$K" "!! a" --sep " ")
[ "$out" = "0 0 220 64" ] && ok "--sep ' '" || notok "--sep: got $out"
printf 'caf\xc3\xa9\n\xe4\xb8\xad' > "$T/in.txt"
ids=$("$BIN/krun" tokenize "$K" --file "$T/in.txt")
"$BIN/krun" tokenize "$K" --decode "$ids" > "$T/back.txt"
cmp -s "$T/in.txt" "$T/back.txt" && ok "--file then --decode gives the bytes back" || notok "round trip through --decode"
ids2=$("$BIN/krun" tokenize "$K" - < "$T/in.txt")
[ "$ids" = "$ids2" ] && ok "- reads standard input" || notok "stdin: $ids2"
echo "$ids" | tr ',' ' ' | "$BIN/krun" tokenize "$K" --decode - > "$T/back2.txt"
cmp -s "$T/in.txt" "$T/back2.txt" && ok "--decode - takes space-separated ids on standard input" || notok "--decode from stdin"
"$BIN/krun" tokenize "$K" --json "é!" > "$T/j.json"
python3 - "$T/j.json" <<'PY' && ok "--json: count, ids, tokens with the piece of each (hex for a partial UTF-8 byte)" || notok "--json: $(cat "$T/j.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["count"] == 3 and len(j["ids"]) == 3 and j["ids"][2] == 0, j
t = j["tokens"]
assert t[0]["hex"] == "c3" and t[1]["hex"] == "a9" and t[2]["piece"] == "!" and "special" not in t[2], t
PY
printf '"a"\n{"text": "!!"}\n\n""\n' > "$T/in.jsonl"
out=$("$BIN/krun" tokenize "$K" --jsonl --file "$T/in.jsonl" | tr '\n' ';')
[ "$out" = "[64];[0,0];[];" ] && ok "--jsonl: one JSON array of ids per line (blank lines skipped)" || notok "--jsonl: $out"
eacute=$("$BIN/krun" tokenize "$K" "é")     # two byte ids
printf '[64,0]\n[%s]\n' "$eacute" | "$BIN/krun" tokenize "$K" --jsonl --decode - > "$T/dec.jsonl"
python3 -c 'import json,sys; l=[json.loads(x) for x in open(sys.argv[1])]; assert l==["a!", "é"], l' "$T/dec.jsonl" \
    && ok "--jsonl --decode: one JSON string per line" || notok "--jsonl --decode: $(cat "$T/dec.jsonl")"
"$BIN/krun" tokenize "$K" --decode --json "${eacute%%,*}" > "$T/dj.json"
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j=={"text":"\ufffd","bytes":1,"valid_utf8":False}, j' "$T/dj.json" \
    && ok "--decode --json: an ill-formed byte shows as U+FFFD, valid_utf8 false" || notok "--decode --json: $(cat "$T/dj.json")"

# Bad input: exit 2 and a message naming what is wrong
expect_exit 0 "krun tokenize --help" "$BIN/krun" tokenize --help
grep -q "krun tokenize MODEL.kpk" "$T/last.out" && ok "--help shows the usage" || notok "--help text"
"$BIN/krun" --help | grep -q "krun tokenize" && ok "krun --help mentions tokenize" || notok "krun --help lacks tokenize"
expect_exit 2 "no model" "$BIN/krun" tokenize
expect_exit 2 "no input" "$BIN/krun" tokenize "$K"
expect_err "exactly one input" "says to give one input"
expect_exit 2 "two inputs" "$BIN/krun" tokenize "$K" "x" --file "$T/in.txt"
expect_exit 2 "unknown option" "$BIN/krun" tokenize "$K" x --frobnicate
expect_err "unknown option --frobnicate" "names the option"
expect_exit 2 "missing input file" "$BIN/krun" tokenize "$K" --file "$T/nope.txt"
expect_err "nope.txt" "names the file"
expect_exit 2 "model that is not a KPK file" "$BIN/krun" tokenize "$T/in.txt" x
expect_exit 2 "missing model" "$BIN/krun" tokenize "$T/none.kpk" x
expect_err "none.kpk" "names the model file"
expect_exit 2 "--decode of a word" "$BIN/krun" tokenize "$K" --decode "12,abc"
expect_err "got \"abc\" at byte 3" "says where"
expect_exit 2 "--decode of an id outside the vocabulary" "$BIN/krun" tokenize "$K" --decode "1 256"
expect_err "token id 256 \(id number 2\) is outside the vocabulary \(0\.\.255\)" "names the id and the range"
printf '"ok"\n[1,\n' > "$T/bad.jsonl"
expect_exit 2 "--jsonl with a line that is not JSON" "$BIN/krun" tokenize "$K" --jsonl --file "$T/bad.jsonl"
expect_err "bad.jsonl line 2" "names the line"
expect_exit 2 "--think without --chat" "$BIN/krun" tokenize "$K" x --think
expect_exit 2 "--effort medium" "$BIN/krun" tokenize "$K" --chat "$T/in.jsonl" --effort medium
expect_err "low, high, max or none" "lists the efforts"
# a damaged meta extent: the tokenizer in the file is bad data (exit 1), named
cp "$K" "$T/bad.kpk"
if python3 - "$T/bad.kpk" <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
i = b.find(b"IQ== 0\n")
assert i > 0
b[i + 3] ^= 0x20
open(sys.argv[1], "wb").write(b)
PY
then
    expect_exit 1 "a damaged meta extent" "$BIN/krun" tokenize "$T/bad.kpk" x
    expect_err "bad.kpk.*(meta|checksum|XXH3)" "names the file and the damaged extent"
else
    skip "damaged meta extent: the rank file is not stored uncompressed"
fi
"$BIN/kpack" convert "$K3_SHARED/fixtures/k3-tiny-oracle" "$T/notok.kpk" --quiet 2>/dev/null && {
    expect_exit 2 "a model without a tokenizer" "$BIN/krun" tokenize "$T/notok.kpk" x
    expect_err "no tokenizer embedded" "says there is no tokenizer"
}
# the synthetic tiny vocabulary has no K3 markers: --chat says so
printf '[{"role":"user","content":"hi"}]' > "$T/chat.json"
expect_exit 2 "--chat with a tokenizer without the K3 markers" "$BIN/krun" tokenize "$K" --chat "$T/chat.json"
expect_err "no <\|open\|> special token" "says which marker is missing"

# The real tokenizer: special strings, the chat vectors, chat errors
TOK="$K3_SHARED/fixtures/tokenizer/tiktoken.model"
VEC="$K3_SHARED/fixtures/chat/chat_vectors.jsonl"
if [ -f "$TOK" ] && [ -f "$VEC" ]; then
    "$BIN/k3synth" "$T/rt" --geometry tiny --seed 2 --layers 2 --experts 2 --topk 1 --tokenizer "$TOK" --quiet >/dev/null \
        && "$BIN/kpack" convert "$T/rt" "$T/rt.kpk" --quiet && rm -rf "$T/rt"
    R="$T/rt.kpk"
    out=$("$BIN/krun" tokenize "$R" "The capital of France is")
    [ "$out" = "1008,10484,318,15383,387" ] && ok "real tokenizer: \"The capital of France is\" -> $out" || notok "real tokenizer: $out"
    a=$("$BIN/krun" tokenize "$R" "<|open|>"); b=$("$BIN/krun" tokenize "$R" --no-special "<|open|>")
    [ "$a" = "163587" ] && [ "$b" != "163587" ] && [ -n "$b" ] \
        && ok "special strings: honoured by default (163587), text with --no-special ($b)" || notok "specials: $a / $b"
    n=0; good=0
    while IFS= read -r line; do
        n=$((n + 1))
        python3 - "$line" "$T/req.json" "$T/want.txt" "$T/flags" <<'PY'
import json, sys
v = json.loads(sys.argv[1]); o = v["options"]
req = {"messages": v["messages"], "chat_template_kwargs": {"thinking": o.get("thinking", True), "thinking_effort": o.get("thinking_effort")}}
if "tools" in o: req["tools"] = o["tools"]
json.dump(req, open(sys.argv[2], "w"))
open(sys.argv[3], "w").write(",".join(map(str, v["ids"])) + "\n")
open(sys.argv[4], "w").write("" if o.get("add_generation_prompt", True) else "--no-generation-prompt")
PY
        "$BIN/krun" tokenize "$R" --chat "$T/req.json" $(cat "$T/flags") > "$T/got.txt" 2>"$T/err" && cmp -s "$T/got.txt" "$T/want.txt" && good=$((good + 1))
    done < "$VEC"
    [ "$n" -eq 11 ] && [ "$good" -eq 11 ] && ok "--chat: all $good of $n chat vectors give the golden ids" || notok "--chat vectors: $good of $n"
    printf '{"messages":[{"role":"user","content":"Hello!"}],"reasoning_effort":"none"}' > "$T/c.json"
    "$BIN/krun" tokenize "$R" --chat "$T/c.json" --print-text > "$T/c.txt"
    printf '<|open|>message role="user"<|sep|>Hello!<|close|>message<|sep|><|end_of_msg|><|open|>message role="assistant"<|sep|><|open|>response<|sep|>\n' > "$T/c.want"
    cmp -s "$T/c.txt" "$T/c.want" && ok "--chat --print-text: the spec's example (reasoning_effort none = thinking off)" || notok "--print-text: $(cat "$T/c.txt")"
    "$BIN/krun" tokenize "$R" --chat "$T/c.json" --think --effort low --print-text | grep -q 'thinking_effort=low`.<|close|>.*<|open|>think<|sep|>$' \
        && ok "--think --effort low override the request" || notok "--think --effort"
    printf '[{"role":"user","content":"Hello!"}]' | "$BIN/krun" tokenize "$R" --chat - --no-think --json > "$T/cj.json"
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["count"]==23 and j["tokens"][0]=={"id":163587,"piece":"<|open|>","special":True}, j' "$T/cj.json" \
        && ok "--chat - with a bare messages array, --json" || notok "--chat --json: $(head -c 300 "$T/cj.json")"
    printf '{"messages":[{"role":"user","content":"x"},{"role":"robot","content":"y"}]}' > "$T/bad.json"
    expect_exit 2 "--chat with an unknown role" "$BIN/krun" tokenize "$R" --chat "$T/bad.json"
    expect_err "bad.json: messages\[1\].role: unknown role \"robot\"" "names the file, the message and the role"
    printf '{"messages":[{"role":"user","content":"x"}' > "$T/trunc.json"
    expect_exit 2 "--chat with truncated JSON" "$BIN/krun" tokenize "$R" --chat "$T/trunc.json"
    expect_err "trunc.json: the request body is not valid JSON" "says the JSON is not valid"
else
    skip "real tokenizer and chat vectors: $TOK or $VEC is absent"
fi
finish
