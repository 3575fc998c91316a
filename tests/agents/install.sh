#!/usr/bin/env bash
# Installs the pinned coding-agent CLIs into tests/agents/node_modules (test_krun_serve_agents.sh
# runs one turn of each; .ci/run calls this).  Everything comes from npm's registry:
#  - `npm install` with the lock, not `npm ci`: opencode-ai lists a binary package per platform as
#    optional, the lock holds only those the registry has for linux-x64, and npm ci refuses it;
#  - npm 11 runs no install script it has not been told to allow, and two of the CLIs need theirs:
#    each copies its native binary out of its per-platform package (already downloaded by npm, no
#    network) over a placeholder.  They are run here by hand, by name, and nothing else's.
# Exit 0 when all three CLIs answer --version; otherwise non-zero, saying which.
set -eu
cd "$(dirname "$0")"
command -v npm >/dev/null || { echo "tests/agents/install.sh: no npm (tests/deps.sh installs it)" >&2; exit 2; }
npm install --no-audit --no-fund --no-save --ignore-scripts
(cd node_modules/@anthropic-ai/claude-code && node install.cjs)
(cd node_modules/opencode-ai && node ./postinstall.mjs)
rc=0
for c in codex claude opencode; do
    v=$(timeout 120 node_modules/.bin/$c --version 2>&1 </dev/null) || { echo "tests/agents/install.sh: $c does not start: $v" >&2; rc=1; continue; }
    echo "$c: $(printf '%s' "$v" | tail -1)"
done
exit $rc
