#!/usr/bin/env bash
# The manual pages kpack(1) and krun(1) (man/): every option each command's --help defines is in
# the page, and every option the page lists for a command is in that command's --help
# (man_help.py says which option is missing from which section); the checker fails when an
# option is taken out of a page or one is added that no --help names; the pages pass mandoc's
# linter (or groff's warnings) and render with man -l without a warning.
source "$(dirname "$0")/lib.sh"
cd "$TOP"

for tool in kpack krun; do
    python3 tests/cli/man_help.py "$BIN/$tool" "man/$tool.1" > "$T/$tool.tap" 2>&1
    rc=$?
    cat "$T/$tool.tap"
    [ $rc -eq 0 ] || grep -q '^not ok' "$T/$tool.tap" || notok "man_help.py $tool exited $rc: $(tail -3 "$T/$tool.tap")"
    FAILS=$((FAILS + $(grep -c '^not ok' "$T/$tool.tap")))
done

# the checker can fail: an option taken out of a page fails once, with the line to add and where
# (the lead adds other branches' options from these messages at merge time)
missing() {  # missing OPTION WHAT EXPECTED: krun(1) without OPTION's items gives one failure, EXPECTED
    sed "/^\.It Fl \\\\${1#-}\( \|\$\)/d" man/krun.1 > "$T/less$1.1"   # the page writes --x as \-x
    python3 tests/cli/man_help.py "$BIN/krun" "$T/less$1.1" > "$T/less$1.tap" 2>&1
    if grep -qF "$3" "$T/less$1.tap" && [ "$(grep -c '^not ok' "$T/less$1.tap")" -eq 1 ]; then
        ok "a page without $1 ($2) fails once: ${3#*: }"
    else
        notok "a page without $1: $(grep -v '^ok' "$T/less$1.tap" | head -3)"
    fi
}
missing --max-queue "krun serve's" \
    'lacks --max-queue, which `krun serve --help` lists: add `.It Fl \-max-queue ...` and its text under `.Ss krun serve`'
missing --simd "in a section four commands share" \
    'lacks --simd, which `krun --help`, `krun batch --help`, `krun chat --help`, `krun serve --help` list: add `.It Fl \-simd ...` and its text under each of `.Ss krun MODEL.kpk`, `.Ss krun batch`, `.Ss krun chat`, `.Ss krun serve`, or once under `.Ss Execution options` or `.Ss Memory options`, the section these commands share'
missing --json "in four commands' own sections" \
    'lacks --json, which `krun --help`, `krun batch --help`, `krun chat --help`, `krun tokenize --help` list: add `.It Fl \-json ...` and its text under each of `.Ss krun MODEL.kpk`, `.Ss krun batch`, `.Ss krun chat`, `.Ss krun tokenize`, or once under a new section whose `.\" help:` line is `krun, krun batch, krun chat, krun tokenize`'
sed 's/^\.It Fl \\-threads Ar N$/.It Fl \\-threads Ar N\n.It Fl \\-no-such-option/' man/kpack.1 > "$T/more.1"
python3 tests/cli/man_help.py "$BIN/kpack" "$T/more.1" > "$T/more.tap" 2>&1
n=$(grep -c '^not ok - kpack(1) .* documents --no-such-option under `.Ss' "$T/more.tap")
[ "$n" -ge 1 ] && ok "an item no --help names fails ($n commands' sections)" \
    || notok "an extra item in kpack(1): $(grep -v '^ok' "$T/more.tap" | head -3)"

for tool in kpack krun; do
    page="man/$tool.1"
    if command -v mandoc >/dev/null; then
        out=$(mandoc -T lint -W warning "$page" 2>&1)
        [ -z "$out" ] && ok "mandoc -T lint -W warning $page: clean" || notok "mandoc -T lint $page: $out"
    elif command -v groff >/dev/null; then
        out=$(groff -mandoc -Tutf8 -ww -z "$page" 2>&1)
        [ -z "$out" ] && ok "groff -ww $page: no warning (mandoc is not installed)" || notok "groff -ww $page: $out"
    else
        skip "lint of $page (neither mandoc nor groff: tests/deps.sh)"
    fi
    if command -v man >/dev/null; then
        err=$(MANWIDTH=80 man -l "$page" 2>&1 >"$T/$tool.txt")
        if [ -z "$err" ] && grep -q "^NAME" "$T/$tool.txt" && grep -q "^EXIT STATUS" "$T/$tool.txt" && grep -q "^EXAMPLES" "$T/$tool.txt" \
            && ! grep -q '\\-\|\\(\|^\.' "$T/$tool.txt"; then
            ok "man -l $page renders ($(wc -l < "$T/$tool.txt") lines: NAME ... EXIT STATUS, EXAMPLES; no roff left in the text)"
        else
            notok "man -l $page: $err $(grep -n '\\-\|\\(\|^\.' "$T/$tool.txt" | head -3)"
        fi
    else
        skip "man -l $page (man is not installed)"
    fi
done
finish
