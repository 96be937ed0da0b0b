// CopyColumns: a block of columns moves between two row-major matrices of different widths
// (the query or key heads out of, and back into, the packed qkv rows), and nothing else is
// written.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/convert.h"
#include "tests/kernels/tensor_util.h"

namespace prl::kernels {
namespace {

using testing::View;

TEST(CopyColumnsTest, CopiesTheBlockBetweenWidthsAndLeavesTheRestAlone) {
  const int64_t T = 5, Ws = 11, Wd = 7, width = 4, src_col = 6, dst_col = 2;
  std::vector<float> src(T * Ws), dst(T * Wd, -1.0f);
  for (int64_t i = 0; i < T * Ws; ++i) src[i] = static_cast<float>(i);
  CopyColumns(View(dst, {T, Wd}), dst_col, View(src, {T, Ws}), src_col, width);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < Wd; ++j) {
      const bool copied = j >= dst_col && j < dst_col + width;
      const float want = copied ? src[t * Ws + src_col + (j - dst_col)] : -1.0f;
      ASSERT_EQ(dst[t * Wd + j], want) << "row " << t << " column " << j;
    }
  }
}

TEST(CopyColumnsTest, ABlockOutsideItsRowIsAProgrammingError) {
  std::vector<float> src(3 * 8), dst(3 * 4);
  EXPECT_DEATH(CopyColumns(View(dst, {3, 4}), 0, View(src, {3, 8}), 5, 4), "from \\[5, 9\\) of 8");
}

}  // namespace
}  // namespace prl::kernels
