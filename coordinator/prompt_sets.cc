#include "coordinator/prompt_sets.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace prl::coordinator {

// ---- Records ---------------------------------------------------------------------------------

void PromptSets::ApplySubmitted(const prl::v1::SubmittedPromptSet& s) {
  Set& set = sets_[s.prompt_set_id()];
  set.submitted = s;
  set.prompts.assign(s.request().prompts_size(), {});
  set.pending = s.request().prompts_size();
  set.samples = s.request().samples_per_prompt();
  set.min_tokens = s.request().prompts().empty() ? 0 : std::numeric_limits<int64_t>::max();
  for (const prl::v1::Prompt& prompt : s.request().prompts()) {
    set.max_tokens = std::max<int64_t>(set.max_tokens, prompt.tokens().ids_size());
    set.min_tokens = std::min<int64_t>(set.min_tokens, prompt.tokens().ids_size());
  }
  set.max_tokens += s.request().sampling().max_tokens();
  set.min_tokens += s.request().sampling().max_tokens();
  set.weight = s.request().weight() > 0 ? s.request().weight() : 1.0;
  order_.push_back(s.prompt_set_id());
  if (!s.request().idempotency_key().empty()) {
    idempotency_[ScopedKey(s.tenant(), s.request().idempotency_key())] = s.prompt_set_id();
  }
  if (set.eval()) {
    eval_.Add(set.id(), s.request().eval(), s.request().samples_per_prompt());
  }
}

void PromptSets::ApplyCompleted(const std::string& set_id, const prl::v1::GroupResult& result) {
  Set* set = FindMutable(set_id);
  if (set == nullptr || result.prompt_index() < 0 ||
      result.prompt_index() >= static_cast<int64_t>(set->prompts.size())) {
    return;
  }
  Prompt& p = set->prompts[result.prompt_index()];
  if (p.state == PromptState::kDone || p.state == PromptState::kFailed) return;
  if (p.state == PromptState::kLeased) {
    --set->in_flight;
  } else {
    --set->pending;
  }
  p.state = PromptState::kDone;
  ++set->done;
  ++(set->eval() ? counts_.eval_groups : counts_.groups_completed);
  for (double r : result.rewards()) set->reward_sum += r;
  set->reward_count += result.rewards_size();
  if (set->eval()) eval_.Scored(set_id, result);
  *set->events.emplace_back().mutable_group() = result;
  FinishIfSettled(*set);
  *set->events.emplace_back().mutable_status() = StatusOf(*set, /*with_eval_rounds=*/false);
  BoundTexts(*set);
}

void PromptSets::ApplyCancelled(const std::string& set_id) {
  Set* set = FindMutable(set_id);
  if (set == nullptr || !set->running()) return;
  set->state = prl::v1::PROMPT_SET_STATE_CANCELLED;
  *set->events.emplace_back().mutable_status() = StatusOf(*set, /*with_eval_rounds=*/false);
}

bool PromptSets::ApplyFailedAttempt(const prl::v1::FailedAttempt& attempt) {
  Set* set = FindMutable(attempt.prompt_set_id());
  const int64_t index = attempt.prompt_index();
  if (set == nullptr || index < 0 || index >= static_cast<int64_t>(set->prompts.size())) {
    return false;
  }
  Prompt& p = set->prompts[index];
  bool rerun = false;
  if (p.state == PromptState::kDone && attempt.reopened()) {  // un-completed, re-run soon
    p.state = PromptState::kPending;
    --set->done;
    ++set->pending;
    rerun = true;
    if (set->state == prl::v1::PROMPT_SET_STATE_DONE) set->state = prl::v1::PROMPT_SET_STATE_RUNNING;
    ++counts_.prompts_reopened;
  }
  if (p.state == PromptState::kDone || p.state == PromptState::kFailed) return false;
  // Live: the lease ends and the prompt is pending again (a re-run). Replay: it is pending
  // already, and queued from its submission.
  if (p.state == PromptState::kLeased) {
    Requeue(*set, index);
    rerun = true;
  }
  p.attempts = attempt.attempts();
  p.stale_reruns = attempt.stale_reruns();
  p.last_reason = attempt.reason();
  if (!attempt.failed()) return rerun;
  p.state = PromptState::kFailed;  // its queue entry is dropped as stale when reached
  --set->pending;
  ++set->failed;
  ++counts_.prompts_failed;
  prl::v1::FailedPrompt failed;
  failed.set_prompt_index(index);
  failed.set_attempts(p.attempts);
  failed.set_stale_reruns(p.stale_reruns);
  failed.set_reason(p.last_reason);
  if (set->first_failed.size() < kMaxFailedListed) set->first_failed.push_back(failed);
  *set->events.emplace_back().mutable_failed() = failed;
  if (set->eval()) eval_.Failed(set->id());
  FinishIfSettled(*set);
  *set->events.emplace_back().mutable_status() = StatusOf(*set, /*with_eval_rounds=*/false);
  return false;
}

