#!/usr/bin/env bash
# A model file that changes under a running process (issue 34.1; docs/RELIABILITY.md, "A model file
# that changes while it runs"): overwritten in place (cp other.kpk live.kpk) or truncated (truncate -s)
# under krun serve, krun and krun batch, in every --io mode and in place from a mapping.  No answer
# computed from bytes that changed is a 200, no run exits 0, /health says damaged (also while no
# request runs), and a truncation under a mapping (SIGBUS) is named instead of killing the process.
# Before: cp gave a 200 with text from neither model and /health ok; truncate killed krun serve by
# SIGBUS with no word.  Also (issue 34.2) a damaged primary superblock: krun goes on with the intact
# backup and says so (stderr, --json, /health), where it was silent.
. "$(dirname "$0")/lib.sh"
export PYTHONPATH="$TOP/tests/cli${PYTHONPATH:+:$PYTHONPATH}"
SLOW=1; [ -n "${KPK_SANITIZED:-}" ] && SLOW=5
export SLOW

"$BIN/k3synth" "$T/a" --geometry tiny --seed 21 --quiet >/dev/null 2>"$T/err" && "$BIN/kpack" convert "$T/a" "$T/a.kpk" --quiet \
    && "$BIN/k3synth" "$T/b" --geometry tiny --seed 22 --quiet >/dev/null 2>&1 && "$BIN/kpack" convert "$T/b" "$T/b.kpk" --quiet \
    || { notok "models: $(cat "$T/err")"; finish; exit 1; }
rm -rf "$T/a" "$T/b"
SIZE=$(stat -c %s "$T/a.kpk")
. "$(dirname "$0")/serve_lib.sh"
# the smallest budgets: every layer and lm_head streamed, so the reads after the change reach the file
minimum() { "$BIN/krun" "$T/a.kpk" --plan --mem 1G "$@" --json "$T/plan.json" >/dev/null && python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["minimum_bytes"] + (1 << 20))' "$T/plan.json"; }
SMEM=$(minimum --ctx 1100 --max-seqs 4)
KMEM=$(minimum --ctx 3003)

# ---- krun serve: a request, the file changed, another request ------------------------------------
# MODE: cp (another model copied over it: the same size, other bytes) or trunc (cut to half)
change() {
    case $1 in
        cp) cp "$T/b.kpk" "$T/live.kpk" ;;
        trunc) truncate -s $((SIZE / 2)) "$T/live.kpk" ;;
    esac
}
for io in inplace direct pread mmap; do
    for mode in cp trunc; do
        cp "$T/a.kpk" "$T/live.kpk"
        args=(--ctx 1100); [ "$io" != inplace ] && args+=(--mem "$SMEM" --io "$io")
        name="serve-$mode-$io"
        start "$name" "$T/live.kpk" --quiet "${args[@]}" || continue
        MODE=$mode LIVE="$T/live.kpk" B="$T/b.kpk" HALF=$((SIZE / 2)) py <<'PY' && ok "krun serve $io, the file changed ($mode) under it: the answer before is 200, after 500/503 naming the file; /health damaged, also before any request runs on it" \
            || notok "krun serve $io, $mode"
import sys, os, json, shutil, serve_client as c
port = int(sys.argv[1])
req = {"prompt": [1, 2, 3, 4], "max_tokens": 8, "temperature": 0}
st, _, body = c.request(port, "POST", "/v1/completions", req)
assert st == 200, (st, body)
if os.environ["MODE"] == "cp": shutil.copyfile(os.environ["B"], os.environ["LIVE"])
else: os.truncate(os.environ["LIVE"], int(os.environ["HALF"]))
# no request yet: /health looks at the file itself
st, _, body = c.request(port, "GET", "/health")
h = json.loads(body)
assert st == 503 and h["status"] == "damaged" and "changed while it was in use" in h["damage"], (st, h.get("damage"))
for k in range(2):
    st, _, body = c.request(port, "POST", "/v1/completions", req)
    e = json.loads(body)["error"]
    assert st in (500, 503) and e["code"] == "model_damaged" and "live.kpk" in e["message"], (st, body)
PY
        stop
        [ "$RC" -eq 1 ] && ! grep -qE "AddressSanitizer|runtime error:" "$T/$name.err" && ok "  and it exits 1 when stopped" \
            || notok "  exit $RC: $(tail -c 300 "$T/$name.err")"
    done
done

