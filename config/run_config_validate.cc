// ValidateRunConfig: ranges and cross-field rules of the run config, a function per section.
// Types and enumeration spellings are checked while reading (run_config.cc); what a role can
// only know on its machine (is a GPU present?) is checked when the role starts
// (roles/device_settings.h).
#include <cmath>
#include <set>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "config/run_config.h"
#include "core/adapter_names.h"
#include "core/status_macros.h"
#include "env/builtin_names.h"

namespace prl::config {

namespace {

template <typename T>
absl::Status Range(bool ok, absl::string_view field, absl::string_view expected, const T& found) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", expected, ", found ", found));
}

std::string Quoted(const std::string& s) { return "'" + s + "'"; }

// host:port with a port in [0, 65535] (0: any free port) and a non-empty host.
absl::Status Address(const std::string& value, absl::string_view field, bool may_be_empty) {
  if (value.empty() && may_be_empty) return absl::OkStatus();
  const size_t colon = value.rfind(':');
  int port = -1;
  const bool ok = colon != std::string::npos && colon > 0 &&
                  absl::SimpleAtoi(value.substr(colon + 1), &port) && port >= 0 && port <= 65535;
  return Range(ok, field, "host:port with a port from 0 to 65535", Quoted(value));
}

// bf16 needs the CUDA backend.
absl::Status DeviceAndDType(DeviceType device, DType dtype, absl::string_view section) {
  const bool ok = dtype == DType::kF32 || device == DeviceType::kCuda;
  return Range(
      ok, absl::StrCat(section, ".dtype"),
      absl::StrCat("fp32 on the CPU (bf16 runs on CUDA only: set ", section, ".device = cuda)"),
      "'bf16'");
}

// task.name = guess_number: the range in env.params (integers, low <= high) and enough turns
// for bisection, which the warm-start demonstrates, to find every secret.
absl::Status ValidateGuessNumber(const RunConfig& c) {
  int64_t bound[2] = {1, 100};
  const char* keys[2] = {"low", "high"};
  for (int i = 0; i < 2; ++i) {
    auto it = c.env.params.find(keys[i]);
    if (it != c.env.params.end() && !absl::SimpleAtoi(it->second, &bound[i])) {
      return Range(false, absl::StrCat("env.params.", keys[i]), "an integer", Quoted(it->second));
    }
  }
  PRL_RETURN_IF_ERROR(Range(
      bound[0] <= bound[1] && bound[1] - bound[0] < (int64_t{1} << 30), "env.params.high",
      absl::StrCat("an integer from env.params.low (", bound[0], ") to low + 2^30"), bound[1]));
  int64_t needed = 1;  // guesses bisection needs: 2^needed - 1 >= the range's size
  while ((int64_t{1} << needed) - 1 < bound[1] - bound[0] + 1) ++needed;
  const int64_t turns = c.env.max_turns > 0 ? c.env.max_turns : 8;
  return Range(turns >= needed, "env.max_turns",
               absl::StrCat("at least ", needed, " (bisection's guesses over ", bound[0], "..",
                            bound[1], ") with task.name = guess_number"),
               turns);
}

absl::Status ValidateRunAndTask(const RunConfig& c) {
  PRL_RETURN_IF_ERROR(Range(!c.run.name.empty() && c.run.name.find('/') == std::string::npos,
                            "run.name", "a non-empty name without '/'", Quoted(c.run.name)));
  PRL_RETURN_IF_ERROR(Range(ParseUmask(c.run.umask) >= 0, "run.umask",
                            "1 to 4 octal digits of at most 0777, e.g. 077", Quoted(c.run.umask)));
  PRL_RETURN_IF_ERROR(Range(!c.model.path.empty() || !c.model.preset.empty(), "model.preset",
                            "a preset name when model.path is empty", "''"));
  PRL_RETURN_IF_ERROR(Range(c.model.max_position_embeddings >= 8, "model.max_position_embeddings",
                            ">= 8", c.model.max_position_embeddings));
  PRL_RETURN_IF_ERROR(Range(c.task.eval_prompts >= 1 && c.task.eval_prompts <= 100000,
                            "task.eval_prompts", "1 to 100000", c.task.eval_prompts));
  PRL_RETURN_IF_ERROR(Range(c.task.samples_per_prompt >= 2 && c.task.samples_per_prompt <= 1024,
                            "task.samples_per_prompt",
                            "2 to 1024 (group-normalised advantages need two samples)",
                            c.task.samples_per_prompt));
  PRL_RETURN_IF_ERROR(Range(c.task.max_tokens >= 1, "task.max_tokens", ">= 1", c.task.max_tokens));
  PRL_RETURN_IF_ERROR(Range(c.task.temperature > 0 && c.task.temperature <= 10, "task.temperature",
                            "a number in (0, 10]", c.task.temperature));
  PRL_RETURN_IF_ERROR(Range(c.task.top_p > 0 && c.task.top_p <= 1, "task.top_p",
                            "a number in (0, 1]", c.task.top_p));
  PRL_RETURN_IF_ERROR(Range(c.sft.steps >= 0, "sft.steps", ">= 0", c.sft.steps));
  PRL_RETURN_IF_ERROR(Range(c.sft.lr > 0, "sft.lr", "a number > 0", c.sft.lr));
  PRL_RETURN_IF_ERROR(Range(c.sft.env_demo_fraction >= 0 && c.sft.env_demo_fraction <= 1,
                            "sft.env_demo_fraction", "a number in [0, 1]",
                            c.sft.env_demo_fraction));
  PRL_RETURN_IF_ERROR(Range(c.eval.every_versions >= 0, "eval.every_versions", ">= 0 (0: none)",
                            c.eval.every_versions));
  PRL_RETURN_IF_ERROR(Range(c.eval.prompts >= 1, "eval.prompts", ">= 1", c.eval.prompts));
  PRL_RETURN_IF_ERROR(Range(c.eval.samples >= 1, "eval.samples", ">= 1", c.eval.samples));
  PRL_RETURN_IF_ERROR(Range(std::isfinite(c.eval.pass_reward), "eval.pass_reward",
                            "a finite number", c.eval.pass_reward));
  PRL_RETURN_IF_ERROR(
      Range(!c.env.address.empty() || c.env.name.empty() || env::IsBuiltinEnvironment(c.env.name),
            "env.name",
            absl::StrCat("a built-in environment (", env::DescribeBuiltinEnvironments(),
                         ") or an env.address"),
            Quoted(c.env.name)));
  PRL_RETURN_IF_ERROR(Range(c.task.name != TaskName::kGuessNumber ||
                                (c.env.name == "guess_number" && c.env.address.empty()),
                            "env.name", "guess_number (built in) for task.name = guess_number",
                            Quoted(c.env.name)));
  // The arithmetic task's references are answers, not secrets of the game's range.
  PRL_RETURN_IF_ERROR(Range(c.task.name != TaskName::kArithmetic || c.env.name != "guess_number" ||
                                !c.env.address.empty(),
                            "env.name",
                            "calculator (or none) for task.name = arithmetic; guess_number goes "
                            "with task.name = guess_number",
                            Quoted(c.env.name)));
  if (c.task.name == TaskName::kGuessNumber) PRL_RETURN_IF_ERROR(ValidateGuessNumber(c));
  PRL_RETURN_IF_ERROR(Range(c.env.address.empty() || !c.env.name.empty(), "env.name",
                            "the name of the environment env.address serves", "''"));
  PRL_RETURN_IF_ERROR(Address(c.env.address, "env.address", true));
  PRL_RETURN_IF_ERROR(Range(c.env.tool_call_format.empty() || c.env.tool_call_format == "hermes" ||
                                c.env.tool_call_format == "llama3_json" ||
                                c.env.tool_call_format == "none",
                            "env.tool_call_format",
                            "\"\" (from the chat template), hermes, llama3_json or none",
                            Quoted(c.env.tool_call_format)));
  PRL_RETURN_IF_ERROR(Range(c.env.max_turns >= 0 && c.env.max_turns <= 1024, "env.max_turns",
                            "0 (8) to 1024", c.env.max_turns));
  PRL_RETURN_IF_ERROR(
      Range(c.env.max_tokens_per_turn >= 0 && c.env.max_tokens_per_turn <= c.task.max_tokens,
            "env.max_tokens_per_turn",
            absl::StrCat("0 (task.max_tokens) to task.max_tokens (", c.task.max_tokens, ")"),
            c.env.max_tokens_per_turn));
  const int32_t turn_tokens =
      c.env.max_tokens_per_turn > 0 ? c.env.max_tokens_per_turn : c.task.max_tokens;
  PRL_RETURN_IF_ERROR(
      Range(c.env.max_episode_tokens == 0 || c.env.max_episode_tokens >= turn_tokens,
            "env.max_episode_tokens",
            absl::StrCat("0 (no limit) or at least a turn's tokens (", turn_tokens,
                         ": env.max_tokens_per_turn, else "
                         "task.max_tokens)"),
            c.env.max_episode_tokens));
  PRL_RETURN_IF_ERROR(Range(
      c.env.timeout_s >= 0 && c.env.timeout_s <= c.coordinator.max_env_timeout_s, "env.timeout_s",
      absl::StrCat("0 (30) to coordinator.max_env_timeout_s (", c.coordinator.max_env_timeout_s,
                   ")"),
      c.env.timeout_s));
  return Range(c.sft.examples_per_step >= 1, "sft.examples_per_step", ">= 1",
               c.sft.examples_per_step);
}

absl::Status ValidateAgent(const RunConfig& c) {
  const AgentSection& a = c.agent;
  if (a.address.empty()) {
    return Range(a.name.empty() && a.params.empty(), "agent.address",
                 "the AgentService's host:port when agent.name or agent.params is set", "''");
  }
  PRL_RETURN_IF_ERROR(Address(a.address, "agent.address", false));
  PRL_RETURN_IF_ERROR(Range(c.env.address.empty(), "env.address",
                            "empty with an agent (a built-in env.name beside agent.address only "
                            "demonstrates the warm-start)",
                            Quoted(c.env.address)));
  PRL_RETURN_IF_ERROR(Range(a.max_calls >= 0 && a.max_calls <= 1024, "agent.max_calls",
                            "0 (16) to 1024", a.max_calls));
  PRL_RETURN_IF_ERROR(
      Range(a.max_tokens_per_call >= 0 && a.max_tokens_per_call <= c.task.max_tokens,
            "agent.max_tokens_per_call",
            absl::StrCat("0 (task.max_tokens) to task.max_tokens (", c.task.max_tokens, ")"),
            a.max_tokens_per_call));
  const int32_t call_tokens = a.max_tokens_per_call > 0 ? a.max_tokens_per_call : c.task.max_tokens;
  PRL_RETURN_IF_ERROR(Range(a.max_episode_tokens == 0 || a.max_episode_tokens >= call_tokens,
                            "agent.max_episode_tokens",
                            absl::StrCat("0 (no limit) or at least a call's tokens (", call_tokens,
                                         ")"),
                            a.max_episode_tokens));
  PRL_RETURN_IF_ERROR(Range(
      a.timeout_s >= 0 && a.timeout_s <= c.coordinator.max_agent_timeout_s, "agent.timeout_s",
      absl::StrCat("0 (300) to coordinator.max_agent_timeout_s (",
                   c.coordinator.max_agent_timeout_s, ")"),
      a.timeout_s));
  return Range(a.tool_call_format.empty() || a.tool_call_format == "hermes" ||
                   a.tool_call_format == "llama3_json" || a.tool_call_format == "none",
               "agent.tool_call_format", "\"\" (from the chat template), hermes, llama3_json or none",
               Quoted(a.tool_call_format));
}

absl::Status ValidateCoordinator(const CoordinatorSection& c) {
  PRL_RETURN_IF_ERROR(Address(c.listen, "coordinator.listen", false));
  PRL_RETURN_IF_ERROR(Address(c.address, "coordinator.address", true));
  PRL_RETURN_IF_ERROR(Range(c.lease_ms >= 100, "coordinator.lease_ms", ">= 100", c.lease_ms));
  PRL_RETURN_IF_ERROR(Range(c.heartbeat_ms >= 10 && c.heartbeat_ms < c.lease_ms,
                            "coordinator.heartbeat_ms", ">= 10 and below coordinator.lease_ms",
                            c.heartbeat_ms));
  PRL_RETURN_IF_ERROR(Range(c.max_attempts >= 1 && c.max_attempts <= 1000,
                            "coordinator.max_attempts", "1 to 1000", c.max_attempts));
  PRL_RETURN_IF_ERROR(Range(c.max_stale_reruns >= 1 && c.max_stale_reruns <= 1000,
                            "coordinator.max_stale_reruns", "1 to 1000", c.max_stale_reruns));
  PRL_RETURN_IF_ERROR(Range(c.max_pending_prompts >= 1, "coordinator.max_pending_prompts", ">= 1",
                            c.max_pending_prompts));
  PRL_RETURN_IF_ERROR(Range(c.max_actors >= 1, "coordinator.max_actors", ">= 1", c.max_actors));
  PRL_RETURN_IF_ERROR(
      Range(c.max_restarts >= 0, "coordinator.max_restarts", ">= 0", c.max_restarts));
  PRL_RETURN_IF_ERROR(Range(c.compact_log_mb >= 1 && c.compact_log_mb <= (int64_t{1} << 20),
                            "coordinator.compact_log_mb", "1 to 1048576", c.compact_log_mb));
  PRL_RETURN_IF_ERROR(Range(c.retention_s >= 0, "coordinator.retention_s", ">= 0", c.retention_s));
  PRL_RETURN_IF_ERROR(Range(c.max_prompts_per_set >= 1 && c.max_prompts_per_set <= 10'000'000,
                            "coordinator.max_prompts_per_set", "1 to 10000000",
                            c.max_prompts_per_set));
  PRL_RETURN_IF_ERROR(Range(c.max_watch_streams >= 1 && c.max_watch_streams <= 100'000,
                            "coordinator.max_watch_streams", "1 to 100000", c.max_watch_streams));
  PRL_RETURN_IF_ERROR(Range(c.max_env_timeout_s >= 1 && c.max_env_timeout_s <= 3600,
                            "coordinator.max_env_timeout_s", "1 to 3600", c.max_env_timeout_s));
  PRL_RETURN_IF_ERROR(Range(c.max_agent_timeout_s >= 1 && c.max_agent_timeout_s <= 86400,
                            "coordinator.max_agent_timeout_s", "1 to 86400",
                            c.max_agent_timeout_s));
  PRL_RETURN_IF_ERROR(Range(c.eval_max_actor_share > 0 && c.eval_max_actor_share <= 1,
                            "coordinator.eval_max_actor_share", "a number in (0, 1]",
                            c.eval_max_actor_share));
  PRL_RETURN_IF_ERROR(Range(c.max_adapters >= 1 && c.max_adapters <= 100'000,
                            "coordinator.max_adapters", "1 to 100000", c.max_adapters));
  PRL_RETURN_IF_ERROR(Range(c.max_adapter_rank >= 1 && c.max_adapter_rank <= 1024,
                            "coordinator.max_adapter_rank", "1 to 1024", c.max_adapter_rank));
  for (size_t i = 0; i < c.agent_addresses.size(); ++i) {
    PRL_RETURN_IF_ERROR(Address(c.agent_addresses[i],
                                absl::StrCat("coordinator.agent_addresses[", i, "]"), false));
  }
  for (size_t i = 0; i < c.reward_addresses.size(); ++i) {
    PRL_RETURN_IF_ERROR(Address(c.reward_addresses[i],
                                absl::StrCat("coordinator.reward_addresses[", i, "]"), false));
  }
  for (size_t i = 0; i < c.env_addresses.size(); ++i) {
    PRL_RETURN_IF_ERROR(
        Address(c.env_addresses[i], absl::StrCat("coordinator.env_addresses[", i, "]"), false));
  }
  return Range(c.max_samples_per_prompt >= 1 && c.max_samples_per_prompt <= 65536,
               "coordinator.max_samples_per_prompt", "1 to 65536", c.max_samples_per_prompt);
}

absl::Status ValidateActors(const ActorsSection& a) {
  PRL_RETURN_IF_ERROR(Range(a.count >= 1 && a.count <= 64, "actors.count", "1 to 64", a.count));
  PRL_RETURN_IF_ERROR(DeviceAndDType(a.device, a.dtype, "actors"));
  PRL_RETURN_IF_ERROR(Range(a.gpu_memory_fraction > 0 && a.gpu_memory_fraction < 1,
                            "actors.gpu_memory_fraction", "a number in (0, 1)",
                            a.gpu_memory_fraction));
  PRL_RETURN_IF_ERROR(Range(a.kv_cache_mb >= 1, "actors.kv_cache_mb", ">= 1", a.kv_cache_mb));
  PRL_RETURN_IF_ERROR(Range(a.block_size >= 1 && a.block_size <= 1024, "actors.block_size",
                            "1 to 1024", a.block_size));
  PRL_RETURN_IF_ERROR(Range(a.max_num_seqs >= 1, "actors.max_num_seqs", ">= 1", a.max_num_seqs));
  PRL_RETURN_IF_ERROR(Range(a.max_num_batched_tokens >= 1, "actors.max_num_batched_tokens", ">= 1",
                            a.max_num_batched_tokens));
  PRL_RETURN_IF_ERROR(Range(a.max_prompts_in_flight >= 1, "actors.max_prompts_in_flight", ">= 1",
                            a.max_prompts_in_flight));
  PRL_RETURN_IF_ERROR(Range(a.env_calls_per_address >= 1 && a.env_calls_per_address <= 1024,
                            "actors.env_calls_per_address", "1 to 1024", a.env_calls_per_address));
  PRL_RETURN_IF_ERROR(Range(a.env_outage_s >= 0 && a.env_outage_s <= 86400, "actors.env_outage_s",
                            "0 to 86400", a.env_outage_s));
  PRL_RETURN_IF_ERROR(Address(a.openai_listen, "actors.openai_listen", false));
  PRL_RETURN_IF_ERROR(Address(a.openai_address, "actors.openai_address", true));
  PRL_RETURN_IF_ERROR(Range(a.openai_max_connections >= 1 && a.openai_max_connections <= 65536,
                            "actors.openai_max_connections", "1 to 65536",
                            a.openai_max_connections));
  PRL_RETURN_IF_ERROR(Range(a.agent_episodes_per_address >= 1 &&
                                a.agent_episodes_per_address <= 65536,
                            "actors.agent_episodes_per_address", "1 to 65536",
                            a.agent_episodes_per_address));
  PRL_RETURN_IF_ERROR(
      Range(a.replay_timeout_s > 0, "actors.replay_timeout_s", "a number > 0", a.replay_timeout_s));
  return Range(a.max_restarts >= 0, "actors.max_restarts", ">= 0", a.max_restarts);
}

absl::Status ValidateLearnerOptimisation(const LearnerSection& l) {
  PRL_RETURN_IF_ERROR(Range(l.lr > 0, "learner.lr", "a number > 0", l.lr));
  PRL_RETURN_IF_ERROR(
      Range(l.weight_decay >= 0, "learner.weight_decay", "a number >= 0", l.weight_decay));
  PRL_RETURN_IF_ERROR(
      Range(l.beta1 >= 0 && l.beta1 < 1, "learner.beta1", "a number in [0, 1)", l.beta1));
  PRL_RETURN_IF_ERROR(
      Range(l.beta2 >= 0 && l.beta2 < 1, "learner.beta2", "a number in [0, 1)", l.beta2));
  PRL_RETURN_IF_ERROR(
      Range(l.max_grad_norm >= 0, "learner.max_grad_norm", ">= 0", l.max_grad_norm));
  PRL_RETURN_IF_ERROR(Range(l.tis_cap > 0, "learner.tis_cap", "a number > 0", l.tis_cap));
  PRL_RETURN_IF_ERROR(Range(l.router_aux_loss_coef >= 0 && std::isfinite(l.router_aux_loss_coef),
                            "learner.router_aux_loss_coef", "a number >= 0 (0: off)",
                            l.router_aux_loss_coef));
  PRL_RETURN_IF_ERROR(Range(l.kl_coef >= 0 && std::isfinite(l.kl_coef), "learner.kl_coef",
                            "a number >= 0 (0: off)", l.kl_coef));
  PRL_RETURN_IF_ERROR(Range(l.kl_reference.empty() || l.kl_coef > 0, "learner.kl_reference",
                            "empty while learner.kl_coef is 0 (no reference is used)",
                            l.kl_reference));
  PRL_RETURN_IF_ERROR(Range(l.lora_rank >= 0 && l.lora_rank <= 1024, "learner.lora_rank",
                            "0 (no LoRA) to 1024", l.lora_rank));
  PRL_RETURN_IF_ERROR(Range(l.lora_init.empty() || l.lora_rank == 0, "learner.lora_rank",
                            "0 with learner.lora_init (the adapter's adapter_config.json sets "
                            "r, lora_alpha and target_modules)",
                            l.lora_rank));
  PRL_RETURN_IF_ERROR(Range(l.lora_alpha > 0 && std::isfinite(l.lora_alpha), "learner.lora_alpha",
                            "a number > 0", l.lora_alpha));
  PRL_RETURN_IF_ERROR(Range(!l.lora() || l.device == DeviceType::kCpu || l.cuda_lora,
                            "learner.device",
                            "cpu with LoRA (learner.lora_rank or lora_init), or cuda with "
                            "learner.cuda_lora (written, not yet verified on a GPU)",
                            std::string(EnumName(kDeviceTypeNames, l.device))));
  PRL_RETURN_IF_ERROR(Range(l.clip_low > 0 && l.clip_low <= 1, "learner.clip_low",
                            "a number in (0, 1]", l.clip_low));
  return Range(l.clip_high > 0, "learner.clip_high", "a number > 0", l.clip_high);
}

absl::Status ValidateLearner(const LearnerSection& l) {
  PRL_RETURN_IF_ERROR(Range(l.keep_logits_mb >= 0 && l.keep_logits_mb <= (int64_t{1} << 20),
                            "learner.keep_logits_mb", "0 to 1048576 (MiB)", l.keep_logits_mb));
  PRL_RETURN_IF_ERROR(Range(l.world_size >= 1 && l.world_size <= 64, "learner.world_size",
                            "1 to 64", l.world_size));
  PRL_RETURN_IF_ERROR(DeviceAndDType(l.device, l.dtype, "learner"));
  PRL_RETURN_IF_ERROR(Range(l.steps >= 0, "learner.steps", ">= 0 (0: until stopped)", l.steps));
  PRL_RETURN_IF_ERROR(
      Range(l.groups_per_step >= 1, "learner.groups_per_step", ">= 1", l.groups_per_step));
  PRL_RETURN_IF_ERROR(ValidateLearnerOptimisation(l));
  PRL_RETURN_IF_ERROR(Range(l.max_lag >= 0, "learner.max_lag", ">= 0", l.max_lag));
  PRL_RETURN_IF_ERROR(Range(l.micro_batch_tokens >= 16, "learner.micro_batch_tokens", ">= 16",
                            l.micro_batch_tokens));
  PRL_RETURN_IF_ERROR(Range(l.adapter_pass_tokens >= 0, "learner.adapter_pass_tokens",
                            ">= 0 (0: each adapter its own passes)", l.adapter_pass_tokens));
  PRL_RETURN_IF_ERROR(Range(l.context_parallel >= 1 && l.world_size % l.context_parallel == 0,
                            "learner.context_parallel",
                            absl::StrCat("a divisor of learner.world_size = ", l.world_size),
                            l.context_parallel));
  PRL_RETURN_IF_ERROR(Range(l.context_parallel == 1 ||
                                (l.device == DeviceType::kCpu && l.dtype == DType::kF32) ||
                                (l.device == DeviceType::kCuda && l.cuda_context_parallel &&
                                 l.context_parallel_attention == ContextAttention::kUlysses),
                            "learner.context_parallel",
                            "1 with learner.device = cuda or dtype bf16, unless "
                            "learner.cuda_context_parallel with learner.context_parallel_attention "
                            "= ulysses (written, not yet verified on a GPU)",
                            l.context_parallel));
  PRL_RETURN_IF_ERROR(Range(l.activation_budget_mb >= 0 && l.activation_budget_mb <= (int64_t{1} << 30),
                            "learner.activation_budget_mb", "0 to 1073741824 (MiB; 0: no budget)",
                            l.activation_budget_mb));
  PRL_RETURN_IF_ERROR(
      Range(l.checkpoint_every >= 1, "learner.checkpoint_every", ">= 1", l.checkpoint_every));
  PRL_RETURN_IF_ERROR(
      Range(l.keep_checkpoints >= 1, "learner.keep_checkpoints", ">= 1", l.keep_checkpoints));
  PRL_RETURN_IF_ERROR(Range(l.timeout_s > 0, "learner.timeout_s", "a number > 0", l.timeout_s));
  return Range(l.max_restarts >= 0, "learner.max_restarts", ">= 0", l.max_restarts);
}

// cuda_ipc maps the learner's device memory into the actors; nccl broadcasts from the
// learner's device into the actors' (NCCL on GPUs, Gloo when both are on the CPU).
absl::Status ValidateTransport(const RunConfig& c) {
  const WeightTransport t = c.broadcast.transport;
  if (t == WeightTransport::kCudaIpc &&
      (c.learner.device != DeviceType::kCuda || c.actors.device != DeviceType::kCuda)) {
    return absl::InvalidArgumentError(
        "broadcast.transport: cuda_ipc needs learner.device = cuda and actors.device = cuda; "
        "use shm on the CPU");
  }
  if (t == WeightTransport::kNccl && c.learner.device != c.actors.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "broadcast.transport: nccl needs the learner and the actors on the same kind of device, "
        "found learner.device = ",
        EnumName(kDeviceTypeNames, c.learner.device), " and actors.device = ",
        EnumName(kDeviceTypeNames, c.actors.device), "; use grpc between a CPU and a GPU"));
  }
  return absl::OkStatus();
}

