#include "bench/torch_baseline.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/child_process.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace prl::bench {

namespace {

// Runs argv (PATH lookup for argv[0]) with stdout captured and stderr inherited, so that the
// script's progress lines show; returns its stdout, or an error if it did not exit with 0.
absl::StatusOr<std::string> RunCapturingStdout(const std::vector<std::string>& argv) {
  ChildSpec spec;
  spec.name = argv[0];
  spec.argv = argv;
  spec.search_path = true;
  spec.capture_stdout = true;
  spec.own_process_group = false;  // a Ctrl-C of the benchmark stops the script too
  PRL_ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::Start(spec));
  std::string out = child.ReadStdout();
  const int status = child.Wait();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("'", absl::StrJoin(argv, " "), "' ",
                                            DescribeWaitStatus(status),
                                            " (its stderr is above; exit code 127: it could not "
                                            "be started)"));
  }
  return out;
}

// The model shape, as both scripts take it.
void AppendShapeArgs(const ModelConfig& c, std::vector<std::string>& argv) {
  for (const auto& [flag, value] : std::vector<std::pair<const char*, std::string>>{
           {"--hidden", absl::StrCat(c.hidden_size)},
           {"--layers", absl::StrCat(c.num_hidden_layers)},
           {"--heads", absl::StrCat(c.num_attention_heads)},
           {"--kv-heads", absl::StrCat(c.num_key_value_heads)},
           {"--head-dim", absl::StrCat(c.head_dim)},
           {"--intermediate", absl::StrCat(c.intermediate_size)},
           {"--vocab", absl::StrCat(c.vocab_size)},
           {"--rope-theta", absl::StrCat(c.rope_theta)},
           {"--rms-eps", absl::StrCat(c.rms_norm_eps)}}) {
    argv.push_back(flag);
    argv.push_back(value);
  }
  if (c.tie_word_embeddings) argv.push_back("--tied");
  if (!c.qkv_bias) argv.push_back("--no-qkv-bias");
  if (c.qk_norm) argv.push_back("--qk-norm");
  if (c.o_bias) argv.push_back("--o-bias");
  if (c.has_moe()) {  // the same Qwen3-MoE block (torch_model_bench.py's Model.moe)
    std::vector<int64_t> moe_layers;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      if (c.IsMoeLayer(l)) moe_layers.push_back(l);
    }
    argv.insert(argv.end(), {"--experts", absl::StrCat(c.num_experts), "--top-k",
                             absl::StrCat(c.num_experts_per_tok), "--moe-inter",
                             absl::StrCat(c.moe_intermediate_size), "--moe-layers",
                             absl::StrJoin(moe_layers, ",")});
    if (c.norm_topk_prob) argv.push_back("--norm-topk");
  }
}

std::string DeviceArg(const Device& device) {
  return device.is_cuda() ? absl::StrCat("cuda:", device.index) : "cpu";
}

absl::Status CheckCommon(const char* what, const std::string& python, DType dtype) {
  if (python.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": no Python given"));
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": dtype must be F32 or BF16"));
  }
  return absl::OkStatus();
}

// Runs a baseline script (argv[1]) and returns the JSON object it printed as its last non-empty
// stdout line (anything a library printed comes before), which must hold a "modes" object.
absl::StatusOr<nlohmann::ordered_json> RunBaselineScript(const char* what,
                                                         const std::vector<std::string>& argv) {
  struct stat st;
  if (stat(argv[1].c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(what, ": no script at '", argv[1],
                                            "' (run from the repository root, or pass "
                                            "--torch-script)"));
  }
  auto out = RunCapturingStdout(argv);
  if (!out.ok()) {
    return absl::Status(out.status().code(), absl::StrCat(what, ": ", out.status().message()));
  }
  std::string last;
  for (absl::string_view line : absl::StrSplit(*out, '\n', absl::SkipWhitespace())) {
    last = std::string(absl::StripAsciiWhitespace(line));
  }
  nlohmann::ordered_json j =
      nlohmann::ordered_json::parse(last, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("modes") || !j["modes"].is_object()) {
    return absl::InternalError(
        absl::StrCat(what, ": no JSON result on the script's stdout: '", last, "'"));
  }
  return j;
}

// A mode's "error" as text ("" when it has none).
std::string ModeError(const nlohmann::ordered_json& r) {
  if (!r.is_object()) return absl::StrCat("not an object: ", r.dump());
  if (!r.contains("error")) return "";
  return r["error"].is_string() ? r["error"].get<std::string>() : r["error"].dump();
}

// A string field, or `fallback` when it is missing or not a string (null, ...).
std::string StringField(const nlohmann::ordered_json& j, const char* key,
                        const std::string& fallback) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}

