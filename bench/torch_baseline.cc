#include "bench/torch_baseline.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace prl::bench {

namespace {

// Runs argv (PATH lookup for argv[0]) with stdout captured and stderr inherited, so that the
// script's progress lines show; returns its stdout, or an error if it did not exit with 0.
absl::StatusOr<std::string> RunCapturingStdout(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawn_err = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (spawn_err != 0) {
    close(fds[0]);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot run '", argv[0], "': ", std::strerror(spawn_err)));
  }
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(
        absl::StrCat("'", absl::StrJoin(argv, " "), "' ",
                     WIFEXITED(status) ? absl::StrCat("exited with ", WEXITSTATUS(status))
                                       : absl::StrCat("was killed by signal ", WTERMSIG(status)),
                     " (its stderr is above)"));
  }
  return out;
}

}  // namespace

std::vector<std::string> TorchBaselineArgv(const ModelConfig& c, const TorchBaselineOptions& o) {
  std::vector<std::string> argv = {
      o.python,         o.script,
      "--hidden",       absl::StrCat(c.hidden_size),
      "--layers",       absl::StrCat(c.num_hidden_layers),
      "--heads",        absl::StrCat(c.num_attention_heads),
      "--kv-heads",     absl::StrCat(c.num_key_value_heads),
      "--head-dim",     absl::StrCat(c.head_dim),
      "--intermediate", absl::StrCat(c.intermediate_size),
      "--vocab",        absl::StrCat(c.vocab_size),
      "--rope-theta",   absl::StrCat(c.rope_theta),
      "--rms-eps",      absl::StrCat(c.rms_norm_eps),
      "--tokens",       absl::StrCat(o.tokens),
      "--seq-len",      absl::StrCat(o.seq_len),
      "--iters",        absl::StrCat(o.iterations),
      "--dtype",        o.dtype == DType::kBF16 ? "bf16" : "f32",
      "--modes",        o.modes,
      "--device",       o.device.is_cuda() ? absl::StrCat("cuda:", o.device.index) : "cpu",
      "--peak-tflops",  absl::StrCat(o.peak_tflops)};
  if (c.tie_word_embeddings) argv.push_back("--tied");
  if (!c.qkv_bias) argv.push_back("--no-qkv-bias");
  return argv;
}

absl::StatusOr<TorchBaseline> RunTorchBaseline(const ModelConfig& config,
                                               const TorchBaselineOptions& o) {
  if (o.python.empty()) return absl::InvalidArgumentError("torch baseline: no Python given");
  if (o.dtype != DType::kF32 && o.dtype != DType::kBF16) {
    return absl::InvalidArgumentError("torch baseline: dtype must be F32 or BF16");
  }
  if (o.tokens <= 0 || o.seq_len <= 0 || o.tokens % o.seq_len != 0) {
    return absl::InvalidArgumentError(absl::StrCat("torch baseline: --tokens (", o.tokens,
                                                   ") must be a multiple of --seq-len (", o.seq_len,
                                                   "): PyTorch runs a batch of equal sequences"));
  }
  struct stat st;
  if (stat(o.script.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("torch baseline: no script at '", o.script,
                                            "' (run from the repository root, or pass "
                                            "--torch-script)"));
  }
  const std::vector<std::string> argv = TorchBaselineArgv(config, o);
  auto out = RunCapturingStdout(argv);
  if (!out.ok())
    return absl::Status(out.status().code(),
                        absl::StrCat("torch baseline: ", out.status().message()));
  // The JSON object is the last non-empty line (anything a library printed comes before).
  std::string last;
  for (absl::string_view line : absl::StrSplit(*out, '\n', absl::SkipWhitespace())) {
    last = std::string(absl::StripAsciiWhitespace(line));
  }
  const nlohmann::ordered_json j =
      nlohmann::ordered_json::parse(last, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("modes") || !j["modes"].is_object()) {
    return absl::InternalError(
        absl::StrCat("torch baseline: no JSON result on the script's stdout: '", last, "'"));
  }
  TorchBaseline result;
  result.framework = j.value("framework", "pytorch");
  result.attention = j.value("attention", "");
  for (const auto& [mode, r] : j["modes"].items()) {
    TorchModeResult m;
    m.mode = mode;
    if (r.contains("error")) {
      m.error = r["error"].is_string() ? r["error"].get<std::string>() : r["error"].dump();
    } else {
      m.forward_tokens_per_s = r.value("forward_tokens_per_s", 0.0);
      m.train_tokens_per_s = r.value("train_tokens_per_s", 0.0);
      m.train_tflops = r.value("train_tflops", 0.0);
      if (!(m.train_tokens_per_s > 0) || !(m.forward_tokens_per_s > 0)) {
        m.error = absl::StrCat("no timings in ", r.dump());
      }
    }
    result.modes.push_back(std::move(m));
  }
  return result;
}

}  // namespace prl::bench
