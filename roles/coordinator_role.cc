#include "roles/coordinator_role.h"

#include <cstdio>
#include <memory>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "checkpoint/hf_model_dir.h"
#include "coordinator/coordinator_server.h"
#include "core/status_macros.h"
#include "metrics/prl_metrics.h"
#include "model/lora.h"
#include "reward/verifiers.h"
#include "roles/adapter_segments.h"
#include "roles/model_text.h"
#include "roles/role_metrics.h"
#include "roles/role_security.h"

namespace prl::roles {

namespace {

namespace v1 = prl::v1;

void UpdateMetrics(coordinator::Coordinator& coordinator, metrics::CoordinatorMetrics& m,
                   metrics::ProcessMetrics& process) {
  const coordinator::CoordinatorStats s = coordinator.Stats();
  int64_t active = 0;
  for (const v1::PromptSetStatus& set : coordinator.List()) {
    active += set.state() == v1::PROMPT_SET_STATE_RUNNING ? 1 : 0;
  }
  m.prompt_sets_active.Set(static_cast<double>(active));
  m.prompts_pending.Set(static_cast<double>(s.prompts_pending));
  m.prompts_in_flight.Set(static_cast<double>(s.prompts_in_flight));
  metrics::AdvanceCounterTo(m.prompts_done, static_cast<double>(s.prompts_done));
  metrics::AdvanceCounterTo(m.leases_expired, static_cast<double>(s.leases_expired));
  metrics::AdvanceCounterTo(m.leases_throttled, static_cast<double>(s.lease_requests_throttled));
  metrics::AdvanceCounterTo(m.leases_dropped, static_cast<double>(s.leases_dropped));
  metrics::AdvanceCounterTo(m.leases_released, static_cast<double>(s.leases_released));
  metrics::AdvanceCounterTo(m.prompts_failed, static_cast<double>(s.prompts_failed));
  metrics::AdvanceCounterTo(m.RequestsRejected("completion_not_lease_holder"),
                            static_cast<double>(s.rejected_completions));
  metrics::AdvanceCounterTo(m.RequestsRejected("progress_out_of_bounds"),
                            static_cast<double>(s.rejected_progress));
  metrics::AdvanceCounterTo(m.RequestsRejected("group_without_lease"),
                            static_cast<double>(s.rejected_groups));
  metrics::AdvanceCounterTo(m.RequestsRejected("release_not_lease_holder"),
                            static_cast<double>(s.rejected_releases));
  for (const auto& [actor, leased] : s.prompts_leased) {
    metrics::AdvanceCounterTo(m.PromptsLeased(actor), static_cast<double>(leased));
  }
  for (const auto& [set, counts] : s.set_throughput) {
    metrics::AdvanceCounterTo(m.PromptSetLeases(set), static_cast<double>(counts.leases));
    metrics::AdvanceCounterTo(m.PromptSetGroupsCompleted(set),
                              static_cast<double>(counts.groups_completed));
  }
  for (const auto& [set, series] : s.evals) {
    const metrics::CoordinatorMetrics::Eval e = m.EvalOf(set);
    e.mean_reward.Set(series.latest.mean_reward());
    e.pass_at_k.Set(series.latest.pass_at_k());
    e.version.Set(static_cast<double>(series.latest.version()));
    metrics::AdvanceCounterTo(e.rounds, static_cast<double>(series.rounds));
  }
  std::set<std::string> live;
  for (const auto& [name, counts] : s.adapters) {  // a run of adapters (docs/tenants.md)
    const metrics::CoordinatorMetrics::Adapter a = m.AdapterOf(name);
    a.version.Set(static_cast<double>(counts.version));
    a.groups_trained.Set(static_cast<double>(counts.groups_consumed));
    a.groups_unconsumed.Set(static_cast<double>(counts.groups_unconsumed));
    a.prompts_in_flight.Set(static_cast<double>(counts.prompts_in_flight));
    a.prompt_sets_running.Set(static_cast<double>(counts.prompt_sets_running));
    live.insert(name);
  }
  m.KeepAdapters(live);
  for (const auto& [tenant, counts] : s.tenants) {
    const metrics::CoordinatorMetrics::Tenant t = m.TenantOf(tenant);
    t.prompts_in_flight.Set(static_cast<double>(counts.prompts_in_flight));
    metrics::AdvanceCounterTo(t.groups_completed, static_cast<double>(counts.groups_completed));
    metrics::AdvanceCounterTo(t.samples, static_cast<double>(counts.samples_completed));
    t.groups_trained.Set(static_cast<double>(counts.groups_trained));
  }
  process.weight_version.Set(static_cast<double>(s.learner_version));
}

}  // namespace

absl::StatusOr<coordinator::CoordinatorConfig> CoordinatorConfigFrom(const config::RunConfig& c) {
  if (c.model.path.empty()) {
    return absl::InvalidArgumentError(
        "model.path is empty: the coordinator needs the model directory (its vocabulary and "
        "context bound the prompts); set model.path or pass --model");
  }
  PRL_ASSIGN_OR_RETURN(const ModelConfig model, ReadModelConfig(c.model.path));
  coordinator::CoordinatorConfig out;
  out.log_path = c.prompt_log();
  out.lease_ms = c.coordinator.lease_ms;
  out.heartbeat_ms = c.coordinator.heartbeat_ms;
  out.max_attempts = c.coordinator.max_attempts;
  out.max_stale_reruns = c.coordinator.max_stale_reruns;
  out.max_pending_prompts = c.coordinator.max_pending_prompts;
  out.max_samples_per_prompt = c.coordinator.max_samples_per_prompt;
  out.max_prompts_per_set = c.coordinator.max_prompts_per_set;
  out.max_actors = c.coordinator.max_actors;
  out.reward_addresses = c.coordinator.reward_addresses;
  out.env_addresses = c.coordinator.env_addresses;
  out.max_env_timeout_s = c.coordinator.max_env_timeout_s;
  out.agent_addresses = c.coordinator.agent_addresses;
  out.max_agent_timeout_s = c.coordinator.max_agent_timeout_s;
  out.eval_max_actor_share = c.coordinator.eval_max_actor_share;
  out.compact_log_bytes = c.coordinator.compact_log_mb << 20;
  out.retention_s = c.coordinator.retention_s;
  out.max_lag = c.learner.max_lag;
  out.groups_per_step = c.learner.groups_per_step;
  out.sync = c.run.mode == config::RunMode::kSync;
  out.vocab_size = model.vocab_size;
  out.max_position_embeddings = model.max_position_embeddings;
  absl::StatusOr<std::shared_ptr<const tokenizer::TextCodec>> text =
      OpenModelText(c, c.model.path, model.vocab_size);
  if (text.ok()) {
    out.text = std::move(*text);
  } else if (!absl::IsNotFound(text.status())) {
    return text.status();
  }
  // A run of adapters (docs/tenants.md): new adapters from learner.lora_*, checked against the
  // model; the tenants' limits (their names: security.tenant_token_files').
  out.adapters = c.coordinator.adapters;
  out.learner_ranks = c.learner.world_size;
  out.max_adapters = c.coordinator.max_adapters;
  out.max_adapter_rank = c.coordinator.max_adapter_rank;
  out.adapter_defaults.set_rank(static_cast<int32_t>(c.learner.lora_rank));
  out.adapter_defaults.set_alpha(c.learner.lora_alpha);
  out.adapter_defaults.set_rslora(c.learner.lora_rslora);
  for (absl::string_view t : absl::StrSplit(c.learner.lora_targets, ',', absl::SkipEmpty())) {
    out.adapter_defaults.add_target_modules(std::string(absl::StripAsciiWhitespace(t)));
  }
  out.adapter_defaults.set_learning_rate(c.learner.lr);
  out.validate_adapter = [model](const v1::AdapterSpec& spec) {
    return ValidateLoraConfig(LoraConfigOf(spec), model);
  };
  if (!c.coordinator.tenants_file.empty()) {
    PRL_ASSIGN_OR_RETURN(out.tenants, coordinator::ReadTenantsFile(c.coordinator.tenants_file));
    for (const auto& [tenant, file] : c.security.tenant_token_files) {
      if (out.tenants.count(tenant) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "security.tenant_token_files['", tenant, "']: the tenant has no limits in ",
            "coordinator.tenants_file '", c.coordinator.tenants_file, "'"));
      }
    }
  }
  out.validate_reward = [](const v1::RewardSpec& spec) {
    reward::RewardSpec parsed;
    parsed.name = spec.name();
    for (const auto& [k, v] : spec.params()) parsed.params[k] = v;
    return reward::MakeRewardFunction(parsed).status();  // validates; the actor builds its own
  };
  return out;
}

