// Context-parallel attention (kernels/context_attention.h): a group of C ranks, each holding two
// chunks of every sequence (chunk r and chunk 2C - 1 - r of 2C, the causal balance), together
// compute packed attention's outputs, log-sum-exps and gradients: each rank its queries' rows,
// the group's key/value gradients summed.
#include "kernels/context_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "tests/kernels/reference_ops.h"
#include "tests/kernels/tensor_util.h"

namespace prl::testing {
namespace {

constexpr int64_t H = 6, KV = 2, D = 16, W = (H + 2 * KV) * D;

// Rank r's pieces of sequences of `lens` (packed from row 0 in `cu`), as full-sequence rows.
struct RankRows {
  std::vector<kernels::QueryPiece> pieces;  // row0 local, kv0 = the sequence's packed start
  std::vector<int64_t> global_rows;         // local row -> packed row
};

RankRows Split(const std::vector<int32_t>& cu, int rank, int size) {
  RankRows r;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t len = cu[s + 1] - cu[s];
    for (const int chunk : {rank, 2 * size - 1 - rank}) {
      const int64_t a = chunk * len / (2 * size), b = (chunk + 1) * len / (2 * size);
      if (b <= a) continue;
      r.pieces.push_back({static_cast<int64_t>(r.global_rows.size()), b - a, a, cu[s]});
      for (int64_t t = a; t < b; ++t) r.global_rows.push_back(cu[s] + t);
    }
  }
  return r;
}

TEST(ContextAttentionTest, ARankGroupComputesPackedAttentionAndItsGradients) {
  const std::vector<int32_t> cu = {0, 1, 6, 70, 135, 265};  // lengths straddle 64-row blocks
  const int64_t T = cu.back();
  std::mt19937_64 rng(3);
  std::vector<float> qkv = ToF32(RandomVec(T * W, rng));
  std::vector<float> dout = ToF32(RandomVec(T * H * D, rng));
  std::vector<int32_t> cu_copy = cu;
  // The whole packed batch on one device: the reference.
  std::vector<float> out(T * H * D), lse(T * H), dqkv(T * W);
  const Tensor cu_t = View(cu_copy, {static_cast<int64_t>(cu.size())});
  kernels::AttentionForward(View(out, {T, H * D}), View(lse, {T, H}), View(qkv, {T, W}), cu_t,
                            {H, KV, D});
  kernels::AttentionBackward(View(dqkv, {T, W}), View(dout, {T, H * D}), View(qkv, {T, W}),
                             View(out, {T, H * D}), View(lse, {T, H}), cu_t, {H, KV, D});
  // Every sequence's keys and values, gathered (the group's all-gather).
  std::vector<float> kv(T * 2 * KV * D);
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(qkv.data() + t * W + H * D, 2 * KV * D, kv.data() + t * 2 * KV * D);
  }
  for (const int size : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << size << " ranks");
    std::vector<float> dkv(T * 2 * KV * D, 0.0f);  // summed over the group
    int64_t rows_seen = 0;
    for (int rank = 0; rank < size; ++rank) {
      const RankRows r = Split(cu, rank, size);
      const int64_t n = static_cast<int64_t>(r.global_rows.size());
      rows_seen += n;
      std::vector<float> q(n * W), dq(n * W, 0.0f), o(n * H * D), l(n * H), dout_local(n * H * D);
      for (int64_t i = 0; i < n; ++i) {
        std::copy_n(qkv.data() + r.global_rows[i] * W, W, q.data() + i * W);
        std::copy_n(dout.data() + r.global_rows[i] * H * D, H * D, dout_local.data() + i * H * D);
      }
      kernels::ContextAttentionForward(View(o, {n, H * D}), View(l, {n, H}), View(q, {n, W}),
                                       View(kv, {T, 2 * KV * D}), r.pieces, {H, KV, D});
      kernels::ContextAttentionBackward(View(dq, {n, W}), View(dkv, {T, 2 * KV * D}),
                                        View(dout_local, {n, H * D}), View(q, {n, W}),
                                        View(kv, {T, 2 * KV * D}), View(o, {n, H * D}),
                                        View(l, {n, H}), r.pieces, {H, KV, D});
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = r.global_rows[i];
        for (int64_t j = 0; j < H * D; ++j) {
          ASSERT_NEAR(o[i * H * D + j], out[t * H * D + j], 1e-5) << "row " << t;
        }
        for (int64_t h = 0; h < H; ++h) ASSERT_NEAR(l[i * H + h], lse[t * H + h], 1e-5);
        for (int64_t j = 0; j < H * D; ++j) {
          ASSERT_NEAR(dq[i * W + j], dqkv[t * W + j], 1e-5) << "dq row " << t;
        }
        for (int64_t j = H * D; j < W; ++j) ASSERT_EQ(dq[i * W + j], 0.0f) << "k|v left alone";
      }
    }
    EXPECT_EQ(rows_seen, T) << "every row on exactly one rank";
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < 2 * KV * D; ++j) {
        ASSERT_NEAR(dkv[t * 2 * KV * D + j], dqkv[t * W + H * D + j], 1e-5) << "dk|dv row " << t;
      }
    }
  }
}

