#!/usr/bin/env bash
# The one command for a machine with a GPU (run from the repository root; no network, no sudo):
# nvidia-smi, every GPU test binary (gtest), `prl score --device cuda` against `--device cpu`
# on a small generated model (log-probs: fp32 mode within 1e-5 absolute per token, bf16 mode
# within 2e-2; fp32 gradients within 1e-4 relative per tensor), `prl learner step --device
# cuda` against `--device cpu` (the update: fp32 within 1e-4 relative, bf16 within 5e-2), and
# the GPU benchmarks
# (`prl bench model` for the Qwen2.5-0.5B and -1.5B shapes at 8192 tokens per step, bf16 and
# fp32 modes, each beside PyTorch eager and torch.compile in the same run), `prl run` with the
# learner and the actors on the GPU (weights over CUDA IPC; over nccl with two GPUs), `prl bench
# broadcast` (weight swaps over cuda_ipc, shm and grpc for the 0.5B and 1.5B shapes) and `prl
# bench e2e` (pipeline against sync mode on the GPU), ending with tables.
#
# Build choice: binaries built elsewhere travel here. The GPU machine (Ubuntu 24.04, glibc
# 2.39) has the CUDA 13.0 toolkit, CMake, ninja and PyTorch but no Debian development packages
# (abseil, gRPC, OpenBLAS, GoogleTest) and no network, so prl cannot be built on it. The build
# machine (Debian 12, glibc 2.36, the same CUDA 13.0) builds them with scripts/gpu_package.sh
# into build-gpu/bundle: binaries without debug sections in bin/, and in lib/ every shared library they load
# except the C/C++ runtime and the CUDA, cuBLAS(Lt), NCCL and driver libraries, which this
# machine supplies (binaries linked against the older glibc run on the newer one). That bundle
# (or its .tar.gz, unpacked here) is all this script needs besides python3 with torch.
#
# Every step runs even after an earlier one failed (hence no `set -e`); the exit status is 1 if
# any test, comparison or prl benchmark failed (a PyTorch baseline that fails is reported, not
# counted). Outputs (gtest XML and logs, the benchmarks' JSON and logs, the tables) go to $OUT
# when that is set, else /tmp/prl-gpu-check.
#
# usage: scripts/gpu_check.sh [BUNDLE=build-gpu/bundle]
#   env: OUT; PYTHON (with torch; default python3); PARTS (default "tests score learner engine roles moe bench swaps e2e": a
#   subset runs in less time, e.g. PARTS=bench; each part takes a few minutes on an H100; the
#   parts "profile" and "profile_learner" are not in the default); TESTS (the test binaries of part tests; default all)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUNDLE=${1:-build-gpu/bundle}
OUT_DIR=${OUT:-/tmp/prl-gpu-check}
PYTHON=${PYTHON:-python3}
PARTS=${PARTS:-tests score learner engine roles moe lora bench swaps e2e}
mkdir -p "$OUT_DIR"
if [ ! -d "$BUNDLE/bin" ] && [ -f "$BUNDLE.tar.gz" ]; then
  tar -C "$(dirname "$BUNDLE")" -xzf "$BUNDLE.tar.gz" || exit 1
fi
if [ ! -d "$BUNDLE/bin" ]; then
  echo "gpu_check: no $BUNDLE/bin: run scripts/gpu_package.sh on the build machine first" >&2
  exit 1
fi
BUNDLE=$(cd "$BUNDLE" && pwd)
PRL="$BUNDLE/bin/prl"
if ! command -v nvidia-smi >/dev/null; then
  echo "gpu_check: no nvidia-smi: this is not the GPU machine" >&2
  exit 1
