#!/usr/bin/env bash
# Builds the GPU test and benchmark binaries HERE and bundles them, with the shared libraries
# they need, for the GPU machine (scripts/gpu_check.sh runs them there).
#
# Why build here: the GPU machine has the CUDA 13 toolkit, CMake, ninja and PyTorch but no
# Debian development packages (abseil, OpenBLAS, GoogleTest, gRPC) and no network, while this
# machine (Debian 12, glibc 2.36, the same CUDA 13.0) has them all; its binaries run on the GPU
# machine's newer glibc (2.39) and libstdc++. The bundle carries every non-system library the
# binaries load except the CUDA, cuBLAS and NCCL libraries and the C/C++ runtime, which the
# GPU machine has. It must stay well under the 64 MiB a device command may carry.
#
# usage: scripts/gpu_package.sh [BUILD_DIR=build-gpu]
#   -> BUILD_DIR/bundle.tar.gz (bin/, lib/; gzip keeps OpenBLAS's 36 MB DYNAMIC_ARCH build and
#      gRPC small enough to carry), also unpacked as BUILD_DIR/bundle
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-gpu}
# prl and every GPU test binary (ctest label gpu), and the worker process that
# cuda_weight_transport_test starts (it looks for it beside itself).
TARGETS=(prl cuda_kernels_test cuda_moe_test cuda_attention_logprob_test cuda_transformer_test
  cuda_lora_test cuda_learner_test cuda_engine_test collective_nccl_test cuda_weight_transport_test
  weight_transport_worker)
# A build directory that exists keeps its configuration (the default architectures, 80 and 90,
# include the H100's), so the everyday build can be packaged without compiling again.
if [ -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -DPRL_CUDA=ON >/dev/null
else
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPRL_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
fi
ninja -C "$BUILD_DIR" -j"${JOBS:-$(nproc)}" "${TARGETS[@]}"
BUNDLE="$BUILD_DIR/bundle"
rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
for t in "${TARGETS[@]}"; do
  bin=$(find "$BUILD_DIR" -type f -name "$t" -perm -u+x | head -1)
  [ -n "$bin" ] || { echo "gpu_package: $t was not built" >&2; exit 1; }
  # Debug sections go; the symbol table stays, so a crash prints a readable stack trace.
  strip --strip-debug -o "$BUNDLE/bin/$t" "$bin"
  ldd "$bin" | awk '/=> \//{print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libstdc++.so*|libgcc_s.so*|\
      ld-linux*|libcuda.so*|libcudart.so*|libcublas*.so*|libnccl.so*) ;;
      *) cp -L -n "$lib" "$BUNDLE/lib/" ;;
    esac
  done
done
tar -C "$BUILD_DIR" -czf "$BUILD_DIR/bundle.tar.gz" bundle
size=$(du -m "$BUILD_DIR/bundle.tar.gz" | cut -f1)
echo "gpu_package: $BUNDLE: $(du -sm "$BUNDLE" | cut -f1) MiB unpacked, $(ls "$BUNDLE/lib" | wc -l)" \
  "libraries; bin: $(ls "$BUNDLE/bin" | tr '\n' ' ')"
echo "gpu_package: $BUILD_DIR/bundle.tar.gz is ${size} MiB (what travels; carry it with the repo)"
if [ "$size" -ge 48 ]; then
  echo "gpu_package: FAILED: the bundle is ${size} MiB; it must stay well under the 64 MiB a" \
    "device command may carry" >&2
  exit 1
fi
