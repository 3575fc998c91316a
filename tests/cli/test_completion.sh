#!/usr/bin/env bash
# Bash completion (completions/kpack; krun's is a link to it): subcommands, every option of every
# command (compared with what man_help.py reads from the same --help), the values an option's
# placeholder lists, directories and files where they are asked for, KPK files for models.
# The completion function runs in a bash that has only sourced the file (no bash-completion
# package needed).
source "$(dirname "$0")/lib.sh"
cd "$TOP"
W="$T/w"; mkdir -p "$W/sub" "$W/ckpt"; : > "$W/m.kpk"; : > "$W/notes.txt"
PATH="$BIN:$PATH"; export PATH

# Every case runs in one bash that sources the file once (as a shell does): $T/cases holds the
# cases, a line each (the words as shell words; '' is an empty last word), $T/got the sorted
# completions of each case's last word.
CASES=(); WANT=()
expect() { CASES+=("$1"); WANT+=("$2"); }
run_cases() {
    printf '%s\n' "${CASES[@]}" > "$T/cases"
    (cd "$W" && bash -c 'source "$0"
        while IFS= read -r line; do
            eval "COMP_WORDS=($line)"; COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMPREPLY=()
            _kpk_complete
            ((${#COMPREPLY[@]})) && printf "%s\n" "${COMPREPLY[@]}" | sort -u | tr "\n" " "; echo
        done < "$1"' "$TOP/completions/kpack" "$T/cases") > "$T/got"
    local i=0 got
    while IFS= read -r got; do
        [ "$got" = "${WANT[i]}" ] && ok "complete '${CASES[i]}' -> ${WANT[i]}" \
            || notok "complete '${CASES[i]}': got '$got', want '${WANT[i]}'"
        i=$((i + 1))
    done < "$T/got"
    [ "$i" -eq "${#CASES[@]}" ] || notok "the completion driver answered $i of ${#CASES[@]} cases"
}
(cd "$W" && bash -c 'source "$0"; complete -p kpack krun' "$TOP/completions/kpack") | grep -q 'complete -F _kpk_complete kpack' \
    && ok "sourcing the file registers _kpk_complete for kpack and krun" || notok "complete -p kpack: not registered"

expect "kpack ''" "cat check-source convert export info verify "
expect "kpack --v" "--version "
expect "kpack convert --comp" "--compress "
expect "kpack convert --compress ''" "all none trunk "
expect "kpack convert --compress=t" "trunk "
expect "kpack convert --order ''" "layer-major trunk-first "
expect "kpack convert ''" "ckpt m.kpk sub "
expect "kpack check-source ''" "ckpt sub "
expect "kpack convert ckpt out.kpk --stripe s" "sub "
expect "kpack convert ckpt out.kpk --stripe sub,c" "sub,ckpt "
expect "kpack convert ckpt out.kpk --sha256 n" "notes.txt "
expect "kpack verify --repair-from ''" "ckpt sub "
expect "kpack export m.kpk ''" "ckpt sub "
expect "krun ''" "batch chat ckpt m.kpk serve sub tokenize "
expect "krun --mem 8G ''" "ckpt m.kpk sub "
expect "krun --io ''" "direct mmap pread "
expect "krun --verify=a" "always "
expect "krun --json n" "notes.txt "
expect "krun serve --max-c" "--max-connections --max-connections-per-ip "
expect "krun serve --chunk ''" "auto "
expect "krun serve m.kpk --port ''" ""
expect "krun chat --effort ''" "high low max "
expect "krun batch --max-seqs ''" "auto "
expect "krun batch m.kpk n" "notes.txt "
expect "krun tokenize m.kpk --js" "--json --jsonl "

# every option of every command completes, and nothing else: the same reading of --help as the pages'
for tool in kpack krun; do
    python3 tests/cli/man_help.py --options "$BIN/$tool" > "$T/$tool.options"
    for sub in $(cut -d' ' -f1 "$T/$tool.options" | sort -u); do
        expect "$tool ${sub#-} --" "$( (awk -v c="$sub" '$1 == c { print $2 }' "$T/$tool.options"; echo --help) | sort -u | tr '\n' ' ')"
    done
done
expect "kpack cat m.kpk --" "--help "   # a command without options
# the presets it offers are krun's (its --help lists them with their sizes)
expect "krun --preset ''" "$("$BIN/krun" --help | sed -n 's/^  --preset NAME *//p' | grep -o '[a-z]* [0-9]*G' | cut -d' ' -f1 | sort | tr '\n' ' ')"
run_cases
finish
