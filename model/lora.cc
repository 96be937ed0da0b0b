#include "model/lora.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/cuda_runtime.h"
#include "core/status_macros.h"

namespace prl {
namespace {

constexpr const char* kTargetNames[kNumLoraTargets] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                       "gate_proj", "up_proj", "down_proj"};
constexpr int64_t kMaxRank = 1024;

bool IsAttention(LoraTarget t) { return static_cast<int>(t) <= static_cast<int>(LoraTarget::kO); }

}  // namespace

const char* LoraTargetName(LoraTarget target) { return kTargetNames[static_cast<int>(target)]; }

double LoraScale(const LoraConfig& lora) {
  const double r = static_cast<double>(lora.rank);
  return lora.rslora ? lora.alpha / std::sqrt(r) : lora.alpha / r;
}

std::string LoraFingerprint(const LoraConfig& lora) {
  return absl::StrCat("r=", lora.rank, " alpha=", lora.alpha, " rslora=", lora.rslora ? 1 : 0,
                      " targets=", absl::StrJoin(lora.target_modules, ","));
}

LoraSite LoraSiteOf(LoraTarget target, const ModelConfig& m) {
  const int64_t C = m.hidden_size, I = m.intermediate_size;
  switch (target) {
    case LoraTarget::kQ:
      return {C, m.q_dim(), 0};
    case LoraTarget::kK:
      return {C, m.kv_dim(), m.q_dim()};
    case LoraTarget::kV:
      return {C, m.kv_dim(), m.q_dim() + m.kv_dim()};
    case LoraTarget::kO:
      return {m.q_dim(), C, 0};
    case LoraTarget::kGate:
      return {C, I, 0};
    case LoraTarget::kUp:
      return {C, I, I};
    case LoraTarget::kDown:
      return {I, C, 0};
  }
  return {};
}

absl::StatusOr<std::array<bool, kNumLoraTargets>> LoraTargets(const LoraConfig& lora,
                                                              const ModelConfig& model) {
  if (lora.rank < 1 || lora.rank > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora.rank: expected 1 to ", kMaxRank, ", found ", lora.rank));
  }
  if (!(lora.alpha > 0.0) || !std::isfinite(lora.alpha)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora.alpha: expected a finite number > 0, found ", lora.alpha));
  }
  if (lora.target_modules.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("lora.target_modules: expected at least one of ",
                                                   absl::StrJoin(kTargetNames, ", "),
                                                   " or all-linear, found none"));
  }
  std::array<bool, kNumLoraTargets> on{};
  for (const std::string& name : lora.target_modules) {
    if (name == "all-linear") {
      on.fill(true);
      continue;
    }
    bool known = false;
    for (int t = 0; t < kNumLoraTargets; ++t) {
      if (name == kTargetNames[t]) {
        if (on[t] && lora.target_modules.size() > 1) {
          return absl::InvalidArgumentError(
              absl::StrCat("lora.target_modules: ", name, " is named twice"));
        }
        on[t] = known = true;
      }
    }
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("lora.target_modules: expected ",
                                                     absl::StrJoin(kTargetNames, ", "),
                                                     " or all-linear, found '", name, "'"));
    }
  }
  const bool mlp = on[4] || on[5] || on[6];
  if (mlp && model.has_moe()) {
    for (int64_t l = 0; l < model.num_hidden_layers; ++l) {
      if (model.IsMoeLayer(l)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "lora.target_modules: gate_proj, up_proj and down_proj name the dense MLP, and layer ",
            l,
            " of this Qwen3-MoE model is sparse (its experts take no adapters); target the "
            "attention projections (q_proj, k_proj, v_proj, o_proj)"));
      }
    }
  }
  for (int t = 0; t < kNumLoraTargets; ++t) {
    if (!on[t]) continue;
    const LoraSite site = LoraSiteOf(static_cast<LoraTarget>(t), model);
    if (lora.rank > std::min(site.in, site.out)) {
      return absl::InvalidArgumentError(
          absl::StrCat("lora.rank: expected at most ", std::min(site.in, site.out), " (",
                       kTargetNames[t], " is ", site.out, " x ", site.in, "), found ", lora.rank));
    }
  }
  return on;
}

absl::Status ValidateLoraConfig(const LoraConfig& lora, const ModelConfig& model) {
  return LoraTargets(lora, model).status();
}

