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
# Each phase's wall time, printed at the end (and before a failure's tail): CI's budget is read
# from them (docs/development.md, "CI").
phase_start=0  # (SECONDS counts from the script's start: the setup scripts above)
phases=()
phase() {
  phases+=("$1 $((SECONDS - phase_start)) s")
  phase_start=$SECONDS
}
print_phases() { echo "test.sh phases: ${phases[*]} (total ${SECONDS} s)"; }
phase setup
BUILD_DIR=${PRL_BUILD_DIR:-build}
JOBS=$(nproc)
# shellcheck disable=SC2086
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${PRL_CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "$JOBS"
phase build
SELECT=(-LE learning)
if [[ ${PRL_TEST_LEARNING:-0} == 1 ]]; then SELECT=(); fi
# The suites of input from outside run again under ASan + UBSan after ctest (docs/development.md,
# "Sanitizers"). Their build runs meanwhile at the lowest priority, in the CPU ctest leaves idle
# (its tests wait for servers, processes and pods: about a quarter of 2 cores). Tests that start
# their processes in sessions of their own put them in scheduling autogroups of their own, where
# a process's nice value counts only against its own group: so the build runs in a session of
# its own (a process group a failed ctest stops) whose autogroup is niced to 19 too.
# Where an autogroup cannot be niced (no autogroups, or not allowed), the build stays in this
# session, niced, in a process group of its own (set -m).
mkdir -p "$BUILD_DIR"
asan_log=$BUILD_DIR/asan-build.log
if setsid --wait bash -c 'echo 19 > /proc/self/autogroup' 2> /dev/null; then
  PRL_SANITIZE_PHASE=build setsid bash -c \
    'echo 19 > /proc/self/autogroup; exec nice -n 19 ./scripts/sanitize.sh asan inputs' \
    > "$asan_log" 2>&1 &
else
  set -m
  PRL_SANITIZE_PHASE=build nice -n 19 ./scripts/sanitize.sh asan inputs > "$asan_log" 2>&1 &
  set +m
fi
asan_build=$!
if ! (cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS" "${SELECT[@]}"); then
  kill -- -"$asan_build" 2> /dev/null || true
  phase ctest
  print_phases
  ./scripts/failed_tests_tail.py "$BUILD_DIR" 60
  exit 8
fi
phase ctest
if ! wait "$asan_build"; then
  tail -n 60 "$asan_log"
  echo "test.sh: the ASan build of the input suites failed (its log: $asan_log)" >&2
  exit 9
fi
phase asan-build-after-ctest
PRL_SANITIZE_PHASE=run ./scripts/sanitize.sh asan inputs
phase asan
print_phases
