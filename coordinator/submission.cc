// Validating a submission (declared in coordinator.h): every field bounded, the sampling
// parameters and the reward checked, prompts tokenised and checked against the model's
// vocabulary and context. Errors name the field and what was expected.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/coordinator.h"
#include "coordinator/field_error.h"
#include "coordinator/prompt_format.h"
#include "core/status_macros.h"
#include "env/builtin_names.h"

namespace prl::coordinator {

namespace {

// Caps on what one submission may carry, beyond the configured ones: every field is bounded.
constexpr size_t kMaxNameBytes = 256, kMaxKeyBytes = 256;
constexpr int kMaxRewardParams = 16;
constexpr size_t kMaxRewardParamBytes = 4096;
constexpr size_t kMaxPromptBytes = 1 << 20;  // a prompt's text, messages or tools
constexpr int kMaxStopTokens = 64;
constexpr int kMaxEnvParams = 64;
constexpr size_t kMaxEnvParamBytes = 4096, kMaxEnvParamsBytes = 64 << 10;
// An evaluation set's period (versions between rounds) at most.
constexpr int64_t kMaxEvalEvery = 1'000'000;

// A set's weight (its share of leases): a ratio of a million between two sets at most, which
// keeps the round robin's credits (coordinator/lease_scheduler.h) far from rounding.
constexpr double kMinWeight = 1e-3, kMaxWeight = 1e3;

size_t PromptBytes(const prl::v1::Prompt& p) {
  size_t n = p.text().size() + p.reference().size() + p.chat().tools_json().size() +
             p.chat().template_kwargs_json().size() + 4 * p.tokens().ids_size();
  for (const prl::v1::ChatMessage& m : p.chat().messages()) n += m.content().size();
  return n;
}

absl::Status TooLarge(absl::string_view field, size_t limit, size_t found) {
  return Invalid(field, absl::StrCat("at most ", limit), absl::StrCat(found));
}

}  // namespace

absl::Status Coordinator::ValidateShape(const prl::v1::SubmitPromptSetRequest& r) const {
  if (r.prompts().empty()) return Invalid("prompts", "at least one prompt", "none");
  if (r.prompts_size() > config_.max_prompts_per_set) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "prompts: at most ", config_.max_prompts_per_set,
        " per submission (coordinator.max_prompts_per_set), found ", r.prompts_size()));
  }
  if (r.name().size() > kMaxNameBytes) return TooLarge("name", kMaxNameBytes, r.name().size());
  if (r.idempotency_key().size() > kMaxKeyBytes) {
    return TooLarge("idempotency_key", kMaxKeyBytes, r.idempotency_key().size());
  }
  if (r.reward().params_size() > kMaxRewardParams) {
    return TooLarge("reward.params", kMaxRewardParams, r.reward().params_size());
  }
  for (const auto& [k, v] : r.reward().params()) {
    if (k.size() + v.size() > kMaxRewardParamBytes) {
      return TooLarge(absl::StrCat("reward.params[", k.substr(0, 64), "]"), kMaxRewardParamBytes,
                      k.size() + v.size());
    }
  }
  for (int i = 0; i < r.prompts_size(); ++i) {
    if (PromptBytes(r.prompts(i)) > kMaxPromptBytes) {
      return TooLarge(absl::StrCat("prompts[", i, "]"), kMaxPromptBytes, PromptBytes(r.prompts(i)));
    }
  }
  if (r.weight() != 0 && !(r.weight() >= kMinWeight && r.weight() <= kMaxWeight)) {
    return Invalid("weight", absl::StrCat("0 (unset: 1) or ", kMinWeight, " to ", kMaxWeight),
                   absl::StrCat(r.weight()));
  }
  if (r.eval().every_versions() < 0 || r.eval().every_versions() > kMaxEvalEvery) {
    return Invalid("eval.every_versions",
                   absl::StrCat("0 (a training set) or 1 to ", kMaxEvalEvery),
                   absl::StrCat(r.eval().every_versions()));
  }
  if (!std::isfinite(r.eval().pass_reward())) {
    return Invalid("eval.pass_reward", "a finite number (0: 1)",
                   absl::StrCat(r.eval().pass_reward()));
  }
  const int32_t n = r.samples_per_prompt();
  if (n < 1 || n > config_.max_samples_per_prompt) {
    return Invalid("samples_per_prompt", absl::StrCat("1 to ", config_.max_samples_per_prompt),
                   absl::StrCat(n));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::ValidateSampling(const prl::v1::SubmitPromptSetRequest& r) const {
  if (!r.has_sampling()) return Invalid("sampling", "the sampling parameters", "none");
  const prl::v1::RolloutSampling& s = r.sampling();
  if (!(s.temperature() >= 0) || !std::isfinite(s.temperature())) {
    return Invalid("sampling.temperature", ">= 0 and finite", absl::StrCat(s.temperature()));
  }
  if (!(s.top_p() > 0 && s.top_p() <= 1)) {
    return Invalid("sampling.top_p", "in (0, 1]", absl::StrCat(s.top_p()));
  }
  if (s.top_k() < 0) return Invalid("sampling.top_k", ">= 0", absl::StrCat(s.top_k()));
  if (s.max_tokens() < 1) {
    return Invalid("sampling.max_tokens", ">= 1", absl::StrCat(s.max_tokens()));
  }
  if (s.stop_token_ids_size() > kMaxStopTokens) {
    return TooLarge("sampling.stop_token_ids", kMaxStopTokens, s.stop_token_ids_size());
  }
  for (int i = 0; i < s.stop_token_ids_size(); ++i) {
    if (s.stop_token_ids(i) < 0 || s.stop_token_ids(i) >= config_.vocab_size) {
      return Invalid(absl::StrCat("sampling.stop_token_ids[", i, "]"),
                     absl::StrCat("a token id in [0, ", config_.vocab_size, ")"),
                     absl::StrCat(s.stop_token_ids(i)));
    }
  }
  return absl::OkStatus();
}

absl::Status Coordinator::ValidateReward(const prl::v1::RewardSpec& reward) const {
  if (!config_.validate_reward) {
    return Invalid("reward.name", "a reward this coordinator knows", reward.name());
  }
  if (reward.name() == "remote") {
    // Actors dial the address: only those the operator allowed (no request forgery into the
    // cluster).
    auto address = reward.params().find("address");
    const std::string found = address == reward.params().end() ? "" : address->second;
    if (std::find(config_.reward_addresses.begin(), config_.reward_addresses.end(), found) ==
        config_.reward_addresses.end()) {
      return Invalid("reward.params.address",
                     config_.reward_addresses.empty()
                         ? std::string("an address listed in coordinator.reward_addresses (none "
                                       "is)")
                         : absl::StrCat("one of coordinator.reward_addresses: ",
                                        absl::StrJoin(config_.reward_addresses, ", ")),
                     absl::StrCat("'", found, "'"));
    }
  }
  if (absl::Status r = config_.validate_reward(reward); !r.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("reward: ", r.message()));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::ValidateEnvironment(const prl::v1::SubmitPromptSetRequest& request,
                                              const Caller& caller,
                                              prl::v1::EnvironmentSpec* out) const {
  const prl::v1::EnvironmentSpec& e = request.environment();
  if (e.name().size() > kMaxNameBytes) {
    return TooLarge("environment.name", kMaxNameBytes, e.name().size());
  }
  if (e.address().size() > kMaxNameBytes) {
    return TooLarge("environment.address", kMaxNameBytes, e.address().size());
  }
  if (e.parameters_size() > kMaxEnvParams) {
    return TooLarge("environment.parameters", kMaxEnvParams, e.parameters_size());
  }
  size_t parameter_bytes = 0;
  for (const auto& [k, v] : e.parameters()) {
    if (k.size() + v.size() > kMaxEnvParamBytes) {
      return TooLarge(absl::StrCat("environment.parameters[", k.substr(0, 64), "]"),
                      kMaxEnvParamBytes, k.size() + v.size());
    }
    parameter_bytes += k.size() + v.size();
  }
  if (parameter_bytes > kMaxEnvParamsBytes) {
    return TooLarge("environment.parameters (bytes in all)", kMaxEnvParamsBytes, parameter_bytes);
  }
  if (e.address().empty()) {
    if (!env::IsBuiltinEnvironment(e.name())) {
      return Invalid("environment.name",
                     absl::StrCat("a built-in environment (", env::DescribeBuiltinEnvironments(),
                                  ") or an environment.address"),
                     absl::StrCat("'", e.name().substr(0, 64), "'"));
    }
  } else {
    // Actors dial the address: only those the operator allowed this caller.
    PRL_RETURN_IF_ERROR(CheckAddress(caller, e.address(), config_.env_addresses,
                                     "coordinator.env_addresses", &TenantLimits::env_addresses,
                                     "environment.address"));
  }
  if (e.max_turns() < 0 || e.max_turns() > 1024) {
    return Invalid("environment.max_turns", "0 (8) to 1024", absl::StrCat(e.max_turns()));
  }
  if (e.max_tokens_per_turn() < 0 || e.max_tokens_per_turn() > request.sampling().max_tokens()) {
    return Invalid("environment.max_tokens_per_turn",
                   absl::StrCat("0 (sampling.max_tokens) to sampling.max_tokens (",
                                request.sampling().max_tokens(), ")"),
                   absl::StrCat(e.max_tokens_per_turn()));
  }
  const int32_t turn_tokens =
      e.max_tokens_per_turn() > 0 ? e.max_tokens_per_turn() : request.sampling().max_tokens();
  if (e.max_episode_tokens() < 0 ||
      (e.max_episode_tokens() > 0 && e.max_episode_tokens() < turn_tokens)) {
    return Invalid("environment.max_episode_tokens",
                   absl::StrCat("0 (no limit) or at least a turn's tokens (", turn_tokens,
                                ": max_tokens_per_turn, else sampling.max_tokens)"),
                   absl::StrCat(e.max_episode_tokens()));
  }
  const std::string& format = e.tool_call_format();
  if (!format.empty() && format != "hermes" && format != "llama3_json" && format != "none") {
    return Invalid("environment.tool_call_format",
                   "\"\" (from the chat template), hermes, llama3_json or none",
                   absl::StrCat("'", format.substr(0, 64), "'"));
  }
  const double max_timeout = config_.max_env_timeout_s;
  if (!(e.timeout_s() >= 0 && e.timeout_s() <= max_timeout)) {
    return Invalid("environment.timeout_s",
                   absl::StrCat("0 (the default: ", std::min(30.0, max_timeout), ") to ",
                                max_timeout, " (coordinator.max_env_timeout_s)"),
                   absl::StrCat(e.timeout_s()));
  }
  *out = e;  // with the defaults filled in: what the actors get
  FillEnvironmentDefaults(request.sampling().max_tokens(), max_timeout, out);
  return absl::OkStatus();
}

absl::Status Coordinator::ValidateAgent(const prl::v1::SubmitPromptSetRequest& request,
                                        const Caller& caller, prl::v1::AgentSpec* out) const {
  const prl::v1::AgentSpec& a = request.agent();
  if (a.name().size() > kMaxNameBytes)
    return TooLarge("agent.name", kMaxNameBytes, a.name().size());
  if (a.address().size() > kMaxNameBytes) {
    return TooLarge("agent.address", kMaxNameBytes, a.address().size());
  }
  if (a.parameters_size() > kMaxEnvParams) {
    return TooLarge("agent.parameters", kMaxEnvParams, a.parameters_size());
  }
  size_t parameter_bytes = 0;
  for (const auto& [k, v] : a.parameters()) {
    if (k.size() + v.size() > kMaxEnvParamBytes) {
      return TooLarge(absl::StrCat("agent.parameters[", k.substr(0, 64), "]"), kMaxEnvParamBytes,
                      k.size() + v.size());
    }
    parameter_bytes += k.size() + v.size();
  }
  if (parameter_bytes > kMaxEnvParamsBytes) {
    return TooLarge("agent.parameters (bytes in all)", kMaxEnvParamsBytes, parameter_bytes);
  }
  // Actors dial the address and hand it episode keys: only those the operator allowed this
  // caller.
  PRL_RETURN_IF_ERROR(CheckAddress(caller, a.address(), config_.agent_addresses,
                                   "coordinator.agent_addresses", &TenantLimits::agent_addresses,
                                   "agent.address"));
  if (a.max_calls() < 0 || a.max_calls() > 1024) {
    return Invalid("agent.max_calls", "0 (16) to 1024", absl::StrCat(a.max_calls()));
  }
  const int32_t max_tokens = request.sampling().max_tokens();
  if (a.max_tokens_per_call() < 0 || a.max_tokens_per_call() > max_tokens) {
    return Invalid(
        "agent.max_tokens_per_call",
        absl::StrCat("0 (sampling.max_tokens) to sampling.max_tokens (", max_tokens, ")"),
        absl::StrCat(a.max_tokens_per_call()));
  }
  const int32_t call_tokens = a.max_tokens_per_call() > 0 ? a.max_tokens_per_call() : max_tokens;
  if (a.max_episode_tokens() < 0 ||
      (a.max_episode_tokens() > 0 && a.max_episode_tokens() < call_tokens)) {
    return Invalid("agent.max_episode_tokens",
                   absl::StrCat("0 (no limit) or at least a call's tokens (", call_tokens,
                                ": max_tokens_per_call, else sampling.max_tokens)"),
                   absl::StrCat(a.max_episode_tokens()));
  }
  const std::string& format = a.tool_call_format();
  if (!format.empty() && format != "hermes" && format != "llama3_json" && format != "none") {
    return Invalid("agent.tool_call_format",
                   "\"\" (from the chat template), hermes, llama3_json or none",
                   absl::StrCat("'", format.substr(0, 64), "'"));
  }
  const double max_timeout = config_.max_agent_timeout_s;
  if (!(a.timeout_s() >= 0 && a.timeout_s() <= max_timeout)) {
    return Invalid("agent.timeout_s",
                   absl::StrCat("0 (the default: ", std::min(300.0, max_timeout), ") to ",
                                max_timeout, " (coordinator.max_agent_timeout_s)"),
                   absl::StrCat(a.timeout_s()));
  }
  *out = a;  // with the defaults filled in: what the actors get
  FillAgentDefaults(max_tokens, max_timeout, out);
  return absl::OkStatus();
}

absl::Status Coordinator::CheckAddress(const Caller& caller, const std::string& address,
                                       const std::vector<std::string>& shared, const char* key,
                                       std::vector<std::string> TenantLimits::*own,
                                       const std::string& field) const {
  const auto listed = [&](const std::vector<std::string>& list) {
    return std::find(list.begin(), list.end(), address) != list.end();
  };
  if (listed(shared)) return absl::OkStatus();
  const char* own_key = own == &TenantLimits::agent_addresses ? "agent_addresses" : "env_addresses";
  std::vector<std::string> usable = shared;
  for (const auto& [tenant, limits] : config_.tenants) {
    if (!caller.operator_() && tenant != caller.tenant) continue;  // never another tenant's
    if (listed(limits.*own)) return absl::OkStatus();
    usable.insert(usable.end(), (limits.*own).begin(), (limits.*own).end());
  }
  std::string lists = key;
  if (!caller.operator_()) {
    lists = absl::StrCat(key, " or coordinator.tenants.", caller.tenant, ".", own_key);
  } else if (!config_.tenants.empty()) {
    lists = absl::StrCat(key, " or a tenant's ", own_key);
  }
  return Invalid(field,
                 usable.empty() ? absl::StrCat("an address listed in ", lists, " (none is)")
                                : absl::StrCat("one of ", lists, ": ", absl::StrJoin(usable, ", ")),
                 absl::StrCat("'", address.substr(0, 128), "'"));
}

absl::Status Coordinator::Validate(const prl::v1::SubmitPromptSetRequest& request,
                                   const Caller& caller,
                                   prl::v1::SubmitPromptSetRequest* out) const {
  *out = request;
  PRL_RETURN_IF_ERROR(ValidateShape(request));
  PRL_RETURN_IF_ERROR(ValidateSampling(request));
  if (request.has_environment() && request.has_agent()) {
    return Invalid("agent", "unset when the set names an environment (one or the other)",
                   absl::StrCat("agent '", request.agent().name().substr(0, 64), "'"));
  }
  if (request.has_agent()) {  // the episodes' rewards come from the agent
    PRL_RETURN_IF_ERROR(ValidateAgent(request, caller, out->mutable_agent()));
  } else if (request.has_environment()) {  // the episodes' rewards come from the environment
    PRL_RETURN_IF_ERROR(ValidateEnvironment(request, caller, out->mutable_environment()));
  } else {
    PRL_RETURN_IF_ERROR(ValidateReward(request.reward()));
  }
  const prl::v1::RolloutSampling& s = request.sampling();
  if (s.stop_token_ids_size() == 0 && config_.text != nullptr) {
    for (int32_t id : config_.text->stop_ids()) out->mutable_sampling()->add_stop_token_ids(id);
  }
  for (int i = 0; i < request.prompts_size(); ++i) {
    const std::string field = absl::StrCat("prompts[", i, "]");
    PRL_ASSIGN_OR_RETURN(
        const std::vector<int32_t> tokens,
        PromptTokens(request.prompts(i), config_.text.get(), config_.vocab_size, field));
    const int64_t total = static_cast<int64_t>(tokens.size()) + s.max_tokens();
    if (total > config_.max_position_embeddings) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", tokens.size(), " tokens + sampling.max_tokens ", s.max_tokens(),
                       " = ", total, " exceeds the model's context (max_position_embeddings = ",
                       config_.max_position_embeddings, ")"));
    }
    prl::v1::Prompt* q = out->mutable_prompts(i);
    q->mutable_tokens()->mutable_ids()->Assign(tokens.begin(), tokens.end());
  }
  return absl::OkStatus();
}

}  // namespace prl::coordinator
