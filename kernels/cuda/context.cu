// Stream-ordered scratch memory of the CUDA backend (kernels/cuda/cuda_ops.h).
#include "kernels/cuda/cuda_ops.h"

namespace prl::kernels::cuda {

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

}  // namespace prl::kernels::cuda
