#!/usr/bin/env bash
# krun serve as a systemd service (systemd/, issue 35), what can be tested without systemd as
# PID 1 (tests/pkg/systemd_boot.sh, in CI, boots it in a container and runs the unit for real):
#  - systemd-analyze verify on the installed unit, with the generator's drop-in: clean;
#  - krun-serve-generator: MemoryMax= from --mem / --preset (the budget krun's own --plan
#    prints, and headroom), LimitNOFILE= from --max-connections (the limit at which krun serve
#    starts, and one below which it refuses), TimeoutStopSec= from --shutdown-timeout (above
#    krun serve's drain and flush), RequiresMountsFor= the model; values krun would refuse left out;
#  - the sd_notify protocol (no libsystemd): READY=1 once /health answers, STOPPING=1 at
#    SIGTERM, to a socket path and to an abstract name; a bad NOTIFY_SOCKET is reported, not fatal;
#  - krun serve's open-file limit: raised to what --max-connections needs, refused when the hard
#    limit is too low;
#  - the unit's ExecStart line, expanded as systemd does, run by hand as an unprivileged user
#    (root only), in a memory cgroup of the generator's MemoryMax: ready, answering, reading the
#    model with O_DIRECT, writing its prefix cache, draining on SIGTERM, exit 0.
source "$(dirname "$0")/lib.sh"
cd "$TOP"
BUILD=${BUILD:-build}

"$BIN/k3synth" "$T/ckpt" --geometry tiny --seed 35 --quiet >/dev/null 2>"$T/err" || { notok "k3synth: $(cat "$T/err")"; finish; exit 1; }
"$BIN/kpack" convert "$T/ckpt" "$T/m.kpk" --quiet || { notok "convert"; finish; exit 1; }

I="$T/inst"
make -s --no-print-directory -o all BUILD="$BUILD" install prefix="$I" >/dev/null 2>"$T/install.err" \
    || { notok "make install prefix=$I: $(head -3 "$T/install.err")"; finish; exit 1; }
UNIT="$I/lib/systemd/system/krun-serve@.service"
GEN="$I/lib/systemd/system-generators/krun-serve-generator"

# ---- the generator ---------------------------------------------------------------------------
C="$T/conf"; mkdir -p "$C"
cat > "$C/demo.conf" <<EOF
# a comment
MODEL=$T/m.kpk
ARGS="--mem 1.5G --port 0 --max-connections 1000 --shutdown-timeout=60"
KRUN_API_KEY=secret
EOF
printf 'MODEL=/srv/a.kpk\nARGS=--preset server --max-seqs 8\n' > "$C/big.conf"
printf "MODEL='/srv/b.kpk'\n  ARGS = --port 9000 --mem=512M\n" > "$C/spaced.conf"
printf 'MODEL=/srv/c.kpk\nARGS=--port 9001\n' > "$C/nobudget.conf"
printf 'MODEL=/srv/d.kpk\nARGS=--mem lots --max-connections 0 --shutdown-timeout soon\n' > "$C/bad.conf"
echo "not a conf" > "$C/README"
G="$T/gen"
KRUN_CONF_DIR="$C" "$GEN" "$G" 2>"$T/gen.err" && ok "the generator runs (5 confs)" || notok "generator: $(cat "$T/gen.err")"
dropin() { cat "$G/krun-serve@$1.service.d/50-krun-derived.conf" 2>/dev/null; }
val() { dropin "$1" | sed -n "s/^$2=//p"; }
G1=$((1 << 30))
[ "$(val demo MemoryMax)" = $((1610612736 + G1)) ] && [ "$(val demo LimitNOFILE)" = 1576 ] && [ "$(val demo TimeoutStopSec)" = 75 ] \
    && [ "$(val demo RequiresMountsFor)" = "$T/m.kpk" ] \
    && ok "demo.conf: MemoryMax = 1.5G + 1 GiB, LimitNOFILE = 1000 + 576, TimeoutStopSec = 60 + 10 + 5, RequiresMountsFor the model" \
    || notok "demo.conf's drop-in: $(dropin demo | tr '\n' ' ')"
