// Streams and error checks of the CUDA backend (kernels/cuda/cuda_ops.h).
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/cuda_ops.h"

namespace prl::kernels::cuda {

cudaStream_t CurrentStream(int /*device*/) { return cudaStreamPerThread; }

void* ScratchAlloc(int device, size_t bytes) {
  static thread_local bool configured[64] = {};
  if (device >= 0 && device < 64 && !configured[device]) {
    // Keep freed blocks in the pool instead of returning them to the driver at every sync.
    cudaMemPool_t pool;
    PRL_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t threshold = UINT64_MAX;
    PRL_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    configured[device] = true;
  }
  void* p = nullptr;
  PRL_CUDA_CHECK(cudaSetDevice(device));
  PRL_CUDA_CHECK(cudaMallocAsync(&p, bytes == 0 ? 1 : bytes, CurrentStream(device)));
  return p;
}

void ScratchFree(int device, void* p) {
  PRL_CUDA_CHECK(cudaSetDevice(device));
  PRL_CUDA_CHECK(cudaFreeAsync(p, CurrentStream(device)));
}

void CheckCuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "prl: CUDA error: %s failed: %s (%s:%d)\n", call, cudaGetErrorString(err),
               file, line);
  std::abort();
}

}  // namespace prl::kernels::cuda
