#include "actor/actor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/group_id.h"
#include "core/status_macros.h"
#include "core/test_hooks.h"
#include "core/xxhash_inline.h"
#include "rpc/grpc_util.h"

namespace prl::actor {

namespace v1 = prl::v1;

namespace {

int64_t NowNanos() { return absl::ToUnixNanos(absl::Now()); }

bool Transient(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsAborted(s);
}

RolloutFinishReason ToRollout(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return RolloutFinishReason::kStop;
    case FinishReason::kAbort:
      return RolloutFinishReason::kAbort;
    default:
      return RolloutFinishReason::kLength;
  }
}

prl::v1::ActorCapacity CapacityOf(const Engine& engine) {
  prl::v1::ActorCapacity capacity;
  capacity.set_max_samples_per_prompt(engine.options().max_num_seqs);
  capacity.set_max_tokens(engine.max_sequence_tokens());
  return capacity;
}

}  // namespace

GroupWriter LocalReplayWriter(ReplayBuffer* buffer, absl::Duration timeout) {
  return [buffer, timeout](absl::Span<const RolloutRecord> group) {
    return buffer->WriteGroup(group, timeout);
  };
}

absl::StatusOr<GroupWriter> RemoteReplayWriter(const std::string& address, absl::Duration timeout) {
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<ReplayPushClient> client,
                       ReplayPushClient::Connect(address));
  std::shared_ptr<ReplayPushClient> shared = std::move(client);
  return GroupWriter([shared, timeout](absl::Span<const RolloutRecord> group) {
    PushResult result;
    return shared->Push({std::vector<RolloutRecord>(group.begin(), group.end())}, &result, timeout);
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
  std::unique_ptr<Actor> actor(
      new Actor(std::move(engine), std::move(write_group), weights, options));
  actor->stats_.weight_version = initial_version;
  return actor;
}

Actor::Actor(std::unique_ptr<Engine> engine, GroupWriter write_group, WeightSubscriber* weights,
             const ActorOptions& options)
    : engine_(std::move(engine)),
      write_group_(std::move(write_group)),
      weights_(weights),
      options_(options),
      capacity_(CapacityOf(*engine_)),
      control_(v1::ActorControl::NewStub(
          rpc::NewChannel(options.coordinator, rpc::ChannelArgs(int64_t{64} << 20)))) {}

ActorStats Actor::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

absl::Status Actor::Register(const std::atomic<bool>* stop) {
  absl::Duration backoff = absl::Milliseconds(100);
  while (!stop->load()) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::RegisterRequest request;
    request.set_actor_name(options_.name);
    *request.mutable_capacity() = capacity_;
    v1::RegisterResponse response;
    const absl::Status s = rpc::FromGrpcStatus(control_->Register(&ctx, request, &response));
    if (s.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        actor_id_ = response.actor_id();
      }
      heartbeat_ms_ = response.heartbeat_ms();
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++stats_.registrations;
      return absl::OkStatus();
    }
    if (!Transient(s)) return s;
    absl::SleepFor(backoff);  // the coordinator may start after us, or be restarting
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
  return absl::CancelledError("actor stopped before it could register");
}

std::string Actor::ActorId() {
  std::lock_guard<std::mutex> lock(mu_);
  return actor_id_;
}

void Actor::Drop(const std::string& lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  held_.erase(lease_id);
  changed_.notify_all();
}

void Actor::Release(const std::string& lease_id, v1::ReleaseReason reason,
                    const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  held_.erase(lease_id);
  v1::ReleaseRequest& release = releases_.emplace_back();
  release.set_lease_id(lease_id);
  release.set_reason(reason);
  release.set_detail(std::string(why.message()));
  changed_.notify_all();
}

void Actor::SendReleases() {
  std::deque<v1::ReleaseRequest> releases;
  std::string actor_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    releases.swap(releases_);
    actor_id = actor_id_;
  }
  for (v1::ReleaseRequest& release : releases) {
    release.set_actor_id(actor_id);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ReleaseResponse response;
    const absl::Status s = rpc::FromGrpcStatus(control_->Release(&ctx, release, &response));
    if (!s.ok()) {
      // The lease already ended (expired, re-registered) or the coordinator is away: the next
      // heartbeat no longer lists it, so it is re-queued anyway.
      std::fprintf(stderr, "actor %s: cannot release %s: %s\n", options_.name.c_str(),
                   release.lease_id().c_str(), std::string(s.message()).c_str());
      continue;
    }
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.leases_released;
  }
}

