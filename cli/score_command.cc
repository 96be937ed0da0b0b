// `prl score`: log-probabilities (and optionally gradients) of token sequences under a model.
//
// Input JSONL, one sequence per line: {"tokens": [int, ...], "score_from": k}, 1 <= k < len.
// Output JSONL, one line per input line: {"logprobs": [...]}, log p(tokens[i] | tokens[:i]) for
// i = k .. len-1. --dump-grads writes d(-sum of all output log-probs)/d(parameters) under HF
// names as F32. Lines are packed into batches of up to --max-batch-tokens tokens (never one
// forward per line); the results do not depend on the packing.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf_model_dir.h"
#include "checkpoint/peft_adapter.h"
#include "checkpoint/safetensors.h"
#include "cli/command.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "kernels/matmul.h"
#include "model/transformer.h"
#include "nlohmann/json.hpp"

namespace prl::cli {

namespace {

struct ScoreFlags {
  std::string model, adapter, input, output, dump_grads, device = "auto";
  float temperature = 1.0f;
  int64_t max_batch_tokens = 16384;
  bool batch_invariant = false;
  std::string dtype = "fp32";
};

struct ScoreLine {
  std::vector<int32_t> tokens;
  int64_t score_from = 0;
};

absl::StatusOr<ScoreLine> ParseLine(const std::string& text, const std::string& where,
                                    const ModelConfig& config) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": malformed JSON: ", e.what()));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected a JSON object"));
  }
  for (const auto& [key, unused] : j.items()) {
    if (key != "tokens" && key != "score_from") {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown key '", key,
                                                     "' (expected \"tokens\" and \"score_from\")"));
    }
  }
  ScoreLine line;
  auto tokens = j.find("tokens");
  if (tokens == j.end() || !tokens->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"tokens\" must be a list of ints"));
  }
  const int64_t n = static_cast<int64_t>(tokens->size());
  if (n < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"tokens\" has ", n, " entries; scoring needs at least 2"));
  }
  if (n > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": sequence of ", n, " tokens is longer than the model's max_position_embeddings = ",
        config.max_position_embeddings));
  }
  line.tokens.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const nlohmann::json& t = (*tokens)[i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tokens[", i, "] = ", t.dump(),
                                                     " is not a token id in [0, ",
                                                     config.vocab_size, ")"));
    }
    line.tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  auto from = j.find("score_from");
  if (from == j.end() || !from->is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"score_from\" must be an integer"));
  }
  line.score_from = from->get<int64_t>();
  if (line.score_from < 1 || line.score_from >= n) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": score_from = ", line.score_from,
                                                   " is out of range; expected 1 <= score_from < ",
                                                   "len(tokens) = ", n));
  }
  return line;
}

absl::StatusOr<std::vector<ScoreLine>> ReadInput(const std::string& path,
                                                 const ModelConfig& config) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open --input '", path, "'"));
  std::vector<ScoreLine> lines;
  std::string text;
  for (int64_t number = 1; std::getline(in, text); ++number) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(path, " line ", number, ": empty line"));
    }
    PRL_ASSIGN_OR_RETURN(ScoreLine line,
                         ParseLine(text, absl::StrCat(path, " line ", number), config));
    lines.push_back(std::move(line));
  }
  if (lines.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no input lines"));
  return lines;
}

