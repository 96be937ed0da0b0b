#!/usr/bin/env bash
# The first command to run on a fresh machine: installs what is missing, builds prl, and runs
# the main job on a built-in default.
#
# Until the RL service exists (`prl run`, the pipeline issue), the main job is the model demo:
# create a small Qwen2-style model, score token sequences with it (log-probabilities and
# gradients), sample from it with the engine, and benchmark its training pass against OpenBLAS
# SGEMM measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
BUILD_DIR=${PRL_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target prl
PRL="$BUILD_DIR/cli/prl"
RUN=runs/quickstart
mkdir -p "$RUN"

echo
echo "== 1. A randomly initialised Qwen2-style model (Hugging Face format) =="
"$PRL" model init --preset tiny --seed 0 --out "$RUN/model"
"$PRL" model info "$RUN/model"

echo
echo "== 2. Scoring: log p(tokens[i] | tokens[:i]) for i >= score_from, one packed batch =="
cat > "$RUN/input.jsonl" <<'JSONL'
{"tokens": [1, 17, 42, 99, 7, 256, 3], "score_from": 3}
{"tokens": [5, 5, 5, 5, 5], "score_from": 1}
{"tokens": [400, 12, 88], "score_from": 2}
JSONL
"$PRL" score --model "$RUN/model" --input "$RUN/input.jsonl" --output "$RUN/logprobs.jsonl" \
  --dump-grads "$RUN/grads.safetensors"
echo "input:  $RUN/input.jsonl"
echo "output: $RUN/logprobs.jsonl"
cat "$RUN/logprobs.jsonl"
echo "gradients of -(sum of log-probs): $RUN/grads.safetensors"

echo
echo "== 3. Generation: 2 samples per prompt with the paged KV-cache engine =="
printf '{"tokens": [1, 17, 42]}\n{"tokens": [5, 5, 5, 5]}\n' > "$RUN/prompts.jsonl"
"$PRL" generate --model "$RUN/model" --input "$RUN/prompts.jsonl" --output "$RUN/samples.jsonl" \
  --n 2 --max-tokens 8 --temperature 1 --seed 0
cat "$RUN/samples.jsonl"

echo
echo "== 4. Training-pass throughput beside OpenBLAS SGEMM (same run) =="
"$PRL" bench model --config tiny --tokens 1024 --seq-len 256 --iters 3
echo
echo "Next: ./scripts/test.sh runs the test suite; 'prl bench model --config 40m' the"
echo "benchmark of the README table. The RL service (prl run) is not built yet."
