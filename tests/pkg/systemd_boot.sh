#!/usr/bin/env bash
# krun-serve@.service run by systemd itself (CI, root; tests/pkg/deb.sh calls it with the kpk
# package installed).  This machine's init is not systemd, so the test boots one: systemd as
# PID 1 in a container (systemd-nspawn, its own network) whose root is this machine's root under
# a throw-away overlay, so the installed package is there and nothing the container does stays.
# In it, krun-serve@demo is enabled before boot and must then:
#   start at boot and become active only through READY=1 (Type=notify), STATUS "serving ...";
#   have the generator's MemoryMax, LimitNOFILE and TimeoutStopSec from /etc/krun/demo.conf;
#   run as the user krun with no capability, no new privileges, a seccomp filter;
#   answer /health and an authorized completion under MemoryDenyWriteExecute and the rest of
#   the hardening, reading the model with O_DIRECT (--mem 100M streams its experts), and write its
#   prefix cache in /var/cache/krun/demo;
#   come back after a crash (SIGKILL) by Restart=on-failure;
#   at `systemctl stop`, finish the request running (the drain: its log line comes after the
#   SIGTERM line), then exit 0.
#     tests/pkg/systemd_boot.sh MODEL.kpk
set -u
MODEL=${1:?usage: systemd_boot.sh MODEL.kpk}
FAILS=0
ok() { echo "ok - $*"; }
notok() { echo "not ok - $*"; FAILS=$((FAILS + 1)); }
skip() { echo "skip - $*"; }
[ "$(id -u)" -eq 0 ] || { skip "krun-serve@.service under systemd in a container (needs root)"; exit 0; }
command -v systemd-nspawn >/dev/null || { skip "krun-serve@.service under systemd in a container (systemd-nspawn: tests/deps.sh pkg)"; exit 0; }
[ -x /usr/bin/krun ] && [ -f /lib/systemd/system/krun-serve@.service ] || { notok "the kpk package is not installed"; exit 1; }

R=$(mktemp -d /tmp/kpk-boot.XXXXXX)
LOG="$R.log"
NSPAWN=0
cleanup() {
    if [ "$NSPAWN" -gt 0 ] && kill -0 "$NSPAWN" 2>/dev/null; then
        kill -TERM "$NSPAWN"   # nspawn asks the container's systemd to power off
        for _ in $(seq 60); do kill -0 "$NSPAWN" 2>/dev/null || break; sleep 1; done
        kill -KILL "$NSPAWN" 2>/dev/null
        wait "$NSPAWN" 2>/dev/null
    fi
    umount "$R/root" 2>/dev/null
    umount "$R" 2>/dev/null
    rmdir "$R" 2>/dev/null
    rm -f "$LOG"
}
trap cleanup EXIT
if ! mount -t tmpfs -o size=2g kpk-boot "$R" || ! mkdir -p "$R/upper" "$R/work" "$R/root" \
    || ! mount -t overlay kpk-boot -o lowerdir=/,upperdir="$R/upper",workdir="$R/work" "$R/root"; then
    skip "krun-serve@.service under systemd in a container (no overlay of / here)"
    exit 0
fi
# the container's own configuration, in the overlay only
mkdir -p "$R/root/srv/kpk"
cp "$MODEL" "$R/root/srv/kpk/demo.kpk" && chmod 644 "$R/root/srv/kpk/demo.kpk"
cat > "$R/root/etc/krun/demo.conf" <<'EOF'
MODEL=/srv/kpk/demo.kpk
ARGS=--mem 100M --ctx 512 --max-seqs 2 --io direct --host 127.0.0.1 --port 8765 --max-connections 100 --shutdown-timeout 20
KRUN_API_KEY=secret
EOF
chmod 600 "$R/root/etc/krun/demo.conf"
mkdir -p "$R/root/etc/systemd/system/multi-user.target.wants"
ln -sf /lib/systemd/system/krun-serve@.service "$R/root/etc/systemd/system/multi-user.target.wants/krun-serve@demo.service"

