#include "learner/step_intake.h"

#include <map>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "core/test_hooks.h"
#include "learner/checkpoint.h"
#include "learner/step_samples.h"

namespace prl::learner {

StepIntake::StepIntake(const ModelLimits& limits, ReplayBuffer* replay, IntakeOptions options)
    : replay_(replay),
      options_(std::move(options)),
      admission_(limits, replay, options_.admission) {}

absl::StatusOr<int64_t> StepIntake::Resume(const std::string& checkpoint_dir, int64_t step,
                                           bool resumed) {
  if (checkpoint_dir.empty()) return 0;
  PRL_ASSIGN_OR_RETURN(journal_, StepJournal::Open(checkpoint_dir + "/journal"));
  PRL_ASSIGN_OR_RETURN(to_replay_, journal_->StepsAfter(step));
  if (resumed) {
    PRL_ASSIGN_OR_RETURN(admission_.ledger(),
                         PromptLedger::Read(CheckpointStepDir(checkpoint_dir, step) + "/" +
                                            PromptLedger::kFileName));
  }
  for (const JournaledStep& j : to_replay_) {
    admission_.SkipReplayed(j.group_keys);
    admission_.Commit(j.step, j.prompt_keys);
  }
  if (!to_replay_.empty()) {
    std::printf("learner: replaying steps %lld..%lld from the journal %s\n",
                static_cast<long long>(step + 1),
                static_cast<long long>(step + static_cast<int64_t>(to_replay_.size())),
                journal_->dir().c_str());
  }
  return static_cast<int64_t>(to_replay_.size());
}

absl::StatusOr<EpisodeAdvantagesResult> EpisodeAdvantages(absl::Span<const RolloutRecord> records,
                                                          const AdvantageConfig& config) {
  EpisodeAdvantagesResult out;
  std::vector<size_t> episode_of(records.size());
  std::map<uint32_t, size_t> by_sample;
  for (size_t i = 0; i < records.size(); ++i) {
    auto [it, inserted] = by_sample.try_emplace(records[i].sample_index,
                                                out.episode_rewards.size());
    if (inserted) out.episode_rewards.push_back(records[i].reward);
    episode_of[i] = it->second;
  }
  const std::vector<std::string> ids(out.episode_rewards.size(), "g");
  PRL_ASSIGN_OR_RETURN(const Advantages adv, GroupAdvantages(out.episode_rewards, ids, config));
  for (size_t e : episode_of) {
    out.advantage.push_back(adv.advantage[e]);
    out.kept.push_back(adv.kept[e]);
  }
  return out;
}

absl::StatusOr<std::vector<TrainSample>> StepIntake::Take(const std::atomic<bool>* stop,
                                                          int64_t learner_version,
                                                          std::vector<LeasedGroup>* leased,
                                                          StepReport* report) {
  std::vector<TrainSample> samples;
  double reward_sum = 0;
  bool waiting = !options_.on_wait;  // with on_wait: what is in first, without waiting
  while (static_cast<int64_t>(leased->size()) < options_.groups_per_step && !stop->load()) {
    admission_.Offer();
    // The groups already in the step keep their leases while the rest arrives (slow actors):
    // renewed between waits, so that the buffer does not deliver them again. One whose lease
    // was lost meanwhile comes again and replaces itself (below).
    for (const LeasedGroup& g : *leased) replay_->Renew(g).IgnoreError();
    TakeOptions take;
    take.max_groups = static_cast<int32_t>(options_.groups_per_step - leased->size());
    take.learner_version = learner_version;
    // With the coordinator to hand them back to, stale groups come to the admission rather
    // than being dropped by the buffer.
    take.max_lag = admission_.hands_back() ? INT64_MAX : options_.admission.max_lag;
    take.timeout = waiting ? options_.take_timeout : absl::ZeroDuration();
    take.reclaim_first = !took_since_resume_;  // what a dead predecessor held comes first
    took_since_resume_ = true;
    PRL_ASSIGN_OR_RETURN(std::vector<LeasedGroup> groups, replay_->Take(take));
    for (LeasedGroup& g : groups) {
      // The same group again: its lease expired while this step was being taken (a slow
      // step) and the buffer delivered it anew. It stays in the step once, under the new lease
      // (acknowledging the new delivery now would consume it before the step is durable: a
      // learner killed then would lose it untrained).
      auto same = std::find_if(leased->begin(), leased->end(),
                               [&](const LeasedGroup& l) { return l.group_key == g.group_key; });
      if (same != leased->end()) {
        *same = g;
        continue;
      }
      std::optional<std::vector<RolloutRecord>> records = admission_.Admit(g, learner_version);
      if (!records.has_value()) continue;
      PRL_ASSIGN_OR_RETURN(const EpisodeAdvantagesResult adv,
                           EpisodeAdvantages(*records, options_.advantages));
      if (std::none_of(adv.kept.begin(), adv.kept.end(), [](bool kept) { return kept; })) {
        // Dynamic sampling (drop_uniform_groups): every reward equal, no signal. Acknowledged
        // now (its prompt is done, never trained) and not in the step, so that the step takes
        // another group in its place and the coordinator's budget counts it consumed.
        replay_->Ack(g).IgnoreError();
        ++dropped_uniform_;
        continue;
      }
      for (double reward : adv.episode_rewards) reward_sum += reward;
      report->samples += static_cast<int64_t>(adv.episode_rewards.size());
      for (size_t i = 0; i < records->size(); ++i) {
        RolloutRecord& r = (*records)[i];
        if (!adv.kept[i] || r.model_tokens() == 0) continue;
        TrainSample s;
        s.prompt = std::move(r.prompt_tokens);
        s.completion = std::move(r.completion_tokens);
        s.behaviour_logprobs = std::move(r.behaviour_logprobs);
        s.versions = std::move(r.token_versions);
        s.sources = std::move(r.token_sources);
        s.route_layers = r.route_layers;
        s.route_top_k = r.route_top_k;
        s.routes = std::move(r.routes);
        s.reward = r.reward;
        s.advantage = adv.advantage[i];
        s.has_advantage = true;
        samples.push_back(std::move(s));
      }
      leased->push_back(std::move(g));
    }
    if (!waiting && static_cast<int64_t>(leased->size()) < options_.groups_per_step) {
      options_.on_wait();  // what is in does not fill the step: waits from here on
      waiting = true;
    }
  }
  admission_.Offer();  // what this step's takes held back
  report->groups = static_cast<int64_t>(leased->size());
  report->mean_reward = report->samples > 0 ? reward_sum / report->samples : 0.0;
  return samples;
}

absl::StatusOr<std::vector<uint8_t>> StepIntake::Next(const std::atomic<bool>* stop, int64_t step,
                                                      int64_t learner_version,
                                                      std::vector<LeasedGroup>* leased,
                                                      StepReport* report) {
  if (!to_replay_.empty()) {
    JournaledStep j = std::move(to_replay_.front());
    to_replay_.erase(to_replay_.begin());
    report->groups = j.groups;
    report->samples = j.samples;
    report->mean_reward = j.mean_reward;
    groups_in_step_ = report->groups;
    return std::move(j.payload);
  }
  if (options_.retired_prompt_sets) {  // the ledger holds the live sets' prompts only
    admission_.ForgetSets(options_.retired_prompt_sets());
  }
  PRL_ASSIGN_OR_RETURN(const std::vector<TrainSample> taken,
                       Take(stop, learner_version, leased, report));
  std::vector<std::string> prompts = admission_.TakeStepPrompts();
  if (stop->load() && leased->size() < static_cast<size_t>(options_.groups_per_step)) {
    for (const LeasedGroup& g : *leased) replay_->Release(g).IgnoreError();
    leased->clear();
    return EncodeStopSignal();
  }
  PRL_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, EncodeStepSamples(taken));
  groups_in_step_ = report->groups;  // before they leave the buffer
  if (!journal_.has_value()) {
    admission_.Commit(step, prompts);
    return bytes;
  }
  JournaledStep j{step, report->groups, report->samples, report->mean_reward, {}, {}, bytes};
  for (const LeasedGroup& g : *leased) j.group_keys.push_back(g.group_key);
  j.prompt_keys = std::move(prompts);
  PRL_RETURN_IF_ERROR(journal_->Append(j));
  TapLine("learner_journal", absl::StrCat("step ", j.step, "\t", absl::StrJoin(j.prompt_keys, ",")));
  admission_.Commit(j.step, j.prompt_keys);
  // On disk now: the buffer may let go of them.
  for (const LeasedGroup& g : *leased) replay_->Ack(g).IgnoreError();
  leased->clear();
  FaultPoint("learner.after_journal_write");  // journaled, not yet checkpointed: a crash window
  return bytes;
}

absl::Status StepIntake::Checkpointed(int64_t step) {
  return journal_.has_value() ? journal_->DropThrough(step) : absl::OkStatus();
}

}  // namespace prl::learner
