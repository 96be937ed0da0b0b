// `prl generate`: samples completions for token prompts with the paged KV-cache engine.
//
// Input JSONL, one prompt per line: {"tokens": [int, ...]} (optionally "seed": int, else the
// request's seed is derived from --seed and the line number). Output JSONL, one line per
// sample, ordered by prompt then sample: {"prompt_index", "sample_index", "tokens" (completion
// only), "logprobs" (behaviour log-probs), "versions" (weight version per token),
// "finish_reason": "length"|"stop"}.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf_model_dir.h"
#include "checkpoint/peft_adapter.h"
#include "cli/command.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "inference_engine/engine.h"
#include "kernels/matmul.h"
#include "nlohmann/json.hpp"

namespace prl::cli {

namespace {

struct GenerateFlags {
  std::string model, adapter, input, output, device = "auto", dtype = "fp32";
  bool no_cuda_graphs = false;
  SamplingParams params;
  EngineOptions engine;
  int64_t kv_cache_mb = 512;
  bool no_prefix_caching = false;
};

struct Prompt {
  std::vector<int32_t> tokens;
  uint64_t seed = 0;
};

uint64_t DeriveSeed(uint64_t base, uint64_t line) {
  uint64_t x = base + 0x9e3779b97f4a7c15ull * (line + 1);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

absl::StatusOr<std::vector<Prompt>> ReadPrompts(const std::string& path, const ModelConfig& config,
                                                uint64_t base_seed) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open --input '", path, "'"));
  std::vector<Prompt> prompts;
  std::string text;
  for (int64_t number = 1; std::getline(in, text); ++number) {
    const std::string where = absl::StrCat(path, " line ", number);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": malformed JSON: ", e.what()));
    }
    if (!j.is_object()) return absl::InvalidArgumentError(where + ": expected a JSON object");
    for (const auto& [key, unused] : j.items()) {
      if (key != "tokens" && key != "seed") {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unknown key '", key, "' (expected \"tokens\", \"seed\")"));
      }
    }
    auto tokens = j.find("tokens");
    if (tokens == j.end() || !tokens->is_array() || tokens->empty()) {
      return absl::InvalidArgumentError(where + ": \"tokens\" must be a non-empty list of ints");
    }
    Prompt p;
    for (size_t i = 0; i < tokens->size(); ++i) {
      const nlohmann::json& t = (*tokens)[i];
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= config.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": tokens[", i, "] = ", t.dump(),
                                                       " is not a token id in [0, ",
                                                       config.vocab_size, ")"));
      }
      p.tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    p.seed = DeriveSeed(base_seed, static_cast<uint64_t>(number - 1));
    if (auto seed = j.find("seed"); seed != j.end()) {
      if (!seed->is_number_unsigned()) {
        return absl::InvalidArgumentError(where + ": \"seed\" must be a non-negative integer");
      }
      p.seed = seed->get<uint64_t>();
    }
    prompts.push_back(std::move(p));
  }
  if (prompts.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no prompts"));
  return prompts;
}

absl::Status RunGenerate(GenerateFlags f) {
  PRL_ASSIGN_OR_RETURN(f.engine.device, ResolveDevice(f.device));
  PRL_ASSIGN_OR_RETURN(f.engine.dtype, ResolveComputeDType(f.dtype, f.engine.device));
  f.engine.cuda_graphs = !f.no_cuda_graphs;
  f.engine.kv_cache_bytes = f.kv_cache_mb << 20;
  f.engine.enable_prefix_caching = !f.no_prefix_caching;
  PRL_ASSIGN_OR_RETURN(ParameterSet loaded, LoadModel(f.model, f.engine.device));
  auto weights = std::make_shared<const ParameterSet>(std::move(loaded));
  const ModelConfig config = weights->config;
  PRL_ASSIGN_OR_RETURN(const std::vector<Prompt> prompts,
                       ReadPrompts(f.input, config, f.params.seed));
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(weights, 0, f.engine));
  if (!f.adapter.empty()) {
    PRL_ASSIGN_OR_RETURN(LoraSet adapter, LoadAdapter(f.adapter, weights->config));
    PRL_RETURN_IF_ERROR(engine->SetAdapter(std::make_shared<const LoraSet>(std::move(adapter))));
  }

  std::map<uint64_t, size_t> prompt_of;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams params = f.params;
    params.seed = prompts[i].seed;
    absl::StatusOr<uint64_t> id = engine->AddRequest(prompts[i].tokens, params);
    if (!id.ok()) {
      return absl::Status(id.status().code(),
                          absl::StrCat(f.input, " line ", i + 1, ": ", id.status().message()));
    }
    prompt_of[*id] = i;
  }
  std::vector<RequestOutput> results(prompts.size());
  const auto start = std::chrono::steady_clock::now();
  auto last_report = start;
  size_t done = 0;
  while (engine->HasUnfinishedRequests()) {
    PRL_RETURN_IF_ERROR(engine->Step());
    for (RequestOutput& r : engine->TakeFinished()) {
      results[prompt_of.at(r.request_id)] = std::move(r);
      ++done;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now - last_report > std::chrono::seconds(5)) {
      const EngineStats s = engine->Stats();
      const double seconds = std::chrono::duration<double>(now - start).count();
      std::fprintf(stderr,
                   "generate: %zu/%zu prompts done, %lld tokens generated (%.0f tok/s), %lld "
                   "running, %lld waiting\n",
                   done, prompts.size(), static_cast<long long>(s.generated_tokens),
                   s.generated_tokens / seconds, static_cast<long long>(s.num_running),
                   static_cast<long long>(s.num_waiting));
      last_report = now;
    }
  }
  std::string out;
  for (size_t i = 0; i < results.size(); ++i) {
    for (const SampleOutput& s : results[i].samples) {
      nlohmann::ordered_json j;
      j["prompt_index"] = i;
      j["sample_index"] = s.sample_index;
      j["tokens"] = s.tokens;
      j["logprobs"] = std::vector<double>(s.logprobs.begin(), s.logprobs.end());
      j["versions"] = s.versions;
      j["finish_reason"] = FinishReasonName(s.finish_reason);
      absl::StrAppend(&out, j.dump(), "\n");
    }
  }
  return WriteFileAtomically(f.output, out);
}

}  // namespace

