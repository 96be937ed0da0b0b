// Named model shapes for `prl model init --preset` and `prl bench model --config`.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/config.h"

namespace prl {

// "tiny" (tests, demos: ~0.2M parameters), "40m" (the CPU benchmark model of the foundation
// issue: hidden 512, 8 layers, 8 heads, 4 KV heads, intermediate 1408, vocab 32000, tied),
// "qwen2.5-0.5b" and "qwen2.5-1.5b" (the shapes of those models, for GPU benchmarks);
// "tiny-qwen3" (tests: "tiny" as Qwen3, head_dim 32 = 2 x hidden / heads) and "qwen3-0.6b",
// "qwen3-1.7b", "qwen3-8b" (the shapes of Qwen/Qwen3-*'s config.json).
absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name);
std::vector<std::string> PresetNames();

}  // namespace prl