t0=$(date +%s)
systemd-nspawn -D "$R/root" --private-network --register=no --keep-unit -M "kpk-boot-$$" --boot > "$LOG" 2>&1 < /dev/null &
NSPAWN=$!
L=
for _ in $(seq 60); do
    L=$(pgrep -P "$NSPAWN" | head -1)
    [ -n "$L" ] && grep -q '^NSpid:.*[[:space:]]1$' "/proc/$L/status" 2>/dev/null && break
    L=; sleep 1
done
if [ -z "$L" ]; then
    skip "krun-serve@.service under systemd in a container (the container did not boot: $(tail -3 "$LOG" | tr '\n' ' '))"
    exit 0
fi
cin() { nsenter --target "$L" --mount --uts --ipc --net --pid -- "$@"; }
state=
for _ in $(seq 180); do   # the manager's bus comes up a moment after PID 1 starts
    state=$(cin systemctl is-system-running 2>/dev/null)
    case $state in running|degraded) break ;; esac
    sleep 1
done
prop() { cin systemctl show krun-serve@demo -p "$1" --value; }
if [ "$(prop ActiveState)" = active ]; then
    ok "systemd booted in a container ($state, $(($(date +%s) - t0)) s) and started the enabled krun-serve@demo at boot"
else
    notok "krun-serve@demo at boot: $(prop ActiveState)/$(prop SubState) $(prop Result); $(cin journalctl -u krun-serve@demo --no-pager 2>&1 | tail -5)"
    exit 1
fi
[ "$(prop Type)" = notify ] && [[ $(prop StatusText) == 'serving "demo" on port 8765' ]] \
    && ok "Type=notify: active after READY=1; systemctl status says: $(prop StatusText)" \
    || notok "readiness: Type $(prop Type), StatusText '$(prop StatusText)'"
[ "$(prop MemoryMax)" = $(((100 << 20) + (1 << 30))) ] && [ "$(prop LimitNOFILE)" = 676 ] && [ "$(prop TimeoutStopUSec)" = 35s ] \
    && cin test -f /run/systemd/generator/krun-serve@demo.service.d/50-krun-derived.conf \
    && ok "the generator's drop-in applies: MemoryMax=$(prop MemoryMax) (100M + 1 GiB), LimitNOFILE=676 (100 + 576), TimeoutStopSec=35s" \
    || notok "derived limits: MemoryMax $(prop MemoryMax), LimitNOFILE $(prop LimitNOFILE), TimeoutStopUSec $(prop TimeoutStopUSec)"
pid=$(prop MainPID)
st=$(cin cat "/proc/$pid/status")
uid=$(cin id -u krun)
if grep -qP "^Uid:\t$uid\t" <<<"$st" && grep -q '^CapEff:\s*0*$' <<<"$st" && grep -q '^NoNewPrivs:\s*1$' <<<"$st" && grep -q '^Seccomp:\s*2$' <<<"$st"; then
    ok "it runs as the user krun (uid $uid), no capability, no new privileges, a seccomp filter"
else
    notok "process $pid: $(grep -E '^(Uid|CapEff|NoNewPrivs|Seccomp):' <<<"$st" | tr '\n' ' ')"
