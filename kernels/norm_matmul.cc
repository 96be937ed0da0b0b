#include "kernels/norm_matmul.h"

#include "kernels/dispatch.h"
#if PRL_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm_skinny.h"
#endif

namespace prl::kernels {

#if PRL_WITH_CUDA
namespace {
cuda::GemmArgs NormGemm(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias) {
  cuda::GemmArgs g = cuda::LinearGemmArgs(x.size(0), w.size(0), x.size(1), x.data, w.data,
                                          out.data, x.dtype, out.dtype);
  g.bias = bias.defined() ? bias.data : nullptr;
  return g;
}
}  // namespace
#endif

bool NormMatmulSupported(const Tensor& out, const Tensor& x, const Tensor& g, const Tensor& w,
                         const Tensor& bias, ReductionOrder order) {
#if PRL_WITH_CUDA
  if (order != ReductionOrder::kFast || !x.device.is_cuda() || x.dtype != DType::kBF16 ||
      g.dtype != DType::kBF16 || w.dtype != DType::kBF16 || x.rank != 2 || w.rank != 2 ||
      g.numel() != x.size(1) || w.size(1) != x.size(1) || out.rank != 2 ||
      out.size(0) != x.size(0) || out.size(1) != w.size(0) ||
      (out.dtype != DType::kBF16 && out.dtype != DType::kF32) ||
      (bias.defined() && (bias.dtype != out.dtype || bias.numel() != w.size(0)))) {
    return false;
  }
  for (const Tensor* t : {&out, &g, &w, &bias}) {
    if (t->defined() && t->device != x.device) return false;
  }
  return cuda::SkinnyNormGemmSupported(NormGemm(out, x, w, bias), g.data);
#else
  (void)out, (void)x, (void)g, (void)w, (void)bias, (void)order;
  return false;
#endif
}

void NormMatmulForward(const Tensor& out, const Tensor& x, const Tensor& g, float eps,
                       const Tensor& w, const Tensor& bias) {
  PRL_CHECK(NormMatmulSupported(out, x, g, w, bias, ReductionOrder::kFast),
            "NormMatmulForward: unsupported operands (NormMatmulSupported is false)");
#if PRL_WITH_CUDA
  const int device = x.device.index;
  cuda::SkinnyNormGemmRun(device, cuda::CurrentStream(device), NormGemm(out, x, w, bias), g.data,
                          eps);
#else
  (void)eps;
#endif
}

}  // namespace prl::kernels
