# Helpers for the krun serve tests (sourced after lib.sh, with SLOW set).

# start NAME ARGS...: krun serve in the background on a free port; sets PORT and PID (0 if it
# did not start: the reason is in $T/NAME.err)
start() {
    local name=$1; shift
    "$BIN/krun" serve "$@" --port 0 >"$T/$name.out" 2>"$T/$name.err" &
    PID=$!; PORT=
    for _ in $(seq $((100 * SLOW))); do
        PORT=$(sed -n 's/.*listening on http:\/\/.*:\([0-9]*\)$/\1/p; s/.*listening on port \([0-9]*\)$/\1/p' "$T/$name.err" 2>/dev/null)
        [ -n "$PORT" ] && return 0
        kill -0 $PID 2>/dev/null || break
        sleep 0.1
    done
    notok "krun serve $* did not start: $(head -c 400 "$T/$name.err")"
    kill -9 $PID 2>/dev/null; PID=0; PORT=0
    return 1
}
# stop [SIGNAL]: signal the server and wait; RC is its exit status
stop() {
    kill -"${1:-TERM}" $PID 2>/dev/null
    wait $PID; RC=$?
}
# py ARGS... < SCRIPT: a python script with the server's port as argv[1]
py() { python3 - "$PORT" "$@"; }