fi
odirect=$(cin sh -c 'for f in /proc/'"$pid"'/fd/*; do [ "$(readlink "$f")" = /srv/kpk/demo.kpk ] && sed -n "s/^flags:[[:space:]]*//p" /proc/'"$pid"'/fdinfo/${f##*/}; done' \
    | while read -r fl; do [ $((8#$fl & 8#40000)) -ne 0 ] && echo yes; done | head -1)
[ "$odirect" = yes ] && ok "it reads /srv/kpk/demo.kpk with O_DIRECT under the hardening" || notok "no O_DIRECT descriptor on the model"

req() { cin curl -s -m 120 -o /dev/stderr -w '%{http_code}' -H 'Content-Type: application/json' "$@"; }
code=$(req http://127.0.0.1:8765/health 2>"$R.health")
[ "$code" = 200 ] && grep -q '"status"' "$R.health" && ! grep -q '"plan"' "$R.health" \
    && ok "/health without the key: 200 and the status only" || notok "/health: $code $(head -c 200 "$R.health")"
code=$(req -H 'Authorization: Bearer secret' -d '{"prompt": "Hello from systemd", "max_tokens": 8}' \
    http://127.0.0.1:8765/v1/completions 2>"$R.comp")
[ "$code" = 200 ] && grep -q '"choices"' "$R.comp" \
    && ok "an authorized completion: 200 (the key from /etc/krun/demo.conf; the tokenizer without PCRE2's JIT)" \
    || notok "completion: $code $(head -c 300 "$R.comp")"
code=$(req -d '{"prompt": "x", "max_tokens": 1}' http://127.0.0.1:8765/v1/completions 2>/dev/null)
[ "$code" = 401 ] && ok "without the key: 401" || notok "without the key: $code"
n=0
for _ in $(seq 50); do
    n=$(cin find /var/cache/krun/demo -type f -user krun 2>/dev/null | wc -l)
    [ "$n" -gt 0 ] && break
    sleep 0.2
done
mode=$(cin stat -c '%a %U' /var/cache/krun/demo 2>/dev/null)
[ "$n" -gt 0 ] && [ "$mode" = "750 krun" ] && ok "its prefix cache: $n files in /var/cache/krun/demo (750, owned by krun), the one place it may write" \
    || notok "cache: $n files, /var/cache/krun/demo '$mode'"

# a crash: Restart=on-failure brings it back (RestartSec=10s)
cin kill -KILL "$pid"
back=
for _ in $(seq 60); do
    [ "$(prop NRestarts)" = 1 ] && [ "$(prop ActiveState)" = active ] && [ "$(prop MainPID)" != "$pid" ] && { back=1; break; }
    sleep 1
done
[ -n "$back" ] && ok "killed with SIGKILL, it is restarted (NRestarts=1) and active again" \
    || notok "after SIGKILL: $(prop ActiveState) NRestarts=$(prop NRestarts)"

# a graceful stop: the request running when SIGTERM comes is finished, then exit 0
cin sh -c 'curl -s -m 120 -H "Content-Type: application/json" -H "Authorization: Bearer secret" \
    -d "{\"prompt\": \"Once upon a time\", \"max_tokens\": 400, \"ignore_eos\": true}" http://127.0.0.1:8765/v1/completions' > "$R.long" 2>&1 &
cpid=$!
for _ in $(seq 100); do
    cin curl -s -H 'Authorization: Bearer secret' http://127.0.0.1:8765/health | grep -q '"live_sequences": *[1-9]' && break
    sleep 0.1
done
cin systemctl stop krun-serve@demo
wait $cpid
# the journal: the SIGTERM line, then the request's own line (it ended during the drain)
cin journalctl -u krun-serve@demo --no-pager -o cat > "$R.journal"
sig=$(grep -n 'SIGTERM: taking no new requests' "$R.journal" | tail -1 | cut -d: -f1)
done_line=$(grep -n '+ 400 generated tokens' "$R.journal" | tail -1 | cut -d: -f1)
if python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["usage"]["completion_tokens"]==400, j' "$R.long" 2>/dev/null \
    && [ "$(prop Result)" = success ] && [ "$(prop ExecMainStatus)" = 0 ] && [ -n "$sig" ] && [ -n "$done_line" ] && [ "$done_line" -gt "$sig" ]; then
    ok "systemctl stop during a 400-token request: the drain began (SIGTERM logged), the request finished after it (400 tokens), exit 0, Result=success"
else
    notok "stop: Result $(prop Result), status $(prop ExecMainStatus), SIGTERM at line '$sig', the request's line '$done_line', reply $(head -c 300 "$R.long"); $(tail -5 "$R.journal")"
fi
rm -f "$R.health" "$R.comp" "$R.long" "$R.journal"
echo "# systemd_boot: $FAILS failed"
[ "$FAILS" -eq 0 ]
