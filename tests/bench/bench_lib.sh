# shellcheck shell=bash disable=SC2034
# Helpers shared by the kpack benches (bench_kpack.sh, bench_codec.sh,
# bench_export.sh, ab_kpack.sh; sourced, not run).  bench_init sets W (work
# directory), RES (results file), SETTLE (seconds) and FAILED=0, or the
# caller does, before the other helpers are used.

# bench_init NAME: what every bench reads from the environment (BIN,
# BENCH_RUNS, BENCH_SETTLE, BENCH_SLICE, BENCH_SKIP, BENCH_DIR) and its work
# directory (BENCH_DIR, or a new build/bench-NAME.XXXXXX on the repo's disk).
bench_init() {
    TOP=$PWD
    BIN=${BIN:-bin}
    case "$BIN" in /*) ;; *) BIN="$TOP/$BIN";; esac
    RUNS=${BENCH_RUNS:-5}
    SETTLE=${BENCH_SETTLE:-3}
    SLICE_OPTS=${BENCH_SLICE:---layers 2 --experts 64}
    SKIP=" ${BENCH_SKIP:-} "
    mkdir -p "$TOP/build"
    W=${BENCH_DIR:-$(mktemp -d "$TOP/build/bench-$1.XXXXXX")}
    mkdir -p "$W"
    W=$(cd "$W" && pwd)
    RES="$W/results.txt"
    : >"$RES"
    FAILED=0
}

CAN_DROP=1
# (under BENCH_LOCK when it is set: another bench on the same disk is not disturbed by this drop)
if ! ${BENCH_LOCK:+flock "$BENCH_LOCK"} sh -c 'sync && echo 3 > /proc/sys/vm/drop_caches' 2>/dev/null; then
    CAN_DROP=0
    echo "NOTE: cannot drop the page cache (not root?): every figure below is taken with a warm cache"
fi
# Drop the page cache, then wait: on a VM that reports free pages to its host
# (Firecracker, virtio-balloon free page reporting) the memory just freed is
# handed back within ~2 s and is slow to touch again; waiting makes every run
# start from the same state.
drop() {
    sync
    [ "$CAN_DROP" = 1 ] && echo 3 > /proc/sys/vm/drop_caches
    sleep "$SETTLE"
}
cached_mb() { awk '/^Cached:/ {printf "%d", $2 / 1024}' /proc/meminfo; }
avail_bytes() { df -B1 --output=avail "$W" | tail -1 | tr -d ' '; }

# run NAME CMD...: one timed run after dropping the page cache.  Appends
# "NAME wall_s peak_rss_kb page_cache_growth_mb" to $RES; the command's stdout
# is left in $W/out.tmp.
run() {
    local name=$1; shift
    local c0 c1
    drop
    c0=$(cached_mb)
    if ! /usr/bin/time -f "%e %M" -o "$W/time.tmp" "$@" >"$W/out.tmp" 2>"$W/err.tmp"; then
        echo "FAILED: $name: $* : $(tail -c 400 "$W/err.tmp")"
        FAILED=1
        return 1
    fi
    c1=$(cached_mb)
    echo "$name $(tail -1 "$W/time.tmp") $((c1 - c0))" >>"$RES"
}

machine() {
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; RAM $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo); kernel $(uname -r)"
    echo "disk: $(df -T "$W" | awk 'NR == 2 {print $1 " (" $2 "), " int($5 / 1048576) " GiB free"}'); work directory $W"
    echo "runs per figure: $RUNS (medians); page cache dropped before every run: $([ "$CAN_DROP" = 1 ] && echo yes || echo NO), then ${SETTLE} s settle"
    echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine makes the figures noisier)"
}

# bench_serve_start ERRFILE CMD...: CMD (a krun serve with --port 0) in the
# background, its stderr in ERRFILE; sets pid, and port once it listens
# (empty, returning 1, when it exits or does not listen within 60 s).
bench_serve_start() {
    local err=$1; shift
    "$@" >/dev/null 2>"$err" &
    pid=$!
    port=
    for _ in $(seq 600); do
        port=$(sed -n 's/.*listening on http:\/\/.*:\([0-9]*\)$/\1/p; s/.*listening on port \([0-9]*\)$/\1/p' "$err" 2>/dev/null)
        [ -n "$port" ] && return 0
        kill -0 $pid 2>/dev/null || break
        sleep 0.1
    done
    return 1
}
