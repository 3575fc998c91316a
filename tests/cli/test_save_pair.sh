#!/usr/bin/env bash
# Saved conversations are never lost (issue 25.7, docs/CHAT.md "Saving", docs/RELIABILITY.md):
# krun chat's /save FILE writes the state FILE and the conversation FILE.json as a pair, so that
# after any failure -- ENOSPC or EIO in any write or sync, a crash before any of its renames --
# /load FILE finds either the earlier pair or the new one, whole; and krun --save-state FILE
# goes through the same writer.  A save replaces only a regular file of its own kind: a FIFO, a
# device node, a symbolic link, a directory or another file at the name is refused and left alone.
# Faults come from the shim (tests/fault/kfault.c); tests/root/test_save_full.sh fills a real
# filesystem.
. "$(dirname "$0")/lib.sh"
need_shim

"$BIN/k3synth" "$T/m" --geometry tiny --seed 23 --quiet >/dev/null 2>"$T/err" || { notok "k3synth: $(cat "$T/err")"; finish; exit 1; }
"$BIN/kpack" convert "$T/m" "$T/m.kpk" --quiet || { notok "convert"; finish; exit 1; }
F="$T/s/conv"
mkdir -p "$T/s"
chat() { "$BIN/krun" chat "$T/m.kpk" --gen 8 --quiet "$@"; }
# the two saves: A after one turn, B after two (more positions)
printf 'Hello there\n/save %s\n' "$T/A" | chat >/dev/null 2>"$T/a.err"
printf 'Hello there\nHow are you?\n/save %s\n' "$T/B" | chat >/dev/null 2>"$T/b.err"
posA=$(sed -n 's/.*saved \([0-9]*\) positions.*/\1/p' "$T/a.err"); posB=$(sed -n 's/.*saved \([0-9]*\) positions.*/\1/p' "$T/b.err")
[ -n "$posA" ] && [ -n "$posB" ] && [ "$posA" != "$posB" ] && ok "two saves to tell apart: A has $posA positions, B $posB" \
    || { notok "reference saves: $(cat "$T/a.err" "$T/b.err")"; finish; exit 1; }
put_A() { rm -rf "$T/s"; mkdir -p "$T/s"; cp "$T/A" "$F"; sed "s|$T/A|$F|" "$T/A.json" >"$F.json"; }
# loads_as WHAT WHICH: /load FILE succeeds with the positions of save WHICH (A or B), and no
# temporary file is left
loads_as() {
    local want; [ "$2" = A ] && want=$posA || want=$posB
    printf '/load %s\n' "$F" | chat >/dev/null 2>"$T/l.err"
    if grep -q "loaded [0-9]* messages, $want positions" "$T/l.err" && ! grep -q "does not hold" "$T/l.err"; then
        ok "$1: /load finds pair $2 whole"
    else notok "$1: wanted pair $2 ($want positions): $(cat "$T/l.err")"; fi
    [ -z "$(ls "$T/s" | grep '\.tmp-')" ] && ok "$1: no temporary file left" || notok "$1: left: $(ls "$T/s")"
}
# save_B_with WHAT VAR=VALUE...: save B over pair A under the shim
save_B_with() {
    rm -f "$T/fault.log"
    ( printf 'Hello there\nHow are you?\n/save %s\n' "$F" | env "$@" KFAULT_LOG="$T/fault.log" LD_PRELOAD="$SHIM" \
        "$BIN/krun" chat "$T/m.kpk" --gen 8 --quiet >/dev/null 2>"$T/f.err"; echo $? >"$T/f.rc" ) 2>/dev/null
    [ -s "$T/fault.log" ] || notok "the fault never fired ($*)"
}

# ---- no fault: B replaces A -------------------------------------------------------------
put_A; loads_as "pair A in place" A
printf 'Hello there\nHow are you?\n/save %s\n' "$F" | chat >/dev/null 2>"$T/x.err"
loads_as "B saved over A" B
[ ! -e "$F.json.new" ] && ok "no FILE.json.new left after a save" || notok "FILE.json.new left"

# ---- a write or a sync fails: the old pair stands --------------------------------------
while IFS='|' read -r label calls nth err path pat; do
    put_A
    save_B_with KFAULT_CALLS=$calls KFAULT_NTH=$nth KFAULT_ERR=$err "KFAULT_PATH=$path"
    grep -qE -- "$pat" "$T/f.err" && ok "$label: reported ($(sed 's/^kfault: //' "$T/fault.log" | head -1 | cut -c1-60))" \
        || notok "$label: wanted /$pat/: $(cat "$T/f.err")"
    loads_as "$label" A
