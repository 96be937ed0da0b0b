// The service roles as commands: `prl coordinator`, `prl actor`, `prl learner serve`, `prl
// replay serve` and `prl reward serve`. Each parses its config flags (cli/config_flags.h) and runs
// the role from roles/; the roles take every setting from the run config.
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/config_flags.h"
#include "roles/actor_role.h"
#include "roles/coordinator_role.h"
#include "roles/learner_role.h"
#include "roles/replay_role.h"
#include "roles/reward_role.h"
#include "roles/stop_signal.h"

namespace prl::cli {

namespace {

CLI::App* FindSubcommand(CLI::App& parent, const std::string& name) {
  for (CLI::App* sub : parent.get_subcommands({})) {
    if (sub->get_name() == name) return sub;
  }
  return nullptr;
}

void RegisterCoordinator(CLI::App& app, CommandRegistry& registry) {
  CLI::App* cmd = app.add_subcommand(
      "coordinator",
      "The prompt-set service: durable prompt sets, leases to actors, the staleness budget");
  auto flags = std::make_shared<ConfigFlags>(cmd);
  flags->Shorthand("--model", "model.path")
      .Shorthand("--listen", "coordinator.listen")
      .Shorthand("--log", "coordinator.log")
      .Shorthand("--lease-ms", "coordinator.lease_ms")
      .Shorthand("--heartbeat-ms", "coordinator.heartbeat_ms")
      .Shorthand("--max-pending-prompts", "coordinator.max_pending_prompts")
      .Shorthand("--max-samples-per-prompt", "coordinator.max_samples_per_prompt")
      .Shorthand("--max-lag", "learner.max_lag")
      .Shorthand("--groups-per-step", "learner.groups_per_step")
      .Shorthand("--mode", "run.mode")
      .Shorthand("--metrics-listen", "metrics.listen");
  registry.Add(cmd, [flags] {
    return flags->Run([](const config::RunConfig& c) {
      return roles::RunCoordinatorRole(c, roles::StopOnSignals());
    });
  });
}

void RegisterActor(CLI::App& app, CommandRegistry& registry) {
  CLI::App* cmd = app.add_subcommand(
      "actor",
      "An actor server: leases prompts, generates groups, writes them to the replay buffer, "
      "swaps in new weights between engine steps");
  auto flags = std::make_shared<ConfigFlags>(cmd);
  auto name = std::make_shared<std::string>();
  cmd->add_option("--name", *name, "This actor's name (logs, records; default: host-pid)");
  flags->Shorthand("--model", "model.path")
      .Shorthand("--run-name", "run.name")
      .Shorthand("--coordinator", "coordinator.address")
      .Shorthand("--device", "actors.device")
      .Shorthand("--dtype", "actors.dtype")
      .Shorthand("--gpu-memory-fraction", "actors.gpu_memory_fraction")
      .Shorthand("--kv-cache-mb", "actors.kv_cache_mb")
      .Shorthand("--max-num-seqs", "actors.max_num_seqs")
      .Shorthand("--max-prompts-in-flight", "actors.max_prompts_in_flight")
      .Shorthand("--replay-timeout-s", "actors.replay_timeout_s")
      .Shorthand("--replay-address", "replay.address")
      .Shorthand("--transport", "broadcast.transport")
      .Shorthand("--weights-address", "broadcast.address")
      .Shorthand("--metrics-listen", "metrics.listen");
  registry.Add(cmd, [flags, name] {
    return flags->Run([&](const config::RunConfig& c) {
      return roles::RunActorRole(c, {.name = *name}, roles::StopOnSignals());
    });
  });
}

void RegisterLearnerServe(CLI::App& app, CommandRegistry& registry,
                          const std::vector<std::string>& argv) {
  CLI::App* cmd =
      FindSubcommand(app, "learner")
          ->add_subcommand(
              "serve",
              "The learner role: trains on groups from the replay buffer, publishes weights, "
              "checkpoints; resumes from its checkpoint");
  auto flags = std::make_shared<ConfigFlags>(cmd);
  flags->Shorthand("--model", "model.path")
      .Shorthand("--run-name", "run.name")
      .Shorthand("--coordinator", "coordinator.address")
      .Shorthand("--world-size", "learner.world_size")
      .Shorthand("--device", "learner.device")
      .Shorthand("--dtype", "learner.dtype")
      .Shorthand("--steps", "learner.steps")
      .Shorthand("--groups-per-step", "learner.groups_per_step")
      .Shorthand("--max-lag", "learner.max_lag")
      .Shorthand("--loss", "learner.loss")
      .Shorthand("--advantage", "learner.advantage")
      .Shorthand("--optimizer", "learner.optimizer")
      .Shorthand("--lr", "learner.lr")
      .Shorthand("--max-grad-norm", "learner.max_grad_norm")
      .Shorthand("--micro-batch-tokens", "learner.micro_batch_tokens")
      .Shorthand("--checkpoint-dir", "learner.checkpoint_dir")
      .Shorthand("--checkpoint-every", "learner.checkpoint_every")
      .Shorthand("--timeout-s", "learner.timeout_s")
      .Shorthand("--report-file", "learner.report_file")
      .Shorthand("--replay-mb", "replay.capacity_mb")
      .Shorthand("--transport", "broadcast.transport")
      .Shorthand("--weights-listen", "broadcast.listen")
      .Shorthand("--metrics-listen", "metrics.listen");
  registry.Add(cmd, [flags, argv] {
    return flags->Run([&](const config::RunConfig& c) {
      return roles::RunLearnerRole(c, argv, roles::StopOnSignals());
    });
  });
}

void RegisterReplayServe(CLI::App& app, CommandRegistry& registry) {
  CLI::App* cmd =
      FindSubcommand(app, "replay")
          ->add_subcommand(
              "serve",
              "Serve a replay segment's gRPC ingest (ReplayService.Push) for remote actors");
  auto flags = std::make_shared<ConfigFlags>(cmd);
  auto segment = std::make_shared<std::string>();
  cmd->add_option("name", *segment, "Segment name (default: the run's, prl-<run.name>-replay)");
  flags->Shorthand("--run-name", "run.name")
      .Shorthand("--listen", "replay.listen")
      .Shorthand("--max-message-mb", "replay.max_message_mb")
      .Shorthand("--write-timeout-ms", "replay.write_timeout_ms")
      .Shorthand("--metrics-listen", "metrics.listen");
  registry.Add(cmd, [flags, segment] {
    return flags->Run([&](const config::RunConfig& c) {
      return roles::RunReplayRole(c, *segment, roles::StopOnSignals());
    });
  });
}

void RegisterRewardServe(CLI::App& app, CommandRegistry& registry) {
  CLI::App* reward = app.add_subcommand("reward", "The reward service");
  reward->require_subcommand(1);
  CLI::App* cmd = reward->add_subcommand(
      "serve", "Serve the run's task reward (task.reward) as a gRPC RewardService");
  auto flags = std::make_shared<ConfigFlags>(cmd);
  flags->Shorthand("--reward", "task.reward")
      .Shorthand("--credit", "task.credit")
      .Shorthand("--listen", "reward.listen")
      .Shorthand("--max-message-mb", "reward.max_message_mb");
  registry.Add(cmd, [flags] {
    return flags->Run(
        [](const config::RunConfig& c) { return roles::RunRewardRole(c, roles::StopOnSignals()); });
  });
}

}  // namespace

void RegisterRoleCommands(CLI::App& app, CommandRegistry& registry, int argc, char** argv) {
  RegisterCoordinator(app, registry);
  RegisterActor(app, registry);
  RegisterLearnerServe(app, registry, std::vector<std::string>(argv, argv + argc));
  RegisterReplayServe(app, registry);
  RegisterRewardServe(app, registry);
}

}  // namespace prl::cli
