// How `prl` subcommands plug into the one binary: each cli/*_command.cc registers its CLI11
// subcommands and an action returning absl::Status; main() parses, runs the action of the
// subcommand that was given, and turns an error status into a message and exit code 1.
#pragma once

#include <functional>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/dtype.h"

namespace prl::cli {

class CommandRegistry {
 public:
  void Add(CLI::App* command, std::function<absl::Status()> action) {
    commands_.push_back({command, std::move(action)});
  }
  // Runs the action of the parsed command (the deepest one, for nested subcommands).
  absl::Status RunParsed() const;

 private:
  struct Entry {
    CLI::App* command;
    std::function<absl::Status()> action;
  };
  std::vector<Entry> commands_;
};

void RegisterModelCommands(CLI::App& app, CommandRegistry& registry);
void RegisterScoreCommand(CLI::App& app, CommandRegistry& registry);
void RegisterAdapterCommands(CLI::App& app, CommandRegistry& registry);
void RegisterTokenizeCommand(CLI::App& app, CommandRegistry& registry);
void RegisterTaskCommands(CLI::App& app, CommandRegistry& registry);
void RegisterGenerateCommand(CLI::App& app, CommandRegistry& registry);
void RegisterReplayCommands(CLI::App& app, CommandRegistry& registry);
void RegisterClientCommands(CLI::App& app, CommandRegistry& registry);
void RegisterEnvCommands(CLI::App& app, CommandRegistry& registry);
// After RegisterLearnerCommands and RegisterReplayCommands (adds `learner serve`, `replay serve`).
void RegisterRoleCommands(CLI::App& app, CommandRegistry& registry, int argc, char** argv);
void RegisterBenchCommands(CLI::App& app, CommandRegistry& registry, int argc, char** argv);
void RegisterBroadcastBench(CLI::App* bench, CommandRegistry& registry);  // by the above
// After RegisterBenchCommands (adds `bench e2e`).
void RegisterRunCommands(CLI::App& app, CommandRegistry& registry);
// The ranks of `prl learner step` re-execute the command line they were given.
void RegisterLearnerCommands(CLI::App& app, CommandRegistry& registry, int argc, char** argv);

// This binary's path (/proc/self/exe), for the processes a command starts.
std::string SelfPath();

// Shared by commands that read a model: a --device flag value resolved with a note on stderr
// when "auto" falls back to the CPU.
absl::StatusOr<Device> ResolveDeviceFlag(const std::string& flag);
// --dtype of the tools (core/dtype.h kComputeDTypeNames): fp32 (exact mode, every backend) or
// bf16 (CUDA only).
absl::StatusOr<DType> ResolveComputeDType(const std::string& flag, Device device);
// --invariant-tensor-cores (the default) and --no-invariant-tensor-cores: the batch-invariant
// mode's BF16 products on the tensor cores or on the CUDA cores (kernels/cuda/gemm.h).
void AddInvariantTensorCoreFlags(CLI::App* command);

}  // namespace prl::cli
