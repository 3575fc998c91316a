#!/usr/bin/env bash
# kpack export writes only inside DIR (issue 25.5, docs/RELIABILITY.md "Export writes only
# inside DIR"): what someone with write access to DIR can plant there, and what a user may
# have left there, is refused by name (exit 2) with the thing it points to untouched, or
# replaced without being written through: a symbolic link at NAME.partial, a symbolically
# linked directory on the way to a file, a link, FIFO or hard link at the journal, a FIFO or
# a device node at NAME.partial, a hard link at NAME.partial, a link or FIFO at NAME.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3

"$BIN/k3synth" "$T/src" --geometry tiny --shards 2 --seed 41 --quiet >/dev/null 2>"$T/synth.err" \
    || { notok "k3synth tiny: $(cat "$T/synth.err")"; finish; exit 1; }
mkdir -p "$T/src/sub"
echo '{"max_new_tokens": 64}' >"$T/src/sub/generation_config.json"
"$BIN/kpack" convert "$T/src" "$T/a.kpk" --quiet || { notok "convert"; finish; exit 1; }
V="$T/victim"; VD="$T/victimdir"
victim() { printf 'the victim: nobody may write here\n' >"$V"; rm -rf "$VD"; mkdir -p "$VD"; }
untouched() { # WHAT: the victim file keeps its bytes and the victim directory stays empty
    if [ "$(cat "$V")" = "the victim: nobody may write here" ] && [ -z "$(ls -A "$VD")" ]; then ok "$1: nothing outside DIR was written"
    else notok "$1: victim changed: $(head -c 80 "$V"; ls -A "$VD")"; fi
}
# export_case WHAT PATTERN: export into $T/d exits 2 naming PATTERN, within 60 s (a FIFO must not hang it)
export_case() {
    timeout 60 "$BIN/kpack" export "$T/a.kpk" "$T/d" --quiet >"$T/last.out" 2>"$T/last.err"; local rc=$?
    [ $rc -eq 2 ] && ok "$1: refused (exit 2)" || notok "$1: exit $rc, wanted 2: $(head -c 300 "$T/last.err")"
    grep -qE -- "$2" "$T/last.err" && ok "$1: named" || notok "$1: wanted /$2/: $(head -c 300 "$T/last.err")"
}
fresh() { rm -rf "$T/d"; mkdir -p "$T/d"; victim; }

# 1. a symbolic link at NAME.partial pointing outside DIR
fresh; ln -s "$V" "$T/d/config.json.partial"
export_case "a symlink planted at config.json.partial" "d/config.json.partial is a symbolic link: kpack export .*does not write through or remove it"
untouched "symlinked .partial"
[ -L "$T/d/config.json.partial" ] && [ ! -e "$T/d/config.json" ] && ok "the link is left alone, nothing published" || notok "symlinked .partial: $(ls -la "$T/d")"

# 2. a symbolically linked directory on the way to a file
fresh; ln -s "$VD" "$T/d/sub"
export_case "a symlinked directory inside DIR (sub -> elsewhere)" "d/sub is a symbolic link, not a directory: kpack export writes only inside"
untouched "symlinked directory"

# ... also when the export is resumed (killed after one file, the link planted before the rerun);
# a link planted after the check is refused when the file is written (unit/test_beneath)
fresh
KPACK_TEST_EXPORT_KILL_AFTER=1 "$BIN/kpack" export "$T/a.kpk" "$T/d" --quiet >/dev/null 2>&1
[ -f "$T/d/.kpack-export.journal" ] && [ -f "$T/d/config.json" ] || notok "the kill after one file left no journal"
ln -s "$VD" "$T/d/sub"
export_case "a symlinked directory, planted before a resumed export" "d/sub is a symbolic link"
untouched "symlinked directory, resumed"

