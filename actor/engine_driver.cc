#include "actor/engine_driver.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "actor/adapter_channels.h"
#include "core/status_macros.h"
#include "core/xxhash_inline.h"

namespace prl::actor {

namespace v1 = prl::v1;

episode::GroupRequest GroupRequestOf(const v1::LeasedPrompt& lease) {
  episode::GroupRequest g;
  g.id = lease.lease_id();
  g.prompt.assign(lease.prompt_tokens().begin(), lease.prompt_tokens().end());
  SamplingParams& p = g.params;
  p.n = lease.samples();
  p.temperature = lease.sampling().temperature();
  p.top_p = lease.sampling().top_p();
  p.top_k = lease.sampling().top_k();
  p.max_tokens = lease.sampling().max_tokens();
  p.seed = lease.sampling().seed() ^ XXH3_64bits(lease.lease_id().data(), lease.lease_id().size());
  p.stop_token_ids.assign(lease.sampling().stop_token_ids().begin(),
                          lease.sampling().stop_token_ids().end());
  if (lease.has_environment()) {
    g.environment = lease.environment();
    p.max_tokens = lease.environment().max_tokens_per_turn();
    g.reference = lease.reference();
    g.submitted = lease.episode_prompt();
  }
  if (lease.has_agent()) {
    g.agent = lease.agent();
    p.max_tokens = lease.agent().max_tokens_per_call();
    g.reference = lease.reference();
    g.submitted = lease.episode_prompt();
  }
  g.adapter = lease.adapter().adapter_id();  // a run of adapters: its engine adapter
  return g;
}

absl::Status EngineDriver::ServeAgents() {
  if (!options_.openai.has_value()) return absl::OkStatus();
  return episodes_.ServeAgents(*options_.openai, options_.openai_model, options_.openai_base_url);
}

EngineDriver::EngineDriver(std::unique_ptr<Engine> engine, WeightSubscriber* weights,
                           LeaseBook* book, ActorStatsBoard* stats, const ActorOptions& options)
    : episodes_(std::move(engine), options.text,
                {options.env_calls_per_address, options.env_outage_budget, options.metrics,
                 options.agent_episodes_per_address},
                [book] { book->Wake(); }),
      weights_(weights),
      book_(book),
      stats_(stats),
      options_(options) {}

absl::StatusOr<bool> EngineDriver::AdapterReady(const v1::LeasedAdapter& adapter) {
  if (options_.adapters == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "the prompt trains adapter '", adapter.spec().name(),
        "' (coordinator.adapters) but this actor serves no adapters (a run of one model)"));
  }
  const absl::Status opened = options_.adapters->Open(adapter);
  if (absl::IsNotFound(opened)) return false;  // the learner has not made it yet: wait
  PRL_RETURN_IF_ERROR(opened);
  Engine& engine = episodes_.engine();
  const std::string& id = adapter.adapter_id();
  std::optional<int64_t> held = engine.AdapterVersion(id);
  if (held.has_value() && *held >= adapter.min_version()) return true;
  PRL_RETURN_IF_ERROR(SwapAdapterIfNewer(id, held.value_or(-1)));
  held = engine.AdapterVersion(id);
  return held.has_value() && *held >= adapter.min_version();
}

absl::Status EngineDriver::SwapAdapterIfNewer(const std::string& adapter_id, int64_t have) {
  absl::StatusOr<std::optional<VersionedWeights>> next =
      options_.adapters->TakeNewer(adapter_id, have);
  if (!next.ok()) {
    // Its channel failed or is closed (the adapter was deleted): it leaves the engine once no
    // request uses it (CloseGoneAdapters), and a lease that names it again opens it again.
    if (!absl::IsNotFound(next.status())) {
      std::fprintf(stderr, "actor %s: adapter %s: %s; closing its channel\n",
                   options_.name.c_str(), adapter_id.c_str(),
                   std::string(next.status().message()).c_str());
      options_.adapters->Close(adapter_id);
    }
    return absl::OkStatus();
  }
  if (!next->has_value() || (*next)->adapter == nullptr) return absl::OkStatus();
  const absl::Status added =
      episodes_.engine().AddAdapter(adapter_id, (*next)->adapter, (*next)->version);
  // Every slot busy with requests in flight: this version waits for the next loop.
  if (absl::IsResourceExhausted(added)) return absl::OkStatus();
  return added;
}

