// LoRA's column additions on CUDA (kernels/convert.h AddColumns, AddColumnsAtRows): an
// adapter's output added into its columns of a fused projection, for every row or for the
// rows of one adapter's requests. One thread per element, one fp32 fused multiply-add (the same
// in both kernels, so that a row gets the same bits through either), one rounding to the
// destination's dtype; each element is written by one thread (rows are distinct), so the
// result does not depend on the launch. The source's dtype may differ from the destination's
// (an F32 adapter's output into a BF16 model's activation, a BF16 gradient read into F32).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace prl::kernels::cuda {

namespace {

template <typename T, typename S>
__global__ void AddColumnsKernel(T* dst, int64_t dst_ld, const S* src, int64_t src_ld,
                                 int64_t width, int64_t n, float alpha, bool accumulate) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / width, j = i % width;
    T& d = dst[t * dst_ld + j];
    d = FromF32<T>(__fmaf_rn(alpha, ToF32(src[t * src_ld + j]), accumulate ? ToF32(d) : 0.0f));
  }
}

template <typename T, typename S>
__global__ void AddColumnsAtRowsKernel(T* dst, int64_t dst_ld, const int32_t* rows, const S* src,
                                       int64_t width, int64_t n, float alpha) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, j = i % width;
    T& d = dst[static_cast<int64_t>(rows[r]) * dst_ld + j];
    d = FromF32<T>(__fmaf_rn(alpha, ToF32(src[r * width + j]), ToF32(d)));
  }
}

}  // namespace

void AddColumns(int device, DType dst_dt, void* dst, int64_t dst_ld, DType src_dt, const void* src,
                int64_t src_ld, int64_t width, int64_t T, float alpha, bool accumulate) {
  const int64_t n = T * width;
  if (n == 0) return;
  SetDevice(device);
  DispatchDType(dst_dt, [&](auto dst_tag) {
    DispatchDType(src_dt, [&](auto src_tag) {
      using V = decltype(dst_tag);
      using S = decltype(src_tag);
      AddColumnsKernel<V, S><<<GridStrideBlocks(n, 256, 4096), 256, 0, CurrentStream(device)>>>(
          static_cast<V*>(dst), dst_ld, static_cast<const S*>(src), src_ld, width, n, alpha,
          accumulate);
    });
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

void AddColumnsAtRows(int device, DType dst_dt, void* dst, int64_t dst_ld, const int32_t* rows,
                      DType src_dt, const void* src, int64_t width, int64_t rows_n, float alpha) {
  const int64_t n = rows_n * width;
  if (n == 0) return;
  SetDevice(device);
  DispatchDType(dst_dt, [&](auto dst_tag) {
    DispatchDType(src_dt, [&](auto src_tag) {
      using V = decltype(dst_tag);
      using S = decltype(src_tag);
      AddColumnsAtRowsKernel<V, S>
          <<<GridStrideBlocks(n, 256, 4096), 256, 0, CurrentStream(device)>>>(
              static_cast<V*>(dst), dst_ld, rows, static_cast<const S*>(src), width, n, alpha);
    });
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace prl::kernels::cuda
