#include "replay/record_proto.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace prl {

namespace {

// RolloutFinishReason and prl.v1.FinishReason share their numbers (1 length, 2 stop, 3 abort).
static_assert(static_cast<int>(RolloutFinishReason::kLength) == v1::FINISH_REASON_LENGTH);
static_assert(static_cast<int>(RolloutFinishReason::kStop) == v1::FINISH_REASON_STOP);
static_assert(static_cast<int>(RolloutFinishReason::kAbort) == v1::FINISH_REASON_ABORT);

template <typename T, typename Repeated>
std::vector<T> ToVector(const Repeated& repeated) {
  return std::vector<T>(repeated.begin(), repeated.end());
}

}  // namespace

void ToProto(const RolloutRecord& r, v1::RolloutRecord* p) {
  p->Clear();
  p->set_run_id(r.run_id);
  p->set_prompt_set_id(r.prompt_set_id);
  p->set_actor_id(r.actor_id);
  p->set_prompt_index(r.prompt_index);
  p->set_group_id(r.group_id);
  p->set_sample_index(r.sample_index);
  p->set_group_size(r.group_size);
  p->mutable_prompt_tokens()->Assign(r.prompt_tokens.begin(), r.prompt_tokens.end());
  p->mutable_completion_tokens()->Assign(r.completion_tokens.begin(), r.completion_tokens.end());
  p->mutable_behaviour_logprobs()->Assign(r.behaviour_logprobs.begin(), r.behaviour_logprobs.end());
  p->mutable_token_versions()->Assign(r.token_versions.begin(), r.token_versions.end());
  p->set_reward(r.reward);
  for (const auto& [name, value] : r.reward_components) {
    v1::RewardComponent* c = p->add_reward_components();
    c->set_name(name);
    c->set_value(value);
  }
  p->set_finish_reason(static_cast<v1::FinishReason>(r.finish_reason));
  v1::RolloutSampling* s = p->mutable_sampling();
  s->set_temperature(r.sampling.temperature);
  s->set_top_p(r.sampling.top_p);
  s->set_top_k(r.sampling.top_k);
  s->set_max_tokens(r.sampling.max_tokens);
  s->set_seed(r.sampling.seed);
  s->mutable_stop_token_ids()->Assign(r.sampling.stop_token_ids.begin(),
                                      r.sampling.stop_token_ids.end());
  p->set_created_unix_nanos(r.created_unix_nanos);
  p->set_finished_unix_nanos(r.finished_unix_nanos);
  p->set_token_sources(std::string(r.token_sources.begin(), r.token_sources.end()));
  p->mutable_turn_ends()->Assign(r.turn_ends.begin(), r.turn_ends.end());
  p->mutable_turn_rewards()->Assign(r.turn_rewards.begin(), r.turn_rewards.end());
  p->set_route_layers(r.route_layers);
  p->set_route_top_k(r.route_top_k);
  p->set_routes(std::string(r.routes.begin(), r.routes.end()));
  p->set_segment(r.segment);
  p->set_segments(r.segments);
}

absl::StatusOr<RolloutRecord> FromProto(const v1::RolloutRecord& p) {
  const v1::FinishReason reason = p.finish_reason();
  if (reason != v1::FINISH_REASON_LENGTH && reason != v1::FINISH_REASON_STOP &&
      reason != v1::FINISH_REASON_ABORT) {
    return absl::InvalidArgumentError(absl::StrCat(
        "finish_reason: expected FINISH_REASON_LENGTH, FINISH_REASON_STOP or "
        "FINISH_REASON_ABORT, found ",
        reason == v1::FINISH_REASON_UNSPECIFIED ? "FINISH_REASON_UNSPECIFIED"
                                                : absl::StrCat(static_cast<int>(reason))));
  }
  if (!p.has_sampling()) {
    return absl::InvalidArgumentError("sampling: expected the sampling parameters, found none");
  }
  RolloutRecord r;
  r.run_id = p.run_id();
  r.prompt_set_id = p.prompt_set_id();
  r.actor_id = p.actor_id();
  r.prompt_index = p.prompt_index();
  r.group_id = p.group_id();
  r.sample_index = p.sample_index();
  r.group_size = p.group_size();
  r.prompt_tokens = ToVector<int32_t>(p.prompt_tokens());
  r.completion_tokens = ToVector<int32_t>(p.completion_tokens());
  r.behaviour_logprobs = ToVector<float>(p.behaviour_logprobs());
  r.token_versions = ToVector<int64_t>(p.token_versions());
  r.reward = p.reward();
  r.reward_components.reserve(p.reward_components_size());
  for (const v1::RewardComponent& c : p.reward_components()) {
    r.reward_components.emplace_back(c.name(), c.value());
  }
  r.finish_reason = static_cast<RolloutFinishReason>(reason);
  const v1::RolloutSampling& s = p.sampling();
  r.sampling.temperature = s.temperature();
  r.sampling.top_p = s.top_p();
  r.sampling.top_k = s.top_k();
  r.sampling.max_tokens = s.max_tokens();
  r.sampling.seed = s.seed();
  r.sampling.stop_token_ids = ToVector<int32_t>(s.stop_token_ids());
  r.created_unix_nanos = p.created_unix_nanos();
  r.finished_unix_nanos = p.finished_unix_nanos();
  r.token_sources.assign(p.token_sources().begin(), p.token_sources().end());
  r.turn_ends = ToVector<uint32_t>(p.turn_ends());
  r.turn_rewards = ToVector<double>(p.turn_rewards());
  if (p.route_layers() > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("route_layers: expected at most 65535, found ", p.route_layers()));
  }
  if (p.route_top_k() > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("route_top_k: expected at most 255, found ", p.route_top_k()));
  }
  r.route_layers = static_cast<uint16_t>(p.route_layers());
  r.route_top_k = static_cast<uint8_t>(p.route_top_k());
  r.routes.assign(p.routes().begin(), p.routes().end());
  r.segment = p.segment();
  r.segments = p.segments() == 0 ? 1 : p.segments();  // (proto3: an older sender's unset field)
  PRL_RETURN_IF_ERROR(ValidateRecord(r));
  return r;
}

}  // namespace prl
