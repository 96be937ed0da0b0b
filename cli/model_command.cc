// `prl model init` and `prl model info`.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/hf_model_dir.h"
#include "cli/command.h"
#include "core/status_macros.h"
#include "model/presets.h"
#include "tokenizer/hf_text_codec.h"

namespace prl::cli {

namespace {

struct InitFlags {
  std::string preset;
  std::string arch = "qwen2";
  int64_t hidden_size = 0, layers = 0, heads = 0, kv_heads = 0, intermediate_size = 0;
  int64_t vocab_size = 0, head_dim = 0, max_positions = 2048;
  double rope_theta = 10000.0, rms_norm_eps = 1e-6;
  bool tie = false;
  bool attention_bias = false;  // qwen3 only: biases on q, k, v and o_proj
  // qwen3_moe only (a preset's values unless given).
  int64_t num_experts = 8, num_experts_per_tok = 2, moe_intermediate_size = 0;
  int64_t decoder_sparse_step = 1;
  bool norm_topk_prob = false;
  std::vector<int64_t> mlp_only_layers;
  uint64_t seed = 0;
  float init_std = 0.02f;
  std::string dtype = "f32";
  double max_shard_mb = 0.0;
  std::string tokenizer;  // a directory with tokenizer.json (and its config files)
  std::string out;
};

// --tokenizer: the vocabulary size is the tokenizer's (or --vocab-size, which must cover it).
absl::Status ApplyTokenizer(const InitFlags& f, bool vocab_given, ModelConfig* config) {
  if (f.tokenizer.empty()) return absl::OkStatus();
  PRL_ASSIGN_OR_RETURN(auto codec, tokenizer::HfTextCodec::Load(f.tokenizer));
  const int64_t needed = codec->vocab_size();
  if (!vocab_given) {
    config->vocab_size = needed;
  } else if (config->vocab_size < needed) {
    return absl::InvalidArgumentError(absl::StrCat("--vocab-size ", config->vocab_size,
                                                   " is below the tokenizer's ", needed, " (",
                                                   codec->Describe(), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DType> ParseStorageDType(const std::string& s) {
  if (s == "f32") return DType::kF32;
  if (s == "bf16") return DType::kBF16;
  if (s == "f16") return DType::kF16;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype: expected f32, bf16 or f16, found '", s, "'"));
}

absl::Status RunInit(const InitFlags& f, const CLI::App& cmd) {
  ModelConfig config;
  auto given = [&](const char* flag) { return cmd.count(flag) > 0; };
  if (!f.preset.empty()) {
    PRL_ASSIGN_OR_RETURN(config, PresetConfig(f.preset));
  } else {
    for (const char* flag :
         {"--hidden-size", "--layers", "--heads", "--intermediate-size", "--vocab-size"}) {
      if (!given(flag)) {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, " is required (or start from --preset)"));
      }
    }
  }
  if (given("--arch") || f.preset.empty()) {
    std::optional<Architecture> arch;
    for (Architecture a : {Architecture::kQwen2, Architecture::kLlama, Architecture::kQwen3,
                           Architecture::kQwen3Moe}) {
      if (f.arch == ModelTypeName(a)) arch = a;
    }
    if (!arch) {
      return absl::InvalidArgumentError(
          absl::StrCat("--arch: expected qwen2, llama, qwen3 or qwen3_moe, found '", f.arch, "'"));
    }
    SetArchitecture(*arch, f.attention_bias, &config);
  } else if (given("--attention-bias")) {
    SetArchitecture(config.arch, f.attention_bias, &config);
  }
  const bool moe = config.arch == Architecture::kQwen3Moe;
  const bool moe_defaults = moe && config.num_experts == 0;  // not from a MoE preset
  for (const char* flag : {"--num-experts", "--num-experts-per-tok", "--moe-intermediate-size",
                           "--norm-topk-prob", "--decoder-sparse-step", "--mlp-only-layers"}) {
    if (!moe && given(flag)) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": only qwen3_moe takes it, the model is ", ArchitectureName(config.arch)));
    }
  }
  if (!moe) config.num_experts = 0;
  if (moe) {
    if (given("--num-experts") || moe_defaults) config.num_experts = f.num_experts;
    if (given("--num-experts-per-tok") || moe_defaults) {
      config.num_experts_per_tok = f.num_experts_per_tok;
    }
    if (given("--moe-intermediate-size")) config.moe_intermediate_size = f.moe_intermediate_size;
    if (given("--norm-topk-prob") || moe_defaults) config.norm_topk_prob = f.norm_topk_prob;
    if (given("--decoder-sparse-step") || moe_defaults) {
      config.decoder_sparse_step = f.decoder_sparse_step;
    }
    if (given("--mlp-only-layers")) {
      config.mlp_only_layers = f.mlp_only_layers;
      std::sort(config.mlp_only_layers.begin(), config.mlp_only_layers.end());
    }
  }
  if (f.attention_bias && config.arch != Architecture::kQwen3 && !moe) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--attention-bias: only qwen3 takes it, the model is ", ArchitectureName(config.arch)));
  }
  if (given("--hidden-size")) config.hidden_size = f.hidden_size;
  if (given("--layers")) config.num_hidden_layers = f.layers;
  if (given("--heads")) config.num_attention_heads = f.heads;
  if (given("--kv-heads"))
    config.num_key_value_heads = f.kv_heads;
  else if (f.preset.empty() || given("--heads"))
    config.num_key_value_heads = config.num_attention_heads;
  if (given("--intermediate-size")) config.intermediate_size = f.intermediate_size;
  // Without --moe-intermediate-size (and no MoE preset): the dense MLP's width.
  if (moe && config.moe_intermediate_size == 0) {
    config.moe_intermediate_size = config.intermediate_size;
  }
  if (given("--vocab-size")) config.vocab_size = f.vocab_size;
  if (given("--max-position-embeddings") || f.preset.empty()) {
    config.max_position_embeddings = f.max_positions;
  }
  if (given("--rope-theta") || f.preset.empty()) config.rope_theta = f.rope_theta;
  if (given("--rms-norm-eps") || f.preset.empty()) config.rms_norm_eps = f.rms_norm_eps;
  if (given("--tie-embeddings") || f.preset.empty()) config.tie_word_embeddings = f.tie;
  // Without --head-dim: hidden / heads, except that a Qwen3 preset keeps its own (128, which
  // is not hidden / heads).
  const bool derive_head_dim =
      !given("--head-dim") && (f.preset.empty() || (config.arch != Architecture::kQwen3 && !moe &&
                                                    (given("--hidden-size") || given("--heads"))));
  if (given("--head-dim")) {
    config.head_dim = f.head_dim;
  } else if (derive_head_dim && config.num_attention_heads > 0) {
    config.head_dim = config.hidden_size / config.num_attention_heads;
  }
  if (config.num_attention_heads > 0 && derive_head_dim &&
      config.hidden_size % config.num_attention_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--hidden-size ", config.hidden_size, " is not a multiple of --heads ",
                     config.num_attention_heads, " (or give --head-dim)"));
  }
  PRL_RETURN_IF_ERROR(ApplyTokenizer(f, given("--vocab-size"), &config));
  absl::Status valid = ValidateModelConfig(config);
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat("model init: ", valid.message()));
  PRL_ASSIGN_OR_RETURN(const DType dtype, ParseStorageDType(f.dtype));

  PRL_ASSIGN_OR_RETURN(ParameterSet params, ParameterSet::Allocate(config, Device::Cpu(), false));
  InitializeParameters(params, f.seed, f.init_std);
  SaveModelOptions options;
  options.dtype = dtype;
  options.max_shard_bytes = static_cast<uint64_t>(f.max_shard_mb * 1024.0 * 1024.0);
  PRL_RETURN_IF_ERROR(SaveModel(f.out, params, options));
  if (!f.tokenizer.empty()) PRL_RETURN_IF_ERROR(CopyTokenizerFiles(f.tokenizer, f.out));
  std::printf("wrote %s: %s, %lld parameters, %s, vocabulary %lld%s\n", f.out.c_str(),
              std::string(ArchitectureName(config.arch)).c_str(),
              static_cast<long long>(ParameterCount(config)), f.dtype.c_str(),
              static_cast<long long>(config.vocab_size),
              f.tokenizer.empty() ? "" : absl::StrCat(" (tokenizer of ", f.tokenizer, ")").c_str());
  return absl::OkStatus();
}