void EngineDriver::CloseGoneAdapters() {
  const absl::Time now = absl::Now();
  if (now - adapters_checked_ < absl::Seconds(1)) return;
  adapters_checked_ = now;
  Engine& engine = episodes_.engine();
  for (const std::string& id : options_.adapters->Gone()) {
    // Not while a lease of it is in the engine (its group would find no channel to go to);
    // still used by a request (FailedPrecondition): the next look removes it.
    const bool leased = std::any_of(leases_.begin(), leases_.end(), [&](const auto& l) {
      return l.second.lease.adapter().adapter_id() == id;
    });
    if (leased) continue;
    const absl::Status removed = engine.RemoveAdapter(id);
    if (!removed.ok() && !absl::IsNotFound(removed)) continue;
    options_.adapters->Close(id);
  }
}

absl::Status EngineDriver::SwapAdaptersIfNewer() {
  if (options_.adapters == nullptr) return absl::OkStatus();
  CloseGoneAdapters();
  Engine& engine = episodes_.engine();
  const std::vector<std::string> open = options_.adapters->open();
  for (const std::string& id : engine.adapters()) {
    if (id.empty() || std::find(open.begin(), open.end(), id) == open.end()) continue;
    const std::optional<int64_t> held = engine.AdapterVersion(id);
    PRL_RETURN_IF_ERROR(SwapAdapterIfNewer(id, held.value_or(-1)));
  }
  return absl::OkStatus();
}

absl::Status EngineDriver::SwapIfNewer() {
  PRL_RETURN_IF_ERROR(SwapAdaptersIfNewer());
  if (weights_ == nullptr) return absl::OkStatus();
  Engine& engine = episodes_.engine();
  // The engine applies staged weights at its next Step: ask only for versions newer than the
  // one staged, or an idle engine would re-take (and re-copy) the same version every loop.
  staged_version_ = std::max(staged_version_, engine.Stats().weight_version);
  PRL_ASSIGN_OR_RETURN(std::optional<VersionedWeights> next, weights_->TakeNewer(staged_version_));
  if (!next.has_value()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  if (next->adapter != nullptr) {  // a LoRA learner's version: its adapter on the base
    PRL_RETURN_IF_ERROR(engine.SwapAdapter(next->adapter, next->version));
  } else {
    PRL_RETURN_IF_ERROR(engine.SwapWeights(next->weights, next->version));
  }
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
  const EngineStats s = episodes_.engine().Stats();
  const episode::EpisodeCounts groups = episodes_.counts();
  options_.metrics->sequences_running.Set(static_cast<double>(s.num_running));
  options_.metrics->sequences_waiting.Set(static_cast<double>(s.num_waiting));
  options_.metrics->groups_in_flight.Set(static_cast<double>(groups.in_engine));
  options_.metrics->episode_groups_waiting_environment.Set(static_cast<double>(groups.waiting));
  // Groups in the engine whose sequences have not started are its waiting sequences.
  const double mean_group = groups.in_engine == 0
                                ? 1.0
                                : static_cast<double>(groups.samples_in_engine) / groups.in_engine;
  options_.metrics->groups_pending.Set(std::min(
      static_cast<double>(groups.in_engine), std::ceil(s.num_waiting / std::max(mean_group, 1.0))));
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
  const int64_t held = episodes_.engine().Stats().weight_version;
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
    const std::string& id = l.lease.lease_id();
    // A run of adapters' prompt (docs/tenants.md): its adapter at the version it needs first.
    absl::Status added = absl::OkStatus();
    if (l.lease.has_adapter()) {
      absl::StatusOr<bool> ready = AdapterReady(l.lease.adapter());
      if (ready.ok() && !*ready) {
        if (absl::Now() - l.leased_at <= options_.weight_wait_timeout) {
          waiting.push_back(std::move(l));
          continue;
        }
        // One adapter's version that never comes (its learner is behind, or it was deleted)
        // costs only its own prompt: given back, the actor goes on with the others.
        ready = absl::DeadlineExceededError(absl::StrCat(
            "adapter ", l.lease.adapter().spec().name(), " (", l.lease.adapter().adapter_id(),
            ") version ", l.lease.adapter().min_version(), " has not arrived after ",
            absl::FormatDuration(options_.weight_wait_timeout)));
      }
      added = ready.status();
    }
    if (added.ok()) added = episodes_.Add(GroupRequestOf(l.lease));
    if (!added.ok()) {
      // The coordinator validated the prompt against its model and this actor's capacity;
      // this engine cannot run it all the same (e.g. the coordinator's model is not ours).
      std::fprintf(stderr, "actor %s: cannot generate %s: %s\n", options_.name.c_str(), id.c_str(),
                   std::string(added.message()).c_str());
      book_->Release(id, v1::RELEASE_REASON_ENGINE_REFUSED, added);
      continue;
    }
    leases_[id] = Leased{std::move(l.lease), absl::ToUnixNanos(absl::Now())};
  }
  waiting_for_weights_ = !waiting.empty();
  book_->Requeue(std::move(waiting));  // ahead of prompts granted meanwhile, in their order
  return absl::OkStatus();
}