absl::Status RunCoordinatorRole(const config::RunConfig& config, const std::atomic<bool>& stop) {
  PRL_RETURN_IF_ERROR(ConfigureRoleSecurity(
      config, std::nullopt, {rpc::Role::kClient, rpc::Role::kActor, rpc::Role::kLearner}));
  PRL_ASSIGN_OR_RETURN(const coordinator::CoordinatorConfig settings,
                       CoordinatorConfigFrom(config));
  // The endpoint first: /healthz answers while a long log replays; /readyz once it serves.
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<RoleMetrics> endpoint, StartRoleMetrics(config.metrics));
  PRL_ASSIGN_OR_RETURN(auto coordinator, coordinator::Coordinator::Open(settings));
  const coordinator::CoordinatorStats stats = coordinator->Stats();
  PRL_ASSIGN_OR_RETURN_IN(
      auto server,
      coordinator::CoordinatorServer::Start(coordinator.get(), config.coordinator.listen,
                                            config.coordinator.max_watch_streams),
      "coordinator.listen");
  metrics::ProcessMetrics process(*endpoint->registry, metrics::Role::kCoordinator);
  metrics::CoordinatorMetrics m(*endpoint->registry);
  endpoint->SetReadiness([] { return absl::OkStatus(); });
  std::printf(
      "coordinator on port %d%s: %lld prompt sets in %s (%lld prompts pending)%s; leases of "
      "%lld ms renewed every %lld ms, budget (%lld + 1) x %lld groups%s; text: %s\n",
      server->port(), endpoint->Describe().c_str(), static_cast<long long>(stats.prompt_sets),
      settings.log_path.c_str(), static_cast<long long>(stats.prompts_pending),
      stats.torn_log_bytes > 0
          ? absl::StrCat(", cut a torn tail of ", stats.torn_log_bytes, " bytes").c_str()
          : "",
      static_cast<long long>(settings.lease_ms), static_cast<long long>(settings.heartbeat_ms),
      static_cast<long long>(settings.max_lag), static_cast<long long>(settings.groups_per_step),
      settings.sync ? ", sync mode" : "",
      settings.text != nullptr ? settings.text->Describe().c_str() : "token prompts only");
  std::fflush(stdout);
  for (int tick = 0; !stop; ++tick) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (tick % 10 == 0) UpdateMetrics(*coordinator, m, process);
  }
  endpoint->SetReadiness(nullptr);
  server->Shutdown();
  return absl::OkStatus();
}

}  // namespace prl::roles
