// LoRA adapters with PEFT's semantics (peft.LoraConfig, peft.tuners.lora.Linear): on each
// targeted projection y = W x (+ b) of the base model,
//
//   y = W x (+ b) + scale * B (A x),   A (r, in), B (out, r), scale = alpha / r
//                                      (use_rslora: alpha / sqrt(r)),
//
// the base W frozen. Targets are PEFT's module names of the Llama / Qwen2 / Qwen3 decoder:
// q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj ("all-linear": all seven; the
// LM head is never a target, as in PEFT). prl fuses q|k|v and gate|up into one GEMM each
// (model/parameters.h); an adapter of q_proj adds into the q columns of the fused output.
// A Qwen3-MoE layer's experts and router are not targets (an MLP target on a MoE model is an
// error naming the layer); its attention projections are.
//
// At creation (InitializeLora) A is PEFT's default kaiming_uniform_(a=sqrt(5)), i.e. uniform
// in +-1/sqrt(in), and B is zero, so an adapter starts as the identity on the base model. No
// dropout (lora_dropout 0: RL fine-tuning), no bias (bias="none").
//
// Memory: one flat F32 buffer per adapter (LoraLayout: PEFT's tensor names in buffer order),
// viewed per layer and module (LoraParams); the same layout holds an adapter's gradients.
// The Transformer applies the adapters given in ModelParams::lora (model/transformer.h).
//
// Status: the CPU backend (forward and backward); on CUDA (F32 or BF16 compute, the adapters
// F32) written but not yet run on a GPU, so refused unless TransformerOptions::cuda_lora (the
// learner) or EngineOptions::cuda_lora (the engine) turns it on.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/buffer.h"
#include "core/tensor.h"
#include "model/config.h"

namespace prl {

struct LoraConfig {
  int64_t rank = 8;   // r: 1 ..= 1024 and at most the smaller side of every target
  double alpha = 16;  // lora_alpha > 0
  bool rslora = false;
  std::vector<std::string> target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
};

// The projections an adapter may target, in the order of a layer's forward.
enum class LoraTarget { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kNumLoraTargets = 7;
// PEFT's module name ("q_proj", ...).
const char* LoraTargetName(LoraTarget target);

// Errors name the field, the expected and the found value.
absl::Status ValidateLoraConfig(const LoraConfig& lora, const ModelConfig& model);
double LoraScale(const LoraConfig& lora);
// The settings as one string ("r=8 alpha=16 rslora=0 targets=q_proj,v_proj"): two adapters with
// the same fingerprint have the same layout and scale.
std::string LoraFingerprint(const LoraConfig& lora);

// The targets of `lora` (after expanding "all-linear"), validated.
absl::StatusOr<std::array<bool, kNumLoraTargets>> LoraTargets(const LoraConfig& lora,
                                                              const ModelConfig& model);

// Where a target's adapter reads and writes, in a layer of `model`: in features, out features,
// and the first column of the output it adds into (the fused q|k|v or gate|up output).
struct LoraSite {
  int64_t in = 0, out = 0, out_col = 0;
};
LoraSite LoraSiteOf(LoraTarget target, const ModelConfig& model);

struct LoraPair {
  Tensor a;  // (r, in)
  Tensor b;  // (out, r)
  bool defined() const { return a.defined(); }
};

struct LoraLayerParams {
  std::array<LoraPair, kNumLoraTargets> modules;  // by LoraTarget; undefined: not targeted
  const LoraPair& operator[](LoraTarget t) const { return modules[static_cast<int>(t)]; }
};

struct LoraParams {
  std::vector<LoraLayerParams> layers;
  double scale = 0.0;
  int64_t rank = 0;
};

// One adapter's rows in a pass over several adapters' micro-batches packed together (a run of
// adapters trained in one base forward and backward: learner/joint_step.h): tokens [begin, end)
// of the batch, whole sequences, apply `lora`. In a gradient ModelParams: where that adapter's
// gradients accumulate.
struct LoraSegment {
  const LoraParams* lora = nullptr;
  int64_t begin = 0, end = 0;  // tokens
};

// A PEFT tensor in an adapter's buffer.
struct LoraEntry {
  std::string name;            // e.g. "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"
  std::vector<int64_t> shape;  // (r, in) for lora_A, (out, r) for lora_B
  int64_t offset = 0;          // first element, in floats from the buffer start
  int64_t numel = 0;
  int64_t layer = 0;
  LoraTarget target = LoraTarget::kQ;
  bool is_a = true;
};

class LoraLayout {
 public:
  static absl::StatusOr<LoraLayout> Make(const ModelConfig& model, const LoraConfig& lora);

  int64_t num_elements() const { return num_elements_; }
  const std::vector<LoraEntry>& entries() const { return entries_; }
  // Views of a buffer laid out like this (adapter weights or their gradients).
  LoraParams Bind(float* base, Device device) const;

 private:
  ModelConfig model_;
  LoraConfig lora_;
  std::vector<LoraEntry> entries_;
  int64_t num_elements_ = 0;
};

// One adapter's weights (or gradients): the buffer, its layout and its views.
struct LoraSet {
  ModelConfig model;
  LoraConfig lora;
  LoraLayout layout;
  Buffer buffer;
  LoraParams params;

  static absl::StatusOr<LoraSet> Allocate(const ModelConfig& model, const LoraConfig& lora,
                                          Device device, bool zeroed);
  // A copy of this set on `device`, complete when it returns (an engine on CUDA takes the CPU
  // sets it is given this way).
  absl::StatusOr<LoraSet> CopyTo(Device device) const;
  float* data() const { return static_cast<float*>(buffer.data()); }
};

// Whether `params` fits `model`: one entry per layer, every pair on `device`, F32, A (r, in)
// and B (out, r) with the in and out of its target in this model. The error names the layer,
// the target, the expected and the found shape (an adapter made for another model).
absl::Status ValidateLoraParams(const LoraParams& params, const ModelConfig& model,
                                Device device);

// A uniform in +-1/sqrt(in) (PEFT's kaiming_uniform_(a=sqrt(5))), B zero. Deterministic in
// `seed` alone. CPU sets only.
void InitializeLora(const LoraSet& set, uint64_t seed);

}  // namespace prl
