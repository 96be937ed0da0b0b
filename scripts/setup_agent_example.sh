#!/usr/bin/env bash
# Installs the example agent's dependencies (examples/openai_agent, pinned in its
# package-lock.json): openai, @grpc/grpc-js and @grpc/proto-loader. Idempotent; without
# node/npm or the registry it prints why and exits 0, and the tests that need the agent skip,
# naming this script (scripts/npm_ci_pinned.sh).
set -euo pipefail
here=$(dirname "$0")
exec "$here/npm_ci_pinned.sh" "$here/../examples/openai_agent" setup_agent_example \
  "agent example tests"
