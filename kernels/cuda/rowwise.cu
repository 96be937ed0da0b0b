// Row-wise and element-wise kernels of the CUDA backend: RMSNorm, RoPE, SwiGLU, embedding,
// add, fill (kernels/cuda/cuda_ops.h). fp32 arithmetic over F32 or BF16 storage.
#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/rope_rotate.cuh"

namespace prl::kernels::cuda {
namespace {

constexpr int kRowThreads = 256;

template <typename T>
__global__ void RmsNormForwardKernel(T* y, float* rstd, const T* x, const T* w, int64_t C,
                                     float eps) {
  const int64_t t = blockIdx.x;
  const T* xr = x + t * C;
  float ss = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = ToF32(xr[c]);
    ss += v * v;
  }
  ss = BlockSum(ss);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(C) + eps);
  if (threadIdx.x == 0) rstd[t] = r;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    y[t * C + c] = FromF32<T>(ToF32(xr[c]) * r * ToF32(w[c]));
  }
}

template <typename T>
__global__ void RmsNormBackwardDxKernel(T* dx, const T* dy, const T* x, const T* w,
                                        const float* rstd, int64_t C) {
  const int64_t t = blockIdx.x;
  const float r = rstd[t];
  float dot = 0;  // sum_j w_j dy_j x_j
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    dot += ToF32(w[c]) * ToF32(dy[t * C + c]) * ToF32(x[t * C + c]);
  }
  dot = BlockSum(dot);
  const float k = r * r * r * dot / static_cast<float>(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const int64_t i = t * C + c;
    const float g = r * ToF32(w[c]) * ToF32(dy[i]) - ToF32(x[i]) * k;
    dx[i] = FromF32<T>(ToF32(dx[i]) + g);
  }
}

// Column sums over rows, deterministic and parallel over rows, in two passes. Pass 1: a block
// of 32 columns x 8 row lanes sums one chunk of `chunk_rows` rows (lane l takes rows l, l + 8,
// ... of the chunk; the 8 lane sums are added in lane order) into partial (chunks, N). Pass 2
// adds a column's partials in chunk order to out. The summed value is x[r, c] (bias
// gradients) or dy[r, c] * x[r, c] * rstd[r] (RMSNorm's weight gradient).
constexpr int kColumnTile = 32, kColumnLanes = 8;
constexpr int64_t kColumnChunkRows = 128;

template <typename T, bool kNormWeight>
__global__ void ColumnPartialKernel(float* partial, const T* x, const T* dy, const float* rstd,
                                    int64_t M, int64_t N, int64_t chunk_rows) {
  __shared__ float lanes[kColumnLanes][kColumnTile];
  const int tx = threadIdx.x % kColumnTile, ty = threadIdx.x / kColumnTile;
  const int64_t c = blockIdx.x * static_cast<int64_t>(kColumnTile) + tx;
  const int64_t chunk = blockIdx.y;
  const int64_t r_begin = chunk * chunk_rows;
  const int64_t r_end = r_begin + chunk_rows < M ? r_begin + chunk_rows : M;
  float s = 0;
  if (c < N) {
    for (int64_t r = r_begin + ty; r < r_end; r += kColumnLanes) {
      if constexpr (kNormWeight) {
        s += ToF32(dy[r * N + c]) * ToF32(x[r * N + c]) * rstd[r];
      } else {
        s += ToF32(x[r * N + c]);
      }
    }
  }
  lanes[ty][tx] = s;
  __syncthreads();
  if (ty == 0 && c < N) {
    float total = 0;
    for (int l = 0; l < kColumnLanes; ++l) total += lanes[l][tx];
    partial[chunk * N + c] = total;
  }
}

__global__ void ColumnFinalKernel(float* out, const float* partial, int64_t chunks, int64_t N) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= N) return;
  float s = 0;
  for (int64_t k = 0; k < chunks; ++k) s += partial[k * N + c];
  out[c] += s;
}

__global__ void RopeTablesKernel(float* cos_t, float* sin_t, const int32_t* positions,
                                 const float* inv_freq, int64_t T, int64_t half) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * half) return;
  const int64_t t = i / half, k = i % half;
  // The angle is an fp32 product (as transformers computes it); cos/sin in double like the
  // CPU backend, so that large angles agree.
  const float angle = static_cast<float>(positions[t]) * inv_freq[k];
  cos_t[i] = static_cast<float>(cos(static_cast<double>(angle)));
  sin_t[i] = static_cast<float>(sin(static_cast<double>(angle)));
}

template <typename T>
__global__ void RopeApplyKernel(T* x, int64_t T_, int64_t num_heads, int64_t D, int64_t row_stride,
                                const float* cos_t, const float* sin_t, float sign) {
  const int64_t half = D / 2;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T_ * num_heads * half) return;
  const int64_t k = i % half, h = (i / half) % num_heads, t = i / (half * num_heads);
  T* head = x + t * row_stride + h * D;
  RotatePair(head, k, half, cos_t[t * half + k], sign * sin_t[t * half + k]);
}

