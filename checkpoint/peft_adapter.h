// PEFT LoRA adapter directories (peft's save_pretrained): adapter_config.json and
// adapter_model.safetensors, with PEFT's tensor names
// ("base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight", model/lora.h). What prl
// writes loads in peft (PeftModel.from_pretrained on the base model) and what peft writes for
// a supported config loads here.
//
// Reading is strict, as for model directories: peft_type LORA; r, lora_alpha, target_modules
// (a list of module names or "all-linear"), use_rslora, bias "none"; features prl does not
// implement are errors naming the key (use_dora, rank_pattern / alpha_pattern entries,
// layers_to_transform, modules_to_save, fan_in_fan_out); lora_dropout is accepted (it is
// inactive at inference and prl trains without dropout). Every tensor the config implies must
// be present with its shape, and no other; F32, BF16 and F16 load into the F32 adapter.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "model/config.h"
#include "model/lora.h"

namespace prl {

// adapter_config.json's LoRA settings. Errors name the file and the key.
absl::StatusOr<LoraConfig> ReadAdapterConfig(const std::string& dir);

// Reads an adapter for `model` into a LoraSet on the CPU.
absl::StatusOr<LoraSet> LoadAdapter(const std::string& dir, const ModelConfig& model);

// adapter_config.json's text for `lora` (what SaveAdapter writes).
std::string AdapterConfigJson(const LoraConfig& lora, const std::string& base_model);

// Writes `adapter` (a CPU set) as a PEFT directory (created if missing; files written
// atomically). base_model: adapter_config.json's base_model_name_or_path (may be empty).
absl::Status SaveAdapter(const std::string& dir, const LoraSet& adapter,
                         const std::string& base_model);

// The adapter's tensors alone, with PEFT's names, as one F32 safetensors file (what
// adapter_model.safetensors holds; also an adapter's gradients, `prl learner step --dump-grads`).
absl::Status SaveAdapterTensors(const std::string& path, const LoraSet& adapter);

}  // namespace prl