# a truncation while a request runs on a mapping: the SIGBUS of the read past the end is caught, the
# sweep fails, the server lives on and says why (before: killed by SIGBUS, nothing on stderr)
cp "$T/a.kpk" "$T/live.kpk"
start sigbus "$T/live.kpk" --quiet --ctx 1100 && {
    LIVE="$T/live.kpk" HALF=$((SIZE / 2)) py <<'PY' && ok "krun serve in place: the file truncated while a long request runs on its mapping: the request fails 500 naming a read past the end (SIGBUS caught), the server answers /health afterwards" \
        || notok "truncated under a running request"
import sys, os, json, threading, time, serve_client as c
port = int(sys.argv[1])
out = {}
def run():
    out["r"] = c.request(port, "POST", "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 1000, "ignore_eos": True})
t = threading.Thread(target=run); t.start()
time.sleep(0.3)
os.truncate(os.environ["LIVE"], int(os.environ["HALF"]))
t.join(120)
st, _, body = out["r"]
assert st == 500 or (st == 200 and b"error" in body), (st, body[:300])
st, _, body = c.request(port, "GET", "/health")
assert st == 503 and json.loads(body)["status"] == "damaged", body
PY
    stop
    [ "$RC" -eq 1 ] && ok "  exit 1 when stopped (not 135: SIGBUS)" || notok "  exit $RC: $(tail -c 300 "$T/sigbus.err")"
}

# ---- krun: the file changed between two tokens -------------------------------------------------------
# The ids go through a one-page pipe: once the first id is read krun is at most a page of ids ahead,
# blocked; then the file changes; krun must stop with exit 1 and print no id computed after.
"$BIN/krun" "$T/a.kpk" --ids 1,2,3 --gen 3000 --ignore-eos --print-ids --quiet >"$T/clean.ids" 2>/dev/null
for io in inplace direct pread mmap; do
    for mode in cp trunc; do
        cp "$T/a.kpk" "$T/live.kpk"
        args=(); [ "$io" != inplace ] && args=(--mem "$KMEM" --io "$io")
        python3 - "$BIN/krun" "$T" "$mode" $((SIZE / 2)) "${args[@]}" <<'PY' && ok "krun $io, the file changed ($mode) while it generates: exit 1 naming the file, the ids printed a prefix of the clean run's" \
            || notok "krun $io, $mode"
import sys, os, fcntl, shutil, subprocess
krun, t, mode, half, args = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]
r, w = os.pipe()
fcntl.fcntl(w, 1031, 4096)                       # F_SETPIPE_SZ: one page
p = subprocess.Popen([krun, t + "/live.kpk", "--ids", "1,2,3", "--gen", "3000", "--ignore-eos", "--print-ids", "--quiet"] + args,
                     stdout=w, stderr=subprocess.PIPE)
os.close(w)
f = os.fdopen(r, "rb")
first = f.read(1)
if mode == "cp": shutil.copyfile(t + "/b.kpk", t + "/live.kpk")
else: os.truncate(t + "/live.kpk", half)
got = first + f.read()
rc = p.wait()
err = p.stderr.read().decode()
clean = open(t + "/clean.ids", "rb").read()
assert rc == 1 and "live.kpk" in err and ("changed while it was in use" in err or "past the end" in err), (rc, err[-300:])
assert clean.startswith(got.rstrip(b"\n ,")) and len(got) < len(clean), (len(got), len(clean))
PY
    done
done

# ---- krun batch ---------------------------------------------------------------------------------------
python3 - "$T/in.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(12):
        f.write(json.dumps({"custom_id": "r%d" % i, "method": "POST", "url": "/v1/completions",
                            "body": {"prompt": [1 + i, 2, 3], "max_tokens": 400, "ignore_eos": True, "temperature": 0}}) + "\n")
PY
for mode in cp trunc; do
    cp "$T/a.kpk" "$T/live.kpk"; rm -f "$T/out.jsonl" "$T/out.jsonl.krun-journal"
    "$BIN/krun" batch "$T/live.kpk" "$T/in.jsonl" "$T/out.jsonl" --max-seqs 2 --quiet 2>"$T/batch.err" & bp=$!
    for _ in $(seq 400); do [ -s "$T/out.jsonl.krun-journal" ] && [ "$(wc -l <"$T/out.jsonl.krun-journal")" -ge 2 ] && break; sleep 0.02; done
    change $mode
    wait $bp; rc=$?
    [ $rc -eq 1 ] && [ ! -e "$T/out.jsonl" ] && grep -q "live.kpk" "$T/batch.err" \
        && ok "krun batch, the file changed ($mode) mid-job: exit 1 naming it, OUT not written, the journal kept" \
        || notok "krun batch $mode: exit $rc: $(tail -c 300 "$T/batch.err")"
done

# ---- a damaged primary superblock (issue 34.2) --------------------------------------------------------
cp "$T/a.kpk" "$T/sb.kpk"
printf '\377' | dd of="$T/sb.kpk" bs=1 seek=100 conv=notrunc 2>/dev/null
expect_exit 1 "kpack verify: a byte of the primary superblock changed: damage" "$BIN/kpack" verify "$T/sb.kpk" --quiet
"$BIN/krun" "$T/sb.kpk" --ids 1,2,3 --gen 4 --print-ids --quiet --json "$T/sb.json" >"$T/sb.ids" 2>"$T/sb.err"; rc=$?
"$BIN/krun" "$T/a.kpk" --ids 1,2,3 --gen 4 --print-ids --quiet >"$T/a4.ids" 2>/dev/null
[ $rc -eq 0 ] && cmp -s "$T/sb.ids" "$T/a4.ids" && grep -q "warning: .*sb.kpk: primary superblock damaged .*backup.*needs repair" "$T/sb.err" \
    && python3 -c 'import json,sys; assert "primary superblock damaged" in json.load(open(sys.argv[1]))["warning"]' "$T/sb.json" \
    && ok "krun on a damaged primary superblock: the same ids from the intact backup, and says so (stderr even with --quiet, --json warning)" \
    || notok "krun, damaged primary superblock: exit $rc: $(cat "$T/sb.err")"
start sbserve "$T/sb.kpk" --quiet && {
    py <<'PY' && ok "  krun serve: /health file_warning names it" || notok "  /health file_warning"
import sys, serve_client as c
h = c.health(int(sys.argv[1]))
assert h["status"] == "ok" and "primary superblock damaged" in h["file_warning"], h
PY
    stop
}
finish