__device__ __forceinline__ float Sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

template <typename T>
__global__ void SwiGluForwardKernel(T* act, const T* gate_up, int64_t T_, int64_t I) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T_ * I) return;
  const int64_t t = i / I, j = i % I;
  const float g = ToF32(gate_up[t * 2 * I + j]), u = ToF32(gate_up[t * 2 * I + I + j]);
  act[i] = FromF32<T>(g * Sigmoid(g) * u);
}

template <typename T>
__global__ void SwiGluBackwardKernel(T* dgate_up, const T* dact, const T* gate_up, int64_t T_,
                                     int64_t I) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T_ * I) return;
  const int64_t t = i / I, j = i % I;
  const float g = ToF32(gate_up[t * 2 * I + j]), u = ToF32(gate_up[t * 2 * I + I + j]);
  const float d = ToF32(dact[i]), sg = Sigmoid(g);
  dgate_up[t * 2 * I + j] = FromF32<T>(d * u * sg * (1.0f + g * (1.0f - sg)));
  dgate_up[t * 2 * I + I + j] = FromF32<T>(d * g * sg);
}

// BF16 with I % 8 == 0 and 16-byte aligned rows: the same per-element arithmetic with a
// thread per 8 elements of a row and 16-byte loads and stores, rows strided over grid y (no
// 64-bit division per element: the scalar kernels above ran at about a quarter of the memory
// bandwidth in the learner's profile).
constexpr int kVec8Threads = 256;

__device__ __forceinline__ void LoadBf16x8(const bf16* p, float* out) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const bf16* v = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
  for (int e = 0; e < 8; ++e) out[e] = ToF32(v[e]);
}
__device__ __forceinline__ void StoreBf16x8(bf16* p, const float* in) {
  uint4 raw;
  bf16* v = reinterpret_cast<bf16*>(&raw);
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = FromF32<bf16>(in[e]);
  *reinterpret_cast<uint4*>(p) = raw;
}

__global__ void SwiGluForwardVec8Kernel(bf16* act, const bf16* gate_up, int64_t T_, int64_t I) {
  const int64_t j = 8 * (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x);
  if (j >= I) return;
  for (int64_t t = blockIdx.y; t < T_; t += gridDim.y) {
    float g[8], u[8], a[8];
    LoadBf16x8(gate_up + t * 2 * I + j, g);
    LoadBf16x8(gate_up + t * 2 * I + I + j, u);
#pragma unroll
    for (int e = 0; e < 8; ++e) a[e] = g[e] * Sigmoid(g[e]) * u[e];
    StoreBf16x8(act + t * I + j, a);
  }
}

__global__ void SwiGluBackwardVec8Kernel(bf16* dgate_up, const bf16* dact, const bf16* gate_up,
                                         int64_t T_, int64_t I) {
  const int64_t j = 8 * (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x);
  if (j >= I) return;
  for (int64_t t = blockIdx.y; t < T_; t += gridDim.y) {
    float g[8], u[8], d[8], dg[8], du[8];
    LoadBf16x8(gate_up + t * 2 * I + j, g);
    LoadBf16x8(gate_up + t * 2 * I + I + j, u);
    LoadBf16x8(dact + t * I + j, d);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float sg = Sigmoid(g[e]);
      dg[e] = d[e] * u[e] * sg * (1.0f + g[e] * (1.0f - sg));
      du[e] = d[e] * g[e] * sg;
    }
    StoreBf16x8(dgate_up + t * 2 * I + j, dg);
    StoreBf16x8(dgate_up + t * 2 * I + I + j, du);
  }
}

bool Vec8Rows(DType dt, int64_t I, std::initializer_list<const void*> tensors) {
  if (dt != DType::kBF16 || I % 8 != 0) return false;
  for (const void* p : tensors) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

dim3 Vec8Grid(int64_t T, int64_t I) {
  return dim3(static_cast<unsigned>((I / 8 + kVec8Threads - 1) / kVec8Threads),
              static_cast<unsigned>(std::min<int64_t>(T, 65535)));
}

template <typename T>
__global__ void EmbeddingForwardKernel(T* out, const T* table, const int32_t* tokens, int64_t T_,
                                       int64_t C) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T_ * C) return;
  const int64_t t = i / C, c = i % C;
  out[i] = table[static_cast<int64_t>(tokens[t]) * C + c];
}

