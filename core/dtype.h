// Element types of tensors and their conversions.
//
// Compute on the CPU backend is fp32; BF16 and F16 appear in checkpoints and (later) as the
// CUDA backend's storage type. Names follow the safetensors spelling ("F32", "BF16", ...).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>

#include "absl/strings/string_view.h"
#include "core/enum_names.h"

namespace prl {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32 };

constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kI32:
      return 4;
  }
  return 0;
}

absl::string_view DTypeName(DType t);

// The compute dtypes a user chooses (`learner.dtype`, `actors.dtype`, --dtype): fp32 (exact
// mode, every backend) or bf16 (CUDA: bf16 compute, fp32 accumulation and master weights).
// "f32" is accepted for fp32.
inline constexpr NamedValue<DType> kComputeDTypeNames[] = {
    {"fp32", DType::kF32}, {"f32", DType::kF32}, {"bf16", DType::kBF16}};
// Parses a safetensors dtype name among the ones above; nullopt for anything else.
std::optional<DType> DTypeFromName(absl::string_view name);

inline float F32FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint32_t BitsFromF32(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

// bfloat16 is the top half of an IEEE float32: widening is exact.
inline float Bf16ToF32(uint16_t h) { return F32FromBits(static_cast<uint32_t>(h) << 16); }
// Round to nearest even; NaN stays NaN (quietened), infinities stay infinite.
uint16_t F32ToBf16(float f);
// IEEE half precision, subnormals, infinities and NaN included. Widening is exact.
float F16ToF32(uint16_t h);
// Round to nearest even; overflow gives infinity.
uint16_t F32ToF16(float f);

// Converts `n` elements of `src` (of dtype `from`) into fp32. from must be F32, BF16 or F16.
void ConvertToF32(float* dst, const void* src, DType from, size_t n);
// Converts `n` fp32 elements into `to` (F32, BF16 or F16), rounding to nearest even.
void ConvertFromF32(void* dst, DType to, const float* src, size_t n);

}  // namespace prl
