// Helpers for the GPU tests: skipping without a GPU, tensors on cuda:0 filled from and read
// back into std::vector<float>, NaN poisoning, and the relative-error measure of the CUDA
// issue.
//
// How a GPU test compares with the CPU backend (the reference):
//   auto x = AsStored(Random(n, seed), dt);   // the inputs as the GPU stores them
//   ...run the CPU kernel on x (fp32)...
//   DeviceTensor gx(dt, {T, C}); gx.Upload(x);  // outputs are NaN-poisoned at construction
//   ...run the kernel on the DeviceTensors...
//   EXPECT_LE(RelativeError(gy.Download(), want), Tolerance(dt));
// In BF16 mode the CPU reference is fed the bf16-rounded inputs (AsStored), so the bound
// measures the kernel's error, not the input rounding. An output element the kernel never
// writes stays NaN and makes RelativeError infinite.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <vector>

#include "core/buffer.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"

#if PRL_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/stream.h"
#include "kernels/cuda/cuda_ops.h"
#endif

// Skips the current test where no GPU exists (CI); scripts/gpu_check.sh runs it on one.
#define PRL_SKIP_WITHOUT_GPU()       \
  if (::prl::CudaDeviceCount() == 0) \
  GTEST_SKIP() << "no CUDA GPU: this test runs on a GPU machine (scripts/gpu_check.sh)"

namespace prl::testing {

// The bounds on ||got - want||_2 / ||want||_2 against the CPU backend.
inline constexpr double kF32Tolerance = 1e-5;
inline constexpr double kBf16Tolerance = 1e-2;
inline double Tolerance(DType dt) { return dt == DType::kF32 ? kF32Tolerance : kBf16Tolerance; }

// n normal(0, scale) values from a fixed seed.
inline std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// The values as a tensor of `dt` holds them: rounded to bf16 (nearest even) for BF16.
inline std::vector<float> AsStored(std::vector<float> v, DType dt) {
  if (dt == DType::kBF16) {
    for (float& x : v) x = Bf16ToF32(F32ToBf16(x));
  }
  return v;
}

// ||got - want||_2 / ||want||_2 in float64; infinite if any element of got is not finite
// (a poisoned, unwritten output) or the sizes differ.
// Equal bits and every value finite (two identical NaN poisons are not agreement).
inline bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  for (float x : a) {
    if (!std::isfinite(x)) return false;
  }
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    const double d = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    diff += d * d;
    norm += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

#if PRL_WITH_CUDA
// Fills an F32 or BF16 tensor on a GPU with NaN (I32 tensors are left alone).
inline void Poison(const Tensor& t) {
  if (t.dtype == DType::kI32 || t.numel() == 0) return;
  kernels::cuda::Fill(t.device.index, t.dtype, t.data, t.numel(),
                      std::numeric_limits<float>::quiet_NaN());
}

// An owned tensor on cuda:0 (F32, BF16 or I32), NaN-poisoned at construction.
struct DeviceTensor {
  Buffer buffer;
  Tensor t;

  DeviceTensor(DType dtype, std::initializer_list<int64_t> shape) {
    t = Tensor(nullptr, dtype, Device::Cuda(0), shape);
    absl::StatusOr<Buffer> b = Buffer::Allocate(Device::Cuda(0), t.bytes());
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) return;
    buffer = std::move(*b);
    t.data = buffer.data();
    Poison(t);
  }

  // Uploads v (numel values): converted to bf16 (round to nearest even) for a BF16 tensor.
  void Upload(const std::vector<float>& v) {
    ASSERT_EQ(static_cast<int64_t>(v.size()), t.numel());
    ASSERT_NE(t.dtype, DType::kI32) << "upload int32 data as std::vector<int32_t>";
    std::vector<uint16_t> half;
    const void* src = v.data();
    if (t.dtype == DType::kBF16) {
      half.reserve(v.size());
      for (float x : v) half.push_back(F32ToBf16(x));
      src = half.data();
    }
    Synchronize();
    const absl::Status s = CopyBytes(t.data, t.device, src, Device::Cpu(), t.bytes());
    EXPECT_TRUE(s.ok()) << s;
  }
  void Upload(const std::vector<int32_t>& v) {
    ASSERT_EQ(static_cast<int64_t>(v.size()), t.numel());
    ASSERT_EQ(t.dtype, DType::kI32);
    Synchronize();
    const absl::Status s = CopyBytes(t.data, t.device, v.data(), Device::Cpu(), t.bytes());
    EXPECT_TRUE(s.ok()) << s;
  }

  // Waits for every queued kernel, then copies the values back as floats (I32 converted).
  std::vector<float> Download() const {
    Synchronize();
    std::vector<float> out(static_cast<size_t>(t.numel()));
    absl::Status s;
    if (t.dtype == DType::kBF16) {
      std::vector<uint16_t> half(out.size());
      s = CopyBytes(half.data(), Device::Cpu(), t.data, t.device, t.bytes());
      for (size_t i = 0; i < out.size(); ++i) out[i] = Bf16ToF32(half[i]);
    } else if (t.dtype == DType::kI32) {
      std::vector<int32_t> ints(out.size());
      s = CopyBytes(ints.data(), Device::Cpu(), t.data, t.device, t.bytes());
      for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(ints[i]);
    } else {
      s = CopyBytes(out.data(), Device::Cpu(), t.data, t.device, t.bytes());
    }
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  // The device-wide barrier the tests use around copies: every stream's work is done (and
  // an asynchronous kernel fault surfaces here, naming this line).
  static void Synchronize() { PRL_CUDA_CHECK(cudaDeviceSynchronize()); }
};
#endif  // PRL_WITH_CUDA

}  // namespace prl::testing