void RegisterGenerateCommand(CLI::App& app, CommandRegistry& registry) {
  auto f = std::make_shared<GenerateFlags>();
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "Sample completions with the paged KV-cache engine.\n"
      "Input lines: {\"tokens\": [int, ...]} (optional \"seed\").\n"
      "Output lines (one per sample): {\"prompt_index\", \"sample_index\", \"tokens\", "
      "\"logprobs\", \"versions\", \"finish_reason\"}.");
  cmd->add_option("--model", f->model, "Hugging Face model directory")->required();
  cmd->add_option("--adapter", f->adapter,
                  "A LoRA adapter on the model: a PEFT directory (on CUDA with --cuda-lora)");
  cmd->add_flag("--cuda-lora", f->engine.cuda_lora,
                "CUDA: take the adapter on the GPU (actors.cuda_lora; written, not yet verified "
                "on a GPU)");
  cmd->add_option("--input", f->input, "Prompts, JSONL")->required();
  cmd->add_option("--output", f->output, "Samples, JSONL (written atomically)")->required();
  cmd->add_option("--n", f->params.n, "Samples per prompt (they share the prompt's KV blocks)")
      ->capture_default_str();
  cmd->add_option("--max-tokens", f->params.max_tokens, "Completion tokens at most")
      ->capture_default_str();
  cmd->add_option("--temperature", f->params.temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p", f->params.top_p, "Nucleus mass (1 disables)")->capture_default_str();
  cmd->add_option("--top-k", f->params.top_k, "Top-k (0 disables)")->capture_default_str();
  cmd->add_option("--seed", f->params.seed, "Base seed; each prompt's seed derives from it")
      ->capture_default_str();
  cmd->add_option("--stop-token", f->params.stop_token_ids,
                  "Token id that ends a sample (repeatable; kept in the output)");
  cmd->add_option("--max-num-seqs", f->engine.max_num_seqs, "Sequences in flight")
      ->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", f->engine.max_num_batched_tokens,
                  "Tokens per engine step (prompts are prefilled in chunks)")
      ->capture_default_str();
  cmd->add_option("--block-size", f->engine.block_size, "Tokens per KV block")
      ->capture_default_str();
  cmd->add_option("--kv-cache-mb", f->kv_cache_mb, "KV cache pool")->capture_default_str();
  cmd->add_flag("--no-prefix-caching", f->no_prefix_caching, "Do not reuse equal prefixes");
  cmd->add_flag("--batch-invariant", f->engine.batch_invariant,
                "Bit-exact results whatever the batch; log-probs equal `prl score`'s in the "
                "same mode (slower)");
  AddInvariantTensorCoreFlags(cmd);
  cmd->add_option("--device", f->device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", f->dtype,
                  "fp32 (exact mode, every backend) | bf16 (CUDA: bf16 weights, activations and "
                  "KV cache, fp32 accumulation)")
      ->capture_default_str();
  cmd->add_flag("--no-cuda-graphs", f->no_cuda_graphs,
                "CUDA: run decode steps eagerly instead of replaying captured graphs");
  cmd->add_option("--max-model-len", f->engine.max_model_len,
                  "Prompt + completion limit (0: the model's context); on CUDA it sizes the "
                  "decode graphs' block tables")
      ->capture_default_str();
  registry.Add(cmd, [f] { return RunGenerate(*f); });
}

}  // namespace prl::cli
