// `prl replay create|stat|reset|serve`: the shared-memory replay segment from the shell.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/command.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "replay/ingest_server.h"
#include "replay/replay_buffer.h"

namespace prl::cli {

namespace {

struct CreateFlags {
  std::string name, label;
  int64_t capacity_mb = 1024, max_groups = 0, lease_ms = 60'000;
  bool drop_oldest = false, reclaim_stale = false;
};

ReplayConfig ConfigFrom(const CreateFlags& f) {
  ReplayConfig c;
  c.capacity_bytes = f.capacity_mb << 20;
  c.max_groups = f.max_groups;
  c.lease_ms = f.lease_ms;
  c.backpressure = f.drop_oldest ? BackpressurePolicy::kDropOldest : BackpressurePolicy::kBlock;
  c.label = f.label;
  return c;
}

absl::Status RunCreate(const CreateFlags& f) {
  PRL_ASSIGN_OR_RETURN(auto buffer, ReplayBuffer::Create(f.name, ConfigFrom(f), f.reclaim_stale));
  std::printf("created replay segment %s (/dev/shm/%s): %lld MB\n", f.name.c_str(), f.name.c_str(),
              static_cast<long long>(f.capacity_mb));
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

struct ServeFlags {
  std::string name;
  int port = 50061;
  int64_t max_message_mb = 256, write_timeout_ms = 10'000;
};

std::atomic<bool> stop_requested{false};

absl::Status RunServe(const ServeFlags& f) {
  PRL_ASSIGN_OR_RETURN(auto buffer, ReplayBuffer::Open(f.name));
  IngestOptions options;
  options.address = absl::StrCat("0.0.0.0:", f.port);
  options.max_message_bytes = f.max_message_mb << 20;
  options.write_timeout = absl::Milliseconds(f.write_timeout_ms);
  PRL_ASSIGN_OR_RETURN(auto server, ReplayIngestServer::Start(buffer.get(), options));
  std::printf("serving replay segment %s on port %d (ReplayService, health, reflection)\n",
              f.name.c_str(), server->port());
  std::fflush(stdout);
  std::signal(SIGINT, [](int) { stop_requested = true; });
  std::signal(SIGTERM, [](int) { stop_requested = true; });
  while (!stop_requested) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server->Shutdown();
  return absl::OkStatus();
}

}  // namespace

void RegisterReplayCommands(CLI::App& app, CommandRegistry& registry) {
  CLI::App* replay = app.add_subcommand("replay", "The shared-memory replay buffer segment");
  replay->require_subcommand(1);

  auto c = std::make_shared<CreateFlags>();
  CLI::App* create = replay->add_subcommand("create", "Create a replay segment in /dev/shm");
  create->add_option("name", c->name, "Segment name ([A-Za-z0-9._-])")->required();
  create->add_option("--capacity-mb", c->capacity_mb, "Ring size")->capture_default_str();
  create->add_option("--max-groups", c->max_groups, "Groups held at once (0: capacity / 4 KB)")
      ->capture_default_str();
  create->add_option("--lease-ms", c->lease_ms, "Re-deliver a taken group not acked within this")
      ->capture_default_str();
  create->add_flag("--drop-oldest", c->drop_oldest,
                   "When full, drop the oldest ready groups instead of making writers wait");
  create->add_flag("--reclaim-stale", c->reclaim_stale,
                   "Replace an existing segment whose creator is dead");
  create->add_option("--label", c->label, "Free text kept in the header (e.g. the run id)");
  registry.Add(create, [c] { return RunCreate(*c); });

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

  auto s = std::make_shared<ServeFlags>();
  CLI::App* serve = replay->add_subcommand(
      "serve", "Serve a segment's gRPC ingest (ReplayService.Push) for remote actors");
  serve->add_option("name", s->name, "Segment name (must exist)")->required();
  serve->add_option("--port", s->port, "Listening port (0: any free port)")->capture_default_str();
  serve->add_option("--max-message-mb", s->max_message_mb, "Largest push message")
      ->capture_default_str();
  serve
      ->add_option("--write-timeout-ms", s->write_timeout_ms,
                   "How long a push waits for space before RESOURCE_EXHAUSTED")
      ->capture_default_str();
  registry.Add(serve, [s] { return RunServe(*s); });
}

}  // namespace prl::cli
