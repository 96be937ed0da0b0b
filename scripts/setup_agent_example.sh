#!/usr/bin/env bash
# Installs the example agent's dependencies (examples/openai_agent, pinned in its
# package-lock.json): openai, @grpc/grpc-js and @grpc/proto-loader. Idempotent: does nothing when
# node_modules matches the lock file. Without node/npm or the registry it prints why and exits 0;
# the tests that need the agent then skip, naming this script.
set -euo pipefail
cd "$(dirname "$0")/../examples/openai_agent"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "setup_agent_example: node/npm not found; agent example tests will skip"
  exit 0
fi
stamp=node_modules/.prl-lock-stamp
if [[ -f $stamp ]] && cmp -s package-lock.json "$stamp"; then exit 0; fi
echo "setup_agent_example: npm ci in $(pwd)"
if npm ci --no-audit --no-fund --loglevel=error; then
  cp package-lock.json "$stamp"
else
  echo "setup_agent_example: npm ci failed; agent example tests will skip"
fi