# 3. the journal: a symbolic link, a hard link, a FIFO
fresh; ln -s "$V" "$T/d/.kpack-export.journal"
export_case "a symlink at .kpack-export.journal" "kpack-export.journal is a symbolic link: kpack export writes its journal only into a file of its own"
untouched "symlinked journal"
fresh; : >"$V"; ln "$V" "$T/d/.kpack-export.journal"
export_case "a hard link at .kpack-export.journal" "kpack-export.journal is a hard link"
[ ! -s "$V" ] && ok "hard-linked journal: the other name got no byte" || notok "hard-linked journal: $(cat "$V")"
fresh; mkfifo "$T/d/.kpack-export.journal"
export_case "a FIFO at .kpack-export.journal" "kpack-export.journal is a FIFO"

# 4. a FIFO or a device node at NAME.partial: never opened
fresh; mkfifo "$T/d/config.json.partial"
export_case "a FIFO at config.json.partial (the old export blocked forever opening it)" "config.json.partial is a FIFO"
fresh
if mknod "$T/d/config.json.partial" c 1 3 2>/dev/null; then
    export_case "a character device (/dev/null's numbers) at config.json.partial" "config.json.partial is a character device"
    [ -c "$T/d/config.json.partial" ] && ok "the device node is left alone" || notok "device node replaced"
else
    skip "a device node at config.json.partial: mknod is not allowed here"
fi

# 5. a link or a FIFO at NAME itself: it exists, export never overwrites
fresh; ln -s "$V" "$T/d/config.json"
export_case "a symlink at config.json" "d/config.json already exists; kpack export never overwrites a file \(it is a symbolic link"
untouched "symlinked target"
fresh; mkfifo "$T/d/config.json"
export_case "a FIFO at config.json" "d/config.json already exists; .*it is a FIFO"

# 6. a hard link at NAME.partial: replaced, never written through (the old export truncated
#    and overwrote the other name)
fresh; ln "$V" "$T/d/config.json.partial"
expect_exit 0 "a hard link at config.json.partial: the export goes on" "$BIN/kpack" export "$T/a.kpk" "$T/d" --quiet
untouched "hard-linked .partial"
cmp -s "$T/src/config.json" "$T/d/config.json" && diff -r "$T/src" "$T/d" >/dev/null 2>&1 \
    && ok "every file exported, identical" || notok "export after a hard-linked .partial differs"

# 7. the export refused above left nothing half-done: with the plants removed it completes
fresh; ln -s "$VD" "$T/d/sub"
"$BIN/kpack" export "$T/a.kpk" "$T/d" --quiet >/dev/null 2>&1
rm "$T/d/sub"
expect_exit 0 "the plant removed, the same export completes" "$BIN/kpack" export "$T/a.kpk" "$T/d" --quiet
diff -r "$T/src" "$T/d" >/dev/null 2>&1 && ok "... every file identical" || notok "export after removing the plant differs"

# 9. the journal is not trusted blindly (issue 34.12; docs/RELIABILITY.md "Export writes only inside DIR")
J=.kpack-export.journal
first=$(ls "$T/src" | sort | head -1)              # the first file export writes (name order)
resumed() { # ROUND: an export killed after its first file; that file then as ROUND says
    rm -rf "$T/d"; mkdir -p "$T/d"
    ( KPACK_TEST_EXPORT_KILL_AFTER=1 exec "$BIN/kpack" export "$T/a.kpk" "$T/d" --quiet ) >/dev/null 2>&1
    [ -f "$T/d/$first" ] && [ -f "$T/d/$J" ] || notok "the killed export left $first and its journal: $(ls -A "$T/d")"
}
resumed; printf 'X' | dd of="$T/d/$first" bs=1 seek=2 conv=notrunc 2>/dev/null; cp "$T/d/$first" "$T/changed"
expect_exit 1 "a finished file changed (one byte, same size) after kill -9: the rerun refuses it (exit 1)" "$BIN/kpack" export "$T/a.kpk" "$T/d" --quiet
grep -qE "d/$first was changed after an earlier run of this export wrote it .*remove it, and run the export again" "$T/last.out" \
    && ok "  ... naming it and what to do" || notok "  ... wanted the file named: $(head -c 300 "$T/last.out")"