// A piece of earlier positions (QueryPiece::keys, ring attention's block): every query sees
// every key of the block. Forward against a float64 reference; the gradients at q, k and v
// against finite differences of that reference.
TEST(ContextAttentionTest, ABlockPieceAttendsEveryKeyOfTheBlock) {
  constexpr int64_t h = 4, kv_heads = 2, d = 4, w = (h + 2 * kv_heads) * d, kv_w = 2 * kv_heads * d;
  const int64_t nq = 5, nk = 7, row0 = 2, kv0 = 3, T = row0 + nq, T_kv = kv0 + nk;
  std::mt19937_64 rng(9);
  const Vec q64 = RandomVec(T * w, rng), kv64 = RandomVec(T_kv * kv_w, rng);
  const Vec dout64 = RandomVec(T * h * d, rng);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  // sum(dout * attention) in float64, queries rows [row0, row0 + nq) over kv rows [kv0, T_kv).
  auto objective = [&](const Vec& q, const Vec& kv, Vec* out, Vec* lse) {
    double total = 0.0;
    for (int64_t i = row0; i < T; ++i) {
      for (int64_t head = 0; head < h; ++head) {
        const int64_t g = head / (h / kv_heads);
        std::vector<double> score(nk);
        double top = -1e300;
        for (int64_t j = 0; j < nk; ++j) {
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c) {
            dot += q[i * w + head * d + c] * kv[(kv0 + j) * kv_w + g * d + c];
          }
          score[j] = scale * dot;
          top = std::max(top, score[j]);
        }
        double sum = 0.0;
        for (double& x : score) sum += (x = std::exp(x - top));
        if (lse != nullptr) (*lse)[i * h + head] = top + std::log(sum);
        for (int64_t c = 0; c < d; ++c) {
          double o = 0.0;
          for (int64_t j = 0; j < nk; ++j) {
            o += score[j] / sum * kv[(kv0 + j) * kv_w + kv_heads * d + g * d + c];
          }
          if (out != nullptr) (*out)[(i * h + head) * d + c] = o;
          total += dout64[(i * h + head) * d + c] * o;
        }
      }
    }
    return total;
  };
  Vec out_ref(T * h * d, 0.0), lse_ref(T * h, 0.0);
  objective(q64, kv64, &out_ref, &lse_ref);
  std::vector<float> qkv = ToF32(q64), kv = ToF32(kv64), dout = ToF32(dout64);
  std::vector<float> out(T * h * d, 0.0f), lse(T * h, 0.0f), dqkv(T * w, 0.0f),
      dkv(T_kv * kv_w, 0.0f);
  const std::vector<kernels::QueryPiece> pieces = {{row0, nq, /*pos0=*/0, kv0, /*keys=*/nk}};
  kernels::ContextAttentionForward(View(out, {T, h * d}), View(lse, {T, h}), View(qkv, {T, w}),
                                   View(kv, {T_kv, kv_w}), pieces, {h, kv_heads, d});
  for (int64_t i = row0 * h * d; i < T * h * d; ++i) ASSERT_NEAR(out[i], out_ref[i], 1e-5) << i;
  for (int64_t i = row0 * h; i < T * h; ++i) ASSERT_NEAR(lse[i], lse_ref[i], 1e-5) << i;
  kernels::ContextAttentionBackward(View(dqkv, {T, w}), View(dkv, {T_kv, kv_w}),
                                    View(dout, {T, h * d}), View(qkv, {T, w}),
                                    View(kv, {T_kv, kv_w}), View(out, {T, h * d}),
                                    View(lse, {T, h}), pieces, {h, kv_heads, d});
  const Vec dq_ref = FiniteDifferenceGradient(
      [&](const Vec& q) { return objective(q, kv64, nullptr, nullptr); }, q64);
  const Vec dkv_ref = FiniteDifferenceGradient(
      [&](const Vec& kv_rows) { return objective(q64, kv_rows, nullptr, nullptr); }, kv64);
  for (int64_t i = row0; i < T; ++i) {
    for (int64_t c = 0; c < h * d; ++c) {
      ASSERT_NEAR(dqkv[i * w + c], dq_ref[i * w + c], 1e-4) << "dq row " << i;
    }
  }
  for (int64_t i = 0; i < T_kv * kv_w; ++i) ASSERT_NEAR(dkv[i], dkv_ref[i], 1e-4) << "dkv " << i;
}

}  // namespace
}  // namespace prl::testing