void EngineDriver::GiveBack() {
  const LeaseBook::GivenBack given = book_->TakeGivenBack();
  for (const std::string& id : given.reclaimed) {
    if (!episodes_.Abort(id, "reclaimed by the coordinator for other prompt sets")) continue;
    leases_.erase(id);
    book_->Release(id, v1::RELEASE_REASON_RECLAIMED,
                   absl::CancelledError("reclaimed for a fair share of the actor"));
    if (options_.metrics != nullptr) options_.metrics->leases_reclaimed.Increment();
  }
  for (const std::string& id : given.lost) {
    if (!episodes_.Abort(id, "its lease was lost")) continue;
    leases_.erase(id);
    book_->Drop(id);
  }
}

void EngineDriver::HandOn() {
  for (episode::FailedGroup& f : episodes_.TakeFailed()) {
    std::fprintf(stderr, "actor %s: group %s failed, released: %s\n", options_.name.c_str(),
                 f.id.c_str(), std::string(f.why.message()).c_str());
    leases_.erase(f.id);
    book_->Release(f.id, v1::RELEASE_REASON_ENVIRONMENT_FAILED, f.why);
  }
  std::vector<GeneratedGroup> groups;
  for (episode::FinishedGroup& done : episodes_.TakeFinished()) {
    auto it = leases_.find(done.id);
    if (it == leases_.end()) continue;
    groups.push_back({std::move(it->second.lease), it->second.created_unix_nanos,
                      std::move(done.output), std::move(done.episodes)});
    leases_.erase(it);
  }
  if (groups.empty()) return;
  stats_->Update(
      [&](ActorStats& st) { st.groups_generated += static_cast<int64_t>(groups.size()); });
  book_->Generated(std::move(groups));
}

absl::Status EngineDriver::Iteration(const std::function<bool()>& halted) {
  PRL_RETURN_IF_ERROR(SwapIfNewer());
  UpdateEngineGauges();
  PRL_RETURN_IF_ERROR(AddGranted());
  GiveBack();
  const bool runnable = episodes_.Runnable();
  PRL_RETURN_IF_ERROR(episodes_.Step());
  HandOn();
  if (runnable) return absl::OkStatus();
  if (waiting_for_weights_) {  // nothing to run until they arrive: poll for them
    Engine& engine = episodes_.engine();
    const int64_t before = engine.Stats().weight_version;
    PRL_RETURN_IF_ERROR(engine.Step());  // applies staged weights, runs nothing
    // Flipped (the CPU engine does at once): the waiting prompts go in on the next pass.
    if (engine.Stats().weight_version == before) absl::SleepFor(absl::Milliseconds(2));
    return absl::OkStatus();
  }
  if (!episodes_.empty()) {
    // Every group waits for its environment (answers wake the book), or for one to come back.
    book_->Wait(absl::Milliseconds(20));
    return absl::OkStatus();
  }
  book_->WaitForGranted(absl::Milliseconds(20), halted);
  return absl::OkStatus();
}

}  // namespace prl::actor
