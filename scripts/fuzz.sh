#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs one, or each in turn.
#
# usage: scripts/fuzz.sh [SECONDS=120] [TARGET=safetensors_header]
#   TARGET  a target of fuzz/CMakeLists.txt (safetensors_header, record_decode, chat_request,
#           prompt_line, environment_reply, agent_reply, tool_calls, http_request), or all: each
#           for SECONDS.
# Environment:
#   FUZZ_RUNS=N     stop after N executions too (-runs=N): N executions or SECONDS, whichever
#                   comes first
#   FUZZ_MAX_LEN=N  the longest input tried (default 4096; prompt_line 65536, deep nesting)
#   FUZZ_JOBS=N     ninja's parallel jobs for the build (default: ninja's own)
#   FUZZ_ARGS=...   more libFuzzer flags, e.g. "-len_control=0 -use_value_profile=1"
# Each run ends with libFuzzer's final stats: the DONE line (cov, ft, corp, exec/s) and
# stat::number_of_executed_units. The committed seed corpus (fuzz/corpus/TARGET) stays small:
# new inputs go to a scratch corpus, build-fuzz/corpus-TARGET; fuzz/TARGET.dict, when there is
# one, lists the tokens (field names, markers) that mutations insert. A crash leaves
# build-fuzz/artifacts-TARGET/crash-*; minimise it (build-fuzz/fuzz/TARGET_fuzzer
# -minimize_crash=1 -runs=100000 CRASH), add it to the committed corpus (the corpus-replay test
# then guards the fix) and fix the parser. With all, every target runs even when one fails, and
# the exit status says whether any did.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN=${1:-120}
TARGET=${2:-safetensors_header}

./scripts/setup.sh  # clang and its libFuzzer runtime (scripts/packages/test.txt)
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DPRL_FUZZ=ON -DPRL_CUDA=OFF \
  -DPRL_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
# The targets fuzz/CMakeLists.txt defines (prl_add_fuzzer).
mapfile -t targets < <(ninja -C build-fuzz -t targets all |
  sed -n 's|^fuzz/\([a-z0-9_]*\)_fuzzer: CXX_EXECUTABLE_LINKER.*|\1|p')
if [[ $TARGET != all ]]; then
  if [[ " ${targets[*]} " != *" $TARGET "* ]]; then
    echo "fuzz: no target '$TARGET'; one of: ${targets[*]} all" >&2
    exit 2
  fi
  targets=("$TARGET")
fi
ninja -C build-fuzz ${FUZZ_JOBS:+-j"$FUZZ_JOBS"} "${targets[@]/%/_fuzzer}"

failed=()
cd build-fuzz
for target in "${targets[@]}"; do
  max_len=${FUZZ_MAX_LEN:-4096}
  if [[ $target == prompt_line && -z ${FUZZ_MAX_LEN:-} ]]; then max_len=65536; fi
  flags=(-max_total_time="$SECONDS_TO_RUN" -max_len="$max_len" -timeout=10 -print_final_stats=1
    -artifact_prefix="artifacts-$target/")
  if [[ -n ${FUZZ_RUNS:-} ]]; then flags+=(-runs="$FUZZ_RUNS"); fi
  if [[ -f ../fuzz/$target.dict ]]; then flags+=(-dict="../fuzz/$target.dict"); fi
  read -r -a extra <<<"${FUZZ_ARGS:-}"
  mkdir -p "corpus-$target" "artifacts-$target"
  echo "fuzz: $target for ${SECONDS_TO_RUN}s${FUZZ_RUNS:+ or $FUZZ_RUNS runs}, max_len $max_len"
  if ! "./fuzz/${target}_fuzzer" "${flags[@]}" "${extra[@]}" "corpus-$target" \
    "../fuzz/corpus/$target"; then
    failed+=("$target")
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz: failed: ${failed[*]} (inputs in build-fuzz/artifacts-TARGET/)" >&2
  exit 1
fi