[ "$(val big MemoryMax)" = $(((128 << 30) + (16 << 30))) ] && [ -z "$(val big LimitNOFILE)" ] && [ "$(val big TimeoutStopSec)" = 45 ] \
    && ok "--preset server: MemoryMax = 128 GiB + an eighth; no --max-connections: the unit's LimitNOFILE; TimeoutStopSec 45 by default" \
    || notok "big.conf's drop-in: $(dropin big | tr '\n' ' ')"
[ "$(val spaced MemoryMax)" = $(((512 << 20) + G1)) ] && [ "$(val spaced RequiresMountsFor)" = /srv/b.kpk ] \
    && ok "quoted values, spaces around =, --mem=512M" || notok "spaced.conf's drop-in: $(dropin spaced | tr '\n' ' ')"
[ -z "$(val nobudget MemoryMax)" ] && dropin nobudget | grep -q "no budget" && [ -z "$(val bad MemoryMax)" ] \
    && [ -z "$(val bad LimitNOFILE)" ] && [ "$(val bad TimeoutStopSec)" = "" ] && [ ! -e "$G/krun-serve@README.service.d" ] \
    && ok "no budget: no MemoryMax, said; values krun refuses (--mem lots, --max-connections 0, --shutdown-timeout soon) left out; only *.conf" \
    || notok "nobudget/bad drop-ins: $(dropin nobudget | tr '\n' ' ') / $(dropin bad | tr '\n' ' ')"

# the generator's numbers are krun's: the presets' budgets from krun --plan itself
for p in laptop desktop workstation server max; do
    printf 'MODEL=/x.kpk\nARGS=--preset %s\n' $p > "$C/p-$p.conf"
done
KRUN_CONF_DIR="$C" "$GEN" "$G"
bad=
for p in laptop desktop workstation server max; do
    want=$("$BIN/krun" "$T/m.kpk" --preset $p --plan 2>&1 | sed -n 's/^memory plan: budget .*(\([0-9]*\) bytes)$/\1/p')
    got=$(dropin p-$p | sed -n 's/^# the budget, \([0-9]*\) bytes.*/\1/p')
    [ -n "$want" ] && [ "$want" = "$got" ] || bad="$bad $p: krun $want, generator $got;"
done
[ -z "$bad" ] && ok "the generator's five presets are the budgets krun --plan prints for them" || notok "presets differ:$bad"
ready() {  # ready JSON (notify_run.py's): READY=1 with a status, /health answering then, STOPPING=1, exit 0
    python3 - "$1" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["ready"].startswith("READY=1\nSTATUS=serving "), j
assert j["ready_health"] == 200 and j["request"] == 200, j
assert j["stopping"].startswith("STOPPING=1\nSTATUS=draining"), j
assert j["exit"] == 0, j
PY
}
# LimitNOFILE: krun serve starts at exactly the generator's limit for --max-connections 1000, and not one below
lim=$(val demo LimitNOFILE)
if command -v prlimit >/dev/null; then
    prlimit --nofile=$((lim - 1)):$((lim - 1)) "$BIN/krun" serve "$T/m.kpk" --port 0 --max-connections 1000 >/dev/null 2>"$T/nofile.err"
    rc=$?
    if [ $rc -eq 2 ] && grep -q "needs $lim open files" "$T/nofile.err" && grep -q "LimitNOFILE=" "$T/nofile.err"; then
        ok "krun serve --max-connections 1000 under a hard limit of $((lim - 1)) open files: refused (exit 2), naming $lim and LimitNOFILE="
    else
        notok "krun serve under nofile $((lim - 1)): exit $rc: $(head -c 300 "$T/nofile.err")"
    fi
    python3 tests/cli/notify_run.py "@kpk-nofile-$$" -- prlimit --nofile=100:$lim "$BIN/krun" serve "$T/m.kpk" --port 0 \
        --max-connections 1000 --quiet > "$T/nofile.json" 2>&1
    ready "$T/nofile.json" && ok "at a soft limit of 100 and a hard limit of $lim it raises the soft limit and serves (NOTIFY_SOCKET an abstract name, @...: READY=1 once /health answers, STOPPING=1 at SIGTERM, exit 0)" \
        || notok "krun serve at nofile 100:$lim (NOTIFY_SOCKET @kpk-nofile-$$): $(cat "$T/nofile.json")"
