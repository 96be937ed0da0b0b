#include "model/parameters.h"

#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/convert.h"

namespace prl {

ParameterLayout::ParameterLayout(const ModelConfig& config) : config_(config) {
  const int64_t C = config.hidden_size, I = config.intermediate_size, V = config.vocab_size;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    index_.emplace(name, entries_.size());
    entries_.push_back({std::move(name), std::move(shape), num_elements_, numel});
    num_elements_ += numel;
  };
  add("model.embed_tokens.weight", {V, C});
  unit_ranges_.push_back({0, num_elements_});
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const int64_t begin = num_elements_;
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add(p + "input_layernorm.weight", {C});
    add(p + "self_attn.q_proj.weight", {config.q_dim(), C});
    add(p + "self_attn.k_proj.weight", {config.kv_dim(), C});
    add(p + "self_attn.v_proj.weight", {config.kv_dim(), C});
    if (config.qkv_bias) {
      add(p + "self_attn.q_proj.bias", {config.q_dim()});
      add(p + "self_attn.k_proj.bias", {config.kv_dim()});
      add(p + "self_attn.v_proj.bias", {config.kv_dim()});
    }
    add(p + "self_attn.o_proj.weight", {C, config.q_dim()});
    if (config.o_bias) add(p + "self_attn.o_proj.bias", {C});
    if (config.qk_norm) {
      add(p + "self_attn.q_norm.weight", {config.head_dim});
      add(p + "self_attn.k_norm.weight", {config.head_dim});
    }
    add(p + "post_attention_layernorm.weight", {C});
    if (config.IsMoeLayer(l)) {
      const int64_t E = config.num_experts, Im = config.moe_intermediate_size;
      add(p + "mlp.gate.weight", {E, C});
      for (int64_t e = 0; e < E; ++e) {
        add(absl::StrCat(p, "mlp.experts.", e, ".gate_proj.weight"), {Im, C});
        add(absl::StrCat(p, "mlp.experts.", e, ".up_proj.weight"), {Im, C});
      }
      for (int64_t e = 0; e < E; ++e) {
        add(absl::StrCat(p, "mlp.experts.", e, ".down_proj.weight"), {C, Im});
      }
    } else {
      add(p + "mlp.gate_proj.weight", {I, C});
      add(p + "mlp.up_proj.weight", {I, C});
      add(p + "mlp.down_proj.weight", {C, I});
    }
    unit_ranges_.push_back({begin, num_elements_});
  }
  const int64_t begin = num_elements_;
  add("model.norm.weight", {C});
  if (!config.tie_word_embeddings) add("lm_head.weight", {V, C});
  unit_ranges_.push_back({begin, num_elements_});
}

const ParamEntry* ParameterLayout::Find(absl::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &entries_[it->second];
}

ModelParams ParameterLayout::Bind(float* base, Device device) const {
  return Bind(base, DType::kF32, device);
}

ModelParams ParameterLayout::Bind(void* base, DType dtype, Device device) const {
  ModelParams p;
  p.layers.resize(config_.num_hidden_layers);
  const int64_t element = static_cast<int64_t>(DTypeSize(dtype));
  for (int u = 0; u < num_units(); ++u) {
    BindUnit(u, static_cast<char*>(base) + unit_ranges_[u].first * element, dtype, device, &p);
  }
  return p;
}

void ParameterLayout::BindUnit(int unit, float* unit_base, Device device, ModelParams* p) const {
  BindUnit(unit, static_cast<void*>(unit_base), DType::kF32, device, p);
}

void ParameterLayout::BindUnit(int unit, void* unit_base, DType dtype, Device device,
                               ModelParams* p) const {
  const ModelConfig& c = config_;
  const int64_t C = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int64_t L = c.num_hidden_layers;
  PRL_CHECK(unit >= 0 && unit < num_units(), "unit ", unit, " of ", num_units());
  PRL_CHECK(static_cast<int64_t>(p->layers.size()) == L, "ModelParams with ", p->layers.size(),
            " layers for a ", L, "-layer model");
  const int64_t unit_begin = unit_ranges_[unit].first;
  auto at = [&](absl::string_view name) {
    const ParamEntry* e = Find(name);
    PRL_CHECK(e != nullptr, "parameter ", name, " missing from the layout");
    PRL_CHECK(e->offset >= unit_begin && e->offset + e->numel <= unit_ranges_[unit].second, name,
              " is not in unit ", unit);
    return static_cast<char*>(unit_base) +
           (e->offset - unit_begin) * static_cast<int64_t>(DTypeSize(dtype));
  };
  if (unit == 0) {
    p->embed = Tensor(at("model.embed_tokens.weight"), dtype, device, {V, C});
    if (c.tie_word_embeddings) p->lm_head = p->embed;
  } else if (unit <= L) {
    const std::string pre = absl::StrCat("model.layers.", unit - 1, ".");
    LayerParams& lp = p->layers[unit - 1];
    lp.input_norm = Tensor(at(pre + "input_layernorm.weight"), dtype, device, {C});
    lp.qkv_weight = Tensor(at(pre + "self_attn.q_proj.weight"), dtype, device, {c.qkv_dim(), C});
    if (c.qkv_bias) {
      lp.qkv_bias = Tensor(at(pre + "self_attn.q_proj.bias"), dtype, device, {c.qkv_dim()});
    }
    lp.o_weight = Tensor(at(pre + "self_attn.o_proj.weight"), dtype, device, {C, c.q_dim()});
    if (c.o_bias) lp.o_bias = Tensor(at(pre + "self_attn.o_proj.bias"), dtype, device, {C});
    if (c.qk_norm) {
      lp.q_norm = Tensor(at(pre + "self_attn.q_norm.weight"), dtype, device, {c.head_dim});
      lp.k_norm = Tensor(at(pre + "self_attn.k_norm.weight"), dtype, device, {c.head_dim});
    }
    lp.post_norm = Tensor(at(pre + "post_attention_layernorm.weight"), dtype, device, {C});
    if (c.IsMoeLayer(unit - 1)) {
      const int64_t E = c.num_experts, Im = c.moe_intermediate_size;
      lp.router_weight = Tensor(at(pre + "mlp.gate.weight"), dtype, device, {E, C});
      lp.experts_gate_up =
          Tensor(at(pre + "mlp.experts.0.gate_proj.weight"), dtype, device, {E, 2 * Im, C});
      lp.experts_down =
          Tensor(at(pre + "mlp.experts.0.down_proj.weight"), dtype, device, {E, C, Im});
    } else {
      lp.gate_up_weight = Tensor(at(pre + "mlp.gate_proj.weight"), dtype, device, {2 * I, C});
      lp.down_weight = Tensor(at(pre + "mlp.down_proj.weight"), dtype, device, {C, I});
    }
  } else {
    p->final_norm = Tensor(at("model.norm.weight"), dtype, device, {C});
    if (!c.tie_word_embeddings) {
      p->lm_head = Tensor(at("lm_head.weight"), dtype, device, {V, C});
    }
  }
}