void Actor::Fail(const absl::Status& error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_.ok()) failure_ = error;
  halted_ = true;
  changed_.notify_all();
}

absl::Status Actor::Heartbeat() {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::HeartbeatRequest request;
  request.set_weight_version(stats().weight_version);
  {
    std::lock_guard<std::mutex> lock(mu_);
    request.set_actor_id(actor_id_);
    for (const std::string& id : held_) request.add_held_lease_ids(id);
    for (const v1::ReleaseRequest& r : releases_) request.add_held_lease_ids(r.lease_id());
  }
  v1::HeartbeatResponse response;
  return rpc::FromGrpcStatus(control_->Heartbeat(&ctx, request, &response));
}

absl::Status Actor::SwapIfNewer() {
  if (weights_ == nullptr) return absl::OkStatus();
  // The engine applies staged weights at its next Step: ask only for versions newer than the
  // one staged, or an idle engine would re-take (and re-copy) the same version every loop.
  staged_version_ = std::max(staged_version_, engine_->Stats().weight_version);
  PRL_ASSIGN_OR_RETURN(std::optional<VersionedWeights> next, weights_->TakeNewer(staged_version_));
  if (!next.has_value()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  PRL_RETURN_IF_ERROR(engine_->SwapWeights(next->weights, next->version));
  staged_version_ = next->version;
  if (options_.weight_metrics != nullptr) {
    options_.weight_metrics->swap_stall_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
  if (options_.process_metrics != nullptr) {
    options_.process_metrics->weight_version.Set(static_cast<double>(next->version));
  }
  std::lock_guard<std::mutex> lock(stats_mu_);
  ++stats_.weight_swaps;
  stats_.weight_version = next->version;
  return absl::OkStatus();
}

void Actor::UpdateTransferMetrics() {
  if (weights_ == nullptr || options_.weight_metrics == nullptr) return;
  const SubscriberStats s = weights_->stats();
  metrics::AdvanceCounterTo(options_.weight_metrics->transfer_bytes,
                            static_cast<double>(s.bytes_received));
  const int64_t received = s.versions_received - versions_received_seen_;
  if (received <= 0) return;
  const double each = (s.total_transfer_seconds - transfer_seconds_seen_) / received;
  for (int64_t i = 0; i < received; ++i) options_.weight_metrics->transfer_seconds.Observe(each);
  versions_received_seen_ = s.versions_received;
  transfer_seconds_seen_ = s.total_transfer_seconds;
}

void Actor::UpdateEngineGauges() {
  UpdateTransferMetrics();
  if (options_.metrics == nullptr) return;
  const EngineStats s = engine_->Stats();
  options_.metrics->sequences_running.Set(static_cast<double>(s.num_running));
  options_.metrics->sequences_waiting.Set(static_cast<double>(s.num_waiting));
  options_.metrics->groups_in_flight.Set(static_cast<double>(in_flight_.size()));
  // Leased groups go to the engine at once; those not started are its waiting sequences.
  int64_t samples = 0;
  for (const auto& [id, job] : in_flight_) samples += job.lease.samples();
  const double mean_group =
      in_flight_.empty() ? 1.0 : static_cast<double>(samples) / in_flight_.size();
  options_.metrics->groups_pending.Set(
      std::min(static_cast<double>(in_flight_.size()),
               std::ceil(s.num_waiting / std::max(mean_group, 1.0))));
  metrics::AdvanceCounterTo(options_.metrics->preemptions, static_cast<double>(s.preemptions));
  metrics::AdvanceCounterTo(options_.metrics->prefill_tokens,
                            static_cast<double>(s.prefill_tokens));
  // The pool is allocated whole (EngineOptions::kv_cache_bytes) and used by blocks.
  const double capacity = static_cast<double>(options_.engine.kv_cache_bytes);
  const double used_fraction =
      s.total_blocks > 0 ? static_cast<double>(s.total_blocks - s.free_blocks) / s.total_blocks : 0;
  options_.metrics->kv_cache_used_bytes.Set(capacity * used_fraction);
  options_.metrics->kv_cache_capacity_bytes.Set(capacity);
}

absl::Status Actor::LeaseMore() {
  v1::LeaseRequest request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t room = options_.max_prompts_in_flight - static_cast<int64_t>(held_.size());
    if (room <= 0) return absl::OkStatus();
    request.set_actor_id(actor_id_);
    request.set_max_prompts(static_cast<int32_t>(room));
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::LeaseResponse response;
  PRL_RETURN_IF_ERROR(rpc::FromGrpcStatus(control_->LeasePrompts(&ctx, request, &response)));
  if (response.prompts().empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  for (const v1::LeasedPrompt& lease : response.prompts()) {
    held_.insert(lease.lease_id());  // before the next heartbeat, which this thread sends
    leased_.push_back({lease, response.min_weight_version(), absl::Now()});
  }
  changed_.notify_all();
  return absl::OkStatus();
}

absl::Status Actor::AddLeased() {
  std::deque<Leased> incoming, waiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming.swap(leased_);
  }
  // The version in use, not the one staged: a CUDA engine flips to staged weights only once
  // their conversion is done (engine.h), so every token of a prompt added now is sampled from
  // `held` or newer. Fixed weights: nothing to wait for.
  const int64_t held = engine_->Stats().weight_version;
  for (Leased& l : incoming) {
    if (weights_ != nullptr && l.min_weight_version > held) {
      if (absl::Now() - l.leased_at > options_.weight_wait_timeout) {
        return absl::DeadlineExceededError(absl::StrCat(
            "actor ", options_.name, ": the coordinator requires weight version ",
            l.min_weight_version, " but the newest delivered is ", held, " after ",
            absl::FormatDuration(options_.weight_wait_timeout), " (is the learner publishing?)"));
      }
      waiting.push_back(std::move(l));
      continue;
    }
    const v1::LeasedPrompt& lease = l.lease;
    SamplingParams params;
    params.n = lease.samples();
    params.temperature = lease.sampling().temperature();
    params.top_p = lease.sampling().top_p();
    params.top_k = lease.sampling().top_k();
    params.max_tokens = lease.sampling().max_tokens();
    params.seed =
        lease.sampling().seed() ^ XXH3_64bits(lease.lease_id().data(), lease.lease_id().size());
    params.stop_token_ids.assign(lease.sampling().stop_token_ids().begin(),
                                 lease.sampling().stop_token_ids().end());
    std::vector<int32_t> prompt(lease.prompt_tokens().begin(), lease.prompt_tokens().end());
    absl::StatusOr<uint64_t> id = engine_->AddRequest(std::move(prompt), params);
    if (!id.ok()) {
      // The coordinator validated the prompt against its model and this actor's capacity;
      // this engine cannot run it all the same (e.g. the coordinator's model is not ours).
      std::fprintf(stderr, "actor %s: cannot generate %s: %s\n", options_.name.c_str(),
                   lease.lease_id().c_str(), std::string(id.status().message()).c_str());
      Release(lease.lease_id(), v1::RELEASE_REASON_ENGINE_REFUSED, id.status());
      continue;
    }
    in_flight_[*id] = InFlight{lease, NowNanos()};
  }
  waiting_for_weights_ = !waiting.empty();
  if (waiting_for_weights_) {  // ahead of leases granted meanwhile, in their order
    std::lock_guard<std::mutex> lock(mu_);
    leased_.insert(leased_.begin(), std::make_move_iterator(waiting.begin()),
                   std::make_move_iterator(waiting.end()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Actor::Text(absl::Span<const int32_t> ids) const {
  if (options_.text != nullptr) return options_.text->DecodeCompletion(ids);
  return absl::StrJoin(ids, " ");
}

absl::StatusOr<reward::RewardFunction*> Actor::RewardFor(const v1::RewardSpec& spec) {
  const std::string key = spec.SerializeAsString();
  auto it = rewards_.find(key);
  if (it != rewards_.end()) return it->second.get();
  reward::RewardSpec parsed;
  parsed.name = spec.name();
  for (const auto& [k, v] : spec.params()) parsed.params[k] = v;
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<reward::RewardFunction> fn,
                       reward::MakeRewardFunction(parsed));
  return (rewards_[key] = std::move(fn)).get();
}

absl::StatusOr<std::vector<reward::RewardInput>> Actor::RewardInputs(const RequestOutput& output,
                                                                     const v1::LeasedPrompt& lease,
                                                                     uint64_t group_id) const {
  PRL_ASSIGN_OR_RETURN(const std::string prompt_text, Text(output.prompt));
  std::vector<reward::RewardInput> inputs(output.samples.size());
  for (size_t i = 0; i < output.samples.size(); ++i) {
    const SampleOutput& s = output.samples[i];
    // The text a verifier sees ends before the stop token.
    std::vector<int32_t> visible = s.tokens;
    if (s.finish_reason == FinishReason::kStop && !visible.empty()) visible.pop_back();
    PRL_ASSIGN_OR_RETURN(std::string completion, Text(visible));
    inputs[i] = {prompt_text, std::move(completion), lease.reference(), output.prompt, s.tokens,
                 group_id};
  }
  return inputs;
}

absl::StatusOr<std::vector<reward::RewardResult>> Actor::ScoreGroup(
    absl::Span<const reward::RewardInput> inputs, const v1::LeasedPrompt& lease) {
  PRL_ASSIGN_OR_RETURN(reward::RewardFunction* const fn, RewardFor(lease.reward()));
  return fn->ScoreBatch(inputs);
}

void Actor::CountRewardFailure(const v1::LeasedPrompt& lease, const absl::Status& failure) {
  std::fprintf(stderr, "actor %s: group %s failed, not written, released: %s\n",
               options_.name.c_str(), lease.lease_id().c_str(),
               std::string(failure.message()).c_str());
  if (options_.metrics != nullptr) {
    const absl::StatusCode code = failure.code();
    options_.metrics
        ->RewardFailures(code == absl::StatusCode::kDeadlineExceeded ? "timeout"
                         : code == absl::StatusCode::kUnavailable    ? "unavailable"
                                                                     : "error")
        .Increment();
  }
  std::lock_guard<std::mutex> lock(stats_mu_);
  ++stats_.reward_failures;
}

RolloutRecord Actor::MakeRecord(const InFlight& job, const RequestOutput& output, size_t sample,
                                const reward::RewardResult& reward, uint64_t group_id,
                                int64_t finished_unix_nanos) const {
  const v1::LeasedPrompt& lease = job.lease;
  const SampleOutput& s = output.samples[sample];
  RolloutRecord r;
  r.run_id = options_.run_id;
  r.prompt_set_id = lease.prompt_set_id();
  r.actor_id = options_.name;
  r.prompt_index = static_cast<uint64_t>(lease.prompt_index());
  r.group_id = group_id;
  r.sample_index = static_cast<uint32_t>(s.sample_index);
  r.group_size = static_cast<uint32_t>(output.samples.size());
  r.prompt_tokens = output.prompt;
  r.completion_tokens = s.tokens;
  r.behaviour_logprobs = s.logprobs;
  r.token_versions = s.versions;
  r.route_layers = s.route_layers;
  r.route_top_k = s.route_top_k;
  r.routes = s.routes;
  r.reward = reward.reward;
  for (const auto& [name, value] : reward.components) r.reward_components.emplace_back(name, value);
  r.finish_reason = ToRollout(s.finish_reason);
  r.sampling.temperature = lease.sampling().temperature();
  r.sampling.top_p = lease.sampling().top_p();
  r.sampling.top_k = lease.sampling().top_k();
  r.sampling.max_tokens = lease.sampling().max_tokens();
  r.sampling.seed = lease.sampling().seed();
  r.sampling.stop_token_ids.assign(lease.sampling().stop_token_ids().begin(),
                                   lease.sampling().stop_token_ids().end());
  r.created_unix_nanos = job.created_unix_nanos;
  r.finished_unix_nanos = finished_unix_nanos;
  return r;
}

Actor::ScoredGroup Actor::BuildGroup(const InFlight& job, const RequestOutput& output,
                                     absl::Span<const reward::RewardInput> inputs,
                                     const std::vector<reward::RewardResult>& rewards,
                                     uint64_t group_id, int64_t finished_unix_nanos) const {
  ScoredGroup g;
  g.records.reserve(output.samples.size());
  g.complete.set_lease_id(job.lease.lease_id());
  v1::GroupResult* result = g.complete.mutable_result();
  result->set_prompt_index(job.lease.prompt_index());
  int64_t min_version = std::numeric_limits<int64_t>::max(), max_version = 0;
  for (size_t i = 0; i < output.samples.size(); ++i) {
    const SampleOutput& s = output.samples[i];
    g.records.push_back(MakeRecord(job, output, i, rewards[i], group_id, finished_unix_nanos));
    for (int64_t v : s.versions) {
      min_version = std::min(min_version, v);
      max_version = std::max(max_version, v);
    }
    g.tokens += static_cast<int64_t>(s.tokens.size());
    result->add_rewards(rewards[i].reward);
    result->add_completion_tokens(static_cast<int32_t>(s.tokens.size()));
    if (options_.text != nullptr) result->add_texts(inputs[i].completion);
  }
  result->set_min_version(min_version == std::numeric_limits<int64_t>::max() ? 0 : min_version);
  result->set_max_version(max_version);
  return g;
}

void Actor::CountWritten(const RequestOutput& output,
                         const std::vector<reward::RewardResult>& rewards, int64_t tokens) {
  if (options_.metrics != nullptr) {
    metrics::ActorMetrics& m = *options_.metrics;
    for (size_t i = 0; i < output.samples.size(); ++i) {
      m.rollout_length_tokens.Observe(static_cast<double>(output.samples[i].tokens.size()));
      m.reward.Observe(rewards[i].reward);
      m.RolloutsFinished(FinishReasonName(output.samples[i].finish_reason)).Increment();
    }
    m.tokens_generated.Increment(static_cast<double>(tokens));
    m.groups_done.Increment();
  }
  std::lock_guard<std::mutex> lock(stats_mu_);
  ++stats_.groups_written;
  stats_.samples_written += static_cast<int64_t>(output.samples.size());
  stats_.tokens_generated += tokens;
}

absl::Status Actor::LostLease(const absl::Status& refused) {
  std::fprintf(stderr, "actor %s: %s\n", options_.name.c_str(),
               std::string(refused.message()).c_str());
  if (options_.metrics != nullptr) options_.metrics->leases_lost.Increment();
  std::lock_guard<std::mutex> lock(stats_mu_);
  ++stats_.lost_leases;
  return absl::OkStatus();
}

absl::Status Actor::ReportComplete(const v1::CompleteRequest& complete) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::CompleteResponse response;
  const absl::Status done = rpc::FromGrpcStatus(control_->Complete(&ctx, complete, &response));
  if (absl::IsFailedPrecondition(done)) return LostLease(done);
  if (!done.ok() && !absl::IsNotFound(done) && !Transient(done)) return done;
  if (done.ok() && !response.accepted()) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.duplicate_completions;
  }
  return absl::OkStatus();
}

absl::Status Actor::WriteWithRetry(absl::Span<const RolloutRecord> records,
                                   const std::atomic<bool>* stop) {
  absl::Status written = write_group_(records);
  const absl::Time give_up = absl::Now() + absl::Minutes(1);
  for (absl::Duration backoff = absl::Milliseconds(100);
       Transient(written) && !Halted(stop) && absl::Now() + backoff < give_up;
       backoff = std::min(backoff * 2, absl::Seconds(5))) {
    absl::SleepFor(backoff);
    written = write_group_(records);
  }
  return written;
}

absl::Status Actor::Finish(const InFlight& job, const RequestOutput& output,
                           const std::atomic<bool>* stop) {
  const int64_t finished = NowNanos();
  const uint64_t group_id = GroupIdOfLease(job.lease.lease_id());

  // Rewards for the whole group, or the group fails visibly.
  absl::StatusOr<std::vector<reward::RewardInput>> inputs =
      RewardInputs(output, job.lease, group_id);
  absl::StatusOr<std::vector<reward::RewardResult>> rewards =
      inputs.ok() ? ScoreGroup(*inputs, job.lease) : inputs.status();
  if (!rewards.ok()) {
    CountRewardFailure(job.lease, rewards.status());
    Release(job.lease.lease_id(), v1::RELEASE_REASON_REWARD_FAILED, rewards.status());
    return absl::OkStatus();
  }
  ScoredGroup group = BuildGroup(job, output, *inputs, *rewards, group_id, finished);
  group.complete.set_actor_id(ActorId());
  // Into the replay buffer first, then done: a crash in between re-runs the prompt. A full
  // buffer blocks here, on the finisher: heartbeats go on renewing the lease meanwhile.
  const absl::Status written = WriteWithRetry(group.records, stop);
  if (absl::IsFailedPrecondition(written)) return LostLease(written);
  if (Transient(written)) {
    // The replay stayed unreachable: drop the group (the next heartbeat gives the prompt back).
    std::fprintf(stderr, "actor %s: group %s not written, the replay is unavailable: %s\n",
                 options_.name.c_str(), job.lease.lease_id().c_str(),
                 std::string(written.message()).c_str());
    return absl::OkStatus();
  }
  PRL_RETURN_IF_ERROR(written);
  CountWritten(output, *rewards, group.tokens);
  TapLine("actor_groups_written", absl::StrCat(job.lease.prompt_set_id(), "\t",
                                              job.lease.prompt_index(), "\t", group_id));
  FaultPoint("actor.after_replay_write");  // the window a crash test aims at
  return ReportComplete(group.complete);
}

void Actor::ControlLoop(const std::atomic<bool>* stop) {
  if (const absl::Status registered = Register(stop); !registered.ok()) return Fail(registered);
  absl::Time next_heartbeat = absl::Now();
  while (!Halted(stop)) {
    absl::Status control = absl::OkStatus();
    SendReleases();  // before a heartbeat, which would drop them without their reason
    if (absl::Now() >= next_heartbeat) {
      control = Heartbeat();
      next_heartbeat = absl::Now() + absl::Milliseconds(heartbeat_ms_);
    }
    if (control.ok()) control = LeaseMore();
    if (absl::IsNotFound(control)) {
      // The coordinator restarted and forgot us: register again. What we generate for the
      // old leases is still accepted (lease ids name their prompt).
      if (const absl::Status again = Register(stop); !again.ok()) return Fail(again);
    } else if (!control.ok() && !Transient(control)) {
      return Fail(control);
    }
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait_for(lock, std::chrono::milliseconds(20));
  }
}

void Actor::FinishLoop(const std::atomic<bool>* stop) {
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait_for(lock, std::chrono::milliseconds(50),
                      [&] { return !generated_.empty() || Halted(stop); });
    // Stopping leaves what is not finished: those leases expire and their prompts are re-run.
    if (Halted(stop)) return;
    if (generated_.empty()) continue;
    Generated next = std::move(generated_.front());
    generated_.pop_front();
    lock.unlock();
    const absl::Status finished = Finish(next.job, next.output, stop);
    Drop(next.job.lease.lease_id());
    if (!finished.ok()) return Fail(finished);
  }
}

absl::Status Actor::EngineIteration(const std::atomic<bool>* stop) {
  PRL_RETURN_IF_ERROR(SwapIfNewer());
  UpdateEngineGauges();
  PRL_RETURN_IF_ERROR(AddLeased());
  if (!engine_->HasUnfinishedRequests()) {
    if (waiting_for_weights_) {  // nothing to run until they arrive: poll for them
      const int64_t before = engine_->Stats().weight_version;
      PRL_RETURN_IF_ERROR(engine_->Step());  // applies staged weights, runs nothing
      // Flipped (the CPU engine does at once): the waiting leases go in on the next pass.
      if (engine_->Stats().weight_version == before) absl::SleepFor(absl::Milliseconds(2));
      return absl::OkStatus();
    }
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait_for(lock, std::chrono::milliseconds(20),
                      [&] { return !leased_.empty() || Halted(stop); });
    return absl::OkStatus();
  }
  PRL_RETURN_IF_ERROR(engine_->Step());
  std::vector<RequestOutput> finished = engine_->TakeFinished();
  if (finished.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  for (RequestOutput& output : finished) {
    auto it = in_flight_.find(output.request_id);
    if (it == in_flight_.end()) continue;
    generated_.push_back({std::move(it->second), std::move(output)});
    in_flight_.erase(it);
  }
  {
    std::lock_guard<std::mutex> stats_lock(stats_mu_);
    stats_.groups_generated += static_cast<int64_t>(finished.size());
  }
  changed_.notify_all();
  return absl::OkStatus();
}

absl::Status Actor::Run(const std::atomic<bool>* stop) {
  std::thread control([this, stop] { ControlLoop(stop); });
  std::thread finisher([this, stop] { FinishLoop(stop); });
  while (!Halted(stop)) {
    if (const absl::Status s = EngineIteration(stop); !s.ok()) Fail(s);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    halted_ = true;  // stop the other two on a stop request as well
    changed_.notify_all();
  }
  control.join();
  finisher.join();
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

}  // namespace prl::actor