__device__ __forceinline__ void AtomicAddF32(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void AtomicAddF32(bf16* p, float v) {
  atomicAdd(p, __float2bfloat16_rn(v));
}

template <typename D, typename T>
__global__ void EmbeddingBackwardKernel(D* dtable, const T* dout, const int32_t* tokens, int64_t T_,
                                        int64_t C) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T_ * C) return;
  const int64_t t = i / C, c = i % C;
  AtomicAddF32(dtable + static_cast<int64_t>(tokens[t]) * C + c, ToF32(dout[i]));
}

template <typename T>
__global__ void AddKernel(T* dst, const T* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = FromF32<T>(ToF32(dst[i]) + ToF32(src[i]));
  }
}

template <typename To, typename From>
__global__ void ConvertKernel(To* dst, const From* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = FromF32<To>(ToF32(src[i]));
  }
}

template <typename T>
__global__ void FillKernel(T* x, int64_t n, float value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = FromF32<T>(value);
  }
}

// out (N, F32) += the column sums of (M, N) rows (see ColumnPartialKernel).
template <bool kNormWeight>
void AddColumnSums(int device, DType dt, float* out, const void* x, const void* dy,
                   const float* rstd, int64_t M, int64_t N) {
  if (M == 0 || N == 0) return;
  cudaStream_t stream = CurrentStream(device);
  // At most 65535 chunks (gridDim.y); 128 rows each up to 8.4 M rows.
  const int64_t chunk_rows = std::max<int64_t>(kColumnChunkRows, (M + 65534) / 65535);
  const int64_t chunks = (M + chunk_rows - 1) / chunk_rows;
  float* partial = static_cast<float*>(ScratchAlloc(device, sizeof(float) * chunks * N));
  const dim3 grid(static_cast<unsigned>((N + kColumnTile - 1) / kColumnTile),
                  static_cast<unsigned>(chunks));
  DispatchDType(dt, [&](auto tag) {
    using V = decltype(tag);
    ColumnPartialKernel<V, kNormWeight><<<grid, kColumnTile * kColumnLanes, 0, stream>>>(
        partial, static_cast<const V*>(x), static_cast<const V*>(dy), rstd, M, N, chunk_rows);
  });
  ColumnFinalKernel<<<Blocks(N, 128), 128, 0, stream>>>(out, partial, chunks, N);
  PRL_CUDA_CHECK(cudaGetLastError());
  ScratchFree(device, partial);
}

}  // namespace

