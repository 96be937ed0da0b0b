#include "coordinator/eval_rounds.h"

#include <algorithm>

namespace prl::coordinator {

void EvalRounds::Add(const std::string& set_id, const prl::v1::EvalSpec& spec,
                     int32_t samples_per_prompt) {
  Series& s = series_[set_id];
  s.every_versions = std::max<int64_t>(1, spec.every_versions());
  s.pass_reward = spec.pass_reward() == 0 ? 1.0 : spec.pass_reward();
  s.k = samples_per_prompt;
}

void EvalRounds::Remove(const std::string& set_id) { series_.erase(set_id); }

const EvalRounds::Series* EvalRounds::Find(const std::string& set_id) const {
  const auto it = series_.find(set_id);
  return it == series_.end() ? nullptr : &it->second;
}

void EvalRounds::Open(const std::string& set_id, int64_t version) {
  const auto it = series_.find(set_id);
  if (it == series_.end()) return;
  Series& s = it->second;
  s.round_version = version;
  s.next_version = version + s.every_versions;
  s.prompts = s.failed = s.samples = s.passed = 0;
  s.reward_sum = 0;
  s.min_weight_version = s.max_weight_version = 0;
}

void EvalRounds::Restore(const std::string& set_id, const prl::v1::EvalRoundResult& finished) {
  const auto it = series_.find(set_id);
  if (it == series_.end()) return;
  Series& s = it->second;
  s.history.push_back(finished);
  while (s.history.size() > kMaxHistory) s.history.pop_front();
  s.next_version = finished.version() + s.every_versions;
}

void EvalRounds::Scored(const std::string& set_id, const prl::v1::GroupResult& result) {
  const auto it = series_.find(set_id);
  if (it == series_.end() || it->second.round_version == kNoRound) return;
  Series& s = it->second;
  s.min_weight_version = s.prompts == 0 ? result.min_version()
                                        : std::min(s.min_weight_version, result.min_version());
  s.max_weight_version = s.prompts == 0 ? result.max_version()
                                        : std::max(s.max_weight_version, result.max_version());
  s.prompts += 1;
  bool passed = false;
  for (double r : result.rewards()) {
    s.reward_sum += r;
    s.samples += 1;
    passed = passed || r >= s.pass_reward;
  }
  s.passed += passed ? 1 : 0;
}

void EvalRounds::Failed(const std::string& set_id) {
  const auto it = series_.find(set_id);
  if (it == series_.end() || it->second.round_version == kNoRound) return;
  it->second.failed += 1;
}

prl::v1::EvalRoundResult EvalRounds::Finish(const std::string& set_id, int64_t unix_ms) {
  prl::v1::EvalRoundResult r;
  const auto it = series_.find(set_id);
  if (it == series_.end() || it->second.round_version == kNoRound) return r;
  Series& s = it->second;
  r.set_version(s.round_version);
  r.set_prompts(s.prompts);
  r.set_prompts_failed(s.failed);
  r.set_samples(s.samples);
  r.set_k(s.k);
  r.set_mean_reward(s.samples > 0 ? s.reward_sum / static_cast<double>(s.samples) : 0.0);
  r.set_pass_at_k(s.prompts > 0 ? static_cast<double>(s.passed) / s.prompts : 0.0);
  r.set_finished_unix_ms(unix_ms);
  r.set_min_weight_version(s.min_weight_version);
  r.set_max_weight_version(s.max_weight_version);
  s.history.push_back(r);
  while (s.history.size() > kMaxHistory) s.history.pop_front();
  s.round_version = kNoRound;
  return r;
}

std::vector<std::string> EvalRounds::Due(int64_t version) const {
  return Due([version](const std::string&) { return version; });
}

std::vector<std::string> EvalRounds::Due(
    const std::function<int64_t(const std::string&)>& version_of) const {
  std::vector<std::string> due;
  for (const auto& [id, s] : series_) {
    if (s.round_version == kNoRound && version_of(id) >= s.next_version) due.push_back(id);
  }
  return due;
}

}  // namespace prl::coordinator
