// `prl replay create|stat|reset`: the shared-memory replay segment from the shell (`prl replay
// serve`, the ingest role, is in role_command.cc).
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/command.h"
#include "cli/config_flags.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "replay/replay_buffer.h"
#include "roles/replay_role.h"

namespace prl::cli {

namespace {

struct CreateFlags {
  std::string name, label;
  int64_t max_groups = 0;
  bool reclaim_stale = false;
};

absl::Status RunCreate(const CreateFlags& f, const config::RunConfig& run) {
  ReplayConfig c = roles::ReplayConfigFrom(run);
  c.max_groups = f.max_groups;
  if (!f.label.empty()) c.label = f.label;
  const std::string name = f.name.empty() ? run.replay_segment() : f.name;
  PRL_ASSIGN_OR_RETURN(auto buffer, ReplayBuffer::Create(name, c, f.reclaim_stale));
  std::printf("created replay segment %s (/dev/shm/%s): %lld MiB, lease %lld ms, %s\n",
              name.c_str(), name.c_str(), static_cast<long long>(run.replay.capacity_mb),
              static_cast<long long>(c.lease_ms),
              run.replay.drop_oldest ? "drop-oldest when full" : "writers wait when full");
  return absl::OkStatus();
}

absl::Status RunStat(const std::string& name, bool json) {
  PRL_ASSIGN_OR_RETURN(const SegmentInfo info, ReplayBuffer::Inspect(name));
  const ReplayStats& s = info.stats;
  const std::pair<const char*, int64_t> counters[] = {{"capacity_bytes", s.capacity_bytes},
                                                      {"used_bytes", s.used_bytes},
                                                      {"groups_ready", s.groups_ready},
                                                      {"groups_leased", s.groups_leased},
                                                      {"writes_in_progress", s.writes_in_progress},
                                                      {"groups_in", s.groups_in},
                                                      {"records_in", s.records_in},
                                                      {"bytes_in", s.bytes_in},
                                                      {"groups_out", s.groups_out},
                                                      {"records_out", s.records_out},
                                                      {"bytes_out", s.bytes_out},
                                                      {"dropped_stale", s.dropped_stale},
                                                      {"dropped_full", s.dropped_full},
                                                      {"redelivered", s.redelivered},
                                                      {"abandoned_writes", s.abandoned_writes},
                                                      {"writer_waits", s.writer_waits},
                                                      {"write_timeouts", s.write_timeouts},
                                                      {"reader_waits", s.reader_waits},
                                                      {"lock_takeovers", s.lock_takeovers}};
  if (json) {
    nlohmann::ordered_json j;
    j["name"] = info.name;
    j["layout_version"] = info.layout_version;
    j["label"] = info.label;
    j["creator_pid"] = info.creator_pid;
    j["creator_alive"] = info.creator_alive;
    j["backpressure"] =
        info.config.backpressure == BackpressurePolicy::kBlock ? "block" : "drop_oldest";
    j["lease_ms"] = info.config.lease_ms;
    for (const auto& [k, v] : counters) j[k] = v;
    std::printf("%s\n", j.dump().c_str());
    return absl::OkStatus();
  }
  std::printf("replay segment %s (layout %u%s%s)\n", info.name.c_str(), info.layout_version,
              info.label.empty() ? "" : ", ", info.label.c_str());
  std::printf("  creator pid %d: %s\n", info.creator_pid,
              info.creator_alive ? "running"
                                 : "not running (created from the CLI, or left by a dead run: "
                                   "`prl replay reset` removes it)");
  std::printf("  backpressure %s, lease %lld ms\n",
              info.config.backpressure == BackpressurePolicy::kBlock ? "block" : "drop-oldest",
              static_cast<long long>(info.config.lease_ms));
  for (const auto& [k, v] : counters) std::printf("  %-20s %lld\n", k, static_cast<long long>(v));
  return absl::OkStatus();
}

}  // namespace

void RegisterReplayCommands(CLI::App& app, CommandRegistry& registry) {
  CLI::App* replay = app.add_subcommand("replay", "The shared-memory replay buffer segment");
  replay->require_subcommand(1);

  auto c = std::make_shared<CreateFlags>();
  CLI::App* create = replay->add_subcommand("create", "Create a replay segment in /dev/shm");
  auto flags = std::make_shared<ConfigFlags>(create);
  create->add_option("name", c->name,
                     "Segment name ([A-Za-z0-9._-]; default: the run's, prl-<run.name>-replay)");
  flags->Shorthand("--run-name", "run.name")
      .Shorthand("--capacity-mb", "replay.capacity_mb")
      .Shorthand("--lease-ms", "replay.lease_ms")
      .Shorthand("--drop-oldest", "replay.drop_oldest");
  create->add_option("--max-groups", c->max_groups, "Groups held at once (0: capacity / 4 KB)")
      ->capture_default_str();
  create->add_flag("--reclaim-stale", c->reclaim_stale,
                   "Replace an existing segment whose creator is dead");
  create->add_option("--label", c->label, "Free text kept in the header (default: the run)");
  registry.Add(create, [c, flags] {
    return flags->Run([&](const config::RunConfig& run) { return RunCreate(*c, run); });
  });

  auto stat_name = std::make_shared<std::string>();
  auto stat_json = std::make_shared<bool>(false);
  CLI::App* stat = replay->add_subcommand("stat", "Print a segment's state and counters");
  stat->add_option("name", *stat_name, "Segment name")->required();
  stat->add_flag("--json", *stat_json, "One JSON object");
  registry.Add(stat, [stat_name, stat_json] { return RunStat(*stat_name, *stat_json); });

  auto reset_name = std::make_shared<std::string>();
  auto force = std::make_shared<bool>(false);
  CLI::App* reset = replay->add_subcommand(
      "reset", "Remove a segment (refuses while its creator runs, unless --force)");
  reset->add_option("name", *reset_name, "Segment name")->required();
  reset->add_flag("--force", *force, "Remove even if its creator is running");
  registry.Add(reset, [reset_name, force] {
    PRL_RETURN_IF_ERROR(ReplayBuffer::Remove(*reset_name, *force));
    std::printf("removed replay segment %s\n", reset_name->c_str());
    return absl::OkStatus();
  });
}

}  // namespace prl::cli