cmp -s "$T/d/$first" "$T/changed" && [ -f "$T/d/$J" ] && ok "  ... the file left as it is, the journal kept" || notok "  changed file or journal: $(ls -A "$T/d")"
rm "$T/d/$first"
expect_exit 0 "  ... removed, the rerun writes it again" "$BIN/kpack" export "$T/a.kpk" "$T/d" --quiet
diff -r "$T/src" "$T/d" >/dev/null 2>&1 && [ ! -e "$T/d/$J" ] && ok "  ... every file identical, no journal left" || notok "export after the changed file differs"
resumed; touch -d '2001-01-01' "$T/d/$first"
expect_exit 0 "a finished file only touched (its times changed, its bytes not): hashed again, kept" "$BIN/kpack" export "$T/a.kpk" "$T/d" --quiet
diff -r "$T/src" "$T/d" >/dev/null 2>&1 && ok "  ... every file identical" || notok "export after touch differs"
resumed; sed -i -e '1s/^kpack-export 2 /kpack-export 1 /' -e 's/^done \([0-9]*\) \([0-9a-f]*\) [0-9]* [0-9.]* [0-9.]* /done \1 \2 /' "$T/d/$J"
expect_exit 0 "a journal of the earlier kpack (version 1, no identities): its files hashed again, the export completes" "$BIN/kpack" export "$T/a.kpk" "$T/d" --quiet
diff -r "$T/src" "$T/d" >/dev/null 2>&1 && ok "  ... every file identical" || notok "export after a version 1 journal differs"
# an export refused before its first file leaves no journal to stand in another's way (before: its header
# stayed, and exporting another KPK into the directory failed: "unfinished export of another KPK file")
"$BIN/k3synth" "$T/src2" --geometry tiny --shards 2 --seed 42 --quiet >/dev/null 2>&1 && "$BIN/kpack" convert "$T/src2" "$T/b.kpk" --quiet \
    || notok "a second KPK file"
rm -rf "$T/d"; mkdir -p "$T/d/sub"; mkfifo "$T/d/sub/generation_config.json.partial"
expect_exit 2 "an export refused before its first file (a FIFO in its way)" "$BIN/kpack" export "$T/a.kpk" "$T/d" --quiet
[ ! -e "$T/d/$J" ] && ok "  ... leaves no journal" || notok "  ... left $(cat "$T/d/$J")"
expect_exit 0 "  ... and another KPK file exports into the directory" "$BIN/kpack" export "$T/b.kpk" "$T/d" --quiet
rm -rf "$T/d"; mkdir -p "$T/d"
( KPACK_TEST_EXPORT_KILL_AFTER=1 exec "$BIN/kpack" export "$T/b.kpk" "$T/d" --quiet ) >/dev/null 2>&1
expect_exit 2 "another KPK file's journal with a file finished: refused" "$BIN/kpack" export "$T/a.kpk" "$T/d" --quiet
expect_err "unfinished export of another KPK file, which finished 1 file here: finish it .*or abandon it: remove .*journal" "  ... naming the ways on"
head -1 "$T/d/$J" >"$T/j1"; cp "$T/j1" "$T/d/$J"; rm -f "$T/d"/*.safetensors "$T/d"/*.json "$T/d"/*.model
expect_exit 0 "another KPK file's journal with nothing finished: taken over" "$BIN/kpack" export "$T/a.kpk" "$T/d" --quiet
diff -r "$T/src" "$T/d" >/dev/null 2>&1 && ok "  ... every file identical" || notok "export over an empty foreign journal differs"

# 8. DIR itself may be a symbolic link (the user names it)
rm -rf "$T/real" "$T/linkdir"; mkdir -p "$T/real"; ln -s "$T/real" "$T/linkdir"
expect_exit 0 "DIR given as a symbolic link to a directory" "$BIN/kpack" export "$T/a.kpk" "$T/linkdir" --quiet
diff -r "$T/src" "$T/real" >/dev/null 2>&1 && ok "... written into the directory it names" || notok "export through a DIR link differs"
finish
