#!/usr/bin/env bash
# krun serve's page (issue 33; docs/SERVE.md, "The page"): GET / and GET /machine with curl (the
# headers, a Content-Security-Policy whose hashes are the page's own style and script, 304 on
# its ETag, the key on /machine, every member file of a set with its bytes and busy time,
# --no-ui), then the page itself in headless Chromium (tests/node/page.mjs: the key prompt, a
# typed message streaming the API's reply, reasoning folded, stop, regenerate, edit, the prefix
# cache's hit, a long prompt's progress, the machine view's plots from live data on a streamed
# model, the open-server warning, no console error), with screenshots of both views in
# $BUILD/page/ (not in git).  Skipped visibly without node, puppeteer-core or Chromium.
. "$(dirname "$0")/lib.sh"
SLOW=1; [ -n "${KPK_SANITIZED:-}" ] && SLOW=5
. "$(dirname "$0")/serve_lib.sh"

TOK="$K3_SHARED/fixtures/tokenizer/tiktoken.model"
if [ ! -f "$TOK" ]; then skip "the real tokenizer $TOK is absent"; finish; exit 0; fi
# a stripe set of two members and a trunk member, so the machine view has several drives
"$BIN/k3synth" "$T/rt" --geometry tiny --seed 2 --layers 3 --experts 4 --topk 2 --tokenizer "$TOK" --quiet >/dev/null \
    && mkdir -p "$T/d1" "$T/d2" "$T/ssd" \
    && "$BIN/kpack" convert "$T/rt" "$T/rt.kpk" --stripe "$T/d1,$T/d2" --trunk-to "$T/ssd" --stripe-unit 64K --quiet && rm -rf "$T/rt" \
    || { notok "the model: a set with the real tokenizer"; finish; exit 1; }

# --mem 100M: below the file (90 MB of which lm_head is 42 MB, with the plan's state and buffers),
# so lm_head streams every token; --chunk 32 and --progress-every 0.25: a long prompt runs in
# many sweeps and says so
start page "$T/rt.kpk" --mem 100M --ctx 4096 --max-seqs 2 --chunk 32 --progress-every 0.25 --api-key k-9 --quiet \
    || { finish; exit 1; }
URL="http://127.0.0.1:$PORT"
APID=$PID

# ---- GET /: the headers, the policy's hashes, 304 --------------------------------------------------------
curl -s -D "$T/h" -o "$T/page.html" "$URL/"
python3 - "$T/h" "$T/page.html" <<'PY' && ok "GET / without a key: 200, text/html, no-cache + ETag, nosniff, no referrer; a CSP that allows nothing but this origin's API, the page's own style and script by their SHA-256 (== the served text), data: images; no URL to anywhere in the page" \
    || notok "GET / headers or policy"
import base64, hashlib, re, sys
head, body = open(sys.argv[1], encoding="latin-1").read(), open(sys.argv[2], "rb").read()
assert head.startswith("HTTP/1.1 200"), head[:40]
h = {k.lower(): v.strip() for k, v in re.findall(r"^([^:\r\n]+):(.*?)\r?$", head, re.M)}
assert h["content-type"] == "text/html; charset=utf-8" and h["cache-control"] == "no-cache" and re.fullmatch(r'"[0-9a-f]{16}"', h["etag"]), h
assert h["x-content-type-options"] == "nosniff" and h["referrer-policy"] == "no-referrer", h
csp = dict(d.strip().split(" ", 1) for d in h["content-security-policy"].split(";"))
def sha(tag):
    m = re.findall(rb"<%s>(.*?)</%s>" % (tag, tag), body, re.S)
    assert len(m) == 1, (tag, len(m))
    return "'sha256-" + base64.b64encode(hashlib.sha256(m[0]).digest()).decode() + "'"
want = {"default-src": "'none'", "script-src": sha(b"script"), "style-src": sha(b"style"), "connect-src": "'self'", "img-src": "data:",
        "base-uri": "'none'", "form-action": "'none'", "frame-ancestors": "'none'"}
assert csp == want, (csp, want)
assert len(body) == int(h["content-length"]) and len(body) < 64 * 1024, len(body)
urls = set(re.findall(rb"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}[^\s\"')]*", body, re.I))
assert urls <= {b"http://www.w3.org/2000/svg"}, urls        # the SVG namespace is a name, never fetched
assert not re.search(rb"<(?:script|link|img|iframe)[^>]*\s(?:src|href)=[\"'](?!data:)", body, re.I), "a resource loaded from a URL"
PY
ETAG=$(tr -d '\r' <"$T/h" | sed -n 's/^ETag: //Ip')
s=$(curl -s -o "$T/304" -w '%{http_code} %{size_download}' -H "If-None-Match: $ETAG" "$URL/")
[ "$s" = "304 0" ] && ok "GET / with If-None-Match: its ETag: 304, no body" || notok "If-None-Match: $s"
s=$(curl -s -o /dev/null -w '%{http_code}' -H 'If-None-Match: "0000000000000000"' "$URL/")
[ "$s" = 200 ] && ok "another ETag: 200" || notok "another ETag: $s"
s=$(curl -s -D "$T/h405" -o /dev/null -w '%{http_code}' -X POST "$URL/")
[ "$s" = 405 ] && grep -qi '^Allow: GET' "$T/h405" && ok "POST /: 405, Allow: GET" || notok "POST /: $s"