absl::Status RunInfo(const std::string& dir) {
  PRL_ASSIGN_OR_RETURN(const ParameterSet params, LoadModel(dir, Device::Cpu()));
  const ModelConfig& c = params.config;
  std::printf("%s\n", std::string(ArchitectureName(c.arch)).c_str());
  std::printf("  parameters        %lld\n", static_cast<long long>(ParameterCount(c)));
  std::printf("  hidden_size       %lld\n", static_cast<long long>(c.hidden_size));
  std::printf("  layers            %lld\n", static_cast<long long>(c.num_hidden_layers));
  std::printf("  heads / kv heads  %lld / %lld (head_dim %lld)\n",
              static_cast<long long>(c.num_attention_heads),
              static_cast<long long>(c.num_key_value_heads), static_cast<long long>(c.head_dim));
  std::printf("  intermediate_size %lld\n", static_cast<long long>(c.intermediate_size));
  std::printf("  vocab_size        %lld\n", static_cast<long long>(c.vocab_size));
  std::printf("  max positions     %lld\n", static_cast<long long>(c.max_position_embeddings));
  std::printf("  tied embeddings   %s\n", c.tie_word_embeddings ? "yes" : "no");
  std::printf("  attention biases  %s\n", c.o_bias     ? "q, k, v, o"
                                          : c.qkv_bias ? "q, k, v"
                                                       : "none");
  std::printf("  q/k norms         %s\n", c.qk_norm ? "yes (per head, before RoPE)" : "no");
  if (c.has_moe()) {
    std::printf(
        "  experts           %lld, top-%lld%s, width %lld\n", static_cast<long long>(c.num_experts),
        static_cast<long long>(c.num_experts_per_tok), c.norm_topk_prob ? " renormalised" : "",
        static_cast<long long>(c.moe_intermediate_size));
    std::printf(
        "  MoE layers        %lld of %lld (decoder_sparse_step %lld, mlp_only_layers [%s])\n",
        static_cast<long long>(c.num_moe_layers()), static_cast<long long>(c.num_hidden_layers),
        static_cast<long long>(c.decoder_sparse_step),
        absl::StrJoin(c.mlp_only_layers, ", ").c_str());
    std::printf("  active parameters %lld per token\n",
                static_cast<long long>(ActiveParameterCount(c)));
  }
  std::printf("  tensors           %zu\n", params.layout.entries().size());
  return absl::OkStatus();
}

}  // namespace

