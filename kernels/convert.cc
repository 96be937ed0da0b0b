#include "kernels/convert.h"

#include <cstring>

#include "kernels/dispatch.h"
#if PRL_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace prl::kernels {

void ConvertDType(const Tensor& dst, const Tensor& src) {
  const char* op = "ConvertDType";
  PRL_CHECK(dst.numel() == src.numel(), op, ": ", dst.numel(), " elements from ", src.numel());
  for (const Tensor* t : {&dst, &src}) {
    PRL_CHECK(t->dtype == DType::kF32 || t->dtype == DType::kBF16, op, ": F32 or BF16, found ",
              DTypeName(t->dtype));
  }
  const Device device = internal::CommonDevice(op, {&dst, &src});
  const int64_t n = src.numel();
  if (device.is_cpu()) {
    if (dst.dtype == src.dtype) {
      std::memcpy(dst.data, src.data, src.bytes());
    } else if (src.dtype == DType::kF32) {
      ConvertFromF32(dst.data, DType::kBF16, src.f32(), n);
    } else {
      ConvertToF32(dst.f32(), src.data, DType::kBF16, n);
    }
    return;
  }
#if PRL_WITH_CUDA
  return cuda::Convert(device.index, dst.dtype, dst.data, src.dtype, src.data, n);
#else
  internal::NoBackend(op, device);
#endif
}

namespace {

bool IsF32OrBf16(DType dt) { return dt == DType::kF32 || dt == DType::kBF16; }

// The column blocks [dst_col, + width) of dst and [src_col, + width) of src: matrices of as
// many rows, the blocks inside them.
void CheckColumnBlocks(const char* op, const Tensor& dst, int64_t dst_col, const Tensor& src,
                       int64_t src_col, int64_t width) {
  PRL_CHECK(dst.rank == 2 && src.rank == 2, op, ": dst ", dst.ShapeString(), " and src ",
            src.ShapeString(), " must be matrices");
  const int64_t T = src.size(0), Wd = dst.size(1), Ws = src.size(1);
  PRL_CHECK(dst.size(0) == T, op, ": dst has ", dst.size(0), " rows, src ", T);
  PRL_CHECK(
      width >= 0 && dst_col >= 0 && src_col >= 0 && dst_col + width <= Wd && src_col + width <= Ws,
      op, ": columns [", dst_col, ", ", dst_col + width, ") of ", Wd, " from [", src_col, ", ",
      src_col + width, ") of ", Ws);
}

}  // namespace

void CopyColumns(const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col,
                 int64_t width) {
  const char* op = "CopyColumns";
  CheckColumnBlocks(op, dst, dst_col, src, src_col, width);
  PRL_CHECK(dst.dtype == src.dtype && (src.dtype == DType::kF32 || src.dtype == DType::kBF16), op,
            ": one dtype, F32 or BF16; found ", DTypeName(dst.dtype), " and ",
            DTypeName(src.dtype));
  const int64_t T = src.size(0), Wd = dst.size(1), Ws = src.size(1);
  const Device device = internal::CommonDevice(op, {&dst, &src});
  const size_t element = DTypeSize(src.dtype);
  char* d = static_cast<char*>(dst.data) + dst_col * element;
  const char* s = static_cast<const char*>(src.data) + src_col * element;
  if (device.is_cpu()) {
#pragma omp parallel for schedule(static) if (T * width >= (1 << 16))
    for (int64_t t = 0; t < T; ++t) {
      std::memcpy(d + t * Wd * element, s + t * Ws * element, width * element);
    }
    return;
  }
#if PRL_WITH_CUDA
  return cuda::CopyColumns(device.index, d, Wd * element, s, Ws * element, width * element, T);
#else
  internal::NoBackend(op, device);
#endif
}