else
    skip "krun serve's open-file limit (prlimit is not installed)"
fi
flush=$(sed -n 's/^#define SERVE_FLUSH_SECONDS \([0-9]*\)$/\1/p' run/cli/cmd_serve.c)
res=$(sed -n 's/^#define SERVE_FD_RESERVE (\([0-9]*\) + 2 \* KPK_MAX_MEMBERS)$/\1/p' run/cli/cmd_serve.c)
mm=$(sed -n 's/^#define KPK_MAX_MEMBERS \([0-9]*\)u$/\1/p' format/kpk.h)
if [ -n "$flush" ] && [ -n "$res" ] && [ -n "$mm" ] && grep -q "^FLUSH_SECONDS=$flush$" "$GEN" && grep -q "^FD_RESERVE=$((res + 2 * mm))$" "$GEN" \
    && grep -q "^LimitNOFILE=$((65536 + res + 2 * mm))$" "$UNIT" && grep -q "^TimeoutStopSec=$((30 + flush + 5))s$" "$UNIT"; then
    ok "the generator's and the unit's reserve ($((res + 2 * mm)) files) and flush ($flush s) are cmd_serve.c's; the unit's LimitNOFILE holds --max-connections 65536"
else
    notok "generator/unit constants differ from run/cli/cmd_serve.c (flush $flush, reserve $res + 2 x $mm)"
fi

# ---- systemd-analyze verify ------------------------------------------------------------------
if command -v systemd-analyze >/dev/null; then
    V="$T/verify"; mkdir -p "$V"
    cp "$UNIT" "$V/krun-serve@demo.service"
    cp -r "$G/krun-serve@demo.service.d" "$V/"
    cp "$C/demo.conf" "$I/etc/krun/demo.conf"
    out=$(MANPATH="$I/share/man" systemd-analyze verify "$V/krun-serve@demo.service" 2>&1); rc=$?
    [ $rc -eq 0 ] && [ -z "$out" ] && ok "systemd-analyze verify krun-serve@demo.service with its drop-in: clean (the man page it names found)" \
        || notok "systemd-analyze verify: exit $rc: $out"
    # it can fail: a setting systemd does not know
    sed 's/^ProtectSystem=strict$/ProtectSystem=very/' "$UNIT" > "$V/krun-serve@bad.service"
    out=$(MANPATH="$I/share/man" systemd-analyze verify "$V/krun-serve@bad.service" 2>&1)
    grep -qi "protect system value.*very" <<<"$out" && ok "systemd-analyze verify names a bad setting (ProtectSystem=very)" \
        || notok "systemd-analyze verify accepted ProtectSystem=very: $out"
    sec=$(systemd-analyze security --offline=yes "$V/krun-serve@demo.service" 2>/dev/null | sed -n 's/.*Overall exposure level for .*: \([0-9.]*\) .*/\1/p')
    [ -n "$sec" ] && awk -v s="$sec" 'BEGIN { exit !(s <= 2.0) }' \
        && ok "systemd-analyze security: exposure $sec (of 10; 2.0 or less)" || notok "systemd-analyze security: exposure '$sec'"
else
    skip "systemd-analyze verify (systemd is not installed)"
fi

# ---- sd_notify -------------------------------------------------------------------------------
python3 tests/cli/notify_run.py "$T/notify.sock" -- "$BIN/krun" serve "$T/m.kpk" --port 0 --quiet > "$T/n1.json" 2>&1
ready "$T/n1.json" && ok "NOTIFY_SOCKET a path: READY=1 and STATUS once /health answers, STOPPING=1 at SIGTERM, exit 0" \
    || notok "sd_notify to a path: $(cat "$T/n1.json")"