absl::StatusOr<LoraLayout> LoraLayout::Make(const ModelConfig& model, const LoraConfig& lora) {
  PRL_ASSIGN_OR_RETURN(const auto on, LoraTargets(lora, model));
  LoraLayout layout;
  layout.model_ = model;
  layout.lora_ = lora;
  const int64_t r = lora.rank;
  for (int64_t l = 0; l < model.num_hidden_layers; ++l) {
    for (int t = 0; t < kNumLoraTargets; ++t) {
      if (!on[t]) continue;
      const LoraTarget target = static_cast<LoraTarget>(t);
      const LoraSite site = LoraSiteOf(target, model);
      const std::string prefix =
          absl::StrCat("base_model.model.model.layers.", l,
                       IsAttention(target) ? ".self_attn." : ".mlp.", kTargetNames[t]);
      for (const bool is_a : {true, false}) {
        LoraEntry e;
        e.name = absl::StrCat(prefix, is_a ? ".lora_A.weight" : ".lora_B.weight");
        e.shape = is_a ? std::vector<int64_t>{r, site.in} : std::vector<int64_t>{site.out, r};
        e.numel = e.shape[0] * e.shape[1];
        e.offset = layout.num_elements_;
        e.layer = l;
        e.target = target;
        e.is_a = is_a;
        layout.num_elements_ += e.numel;
        layout.entries_.push_back(std::move(e));
      }
    }
  }
  return layout;
}

LoraParams LoraLayout::Bind(float* base, Device device) const {
  LoraParams p;
  p.layers.resize(model_.num_hidden_layers);
  p.scale = LoraScale(lora_);
  p.rank = lora_.rank;
  for (const LoraEntry& e : entries_) {
    LoraPair& pair = p.layers[e.layer].modules[static_cast<int>(e.target)];
    (e.is_a ? pair.a : pair.b) =
        Tensor(base + e.offset, DType::kF32, device, {e.shape[0], e.shape[1]});
  }
  return p;
}

absl::StatusOr<LoraSet> LoraSet::Allocate(const ModelConfig& model, const LoraConfig& lora,
                                          Device device, bool zeroed) {
  PRL_ASSIGN_OR_RETURN(LoraLayout layout, LoraLayout::Make(model, lora));
  const size_t bytes = static_cast<size_t>(layout.num_elements()) * sizeof(float);
  PRL_ASSIGN_OR_RETURN(Buffer buffer, zeroed ? Buffer::AllocateZeroed(device, bytes)
                                             : Buffer::Allocate(device, bytes));
  LoraSet set{model, lora, std::move(layout), std::move(buffer), {}};
  set.params = set.layout.Bind(set.data(), device);
  return set;
}

absl::StatusOr<LoraSet> LoraSet::CopyTo(Device device) const {
  PRL_ASSIGN_OR_RETURN(LoraSet copy, Allocate(model, lora, device, /*zeroed=*/false));
  PRL_RETURN_IF_ERROR(
      CopyBytes(copy.buffer.data(), device, buffer.data(), buffer.device(), buffer.bytes()));
  // A copy from pageable host memory may return before its DMA lands, and the engine's stream is
  // not ordered with the copy's: the copy is whole when this returns.
  if (device.is_cuda()) PRL_RETURN_IF_ERROR(cuda::Synchronize(device.index));
  return copy;
}

absl::Status ValidateLoraParams(const LoraParams& params, const ModelConfig& model, Device device) {
  if (static_cast<int64_t>(params.layers.size()) != model.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA adapter: ", params.layers.size(),
                                                   " layers for a model of ",
                                                   model.num_hidden_layers));
  }
  for (int64_t l = 0; l < model.num_hidden_layers; ++l) {
    for (int t = 0; t < kNumLoraTargets; ++t) {
      const LoraPair& p = params.layers[l].modules[t];
      if (!p.defined()) continue;
      const LoraSite site = LoraSiteOf(static_cast<LoraTarget>(t), model);
      const bool fits = p.a.rank == 2 && p.b.rank == 2 && p.a.size(0) == params.rank &&
                        p.a.size(1) == site.in && p.b.size(0) == site.out &&
                        p.b.size(1) == params.rank && p.a.dtype == DType::kF32 &&
                        p.b.dtype == DType::kF32 && p.a.device == device && p.b.device == device;
      if (!fits) {
        return absl::InvalidArgumentError(
            absl::StrCat("LoRA adapter: layer ", l, " ", kTargetNames[t], ": expected F32 A ",
                         params.rank, " x ", site.in, " and B ", site.out, " x ", params.rank,
                         " on ", device.ToString(), ", found A ", p.a.ShapeString(), " and B ",
                         p.b.ShapeString(), " ", DTypeName(p.a.dtype), " on ",
                         p.a.device.ToString(), " (an adapter of another model?)"));
      }
    }
  }
  return absl::OkStatus();
}

void InitializeLora(const LoraSet& set, uint64_t seed) {
  PRL_CHECK(set.buffer.device().is_cpu(), "InitializeLora: a CPU set, found ",
            set.buffer.device().ToString());
  for (size_t i = 0; i < set.layout.entries().size(); ++i) {
    const LoraEntry& e = set.layout.entries()[i];
    float* w = set.data() + e.offset;
    if (!e.is_a) {
      std::fill(w, w + e.numel, 0.0f);
      continue;
    }
    // One stream per tensor; uniform doubles from the top 53 bits (the same on every machine).
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + i);
    const double bound = 1.0 / std::sqrt(static_cast<double>(e.shape[1]));
    for (int64_t j = 0; j < e.numel; ++j) {
      const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
      w[j] = static_cast<float>((2.0 * u - 1.0) * bound);
    }
  }
}

}  // namespace prl
