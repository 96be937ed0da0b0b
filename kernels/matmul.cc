#include "kernels/matmul.h"

#include "kernels/convert.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"
#if PRL_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm_skinny.h"
#endif

namespace prl::kernels {

using internal::ExpectTensor;

#if PRL_WITH_CUDA
namespace {
// cuBLASLt arguments of out (M, N) = a (M, K) . w (N, K)^T, row-major, contiguous.
cuda::GemmArgs LinearGemm(const Tensor& out, const Tensor& a, const Tensor& w, DType dt,
                          DType out_dt) {
  return cuda::LinearGemmArgs(a.size(0), w.size(0), a.size(1), a.data, w.data, out.data, dt,
                              out_dt);
}
}  // namespace
#endif

void MatmulForward(const Tensor& out, const Tensor& a, const Tensor& w, const Tensor& bias,
                   bool accumulate, ReductionOrder order) {
  const char* op = "MatmulForward";
  const int64_t M = a.size(0), K = a.size(1), N = w.size(0);
  const DType dt = internal::ActivationDType(a);
  // On CUDA a BF16 product may be written as F32 (the LM head's logits).
  const DType out_dt =
      a.device.is_cuda() && dt == DType::kBF16 && out.dtype == DType::kF32 ? DType::kF32 : dt;
  ExpectTensor(op, "out", out, out_dt, {M, N});
  ExpectTensor(op, "a", a, dt, {M, K});
  ExpectTensor(op, "w", w, dt, {N, K});
  if (bias.defined()) ExpectTensor(op, "bias", bias, dt, {N});
  const Device device = internal::CommonDevice(op, {&out, &a, &w, &bias});
  if (device.is_cpu()) {
    const float* b = bias.defined() ? bias.f32() : nullptr;
    if (order == ReductionOrder::kBatchInvariant) {
      return cpu::MatmulForwardInvariant(out.f32(), a.f32(), w.f32(), b, M, N, K, accumulate);
    }
    return cpu::MatmulForward(out.f32(), a.f32(), w.f32(), b, M, N, K, accumulate);
  }
#if PRL_WITH_CUDA
  // cuBLASLt picks algorithms (and split-K) by shape: the batch-invariant order has its own
  // kernel (kernels/cuda/gemm_invariant.cu).
  if (order == ReductionOrder::kBatchInvariant) {
    return cuda::InvariantGemm(device.index, dt, out_dt, out.data, a.data, w.data,
                               bias.defined() ? bias.data : nullptr, M, N, K, accumulate);
  }
  cuda::GemmArgs g = LinearGemm(out, a, w, dt, out_dt);
  g.beta = accumulate ? 1.0f : 0.0f;
  g.bias = bias.defined() ? bias.data : nullptr;
  return cuda::Gemm(device.index, cuda::CurrentStream(device.index), g);
#else
  internal::NoBackend(op, device);
#endif
}

void SetGemmAlgorithmSearch(bool on) {
#if PRL_WITH_CUDA
  cuda::SetGemmAlgorithmSearch(on);
#else
  (void)on;
#endif
}

void SetSkinnyGemm(bool on) {
#if PRL_WITH_CUDA
  cuda::SetSkinnyGemm(on);
#else
  (void)on;
#endif
}

void SetTensorCoreInvariantGemm(bool on) {
#if PRL_WITH_CUDA
  cuda::SetTensorCoreInvariantGemm(on);
#else
  (void)on;
#endif
}

bool TensorCoreInvariantGemm() {
#if PRL_WITH_CUDA
  return cuda::TensorCoreInvariantGemm();
#else
  return false;
#endif
}

bool GemmAlgorithmSearch() {
#if PRL_WITH_CUDA
  return cuda::GemmAlgorithmSearch();
#else
  return false;
#endif
}

void MatmulResidualForward(const Tensor& out, const Tensor& a, const Tensor& w,
                           const Tensor& residual, ReductionOrder order) {
  const char* op = "MatmulResidualForward";
  const DType dt = internal::ActivationDType(a);
  ExpectTensor(op, "residual", residual, dt, {a.size(0), w.size(0)});
  const Device device = internal::CommonDevice(op, {&out, &a, &w, &residual});
#if PRL_WITH_CUDA
  if (device.is_cuda() && order == ReductionOrder::kFast) {
    const int64_t M = a.size(0), K = a.size(1), N = w.size(0);
    ExpectTensor(op, "out", out, dt, {M, N});
    ExpectTensor(op, "a", a, dt, {M, K});
    ExpectTensor(op, "w", w, dt, {N, K});
    cuda::GemmArgs g = LinearGemm(out, a, w, dt, dt);
    g.c = residual.data;
    g.beta = 1.0f;
    return cuda::Gemm(device.index, cuda::CurrentStream(device.index), g);
  }
#endif
  (void)device;
  if (out.data != residual.data) ConvertDType(out, residual);
  MatmulForward(out, a, w, {}, /*accumulate=*/true, order);
}

void MatmulBackward(const Tensor& da, const Tensor& dw, const Tensor& dbias, const Tensor& dout,
                    const Tensor& a, const Tensor& w) {
  const char* op = "MatmulBackward";
  const int64_t M = a.size(0), K = a.size(1), N = w.size(0);
  const DType dt = internal::ActivationDType(a);
  // Weight gradients accumulate in F32 (or the activations' dtype) on CUDA.
  const DType dw_dt = dw.device.is_cuda() && dw.dtype == DType::kF32 ? DType::kF32 : dt;
  if (da.defined()) ExpectTensor(op, "da", da, dt, {M, K});
  if (dw.defined()) ExpectTensor(op, "dw", dw, dw_dt, {N, K});
  if (dbias.defined()) ExpectTensor(op, "dbias", dbias, DType::kF32, {N});
  ExpectTensor(op, "dout", dout, dt, {M, N});
  ExpectTensor(op, "a", a, dt, {M, K});
  ExpectTensor(op, "w", w, dt, {N, K});
  const Device device = internal::CommonDevice(op, {&da, &dw, &dbias, &dout, &a, &w});
  if (device.is_cpu()) {
    return cpu::MatmulBackward(da.defined() ? da.f32() : nullptr,
                               dw.defined() ? dw.f32() : nullptr,
                               dbias.defined() ? dbias.f32() : nullptr, dout.f32(), a.f32(),
                               w.f32(), M, N, K);
  }
#if PRL_WITH_CUDA
  if (da.defined()) {  // da (M, K) = dout (M, N) . w (N, K)
    cuda::GemmArgs g;
    g.M = M;
    g.N = K;
    g.K = N;
    g.a = dout.data;
    g.lda = N;
    g.b = w.data;
    g.ldb = K;
    g.d = da.data;
    g.ldd = K;
    g.ab_dtype = g.d_dtype = dt;
    cuda::Gemm(device.index, cuda::CurrentStream(device.index), g);
  }
  if (dw.defined()) {  // dw (N, K) += dout^T (N, M) . a (M, K)
    cuda::GemmArgs g;
    g.trans_a = true;
    g.M = N;
    g.N = K;
    g.K = M;
    g.a = dout.data;
    g.lda = N;
    g.b = a.data;
    g.ldb = K;
    g.d = dw.data;
    g.ldd = K;
    g.ab_dtype = dt;
    g.d_dtype = dw_dt;
    g.beta = 1;
    cuda::Gemm(device.index, cuda::CurrentStream(device.index), g);
  }
  if (dbias.defined()) cuda::ColumnSums(device.index, dt, dbias.f32(), dout.data, M, N);
  return;
#else
  internal::NoBackend(op, device);
#endif
}

}  // namespace prl::kernels
