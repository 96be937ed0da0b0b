#include "core/dtype.h"

#include <cmath>

#include "core/check.h"

namespace prl {

absl::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI32:
      return "I32";
  }
  return "?";
}

std::optional<DType> DTypeFromName(absl::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "I32") return DType::kI32;
  return std::nullopt;
}

uint16_t F32ToBf16(float f) {
  uint32_t bits = BitsFromF32(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: value = mantissa * 2^-24, exactly representable in fp32.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return F32FromBits(sign | 0x7f800000u | (mantissa << 13));
  return F32FromBits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t F32ToF16(float f) {
  const uint32_t bits = BitsFromF32(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs_bits >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: infinity
  if (abs_bits < 0x38800000u) {
    // Result is subnormal (or zero) in half: round |f| * 2^24 to nearest even integer.
    const float scaled = F32FromBits(abs_bits) * 16777216.0f;  // exact: power of two
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits.
  const uint32_t rebased = abs_bits - (112u << 23);
  const uint32_t rounding_bias = 0xfffu + ((rebased >> 13) & 1u);
  return sign | static_cast<uint16_t>((rebased + rounding_bias) >> 13);
}

void ConvertToF32(float* dst, const void* src, DType from, size_t n) {
  switch (from) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::kI32:
      break;
  }
  PRL_CHECK(false, "ConvertToF32: unsupported source dtype ", DTypeName(from));
}

void ConvertFromF32(void* dst, DType to, const float* src, size_t n) {
  switch (to) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToBf16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToF16(src[i]);
      return;
    }
    case DType::kI32:
      break;
  }
  PRL_CHECK(false, "ConvertFromF32: unsupported target dtype ", DTypeName(to));
}

}  // namespace prl