done <<'EOF_CASES'
ENOSPC writing the state's header|pwrite|1|ENOSPC|*/conv.tmp-*|cannot save .*conv: writing .*conv.tmp-[0-9-]*: No space left on device; .*conv is unchanged
ENOSPC writing the state's layers|pwrite|4|ENOSPC|*/conv.tmp-*|No space left on device
EIO syncing the state|fsync|1|EIO|*/conv.tmp-*|syncing .*conv.tmp-.*: Input/output error
ENOSPC writing the conversation (the old /save cut FILE.json here)|pwrite|1|ENOSPC|*/conv.json.tmp-*|cannot save .*conv.json: writing .*No space left on device
EIO syncing the conversation|fsync|1|EIO|*/conv.json.tmp-*|Input/output error
EIO renaming the conversation to FILE.json.new|rename|1|EIO|*/conv.json.tmp-*|cannot rename .*conv.json.tmp-.* to .*conv.json.new: Input/output error
EIO renaming the state over FILE|rename|1|EIO|*/conv.tmp-*|cannot rename .*conv.tmp-.* to .*conv: Input/output error
EOF_CASES

# ---- a crash before each rename: the old pair, or the new one (finished by /load) --------
put_A; save_B_with KFAULT_CALLS=rename KFAULT_NTH=1 KFAULT_ERR=KILL 'KFAULT_PATH=*/conv*'
[ "$(cat "$T/f.rc")" = 137 ] && ok "killed before the first rename" || notok "kill 1: rc $(cat "$T/f.rc")"
rm -f "$T"/s/*.tmp-*   # a crash leaves its temporary files (never read; a later save does not reuse them)
loads_as "crash before rename 1 (conversation to FILE.json.new)" A
put_A; save_B_with KFAULT_CALLS=rename KFAULT_NTH=2 KFAULT_ERR=KILL 'KFAULT_PATH=*/conv*'
rm -f "$T"/s/*.tmp-*
[ -e "$F.json.new" ] && ok "crash before rename 2: the new conversation waits as FILE.json.new" || notok "no FILE.json.new after kill 2"
loads_as "crash before rename 2 (the state over FILE)" A
put_A; save_B_with KFAULT_CALLS=rename KFAULT_NTH=3 KFAULT_ERR=KILL 'KFAULT_PATH=*/conv*'
cmp -s "$F" "$T/B" && ! grep -q '"history_tokens": '"$posB" "$F.json" && ok "crash before rename 3: the state is B's, FILE.json still A's" \
    || notok "after kill 3: $(ls -la "$T/s")"
loads_as "crash before rename 3 (FILE.json.new over FILE.json)" B
grep -q "finished an interrupted save of $F" "$T/l.err" && [ ! -e "$F.json.new" ] && grep -q '"history_tokens": '"$posB" "$F.json" \
    && ok "/load finished the interrupted save (FILE.json.new renamed over FILE.json), and said so" || notok "roll forward: $(cat "$T/l.err")"
# interrupted B, then a save C that fails: B is not lost (the next save finishes B's pair first)
put_A; save_B_with KFAULT_CALLS=rename KFAULT_NTH=3 KFAULT_ERR=KILL 'KFAULT_PATH=*/conv*'
rm -f "$T/fault.log"
printf 'Other words\n/save %s\n' "$F" | env KFAULT_CALLS=pwrite KFAULT_NTH=1 KFAULT_ERR=ENOSPC 'KFAULT_PATH=*/conv.tmp-*' \
    KFAULT_LOG="$T/fault.log" LD_PRELOAD="$SHIM" "$BIN/krun" chat "$T/m.kpk" --gen 8 --quiet >/dev/null 2>"$T/c.err"
grep -q "No space left" "$T/c.err" && ok "a save after the interrupted one fails (ENOSPC)" || notok "save C: $(cat "$T/c.err")"
loads_as "an interrupted save, then a failed one" B

# interrupted B, then a save C that cannot put B's conversation in place first (EIO renaming
# FILE.json.new): C saves nothing, so B's pair is not lost
put_A; save_B_with KFAULT_CALLS=rename KFAULT_NTH=3 KFAULT_ERR=KILL 'KFAULT_PATH=*/conv*'
rm -f "$T/fault.log"
printf 'Other words\n/save %s\n' "$F" | env KFAULT_CALLS=rename KFAULT_ERR=EIO 'KFAULT_PATH=*/conv.json.new' \
    KFAULT_LOG="$T/fault.log" LD_PRELOAD="$SHIM" "$BIN/krun" chat "$T/m.kpk" --gen 8 --quiet >/dev/null 2>"$T/c.err"
[ -s "$T/fault.log" ] && grep -q "could not be put in place (above); nothing was saved" "$T/c.err" \
    && ok "a save that cannot finish the interrupted one first saves nothing, and says why" || notok "save C over a stuck pair: $(cat "$T/c.err")"
loads_as "an interrupted save, then one that could not finish it" B

