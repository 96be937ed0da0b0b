#include "model/lora_merge.h"

#include "core/check.h"

namespace prl {

namespace {

// The weight a target's adapter adds into, and the first row of its part.
std::pair<Tensor, int64_t> TargetWeight(const LayerParams& layer, LoraTarget target,
                                        const ModelConfig& config) {
  const LoraSite site = LoraSiteOf(target, config);
  switch (target) {
    case LoraTarget::kQ:
    case LoraTarget::kK:
    case LoraTarget::kV:
      return {layer.qkv_weight, site.out_col};
    case LoraTarget::kO:
      return {layer.o_weight, 0};
    case LoraTarget::kGate:
    case LoraTarget::kUp:
      return {layer.gate_up_weight, site.out_col};
    case LoraTarget::kDown:
      return {layer.down_weight, 0};
  }
  return {};
}

}  // namespace

void MergeLora(const LoraParams& adapter, const ModelConfig& config, const ModelParams& params) {
  PRL_CHECK(adapter.layers.size() == params.layers.size(), "MergeLora: layer counts differ");
  for (size_t l = 0; l < params.layers.size(); ++l) {
    for (int ti = 0; ti < kNumLoraTargets; ++ti) {
      const LoraTarget target = static_cast<LoraTarget>(ti);
      const LoraPair& pair = adapter.layers[l][target];
      if (!pair.defined()) continue;
      const LoraSite site = LoraSiteOf(target, config);
      const auto [weight, row0] = TargetWeight(params.layers[l], target, config);
      PRL_CHECK(weight.dtype == DType::kF32 && weight.device.is_cpu(),
                "MergeLora: F32 CPU weights");
      const int64_t r = pair.a.size(0);
      const float* a = pair.a.f32();
      const float* b = pair.b.f32();
      float* w = weight.f32();
#pragma omp parallel for schedule(static)
      for (int64_t o = 0; o < site.out; ++o) {
        for (int64_t i = 0; i < site.in; ++i) {
          double delta = 0;
          for (int64_t j = 0; j < r; ++j) {
            delta += static_cast<double>(b[o * r + j]) * a[j * site.in + i];
          }
          float& x = w[(row0 + o) * site.in + i];
          x = static_cast<float>(x + adapter.scale * delta);
        }
      }
    }
  }
}

}  // namespace prl
