#include "model/moe_layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "kernels/matmul.h"
#include "kernels/swiglu.h"

namespace prl {

namespace k = kernels;

MoeActivations TakeMoeActivations(Arena& arena, const ModelConfig& c, int64_t T) {
  const int64_t E = c.num_experts, K = c.num_experts_per_tok, Im = c.moe_intermediate_size;
  const int64_t C = c.hidden_size, N = T * K;
  MoeActivations a;
  a.probs = arena.Take(DType::kF32, {T, E});
  a.routes = arena.Take(DType::kI32, {T, K});
  a.recomputed = arena.Take(DType::kI32, {T, K});
  a.weights = arena.Take(DType::kF32, {T, K});
  a.row_of = arena.Take(DType::kI32, {N});
  a.token_of = arena.Take(DType::kI32, {N});
  a.expert_begin = arena.Take(DType::kI32, {E + 1});
  a.x = arena.Take(DType::kF32, {N, C});
  a.gate_up = arena.Take(DType::kF32, {N, 2 * Im});
  a.act = arena.Take(DType::kF32, {N, Im});
  a.y = arena.Take(DType::kF32, {N, C});
  return a;
}

MoeScratch TakeMoeScratch(Arena& arena, const ModelConfig& c, int64_t T) {
  const int64_t E = c.num_experts, K = c.num_experts_per_tok, Im = c.moe_intermediate_size;
  const int64_t C = c.hidden_size, N = T * K;
  MoeScratch s;
  s.dy = arena.Take(DType::kF32, {N, C});
  s.dact = arena.Take(DType::kF32, {N, Im});
  s.dgate_up = arena.Take(DType::kF32, {N, 2 * Im});
  s.dx = arena.Take(DType::kF32, {N, C});
  s.dlogits = arena.Take(DType::kF32, {T, E});
  s.dweights = arena.Take(DType::kF32, {T, K});
  return s;
}

namespace {

// Expert e's matrix in an (E, rows, cols) stack.
Tensor Expert(const Tensor& stack, int64_t e) {
  const int64_t rows = stack.size(1), cols = stack.size(2);
  return Tensor(stack.f32() + e * rows * cols, DType::kF32, stack.device, {rows, cols});
}

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

// Routes every token (router softmax, top-K or the forced experts, weights) and sorts the
// (token, k) pairs by expert.
void Route(const ModelConfig& c, const MoeActivations& a, int64_t T, const int32_t* forced) {
  const int64_t E = c.num_experts, K = c.num_experts_per_tok;
  float* probs = a.probs.f32();
  int32_t* routes = a.routes.i32();
  int32_t* recomputed = a.recomputed.i32();
  float* weights = a.weights.f32();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    float* p = probs + t * E;
    Softmax(p, E);
    TopK(p, E, K, recomputed + t * K);
    const int32_t* use = recomputed + t * K;
    if (forced != nullptr && forced[t * K] >= 0) use = forced + t * K;
    for (int64_t k = 0; k < K; ++k) {
      PRL_CHECK(use[k] >= 0 && use[k] < E, "replayed expert ", use[k], " of ", E);
      routes[t * K + k] = use[k];
      weights[t * K + k] = p[use[k]];
    }
    if (c.norm_topk_prob) {
      // transformers: routing_weights /= routing_weights.sum(-1), in fp32.
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s += weights[t * K + k];
      for (int64_t k = 0; k < K; ++k) weights[t * K + k] /= s;
    }
  }
  // Counting sort by expert; within an expert the rows keep token order.
  int32_t* begin = a.expert_begin.i32();
  std::fill(begin, begin + E + 1, 0);
  for (int64_t i = 0; i < T * K; ++i) ++begin[routes[i] + 1];
  for (int64_t e = 0; e < E; ++e) begin[e + 1] += begin[e];
  std::vector<int32_t> cursor(begin, begin + E);
  int32_t* row_of = a.row_of.i32();
  int32_t* token_of = a.token_of.i32();
  for (int64_t i = 0; i < T * K; ++i) {
    const int32_t row = cursor[routes[i]]++;
    row_of[i] = row;
    token_of[row] = static_cast<int32_t>(i / K);
  }
}

}  // namespace

