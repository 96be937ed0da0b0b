#!/usr/bin/env bash
# End-to-end check of `prl score` against the independent float64 PyTorch reference
# (torch_reference.py): log-probs within 1e-4 absolute and gradients within 1e-3 relative per
# tensor (the foundation issue's bar).
#
# usage: score_matches_reference.sh PRL WORKDIR [--temperature T] (--prl-init | --reference) \
#            MODEL-FLAGS...
#   --prl-init:  the model is written by `prl model init MODEL-FLAGS`
#   --reference: the model is written by torch_reference.py make-checkpoint MODEL-FLAGS
#                (random norms and biases, BF16/F16 storage, shards, RoPE scaling)
set -euo pipefail
PRL=$1
WORK=$2
shift 2
TEMPERATURE=1.0
if [[ $1 == --temperature ]]; then TEMPERATURE=$2; shift 2; fi
PY=/usr/bin/python3  # Debian's python3-torch lives here
REF="$(cd "$(dirname "$0")" && pwd)/torch_reference.py"

rm -rf "$WORK"
mkdir -p "$WORK"
case $1 in
  --prl-init) shift; "$PRL" model init "$@" --out "$WORK/model" ;;
  --reference) shift; $PY "$REF" make-checkpoint "$@" --out "$WORK/model" ;;
  *) echo "expected --prl-init or --reference, found $1" >&2; exit 2 ;;
esac
VOCAB=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" \
  "$WORK/model/config.json")
# Lengths up to 150 cross the attention kernel's 64-row query blocks; a 300-token batch budget
# makes prl pack the lines into several batches.
$PY "$REF" gen-input --vocab-size "$VOCAB" --lines 9 --min-len 2 --max-len 150 --seed 5 \
  --out "$WORK/input.jsonl"
"$PRL" score --model "$WORK/model" --input "$WORK/input.jsonl" --output "$WORK/logprobs.jsonl" \
  --dump-grads "$WORK/grads.safetensors" --max-batch-tokens 300 --temperature "$TEMPERATURE" \
  --device cpu
$PY "$REF" check-score --model "$WORK/model" --input "$WORK/input.jsonl" \
  --logprobs "$WORK/logprobs.jsonl" --grads "$WORK/grads.safetensors" \
  --temperature "$TEMPERATURE" --logprob-atol 1e-4 --grad-rtol 1e-3