void RegisterModelCommands(CLI::App& app, CommandRegistry& registry) {
  CLI::App* model =
      app.add_subcommand("model", "Create and inspect Hugging Face model directories");
  model->require_subcommand(1);

  auto f = std::make_shared<InitFlags>();
  CLI::App* init = model->add_subcommand(
      "init",
      "Write a randomly initialised Llama/Qwen2/Qwen3/Qwen3-MoE model directory (config.json + "
      "model.safetensors)");
  init->add_option("--preset", f->preset,
                   "Start from a named shape: " + absl::StrJoin(PresetNames(), ", ") +
                       " (flags below override)");
  init->add_option("--arch", f->arch,
                   "qwen2 (q/k/v biases), llama, qwen3 (per-head q/k norms) or qwen3_moe (qwen3 "
                   "with mixture-of-experts MLPs)")
      ->capture_default_str();
  init->add_flag("--attention-bias", f->attention_bias,
                 "qwen3, qwen3_moe: biases on q, k, v and o_proj (config.json's attention_bias)");
  init->add_option("--num-experts", f->num_experts, "qwen3_moe: experts per MoE layer (<= 256)")
      ->capture_default_str();
  init->add_option("--num-experts-per-tok", f->num_experts_per_tok,
                   "qwen3_moe: experts each token is routed to (top-k)")
      ->capture_default_str();
  init->add_option("--moe-intermediate-size", f->moe_intermediate_size,
                   "qwen3_moe: each expert's MLP width (default: --intermediate-size)");
  init->add_flag("--norm-topk-prob", f->norm_topk_prob,
                 "qwen3_moe: renormalise the kept experts' probabilities to sum 1");
  init->add_option("--decoder-sparse-step", f->decoder_sparse_step,
                   "qwen3_moe: layer l is MoE when (l + 1) % step == 0")
      ->capture_default_str();
  init->add_option("--mlp-only-layers", f->mlp_only_layers,
                   "qwen3_moe: layers that keep the dense MLP")
      ->delimiter(',');
  init->add_option("--hidden-size", f->hidden_size, "Hidden size C");
  init->add_option("--layers", f->layers, "Number of transformer blocks");
  init->add_option("--heads", f->heads, "Query heads");
  init->add_option("--kv-heads", f->kv_heads, "Key/value heads (default: --heads; fewer = GQA)");
  init->add_option("--intermediate-size", f->intermediate_size, "MLP width I");
  init->add_option("--vocab-size", f->vocab_size, "Vocabulary size V");
  init->add_option("--head-dim", f->head_dim, "Head size (default hidden/heads)");
  init->add_option("--max-position-embeddings", f->max_positions, "Longest sequence")
      ->capture_default_str();
  init->add_option("--rope-theta", f->rope_theta, "RoPE base")->capture_default_str();
  init->add_option("--rms-norm-eps", f->rms_norm_eps, "RMSNorm epsilon")->capture_default_str();
  init->add_flag("--tie-embeddings", f->tie, "Share the embedding and LM head matrices");
  init->add_option("--seed", f->seed, "Random seed (same seed, same file)")->capture_default_str();
  init->add_option("--init-std", f->init_std, "Standard deviation of weight matrices")
      ->capture_default_str();
  init->add_option("--dtype", f->dtype, "Storage dtype: f32, bf16 or f16")->capture_default_str();
  init->add_option("--max-shard-mb", f->max_shard_mb,
                   "Split weights into shards of at most this size (0: one file)")
      ->capture_default_str();
  init->add_option("--tokenizer", f->tokenizer,
                   "Copy this directory's Hugging Face tokenizer files (tokenizer.json, ...) and "
                   "size the vocabulary for it");
  init->add_option("--out", f->out, "Output directory")->required();
  registry.Add(init, [f, init] { return RunInit(*f, *init); });

  auto dir = std::make_shared<std::string>();
  CLI::App* info = model->add_subcommand("info", "Load a model directory and print its shape");
  info->add_option("dir", *dir, "Model directory")->required();
  registry.Add(info, [dir] { return RunInfo(*dir); });
}

}  // namespace prl::cli
