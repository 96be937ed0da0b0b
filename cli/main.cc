// prl: one binary, one subcommand per role or tool (docs/architecture.md, "CLI").
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cli/command.h"
#include "core/device.h"
#include "core/status_macros.h"
#include "kernels/cpu/blas_tuning.h"
#include "kernels/matmul.h"

namespace prl::cli {

absl::Status CommandRegistry::RunParsed() const {
  const Entry* chosen = nullptr;
  for (const Entry& e : commands_) {
    if (!e.command->parsed()) continue;
    // Deeper commands are registered after their parents' siblings; prefer the one with no
    // parsed subcommand of its own.
    if (e.command->get_subcommands().empty()) chosen = &e;
  }
  if (chosen == nullptr) return absl::InvalidArgumentError("no command given; see prl --help");
  return chosen->action();
}

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("prl");
}

absl::StatusOr<Device> ResolveDeviceFlag(const std::string& flag) {
  absl::StatusOr<Device> device = ResolveDevice(flag);
  if (device.ok() && flag == "auto" && device->is_cpu() && CudaCompiled()) {
    std::fprintf(stderr, "prl: --device auto: using the CPU backend (%s)\n",
                 DescribeBackends().c_str());
  }
  return device;
}

absl::StatusOr<DType> ResolveComputeDType(const std::string& flag, Device device) {
  PRL_ASSIGN_OR_RETURN(const DType dtype, ParseEnum(kComputeDTypeNames, flag, "--dtype"));
  if (dtype == DType::kF32) return dtype;
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat("--dtype bf16 runs on CUDA only; the ",
                                                   device.ToString(), " backend is fp32"));
  }
  return DType::kBF16;
}

void AddInvariantTensorCoreFlags(CLI::App* command) {
  command->add_flag_callback(
      "--invariant-tensor-cores", [] { kernels::SetTensorCoreInvariantGemm(true); },
      "CUDA, with the batch-invariant mode: its BF16 products on the tensor cores (the default; "
      "kernels/cuda/gemm.h)");
  command->add_flag_callback(
      "--no-invariant-tensor-cores", [] { kernels::SetTensorCoreInvariantGemm(false); },
      "CUDA, with the batch-invariant mode: its BF16 products on the CUDA cores (slower; every "
      "process whose results must match needs the same choice)");
}

}  // namespace prl::cli

int main(int argc, char** argv) {
  // A crash (SIGSEGV, SIGABRT, ...) prints the signal and a symbolised stack trace to stderr,
  // which every role's log keeps, then dies with the same signal.
  absl::InitializeSymbolizer(argv[0]);
  absl::InstallFailureSignalHandler(absl::FailureSignalHandlerOptions());
  std::signal(SIGTERM, SIG_DFL);  // a stop request is no failure: no trace, default exit
  // Run data (prompts, completions, checkpoints, logs) is private unless the run config's
  // run.umask says otherwise (cli/config_flags.cc applies it).
  umask(077);
  // Debian's abseil is built with absl::Mutex deadlock detection on (as without NDEBUG): every
  // lock of gRPC's mutexes then updates one process-wide lock graph under a global lock, which
  // serialises the servers' threads. prl's own code uses std::mutex; the check is a debug aid.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  prl::kernels::cpu::ReexecWithTunedOpenBlasIfNeeded(argv);
  CLI::App app{
      "prl: asynchronous Pipeline-RL for language models.\n"
      "Roles: run (everything on this machine), coordinator, actor, learner serve; clients: "
      "submit, status; tools: model, score, generate, replay, learner step|train, export, bench."};
  app.set_version_flag(
      "--version", [] { return absl::StrCat("prl 0.1.0, backends: ", prl::DescribeBackends()); });
  app.require_subcommand(1);
  int threads = 0;
  app.add_option("--threads", threads,
                 "CPU threads for kernels and BLAS (0: all cores, or OMP_NUM_THREADS)")
      ->check(CLI::NonNegativeNumber);

  prl::cli::CommandRegistry registry;
  prl::cli::RegisterModelCommands(app, registry);
  prl::cli::RegisterScoreCommand(app, registry);
  prl::cli::RegisterAdapterCommands(app, registry);
  prl::cli::RegisterTokenizeCommand(app, registry);
  prl::cli::RegisterTaskCommands(app, registry);
  prl::cli::RegisterGenerateCommand(app, registry);
  prl::cli::RegisterReplayCommands(app, registry);
  prl::cli::RegisterClientCommands(app, registry);
  prl::cli::RegisterEnvCommands(app, registry);
  prl::cli::RegisterLearnerCommands(app, registry, argc, argv);
  prl::cli::RegisterRoleCommands(app, registry, argc, argv);
  prl::cli::RegisterBenchCommands(app, registry, argc, argv);
  prl::cli::RegisterRunCommands(app, registry);

  CLI11_PARSE(app, argc, argv);
  if (threads > 0) omp_set_num_threads(threads);

  const absl::Status status = registry.RunParsed();
  if (!status.ok()) {
    std::fprintf(stderr, "prl: error: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