void MoeForward(const ModelConfig& c, k::ReductionOrder order, const LayerParams& p,
                const MoeActivations& a, const Tensor& x, const Tensor& residual, const Tensor& out,
                const int32_t* forced) {
  PRL_CHECK(x.device.is_cpu() && x.dtype == DType::kF32,
            "the MoE block runs on the CPU in F32 only, found ", DTypeName(x.dtype), " on ",
            x.device.ToString());
  const int64_t T = x.size(0), C = c.hidden_size, E = c.num_experts, K = c.num_experts_per_tok;
  const int64_t N = T * K;
  k::MatmulForward(a.probs, x, p.router_weight, {}, /*accumulate=*/false, order);  // logits
  Route(c, a, T, forced);
  const int32_t* token_of = a.token_of.i32();
  const float* xs = x.f32();
  float* gathered = a.x.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    std::memcpy(gathered + r * C, xs + static_cast<int64_t>(token_of[r]) * C, C * sizeof(float));
  }
  const int32_t* begin = a.expert_begin.i32();
  for (int64_t e = 0; e < E; ++e) {
    if (begin[e] == begin[e + 1]) continue;
    k::MatmulForward(a.gate_up.Rows(begin[e], begin[e + 1]), a.x.Rows(begin[e], begin[e + 1]),
                     Expert(p.experts_gate_up, e), {}, false, order);
  }
  k::SwiGluForward(a.act, a.gate_up);
  for (int64_t e = 0; e < E; ++e) {
    if (begin[e] == begin[e + 1]) continue;
    k::MatmulForward(a.y.Rows(begin[e], begin[e + 1]), a.act.Rows(begin[e], begin[e + 1]),
                     Expert(p.experts_down, e), {}, false, order);
  }
  const int32_t* row_of = a.row_of.i32();
  const float* w = a.weights.f32();
  const float* y = a.y.f32();
  const float* res = residual.f32();
  float* o = out.f32();
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
      for (int64_t i = 0; i < C; ++i) o[t * C + i] = res[t * C + i] + acc[i];
    }
  }
}

void MoeBackward(const ModelConfig& c, const LayerParams& p, const LayerParams& g,
                 const MoeActivations& a, const Tensor& x, const Tensor& dout, const Tensor& dx,
                 const MoeScratch& s, const double* aux_dprobs) {
  const int64_t T = x.size(0), C = c.hidden_size, E = c.num_experts, K = c.num_experts_per_tok;
  const int32_t* row_of = a.row_of.i32();
  const int32_t* routes = a.routes.i32();
  const float* w = a.weights.f32();
  const float* probs = a.probs.f32();
  const float* y = a.y.f32();
  const float* d = dout.f32();
  float* dy = s.dy.f32();
  float* dw = s.dweights.f32();
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
  const int32_t* begin = a.expert_begin.i32();
  for (int64_t e = 0; e < E; ++e) {
    if (begin[e] == begin[e + 1]) continue;
    k::MatmulBackward(s.dact.Rows(begin[e], begin[e + 1]), Expert(g.experts_down, e), {},
                      s.dy.Rows(begin[e], begin[e + 1]), a.act.Rows(begin[e], begin[e + 1]),
                      Expert(p.experts_down, e));
  }
  k::SwiGluBackward(s.dgate_up, s.dact, a.gate_up);
  for (int64_t e = 0; e < E; ++e) {
    if (begin[e] == begin[e + 1]) continue;
    k::MatmulBackward(s.dx.Rows(begin[e], begin[e + 1]), Expert(g.experts_gate_up, e), {},
                      s.dgate_up.Rows(begin[e], begin[e + 1]), a.x.Rows(begin[e], begin[e + 1]),
                      Expert(p.experts_gate_up, e));
  }
  // Router: w = p[routes] (/ S, S = sum_k p[routes_k], iff norm_topk_prob); p = softmax(logits).
  float* dlogits = s.dlogits.f32();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* pt = probs + t * E;
    const int32_t* rt = routes + t * K;
    double dp[kMaxExperts] = {};  // gradient at p (zero off the routes)
    if (c.norm_topk_prob) {
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
  k::MatmulBackward(dx, g.router_weight, {}, s.dlogits, x, p.router_weight);
  // The experts' input gradients, gathered back to their tokens in k order.
  const float* dxs = s.dx.f32();
  float* dxo = dx.f32();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t kk = 0; kk < K; ++kk) {
      const float* src = dxs + static_cast<int64_t>(row_of[t * K + kk]) * C;
      for (int64_t i = 0; i < C; ++i) dxo[t * C + i] += src[i];
    }
  }
}

}  // namespace prl