std::vector<int64_t> PromptSets::ApplyEvalRound(const prl::v1::EvalRound& round) {
  Set* set = FindMutable(round.prompt_set_id());
  if (set == nullptr || !set->eval()) return {};
  if (round.has_finished()) {
    eval_.Restore(set->id(), round.finished());
    return {};
  }
  eval_.Open(set->id(), round.version());
  std::vector<int64_t> reopened;
  for (size_t i = 0; i < set->prompts.size(); ++i) {
    Prompt& p = set->prompts[i];
    if (p.state == PromptState::kDone || p.state == PromptState::kFailed) {
      reopened.push_back(static_cast<int64_t>(i));
    }
    if (p.state != PromptState::kLeased) p = Prompt{};  // (a round opens with none leased)
  }
  set->pending = static_cast<int64_t>(set->prompts.size()) - set->in_flight;
  set->done = set->failed = 0;
  set->reward_sum = 0;
  set->reward_count = 0;
  set->first_failed.clear();
  set->round_first_event = set->events.size();
  *set->events.emplace_back().mutable_status() = StatusOf(*set, /*with_eval_rounds=*/false);
  return reopened;
}

void PromptSets::MarkLeased(const std::string& set_id, int64_t index) {
  Set& set = sets_.at(set_id);
  set.prompts.at(index).state = PromptState::kLeased;
  --set.pending;
  ++set.in_flight;
}

void PromptSets::FillLease(const Set& set, int64_t index, prl::v1::LeasedPrompt* out) {
  const prl::v1::SubmitPromptSetRequest& req = set.submitted.request();
  out->set_prompt_set_id(set.id());
  out->set_prompt_index(index);
  *out->mutable_prompt_tokens() = req.prompts(index).tokens().ids();
  out->set_reference(req.prompts(index).reference());
  out->set_samples(req.samples_per_prompt());
  *out->mutable_sampling() = req.sampling();
  *out->mutable_reward() = req.reward();
  if (req.has_environment()) *out->mutable_environment() = req.environment();
  if (req.has_agent()) *out->mutable_agent() = req.agent();
  out->set_eval(set.eval());
  if (!set.submitted.adapter_id().empty()) {
    out->mutable_adapter()->set_adapter_id(set.submitted.adapter_id());
    *out->mutable_adapter()->mutable_spec() = set.submitted.request().adapter();
  }
  if ((req.has_environment() || req.has_agent()) && index < set.submitted.episode_prompts_size()) {
    *out->mutable_episode_prompt() = set.submitted.episode_prompts(index);
  }
}

void PromptSets::Requeue(Set& set, int64_t index) {
  set.prompts[index].state = PromptState::kPending;
  --set.in_flight;
  ++set.pending;
}

void PromptSets::FinishIfSettled(Set& set) {
  if (!set.running() || set.done + set.failed != static_cast<int64_t>(set.prompts.size())) return;
  if (!set.eval()) {
    set.state = prl::v1::PROMPT_SET_STATE_DONE;
    return;
  }
  // An evaluation set's round ends; the set runs on until cancelled.
  const EvalRounds::Series* series = eval_.Find(set.id());
  if (series != nullptr && series->round_version != EvalRounds::kNoRound) {
    eval_.Finish(set.id(), absl::ToUnixMillis(absl::Now()));
  }
}

