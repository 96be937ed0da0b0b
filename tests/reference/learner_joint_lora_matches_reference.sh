#!/usr/bin/env bash
# A run of adapters' joint step (`prl learner step --joint`: several LoRA adapters trained in one
# set of passes over the shared frozen base, learner/joint_step.h) against the independent
# float64 PyTorch reference (learner_reference.py check-step --adapter: peft's LoRA, autograd
# over each adapter's own tensors) and against each adapter's own step:
#
#   - three adapters of different ranks, scales and targets, each with its own rollouts: each
#     one's gradient within 1e-4 of the reference's, its updated adapter within 1e-5 (SGD with
#     weight decay) and its update within 1e-2 (AdamW);
#   - each adapter's gradient and update equal its separate `prl learner step` within 1e-5, with
#     every adapter in one pass (learner.adapter_pass_tokens 4096) and one per pass (1);
#   - the check discriminates: an adapter's joint step is not the reference's step on another
#     adapter's rollouts.
#
# usage: learner_joint_lora_matches_reference.sh PRL WORKDIR TARGETS0 TARGETS1 TARGETS2 ARCH-FLAGS...
set -euo pipefail
PRL=$(realpath "$1")
WORK=$2
TARGETS=("$3" "$4" "$5")
shift 5
PY=/usr/bin/python3
REF="$(cd "$(dirname "$0")" && pwd)/learner_reference.py"
TORCH_REF="$(dirname "$REF")/torch_reference.py"
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK"
$PY "$TORCH_REF" make-checkpoint "$@" --hidden-size 32 --layers 2 --heads 4 \
  --intermediate-size 48 --vocab-size 40 --max-position-embeddings 64 --seed 3 --out m0 > /dev/null
RANKS=(4 2 3)
ALPHAS=(8 3 6)
for k in 0 1 2; do
  $PY "$REF" gen-rollouts --vocab-size 40 --groups $((2 + k)) --samples 4 --max-completion 12 \
    --seed $((10 + k)) --out "r$k.jsonl"
  # Trained-looking starting adapters (B random): both A and B have gradients.
  $PY "$TORCH_REF" make-adapter --model m0 --rank "${RANKS[$k]}" --alpha "${ALPHAS[$k]}" \
    --targets "${TARGETS[$k]}" --b-std 0.2 --seed $((20 + k)) --out "a$k" > /dev/null
done

pairs=()  # (each adapter's own step, the joint one): compared in one go below
for opt in sgd adamw; do
  lr=0.01
  [[ $opt == adamw ]] && lr=1e-4
  flags=(--model m0 --optimizer "$opt" --lr "$lr" --weight-decay 0.1 --micro-batch-tokens 30
         --timeout-s 60)
  for k in 0 1 2; do  # each adapter's own step
    "$PRL" learner step "${flags[@]}" --rollouts "r$k.jsonl" --lora-init "a$k" \
      --out "$opt-own$k" --dump-grads "$opt-own$k.grads.safetensors" > "$opt-own$k.log"
  done
  for pass_tokens in 4096 1; do
    name="$opt-joint-p$pass_tokens"
    "$PRL" learner step "${flags[@]}" --adapter-pass-tokens "$pass_tokens" \
      --rollouts r0.jsonl --lora-init a0 --out "${name}0" --dump-grads "${name}0.grads.safetensors" \
      --joint "a1,r1.jsonl,${name}1,${name}1.grads.safetensors" \
      --joint "a2,r2.jsonl,${name}2,${name}2.grads.safetensors" > "$name.log"
    [[ $(grep -c "^step: loss" "$name.log") == 3 ]]
    for k in 0 1 2; do
      pairs+=("$opt-own$k/adapter_model.safetensors" "$name$k/adapter_model.safetensors"
              "$opt-own$k.grads.safetensors" "$name$k.grads.safetensors")
    done
  done
done
$PY "$REF" compare-models "${pairs[@]}" --rtol 1e-5

for k in 0 1 2; do
  $PY "$REF" check-step --model m0 --rollouts "r$k.jsonl" --adapter "a$k" \
    --prl-out "sgd-joint-p4096$k" --grads "sgd-joint-p4096$k.grads.safetensors" --optimizer sgd \
    --lr 0.01 --weight-decay 0.1
  $PY "$REF" check-step --model m0 --rollouts "r$k.jsonl" --adapter "a$k" \
    --prl-out "adamw-joint-p4096$k" --grads "adamw-joint-p4096$k.grads.safetensors" \
    --optimizer adamw --lr 1e-4 --weight-decay 0.1 --update-rtol 1e-2
done

# The check discriminates: adapter 1's joint step is not the reference's on adapter 0's data.
if $PY "$REF" check-step --model m0 --rollouts r0.jsonl --adapter a1 --prl-out sgd-joint-p40961 \
    --grads sgd-joint-p40961.grads.safetensors --optimizer sgd --lr 0.01 --weight-decay 0.1 \
    > mutated.log; then
  echo "FAIL: the reference accepted an adapter's joint step on another adapter's rollouts"
  exit 1
fi
echo "the joint step of three adapters matches the reference and each adapter's own step"
