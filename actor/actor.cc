#include "actor/actor.h"

#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "replay/ingest_server.h"

namespace prl::actor {

namespace {

prl::v1::ActorCapacity CapacityOf(const Engine& engine, int32_t max_prompts_in_flight) {
  prl::v1::ActorCapacity capacity;
  capacity.set_max_samples_per_prompt(engine.options().max_num_seqs);
  capacity.set_max_tokens(engine.max_sequence_tokens());
  capacity.set_max_prompts_in_flight(max_prompts_in_flight);
  return capacity;
}

}  // namespace

GroupWriter LocalReplayWriter(ReplayBuffer* buffer, absl::Duration timeout) {
  return [buffer, timeout](absl::Span<const RolloutRecord> group) {
    return buffer->WriteGroup(group, timeout);
  };
}

absl::StatusOr<GroupWriter> RemoteReplayWriter(const std::string& address, absl::Duration timeout,
                                              int64_t max_message_bytes,
                                              const std::string& adapter_id) {
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<ReplayPushClient> client,
                       ReplayPushClient::Connect(address, max_message_bytes));
  std::shared_ptr<ReplayPushClient> shared = std::move(client);
  return GroupWriter([shared, timeout, adapter_id](absl::Span<const RolloutRecord> group) {
    PushResult result;
    return shared->Push({std::vector<RolloutRecord>(group.begin(), group.end())}, &result, timeout,
                        adapter_id);
  });
}

absl::StatusOr<std::unique_ptr<Actor>> Actor::Create(
    std::shared_ptr<const ParameterSet> initial_weights, int64_t initial_version,
    GroupWriter write_group, WeightSubscriber* weights, const ActorOptions& options) {
  if (options.max_prompts_in_flight < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "actor max_prompts_in_flight: expected >= 1, found ", options.max_prompts_in_flight));
  }
  if (!write_group) return absl::InvalidArgumentError("actor: no replay writer");
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                       Engine::Create(std::move(initial_weights), initial_version, options.engine));
  if (options.initial_adapter != nullptr) {
    PRL_RETURN_IF_ERROR(engine->SetAdapter(options.initial_adapter));
  }
  std::unique_ptr<Actor> actor(
      new Actor(std::move(engine), std::move(write_group), weights, options));
  if (absl::Status served = actor->driver_.ServeAgents(); !served.ok()) {
    return absl::Status(served.code(), absl::StrCat("actors.openai_listen: ", served.message()));
  }
  actor->stats_.Update([&](ActorStats& st) { st.weight_version = initial_version; });
  return actor;
}

Actor::Actor(std::unique_ptr<Engine> engine, GroupWriter write_group, WeightSubscriber* weights,
             const ActorOptions& options)
    : options_(options),
      book_(options.max_prompts_in_flight),
      link_(options.coordinator, options.name, CapacityOf(*engine, options.max_prompts_in_flight),
            &stats_),
      driver_(std::move(engine), weights, &book_, &stats_, options_),
      finisher_(std::move(write_group), &link_, &book_, &stats_, options_) {}

void Actor::Fail(const absl::Status& error) {
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (failure_.ok()) failure_ = error;
  }
  halted_ = true;
  book_.Wake();
}

void Actor::ControlLoop(const std::atomic<bool>* stop) {
  if (const absl::Status registered = link_.Register(stop); !registered.ok()) {
    return Fail(registered);
  }
  absl::Time next_heartbeat = absl::Now();
  while (!Halted(stop)) {
    absl::Status control = absl::OkStatus();
    link_.SendReleases(book_);  // before a heartbeat, which would drop them without their reason
    if (absl::Now() >= next_heartbeat) {
      control = link_.Heartbeat(stats_.Get().weight_version, book_);
      next_heartbeat = absl::Now() + absl::Milliseconds(link_.heartbeat_ms());
    }
    if (control.ok()) control = link_.LeaseMore(book_);
    if (absl::IsNotFound(control)) {
      // The coordinator restarted and forgot us: register again. What we generate for the
      // old leases is still accepted (lease ids name their prompt).
      if (const absl::Status again = link_.Register(stop); !again.ok()) return Fail(again);
    } else if (!control.ok() && !Transient(control)) {
      return Fail(control);
    }
    book_.Wait(absl::Milliseconds(20));
  }
}

void Actor::FinishLoop(const std::atomic<bool>* stop) {
  const auto halted = [&] { return Halted(stop); };
  while (!halted()) {
    // Stopping leaves what is not finished: those leases expire and their prompts are re-run.
    std::optional<GeneratedGroup> next = book_.NextGenerated(absl::Milliseconds(50), halted);
    if (!next.has_value()) continue;
    const absl::Status finished = finisher_.Finish(*next, halted);
    book_.Drop(next->lease.lease_id());
    if (!finished.ok()) return Fail(finished);
  }
}

absl::Status Actor::Run(const std::atomic<bool>* stop) {
  std::thread control([this, stop] { ControlLoop(stop); });
  std::thread finisher([this, stop] { FinishLoop(stop); });
  const auto halted = [&] { return Halted(stop); };
  while (!halted()) {
    if (const absl::Status s = driver_.Iteration(halted); !s.ok()) Fail(s);
  }
  halted_ = true;  // stop the other two on a stop request as well
  book_.Wake();
  control.join();
  finisher.join();
  std::lock_guard<std::mutex> lock(failure_mu_);
  return failure_;
}

}  // namespace prl::actor
