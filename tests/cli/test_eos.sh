#!/usr/bin/env bash
# The end of a generated message (K3_MODEL.md §9, K3_CHAT.md): generation stops at
# 163586 <|end_of_msg|> (the release's eos_token_id) and at 163585 [EOS] (the tokenizer's
# eos_token, on which serving stacks also stop), and at nothing else.  A synthetic model
# with the real tokenizer has its lm_head rigged (tests/cli/rig_head.py, through the
# independent reference) so that the first greedy token is the id under test.
. "$(dirname "$0")/lib.sh"
TOK="$K3_SHARED/fixtures/tokenizer/tiktoken.model"
/usr/bin/python3 -c "import numpy" 2>/dev/null || { skip "numpy for /usr/bin/python3 is missing (tests/deps.sh installs python3-numpy)"; finish; exit 0; }
[ -f "$TOK" ] || { skip "the real tokenizer fixture is missing ($TOK)"; finish; exit 0; }
"$BIN/k3synth" "$T/m" --geometry tiny --layers 4 --full-attn 2,4 --experts 4 --topk 2 \
    --tokenizer "$TOK" --quiet || { notok "k3synth"; finish; exit 1; }
IDS=1000,2000,3000
gen() {  # gen KPK ARGS...: the generated ids, comma-separated
    "$BIN/krun" "$1" --ids $IDS --gen 4 --json "$T/g.json" --quiet "${@:2}" >/dev/null 2>"$T/g.err" &&
        python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["generated_ids"])))' "$T/g.json"
}
CASES=("163586 stop <|end_of_msg|>" "163585 stop [EOS]" "163587 go <|open|>" "163584 go [BOS]")
rigs=(); for case in "${CASES[@]}"; do read -r id _ <<<"$case"; rigs+=(--token "$id:$T/r$id"); done
/usr/bin/python3 "$TOP/tests/cli/rig_head.py" "$T/m" --ids $IDS "${rigs[@]}" || notok "rig_head.py"
for case in "${CASES[@]}"; do
    read -r id what name <<<"$case"
    [ -d "$T/r$id" ] || { notok "rig $id"; continue; }
    "$BIN/kpack" convert "$T/r$id" "$T/r$id.kpk" --quiet || { notok "convert $id"; continue; }
    out=$(gen "$T/r$id.kpk"); all=$(gen "$T/r$id.kpk" --ignore-eos)
    case "$all" in "$id",*,*,*) ok "the rigged model picks $id ($name) first: $all" ;;
                   *) notok "the rig for $id did not take: --ignore-eos gave '$all'"; continue ;; esac
    if [ "$what" = stop ]; then
        [ "$out" = "$id" ] && ok "$name ($id) ends the message: generated $out" || notok "$name ($id): generated '$out', wanted only $id"
    else
        [ "$out" = "$all" ] && ok "$name ($id) does not end the message" || notok "$name ($id) stopped generation: '$out' vs '$all'"
    fi
    rm -rf "$T/r$id" "$T/r$id.kpk"
done
finish
