#!/usr/bin/env bash
# A short run of the end-to-end request soak (tests/soak/serve_soak.py; `make soak` runs 10,000
# requests under ASan/UBSan): a few hundred random requests over every field, with disconnects,
# half-closes and three epochs ended by signals (two signals, SIGINT, SIGTERM with requests in
# flight), against the tiny model with the real tokenizer.  Under `make asan`, $BIN/krun is the
# sanitizer build.  SERVE_SOAK_SEED=N replays a run (the seed is printed).
. "$(dirname "$0")/lib.sh"
TOK="$K3_SHARED/fixtures/tokenizer/tiktoken.model"
if [ ! -f "$TOK" ]; then skip "request soak: the real tokenizer $TOK is absent"; finish; exit 0; fi
DEADLINE=60; [ -n "${KPK_SANITIZED:-}" ] && DEADLINE=300
python3 "$TOP/tests/soak/serve_soak.py" --krun "$BIN/krun" --tools "$BIN" --tokenizer "$TOK" --requests "${SERVE_SOAK_REQUESTS:-250}" \
    --epochs 3 --workers 8 --deadline $DEADLINE --seed "${SERVE_SOAK_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}" \
    --work "$T/soak" --tap | sed 's/^serve soak:/# serve soak:/; s/^  /#   /'
[ "${PIPESTATUS[0]}" -eq 0 ] || FAILS=$((FAILS + 1))
finish
