#!/usr/bin/env bash
# `prl score --adapter` against the independent float64 PyTorch reference (torch_reference.py,
# peft's LoRA semantics): log-probs within 1e-4 absolute, the base's and the adapter's
# gradients within 1e-3 relative per tensor. The model is written by the reference; the adapter
# by prl (`prl adapter init`, B random: an adapter that changes the model) or by the reference
# (`make-adapter`, peft's directory layout with keys prl must accept).
#
# usage: lora_matches_reference.sh PRL WORKDIR (prl | reference) RANK ALPHA TARGETS RSLORA(0|1) \
#            MODEL-FLAGS...
set -euo pipefail
PRL=$1
WORK=$2
WRITER=$3
RANK=$4
ALPHA=$5
TARGETS=$6
RSLORA=$7
shift 7
PY=/usr/bin/python3
REF="$(cd "$(dirname "$0")" && pwd)/torch_reference.py"

rm -rf "$WORK"
mkdir -p "$WORK"
$PY "$REF" make-checkpoint "$@" --out "$WORK/model"
rs=()
if [ "$RSLORA" = 1 ]; then rs=(--rslora); fi
case $WRITER in
  prl) "$PRL" adapter init --model "$WORK/model" --out "$WORK/adapter" --rank "$RANK" \
         --alpha "$ALPHA" --targets "$TARGETS" "${rs[@]}" --seed 3 --b-std 0.3 ;;
  reference) $PY "$REF" make-adapter --model "$WORK/model" --out "$WORK/adapter" --rank "$RANK" \
               --alpha "$ALPHA" --targets "$TARGETS" "${rs[@]}" --seed 3 --dtype bf16 ;;
  *) echo "expected prl or reference, found $WRITER" >&2; exit 2 ;;
esac
VOCAB=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" \
  "$WORK/model/config.json")
$PY "$REF" gen-input --vocab-size "$VOCAB" --lines 6 --min-len 2 --max-len 90 --seed 7 \
  --out "$WORK/input.jsonl"
"$PRL" score --model "$WORK/model" --adapter "$WORK/adapter" --input "$WORK/input.jsonl" \
  --output "$WORK/logprobs.jsonl" --dump-grads "$WORK/grads.safetensors" \
  --max-batch-tokens 200 --device cpu
$PY "$REF" check-score --model "$WORK/model" --adapter "$WORK/adapter" \
  --input "$WORK/input.jsonl" --logprobs "$WORK/logprobs.jsonl" --grads "$WORK/grads.safetensors" \
  --logprob-atol 1e-4 --grad-rtol 1e-3
