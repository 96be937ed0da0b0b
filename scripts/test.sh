#!/usr/bin/env bash
# Installs what is missing, configures, builds and runs every test, then the input suites under
# ASan + UBSan (CI runs exactly this).
#   PRL_BUILD_DIR   build directory (default: build)
#   PRL_CMAKE_ARGS  extra CMake arguments, e.g. "-DPRL_CUDA=OFF"
#   PRL_TEST_LEARNING=1  the learning runs too (ctest label `learning`: learning curves of
#                   several minutes each, docs/development.md "Learning runs"); CI leaves them out
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/setup_test_references.sh
./scripts/setup_deploy_validation.sh
./scripts/setup_agent_example.sh
BUILD_DIR=${PRL_BUILD_DIR:-build}
JOBS=$(nproc)
# shellcheck disable=SC2086
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${PRL_CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "$JOBS"
SELECT=(-LE learning)
if [[ ${PRL_TEST_LEARNING:-0} == 1 ]]; then SELECT=(); fi
if ! (cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS" "${SELECT[@]}"); then
  ./scripts/failed_tests_tail.py "$BUILD_DIR" 60
  exit 8
fi
# The suites of input from outside again, under ASan + UBSan (docs/development.md, "Sanitizers").
./scripts/sanitize.sh asan inputs
