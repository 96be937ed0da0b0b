#include "kernels/moe.h"

#include "kernels/cpu/moe.h"
#include "kernels/dispatch.h"
#if PRL_WITH_CUDA
#include "kernels/cuda/moe.h"
#endif

namespace prl::kernels {

using internal::ExpectTensor;

void MoeRoute(const Tensor& probs, const Tensor& recomputed, const Tensor& routes,
              const Tensor& weights, const Tensor& logits, const Tensor& forced, bool renormalise) {
  const char* op = "MoeRoute";
  const int64_t T = logits.size(0), E = logits.size(1), K = routes.size(1);
  ExpectTensor(op, "logits", logits, DType::kF32, {T, E});
  ExpectTensor(op, "probs", probs, DType::kF32, {T, E});
  ExpectTensor(op, "recomputed", recomputed, DType::kI32, {T, K});
  ExpectTensor(op, "routes", routes, DType::kI32, {T, K});
  ExpectTensor(op, "weights", weights, DType::kF32, {T, K});
  if (forced.defined()) ExpectTensor(op, "forced", forced, DType::kI32, {T, K});
  const Device device =
      internal::CommonDevice(op, {&probs, &recomputed, &routes, &weights, &logits, &forced});
  const int32_t* forced_ids = forced.defined() ? forced.i32() : nullptr;
  if (device.is_cpu()) {
    return cpu::MoeRoute(probs.f32(), recomputed.i32(), routes.i32(), weights.f32(), logits.f32(),
                         forced_ids, T, E, K, renormalise);
  }
#if PRL_WITH_CUDA
  return cuda::MoeRoute(device.index, probs.f32(), recomputed.i32(), routes.i32(), weights.f32(),
                        logits.f32(), forced_ids, T, E, K, renormalise);
#else
  internal::NoBackend(op, device);
#endif
}

void MoeSortByExpert(const Tensor& expert_begin, const Tensor& row_of, const Tensor& token_of,
                     const Tensor& routes, int64_t E) {
  const char* op = "MoeSortByExpert";
  const int64_t T = routes.size(0), K = routes.size(1), N = T * K;
  ExpectTensor(op, "routes", routes, DType::kI32, {T, K});
  ExpectTensor(op, "expert_begin", expert_begin, DType::kI32, {E + 1});
  ExpectTensor(op, "row_of", row_of, DType::kI32, {N});
  ExpectTensor(op, "token_of", token_of, DType::kI32, {N});
  const Device device = internal::CommonDevice(op, {&expert_begin, &row_of, &token_of, &routes});
  if (device.is_cpu()) {
    return cpu::MoeSortByExpert(expert_begin.i32(), row_of.i32(), token_of.i32(), routes.i32(), N,
                                K, E);
  }
#if PRL_WITH_CUDA
  return cuda::MoeSortByExpert(device.index, expert_begin.i32(), row_of.i32(), token_of.i32(),
                               routes.i32(), N, K, E);
#else
  internal::NoBackend(op, device);
#endif
}

void MoeGatherRows(const Tensor& x, const Tensor& in, const Tensor& token_of) {
  const char* op = "MoeGatherRows";
  const int64_t T = in.size(0), C = in.size(1), N = x.size(0);
  const DType dt = internal::ActivationDType(in);
  ExpectTensor(op, "in", in, dt, {T, C});
  ExpectTensor(op, "x", x, dt, {N, C});
  ExpectTensor(op, "token_of", token_of, DType::kI32, {N});
  const Device device = internal::CommonDevice(op, {&x, &in, &token_of});
  if (device.is_cpu()) return cpu::MoeGatherRows(x.f32(), in.f32(), token_of.i32(), N, C);
#if PRL_WITH_CUDA
  return cuda::MoeGatherRows(device.index, dt, x.data, in.data, token_of.i32(), N, C);
#else
  internal::NoBackend(op, device);
#endif
}

void MoeCombine(const Tensor& out, const Tensor& residual, const Tensor& y, const Tensor& weights,
                const Tensor& row_of) {
  const char* op = "MoeCombine";
  const int64_t T = residual.size(0), C = residual.size(1), K = weights.size(1), N = T * K;
  const DType dt = internal::ActivationDType(residual);
  ExpectTensor(op, "residual", residual, dt, {T, C});
  ExpectTensor(op, "out", out, dt, {T, C});
  ExpectTensor(op, "y", y, dt, {N, C});
  ExpectTensor(op, "weights", weights, DType::kF32, {T, K});
  ExpectTensor(op, "row_of", row_of, DType::kI32, {N});
  const Device device = internal::CommonDevice(op, {&out, &residual, &y, &weights, &row_of});
  if (device.is_cpu()) {
    return cpu::MoeCombine(out.f32(), residual.f32(), y.f32(), weights.f32(), row_of.i32(), T, K,
                           C);
  }
#if PRL_WITH_CUDA
  return cuda::MoeCombine(device.index, dt, out.data, residual.data, y.data, weights.f32(),
                          row_of.i32(), T, K, C);
#else
  internal::NoBackend(op, device);
#endif
}

void MoeCombineBackward(const Tensor& dy, const Tensor& dweights, const Tensor& dout,
                        const Tensor& y, const Tensor& weights, const Tensor& row_of) {
  const char* op = "MoeCombineBackward";
  const int64_t T = dout.size(0), C = dout.size(1), K = weights.size(1), N = T * K;
  const DType dt = internal::ActivationDType(dout);
  ExpectTensor(op, "dout", dout, dt, {T, C});
  ExpectTensor(op, "y", y, dt, {N, C});
  ExpectTensor(op, "dy", dy, dt, {N, C});
  ExpectTensor(op, "weights", weights, DType::kF32, {T, K});
  ExpectTensor(op, "dweights", dweights, DType::kF32, {T, K});
  ExpectTensor(op, "row_of", row_of, DType::kI32, {N});
  const Device device =
      internal::CommonDevice(op, {&dy, &dweights, &dout, &y, &weights, &row_of});
  if (device.is_cpu()) {
    return cpu::MoeCombineBackward(dy.f32(), dweights.f32(), dout.f32(), y.f32(), weights.f32(),
                                   row_of.i32(), T, K, C);
  }
#if PRL_WITH_CUDA
  return cuda::MoeCombineBackward(device.index, dt, dy.data, dweights.f32(), dout.data, y.data,
                                  weights.f32(), row_of.i32(), T, K, C);
#else
  internal::NoBackend(op, device);
#endif
}

void MoeRouterBackward(const Tensor& dlogits, const Tensor& probs, const Tensor& routes,
                       const Tensor& weights, const Tensor& dweights, const Tensor& aux_dprobs,
                       bool renormalise) {
  const char* op = "MoeRouterBackward";
  const int64_t T = probs.size(0), E = probs.size(1), K = routes.size(1);
  ExpectTensor(op, "probs", probs, DType::kF32, {T, E});
  ExpectTensor(op, "dlogits", dlogits, DType::kF32, {T, E});
  ExpectTensor(op, "routes", routes, DType::kI32, {T, K});
  ExpectTensor(op, "weights", weights, DType::kF32, {T, K});
  ExpectTensor(op, "dweights", dweights, DType::kF32, {T, K});
  if (aux_dprobs.defined()) ExpectTensor(op, "aux_dprobs", aux_dprobs, DType::kF32, {E});
  const Device device = internal::CommonDevice(
      op, {&dlogits, &probs, &routes, &weights, &dweights, &aux_dprobs});
  const float* aux = aux_dprobs.defined() ? aux_dprobs.f32() : nullptr;
  if (device.is_cpu()) {
    return cpu::MoeRouterBackward(dlogits.f32(), probs.f32(), routes.i32(), weights.f32(),
                                  dweights.f32(), aux, T, E, K, renormalise);
  }
#if PRL_WITH_CUDA
  return cuda::MoeRouterBackward(device.index, dlogits.f32(), probs.f32(), routes.i32(),
                                 weights.f32(), dweights.f32(), aux, T, E, K, renormalise);
#else
  internal::NoBackend(op, device);
#endif
}

void MoeScatterAddRows(const Tensor& dx, const Tensor& dxs, const Tensor& row_of) {
  const char* op = "MoeScatterAddRows";
  const int64_t T = dx.size(0), C = dx.size(1), N = dxs.size(0), K = T > 0 ? N / T : 0;
  const DType dt = internal::ActivationDType(dx);
  ExpectTensor(op, "dx", dx, dt, {T, C});
  ExpectTensor(op, "dxs", dxs, dt, {T * K, C});
  ExpectTensor(op, "row_of", row_of, DType::kI32, {T * K});
  const Device device = internal::CommonDevice(op, {&dx, &dxs, &row_of});
  if (device.is_cpu()) return cpu::MoeScatterAddRows(dx.f32(), dxs.f32(), row_of.i32(), T, K, C);
#if PRL_WITH_CUDA
  return cuda::MoeScatterAddRows(device.index, dt, dx.data, dxs.data, row_of.i32(), T, K, C);
#else
  internal::NoBackend(op, device);
#endif
}

}  // namespace prl::kernels