void PromptSets::BoundTexts(Set& set) {
  // The group just added (followed by its status).
  auto newest = std::find_if(set.events.rbegin(), set.events.rend(),
                             [](const prl::v1::PromptSetEvent& e) { return e.has_group(); });
  if (newest == set.events.rend()) return;
  for (const std::string& t : newest->group().texts()) set.text_bytes += t.size();
  while (set.text_bytes > max_text_bytes_per_set_ && set.oldest_text < set.events.size()) {
    prl::v1::PromptSetEvent& e = set.events[set.oldest_text++];
    if (!e.has_group() || e.group().texts().empty()) continue;
    for (const std::string& t : e.group().texts()) set.text_bytes -= t.size();
    e.mutable_group()->clear_texts();
    e.mutable_group()->set_texts_dropped(true);
  }
}

// ---- Reading ---------------------------------------------------------------------------------

PromptSets::Set* PromptSets::FindMutable(const std::string& set_id) {
  auto it = sets_.find(set_id);
  return it == sets_.end() ? nullptr : &it->second;
}

const PromptSets::Set* PromptSets::Find(const std::string& set_id) const {
  auto it = sets_.find(set_id);
  return it == sets_.end() ? nullptr : &it->second;
}

const PromptSets::Prompt* PromptSets::FindPrompt(const std::string& set_id, int64_t index) const {
  const Set* set = Find(set_id);
  if (set == nullptr || index < 0 || index >= static_cast<int64_t>(set->prompts.size())) {
    return nullptr;
  }
  return &set->prompts[index];
}

std::string PromptSets::ScopedKey(const std::string& tenant, const std::string& key) {
  return tenant.empty() ? key : absl::StrCat(tenant, "\x1f", key);
}

const std::string* PromptSets::ByIdempotencyKey(const std::string& tenant,
                                                const std::string& key) const {
  auto it = idempotency_.find(ScopedKey(tenant, key));
  return it == idempotency_.end() ? nullptr : &it->second;
}

prl::v1::PromptSetStatus PromptSets::StatusOf(const Set& set, bool with_eval_rounds) const {
  prl::v1::PromptSetStatus s;
  s.set_prompt_set_id(set.id());
  s.set_name(set.submitted.request().name());
  s.set_state(set.state);
  s.set_prompts_total(static_cast<int64_t>(set.prompts.size()));
  s.set_prompts_pending(set.pending);
  s.set_prompts_in_flight(set.in_flight);
  s.set_prompts_done(set.done);
  s.set_mean_reward(set.reward_count > 0 ? set.reward_sum / set.reward_count : 0.0);
  s.set_created_unix_ms(set.submitted.created_unix_ms());
  s.set_samples_per_prompt(set.submitted.request().samples_per_prompt());
  s.set_prompts_failed(set.failed);
  s.set_weight(set.weight);
  if (set.submitted.request().has_adapter()) s.set_adapter(set.submitted.request().adapter().name());
  for (const prl::v1::FailedPrompt& f : set.first_failed) *s.add_failed_prompts() = f;
  if (set.eval()) {
    s.set_eval(true);
    const EvalRounds::Series* series = eval_.Find(set.id());
    s.set_eval_round_version(series == nullptr ? EvalRounds::kNoRound : series->round_version);
    if (series != nullptr && with_eval_rounds) {
      for (const prl::v1::EvalRoundResult& r : series->history) *s.add_eval_rounds() = r;
    }
  }
  if (set.running() && set.pending > 0) s.set_message(wait_note_(set));
  return s;
}

int64_t PromptSets::PendingOrInFlight() const {
  int64_t n = 0;
  for (const auto& [id, set] : sets_) {
    if (set.running()) n += set.pending + set.in_flight;
  }
  return n;
}

int64_t PromptSets::EvalInFlight() const {
  int64_t n = 0;
  for (const auto& [id, set] : sets_) n += set.eval() ? set.in_flight : 0;
  return n;
}

std::vector<std::string> PromptSets::DueEvalRounds(
    const std::function<int64_t(const std::string& set_id)>& version_of) const {
  std::vector<std::string> due;
  for (const std::string& id : eval_.Due(version_of)) {
    const Set* set = Find(id);
    if (set != nullptr && set->running()) due.push_back(id);
  }
  return due;
}

void PromptSets::Totals(int64_t* pending, int64_t* in_flight, int64_t* done) const {
  *pending = *in_flight = *done = 0;
  for (const auto& [id, set] : sets_) {
    *pending += set.running() ? set.pending : 0;
    *in_flight += set.in_flight;
    *done += set.done;
  }
}

}  // namespace prl::coordinator
