#!/usr/bin/env bash
# The first command to run on a fresh machine: installs what is missing, builds prl, and runs
# the main job on its built-in default: `prl run`, the whole pipeline on this machine.
#
# The built-in run (`prl run --print-config` shows it): a tiny Qwen2-style model created on the
# fly with a character vocabulary, a short supervised warm-start on the arithmetic task
# (`prl learner train --loss sft`), then RL — a coordinator, a learner and two actors as
# separate processes, weights swapped into the actors mid-generation — and greedy accuracy on
# held-out problems before and after RL. Everything lands in runs/quickstart/ (summary.json,
# logs, checkpoints, the final model). Extra arguments go to `prl run`, e.g.
#   ./scripts/quickstart.sh --mode sync --set learner.steps=100
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
BUILD_DIR=${PRL_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target prl
PRL="$BUILD_DIR/cli/prl"

echo
"$PRL" run "$@"
echo
echo "Next: ./scripts/test.sh runs the test suite; '$PRL bench e2e' compares sync and pipeline"
echo "mode on this config; '$PRL run --help' lists the options."
