#include "roles/replay_role.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "checkpoint/hf_model_dir.h"
#include "core/status_macros.h"
#include "prl/v1/prompt.grpc.pb.h"
#include "replay/ingest_server.h"
#include "replay/record_encoder.h"
#include "replay/replay_buffer.h"
#include "roles/adapter_segments.h"
#include "roles/role_metrics.h"
#include "roles/role_security.h"
#include "rpc/grpc_util.h"

namespace prl::roles {

std::function<absl::Status(absl::Span<const RolloutRecord>, const std::string&)>
AdmitLeasedGroups(const config::RunConfig& c) {
  auto control = std::shared_ptr<prl::v1::ActorControl::Stub>(prl::v1::ActorControl::NewStub(
      rpc::NewChannel(c.coordinator_address(), rpc::ChannelArgs(int64_t{1} << 20))));
  return [control, run = c.run.name](absl::Span<const RolloutRecord> group,
                                     const std::string& adapter_id) -> absl::Status {
    if (group.empty()) return absl::InvalidArgumentError("an empty group");
    const RolloutRecord& first = group.front();
    for (size_t i = 0; i < group.size(); ++i) {
      const RolloutRecord& r = group[i];
      if (r.run_id != run) {
        return absl::PermissionDeniedError(
            absl::StrCat("run_id: expected this run's '", run, "', found '", r.run_id, "'"));
      }
      // One group is one lease's: one prompt, one group id, one actor.
      auto differs = [&](absl::string_view field, const auto& expected, const auto& found) {
        return absl::InvalidArgumentError(absl::StrCat("record ", i, " of the group: ", field,
                                                       ": expected the group's ", expected,
                                                       " (its first record's), found ", found));
      };
      if (r.prompt_set_id != first.prompt_set_id) {
        return differs("prompt_set_id", first.prompt_set_id, r.prompt_set_id);
      }
      if (r.prompt_index != first.prompt_index) {
        return differs("prompt_index", first.prompt_index, r.prompt_index);
      }
      if (r.group_id != first.group_id) return differs("group_id", first.group_id, r.group_id);
      if (r.actor_id != first.actor_id) return differs("actor_id", first.actor_id, r.actor_id);
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    prl::v1::CheckGroupRequest check;
    check.set_prompt_set_id(first.prompt_set_id);
    check.set_prompt_index(static_cast<int64_t>(first.prompt_index));
    check.set_group_id(first.group_id);
    check.set_adapter_id(adapter_id);
    prl::v1::CheckGroupResponse ignored;
    return rpc::FromGrpcStatus(control->CheckGroup(&ctx, check, &ignored));
  };
}

ReplayConfig ReplayConfigFrom(const config::RunConfig& c) {
  ReplayConfig rc;
  rc.capacity_bytes = c.replay.capacity_mb << 20;
  rc.lease_ms = c.replay.lease_ms;
  rc.backpressure =
      c.replay.drop_oldest ? BackpressurePolicy::kDropOldest : BackpressurePolicy::kBlock;
  rc.label = absl::StrCat("run ", c.run.name);
  return rc;
}

namespace {

// A run of adapters' replays on this node, by adapter id: each adapter's segment (made by the
// learner beside this role) opened on its first push, closed once the learner removed it.
class AdapterReplays {
 public:
  explicit AdapterReplays(const config::RunConfig& c) : c_(c) {}

  absl::StatusOr<std::shared_ptr<ReplayBuffer>> Find(const std::string& adapter_id) {
    // The coordinator vouched for the id (AdmitLeasedGroups); its form is checked again before
    // it names a file.
    if (!IsAdapterId(adapter_id)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "adapter_id: expected 'ad-' and 12 hex digits, found '", adapter_id.substr(0, 64), "'"));
    }
    const std::string name = AdapterReplaySegment(c_, adapter_id);
    std::error_code error;
    const bool exists = std::filesystem::exists(std::filesystem::path("/dev/shm") / name, error);
    std::lock_guard<std::mutex> lock(mu_);
    if (!exists) {  // not made yet, or removed (the adapter was deleted)
      open_.erase(adapter_id);
      return absl::UnavailableError(absl::StrCat(
          "adapter ", adapter_id, ": its replay segment ", name, " is not on this node (the "
          "learner makes it when it hears of the adapter)"));
    }
    auto it = open_.find(adapter_id);
    if (it == open_.end()) {
      PRL_ASSIGN_OR_RETURN(std::unique_ptr<ReplayBuffer> buffer, ReplayBuffer::Open(name));
      it = open_.emplace(adapter_id, std::shared_ptr<ReplayBuffer>(std::move(buffer))).first;
    }
    return it->second;
  }

 private:
  const config::RunConfig& c_;
  std::mutex mu_;
  // A push writing into one whose adapter was deleted meanwhile holds it until it is done.
  std::map<std::string, std::shared_ptr<ReplayBuffer>> open_;
};

}  // namespace

