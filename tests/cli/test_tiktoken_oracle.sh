#!/usr/bin/env bash
# krun's tokenizer against npm tiktoken on the post-Unicode-14 corpus (tests/tiktoken/README.md), when
# node and the npm packages are installed; a visible skip otherwise (make test never uses the network).
MIXES=${MIXES:-1000} exec "$(dirname "$0")/../tiktoken/compare.sh"
