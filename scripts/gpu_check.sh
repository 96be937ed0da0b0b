#!/usr/bin/env bash
# The one command for a machine with a GPU: runs every GPU test and the GPU benchmarks that
# exist, and prints a short table.
#
# Build choice (see scripts/gpu_package.sh): the binaries are built on a Debian machine with
# the development packages and the same CUDA 13.0, and travel as build-gpu/bundle (binaries
# plus the non-system shared libraries they load; the GPU machine supplies CUDA, cuBLAS(Lt),
# NCCL and the C/C++ runtime). Run scripts/gpu_package.sh first where the build works, then
# this script on the GPU machine from the repository root. Outputs (gtest XML, logs) also go
# to $OUT when that is set.
#
# usage: scripts/gpu_check.sh [BUNDLE=build-gpu/bundle]   (or BUNDLE.tar.gz, unpacked here)
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${1:-build-gpu/bundle}
OUT_DIR=${OUT:-/tmp/prl-gpu-check}
mkdir -p "$OUT_DIR"
if [ ! -d "$BUNDLE/bin" ] && [ -f "$BUNDLE.tar.gz" ]; then
  tar -C "$(dirname "$BUNDLE")" -xzf "$BUNDLE.tar.gz"
fi
if [ ! -d "$BUNDLE/bin" ]; then
  echo "gpu_check: no $BUNDLE/bin: run scripts/gpu_package.sh on the build machine first" >&2
  exit 1