absl::StatusOr<ParameterSet> ParameterSet::Allocate(const ModelConfig& config, Device device,
                                                    bool zeroed) {
  ParameterLayout layout(config);
  const size_t bytes = static_cast<size_t>(layout.num_elements()) * sizeof(float);
  PRL_ASSIGN_OR_RETURN(Buffer buffer, zeroed ? Buffer::AllocateZeroed(device, bytes)
                                             : Buffer::Allocate(device, bytes));
  ModelParams params = layout.Bind(static_cast<float*>(buffer.data()), device);
  return ParameterSet{config, std::move(layout), std::move(buffer), std::move(params)};
}

Tensor ParameterSet::View(const ParamEntry& entry) const {
  Tensor t(data() + entry.offset, DType::kF32, buffer.device(), {});
  t.rank = static_cast<int>(entry.shape.size());
  for (int i = 0; i < t.rank; ++i) t.dims[i] = entry.shape[i];
  return t;
}

namespace {

// SplitMix64: a counter-based generator, so element i of a tensor depends only on (seed,
// tensor index, i).
uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double UniformOpen(uint64_t bits) {  // in (0, 1)
  return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53;
}

}  // namespace

void InitializeParameters(const ParameterSet& set, uint64_t seed, float std) {
  PRL_CHECK(set.buffer.device().is_cpu(), "InitializeParameters runs on host memory");
  const auto& entries = set.layout.entries();
  for (size_t k = 0; k < entries.size(); ++k) {
    const ParamEntry& e = entries[k];
    float* dst = set.data() + e.offset;
    const bool is_norm = e.name.ends_with("norm.weight");
    const bool is_bias = e.name.ends_with(".bias");
    if (is_norm || is_bias) {
      for (int64_t i = 0; i < e.numel; ++i) dst[i] = is_norm ? 1.0f : 0.0f;
      continue;
    }
    const uint64_t stream = SplitMix64(seed ^ SplitMix64(k + 1));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < e.numel; i += 2) {
      // Box-Muller: two normals from two uniforms.
      const double u1 = UniformOpen(SplitMix64(stream + 2 * static_cast<uint64_t>(i)));
      const double u2 = UniformOpen(SplitMix64(stream + 2 * static_cast<uint64_t>(i) + 1));
      const double radius = std::sqrt(-2.0 * std::log(u1));
      const double angle = 2.0 * std::numbers::pi * u2;
      dst[i] = static_cast<float>(std * radius * std::cos(angle));
      if (i + 1 < e.numel) dst[i + 1] = static_cast<float>(std * radius * std::sin(angle));
    }
  }
}

namespace {
void RetypeView(Tensor* t, const char* f32_base, char* base, DType dtype) {
  if (!t->defined()) return;
  const int64_t element = (static_cast<const char*>(t->data) - f32_base) / 4;
  t->data = base + element * static_cast<int64_t>(DTypeSize(dtype));
  t->dtype = dtype;
}
}  // namespace

absl::StatusOr<ComputeParams> ToComputeDType(const ParameterSet& source, DType dtype) {
  const int64_t n = source.layout.num_elements();
  const Device device = source.buffer.device();
  ComputeParams out;
  PRL_ASSIGN_OR_RETURN(out.buffer,
                       Buffer::Allocate(device, static_cast<size_t>(n) * DTypeSize(dtype)));
  const Tensor src(const_cast<float*>(source.data()), DType::kF32, device, {n});
  const Tensor dst(out.buffer.data(), dtype, device, {n});
  kernels::ConvertDType(dst, src);
  out.params = source.params;
  const char* f32_base = reinterpret_cast<const char*>(source.data());
  char* base = static_cast<char*>(out.buffer.data());
  ModelParams& p = out.params;
  RetypeView(&p.embed, f32_base, base, dtype);
  RetypeView(&p.final_norm, f32_base, base, dtype);
  RetypeView(&p.lm_head, f32_base, base, dtype);
  for (LayerParams& l : p.layers) {
    for (Tensor* t : {&l.input_norm, &l.qkv_weight, &l.qkv_bias, &l.o_weight, &l.o_bias, &l.q_norm,
                      &l.k_norm, &l.post_norm, &l.gate_up_weight, &l.down_weight, &l.router_weight,
                      &l.experts_gate_up, &l.experts_down}) {
      RetypeView(t, f32_base, base, dtype);
    }
  }
  return out;
}

}  // namespace prl