# ---- the issue's case at the system call: every write to FILE.json fails with ENOSPC --------
# (strace -e inject reaches stdio's own writes, which the shim cannot: the /save before this
# fix rewrote FILE.json in place after the state was renamed, and lost both saves; now FILE.json
# is only ever renamed into place)
if command -v strace >/dev/null && strace -f -o /dev/null -e trace=write -e inject=write:error=ENOSPC -P "$T/probe" \
        sh -c "echo x >'$T/probe'" 2>/dev/null; [ -e "$T/probe" ] && [ ! -s "$T/probe" ]; then
    put_A
    printf 'Hello there\nHow are you?\n/save %s\n' "$F" | strace -f -o /dev/null -P "$F.json" -e trace=write,pwrite64 \
        -e inject=write,pwrite64:error=ENOSPC "$BIN/krun" chat "$T/m.kpk" --gen 8 --quiet >/dev/null 2>"$T/st.err"
    printf '/load %s\n' "$F" | chat >/dev/null 2>"$T/l.err"
    grep -qE "loaded [0-9]* messages, ($posA|$posB) positions" "$T/l.err" \
        && ok "ENOSPC on every write to FILE.json (strace): /load still finds a whole pair" || notok "strace ENOSPC: $(cat "$T/st.err" "$T/l.err")"
else
    skip "ENOSPC at the system call: strace is missing or cannot trace here (make deps)"
fi

# ---- what a save refuses to replace -------------------------------------------------------
refuse() { # WHAT PATTERN CHECK...: /save onto $F is refused, named, the chat goes on, CHECK holds
    local what=$1 pat=$2; shift 2
    printf 'Hello there\n/save %s\nHow are you?\n' "$F" | chat --json "$T/r.jsonl" >/dev/null 2>"$T/r.err"
    if grep -qE -- "$pat" "$T/r.err" && [ "$(wc -l <"$T/r.jsonl")" -eq 2 ] && "$@"; then ok "/save onto $what: refused, named, left alone, the chat goes on"
    else notok "/save onto $what: $(cat "$T/r.err"; ls -la "$T/s")"; fi
}
rm -rf "$T/s"; mkdir -p "$T/s"; mkfifo "$F"
refuse "a FIFO" "cannot save to .*conv: it is a FIFO; a save replaces only a regular file" test -p "$F"
rm -rf "$T/s"; mkdir -p "$T/s"; echo victim >"$T/victim"; ln -s "$T/victim" "$F"
refuse "a symbolic link" "it is a symbolic link.*or the file the link points to" test -L "$F" -a "$(cat "$T/victim")" = victim
rm -rf "$T/s"; mkdir -p "$T/s" "$F"
refuse "a directory" "it is a directory" test -d "$F"
rm -rf "$T/s"; mkdir -p "$T/s"; echo "my notes" >"$F"
refuse "a file that is not a state" "it exists and is not a krun state file; a save replaces only an earlier save" \
    test "$(cat "$F")" = "my notes"
rm -rf "$T/s"; mkdir -p "$T/s"; echo "my notes" >"$F.json"
refuse "a FILE.json that is not a conversation" "conv.json: it exists and is not a conversation saved by krun chat" \
    test "$(cat "$F.json")" = "my notes" -a ! -e "$F"
rm -rf "$T/s"; mkdir -p "$T/s"
if mknod "$F" c 1 3 2>/dev/null; then
    refuse "a character device (/dev/null's numbers: as root, /save /dev/null replaced the real one)" "it is a character device" test -c "$F"
else
    skip "/save onto a device node: mknod is not allowed here"
fi

# ---- krun --save-state: the same writer ------------------------------------------------------
S1="$T/one"
run1() { "$BIN/krun" "$T/m.kpk" --ids 3,7,11 --gen 2 --quiet "$@" >/dev/null; }
expect_exit 0 "--save-state to a new name" run1 --save-state "$S1"
cp "$S1" "$T/one.ref"
expect_exit 0 "--save-state over an earlier state" run1 --save-state "$S1"
rm -f "$T/fault.log"
env KFAULT_CALLS=pwrite KFAULT_NTH=2 KFAULT_ERR=ENOSPC "KFAULT_PATH=$S1.tmp-*" KFAULT_LOG="$T/fault.log" LD_PRELOAD="$SHIM" \
    "$BIN/krun" "$T/m.kpk" --ids 3,7,11,5 --gen 2 --quiet --save-state "$S1" >/dev/null 2>"$T/last.err"; rc=$?
[ $rc -eq 2 ] && [ -s "$T/fault.log" ] && grep -q "No space left on device; .*one is unchanged" "$T/last.err" && cmp -s "$S1" "$T/one.ref" \
    && [ -z "$(ls "$T" | grep 'one.tmp-')" ] && ok "--save-state with ENOSPC: exit 2, named, the earlier state intact, no temporary file" \
    || notok "--save-state ENOSPC: rc $rc: $(cat "$T/last.err")"
expect_exit 0 "... and it still loads" run1 --load-state "$S1"
mkfifo "$T/fifo"
expect_exit 2 "--save-state onto a FIFO" run1 --save-state "$T/fifo"
expect_err "cannot save to .*fifo: it is a FIFO" "... refused, named"
[ -p "$T/fifo" ] && ok "... the FIFO is left alone" || notok "the FIFO was replaced"
echo "my notes" >"$T/notes"
expect_exit 2 "--save-state onto a file that is not a state" run1 --save-state "$T/notes"
[ "$(cat "$T/notes")" = "my notes" ] && ok "... the file is left alone" || notok "the notes were replaced"
finish
