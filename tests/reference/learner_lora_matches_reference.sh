#!/usr/bin/env bash
# `prl learner step` training a LoRA adapter on a frozen base (learner.lora_*) against the
# independent float64 PyTorch reference (learner_reference.py check-step --adapter: peft's
# LoRA, autograd over the adapter's tensors only), and against itself across world sizes:
#
#   - the adapter's gradient (--dump-grads, peft's names) within 1e-4 relative per tensor, the
#     updated adapter (--out, a peft directory) within 1e-5, SGD and AdamW with weight decay;
#   - world sizes 1, 2, 3 and micro-batch budgets of one sequence up to the whole batch give
#     the same adapter and gradient within 1e-5 (FSDP over the adapter);
#   - a new adapter (learner.lora_rank: A random with prl adapter init's seed, B zero) trains
#     B only on its first step, as the reference says;
#   - the check discriminates: the reference from another starting adapter fails;
#   - the KL reference of the starting model is the frozen base: KL 0 from a new adapter, the
#     same on one and two ranks from another;
#   - a LoRA checkpoint resumes and `prl export --adapter` writes the adapter the learner holds;
#     a run with other LoRA settings refuses the checkpoint.
#
# usage: learner_lora_matches_reference.sh PRL WORKDIR TARGETS ARCH-FLAGS...
set -euo pipefail
PRL=$(realpath "$1")
WORK=$2
TARGETS=$3
shift 3
PY=/usr/bin/python3
REF="$(cd "$(dirname "$0")" && pwd)/learner_reference.py"
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK"
$PY "$(dirname "$REF")/torch_reference.py" make-checkpoint "$@" --hidden-size 32 --layers 2 \
  --heads 4 --intermediate-size 48 --vocab-size 40 --max-position-embeddings 64 --seed 3 \
  --out m0 > /dev/null
$PY "$REF" gen-rollouts --vocab-size 40 --groups 4 --samples 4 --max-completion 12 --seed 3 \
  --out rollouts.jsonl
# A trained-looking starting adapter (B random): both A and B have gradients.
$PY "$(dirname "$REF")/torch_reference.py" make-adapter --model m0 --rank 4 --alpha 8 \
  --targets "$TARGETS" --b-std 0.2 --seed 5 --out a0 > /dev/null

step() {  # name, then flags for prl learner step
  local name=$1
  shift
  "$PRL" learner step --model m0 --rollouts rollouts.jsonl --out "$name" \
    --dump-grads "$name.grads.safetensors" --timeout-s 60 "$@" > "$name.log"
}

pairs=()  # (world size 1 in one micro-batch, another): compared in one python start below
for opt in sgd adamw; do
  lr=0.01
  [[ $opt == adamw ]] && lr=1e-4
  for world in 1 2 3; do
    for mbt in 4096 20; do
      name="$opt-w$world-mbt$mbt"
      step "$name" --lora-init a0 --optimizer "$opt" --lr "$lr" --weight-decay 0.1 \
        --world-size "$world" --micro-batch-tokens "$mbt"
      pairs+=("$opt-w1-mbt4096/adapter_model.safetensors" "$name/adapter_model.safetensors"
              "$opt-w1-mbt4096.grads.safetensors" "$name.grads.safetensors")
    done
  done
done
$PY "$REF" compare-models "${pairs[@]}" --rtol 1e-5
$PY "$REF" check-step --model m0 --rollouts rollouts.jsonl --adapter a0 --prl-out sgd-w3-mbt20 \
  --grads sgd-w3-mbt20.grads.safetensors --optimizer sgd --lr 0.01 --weight-decay 0.1
$PY "$REF" check-step --model m0 --rollouts rollouts.jsonl --adapter a0 --prl-out adamw-w2-mbt20 \
  --grads adamw-w2-mbt20.grads.safetensors --optimizer adamw --lr 1e-4 --weight-decay 0.1 \
  --update-rtol 1e-2

# A new adapter from the learner's settings equals `prl adapter init`'s (same seed): check the
# learner's first step from it, rsLoRA and the sequence normalisation on two ranks.
"$PRL" adapter init --model m0 --rank 2 --alpha 4 --rslora --targets "$TARGETS" --out fresh0 \
  > /dev/null