fi
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export LD_LIBRARY_PATH="$BUNDLE/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0
part() { [[ " $PARTS " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader |
  tee "$OUT_DIR/gpu.txt"
nvidia-smi >"$OUT_DIR/nvidia-smi.txt" 2>&1

# --- GPU tests ----------------------------------------------------------------------------
run_tests() {
  local test name rc
  for test in "$BUNDLE"/bin/*_test; do
    name=$(basename "$test")
    [ -z "${TESTS:-}" ] || [[ " $TESTS " == *" $name "* ]] || continue
    echo "== $name"
    "$test" --gtest_output="xml:$OUT_DIR/$name.xml" 2>&1 | tee "$OUT_DIR/$name.log" |
      grep -E "^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|Failure|error"
    rc=("${PIPESTATUS[@]}")
    if [ "${rc[0]}" -ne 0 ]; then
      echo "gpu_check: $name exited with ${rc[0]} (log: $OUT_DIR/$name.log)" >&2
      status=1
    elif grep -q "no CUDA GPU" "$OUT_DIR/$name.log"; then
      # The tests' skip message: here it means the binary saw no usable GPU (driver, runtime).
      echo "gpu_check: $name found no GPU on a machine with one: see $OUT_DIR/$name.log" >&2
      status=1
    fi
  done
  # The relative errors the tests recorded (gtest properties), as a table.
  python3 - "$OUT_DIR" <<'PY'
import glob, sys, xml.etree.ElementTree as ET
rows = []
for path in sorted(glob.glob(sys.argv[1] + "/*_test.xml")):
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
    print("\n%-40s %12s %6s" % ("recorded error (test property)", "value", "test"))
    for name, value, state in rows:
        print("%-40s %12.3e %6s" % (name, value, state))
PY
}

# A small random Qwen2-shaped model (vocabulary 1000) for the cuda-vs-cpu comparisons.
small_model() {  # small_model DIR SEED
  "$PRL" model init --arch qwen2 --hidden-size 256 --layers 3 --heads 4 --kv-heads 2 \
    --intermediate-size 640 --vocab-size 1000 --tie-embeddings --seed "$2" --out "$1" >/dev/null
}

# --- prl score on cuda against cpu ----------------------------------------------------------
run_score() {
  echo "== prl score: --device cuda (fp32 and bf16 modes) against --device cpu"
  local work="$OUT_DIR/score" d
  mkdir -p "$work"
  small_model "$work/model" 3 || { status=1; return; }
  python3 - "$work/in.jsonl" <<'PY'
import json, random, sys
rng = random.Random(5)
with open(sys.argv[1], "w") as f:
    for n in (2, 17, 130, 64, 300):
        f.write(json.dumps({"tokens": [rng.randrange(1000) for _ in range(n)],
                            "score_from": 1}) + "\n")
PY
  for d in cpu cuda; do
    "$PRL" score --model "$work/model" --input "$work/in.jsonl" --output "$work/$d.jsonl" \
      --device "$d" --dump-grads "$work/$d.safetensors" || status=1
  done
  "$PRL" score --model "$work/model" --input "$work/in.jsonl" --output "$work/bf16.jsonl" \
    --device cuda --dtype bf16 || status=1
  python3 - "$work" <<'PY' | tee "$OUT_DIR/score_summary.txt" || status=1
import array, json, math, struct, sys
w = sys.argv[1]

def logprobs(name):
    try:
        return [json.loads(l)["logprobs"] for l in open("%s/%s.jsonl" % (w, name))]
    except OSError:
        return None

def tensors(name):  # safetensors, F32 only (what --dump-grads writes)
    with open("%s/%s.safetensors" % (w, name), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for key, t in header.items():
        if key == "__metadata__":
            continue
        assert t["dtype"] == "F32", t
        begin, end = t["data_offsets"]
        out[key] = array.array("f", data[begin:end])
    return out

ok = True
cpu = logprobs("cpu")
for name, bound in (("cuda", 1e-5), ("bf16", 2e-2)):
    got = logprobs(name)
    if cpu is None or got is None:
        print("prl score %s: no output" % name)
        ok = False
        continue
    worst = max(abs(a - b) for x, y in zip(cpu, got) for a, b in zip(x, y))
    print("prl score --device cuda %s vs cpu: max |log-prob difference| %.3e over %d tokens "
          "(bound %.0e)" % ("fp32" if name == "cuda" else "--dtype bf16", worst,
                            sum(map(len, cpu)), bound))
    ok = ok and worst <= bound
try:
    gc, gg = tensors("cpu"), tensors("cuda")
    worst, where = 0.0, ""
    for key, ref in gc.items():
        diff = math.sqrt(sum((a - b) ** 2 for a, b in zip(gg[key], ref)))
        rel = diff / max(math.sqrt(sum(a * a for a in ref)), 1e-30)
        if rel > worst:
            worst, where = rel, key
    print("prl score --dump-grads cuda vs cpu: worst relative L2 error %.3e (%s) over %d "
          "tensors (bound 1e-4)" % (worst, where, len(gc)))
    ok = ok and worst <= 1e-4
except (OSError, KeyError, ValueError, AssertionError) as e:
    print("prl score --dump-grads: cannot compare: %r" % (e,))
    ok = False
sys.exit(0 if ok else 1)
PY
}

# --- prl learner step on cuda against cpu --------------------------------------------------
# One step (SGD, so the update is the clipped gradient times the learning rate) on a small
# generated model and rollouts: the update of `--device cuda` (NCCL, world size 1) against the
# CPU learner's (Gloo): fp32 mode within 1e-4 relative L2, bf16 mode within 5e-2.
run_learner() {
  echo "== prl learner step: --device cuda (fp32 and bf16 modes) against --device cpu"
  local work="$OUT_DIR/learner"
  mkdir -p "$work"
  small_model "$work/model" 4 || { status=1; return; }
  python3 - "$work/rollouts.jsonl" <<'PY'
import json, random, sys
rng = random.Random(9)
with open(sys.argv[1], "w") as f:
    for i in range(12):
        n = rng.randrange(1, 120)
        f.write(json.dumps({"prompt": [rng.randrange(1000) for _ in range(rng.randrange(1, 40))],
                            "completion": [rng.randrange(1000) for _ in range(n)],
                            "behaviour_logprobs": [-rng.uniform(3, 9) for _ in range(n)],
                            "advantage": rng.choice([1.0, -0.5, 0.25])}) + "\n")
PY
  local args=(--model "$work/model" --rollouts "$work/rollouts.jsonl" --optimizer sgd --lr 1e-2
    --micro-batch-tokens 256)
  "$PRL" learner step "${args[@]}" --device cpu --out "$work/cpu" >"$work/cpu.log" 2>&1 ||
    { cat "$work/cpu.log"; status=1; }
  "$PRL" learner step "${args[@]}" --device cuda --out "$work/cuda" >"$work/cuda.log" 2>&1 ||
    { cat "$work/cuda.log"; status=1; }
  "$PRL" learner step "${args[@]}" --device cuda --dtype bf16 --out "$work/bf16" \
    >"$work/bf16.log" 2>&1 || { cat "$work/bf16.log"; status=1; }
  python3 - "$work" <<'PY' | tee "$OUT_DIR/learner_summary.txt" || status=1
import array, json, math, struct, sys
w = sys.argv[1]

def flat(name):  # every F32 tensor of a model directory, concatenated in name order
    with open("%s/%s/model.safetensors" % (w, name), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = array.array("f")
    for key in sorted(k for k in header if k != "__metadata__"):
        begin, end = header[key]["data_offsets"]
        out.extend(array.array("f", data[begin:end]))
    return out

ok = True
try:
    init, cpu = flat("model"), flat("cpu")
    ref = [b - a for a, b in zip(init, cpu)]
    norm = math.sqrt(sum(x * x for x in ref))
    for name, bound in (("cuda", 1e-4), ("bf16", 5e-2)):
        got = [b - a for a, b in zip(init, flat(name))]
        err = math.sqrt(sum((g - r) ** 2 for g, r in zip(got, ref))) / max(norm, 1e-30)
        print("prl learner step --device cuda %s vs cpu: update relative L2 error %.3e "
              "(bound %.0e; update norm %.3e)" % ("fp32" if name == "cuda" else "--dtype bf16",
                                                   err, bound, norm))
        ok = ok and err <= bound
except (OSError, KeyError, ValueError) as e:
    print("prl learner step: cannot compare: %r" % (e,))
    ok = False
sys.exit(0 if ok else 1)
PY
}

# --- the engine on cuda: behaviour log-probs against the learner's ---------------------------
# prl generate --device cuda (temperature 1, no top-k/top-p) then prl score --device cuda of the
# same sequences, per mode: mean |log pi - log mu|, the fraction of tokens with pi/mu outside
# [0.99, 1.01], KL(mu || pi) per token (mean of log mu - log pi over tokens drawn from mu).
# The batch-invariant mode must give zero difference; fp32 fast within 1e-5; bf16 reported.
run_engine() {
  echo "== prl generate --device cuda against prl score --device cuda (agreement)"
  local work="$OUT_DIR/engine" dtype inv tag
  mkdir -p "$work"
  small_model "$work/model" 5 || { status=1; return; }
  python3 - "$work/prompts.jsonl" <<'PY'
import json, random, sys
rng = random.Random(4)
with open(sys.argv[1], "w") as f:
    for i in range(48):
        f.write(json.dumps({"tokens": [rng.randrange(1000) for _ in range(rng.randrange(1, 200))],
                            "seed": i}) + "\n")
PY
  # The batch-invariant BF16 products on the CUDA cores and on the tensor cores (the default,
  # kernels/cuda/gemm.h): each must keep generate and score equal bit for bit.
  for variant in f32: f32:--batch-invariant bf16: \
    "bf16:--batch-invariant --no-invariant-tensor-cores" \
    "bf16:--batch-invariant --invariant-tensor-cores"; do
    dtype=${variant%%:*}
    inv=${variant#*:}
    tag="${dtype}${inv:+_invariant}"
    [[ "$inv" == *--invariant-tensor-cores* ]] && tag="${tag}_tc"
    {
      "$PRL" generate --model "$work/model" --input "$work/prompts.jsonl" --device cuda \
        --dtype "$dtype" $inv --n 2 --max-tokens 128 --temperature 1 \
        --output "$work/gen_$tag.jsonl" >"$work/gen_$tag.log" 2>&1 ||
        { cat "$work/gen_$tag.log"; status=1; continue; }
      python3 - "$work/prompts.jsonl" "$work/gen_$tag.jsonl" "$work/score_in_$tag.jsonl" <<'PY'
import json, sys
prompts = [json.loads(l)["tokens"] for l in open(sys.argv[1])]
with open(sys.argv[3], "w") as f:
    for l in open(sys.argv[2]):
        g = json.loads(l)
        p = prompts[g["prompt_index"]]
        if g["tokens"]:
            f.write(json.dumps({"tokens": p + g["tokens"], "score_from": len(p)}) + "\n")
PY
      "$PRL" score --model "$work/model" --input "$work/score_in_$tag.jsonl" --device cuda \
        --dtype "$dtype" $inv --output "$work/score_$tag.jsonl" >"$work/score_$tag.log" 2>&1 ||
        { cat "$work/score_$tag.log"; status=1; }
    }
  done
  python3 - "$work" <<'PY' | tee "$OUT_DIR/engine_agreement.txt" || status=1
import json, math, sys
w = sys.argv[1]
ok = True
for tag, bound in (("f32", 1e-5), ("f32_invariant", 0.0), ("bf16", None), ("bf16_invariant", 0.0),
                   ("bf16_invariant_tc", 0.0)):
    try:
        mu = [g["logprobs"] for g in map(json.loads, open("%s/gen_%s.jsonl" % (w, tag))) if g["tokens"]]
        pi = [s["logprobs"] for s in map(json.loads, open("%s/score_%s.jsonl" % (w, tag)))]
    except OSError as e:
        print("%-15s not run: %s" % (tag, e))
        ok = False
        continue
    d = [p - m for a, b in zip(pi, mu) for p, m in zip(a, b)]
    n = max(len(d), 1)
    mean_abs = sum(abs(x) for x in d) / n
    worst = max((abs(x) for x in d), default=0.0)
    outside = sum(1 for x in d if not 0.99 <= math.exp(x) <= 1.01) / n
    kl = sum(-x for x in d) / n
    print("%-15s %7d tokens: mean |diff| %.3e, max %.3e, ratio outside [0.99, 1.01] %.5f, "
          "KL/token %.3e%s" % (tag, len(d), mean_abs, worst, outside, kl,
                               "" if bound is None else " (bound %.0e)" % bound))
    if bound is not None:
        ok = ok and worst <= bound
sys.exit(0 if ok else 1)
PY
  echo "-- prl bench engine --config qwen2.5-0.5b --device cuda --dtype bf16 (prompt 512, output 512)"
  "$PRL" bench engine --config qwen2.5-0.5b --device cuda --dtype bf16 --prompt-len 512 \
    --output-len 512 --batches 1,16,64,256 --iters 1 --swap-interval-ms 2000 --invariant-cost \
    --tuned-cost --torch-baseline "${PYTHON:-python3}" --torch-modes graph --json \
    >"$OUT_DIR/bench_engine_bf16.json" 2>"$OUT_DIR/bench_engine_bf16.log" ||
    { tail -20 "$OUT_DIR/bench_engine_bf16.log"; status=1; }
  python3 - "$OUT_DIR/bench_engine_bf16.json" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
for k, v in r.get("setup", {}).items() if isinstance(r.get("setup"), dict) else r.get("setup", []):
    print("  %s: %s" % (k, v))
for x in r["results"]:
    print("  %-36s %12.1f %-5s | %-26s %12.1f | ratio %.3f" % (
        x["name"], x["value"], x["unit"], x["baseline_name"], x["baseline_value"], x["ratio"]))
PY
  # The RMSNorms fused into the small decode steps' projections (actors.norm_in_gemm, off until
  # this and cuda_kernels_test / cuda_engine_test pass): beside the same tuned kernels without.
  echo "-- prl bench engine --tuned-kernels --norm-in-gemm (batches 1 and 8)"
  "$PRL" bench engine --config qwen2.5-0.5b --device cuda --dtype bf16 --prompt-len 512 \
    --output-len 512 --batches 1,8 --iters 1 --tuned-kernels --norm-in-gemm --json \
    >"$OUT_DIR/bench_engine_norm_in_gemm.json" 2>"$OUT_DIR/bench_engine_norm_in_gemm.log" ||
    { tail -20 "$OUT_DIR/bench_engine_norm_in_gemm.log"; status=1; }
  python3 - "$OUT_DIR/bench_engine_norm_in_gemm.json" <<'PY' || true
import json, sys
for x in json.load(open(sys.argv[1]))["results"]:
    if "norm_in_gemm" in x["name"]:
        print("  %-36s %12.1f %-5s | %-26s %12.1f | ratio %.3f" % (
            x["name"], x["value"], x["unit"], x["baseline_name"], x["baseline_value"], x["ratio"]))
PY
  # The batch-invariant mode with its BF16 products on the tensor cores (experimental), beside
  # the tuned fast mode: issue 30 asks for at least 0.8x at batches 64 and 256.
  echo "-- prl bench engine --tuned-kernels --invariant-cost --invariant-tensor-cores (64, 256)"
  "$PRL" bench engine --config qwen2.5-0.5b --device cuda --dtype bf16 --prompt-len 512 \
    --output-len 512 --batches 64,256 --iters 1 --tuned-kernels --invariant-cost \
    --invariant-tensor-cores --json \
    >"$OUT_DIR/bench_engine_invariant_tc.json" 2>"$OUT_DIR/bench_engine_invariant_tc.log" ||
    { tail -20 "$OUT_DIR/bench_engine_invariant_tc.log"; status=1; }
  python3 - "$OUT_DIR/bench_engine_invariant_tc.json" <<'PY' || true
import json, sys
for x in json.load(open(sys.argv[1]))["results"]:
    if "batch_invariant" in x["name"]:
        print("  %-36s %12.1f %-5s | %-26s %12.1f | ratio %.3f" % (
            x["name"], x["value"], x["unit"], x["baseline_name"], x["baseline_value"], x["ratio"]))
PY
}

# --- where the GPU time goes ---------------------------------------------------------------
# Nsight Compute times every kernel of one decode step and of one learner pass, and the table
# sums the time per kernel name. Part profile: decode step 32 (prl bench engine --profile-step:
# the step runs between cudaProfilerStart and cudaProfilerStop; graph nodes one by one), 0.5B
# shape, bf16, prompt 512, at batches 1, 64 and 256 with the tuned kernels and at 256 without.
# Part profile_learner: one forward+backward of the 0.5B shape, bf16, 8192 tokens in sequences
# of 2048 (prl bench model --profile), with the tuned kernels.
find_ncu() {
  command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null |
    head -1
}

run_profile_learner() {
  echo "== ncu: GPU time per kernel of one learner forward+backward"
  local ncu
  ncu=$(find_ncu)
  if [ -z "$ncu" ]; then
    echo "gpu_check: no ncu on this machine: profile skipped" >&2
    return
  fi
  "$ncu" --profile-from-start off --metrics gpu__time_duration.sum --csv \
    --log-file "$OUT_DIR/ncu_learner_bf16.csv" \
    "$PRL" bench model --config qwen2.5-0.5b --device cuda --dtype bf16 --tokens 8192 \
    --seq-len 2048 --iters 1 --tuned-kernels --profile --json >"$OUT_DIR/ncu_learner_bf16.json" \
    2>"$OUT_DIR/ncu_learner_bf16.log" || { tail -5 "$OUT_DIR/ncu_learner_bf16.log"; status=1; }
  profile_table
}

run_profile() {
  echo "== ncu: GPU time per kernel of one decode step"
  local ncu tag batch flag
  ncu=$(find_ncu)
  if [ -z "$ncu" ]; then
    echo "gpu_check: no ncu on this machine: profile skipped" >&2
    return
  fi
  for tag in tuned_b1 tuned_b64 tuned_b256 default_b256; do
    batch=${tag##*_b}
    flag=$([ "${tag%%_*}" = tuned ] && echo --tuned-kernels)
    "$ncu" --profile-from-start off --graph-profiling node --metrics gpu__time_duration.sum \
      --csv --log-file "$OUT_DIR/ncu_$tag.csv" \
      "$PRL" bench engine --config qwen2.5-0.5b --device cuda --dtype bf16 --prompt-len 512 \
      --output-len 40 --batches "$batch" --iters 1 --swap-interval-ms 0 --profile-step 32 \
      $flag --json >"$OUT_DIR/ncu_$tag.json" 2>"$OUT_DIR/ncu_$tag.log" ||
      { tail -5 "$OUT_DIR/ncu_$tag.log"; status=1; }
  done
  profile_table
}

# The table of every ncu_*.csv in $OUT_DIR: kernels by total time.
profile_table() {
  python3 - "$OUT_DIR" <<'PY' | tee "$OUT_DIR/profile_summary.txt"
import csv, glob, os, re, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "ncu_*.csv"))):
    rows = []
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(r["Metric Value"].replace(",", ""))
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(r.get("Metric Unit"), 1e-3)
        name = re.sub(r"\(.*", "", r["Kernel Name"])[:60]
        rows.append((name, value * scale))
    total = sum(t for _, t in rows)
    by = {}
    for name, t in rows:
        c, s = by.get(name, (0, 0.0))
        by[name] = (c + 1, s + t)
    print("\n%s: %d kernels, %.1f us of GPU time in the step" % (
        os.path.basename(path), len(rows), total))
    for name, (c, t) in sorted(by.items(), key=lambda x: -x[1][1])[:14]:
        print("  %-60s %4d x %8.1f us  %5.1f%%" % (name, c, t, 100 * t / max(total, 1e-9)))
PY
}

# --- benchmarks ---------------------------------------------------------------------------
# Forward+backward of the two issue shapes at 8192 tokens per step (4 sequences of 2048), each
# `prl bench model` running the same model in PyTorch first (eager with SDPA, and
# torch.compile) on this GPU in the same run. bf16 mode: MFU against the dense bf16 peak; fp32
# mode (the exact mode) beside PyTorch eager fp32 only (TF32 off; compile skipped for time;
# PyTorch eager fp32 may run out of memory on the 1.5B shape). A baseline that cannot run at
# all (no torch) makes the row run again without it.
bench() {  # bench NAME ARGS...: prl bench model ARGS --json > $OUT_DIR/NAME.json
  local name=$1
  shift
  echo "-- prl bench model $*"
  if ! "$PRL" bench model "$@" --torch-baseline "$PYTHON" --json >"$OUT_DIR/$name.json" \
    2>"$OUT_DIR/$name.log"; then
    tail -5 "$OUT_DIR/$name.log" >&2
    echo "gpu_check: $name: again without the PyTorch baseline" >&2
    "$PRL" bench model "$@" --json >"$OUT_DIR/$name.json" 2>>"$OUT_DIR/$name.log" || {
      tail -5 "$OUT_DIR/$name.log" >&2
      rm -f "$OUT_DIR/$name.json"
      status=1
    }
  fi
}

run_bench() {
  echo "== benchmarks: model forward+backward, prl beside PyTorch on this GPU"
  local preset
  for preset in qwen2.5-0.5b qwen2.5-1.5b; do
    bench "bench_bf16_$preset" --config "$preset" --device cuda --dtype bf16 --tokens 8192 \
      --seq-len 2048 --iters 5
  done
  # Where the time goes: the same tokens in sequences of 256 instead of 2048 (8x less
  # attention work, the same GEMMs).
  echo "-- prl bench model --config qwen2.5-0.5b --dtype bf16 --seq-len 256"
  "$PRL" bench model --config qwen2.5-0.5b --device cuda --dtype bf16 --tokens 8192 \
    --seq-len 256 --iters 5 --json >"$OUT_DIR/bench_bf16_short.json" \
    2>"$OUT_DIR/bench_bf16_short.log" || status=1
  # The LM head's logits kept from the forward for the backward (TransformerOptions::keep_logits,
  # off on CUDA until cuda_transformer_test's kept-logits case has passed): the 0.5B shape again,
  # its 8192 rows' logits in one 5 GB chunk, one logits GEMM fewer per step.
  echo "-- prl bench model --config qwen2.5-0.5b --dtype bf16 --keep-logits-mb 8192"
  "$PRL" bench model --config qwen2.5-0.5b --device cuda --dtype bf16 --tokens 8192 \
    --seq-len 2048 --iters 5 --keep-logits-mb 8192 --json \
    >"$OUT_DIR/bench_bf16_keep_logits.json" 2>"$OUT_DIR/bench_bf16_keep_logits.log" || status=1
  for preset in qwen2.5-0.5b qwen2.5-1.5b; do
    bench "bench_f32_$preset" --config "$preset" --device cuda --dtype f32 --tokens 8192 \
      --seq-len 2048 --iters 3 --torch-modes eager
  done
  # Full learner steps (loss, FSDP over NCCL at world size 1, clipping, AdamW) beside the model
  # pass alone above: what the learner adds.
  local dtype
  for dtype in bf16 f32; do
    echo "-- prl bench learner --config qwen2.5-0.5b --device cuda --dtype $dtype"
    "$PRL" bench learner --config qwen2.5-0.5b --device cuda --dtype "$dtype" --tokens 8192 \
      --seq-len 2048 --iters 3 --world-sizes 1 --json >"$OUT_DIR/bench_learner_$dtype.json" \
      2>"$OUT_DIR/bench_learner_$dtype.log" || { tail -5 "$OUT_DIR/bench_learner_$dtype.log"; status=1; }
  done
  python3 - "$OUT_DIR" <<'PY' | tee "$OUT_DIR/bench_summary.txt"
import json, os, sys
d = sys.argv[1]
print("\n%-20s %-4s %8s %7s %6s %5s | %-20s | %-20s" % (
    "model/seq_len", "mode", "tok/s", "TFLOP/s", "MFU", "/GEMM", "PyTorch eager, ratio",
    "torch.compile, ratio"))
runs = [("qwen2.5-0.5b/2048", "bf16", "bench_bf16_qwen2.5-0.5b"),
        ("qwen2.5-1.5b/2048", "bf16", "bench_bf16_qwen2.5-1.5b"),
        ("qwen2.5-0.5b/256", "bf16", "bench_bf16_short"),
        ("0.5b/2048 kept", "bf16", "bench_bf16_keep_logits"),
        ("qwen2.5-0.5b/2048", "f32", "bench_f32_qwen2.5-0.5b"),
        ("qwen2.5-1.5b/2048", "f32", "bench_f32_qwen2.5-1.5b")]
for label, mode, name in runs:
    path = os.path.join(d, name + ".json")
    if not os.path.exists(path):
        print("%-20s %-4s   not run or failed: see %s.log" % (label, mode, name))
        continue
    r = json.load(open(path))
    rows = {(x["name"], x["baseline_name"]): x for x in r["results"]}
    first = lambda n: next((x for (m, _), x in rows.items() if m == n), None)
    tok = first("train_tokens_per_s")["value"]
    gemm = first("train_gflops")
    mfu = first("train_tflops")

    def torch_cell(torch_mode):
        x = rows.get(("train_tokens_per_s", "pytorch_%s_%s" % (torch_mode, mode)))
        if x:
            return "%8.0f tok/s %5.2f" % (x["baseline_value"], x["ratio"])
        return "failed" if "failed" in r["setup"].get("torch_" + torch_mode, "") else "-"

    print("%-20s %-4s %8.0f %7.1f %6s %5.2f | %-20s | %-20s" % (
        label, mode, tok, gemm["value"] / 1e3, "%.1f%%" % (100 * mfu["ratio"]) if mfu else "-",
        gemm["ratio"], torch_cell("eager"), torch_cell("compile")))
for mode in ("bf16", "f32"):
    path = os.path.join(d, "bench_learner_%s.json" % mode)
    if not os.path.exists(path):
        print("learner 0.5b/2048    %-4s   not run or failed: see bench_learner_%s.log" % (mode, mode))
        continue
    r = json.load(open(path))
    rows = {x["name"]: x for x in r["results"]}
    tok, gf = rows["w1_tokens_per_s"], rows["w1_gflops"]
    print("%-20s %-4s %8.0f %7.1f %6s %5.2f | learner step: loss, FSDP/NCCL, AdamW" % (
        "learner 0.5b/2048", mode, tok["value"], gf["value"] / 1e3, "-",
        gf["value"] / gf["baseline_value"]))
print("MFU: model FLOPs/s (model/flops.h) over the GPU's peak for the mode; /GEMM: over "
      "cuBLASLt on the MLP shape in the same dtype, same run; ratio: prl tokens/s over "
      "PyTorch's (> 1: prl faster). Failures: the JSON's setup and the .log files in " + d)
PY
}

# --- the service roles on the GPU: prl run with the learner and the actors sharing it --------
# The built-in task, short: a warm-start, then RL with the learner (NCCL, world size 1) and two
# actors (CUDA engines) on GPU 0, weights over CUDA IPC; then the same over the collective
# (nccl) transport when a second GPU exists (NCCL needs one rank per GPU).
run_roles() {
  echo "== prl run: learner and actors on CUDA"
  local work="$OUT_DIR/roles" transport
  mkdir -p "$work"
  for transport in cuda_ipc nccl; do
    if [ "$transport" = nccl ] && [ "$(nvidia-smi -L | wc -l)" -lt 2 ]; then
      echo "prl run over nccl: skipped (needs 2 GPUs)"
      continue
    fi
    "$PRL" run --run-dir "$work/$transport" --set run.name="gpu-$transport" \
      --set coordinator.listen=127.0.0.1:0 --set broadcast.listen=127.0.0.1:0 \
      --set broadcast.transport="$transport" --set learner.device=cuda --set actors.device=cuda \
      --set sft.steps=300 --set learner.steps=200 --set task.eval_prompts=200 \
      >"$work/$transport.log" 2>&1 || { tail -20 "$work/$transport.log"; status=1; continue; }
    python3 - "$work/$transport/summary.json" "$transport" <<'PY' || status=1
import json, sys
s = json.load(open(sys.argv[1]))
print("prl run over %s: %d steps, %.0f samples/s, lag mean %.2f, held-out %.3f -> %.3f" % (
    sys.argv[2], s["steps"], s["samples_per_second"], s["mean_lag"], s["eval_before"],
    s["eval_after"]))
sys.exit(0 if s["steps"] == 200 else 1)
PY
  done
}

# `prl run` with the tiny Qwen3-MoE (model.preset=tiny-qwen3-moe) on the GPU: the learner and
# the actors on CUDA (the MoE block on the device, routes recorded by the actors and replayed by
# the learner), weights over CUDA IPC; 60 steps required.
run_moe() {
  echo "== prl run: the tiny Qwen3-MoE with the learner and the actors on CUDA"
  local work="$OUT_DIR/moe"
  mkdir -p "$work"
  "$PRL" run --run-dir "$work/run" --set run.name=gpu-moe --set model.preset=tiny-qwen3-moe \
    --set coordinator.listen=127.0.0.1:0 --set broadcast.listen=127.0.0.1:0 \
    --set broadcast.transport=cuda_ipc --set learner.device=cuda --set actors.device=cuda \
    --set sft.steps=200 --set learner.steps=60 --set task.eval_prompts=100 \
    >"$work/run.log" 2>&1 || { tail -20 "$work/run.log"; status=1; return; }
  python3 - "$work/run/summary.json" <<'PY' || status=1
import json, sys
s = json.load(open(sys.argv[1]))
print("prl run, tiny Qwen3-MoE on CUDA: %d steps, %.0f samples/s, lag mean %.2f, held-out %.3f -> %.3f" % (
    s["steps"], s["samples_per_second"], s["mean_lag"], s["eval_before"], s["eval_after"]))
sys.exit(0 if s["steps"] == 60 else 1)
PY
  # Two layers of Qwen3-30B-A3B's shape (128 experts, top 8, width 768), bf16, beside PyTorch
  # eager of the same block (bench/torch_model_bench.py's Qwen3-MoE block).
  echo "-- prl bench model: two layers of Qwen3-30B-A3B's shape, bf16, beside PyTorch eager"
  python3 - "$work/qwen3-30b-a3b-2layers.json" <<'PY'
import json, sys
json.dump({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
           "hidden_size": 2048, "num_hidden_layers": 2, "num_attention_heads": 32,
           "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
           "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
           "norm_topk_prob": True, "vocab_size": 151936, "rms_norm_eps": 1e-6,
           "rope_theta": 1000000.0, "max_position_embeddings": 40960,
           "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu"},
          open(sys.argv[1], "w"))
PY
  timeout 150 "$PRL" bench model --config "$work/qwen3-30b-a3b-2layers.json" --device cuda \
    --dtype bf16 --tokens 4096 --seq-len 1024 --iters 3 --torch-baseline "$PYTHON" \
    --torch-modes eager >"$work/bench_model_moe.txt" 2>"$work/bench_model_moe.log" ||
    { tail -5 "$work/bench_model_moe.log"; status=1; }
  cat "$work/bench_model_moe.txt"
}

# LoRA on the GPU (learner.cuda_lora, actors.cuda_lora; written, not yet run on a GPU): `prl
# run` training an adapter of rank 8 on the frozen base with the learner and the actors on CUDA
# (bf16; each version an adapter the actors copy to the GPU), 100 steps required; then two
# tenants (a run of adapters, docs/tenants.md) on one base, 60 steps each. Their test binaries
# (cuda_lora_test; CudaLoraLearnerTest in cuda_learner_test, CudaEngineLoraTest in
# cuda_engine_test) are in part tests.
run_lora() {
  echo "== prl run: a LoRA adapter, then two tenants, with the learner and the actors on CUDA"
  local work="$OUT_DIR/lora"
  mkdir -p "$work"
  local cuda=(--set learner.device=cuda --set actors.device=cuda --set learner.dtype=bf16
    --set actors.dtype=bf16 --set learner.cuda_lora=true --set actors.cuda_lora=true
    --set coordinator.listen=127.0.0.1:0 --set broadcast.listen=127.0.0.1:0
    --set learner.lora_rank=8 --set learner.lora_targets=all-linear --set learner.lr=1e-3
    --set sft.steps=300 --set task.eval_prompts=100)
  "$PRL" run --run-dir "$work/adapter" --set run.name=gpu-lora "${cuda[@]}" \
    --set learner.steps=100 >"$work/adapter.log" 2>&1 ||
    { tail -20 "$work/adapter.log"; status=1; }
  python3 - "$work/adapter/summary.json" <<'PY' || status=1
import json, sys
s = json.load(open(sys.argv[1]))
print("prl run, LoRA on CUDA: %d steps, %.0f samples/s, lag mean %.2f, held-out %.3f -> %.3f" % (
    s["steps"], s["samples_per_second"], s["mean_lag"], s["eval_before"], s["eval_after"]))
sys.exit(0 if s["steps"] == 100 else 1)
PY
  python3 - "$work/tenants.json" <<'PY'
import json, sys
json.dump({"coordinator": {"adapters": True},
           "tenants": [{"name": "add", "task": {"operations": "+"}},
                       {"name": "sub", "task": {"operations": "-"}, "adapter": {"rank": 4}}]},
          open(sys.argv[1], "w"))
PY
  # Many adapters in one decode batch on the GPU (eager steps) beside the base model alone.
  echo "-- prl bench engine --adapters 8 --cuda-lora: the 0.5B shape, bf16, batches 16 and 64"
  timeout 240 "$PRL" bench engine --config qwen2.5-0.5b --device cuda --dtype bf16 \
    --adapters 8 --adapter-rank 16 --batches 16,64 --prompt-len 64 --output-len 128 --iters 1 \
    --swap-interval-ms 0 --cuda-lora --json >"$work/bench_engine_adapters.json" \
    2>"$work/bench_engine_adapters.log" || { tail -5 "$work/bench_engine_adapters.log"; status=1; }
  python3 - "$work/bench_engine_adapters.json" <<'PY' || true
import json, sys
for x in json.load(open(sys.argv[1]))["results"]:
    if "adapters" in x["name"]:
        print("%s: %.0f tok/s, base alone %.0f, ratio %.2f" % (
            x["name"], x["value"], x.get("baseline_value", 0), x.get("ratio", 0)))
PY
  "$PRL" run --config "$work/tenants.json" --run-dir "$work/tenants" --set run.name=gpu-tenants \
    "${cuda[@]}" --set learner.steps=60 >"$work/tenants.log" 2>&1 ||
    { tail -20 "$work/tenants.log"; status=1; }
  python3 - "$work/tenants/summary.json" <<'PY' || status=1
import json, sys
s = json.load(open(sys.argv[1]))
ok = True
for t in s["tenants"]:
    print("prl run, tenant %s on CUDA: %d steps, held-out %.3f -> %.3f" % (
        t["name"], t["steps"], t["eval_before"], t["eval_after"]))
    ok = ok and t["steps"] == 60
sys.exit(0 if ok and len(s["tenants"]) == 2 else 1)
PY
}

# --- weight swaps and the pipeline against sync mode ---------------------------------------
# Publish-to-swapped latency and the stall per transport for the 0.5B and 1.5B shapes (a second
# prl process decodes in bf16 while versions arrive), then `prl bench e2e` (sync mode, then
# pipeline mode) with the learner and the actors on this GPU, weights over CUDA IPC.
run_swaps() {
  echo "== prl bench broadcast: publish-to-swapped over cuda_ipc, shm, grpc"
  "$PRL" bench broadcast --configs qwen2.5-0.5b,qwen2.5-1.5b --device cuda --dtype bf16 \
    --versions 5 --work-dir "$OUT_DIR" --json >"$OUT_DIR/bench_broadcast.json" \
    2>"$OUT_DIR/bench_broadcast.log" || { tail -5 "$OUT_DIR/bench_broadcast.log"; status=1; }
  python3 - "$OUT_DIR/bench_broadcast.json" <<'PY' || status=1
import json, sys
for x in json.load(open(sys.argv[1]))["results"]:
    print("  %-40s %10.2f %-3s | %-18s %10.2f" % (x["name"], x["value"], x["unit"],
                                                  x["baseline_name"], x["baseline_value"]))
PY
}

run_e2e() {
  echo "== prl bench e2e: pipeline vs sync with the learner and the actors on the GPU"
  "$PRL" bench e2e --run-dir "$OUT_DIR/e2e" --set coordinator.listen=127.0.0.1:0 \
    --set broadcast.listen=127.0.0.1:0 --set broadcast.transport=cuda_ipc \
    --set learner.device=cuda --set actors.device=cuda --set learner.steps=400 \
    >"$OUT_DIR/bench_e2e.txt" 2>"$OUT_DIR/bench_e2e.log" || { tail -5 "$OUT_DIR/bench_e2e.log"; status=1; }
  grep -E "samples/s|lag|wall time|eval_after" "$OUT_DIR/bench_e2e.txt"
  # Long-tailed completion lengths: the untrained model stops at its stop token with a chance of
  # about 1/vocab per token, so lengths are geometric (mean ~22 tokens, each step's longest ~5x
  # that) up to max_tokens; a sync step waits for its longest completion.
  echo "== prl bench e2e: the same with long-tailed completion lengths (no warm-start)"
  "$PRL" bench e2e --run-dir "$OUT_DIR/e2e-tail" --set coordinator.listen=127.0.0.1:0 \
    --set broadcast.listen=127.0.0.1:0 --set broadcast.transport=cuda_ipc \
    --set learner.device=cuda --set actors.device=cuda --set learner.steps=400 \
    --set sft.steps=0 --set task.max_tokens=512 --set model.max_position_embeddings=1024 \
    >"$OUT_DIR/bench_e2e_tail.txt" 2>"$OUT_DIR/bench_e2e_tail.log" ||
    { tail -5 "$OUT_DIR/bench_e2e_tail.log"; status=1; }
  grep -E "samples/s|completion|lag|wall time" "$OUT_DIR/bench_e2e_tail.txt"
}

part tests && run_tests
if part score || part learner || part engine || part roles || part moe || part lora ||
  part bench || part swaps || part e2e || part profile || part profile_learner; then
  if [ ! -x "$PRL" ]; then
    echo "gpu_check: no $PRL in the bundle" >&2
    status=1
  else
    part score && run_score
    part learner && run_learner
    part engine && run_engine
    part profile && run_profile
    part profile_learner && run_profile_learner
    part roles && run_roles
    part moe && run_moe
    part lora && run_lora
    part bench && run_bench
    part swaps && run_swaps
    part e2e && run_e2e
  fi
fi
echo "gpu_check ($PARTS): $([ $status -eq 0 ] && echo 'all passed' || echo 'FAILURES (see above)')"
exit $status
