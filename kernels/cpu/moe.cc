// The CPU backend of kernels/moe.h: model/moe_layer.h's routing, sort, gather, combine and
// their backward, as they were written in the layer before the CUDA backend joined.
#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/check.h"

namespace prl::kernels::cpu {
namespace {

constexpr int64_t kMaxExperts = 256;

// In place: logits (E) -> softmax, as torch's fp32 softmax (max subtracted).
void Softmax(float* row, int64_t E) {
  const float max = *std::max_element(row, row + E);
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    row[e] = std::exp(row[e] - max);
    sum += row[e];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t e = 0; e < E; ++e) row[e] *= inv;
}

// The K experts of largest p, by decreasing p, ties to the lower id.
void TopK(const float* p, int64_t E, int64_t K, int32_t* out) {
  int32_t ids[kMaxExperts];
  std::iota(ids, ids + E, 0);
  std::partial_sort(ids, ids + K, ids + E,
                    [p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  std::copy(ids, ids + K, out);
}

}  // namespace

void MoeRoute(float* probs, int32_t* recomputed, int32_t* routes, float* weights,
              const float* logits, const int32_t* forced, int64_t T, int64_t E, int64_t K,
              bool renormalise) {
  PRL_CHECK(E >= 1 && E <= kMaxExperts && K >= 1 && K <= E, "MoeRoute: E ", E, ", K ", K);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    float* p = probs + t * E;
    if (p != logits + t * E) std::memcpy(p, logits + t * E, E * sizeof(float));
    Softmax(p, E);
    TopK(p, E, K, recomputed + t * K);
    const int32_t* use = recomputed + t * K;
    if (forced != nullptr && forced[t * K] >= 0) use = forced + t * K;
    for (int64_t k = 0; k < K; ++k) {
      PRL_CHECK(use[k] >= 0 && use[k] < E, "replayed expert ", use[k], " of ", E);
      routes[t * K + k] = use[k];
      weights[t * K + k] = p[use[k]];
    }
    if (renormalise) {
      // transformers: routing_weights /= routing_weights.sum(-1), in fp32.
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s += weights[t * K + k];
      for (int64_t k = 0; k < K; ++k) weights[t * K + k] /= s;
    }
  }
}

void MoeSortByExpert(int32_t* begin, int32_t* row_of, int32_t* token_of, const int32_t* routes,
                     int64_t N, int64_t K, int64_t E) {
  std::fill(begin, begin + E + 1, 0);
  for (int64_t i = 0; i < N; ++i) ++begin[routes[i] + 1];
  for (int64_t e = 0; e < E; ++e) begin[e + 1] += begin[e];
  std::vector<int32_t> cursor(begin, begin + E);
  for (int64_t i = 0; i < N; ++i) {
    const int32_t row = cursor[routes[i]]++;
    row_of[i] = row;
    token_of[row] = static_cast<int32_t>(i / K);
  }
}

void MoeGatherRows(float* x, const float* in, const int32_t* token_of, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    std::memcpy(x + r * C, in + static_cast<int64_t>(token_of[r]) * C, C * sizeof(float));
  }
}

void MoeCombine(float* out, const float* residual, const float* y, const float* w,
                const int32_t* row_of, int64_t T, int64_t K, int64_t C) {
#pragma omp parallel
  {
    std::vector<float> acc(C);  // one per thread
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t kk = 0; kk < K; ++kk) {
        const float wk = w[t * K + kk];
        const float* yr = y + static_cast<int64_t>(row_of[t * K + kk]) * C;
        for (int64_t i = 0; i < C; ++i) acc[i] += wk * yr[i];
      }
      for (int64_t i = 0; i < C; ++i) out[t * C + i] = residual[t * C + i] + acc[i];
    }
  }
}

void MoeCombineBackward(float* dy, float* dw, const float* d, const float* y, const float* w,
                        const int32_t* row_of, int64_t T, int64_t K, int64_t C) {
  // out_t = sum_k w_k y_row: dw_k = <dout_t, y_row>, dy_row = w_k dout_t.
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t kk = 0; kk < K; ++kk) {
      const int64_t row = row_of[t * K + kk];
      const float wk = w[t * K + kk];
      double dot = 0.0;
      for (int64_t i = 0; i < C; ++i) {
        dot += static_cast<double>(d[t * C + i]) * y[row * C + i];
        dy[row * C + i] = wk * d[t * C + i];
      }
      dw[t * K + kk] = static_cast<float>(dot);
    }
  }
}

void MoeRouterBackward(float* dlogits, const float* probs, const int32_t* routes, const float* w,
                       const float* dw, const float* aux_dprobs, int64_t T, int64_t E, int64_t K,
                       bool renormalise) {
  // w = p[routes] (/ S, S = sum_k p[routes_k], iff renormalise); p = softmax(logits).
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* pt = probs + t * E;
    const int32_t* rt = routes + t * K;
    double dp[kMaxExperts] = {};  // gradient at p (zero off the routes)
    if (renormalise) {
      double sum = 0.0, dw_dot_w = 0.0;
      for (int64_t kk = 0; kk < K; ++kk) {
        sum += pt[rt[kk]];
        dw_dot_w += static_cast<double>(dw[t * K + kk]) * w[t * K + kk];
      }
      for (int64_t kk = 0; kk < K; ++kk) dp[rt[kk]] = (dw[t * K + kk] - dw_dot_w) / sum;
    } else {
      for (int64_t kk = 0; kk < K; ++kk) dp[rt[kk]] = dw[t * K + kk];
    }
    double p_dot_dp = 0.0;
    if (aux_dprobs == nullptr) {  // dp is zero off the routes
      for (int64_t kk = 0; kk < K; ++kk) p_dot_dp += pt[rt[kk]] * dp[rt[kk]];
    } else {
      for (int64_t e = 0; e < E; ++e) {
        dp[e] += aux_dprobs[e];
        p_dot_dp += pt[e] * dp[e];
      }
    }
    for (int64_t e = 0; e < E; ++e) {
      dlogits[t * E + e] = static_cast<float>(pt[e] * (dp[e] - p_dot_dp));
    }
  }
}

void MoeScatterAddRows(float* dx, const float* dxs, const int32_t* row_of, int64_t T, int64_t K,
                       int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t kk = 0; kk < K; ++kk) {
      const float* src = dxs + static_cast<int64_t>(row_of[t * K + kk]) * C;
      for (int64_t i = 0; i < C; ++i) dx[t * C + i] += src[i];
    }
  }
}

}  // namespace prl::kernels::cpu