absl::Status ValidateServices(const RunConfig& c) {
  PRL_RETURN_IF_ERROR(ValidateTransport(c));
  const ReplaySection& r = c.replay;
  PRL_RETURN_IF_ERROR(Range(r.capacity_mb >= 1, "replay.capacity_mb", ">= 1", r.capacity_mb));
  PRL_RETURN_IF_ERROR(Range(r.adapter_capacity_mb >= 0, "replay.adapter_capacity_mb",
                            ">= 0 (0: sized from the lag budget)", r.adapter_capacity_mb));
  PRL_RETURN_IF_ERROR(Range(r.lease_ms >= 100, "replay.lease_ms", ">= 100", r.lease_ms));
  PRL_RETURN_IF_ERROR(Address(r.listen, "replay.listen", false));
  PRL_RETURN_IF_ERROR(Address(r.address, "replay.address", true));
  PRL_RETURN_IF_ERROR(
      Range(r.max_message_mb >= 1, "replay.max_message_mb", ">= 1", r.max_message_mb));
  PRL_RETURN_IF_ERROR(
      Range(r.write_timeout_ms >= 1, "replay.write_timeout_ms", ">= 1", r.write_timeout_ms));
  PRL_RETURN_IF_ERROR(Address(c.broadcast.listen, "broadcast.listen", false));
  PRL_RETURN_IF_ERROR(Address(c.broadcast.address, "broadcast.address", true));
  PRL_RETURN_IF_ERROR(Range(c.broadcast.timeout_s > 0, "broadcast.timeout_s", "a number > 0",
                            c.broadcast.timeout_s));
  PRL_RETURN_IF_ERROR(Address(c.reward.listen, "reward.listen", false));
  PRL_RETURN_IF_ERROR(Range(c.reward.max_message_mb >= 1, "reward.max_message_mb", ">= 1",
                            c.reward.max_message_mb));
  PRL_RETURN_IF_ERROR(Range(c.security.cert_refresh_s >= 1 && c.security.cert_refresh_s <= 3600,
                            "security.cert_refresh_s", "1 to 3600", c.security.cert_refresh_s));
  PRL_RETURN_IF_ERROR(Address(c.metrics.listen, "metrics.listen", false));
  return Range(c.metrics.base_port >= 0 && c.metrics.base_port < 65000, "metrics.base_port",
               "0 (free ports) or a port below 65000", c.metrics.base_port);
}

}  // namespace

