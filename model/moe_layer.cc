#include "model/moe_layer.h"

#include <algorithm>
#include <vector>

#include "core/buffer.h"
#include "core/check.h"
#include "core/cuda_runtime.h"
#include "kernels/convert.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/swiglu.h"

namespace prl {

namespace k = kernels;

MoeActivations TakeMoeActivations(Arena& arena, const ModelConfig& c, int64_t T, DType dt) {
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
  a.x = arena.Take(dt, {N, C});
  a.gate_up = arena.Take(dt, {N, 2 * Im});
  a.act = arena.Take(dt, {N, Im});
  a.y = arena.Take(dt, {N, C});
  if (!arena.device().is_cpu()) a.forced = arena.Take(DType::kI32, {T, K});
  a.begin_host = std::make_shared<std::vector<int32_t>>(E + 1, 0);
  return a;
}

MoeScratch TakeMoeScratch(Arena& arena, const ModelConfig& c, int64_t T, DType dt) {
  const int64_t E = c.num_experts, K = c.num_experts_per_tok, Im = c.moe_intermediate_size;
  const int64_t C = c.hidden_size, N = T * K;
  MoeScratch s;
  s.dy = arena.Take(dt, {N, C});
  s.dact = arena.Take(dt, {N, Im});
  s.dgate_up = arena.Take(dt, {N, 2 * Im});
  s.dx = arena.Take(dt, {N, C});
  s.dlogits = arena.Take(DType::kF32, {T, E});
  s.dlogits_c = dt == DType::kF32 ? s.dlogits : arena.Take(dt, {T, E});
  s.dweights = arena.Take(DType::kF32, {T, K});
  s.aux = arena.Take(DType::kF32, {E});
  return s;
}

namespace {

// Expert e's matrix in an (E, rows, cols) stack (undefined for an undefined stack: a frozen
// weight's gradient).
Tensor Expert(const Tensor& stack, int64_t e) {
  if (!stack.defined()) return {};
  const int64_t rows = stack.size(1), cols = stack.size(2);
  return Tensor(static_cast<char*>(stack.data) + e * rows * cols * DTypeSize(stack.dtype),
                stack.dtype, stack.device, {rows, cols});
}

// Copies between the host and `device` (either way), ordered with the kernels queued on the
// calling thread's current stream there.
void Copy(void* dst, const void* src, size_t bytes, Device device) {
  if (device.is_cpu()) {
    std::copy_n(static_cast<const char*>(src), bytes, static_cast<char*>(dst));
    return;
  }
  const absl::Status status = cuda::MemcpyOnCurrentStream(device.index, dst, src, bytes);
  PRL_CHECK(status.ok(), "MoE layer: ", status.ToString());
}

}  // namespace

void MoeForward(const ModelConfig& c, k::ReductionOrder order, const LayerParams& p,
                const MoeActivations& a, const Tensor& x, const Tensor& residual, const Tensor& out,
                const int32_t* forced) {
  const int64_t T = x.size(0), E = c.num_experts, K = c.num_experts_per_tok;
  const Device device = x.device;
  k::MatmulForward(a.probs, x, p.router_weight, {}, /*accumulate=*/false, order);  // logits
  Tensor forced_routes;
  if (forced != nullptr) {
    if (device.is_cpu()) {
      forced_routes = Tensor(const_cast<int32_t*>(forced), DType::kI32, device, {T, K});
    } else {
      Copy(a.forced.data, forced, T * K * sizeof(int32_t), device);
      forced_routes = a.forced;
    }
  }
  k::MoeRoute(a.probs, a.recomputed, a.routes, a.weights, a.probs, forced_routes,
              c.norm_topk_prob);
  k::MoeSortByExpert(a.expert_begin, a.row_of, a.token_of, a.routes, E);
  std::vector<int32_t>& begin = *a.begin_host;
  Copy(begin.data(), a.expert_begin.data, (E + 1) * sizeof(int32_t), device);
  k::MoeGatherRows(a.x, x, a.token_of);
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
  k::MoeCombine(out, residual, a.y, a.weights, a.row_of);
}

void MoeBackward(const ModelConfig& c, const LayerParams& p, const LayerParams& g,
                 const MoeActivations& a, const Tensor& x, const Tensor& dout, const Tensor& dx,
                 const MoeScratch& s, const double* aux_dprobs) {
  const int64_t E = c.num_experts;
  k::MoeCombineBackward(s.dy, s.dweights, dout, a.y, a.weights, a.row_of);
  const std::vector<int32_t>& begin = *a.begin_host;
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
  Tensor aux;
  if (aux_dprobs != nullptr) {
    const std::vector<float> aux_host(aux_dprobs, aux_dprobs + E);
    Copy(s.aux.data, aux_host.data(), E * sizeof(float), x.device);
    aux = s.aux;
  }
  k::MoeRouterBackward(s.dlogits, a.probs, a.routes, a.weights, s.dweights, aux,
                       c.norm_topk_prob);
  if (s.dlogits_c.data != s.dlogits.data) k::ConvertDType(s.dlogits_c, s.dlogits);
  k::MatmulBackward(dx, g.router_weight, {}, s.dlogits_c, x, p.router_weight);
  // The experts' input gradients, gathered back to their tokens in k order.
  k::MoeScatterAddRows(dx, s.dx, a.row_of);
}

void MoeRoutesToHost(const MoeActivations& a, std::vector<int32_t>* routes,
                     std::vector<int32_t>* recomputed, std::vector<float>* probs) {
  const Device device = a.routes.device;
  auto copy = [&](auto* dst, const Tensor& t) {
    if (dst == nullptr) return;
    dst->resize(t.numel());
    Copy(dst->data(), t.data, t.bytes(), device);
  };
  copy(routes, a.routes);
  copy(recomputed, a.recomputed);
  copy(probs, a.probs);
}

}  // namespace prl