fi
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT_DIR/gpu.txt"
status=0
for test in "$BUNDLE"/bin/*_test; do
  name=$(basename "$test")
  echo "== $name"
  "$test" --gtest_output="xml:$OUT_DIR/$name.xml" 2>&1 | tee "$OUT_DIR/$name.log" | \
    grep -E "^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|Failure|error" || true
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done
PRL="$BUNDLE/bin/prl"
if [ -x "$PRL" ]; then
  echo "== prl score: --device cuda against --device cpu (fp32 mode)"
  work="$OUT_DIR/score"
  mkdir -p "$work"
  "$PRL" model init --arch qwen2 --hidden-size 256 --layers 3 --heads 4 --kv-heads 2 \
    --intermediate-size 640 --vocab-size 1000 --tie-embeddings --seed 3 --out "$work/model" >/dev/null
  python3 - "$work/in.jsonl" <<'PY'
import json, random, sys
rng = random.Random(5)
with open(sys.argv[1], "w") as f:
    for n in (2, 17, 130, 64, 300):
        f.write(json.dumps({"tokens": [rng.randrange(1000) for _ in range(n)], "score_from": 1}) + "\n")
PY
  for d in cpu cuda; do
    "$PRL" score --model "$work/model" --input "$work/in.jsonl" --output "$work/$d.jsonl" \
      --device "$d" --dump-grads "$work/$d.safetensors" || status=1
  done
  "$PRL" score --model "$work/model" --input "$work/in.jsonl" --output "$work/bf16.jsonl" \
    --device cuda --dtype bf16 || status=1
  python3 - "$work" <<'PY' || status=1
import json, sys
w = sys.argv[1]
cpu = [json.loads(l)["logprobs"] for l in open(w + "/cpu.jsonl")]
gpu = [json.loads(l)["logprobs"] for l in open(w + "/cuda.jsonl")]
worst = max(abs(a - b) for x, y in zip(cpu, gpu) for a, b in zip(x, y))
bf16 = [json.loads(l)["logprobs"] for l in open(w + "/bf16.jsonl")]
worst16 = max(abs(a - b) for x, y in zip(cpu, bf16) for a, b in zip(x, y))
print("prl score cuda vs cpu: max |log-prob difference| %.3e over %d tokens (bound 1e-5); "
      "--dtype bf16: %.3e (bound 2e-2)" % (worst, sum(map(len, cpu)), worst16))
sys.exit(0 if worst <= 1e-5 and worst16 <= 2e-2 else 1)
PY
  # A baseline that fails (PyTorch eager fp32 runs out of memory on the 1.5B shape at 8192
  # tokens) is reported, not counted as a prl failure.
  echo "== benchmarks: model forward+backward, prl (fp32 mode) beside PyTorch on this GPU"
  for shape in "qwen2.5-0.5b 896 24 14 2 4864 --tied" "qwen2.5-1.5b 1536 28 12 2 8960 --tied"; do
    set -- $shape
    "$PRL" bench model --config "$1" --device cuda --tokens 8192 --seq-len 2048 --iters 3 \
      --json > "$OUT_DIR/bench_$1.json" || status=1
    "$PRL" bench model --config "$1" --device cuda --dtype bf16 --tokens 8192 --seq-len 2048 \
      --iters 3 --json > "$OUT_DIR/bench16_$1.json" || status=1
    python3 bench/torch_model_bench.py --hidden "$2" --layers "$3" --heads "$4" --kv-heads "$5" \
      --intermediate "$6" --vocab 151936 $7 --tokens 8192 --seq-len 2048 --iters 3 \
      > "$OUT_DIR/torch_f32_$1.json" 2> "$OUT_DIR/torch_f32_$1.log" || true
    python3 bench/torch_model_bench.py --hidden "$2" --layers "$3" --heads "$4" --kv-heads "$5" \
      --intermediate "$6" --vocab 151936 $7 --tokens 8192 --seq-len 2048 --iters 3 \
      --dtype bf16 > "$OUT_DIR/torch_bf16_$1.json" 2> "$OUT_DIR/torch_bf16_$1.log" || true
    python3 - "$OUT_DIR" "$1" <<'PY'
import json, sys
d, name = sys.argv[1], sys.argv[2]
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None  # the run failed (e.g. out of memory): its log says why
prl = load("%s/bench_%s.json" % (d, name))
t32 = load("%s/torch_f32_%s.json" % (d, name))
t16 = load("%s/torch_bf16_%s.json" % (d, name))
p16 = load("%s/bench16_%s.json" % (d, name))
line = name + " forward+backward tokens/s:"
if prl:
    r = {x["name"]: x for x in prl["results"]}
    tok = r["train_tokens_per_s"]["value"]
    line += " prl fp32 %.0f (%.1f TFLOP/s, %.2f of cuBLASLt SGEMM)" % (
        tok, r["train_gflops"]["value"] / 1e3, r["train_gflops"]["ratio"])
else:
    tok, line = None, line + " prl failed"
if t32:
    line += " | PyTorch eager fp32 %.0f" % t32["train_tokens_per_s"]
    if tok:
        line += " (prl/PyTorch %.2f)" % (tok / t32["train_tokens_per_s"])
else:
    line += " | PyTorch eager fp32 failed (out of memory?)"
if p16:
    r16 = {x["name"]: x for x in p16["results"]}
    tf = r16["train_gflops"]["value"] / 1e3
    line += " | prl bf16 %.0f (%.1f TFLOP/s, MFU %.1f%% of 989)" % (
        r16["train_tokens_per_s"]["value"], tf, 100 * tf / 989)
else:
    line += " | prl bf16 failed"
line += " | PyTorch eager bf16 %s" % ("%.0f" % t16["train_tokens_per_s"] if t16 else "failed")
if p16 and t16:
    line += " (prl/PyTorch bf16 %.2f)" % (r16["train_tokens_per_s"]["value"] / t16["train_tokens_per_s"])
print(line)
PY
  done
  # Where the time goes: the same tokens in sequences of 256 instead of 2048 (8x less
  # attention work, the same GEMMs).
  "$PRL" bench model --config qwen2.5-0.5b --device cuda --tokens 8192 --seq-len 256 --iters 3 \
    --json > "$OUT_DIR/bench_short.json" || status=1
  python3 - "$OUT_DIR" <<'PY'
import json, sys
r = {x["name"]: x for x in json.load(open(sys.argv[1] + "/bench_short.json"))["results"]}
print("qwen2.5-0.5b in sequences of 256: forward+backward %.0f tok/s (%.2f of cuBLASLt SGEMM)"
      % (r["train_tokens_per_s"]["value"], r["train_gflops"]["ratio"]))
PY
fi

# The relative errors each test recorded (gtest properties), as a table.
python3 - "$OUT_DIR" <<'PY'
import glob, sys, xml.etree.ElementTree as ET
rows = []
for path in sorted(glob.glob(sys.argv[1] + "/*.xml")):
    for case in ET.parse(path).getroot().iter("testcase"):
        failed = case.find("failure") is not None
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        standard = {"name", "status", "result", "time", "timestamp", "classname", "file", "line"}
        props.update({k: v for k, v in case.attrib.items() if k not in standard})
        for name, value in props.items():
            try:
                rows.append((name, float(value), "FAIL" if failed else "ok"))
            except ValueError:
                pass
if rows:
    print("\n%-28s %12s %6s" % ("kernel output (mode)", "rel. error", "test"))
    for name, value, state in rows:
        print("%-28s %12.3e %6s" % (name, value, state))
PY
echo "gpu_check: $([ $status -eq 0 ] && echo 'all GPU tests passed' || echo 'FAILURES (see above)')"
exit $status
