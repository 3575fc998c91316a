#!/usr/bin/env bash
# One writer per output (issue 12.2): a second `kpack convert` of the same
# output stops, naming the pid that holds it, and the first completes intact;
# a run that finds its partial file replaced or its journal rewritten by some
# other process (one that ignores the lock) publishes nothing.
. "$(dirname "$0")/lib.sh"

"$BIN/k3synth" "$T/src" --geometry tiny --shards 3 --seed 21 --quiet >/dev/null 2>"$T/synth.err" \
    || { notok "k3synth tiny: $(cat "$T/synth.err")"; finish; exit 1; }
"$BIN/kpack" convert "$T/src" "$T/ref.kpk" --quiet || { notok "reference conversion failed"; finish; exit 1; }
clean() { rm -f "$T"/x.kpk "$T"/x.kpk.partial "$T"/x.kpk.journal "$T"/x.kpk.lock; }
# wait_for CMD...: poll (up to 10 s) until the command succeeds
wait_for() { for _ in $(seq 200); do "$@" && return 0; sleep 0.05; done; return 1; }
journal_has() { [ -f "$T/x.kpk.journal" ] && [ "$(stat -c %s "$T/x.kpk.journal")" -ge $((64 + 32 * $1)) ]; }
slow_convert() { # in the background; $pid
    KPACK_SYNC_BYTES=1 KPACK_TEST_DELAY_MS=${DELAY:-15} "$BIN/kpack" convert "$T/src" "$T/x.kpk" --quiet 2>"$T/first.err" &
    pid=$!
}

# 1. Two conversions of one output.
clean
slow_convert
wait_for journal_has 3 || notok "the first conversion did not start"
ino=$(stat -c %i "$T/x.kpk.partial")
expect_exit 2 "a second convert of the same output while the first runs" "$BIN/kpack" convert "$T/src" "$T/x.kpk" --quiet
expect_err "x.kpk is being converted by another kpack \(pid $pid, lock .*x.kpk.lock\)" "the second names the first's pid ($pid)"
[ "$(stat -c %i "$T/x.kpk.partial")" = "$ino" ] && journal_has 3 && ok "the second left the first's files alone" \
    || notok "the second touched the partial file or the journal"
expect_exit 0 "a --dry-run meanwhile needs no lock" "$BIN/kpack" convert "$T/src" "$T/x.kpk" --dry-run
wait $pid; rc=$?
[ $rc -eq 0 ] && ok "the first completes (exit 0)" || notok "the first exited $rc: $(cat "$T/first.err")"
"$BIN/kpack" verify "$T/x.kpk" --quiet >/dev/null && cmp -s "$T/x.kpk" "$T/ref.kpk" \
    && ok "its file verifies and is identical to an undisturbed conversion" || notok "the first's file is damaged"
[ ! -e "$T/x.kpk.lock" ] && [ ! -e "$T/x.kpk.partial" ] && [ ! -e "$T/x.kpk.journal" ] \
    && ok "no lock, partial or journal left" || notok "leftovers: $(ls "$T" | tr '\n' ' ')"

# 2. kill -9 frees the lock (the kernel drops it); the stale lock file is reused.
clean
slow_convert
wait_for journal_has 3
kill -9 $pid; wait $pid 2>/dev/null
[ -e "$T/x.kpk.lock" ] && ok "kill -9 leaves the lock file" || skip "kill -9 left no lock file (landed late?)"
"$BIN/kpack" convert "$T/src" "$T/x.kpk" 2>"$T/resume.err" >/dev/null && cmp -s "$T/x.kpk" "$T/ref.kpk" \
    && ! grep -q "being converted" "$T/resume.err" \
    && ok "after kill -9 the rerun takes the lock and resumes to an identical file" \
    || notok "rerun after kill -9: $(cat "$T/resume.err")"

# 3, 4. Another process changes the first run's files behind its back (one
# that ignores the lock: a cp, or an older kpack creating the journal anew):
# the first run exits 2 naming it, publishes nothing, and a rerun gives the
# identical file.  tampered LABEL PATTERN CMD...
tampered() {
    local label=$1 pat=$2; shift 2
    clean
    slow_convert
    wait_for journal_has 5
    "$@"
    wait $pid; rc=$?
    [ $rc -eq 2 ] && grep -q "$pat" "$T/first.err" \
        && ok "$label is noticed before the rename (exit 2, named)" || notok "$label: rc $rc: $(cat "$T/first.err")"
    [ ! -e "$T/x.kpk" ] && ok "$label: nothing published" || notok "$label: x.kpk was published"
    "$BIN/kpack" convert "$T/src" "$T/x.kpk" --quiet 2>"$T/resume.err" && cmp -s "$T/x.kpk" "$T/ref.kpk" \
        && ok "$label: the rerun gives the identical file" || notok "$label: rerun: $(cat "$T/resume.err")"
}
replace_partial() { local size; size=$(stat -c %s "$T/x.kpk.partial"); rm "$T/x.kpk.partial"; truncate -s "$size" "$T/x.kpk.partial"; }
tampered "a replaced partial file" "x.kpk.partial was removed or replaced by another process.*nothing was published" replace_partial
tampered "a rewritten journal" "x.kpk.journal no longer records what this conversion wrote" truncate -s 64 "$T/x.kpk.journal"
clean
finish