double NumberField(const nlohmann::ordered_json& r, const char* key) {
  return r.contains(key) && r[key].is_number() ? r[key].get<double>() : 0.0;
}

}  // namespace

std::vector<std::string> TorchBaselineArgv(const ModelConfig& c, const TorchBaselineOptions& o) {
  std::vector<std::string> argv = {o.python, o.script};
  AppendShapeArgs(c, argv);
  argv.insert(argv.end(), {"--tokens", absl::StrCat(o.tokens), "--seq-len", absl::StrCat(o.seq_len),
                           "--iters", absl::StrCat(o.iterations),                //
                           "--dtype", o.dtype == DType::kBF16 ? "bf16" : "f32",  //
                           "--modes", o.modes, "--device", DeviceArg(o.device),  //
                           "--peak-tflops", absl::StrCat(o.peak_tflops)});
  return argv;
}

absl::StatusOr<TorchBaseline> RunTorchBaseline(const ModelConfig& config,
                                               const TorchBaselineOptions& o) {
  PRL_RETURN_IF_ERROR(CheckCommon("torch baseline", o.python, o.dtype));
  if (o.tokens <= 0 || o.seq_len <= 0 || o.tokens % o.seq_len != 0) {
    return absl::InvalidArgumentError(absl::StrCat("torch baseline: --tokens (", o.tokens,
                                                   ") must be a multiple of --seq-len (", o.seq_len,
                                                   "): PyTorch runs a batch of equal sequences"));
  }
  PRL_ASSIGN_OR_RETURN(const nlohmann::ordered_json j,
                       RunBaselineScript("torch baseline", TorchBaselineArgv(config, o)));
  TorchBaseline result;
  result.framework = StringField(j, "framework", "pytorch");
  result.attention = StringField(j, "attention", "");
  for (const auto& [mode, r] : j["modes"].items()) {
    TorchModeResult m;
    m.mode = mode;
    m.error = ModeError(r);
    if (m.error.empty()) {
      m.forward_tokens_per_s = NumberField(r, "forward_tokens_per_s");
      m.train_tokens_per_s = NumberField(r, "train_tokens_per_s");
      m.train_tflops = NumberField(r, "train_tflops");
      if (!(m.train_tokens_per_s > 0) || !(m.forward_tokens_per_s > 0)) {
        m.error = absl::StrCat("no timings in ", r.dump());
      }
    }
    result.modes.push_back(std::move(m));
  }
  return result;
}

std::vector<std::string> TorchDecodeArgv(const ModelConfig& c, const TorchDecodeOptions& o) {
  std::vector<std::string> argv = {o.python, o.script};
  AppendShapeArgs(c, argv);
  argv.insert(argv.end(), {"--batch", absl::StrCat(o.batch), "--prompt", absl::StrCat(o.prompt),
                           "--output", absl::StrCat(o.output), "--warmup", absl::StrCat(o.warmup),
                           "--seed", absl::StrCat(o.seed),                       //
                           "--dtype", o.dtype == DType::kBF16 ? "bf16" : "f32",  //
                           "--modes", o.modes, "--device", DeviceArg(o.device)});
  return argv;
}

absl::StatusOr<TorchDecodeResult> RunTorchDecodeBaseline(const ModelConfig& config,
                                                         const TorchDecodeOptions& o) {
  PRL_RETURN_IF_ERROR(CheckCommon("torch decode baseline", o.python, o.dtype));
  if (o.batch <= 0 || o.prompt <= 0 || o.output <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("torch decode baseline: batch (", o.batch,
                                                   "), prompt (", o.prompt, ") and output (",
                                                   o.output, ") must be positive"));
  }
  PRL_ASSIGN_OR_RETURN(const nlohmann::ordered_json j,
                       RunBaselineScript("torch decode baseline", TorchDecodeArgv(config, o)));
  TorchDecodeResult result;
  result.framework = StringField(j, "framework", "pytorch");
  result.device = StringField(j, "device", "");
  result.attention = StringField(j, "attention", "");
  result.sampling = StringField(j, "sampling", "");
  for (const auto& [mode, r] : j["modes"].items()) {
    TorchDecodeMode m;
    m.mode = mode;
    m.error = ModeError(r);
    if (m.error.empty()) {
      m.prefill_s = NumberField(r, "prefill_s");
      m.decode_s = NumberField(r, "decode_s");
      m.decode_tokens_per_s = NumberField(r, "decode_tokens_per_s");
      m.step_ms = NumberField(r, "step_ms");
      if (!(m.decode_tokens_per_s > 0) || !(m.decode_s > 0)) {
        m.error = absl::StrCat("no timings in ", r.dump());
      }
    }
    result.modes.push_back(std::move(m));
  }
  return result;
}

}  // namespace prl::bench
