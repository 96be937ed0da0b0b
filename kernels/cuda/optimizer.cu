// Optimizer kernels on flat F32 shards (cuda_ops.h): AdamW with the CPU backend's arithmetic
// (torch.optim.AdamW's), optionally writing the updated parameters' BF16 copy in the same
// pass; SGD; and a deterministic sum of squares for the global gradient norm.
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"

namespace prl::kernels::cuda {
namespace {

__global__ void AdamWKernel(float* p, const float* g, float* m, float* v, int64_t n,
                            float decay_factor, float b1, float b2, float eps, float step_size,
                            float inv_sqrt_bc2, float scale, bf16* p_bf16) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float gi = g[i] * scale;
    float pi = p[i] * decay_factor;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    const float denom = sqrtf(vi) * inv_sqrt_bc2 + eps;
    pi -= step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (p_bf16 != nullptr) p_bf16[i] = __float2bfloat16_rn(pi);
  }
}

__global__ void SgdKernel(float* p, const float* g, int64_t n, float weight_decay, float lr,
                          float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    p[i] -= lr * (scale * g[i] + weight_decay * p[i]);
  }
}

constexpr int kSumBlocks = 1024, kSumThreads = 256;

// Fixed grid and block shapes and a fixed reduction tree: the same result on every run.
template <typename T>
__global__ void PartialSquaresKernel(double* partial, const T* x, int64_t n) {
  __shared__ double lane_sums[kSumThreads];
  double s = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kSumThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(kSumBlocks) * kSumThreads) {
    const double v = ToF32(x[i]);
    s += v * v;
  }
  lane_sums[threadIdx.x] = s;
  __syncthreads();
  for (int stride = kSumThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) lane_sums[threadIdx.x] += lane_sums[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = lane_sums[0];
}

__global__ void FinalSumKernel(double* out, const double* partial) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double s = 0;
  for (int i = 0; i < kSumBlocks; ++i) s += partial[i];
  *out = s;
}

}  // namespace

void AdamWUpdate(int device, float* p, const float* g, float* m, float* v, int64_t n, bool decay,
                 float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step,
                 float grad_scale, uint16_t* p_bf16) {
  if (n == 0) return;
  SetDevice(device);
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  const float step_size = static_cast<float>(lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float decay_factor = decay ? 1.0f - lr * weight_decay : 1.0f;
  AdamWKernel<<<GridStrideBlocks(n, 256, 8192), 256, 0, CurrentStream(device)>>>(
      p, g, m, v, n, decay_factor, beta1, beta2, eps, step_size, inv_sqrt_bc2, grad_scale,
      reinterpret_cast<bf16*>(p_bf16));
  PRL_CUDA_CHECK(cudaGetLastError());
}

void SgdUpdate(int device, float* p, const float* g, int64_t n, float weight_decay, float lr,
               float grad_scale) {
  if (n == 0) return;
  SetDevice(device);
  SgdKernel<<<GridStrideBlocks(n, 256, 8192), 256, 0, CurrentStream(device)>>>(
      p, g, n, weight_decay, lr, grad_scale);
  PRL_CUDA_CHECK(cudaGetLastError());
}

double SumOfSquares(int device, DType dt, const void* x, int64_t n) {
  SetDevice(device);
  cudaStream_t stream = CurrentStream(device);
  double* partial = nullptr;  // kSumBlocks partial sums, then the total
  PRL_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partial),
                                 sizeof(double) * (kSumBlocks + 1), stream));
  DispatchDType(dt, [&](auto tag) {
    using T = decltype(tag);
    PartialSquaresKernel<T>
        <<<kSumBlocks, kSumThreads, 0, stream>>>(partial, static_cast<const T*>(x), n);
  });
  FinalSumKernel<<<1, 32, 0, stream>>>(partial + kSumBlocks, partial);
  PRL_CUDA_CHECK(cudaGetLastError());
  double total = 0;
  PRL_CUDA_CHECK(cudaMemcpyAsync(&total, partial + kSumBlocks, sizeof(double),
                                 cudaMemcpyDeviceToHost, stream));
  PRL_CUDA_CHECK(cudaFreeAsync(partial, stream));
  PRL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return total;
}

}  // namespace prl::kernels::cuda
