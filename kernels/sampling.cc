#include "kernels/sampling.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"

namespace prl::kernels {

void SampleTokens(const Tensor& tokens, const Tensor& logprobs, const Tensor& logits,
                  absl::Span<const SamplingRow> rows) {
  const char* op = "SampleTokens";
  const int64_t R = logits.size(0), V = logits.size(1);
  internal::ExpectTensor(op, "tokens", tokens, DType::kI32, {R});
  internal::ExpectTensor(op, "logprobs", logprobs, DType::kF32, {R});
  internal::ExpectTensor(op, "logits", logits, DType::kF32, {R, V});
  PRL_CHECK(static_cast<int64_t>(rows.size()) == R, op, ": ", rows.size(), " rows for ", R,
            " logit rows");
  const Device device = internal::CommonDevice(op, {&tokens, &logprobs, &logits});
  if (device.is_cpu()) {
    return cpu::SampleTokens(tokens.i32(), logprobs.f32(), logits.f32(), rows.data(), R, V);
  }
  internal::NoBackend(op, device);
}

}  // namespace prl::kernels
