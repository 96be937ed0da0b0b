#include "actor/engine_driver.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "core/xxhash_inline.h"

namespace prl::actor {

namespace v1 = prl::v1;

EngineDriver::EngineDriver(std::unique_ptr<Engine> engine, WeightSubscriber* weights,
                           LeaseBook* book, ActorStatsBoard* stats, const ActorOptions& options)
    : engine_(std::move(engine)),
      weights_(weights),
      book_(book),
      stats_(stats),
      options_(options),
      episodes_(std::make_unique<EpisodeRunner>(options.text, options.episode_threads,
                                                [book] { book->Wake(); }, options.metrics)) {}

SamplingParams EngineDriver::ParamsOf(const v1::LeasedPrompt& lease) {
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
  return params;
}

void EngineDriver::AbortGroup(const std::string& lease_id, uint64_t request_id,
                              const absl::Status& why) {
  std::fprintf(stderr, "actor %s: group %s failed, released: %s\n", options_.name.c_str(),
               lease_id.c_str(), std::string(why.message()).c_str());
  if (request_id != 0) {
    engine_->Abort(request_id);  // its output is not handed on: it leaves in_engine_ here
    in_engine_.erase(request_id);
  }
  starting_.erase(lease_id);
  episodes_->Forget(lease_id);
  book_->Release(lease_id, v1::RELEASE_REASON_ENVIRONMENT_FAILED, why);
  if (options_.metrics != nullptr) options_.metrics->EnvironmentErrors(why.code()).Increment();
}

void EngineDriver::ApplyEpisodeActions() {
  using Kind = EpisodeRunner::Action::Kind;
  for (EpisodeRunner::Action& a : episodes_->TakeActions()) {
    auto starting = starting_.end();
    SamplingParams base;
    if (a.kind == Kind::kAddGroup) {
      starting = starting_.find(a.lease_id);
      if (starting == starting_.end()) continue;  // released meanwhile
      base = ParamsOf(starting->second.lease);
    }
    absl::StatusOr<uint64_t> applied = EpisodeRunner::Apply(*engine_, a, std::move(base));
    if (!applied.ok()) {
      AbortGroup(a.lease_id, a.request_id, applied.status());
    } else if (a.kind == Kind::kAddGroup) {
      in_engine_[*applied] = std::move(starting->second);
      starting_.erase(starting);
      episodes_->Bind(a.lease_id, *applied);
    }
  }
}

absl::Status EngineDriver::SwapIfNewer() {
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
  stats_->Update([&](ActorStats& st) {
    ++st.weight_swaps;
    st.weight_version = next->version;
  });
  return absl::OkStatus();
}

void EngineDriver::UpdateTransferMetrics() {
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

void EngineDriver::UpdateEngineGauges() {
  UpdateTransferMetrics();
  if (options_.metrics == nullptr) return;
  const EngineStats s = engine_->Stats();
  options_.metrics->sequences_running.Set(static_cast<double>(s.num_running));
  options_.metrics->sequences_waiting.Set(static_cast<double>(s.num_waiting));
  options_.metrics->groups_in_flight.Set(static_cast<double>(in_engine_.size()));
  // Granted groups go to the engine at once; those not started are its waiting sequences.
  int64_t samples = 0;
  for (const auto& [id, job] : in_engine_) samples += job.lease.samples();
  const double mean_group =
      in_engine_.empty() ? 1.0 : static_cast<double>(samples) / in_engine_.size();
  options_.metrics->groups_pending.Set(
      std::min(static_cast<double>(in_engine_.size()),
               std::ceil(s.num_waiting / std::max(mean_group, 1.0))));
  metrics::AdvanceCounterTo(options_.metrics->preemptions, static_cast<double>(s.preemptions));
  metrics::AdvanceCounterTo(options_.metrics->prefill_tokens,
                            static_cast<double>(s.prefill_tokens));
  metrics::AdvanceCounterTo(options_.metrics->episode_context_tokens,
                            static_cast<double>(s.turn_context_tokens));
  metrics::AdvanceCounterTo(options_.metrics->episode_context_kept_tokens,
                            static_cast<double>(s.turn_kept_tokens));
  // The pool is allocated whole (EngineOptions::kv_cache_bytes) and used by blocks.
  const double capacity = static_cast<double>(options_.engine.kv_cache_bytes);
  const double used_fraction =
      s.total_blocks > 0 ? static_cast<double>(s.total_blocks - s.free_blocks) / s.total_blocks : 0;
  options_.metrics->kv_cache_used_bytes.Set(capacity * used_fraction);
  options_.metrics->kv_cache_capacity_bytes.Set(capacity);
}

absl::Status EngineDriver::AddGranted() {
  std::deque<LeasedPrompt> waiting;
  // The version in use, not the one staged: a CUDA engine flips to staged weights only once
  // their conversion is done (engine.h), so every token of a prompt added now is sampled from
  // `held` or newer. Fixed weights: nothing to wait for.
  const int64_t held = engine_->Stats().weight_version;
  for (LeasedPrompt& l : book_->TakeGranted()) {
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
    if (lease.has_environment()) {  // its episodes start first (actor/episode_runner.h)
      starting_[lease.lease_id()] = InEngine{lease, absl::ToUnixNanos(absl::Now())};
      episodes_->StartGroup(lease, engine_->max_sequence_tokens());
      continue;
    }
    std::vector<int32_t> prompt(lease.prompt_tokens().begin(), lease.prompt_tokens().end());
    absl::StatusOr<uint64_t> id = engine_->AddRequest(std::move(prompt), ParamsOf(lease));
    if (!id.ok()) {
      // The coordinator validated the prompt against its model and this actor's capacity;
      // this engine cannot run it all the same (e.g. the coordinator's model is not ours).
      std::fprintf(stderr, "actor %s: cannot generate %s: %s\n", options_.name.c_str(),
                   lease.lease_id().c_str(), std::string(id.status().message()).c_str());
      book_->Release(lease.lease_id(), v1::RELEASE_REASON_ENGINE_REFUSED, id.status());
      continue;
    }
    in_engine_[*id] = InEngine{lease, absl::ToUnixNanos(absl::Now())};
  }
  waiting_for_weights_ = !waiting.empty();
  book_->Requeue(std::move(waiting));  // ahead of prompts granted meanwhile, in their order
  return absl::OkStatus();
}

absl::Status EngineDriver::Iteration(const std::function<bool()>& halted) {
  PRL_RETURN_IF_ERROR(SwapIfNewer());
  UpdateEngineGauges();
  PRL_RETURN_IF_ERROR(AddGranted());
  ApplyEpisodeActions();
  HandOnFinished();  // an episode group whose last sample just finished
  const EngineStats before_step = engine_->Stats();
  if (engine_->HasUnfinishedRequests() && before_step.num_running == 0 &&
      before_step.num_waiting == 0) {
    // Every sample in the engine waits for its environment: wait for an answer (or a grant).
    book_->Wait(absl::Milliseconds(20));
    return absl::OkStatus();
  }
  if (!engine_->HasUnfinishedRequests()) {
    if (!starting_.empty() || episodes_->Busy()) {  // episodes starting
      book_->Wait(absl::Milliseconds(20));
      return absl::OkStatus();
    }
    if (waiting_for_weights_) {  // nothing to run until they arrive: poll for them
      const int64_t before = engine_->Stats().weight_version;
      PRL_RETURN_IF_ERROR(engine_->Step());  // applies staged weights, runs nothing
      // Flipped (the CPU engine does at once): the waiting prompts go in on the next pass.
      if (engine_->Stats().weight_version == before) absl::SleepFor(absl::Milliseconds(2));
      return absl::OkStatus();
    }
    book_->WaitForGranted(absl::Milliseconds(20), halted);
    return absl::OkStatus();
  }
  PRL_RETURN_IF_ERROR(engine_->Step());
  for (const TurnOutput& turn : engine_->TakeTurns()) episodes_->OnTurn(turn);
  HandOnFinished();
  return absl::OkStatus();
}

void EngineDriver::HandOnFinished() {
  std::vector<RequestOutput> finished = engine_->TakeFinished();
  if (finished.empty()) return;
  std::vector<GeneratedGroup> groups;
  for (RequestOutput& output : finished) {
    auto it = in_engine_.find(output.request_id);
    if (it == in_engine_.end()) continue;
    const uint64_t id = output.request_id;
    groups.push_back({std::move(it->second.lease), it->second.created_unix_nanos,
                      std::move(output), episodes_->TakeOutcome(id)});
    in_engine_.erase(it);
  }
  stats_->Update(
      [&](ActorStats& st) { st.groups_generated += static_cast<int64_t>(groups.size()); });
  book_->Generated(std::move(groups));
}

}  // namespace prl::actor
