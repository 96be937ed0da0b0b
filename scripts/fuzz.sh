#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs one for a while.
#
# usage: scripts/fuzz.sh [SECONDS=120] [TARGET=safetensors_header]
# The committed seed corpus (fuzz/corpus/TARGET) stays small: new inputs go to a scratch
# corpus under build-fuzz/. A crash leaves crash-* in build-fuzz/; minimise it, add it to the
# committed corpus (the corpus-replay test then guards the fix) and fix the parser.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN=${1:-120}
TARGET=${2:-safetensors_header}
./scripts/setup.sh
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DPRL_FUZZ=ON -DPRL_CUDA=OFF \
  -DPRL_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build-fuzz "${TARGET}_fuzzer"
mkdir -p "build-fuzz/corpus-${TARGET}"
cd build-fuzz
"./fuzz/${TARGET}_fuzzer" -max_total_time="$SECONDS_TO_RUN" -max_len=4096 -timeout=10 \
  -print_final_stats=1 "corpus-${TARGET}" "../fuzz/corpus/${TARGET}"