step fresh --lora-rank 2 --lora-alpha 4 --lora-rslora --lora-targets "$TARGETS" \
  --normalization sequence --optimizer sgd --lr 0.01 --world-size 2 --micro-batch-tokens 25
$PY "$REF" check-step --model m0 --rollouts rollouts.jsonl --adapter fresh0 --prl-out fresh \
  --grads fresh.grads.safetensors --normalization sequence --optimizer sgd --lr 0.01

# The check discriminates: the step from a0 is not the reference's step from a scaled a0.
mkdir -p a1
cp a0/adapter_config.json a1/
python_scale='
import sys
sys.path.insert(0, sys.argv[1])
import torch_reference as ref
t = ref.read_safetensors("a0/adapter_model.safetensors")
ref.write_safetensors("a1/adapter_model.safetensors", {n: a * 1.5 for n, a in t.items()})
'
$PY -c "$python_scale" "$(dirname "$REF")"
if $PY "$REF" check-step --model m0 --rollouts rollouts.jsonl --adapter a1 \
    --prl-out sgd-w3-mbt20 --grads sgd-w3-mbt20.grads.safetensors --optimizer sgd --lr 0.01 \
    --weight-decay 0.1 > mutated.log; then
  echo "FAIL: the reference accepted the step of another starting adapter"
  exit 1
fi

# The KL reference of the starting model is the frozen base itself (an adapter of zeros): from a
# new adapter (B = 0) the policy is the base and the KL is exactly 0; from a0 it is the same on
# one and two ranks.
ref_kl() {  # flags for prl learner step; prints reference_kl
  "$PRL" learner step --model m0 --rollouts rollouts.jsonl --out kl --timeout-s 60 --optimizer sgd \
    --lr 0.01 --kl-coef 0.1 --json "$@" | tail -n 1 |
    $PY -c "import json, sys; print(json.load(sys.stdin)['reference_kl'])"
}
[[ $(ref_kl --lora-init fresh0) == 0.0 ]]
kl1=$(ref_kl --lora-init a0 --world-size 1)
kl2=$(ref_kl --lora-init a0 --world-size 2)
$PY -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if a > 1e-3 and abs(a - b) <= 1e-6 * a else 1)" \
  "$kl1" "$kl2"

# Checkpoints hold the adapter: two steps, a resumed third, and the export of each.
train() {  # name, steps, then flags
  local name=$1 steps=$2
  shift 2
  "$PRL" learner train --model m0 --rollouts rollouts.jsonl --checkpoint-dir ck \
    --checkpoint-every 1 --steps "$steps" --samples-per-step 8 --timeout-s 60 --optimizer adamw \
    --lr 1e-3 --world-size 2 --out "$name" "$@" > "$name.log"
}
train two 2 --lora-init a0
"$PRL" export --checkpoint-dir ck --out exported2 --adapter > /dev/null
$PY "$REF" compare-models two/adapter_model.safetensors exported2/adapter_model.safetensors \
  --rtol 0
train three 3 --lora-init a0
grep -q "resumed from" three.log
"$PRL" export --checkpoint-dir ck --out exported3 --adapter > /dev/null
$PY "$REF" compare-models three/adapter_model.safetensors exported3/adapter_model.safetensors \
  --rtol 0
# Three steps in one go equal two, a checkpoint and a resumed third.
rm -rf ck
train straight 3 --lora-init a0
$PY "$REF" compare-models straight/adapter_model.safetensors three/adapter_model.safetensors \
  --rtol 0
if train other 4 --lora-rank 2 --lora-targets "$TARGETS" 2> other.err; then
  echo "FAIL: a run with other LoRA settings resumed a LoRA checkpoint"
  exit 1
fi
grep -q "checkpoint adapter is" other.err other.log
if "$PRL" export --checkpoint-dir ck --out full > /dev/null 2> export.err; then
  echo "FAIL: prl export wrote a LoRA checkpoint as a full model"
  exit 1
fi
grep -q "pass --adapter" export.err
echo "learner LoRA step matches the reference"