absl::Status RunScore(const ScoreFlags& f) {
  if (f.max_batch_tokens <= 0) {
    return absl::InvalidArgumentError("--max-batch-tokens must be positive");
  }
  PRL_ASSIGN_OR_RETURN(const Device device, ResolveDeviceFlag(f.device));
  PRL_ASSIGN_OR_RETURN(const ParameterSet params, LoadModel(f.model, device));
  PRL_ASSIGN_OR_RETURN(const std::vector<ScoreLine> lines, ReadInput(f.input, params.config));
  const bool want_grads = !f.dump_grads.empty();
  std::optional<ParameterSet> grads;
  if (want_grads) {
    PRL_ASSIGN_OR_RETURN(grads, ParameterSet::Allocate(params.config, device, true));
  }
  // A LoRA adapter on the model (PEFT directory), and its gradients.
  std::optional<LoraSet> adapter, adapter_grads;
  if (!f.adapter.empty()) {
    if (!device.is_cpu()) {
      return absl::UnimplementedError(absl::StrCat(
          "--adapter: LoRA adapters run on the CPU backend only for now, found --device ",
          device.ToString(), " (use --device cpu)"));
    }
    PRL_ASSIGN_OR_RETURN(adapter, LoadAdapter(f.adapter, params.config));
    if (want_grads) {
      PRL_ASSIGN_OR_RETURN(adapter_grads, LoraSet::Allocate(params.config, adapter->lora,
                                                             Device::Cpu(), /*zeroed=*/true));
      grads->params.lora = &adapter_grads->params;
    }
  }

  TransformerOptions options;
  if (f.batch_invariant) options.reduction_order = kernels::ReductionOrder::kBatchInvariant;
  PRL_ASSIGN_OR_RETURN(options.compute_dtype, ResolveComputeDType(f.dtype, device));
  Transformer model(params.config, device, options);
  std::optional<ComputeParams> compute;  // bf16 mode: the bf16 copy of the weights
  if (options.compute_dtype != DType::kF32) {
    PRL_ASSIGN_OR_RETURN(compute, ToComputeDType(params, options.compute_dtype));
  }
  ModelParams weights = compute.has_value() ? compute->params : params.params;
  if (adapter.has_value()) weights.lora = &adapter->params;
  std::string output;
  const auto start = std::chrono::steady_clock::now();
  auto last_report = start;
  size_t next = 0;
  while (next < lines.size()) {
    // Pack lines until the token budget is reached (a longer line gets a batch of its own).
    PackedBatch batch;
    const size_t first = next;
    while (next < lines.size()) {
      const int64_t len = static_cast<int64_t>(lines[next].tokens.size()) - 1;
      if (next > first && batch.num_tokens() + len > f.max_batch_tokens) break;
      batch.AddScored(lines[next].tokens, lines[next].score_from);
      ++next;
    }
    std::vector<float> logprobs(batch.num_tokens());
    PRL_RETURN_IF_ERROR(
        model.Forward(weights, batch, f.temperature, absl::MakeSpan(logprobs), want_grads));
    if (want_grads) {
      // d(-sum logprob) / d logprob = -1 at every scored position.
      std::vector<float> dlogprobs(batch.num_tokens());
      for (int64_t t = 0; t < batch.num_tokens(); ++t) {
        dlogprobs[t] = batch.targets[t] == PackedBatch::kNoTarget ? 0.0f : -1.0f;
      }
      PRL_RETURN_IF_ERROR(model.Backward(weights, dlogprobs, grads->params));
    }
    for (size_t i = first; i < next; ++i) {
      const int64_t s = static_cast<int64_t>(i - first);
      const int32_t begin = batch.cu_seqlens[s];
      const int64_t n = static_cast<int64_t>(lines[i].tokens.size());
      nlohmann::json out;
      std::vector<double> values;
      for (int64_t pos = lines[i].score_from; pos < n; ++pos) {
        values.push_back(logprobs[begin + pos - 1]);
      }
      out["logprobs"] = values;
      absl::StrAppend(&output, out.dump(), "\n");
    }
    const auto now = std::chrono::steady_clock::now();
    if (next < lines.size() && now - last_report > std::chrono::seconds(5)) {
      std::fprintf(stderr, "score: %zu/%zu lines (%.0f s)\n", next, lines.size(),
                   std::chrono::duration<double>(now - start).count());
      last_report = now;
    }
  }
  PRL_RETURN_IF_ERROR(WriteFileAtomically(f.output, output));
  if (want_grads && device.is_cuda()) {  // the writer reads host memory
    PRL_ASSIGN_OR_RETURN(ParameterSet host,
                         ParameterSet::Allocate(params.config, Device::Cpu(), false));
    PRL_RETURN_IF_ERROR(
        CopyBytes(host.data(), Device::Cpu(), grads->data(), device, grads->buffer.bytes()));
    grads = std::move(host);
  }
  if (want_grads && !adapter.has_value()) {
    PRL_RETURN_IF_ERROR(SaveParameterSetTensors(f.dump_grads, *grads));
  } else if (want_grads) {  // the base's gradients and the adapter's, under their names
    std::vector<SafetensorsTensorToWrite> tensors;
    for (const ParamEntry& e : grads->layout.entries()) {
      tensors.push_back({e.name, e.shape, grads->data() + e.offset});
    }
    for (const LoraEntry& e : adapter_grads->layout.entries()) {
      tensors.push_back({e.name, e.shape, adapter_grads->data() + e.offset});
    }
    PRL_RETURN_IF_ERROR(WriteSafetensors(f.dump_grads, tensors, DType::kF32, {{"format", "pt"}}));
  }
  return absl::OkStatus();
}

}  // namespace

void RegisterScoreCommand(CLI::App& app, CommandRegistry& registry) {
  auto f = std::make_shared<ScoreFlags>();
  CLI::App* score = app.add_subcommand(
      "score",
      "Log-probabilities of token sequences under a model (and gradients with --dump-grads).\n"
      "Input lines: {\"tokens\": [int, ...], \"score_from\": k}, 1 <= k < len(tokens).\n"
      "Output lines: {\"logprobs\": [...]}: log p(tokens[i] | tokens[:i]) for i = k..len-1.");
  score->add_option("--model", f->model, "Hugging Face model directory")->required();
  score->add_option("--adapter", f->adapter,
                    "A LoRA adapter on the model: a PEFT directory (adapter_config.json, "
                    "adapter_model.safetensors); with --dump-grads its gradients are written "
                    "too. CPU only for now");
  score->add_option("--input", f->input, "Input JSONL")->required();
  score->add_option("--output", f->output, "Output JSONL (written atomically)")->required();
  score->add_option("--dump-grads", f->dump_grads,
                    "Write d(-sum of all log-probs)/d(params) here (safetensors, F32, HF names)");
  score
      ->add_option("--temperature", f->temperature,
                   "Score under softmax(logits / T), the sampler's transform")
      ->capture_default_str();
  score->add_option("--max-batch-tokens", f->max_batch_tokens, "Tokens per packed batch")
      ->capture_default_str();
  score
      ->add_option("--dtype", f->dtype,
                   "fp32 (exact mode, every backend) | bf16 (CUDA: bf16 weights and activations, "
                   "fp32 accumulation)")
      ->capture_default_str();
  score->add_flag("--batch-invariant", f->batch_invariant,
                  "Fixed reduction order: log-probs equal `prl generate --batch-invariant`'s "
                  "behaviour log-probs bit for bit (slower)");
  AddInvariantTensorCoreFlags(score);
  score->add_option("--device", f->device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  registry.Add(score, [f] { return RunScore(*f); });
}

}  // namespace prl::cli