int64_t AdapterReplayCapacityBytes(const config::RunConfig& c, const ModelConfig& model) {
  constexpr int64_t kFloor = int64_t{4} << 20, kCeiling = int64_t{32} << 20;
  if (c.replay.adapter_capacity_mb > 0) return c.replay.adapter_capacity_mb << 20;
  if (c.learner.groups_per_step <= 0) return kCeiling;
  // The largest record the model allows: every position a completion token (its log-prob,
  // version, source and routes), ids at their longest, a reward component and a turn per 64
  // tokens as room for what environments add. Its size is linear in the tokens (up to each
  // section's 8-byte padding), so it is measured at 0 and 4096 tokens and extended: a model
  // file's context never makes this allocate.
  const auto record_bytes = [&](int64_t tokens) {
    RolloutRecord r;
    r.run_id = r.prompt_set_id = r.actor_id = std::string(255, 'x');
    r.prompt_tokens.assign(1, 0);
    r.completion_tokens.assign(tokens, 0);
    r.behaviour_logprobs.assign(tokens, 0.0f);
    r.token_versions.assign(tokens, 0);
    r.token_sources.assign(tokens, 0);
    r.turn_ends.assign(tokens / 64 + 1, 0);
    r.turn_rewards.assign(tokens / 64 + 1, 0.0);
    r.reward_components.assign(8, {std::string(64, 'x'), 0.0});
    if (model.num_experts > 0) {
      r.route_layers = static_cast<uint16_t>(model.num_hidden_layers);
      r.route_top_k = static_cast<uint8_t>(model.num_experts_per_tok);
      r.routes.assign(tokens * model.num_hidden_layers * model.num_experts_per_tok, 0);
    }
    return static_cast<double>(EncodedRecordSize(r));
  };
  constexpr int64_t kProbe = 4096;
  const double empty = record_bytes(0), per_token = (record_bytes(kProbe) - empty) / kProbe;
  const double tokens = static_cast<double>(std::max<int64_t>(model.max_position_embeddings, 1));
  const double samples = static_cast<double>(std::max<int64_t>(c.task.samples_per_prompt, 1));
  // + each section's padding and the group's offsets; + the frame.
  const double group_bytes = samples * (empty + tokens * per_token + 64 + 8) + 256;
  const int64_t budget_groups =
      (c.run.mode == config::RunMode::kSync ? 1 : c.learner.max_lag + 1) * c.learner.groups_per_step;
  const double wanted = 2.0 * static_cast<double>(budget_groups) * group_bytes;
  return static_cast<int64_t>(
      std::clamp<double>(wanted, static_cast<double>(kFloor), static_cast<double>(kCeiling)));
}

ReplayConfig AdapterReplayConfigFrom(const config::RunConfig& c, const ModelConfig& model) {
  ReplayConfig rc = ReplayConfigFrom(c);
  rc.capacity_bytes = AdapterReplayCapacityBytes(c, model);
  return rc;
}

absl::Status RunReplayRole(const config::RunConfig& c, const std::string& segment,
                           const std::atomic<bool>& stop) {
  PRL_RETURN_IF_ERROR(ConfigureRoleSecurity(c, rpc::Role::kLearner, {rpc::Role::kActor}));
  const std::string name = segment.empty() ? c.replay_segment() : segment;
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<RoleMetrics> endpoint, StartRoleMetrics(c.metrics));
  metrics::ProcessMetrics process(*endpoint->registry, metrics::Role::kReplay);
  // A run of adapters: no run's segment, each adapter's opened on its first push.
  const bool adapters = c.coordinator.adapters && segment.empty();
  // The run's segment is created by the learner beside it: wait for it (not ready meanwhile,
  // saying so every 30 s). A segment named on the command line must exist.
  absl::StatusOr<std::unique_ptr<ReplayBuffer>> opened =
      adapters ? std::unique_ptr<ReplayBuffer>() : ReplayBuffer::Open(name);
  for (int waited_ms = 0; segment.empty() && absl::IsNotFound(opened.status()) && !stop;
       waited_ms += 200) {
    if (waited_ms % 30'000 == 0) {
      std::printf("replay: waiting for the learner to create segment %s\n", name.c_str());
      std::fflush(stdout);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    opened = ReplayBuffer::Open(name);
  }
  if (stop && !opened.ok()) return absl::OkStatus();
  PRL_ASSIGN_OR_RETURN(auto buffer, std::move(opened));
  IngestOptions options;
  options.address = c.replay.listen;
  options.max_message_bytes = c.replay.max_message_mb << 20;
  options.write_timeout = absl::Milliseconds(c.replay.write_timeout_ms);
  options.admit = AdmitLeasedGroups(c);
  metrics::IngestMetrics ingested(*endpoint->registry);
  options.on_written = [&ingested](size_t records) {
    ingested.groups.Increment();
    ingested.records.Increment(static_cast<double>(records));
  };
  AdapterReplays adapter_replays(c);
  if (adapters) {
    options.adapter_buffer = [&adapter_replays](const std::string& adapter_id) {
      return adapter_replays.Find(adapter_id);
    };
  }
  // Quarantine: groups the model cannot take are refused here, before the learner sees them
  // (the learner checks token versions against its own; the ingest cannot know it).
  if (!c.model.path.empty()) {
    PRL_ASSIGN_OR_RETURN(const ModelConfig model, ReadModelConfig(c.model.path));
    options.model = LimitsOfModel(model);
  }
  options.dead_letter_path = c.dead_letter_file("ingest");
  PRL_ASSIGN_OR_RETURN_IN(auto server, ReplayIngestServer::Start(buffer.get(), options),
                          "replay.listen");
  const std::string served =
      adapters ? absl::StrCat("each adapter's replay segment ", name, "-<adapter id>")
               : absl::StrCat("replay segment ", name);
  std::printf(
      "serving %s on port %d (ReplayService, health, reflection)%s; messages up to %lld MiB, "
      "writes wait %lld ms for space\n",
      served.c_str(), server->port(), endpoint->Describe().c_str(),
      static_cast<long long>(c.replay.max_message_mb),
      static_cast<long long>(c.replay.write_timeout_ms));
  std::fflush(stdout);
  endpoint->SetReadiness([] { return absl::OkStatus(); });
  metrics::QuarantineMetrics dead_letters(*endpoint->registry);
  while (!stop) {
    ExportDeadLetters(server->dead_letters(), dead_letters);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  endpoint->SetReadiness(nullptr);
  server->Shutdown();
  return absl::OkStatus();
}

}  // namespace prl::roles
