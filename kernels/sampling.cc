#include "kernels/sampling.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"
#if PRL_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace prl::kernels {

Tensor SamplingRowsTensor(absl::Span<const SamplingRow> rows) {
  return Tensor(const_cast<SamplingRow*>(rows.data()), DType::kI32, Device::Cpu(),
                {static_cast<int64_t>(rows.size()), kSamplingRowWords});
}

void SampleTokens(const Tensor& tokens, const Tensor& logprobs, const Tensor& logits,
                  const Tensor& rows, bool split_vocabulary) {
  const char* op = "SampleTokens";
  const int64_t R = logits.size(0), V = logits.size(1);
  internal::ExpectTensor(op, "tokens", tokens, DType::kI32, {R});
  internal::ExpectTensor(op, "logprobs", logprobs, DType::kF32, {R});
  internal::ExpectTensor(op, "logits", logits, DType::kF32, {R, V});
  internal::ExpectTensor(op, "rows", rows, DType::kI32, {R, kSamplingRowWords});
  const Device device = internal::CommonDevice(op, {&tokens, &logprobs, &logits, &rows});
  const auto* row_data = static_cast<const SamplingRow*>(rows.data);
  (void)split_vocabulary;  // the CPU samples a row per thread
  if (device.is_cpu()) {
    return cpu::SampleTokens(tokens.i32(), logprobs.f32(), logits.f32(), row_data, R, V);
  }
#if PRL_WITH_CUDA
  return cuda::SampleTokens(device.index, tokens.i32(), logprobs.f32(), logits.f32(), row_data, R,
                            V, split_vocabulary);
#else
  internal::NoBackend(op, device);
#endif
}

std::vector<std::pair<int32_t, float>> TopLogprobs(absl::Span<const float> logits,
                                                   const SamplingRow& row, int32_t k) {
  return cpu::TopLogprobs(logits.data(), static_cast<int64_t>(logits.size()), row, k);
}

void SampleTokens(const Tensor& tokens, const Tensor& logprobs, const Tensor& logits,
                  absl::Span<const SamplingRow> rows) {
  PRL_CHECK(static_cast<int64_t>(rows.size()) == logits.size(0), "SampleTokens: ", rows.size(),
            " rows for ", logits.size(0), " logit rows");
  SampleTokens(tokens, logprobs, logits, SamplingRowsTensor(rows));
}

}  // namespace prl::kernels
