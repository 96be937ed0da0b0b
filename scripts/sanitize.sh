#!/usr/bin/env bash
# Builds test suites with a sanitizer and runs them (docs/development.md, "Sanitizers").
#
# usage: scripts/sanitize.sh asan|tsan [all|inputs|concurrency|SUITE,SUITE...] [-- GTEST_ARGS...]
#   asan          AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/); default scope
#                 `all`: every CPU test suite
#   tsan          ThreadSanitizer (build-tsan/); default scope `concurrency`: the suites whose
#                 threads meet (episode engine, endpoint, coordinator, replay, weight transports,
#                 the adapters' weight server, step turns and thread, the step batcher,
#                 adapter learner)
#   inputs        the suites of input from outside that build without the engine (bounded
#                 JSON, the endpoint's parsers and server, the tokenizer and chat template):
#                 what CI runs under asan (scripts/test.sh), within its time budget. The
#                 coordinator's validation, tool calls and the agent endpoint end to end run
#                 in `all` (and their parsers in the fuzzers, scripts/fuzz.sh)
# A finding stops the suite with its report (halt_on_error); the script exits non-zero.
# The build is CUDA-free (sanitizers cover the host code) and incremental.
#   PRL_SANITIZE_PHASE=build|run   only build the suites, or only run them (built before);
#                   default both (scripts/test.sh builds while ctest runs, then runs them)
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?usage: scripts/sanitize.sh asan|tsan [all|inputs|concurrency]}
SCOPE=${2:-}
shift $(($# < 2 ? $# : 2))
[[ "${1:-}" == "--" ]] && shift

INPUT_SUITES=(json_input_test openai_test tokenizer_test chat_template_test)
CONCURRENCY_SUITES=(episode_test openai_test coordinator_test replay_buffer_test
  replay_ingest_test weight_shm_transport_test weight_grpc_transport_test
  weight_grpc_adapter_server_test weight_collective_transport_test learner_step_turns_test
  learner_joint_step_test adapter_learner_test)

case "$MODE" in
  asan)
    FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    DIR=build-asan
    # -O1 -g1: ASan's usual optimisation, with line tables for the reports' stacks (CI's
    # budget: -O2 -g took twice the compile time, the endpoint's Beast server 263 s against 119).
    OPT="-O1 -g1 -DNDEBUG"
    SCOPE=${SCOPE:-all}
    # Leaks are reported too; UBSan stops at its first finding, with a stack.
    export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    ;;
  tsan)
    FLAGS="-fsanitize=thread -fno-omit-frame-pointer"
    DIR=build-tsan
    OPT="-O2 -g -DNDEBUG"  # CMake's RelWithDebInfo
    SCOPE=${SCOPE:-concurrency}
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp}
    # Debian's Abseil rebuilt with TSan (its sonames), loaded by the suites and by Debian's gRPC,
    # so every absl::Mutex, gRPC's included, is seen to synchronise (scripts/tsan_deps.sh).
    TSAN_LIBS=$(./scripts/tsan_deps.sh)
    export LD_LIBRARY_PATH=$TSAN_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # libgomp's and OpenBLAS's own threads are not instrumented either: kernels run on the
    # calling thread, so the threads TSan watches are prl's (and gRPC's).
    export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
    ;;
  *)
    echo "usage: scripts/sanitize.sh asan|tsan [all|inputs|concurrency]" >&2
    exit 2
    ;;
esac

./scripts/setup.sh
cmake -S . -B "$DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPRL_CUDA=OFF \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$OPT" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$OPT" \
  -DCMAKE_CXX_FLAGS="$FLAGS" -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_EXE_LINKER_FLAGS="$FLAGS" \
  -DCMAKE_SHARED_LINKER_FLAGS="$FLAGS" >/dev/null

case "$SCOPE" in
  inputs) SUITES=("${INPUT_SUITES[@]}") ;;
  concurrency) SUITES=("${CONCURRENCY_SUITES[@]}") ;;
  all)
    mapfile -t SUITES < <(grep -rhoE 'prl_gtest\([a-z0-9_]+' tests/*/CMakeLists.txt |
      sed 's/prl_gtest(//' | grep -v '^cuda_' | grep -v nccl)
    ;;
  *) IFS=, read -r -a SUITES <<<"$SCOPE" ;;  # suites by name: openai_test,json_input_test
esac

PHASE=${PRL_SANITIZE_PHASE:-all}
if [[ $PHASE != run ]]; then
  cmake --build "$DIR" -j "$(nproc)" --target "${SUITES[@]}"
fi
if [[ $PHASE == build ]]; then
  echo "$MODE: ${#SUITES[@]} suites built"
  exit 0
fi
failed=()
for suite in "${SUITES[@]}"; do
  binary=$(find "$DIR/tests" -type f -name "$suite" -perm -u+x | head -1)
  echo "== $MODE: $suite"
  # A test that cannot run here (no GPU) skips, as under ctest.
  if ! OMP_WAIT_POLICY=PASSIVE "$binary" --gtest_brief=1 "$@"; then failed+=("$suite"); fi
done
# The closing line counts suites (each a GoogleTest binary, clean or not).
[[ ${#failed[@]} -gt 0 ]] && echo "$MODE: failed suites: ${failed[*]}" >&2
echo "$MODE: $((${#SUITES[@]} - ${#failed[@]})) passed, ${#failed[@]} failed"
[[ ${#failed[@]} -eq 0 ]]