void RmsNormForward(int device, DType dt, void* y, float* rstd, const void* x, const void* w,
                    int64_t T, int64_t C, float eps) {
  if (T == 0) return;
  SetDevice(device);
  DispatchDType(dt, [&](auto tag) {
    using V = decltype(tag);
    RmsNormForwardKernel<V><<<T, kRowThreads, 0, CurrentStream(device)>>>(
        static_cast<V*>(y), rstd, static_cast<const V*>(x), static_cast<const V*>(w), C, eps);
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

void RmsNormBackward(int device, DType dt, void* dx, float* dw, const void* dy, const void* x,
                     const void* w, const float* rstd, int64_t T, int64_t C) {
  if (T == 0) return;
  SetDevice(device);
  DispatchDType(dt, [&](auto tag) {
    using V = decltype(tag);
    RmsNormBackwardDxKernel<V><<<T, kRowThreads, 0, CurrentStream(device)>>>(
        static_cast<V*>(dx), static_cast<const V*>(dy), static_cast<const V*>(x),
        static_cast<const V*>(w), rstd, C);
  });
  PRL_CUDA_CHECK(cudaGetLastError());
  if (dw != nullptr) AddColumnSums<true>(device, dt, dw, x, dy, rstd, T, C);
}

void RopeTables(int device, float* cos, float* sin, const int32_t* positions, const float* inv_freq,
                int64_t T, int64_t half) {
  if (T * half == 0) return;
  SetDevice(device);
  RopeTablesKernel<<<Blocks(T * half, 256), 256, 0, CurrentStream(device)>>>(cos, sin, positions,
                                                                             inv_freq, T, half);
  PRL_CUDA_CHECK(cudaGetLastError());
}

void RopeApply(int device, DType dt, void* x, int64_t T, int64_t num_heads, int64_t D,
               int64_t row_stride, const float* cos, const float* sin, bool inverse) {
  const int64_t n = T * num_heads * (D / 2);
  if (n == 0) return;
  SetDevice(device);
  DispatchDType(dt, [&](auto tag) {
    using V = decltype(tag);
    RopeApplyKernel<V><<<Blocks(n, 256), 256, 0, CurrentStream(device)>>>(
        static_cast<V*>(x), T, num_heads, D, row_stride, cos, sin, inverse ? -1.0f : 1.0f);
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

void SwiGluForward(int device, DType dt, void* act, const void* gate_up, int64_t T, int64_t I) {
  if (T * I == 0) return;
  SetDevice(device);
  if (Vec8Rows(dt, I, {act, gate_up})) {
    SwiGluForwardVec8Kernel<<<Vec8Grid(T, I), kVec8Threads, 0, CurrentStream(device)>>>(
        static_cast<bf16*>(act), static_cast<const bf16*>(gate_up), T, I);
    PRL_CUDA_CHECK(cudaGetLastError());
    return;
  }
  DispatchDType(dt, [&](auto tag) {
    using V = decltype(tag);
    SwiGluForwardKernel<V><<<Blocks(T * I, 256), 256, 0, CurrentStream(device)>>>(
        static_cast<V*>(act), static_cast<const V*>(gate_up), T, I);
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

void SwiGluBackward(int device, DType dt, void* dgate_up, const void* dact, const void* gate_up,
                    int64_t T, int64_t I) {
  if (T * I == 0) return;
  SetDevice(device);
  if (Vec8Rows(dt, I, {dgate_up, dact, gate_up})) {
    SwiGluBackwardVec8Kernel<<<Vec8Grid(T, I), kVec8Threads, 0, CurrentStream(device)>>>(
        static_cast<bf16*>(dgate_up), static_cast<const bf16*>(dact),
        static_cast<const bf16*>(gate_up), T, I);
    PRL_CUDA_CHECK(cudaGetLastError());
    return;
  }
  DispatchDType(dt, [&](auto tag) {
    using V = decltype(tag);
    SwiGluBackwardKernel<V><<<Blocks(T * I, 256), 256, 0, CurrentStream(device)>>>(
        static_cast<V*>(dgate_up), static_cast<const V*>(dact), static_cast<const V*>(gate_up), T,
        I);
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

void EmbeddingForward(int device, DType dt, void* out, const void* table, const int32_t* tokens,
                      int64_t T, int64_t C) {
  if (T * C == 0) return;
  SetDevice(device);
  DispatchDType(dt, [&](auto tag) {
    using V = decltype(tag);
    EmbeddingForwardKernel<V><<<Blocks(T * C, 256), 256, 0, CurrentStream(device)>>>(
        static_cast<V*>(out), static_cast<const V*>(table), tokens, T, C);
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

void EmbeddingBackward(int device, DType dt, DType dtable_dt, void* dtable, const void* dout,
                       const int32_t* tokens, int64_t T, int64_t C) {
  if (T * C == 0) return;
  SetDevice(device);
  DispatchDType(dt, [&](auto tag) {
    using V = decltype(tag);
    DispatchDType(dtable_dt, [&](auto dtable_tag) {
      using D = decltype(dtable_tag);
      EmbeddingBackwardKernel<D, V><<<Blocks(T * C, 256), 256, 0, CurrentStream(device)>>>(
          static_cast<D*>(dtable), static_cast<const V*>(dout), tokens, T, C);
    });
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

void ColumnSums(int device, DType dt, float* dbias, const void* x, int64_t M, int64_t N) {
  SetDevice(device);
  AddColumnSums<false>(device, dt, dbias, x, nullptr, nullptr, M, N);
}

void AddInPlace(int device, DType dt, void* dst, const void* src, int64_t n) {
  if (n == 0) return;
  SetDevice(device);
  DispatchDType(dt, [&](auto tag) {
    using V = decltype(tag);
    AddKernel<V><<<GridStrideBlocks(n, 256, 4096), 256, 0, CurrentStream(device)>>>(
        static_cast<V*>(dst), static_cast<const V*>(src), n);
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

void CopyColumns(int device, void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                 int64_t row_bytes, int64_t T) {
  if (T == 0 || row_bytes == 0) return;
  SetDevice(device);
  PRL_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch), src,
                                   static_cast<size_t>(src_pitch), static_cast<size_t>(row_bytes),
                                   static_cast<size_t>(T), cudaMemcpyDeviceToDevice,
                                   CurrentStream(device)));
}

void Convert(int device, DType to, void* dst, DType from, const void* src, int64_t n) {
  if (n == 0) return;
  SetDevice(device);
  if (to == from) {
    PRL_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * DTypeSize(to),
                                   cudaMemcpyDeviceToDevice, CurrentStream(device)));
    return;
  }
  DispatchDType(to, [&](auto to_tag) {
    using To = decltype(to_tag);
    DispatchDType(from, [&](auto from_tag) {
      using From = decltype(from_tag);
      ConvertKernel<To, From><<<GridStrideBlocks(n, 256, 8192), 256, 0, CurrentStream(device)>>>(
          static_cast<To*>(dst), static_cast<const From*>(src), n);
    });
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

void Fill(int device, DType dt, void* x, int64_t n, float value) {
  if (n == 0) return;
  SetDevice(device);
  DispatchDType(dt, [&](auto tag) {
    using V = decltype(tag);
    FillKernel<V><<<GridStrideBlocks(n, 256, 4096), 256, 0, CurrentStream(device)>>>(
        static_cast<V*>(x), n, value);
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace prl::kernels::cuda
