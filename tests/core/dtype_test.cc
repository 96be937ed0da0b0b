#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace prl {
namespace {

TEST(DTypeTest, NamesRoundTripInSafetensorsSpelling) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    EXPECT_EQ(DTypeFromName(DTypeName(t)), t);
  }
  EXPECT_FALSE(DTypeFromName("F64").has_value());
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
}

TEST(DTypeTest, EveryF16BitPatternWidensExactlyAndNarrowsBack) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = F16ToF32(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f))));
      continue;
    }
    ASSERT_EQ(F32ToF16(f), h) << "bits 0x" << std::hex << bits;
  }
}

TEST(DTypeTest, F16WideningMatchesKnownValues) {
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x7c00), std::numeric_limits<float>::infinity());
}

TEST(DTypeTest, F16NarrowingRoundsToNearestEvenAndOverflowsToInfinity) {
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even (down)
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(F32ToF16(65519.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);
  EXPECT_EQ(F32ToF16(-1e9f), 0xfc00);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);  // half the smallest subnormal: tie -> 0
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 subnormal units -> 2 (even)
}

TEST(DTypeTest, Bf16IsTheTopHalfAndRoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  EXPECT_EQ(F32ToBf16(F32FromBits(0x3f808000)), 0x3f80);  // tie -> even (down)
  EXPECT_EQ(F32ToBf16(F32FromBits(0x3f818000)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(F32ToBf16(F32FromBits(0x3f808001)), 0x3f81);  // above the tie -> up
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(Bf16ToF32(F32ToBf16(-std::numeric_limits<float>::infinity())),
            -std::numeric_limits<float>::infinity());
}

TEST(DTypeTest, BufferConversionsAgreeWithScalarOnes) {
  const std::vector<float> src = {0.0f, -1.5f, 3.14159f, 1e-6f, 70000.0f};
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<uint8_t> packed(src.size() * DTypeSize(t));
    ConvertFromF32(packed.data(), t, src.data(), src.size());
    std::vector<float> back(src.size());
    ConvertToF32(back.data(), packed.data(), t, src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      const float expected = t == DType::kF32    ? src[i]
                             : t == DType::kBF16 ? Bf16ToF32(F32ToBf16(src[i]))
                                                 : F16ToF32(F32ToF16(src[i]));
      EXPECT_EQ(back[i], expected) << DTypeName(t) << " " << src[i];
    }
  }
}

}  // namespace
}  // namespace prl