void AddColumns(const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col,
                int64_t width, float alpha, bool accumulate) {
  const char* op = "AddColumns";
  CheckColumnBlocks(op, dst, dst_col, src, src_col, width);
  const int64_t T = src.size(0), Wd = dst.size(1), Ws = src.size(1);
  const Device device = internal::CommonDevice(op, {&dst, &src});
  PRL_CHECK((dst.dtype == DType::kF32 && src.dtype == DType::kF32) ||
                (device.is_cuda() && IsF32OrBf16(dst.dtype) && IsF32OrBf16(src.dtype)),
            op, ": dst ", DTypeName(dst.dtype), ", src ", DTypeName(src.dtype));
  if (device.is_cuda()) {
#if PRL_WITH_CUDA
    return cuda::AddColumns(
        device.index, dst.dtype,
        static_cast<char*>(dst.data) + dst_col * static_cast<int64_t>(DTypeSize(dst.dtype)), Wd,
        src.dtype,
        static_cast<const char*>(src.data) + src_col * static_cast<int64_t>(DTypeSize(src.dtype)),
        Ws, width, T, alpha, accumulate);
#endif
  }
  if (!device.is_cpu()) internal::NoBackend(op, device);
  float* d = dst.f32() + dst_col;
  const float* s = src.f32() + src_col;
#pragma omp parallel for schedule(static) if (T * width >= (1 << 16))
  for (int64_t t = 0; t < T; ++t) {
    float* dr = d + t * Wd;
    const float* sr = s + t * Ws;
    if (accumulate) {
      for (int64_t j = 0; j < width; ++j) dr[j] += alpha * sr[j];
    } else {
      for (int64_t j = 0; j < width; ++j) dr[j] = alpha * sr[j];
    }
  }
}

void AddColumnsAtRows(const Tensor& dst, const Tensor& rows, int64_t dst_col, const Tensor& src,
                      float alpha) {
  const char* op = "AddColumnsAtRows";
  PRL_CHECK(dst.rank == 2 && src.rank == 2 && rows.rank == 1, op, ": dst ", dst.ShapeString(),
            ", rows ", rows.ShapeString(), ", src ", src.ShapeString());
  const int64_t n = src.size(0), width = src.size(1), T = dst.size(0), Wd = dst.size(1);
  PRL_CHECK(rows.size(0) == n && dst_col >= 0 && dst_col + width <= Wd, op, ": ", n,
            " rows of width ", width, " into columns [", dst_col, ", ", dst_col + width, ") of ",
            Wd);
  const Device device = internal::CommonDevice(op, {&dst, &rows, &src});
  PRL_CHECK(((dst.dtype == DType::kF32 && src.dtype == DType::kF32) ||
             (device.is_cuda() && IsF32OrBf16(dst.dtype) && IsF32OrBf16(src.dtype))) &&
                rows.dtype == DType::kI32,
            op, ": dst ", DTypeName(dst.dtype), ", src ", DTypeName(src.dtype), ", rows ",
            DTypeName(rows.dtype));
  if (device.is_cuda()) {
#if PRL_WITH_CUDA
    // Rows out of range are the caller's bug; the CPU backend checks them, CUDA trusts them.
    return cuda::AddColumnsAtRows(
        device.index, dst.dtype,
        static_cast<char*>(dst.data) + dst_col * static_cast<int64_t>(DTypeSize(dst.dtype)), Wd,
        rows.i32(), src.dtype, src.data, width, n, alpha);
#endif
  }
  if (!device.is_cpu()) internal::NoBackend(op, device);
  const int32_t* r = rows.i32();
  float* d = dst.f32();
  const float* s = src.f32();
#pragma omp parallel for schedule(static) if (n * width >= (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    PRL_CHECK(r[i] >= 0 && r[i] < T, op, ": row ", r[i], " of ", T);
    float* dr = d + static_cast<int64_t>(r[i]) * Wd + dst_col;
    const float* sr = s + i * width;
    for (int64_t j = 0; j < width; ++j) dr[j] += alpha * sr[j];
  }
}

}  // namespace prl::kernels