int ParseUmask(const std::string& text) {
  if (text.empty() || text.size() > 4) return -1;
  int value = 0;
  for (char ch : text) {
    if (ch < '0' || ch > '7') return -1;
    value = value * 8 + (ch - '0');
  }
  return value <= 0777 ? value : -1;
}

namespace {

// prl run's tenants: each its own adapter in a run of adapters, each task valid as the run's.
absl::Status ValidateTenants(const RunConfig& c) {
  if (c.tenants.empty()) return absl::OkStatus();
  PRL_RETURN_IF_ERROR(Range(c.coordinator.adapters, "coordinator.adapters",
                            "true with tenants (each tenant trains its own adapter)", "false"));
  PRL_RETURN_IF_ERROR(Range(
      static_cast<int64_t>(c.tenants.size()) <= c.coordinator.max_adapters, "tenants",
      absl::StrCat("at most coordinator.max_adapters (", c.coordinator.max_adapters, ") tenants"),
      c.tenants.size()));
  std::set<std::string> names;
  for (size_t i = 0; i < c.tenants.size(); ++i) {
    const TenantSection& t = c.tenants[i];
    const std::string where = absl::StrCat("tenants[", i, "]");
    PRL_RETURN_IF_ERROR(Range(IsAdapterName(t.name), where + ".name",
                              "1 to 64 characters of [a-z0-9._-] starting with a letter or digit "
                              "(its adapter's name)",
                              Quoted(t.name.substr(0, 80))));
    PRL_RETURN_IF_ERROR(Range(names.insert(t.name).second, where + ".name",
                              "a name no other tenant has", Quoted(t.name)));
    const auto& a = t.adapter;
    PRL_RETURN_IF_ERROR(Range(a.rank >= 0 && a.rank <= c.coordinator.max_adapter_rank,
                              where + ".adapter.rank",
                              absl::StrCat("0 (learner.lora_rank) to ",
                                           c.coordinator.max_adapter_rank,
                                           " (coordinator.max_adapter_rank)"),
                              a.rank));
    PRL_RETURN_IF_ERROR(Range(std::isfinite(a.alpha) && a.alpha >= 0, where + ".adapter.alpha",
                              "0 (learner.lora_alpha) or a finite number > 0", a.alpha));
    PRL_RETURN_IF_ERROR(
        Range(std::isfinite(a.learning_rate) && a.learning_rate >= 0 && a.learning_rate <= 1,
              where + ".adapter.learning_rate", "0 (learner.lr) or in (0, 1]", a.learning_rate));
    PRL_RETURN_IF_ERROR(
        Range(a.target_modules.size() <= kMaxAdapterTargets, where + ".adapter.target_modules",
              absl::StrCat("at most ", kMaxAdapterTargets, " names"), a.target_modules.size()));
    for (size_t m = 0; m < a.target_modules.size(); ++m) {
      PRL_RETURN_IF_ERROR(Range(IsAdapterTarget(a.target_modules[m]),
                                absl::StrCat(where, ".adapter.target_modules[", m, "]"),
                                absl::StrCat("one of ", absl::StrJoin(kAdapterTargets, ", ")),
                                Quoted(a.target_modules[m].substr(0, 64))));
    }
    const absl::Status task = ValidateRunConfig(c.ForTenant(t));
    if (!task.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " ('", t.name, "'): ", task.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRunConfig(const RunConfig& c) {
  PRL_RETURN_IF_ERROR(ValidateRunAndTask(c));
  PRL_RETURN_IF_ERROR(ValidateCoordinator(c.coordinator));
  PRL_RETURN_IF_ERROR(ValidateAgent(c));
  PRL_RETURN_IF_ERROR(ValidateActors(c.actors));
  // An actor's engine runs a prompt's samples in one batch: a larger group could never run.
  PRL_RETURN_IF_ERROR(Range(c.task.samples_per_prompt <= c.actors.max_num_seqs,
                            "task.samples_per_prompt",
                            absl::StrCat("at most actors.max_num_seqs (", c.actors.max_num_seqs,
                                         ": an actor's engine runs a prompt's samples together)"),
                            c.task.samples_per_prompt));
  PRL_RETURN_IF_ERROR(ValidateLearner(c.learner));
  // The actors run adapters with a LoRA learner and in a run of adapters.
  PRL_RETURN_IF_ERROR(Range(
      !(c.learner.lora() || c.coordinator.adapters) || c.actors.device == DeviceType::kCpu ||
          c.actors.cuda_lora,
      "actors.device",
      "cpu with LoRA adapters (learner.lora_rank, lora_init or coordinator.adapters), or cuda "
      "with actors.cuda_lora (written, not yet verified on a GPU)",
      std::string(EnumName(kDeviceTypeNames, c.actors.device))));
  // A run of adapters makes each adapter from learner.lora_* (a rank, not a starting adapter).
  PRL_RETURN_IF_ERROR(Range(!c.coordinator.adapters ||
                                (c.learner.lora_rank > 0 && c.learner.lora_init.empty()),
                            "learner.lora_rank",
                            "> 0 with coordinator.adapters (each new adapter's default rank; "
                            "learner.lora_init unset)",
                            c.learner.lora_rank));
  PRL_RETURN_IF_ERROR(Range(!c.coordinator.adapters ||
                                c.learner.lora_rank <= c.coordinator.max_adapter_rank,
                            "learner.lora_rank",
                            absl::StrCat("at most coordinator.max_adapter_rank (",
                                         c.coordinator.max_adapter_rank,
                                         ") with coordinator.adapters (each new adapter's "
                                         "default rank)"),
                            c.learner.lora_rank));
  // Each adapter's versions travel in a segment of its own on the learner's node or a channel
  // of its own on the learner's gRPC weight server (roles/adapter_segments.h).
  PRL_RETURN_IF_ERROR(Range(!c.coordinator.adapters ||
                                c.broadcast.transport == WeightTransport::kShm ||
                                c.broadcast.transport == WeightTransport::kGrpc,
                            "broadcast.transport",
                            "shm or grpc with coordinator.adapters (each adapter's versions in a "
                            "segment or a gRPC channel of its own; cuda_ipc and nccl carry one "
                            "model's)",
                            EnumName(kWeightTransportNames, c.broadcast.transport)));
  // "{rank}": an actor's address of the learner rank an adapter trains on (roles/
  // adapter_segments.h), which only a run of adapters places.
  const std::vector<std::pair<std::string, std::string>> rank_addresses = LearnerRankAddresses(c);
  for (const auto& [key, address] : rank_addresses) {
    PRL_RETURN_IF_ERROR(Range(c.coordinator.adapters, key,
                              "no {rank} without coordinator.adapters (it names the learner rank "
                              "an adapter is placed on)",
                              Quoted(address)));
  }
  // Several ranks each train their adapters (roles/adapter_learner.h): on the actors' node
  // (each adapter's segments where the actors open them), or each rank on a node of its own,
  // the actors reaching each adapter's rank's weight server and replay ingest through {rank}.
  const bool one_node = c.broadcast.transport == WeightTransport::kShm && c.replay.address.empty();
  const bool across_nodes =
      c.broadcast.transport == WeightTransport::kGrpc && rank_addresses.size() == 2;
  PRL_RETURN_IF_ERROR(Range(!c.coordinator.adapters || c.learner.world_size == 1 ||
                                ((one_node || across_nodes) && c.learner.context_parallel == 1),
                            "learner.world_size",
                            "1 with coordinator.adapters, unless the ranks train on the actors' "
                            "node (broadcast.transport shm, replay.address empty) or each on a "
                            "node of its own (broadcast.transport grpc, broadcast.address and "
                            "replay.address naming each rank's servers with {rank}, e.g. "
                            "'prl-learner-{rank}.prl-learner:50062'), with "
                            "learner.context_parallel 1",
                            c.learner.world_size));
  PRL_RETURN_IF_ERROR(Range(c.coordinator.tenants_file.empty() == c.security.tenant_token_files.empty(),
                            "coordinator.tenants_file",
                            "set exactly when security.tenant_token_files is (the tenants' limits "
                            "and their tokens)",
                            absl::StrCat("'", c.coordinator.tenants_file, "' with ",
                                         c.security.tenant_token_files.size(), " tenant tokens")));
  PRL_RETURN_IF_ERROR(ValidateTenants(c));
  return ValidateServices(c);
}

}  // namespace prl::config
