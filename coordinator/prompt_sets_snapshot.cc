// The prompt sets' bounded state (declared in prompt_sets.h): the snapshot that compacts the
// prompt log, and finished sets retired after retention_s.
//
// A snapshot lists, per live set in submission order, its submission, its completed groups
// (each prompt's one GroupResult, from the set's events), the latest failed attempt of each
// prompt not completed (its counts, reason and whether it failed) and its cancellation.
// Replaying it rebuilds what replaying the whole log would, less the retired sets; leases are
// not durable either way.
#include <algorithm>
#include <set>

#include "absl/time/clock.h"

#include "coordinator/prompt_sets.h"

namespace prl::coordinator {

namespace {

const std::string& SetIdOf(const prl::v1::LogRecord& record) {
  if (record.has_submitted()) return record.submitted().prompt_set_id();
  if (record.has_completed()) return record.completed().prompt_set_id();
  if (record.has_failed_attempt()) return record.failed_attempt().prompt_set_id();
  if (record.has_eval_round()) return record.eval_round().prompt_set_id();
  return record.cancelled();
}

}  // namespace

// An evaluation set's rounds, after its submission: the finished ones, then the round whose
// prompts' records follow — the running one, or between rounds the last finished one again
// (so that its prompts replay as settled: replaying its groups finishes it once more, with
// the same result, instead of leaving its prompts pending outside any round).
void PromptSets::AppendEvalRounds(const std::string& id, const Set& set,
                                  std::vector<prl::v1::LogRecord>* out) const {
  const EvalRounds::Series* series = eval_.Find(id);
  if (series == nullptr) return;
  const bool running = series->round_version != EvalRounds::kNoRound;
  const size_t restored = series->history.size() - (running || series->history.empty() ? 0 : 1);
  for (size_t i = 0; i < restored; ++i) {
    prl::v1::LogRecord& record = out->emplace_back();
    record.mutable_eval_round()->set_prompt_set_id(id);
    record.mutable_eval_round()->set_version(series->history[i].version());
    *record.mutable_eval_round()->mutable_finished() = series->history[i];
    record.set_unix_ms(series->history[i].finished_unix_ms());
  }
  if (running || !series->history.empty()) {
    prl::v1::LogRecord& record = out->emplace_back();
    record.mutable_eval_round()->set_prompt_set_id(id);
    record.mutable_eval_round()->set_version(running ? series->round_version
                                                     : series->history.back().version());
    record.set_unix_ms(set.submitted.created_unix_ms());
  }
}

std::vector<prl::v1::LogRecord> PromptSets::Snapshot() const {
  std::vector<prl::v1::LogRecord> out;
  for (const std::string& id : order_) {
    const Set& set = sets_.at(id);
    // A finished set's records carry its finishing time (the retention clock); a running
    // set's completions are stamped by the log.
    const auto finished = finished_at_.find(id);
    const int64_t finished_ms =
        finished == finished_at_.end() ? 0 : absl::ToUnixMillis(finished->second);
    prl::v1::LogRecord& submitted = out.emplace_back();
    *submitted.mutable_submitted() = set.submitted;
    submitted.set_unix_ms(set.submitted.created_unix_ms());
    if (set.eval()) AppendEvalRounds(id, set, &out);
    for (size_t e = set.round_first_event; e < set.events.size(); ++e) {
      const prl::v1::PromptSetEvent& event = set.events[e];
      if (!event.has_group()) continue;
      // The group of a prompt the learner handed back (ReopenPrompts) no longer completes it.
      const int64_t index = event.group().prompt_index();
      if (index < 0 || index >= static_cast<int64_t>(set.prompts.size()) ||
          set.prompts[index].state != PromptState::kDone) {
        continue;
      }
      prl::v1::LogRecord& completed = out.emplace_back();
      completed.mutable_completed()->set_prompt_set_id(id);
      prl::v1::GroupResult* result = completed.mutable_completed()->mutable_result();
      *result = event.group();
      result->clear_texts();  // texts are for watchers only, never logged
      result->clear_texts_dropped();
      completed.set_unix_ms(finished_ms);
    }
    for (size_t i = 0; i < set.prompts.size(); ++i) {
      const Prompt& p = set.prompts[i];
      if ((p.attempts == 0 && p.stale_reruns == 0) || p.state == PromptState::kDone) continue;
      prl::v1::LogRecord& attempt = out.emplace_back();
      prl::v1::FailedAttempt* a = attempt.mutable_failed_attempt();
      a->set_prompt_set_id(id);
      a->set_prompt_index(static_cast<int64_t>(i));
      a->set_attempts(p.attempts);
      a->set_stale_reruns(p.stale_reruns);
      a->set_reason(p.last_reason);
      a->set_failed(p.state == PromptState::kFailed);
      attempt.set_unix_ms(finished_ms);
    }
    if (set.state == prl::v1::PROMPT_SET_STATE_CANCELLED) {
      prl::v1::LogRecord& cancelled = out.emplace_back();
      cancelled.set_cancelled(id);
      cancelled.set_unix_ms(finished_ms);
    }
  }
  return out;
}

std::vector<std::string> PromptSets::Retire(absl::Time now, int64_t retention_s) {
  if (retention_s <= 0) return {};
  std::set<std::string> retired;
  for (const auto& [id, set] : sets_) {
    if (set.running()) continue;
    const auto [since, inserted] = finished_at_.emplace(id, now);
    if (now - since->second >= absl::Seconds(retention_s)) retired.insert(id);
  }
  if (retired.empty()) return {};
  auto is_retired = [&](const std::string& id) { return retired.count(id) > 0; };
  for (auto it = idempotency_.begin(); it != idempotency_.end();) {
    it = is_retired(it->second) ? idempotency_.erase(it) : std::next(it);
  }
  order_.erase(std::remove_if(order_.begin(), order_.end(), is_retired), order_.end());
  for (const std::string& id : retired) {
    sets_.erase(id);
    eval_.Remove(id);
    finished_at_.erase(id);
    recently_retired_.push_back(id);
    if (recently_retired_.size() > kRecentlyRetired) recently_retired_.pop_front();
  }
  counts_.sets_retired += static_cast<int64_t>(retired.size());
  return {retired.begin(), retired.end()};
}

void PromptSets::RecoverFinishTimes(const std::vector<prl::v1::LogRecord>& records) {
  std::map<std::string, int64_t> last_ms;
  for (const prl::v1::LogRecord& record : records) {
    int64_t& ms = last_ms[SetIdOf(record)];
    ms = std::max(ms, record.unix_ms());
  }
  const absl::Time now = absl::Now();
  for (const auto& [id, set] : sets_) {
    if (set.running()) continue;
    const int64_t ms = last_ms[id];
    finished_at_[id] = ms > 0 ? absl::FromUnixMillis(ms) : now;  // older logs: from now
  }
}

}  // namespace prl::coordinator
