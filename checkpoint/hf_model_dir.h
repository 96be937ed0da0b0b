// Hugging Face model directories: config.json plus model.safetensors, or shards listed in
// model.safetensors.index.json, with transformers' tensor names (docs/architecture.md, "Model
// format"). A user's checkpoint loads unchanged; what prl writes loads in transformers.
//
// Loading converts F32, BF16 and F16 tensors to the fp32 parameter buffer. Every tensor the
// config implies must be present with the right shape; tensors the model would not use are an
// error too (except the ones transformers itself ignores: rotary inv_freq buffers, and
// lm_head.weight when embeddings are tied), so that a mismatched checkpoint never half-loads.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "model/config.h"
#include "model/parameters.h"

namespace prl {

absl::StatusOr<ModelConfig> ReadModelConfig(const std::string& dir);

// Reads config.json and the weights into a ParameterSet on `device`.
absl::StatusOr<ParameterSet> LoadModel(const std::string& dir, Device device);

struct SaveModelOptions {
  DType dtype = DType::kF32;  // F32, BF16 or F16 in the files
  // 0: one model.safetensors. Otherwise shards of at most this many bytes (a tensor larger
  // than that gets a shard of its own) plus model.safetensors.index.json, as transformers'
  // save_pretrained(max_shard_size=...) writes them.
  uint64_t max_shard_bytes = 0;
};

// Writes config.json and the weights into `dir` (created if missing). Each file is written
// atomically; weight files of the other layout (single vs sharded), and shards of an earlier
// sharded save that this one does not overwrite, are removed so the directory is unambiguous.
absl::Status SaveModel(const std::string& dir, const ParameterSet& params,
                       const SaveModelOptions& options = {});

// Writes every tensor of `set` under its HF name, as F32, into one safetensors file (used for
// gradients: `prl score --dump-grads`).
// Copies a model directory's Hugging Face tokenizer files (tokenizer.json,
// tokenizer_config.json, generation_config.json, special_tokens_map.json: those present) to
// another, so that a trained or exported model keeps the text of the one it started from.
absl::Status CopyTokenizerFiles(const std::string& from_dir, const std::string& to_dir);

absl::Status SaveParameterSetTensors(const std::string& path, const ParameterSet& set);

}  // namespace prl