# ---- GET /machine: the key, every member, the counters ---------------------------------------------------
s=$(curl -s -o "$T/m.out" -w '%{http_code}' "$URL/machine")
[ "$s" = 401 ] && grep -q invalid_api_key "$T/m.out" && ok "GET /machine without the key: 401" || notok "/machine without the key: $s $(cat "$T/m.out")"
curl -s -H 'Authorization: Bearer k-9' "$URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"The disk","max_tokens":12,"ignore_eos":true,"temperature":0}' >/dev/null
curl -s -H 'Authorization: Bearer k-9' "$URL/machine" >"$T/m.json"
python3 - "$T/m.json" "$T" <<'PY' && ok "GET /machine: each member file of the set (entry, trunk, 2 stripes) with its path, role and size, bytes read and busy seconds; the trunk member read 12 tokens' lm_head (>= 12 x 42 MB) in a busy time that makes its speed finite; bytes by kind, expert hits, memory; api_key, loopback" \
    || notok "/machine: $(head -c 600 "$T/m.json")"
import json, os, sys
j, d = json.load(open(sys.argv[1])), sys.argv[2]
files = [d + "/rt.kpk", d + "/ssd/rt.kpk.trunk", d + "/d1/rt.kpk.s0", d + "/d2/rt.kpk.s1"]
ms = j["members"]
assert [(m["member"], m["role"], m["stripe"]) for m in ms] == [(0, "entry", None), (1, "plain", None), (2, "stripe", 0), (3, "stripe", 1)], ms
for m, f in zip(ms, files):
    assert os.path.samefile(m["path"], f) and m["size"] == os.path.getsize(f), (m, f)
    assert m["bytes"] >= m["queued_bytes"] >= 0 and m["busy_seconds"] >= 0, m
t = ms[1]
assert t["queued_bytes"] >= 12 * 41_900_000 and 0 < t["busy_seconds"] and t["queued_bytes"] / t["busy_seconds"] > 1e6, t
assert j["bytes"]["head"] >= 12 * 41_900_000 and j["bytes"]["total"] >= j["bytes"]["head"], j["bytes"]
assert j["experts"]["hits"] + j["experts"]["misses"] > 0 and j["model"]["layers"] == 3 and j["model"]["vocab"] == 163840, j
assert j["api_key"] is True and j["loopback"] is True and j["in_place"] is False and j["rss_bytes"] > 0 and j["threads"] >= 1, j
PY
curl -s -H 'Authorization: Bearer k-9' "$URL/metrics" | grep -q 'krun_responses_total{endpoint="/machine",status="2xx"} 1' \
    && ok "/metrics counts /machine's responses" || notok "/metrics: no /machine line"

# ---- --no-ui; an open server (no key, every address) -------------------------------------------------------
start noui "$T/rt.kpk" --mem 100M --ctx 512 --max-seqs 1 --no-ui --quiet || { PID=$APID; stop; finish; exit 1; }
s=$(curl -s -o "$T/n.out" -w '%{http_code}' "http://127.0.0.1:$PORT/")
h=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")
[ "$s" = 404 ] && [ "$h" = 200 ] && ! grep -q '(the page)' "$T/n.out" && ok "--no-ui: GET / is a 404 (the API goes on)" || notok "--no-ui: / $s, /health $h"
stop
"$BIN/krun" serve --help | grep -q -- '--no-ui' && ok "krun serve --help names --no-ui" || notok "--help: no --no-ui"
start open "$T/rt.kpk" --mem 100M --ctx 512 --max-seqs 1 --host 0.0.0.0 --quiet || { PID=$APID; stop; finish; exit 1; }
OPID=$PID
OPEN_URL="http://127.0.0.1:$PORT"
curl -s "$OPEN_URL/machine" | python3 -c 'import json,sys; j=json.load(sys.stdin); assert j["api_key"] is False and j["loopback"] is False, j' \
    && ok "--host 0.0.0.0 without a key: /machine says api_key false, loopback false" || notok "open server's /machine"

# ---- the page in a browser ------------------------------------------------------------------------------------
NODE_DIR="$TOP/tests/node"
CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
case ${BUILD:-build} in /*) SHOTS="$BUILD/page" ;; *) SHOTS="$TOP/${BUILD:-build}/page" ;; esac
if ! command -v node >/dev/null; then
    skip "the page in a browser: node is not installed"
elif [ ! -d "$NODE_DIR/node_modules/puppeteer-core" ]; then
    skip "the page in a browser: puppeteer-core is not installed (npm ci --prefix tests/node; .ci/run does it)"
elif [ -z "$CHROMIUM" ]; then
    skip "the page in a browser: Chromium is not installed (apt-get install chromium; tests/deps.sh does it)"
else
    mkdir -p "$SHOTS"
    node "$NODE_DIR/page.mjs" "$CHROMIUM" "$URL" k-9 "$OPEN_URL" "$SHOTS" "$SLOW" >"$T/node.out" 2>&1 || notok "page.mjs exited non-zero: $(grep -v '^ok' "$T/node.out" | head -c 600)"
    cat "$T/node.out"
    [ -s "$SHOTS/chat.png" ] && [ -s "$SHOTS/machine.png" ] && ok "screenshots of both views: $SHOTS/chat.png, $SHOTS/machine.png" \
        || notok "no screenshots in $SHOTS"
fi
stop
[ "$RC" = 0 ] && ok "the open server exits 0" || notok "the open server exited $RC"
PID=$APID
stop
[ "$RC" = 0 ] && ok "the server exits 0" || notok "the server exited $RC"
finish
