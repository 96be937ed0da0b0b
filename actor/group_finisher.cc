#include "actor/group_finisher.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "actor/adapter_channels.h"
#include "core/group_id.h"
#include "core/status_macros.h"
#include "core/test_hooks.h"

namespace prl::actor {

namespace v1 = prl::v1;

namespace {

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

}  // namespace

GroupFinisher::GroupFinisher(GroupWriter write_group, CoordinatorLink* link, LeaseBook* book,
                             ActorStatsBoard* stats, const ActorOptions& options)
    : write_group_(std::move(write_group)),
      link_(link),
      book_(book),
      stats_(stats),
      options_(options) {}

absl::StatusOr<std::string> GroupFinisher::Text(absl::Span<const int32_t> ids) const {
  if (options_.text != nullptr) return options_.text->DecodeCompletion(ids);
  return absl::StrJoin(ids, " ");
}

absl::StatusOr<std::vector<reward::RewardInput>> GroupFinisher::RewardInputs(
    const GeneratedGroup& group, uint64_t group_id) const {
  const RequestOutput& output = group.output;
  PRL_ASSIGN_OR_RETURN(const std::string prompt_text, Text(output.prompt));
  std::vector<reward::RewardInput> inputs(output.samples.size());
  for (size_t i = 0; i < output.samples.size(); ++i) {
    const SampleOutput& s = output.samples[i];
    // The text a verifier sees ends before the stop token.
    std::vector<int32_t> visible = s.tokens;
    if (s.finish_reason == FinishReason::kStop && !visible.empty()) visible.pop_back();
    PRL_ASSIGN_OR_RETURN(std::string completion, Text(visible));
    inputs[i] = {prompt_text, std::move(completion), group.lease.reference(), output.prompt,
                 s.tokens, group_id};
  }
  return inputs;
}

absl::StatusOr<std::vector<reward::RewardResult>> GroupFinisher::Score(
    absl::Span<const reward::RewardInput> inputs, const v1::LeasedPrompt& lease) {
  const std::string key = lease.reward().SerializeAsString();
  auto it = rewards_.find(key);
  if (it == rewards_.end()) {
    reward::RewardSpec parsed;
    parsed.name = lease.reward().name();
    for (const auto& [k, v] : lease.reward().params()) parsed.params[k] = v;
    PRL_ASSIGN_OR_RETURN(std::unique_ptr<reward::RewardFunction> fn,
                         reward::MakeRewardFunction(parsed));
    it = rewards_.emplace(key, std::move(fn)).first;
  }
  return it->second->ScoreBatch(inputs);
}

void GroupFinisher::CountRewardFailure(const v1::LeasedPrompt& lease, const absl::Status& failure) {
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
  stats_->Update([](ActorStats& st) { ++st.reward_failures; });
}

absl::StatusOr<std::vector<reward::RewardResult>> GroupFinisher::EpisodeRewards(
    const GeneratedGroup& group) {
  if (group.episodes.size() != group.output.samples.size()) {
    return absl::InternalError(absl::StrCat("group ", group.lease.lease_id(), ": ",
                                            group.episodes.size(), " episode outcomes for ",
                                            group.output.samples.size(), " samples"));
  }
  std::vector<reward::RewardResult> rewards(group.episodes.size());
  for (size_t i = 0; i < rewards.size(); ++i) rewards[i].reward = group.episodes[i].reward;
  if (options_.metrics == nullptr) return rewards;
  std::vector<int64_t> turns(rewards.size(), 0);
  for (const RecordPart& part : PartsOf(group)) {  // every record of every episode
    const SampleOutput& s = *part.output;
    const int64_t env_tokens = std::count(s.sources.begin(), s.sources.end(), 1);
    turns[part.sample] += static_cast<int64_t>(part.turn_ends->size());
    options_.metrics->episode_model_tokens.Increment(
        static_cast<double>(static_cast<int64_t>(s.tokens.size()) - env_tokens));
    options_.metrics->episode_environment_tokens.Increment(static_cast<double>(env_tokens));
  }
  for (int64_t t : turns) options_.metrics->episode_turns.Observe(static_cast<double>(t));
  return rewards;
}

RolloutRecord GroupFinisher::MakeRecord(const GeneratedGroup& group, const RecordPart& part,
                                        const reward::RewardResult& reward, uint64_t group_id,
                                        int64_t finished_unix_nanos) const {
  const v1::LeasedPrompt& lease = group.lease;
  const SampleOutput& s = *part.output;
  RolloutRecord r;
  r.run_id = options_.run_id;
  r.prompt_set_id = lease.prompt_set_id();
  r.actor_id = options_.name;
  r.prompt_index = static_cast<uint64_t>(lease.prompt_index());
  r.group_id = group_id;
  r.sample_index = static_cast<uint32_t>(s.sample_index);
  r.group_size = static_cast<uint32_t>(group.output.samples.size());
  r.segment = part.segment;
  r.segments = part.segments;
  r.prompt_tokens = *part.prompt;
  r.completion_tokens = s.tokens;
  r.behaviour_logprobs = s.logprobs;
  r.token_versions = s.versions;
  r.token_sources = s.sources;
  r.route_layers = s.route_layers;  // MoE: the experts the engine routed each token to
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
  r.created_unix_nanos = group.created_unix_nanos;
  r.finished_unix_nanos = finished_unix_nanos;
  if (part.turn_ends != nullptr) {
    r.turn_ends = *part.turn_ends;
    r.turn_rewards = *part.turn_rewards;
  }
  return r;
}

std::vector<GroupFinisher::RecordPart> GroupFinisher::PartsOf(const GeneratedGroup& group) {
  std::vector<RecordPart> parts;
  for (size_t i = 0; i < group.output.samples.size(); ++i) {
    const episode::EpisodeOutcome* episode =
        group.episodes.empty() ? nullptr : &group.episodes[i];
    if (episode != nullptr && !episode->segments.empty()) {  // an agent's: one per trajectory
      const uint32_t n = static_cast<uint32_t>(episode->segments.size());
      for (uint32_t k = 0; k < n; ++k) {
        const episode::EpisodeSegment& s = episode->segments[k];
        parts.push_back({i, k, n, &s.prompt, &s.output, &s.turn_ends, &s.turn_rewards});
      }
      continue;
    }
    parts.push_back({i, 0, 1, &group.output.prompt, &group.output.samples[i],
                     episode != nullptr ? &episode->turn_ends : nullptr,
                     episode != nullptr ? &episode->turn_rewards : nullptr});
  }
  return parts;
}

GroupFinisher::ScoredGroup GroupFinisher::Build(const GeneratedGroup& group,
                                                absl::Span<const reward::RewardInput> inputs,
                                                const std::vector<reward::RewardResult>& rewards,
                                                uint64_t group_id,
                                                int64_t finished_unix_nanos) const {
  const RequestOutput& output = group.output;
  ScoredGroup g;
  g.complete.set_lease_id(group.lease.lease_id());
  v1::GroupResult* result = g.complete.mutable_result();
  result->set_prompt_index(group.lease.prompt_index());
  int64_t min_version = std::numeric_limits<int64_t>::max(), max_version = 0;
  std::vector<int64_t> sample_tokens(output.samples.size(), 0);
  for (const RecordPart& part : PartsOf(group)) {
    const SampleOutput& s = *part.output;
    g.records.push_back(
        MakeRecord(group, part, rewards[part.sample], group_id, finished_unix_nanos));
    for (int64_t v : s.versions) {
      min_version = std::min(min_version, v);
      max_version = std::max(max_version, v);
    }
    g.tokens += static_cast<int64_t>(s.tokens.size());
    sample_tokens[part.sample] += static_cast<int64_t>(s.tokens.size());
  }
  for (size_t i = 0; i < output.samples.size(); ++i) {
    result->add_rewards(rewards[i].reward);
    result->add_completion_tokens(static_cast<int32_t>(sample_tokens[i]));
    if (options_.text != nullptr) result->add_texts(inputs[i].completion);
  }
  result->set_min_version(min_version == std::numeric_limits<int64_t>::max() ? 0 : min_version);
  result->set_max_version(max_version);
  return g;
}

void GroupFinisher::CountWritten(const RequestOutput& output,
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
  stats_->Update([&](ActorStats& st) {
    ++st.groups_written;
    st.samples_written += static_cast<int64_t>(output.samples.size());
    st.tokens_generated += tokens;
  });
}

absl::Status GroupFinisher::LostLease(const absl::Status& refused) {
  std::fprintf(stderr, "actor %s: %s\n", options_.name.c_str(),
               std::string(refused.message()).c_str());
  if (options_.metrics != nullptr) options_.metrics->leases_lost.Increment();
  stats_->Update([](ActorStats& st) { ++st.lost_leases; });
  return absl::OkStatus();
}

absl::Status GroupFinisher::Complete(const v1::CompleteRequest& complete) {
  const absl::Status done = link_->Complete(complete);
  if (absl::IsFailedPrecondition(done)) return LostLease(done);
  if (!done.ok() && !absl::IsNotFound(done) && !Transient(done)) return done;
  return absl::OkStatus();
}

absl::Status GroupFinisher::WriteWithRetry(const v1::LeasedPrompt& lease,
                                           absl::Span<const RolloutRecord> records,
                                           const std::function<bool()>& halted) {
  const auto write = [&]() -> absl::Status {
    if (!lease.has_adapter()) return write_group_(records);
    if (options_.adapters == nullptr) {
      return absl::FailedPreconditionError("a group of an adapter on an actor of no adapters");
    }
    return options_.adapters->Write(lease.adapter().adapter_id(), records);
  };
  absl::Status written = write();
  const absl::Time give_up = absl::Now() + absl::Minutes(1);
  for (absl::Duration backoff = absl::Milliseconds(100);
       Transient(written) && !halted() && absl::Now() + backoff < give_up;
       backoff = std::min(backoff * 2, absl::Seconds(5))) {
    absl::SleepFor(backoff);
    written = write();
  }
  return written;
}

absl::Status GroupFinisher::Finish(const GeneratedGroup& group,
                                   const std::function<bool()>& halted) {
  const int64_t finished = absl::ToUnixNanos(absl::Now());
  const v1::LeasedPrompt& lease = group.lease;
  const uint64_t group_id = GroupIdOfLease(lease.lease_id());
  // Rewards for the whole group, or the group fails visibly. An episode's reward is its
  // environment's.
  absl::StatusOr<std::vector<reward::RewardInput>> inputs = RewardInputs(group, group_id);
  absl::StatusOr<std::vector<reward::RewardResult>> rewards =
      !inputs.ok()              ? inputs.status()
      : group.episodes.empty() ? Score(*inputs, lease)
                               : EpisodeRewards(group);
  if (!rewards.ok()) {
    CountRewardFailure(lease, rewards.status());
    book_->Release(lease.lease_id(), v1::RELEASE_REASON_REWARD_FAILED, rewards.status());
    return absl::OkStatus();
  }
  const ScoredGroup scored = Build(group, *inputs, *rewards, group_id, finished);
  if (lease.eval()) {  // an evaluation set's: scored for its round, never trained on
    if (options_.metrics != nullptr) {  // decoded like any group; not a rollout or its reward
      options_.metrics->eval_groups.Increment();
      options_.metrics->tokens_generated.Increment(static_cast<double>(scored.tokens));
    }
    stats_->Update([&](ActorStats& st) {
      ++st.eval_groups;
      st.tokens_generated += scored.tokens;
    });
    return Complete(scored.complete);
  }
  // Into the replay buffer first, then done: a crash in between re-runs the prompt. A full
  // buffer blocks here, on the finisher: heartbeats go on renewing the lease meanwhile.
  const absl::Status written = WriteWithRetry(lease, scored.records, halted);
  if (absl::IsFailedPrecondition(written)) return LostLease(written);
  if (Transient(written)) {
    // The replay stayed unreachable: drop the group (the next heartbeat gives the prompt back).
    std::fprintf(stderr, "actor %s: group %s not written, the replay is unavailable: %s\n",
                 options_.name.c_str(), lease.lease_id().c_str(),
                 std::string(written.message()).c_str());
    return absl::OkStatus();
  }
  if (lease.has_adapter() && absl::IsNotFound(written)) {
    // Its adapter's channel is closed (the adapter was deleted): only this group is lost, the
    // prompt given back; the actor goes on with every other adapter's.
    std::fprintf(stderr, "actor %s: group %s of adapter %s not written: %s\n",
                 options_.name.c_str(), lease.lease_id().c_str(),
                 lease.adapter().spec().name().c_str(), std::string(written.message()).c_str());
    book_->Release(lease.lease_id(), v1::RELEASE_REASON_ENGINE_REFUSED, written);
    return absl::OkStatus();
  }
  PRL_RETURN_IF_ERROR(written);
  CountWritten(group.output, *rewards, scored.tokens);
  TapLine("actor_groups_written",
          absl::StrCat(lease.prompt_set_id(), "\t", lease.prompt_index(), "\t", group_id));
  FaultPoint("actor.after_replay_write");  // the window a crash test aims at
  return Complete(scored.complete);
}

}  // namespace prl::actor
