// Evaluation sets (declared in coordinator.h; the rounds are coordinator/eval_rounds.h's, held
// by PromptSets): opening the rounds the learner's version makes due, and the share of an
// actor's slots evaluation leases may take. Leasing (leasing.cc) keeps evaluation prompts out
// of the lag budget and within that share.
#include <algorithm>
#include <cmath>

#include "coordinator/coordinator.h"

namespace prl::coordinator {

absl::StatusOr<uint64_t> Coordinator::OpenEvalRoundLocked(const std::string& set_id) {
  prl::v1::LogRecord record;
  record.mutable_eval_round()->set_prompt_set_id(set_id);
  record.mutable_eval_round()->set_version(EvalVersionLocked(set_id));
  // Applied even if the log refuses it, as a failed attempt is (prompt_attempts.cc): a round
  // whose record is lost opens again after a restart.
  absl::StatusOr<uint64_t> ticket = log_->Write(record);
  Apply(record);
  return ticket;
}

int64_t Coordinator::EvalVersionLocked(const std::string& set_id) const {
  const PromptSets::Set* set = sets_.Find(set_id);
  if (set != nullptr && !set->submitted.adapter_id().empty()) {
    const Adapters::Adapter* adapter = adapters_.ById(set->submitted.adapter_id());
    return adapter != nullptr ? adapter->budget->learner_version() : 0;
  }
  return budget_->learner_version();
}

void Coordinator::OpenDueEvalRoundsLocked() {
  const auto version_of = [this](const std::string& id) { return EvalVersionLocked(id); };
  for (const std::string& id : sets_.DueEvalRounds(version_of)) {
    OpenEvalRoundLocked(id).IgnoreError();  // a failed log refuses every later append, visibly
  }
}

std::map<std::string, CoordinatorStats::EvalSeries> Coordinator::EvalSeriesLocked() const {
  std::map<std::string, CoordinatorStats::EvalSeries> out;
  for (const std::string& id : sets_.order()) {
    const EvalRounds::Series* series = sets_.eval_rounds().Find(id);
    if (series == nullptr || series->history.empty()) continue;
    const std::string& name = sets_.Find(id)->submitted.request().name();
    // Bounded: the first kMaxEvalNames names (a metric label, a reply's entries).
    if (out.size() >= CoordinatorStats::kMaxEvalNames && !out.contains(name)) continue;
    CoordinatorStats::EvalSeries& e = out[name];
    // Sets of one name: the newest round of them all.
    if (e.rounds == 0 || series->history.back().finished_unix_ms() >= e.latest.finished_unix_ms()) {
      e.latest = series->history.back();
    }
    e.rounds += static_cast<int64_t>(series->history.size());
  }
  return out;
}

int64_t Coordinator::EvalLeasesAllowedLocked(const std::string& actor_id,
                                             const ActorTable::Actor& actor) const {
  const int32_t slots = actor.capacity.max_prompts_in_flight();
  const int64_t cap =
      slots <= 0 ? 1
                 : std::max<int64_t>(1, static_cast<int64_t>(std::floor(
                                            config_.eval_max_actor_share * slots + 1e-9)));
  int64_t held = 0;
  for (const auto& [id, lease] : leases_.HeldBy(actor_id)) {
    const PromptSets::Set* set = sets_.Find(lease->prompt.set_id);
    held += set != nullptr && set->eval() ? 1 : 0;
  }
  return std::max<int64_t>(0, cap - held);
}

}  // namespace prl::coordinator