NOTIFY_SOCKET=relative/not-a-socket "$BIN/krun" serve "$T/m.kpk" --port 0 --quiet > /dev/null 2> "$T/badsock.err" &
pid=$!
for _ in $(seq 100); do grep -q "listening" "$T/badsock.err" && break; sleep 0.1; done
kill -TERM $pid; wait $pid; rc=$?
[ $rc -eq 0 ] && grep -q "cannot notify systemd through NOTIFY_SOCKET=relative/not-a-socket" "$T/badsock.err" \
    && ok "a NOTIFY_SOCKET that cannot be used is reported on stderr; the server serves and stops cleanly" \
    || notok "bad NOTIFY_SOCKET: exit $rc: $(cat "$T/badsock.err")"

# ---- ExecStart by hand, as an unprivileged user ----------------------------------------------
if [ "$(id -u)" -ne 0 ] || ! command -v setpriv >/dev/null; then
    skip "the unit's ExecStart run as an unprivileged user (needs root and setpriv)"
else
    # a world-readable model and a cache owned by the user, as CacheDirectory= makes it
    P=$(mktemp -d /tmp/kpk-unit.XXXXXX); chmod 755 "$P"
    cp "$T/m.kpk" "$P/m.kpk"; chmod 644 "$P/m.kpk"
    mkdir -m 750 "$P/cache"; chown nobody:nogroup "$P/cache" 2>/dev/null || chown 65534:65534 "$P/cache"
    printf 'MODEL=%s\nARGS=--mem 64M --io direct --port 0\nKRUN_API_KEY=secret\n' "$P/m.kpk" > "$I/etc/krun/hand.conf"
    KRUN_CONF_DIR="$I/etc/krun" "$GEN" "$G"
    # the line as systemd expands it: ${MODEL} one word, $CACHE and $ARGS split at spaces
    MODEL=$(sed -n 's/^MODEL=//p' "$I/etc/krun/hand.conf"); ARGS=$(sed -n 's/^ARGS=//p' "$I/etc/krun/hand.conf")
    CACHE=$(sed -n 's/^Environment="CACHE=\(.*\)"$/\1/p' "$UNIT" | sed "s|%C/krun/%i|$P/cache|")
    words=()
    for w in $(sed -n 's/^ExecStart=//p' "$UNIT"); do
        case $w in
            '${MODEL}') words+=("$MODEL") ;;
            '$CACHE') words+=($CACHE) ;;
            '$ARGS') words+=($ARGS) ;;
            *) words+=("$w") ;;
        esac
    done
    [ "${words[0]}" = "$I/bin/krun" ] && [ "${words[1]}" = serve ] && [ "${words[2]}" = "$P/m.kpk" ] && [ "${words[3]}" = --cache-dir ] \
        && ok "ExecStart expands to: ${words[*]}" || notok "ExecStart expands to: ${words[*]}"
    mmax=$(val hand MemoryMax)
    KRUN_API_KEY=secret NOTIFY_RUN_ERR="$T/hand.err" cg_run "$mmax" python3 tests/cli/notify_run.py "@kpk-hand-$$" --model "$P/m.kpk" \
        --cache "$P/cache" -- setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs "${words[@]}" > "$T/hand.json"
    rc=$?
    if [ $rc -eq 99 ]; then
        skip "a memory cgroup of MemoryMax=$mmax for the run by hand (no writable memory cgroup here); run without"
        KRUN_API_KEY=secret NOTIFY_RUN_ERR="$T/hand.err" python3 tests/cli/notify_run.py "@kpk-hand-$$" --model "$P/m.kpk" \
            --cache "$P/cache" -- setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs "${words[@]}" > "$T/hand.json"
    fi
    if python3 - "$T/hand.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["uid"] == 65534 and j["ready_health"] == 200 and j["request"] == 200, j
assert j["odirect"] is True and j["cache_files"] > 0 and j["exit"] == 0, j
assert j["stopping"].startswith("STOPPING=1"), j
PY
    then
        ok "as uid 65534 in a cgroup of MemoryMax=$mmax (--mem 64M): ready, /health and an authorized completion answered, the model read with O_DIRECT, the cache written in its directory, drained and exit 0 at SIGTERM"
    else
        notok "ExecStart by hand: $(cat "$T/hand.json") $(tail -5 "$T/hand.err")"
    fi
    rm -rf "$P"
fi
finish
