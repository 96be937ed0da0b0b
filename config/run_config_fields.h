// Every key of the run config once, as (section, key, member, help): the reader, the writer,
// the list of known keys and the --help texts of flag shorthands all walk VisitFields, so they
// cannot disagree. Internal to config/.
#pragma once

#include "absl/types/span.h"
#include "config/run_config.h"
#include "core/enum_names.h"

namespace prl::config::internal {

// An enumeration-valued field: written and read as one of its names.
template <typename E>
struct EnumField {
  E& value;
  absl::Span<const NamedValue<E>> names;
};
template <typename E, size_t N>
EnumField<E> Enum(E& value, const NamedValue<E> (&names)[N]) {
  return {value, absl::MakeConstSpan(names)};
}

template <typename Visitor>
void VisitRunFields(RunConfig& c, Visitor& v) {
  v("run", "name", c.run.name, "Run name: names the run directory and shared-memory segments");
  v("run", "dir", c.run.dir, "Run directory (empty: runs/<name>)");
  v("run", "mode", Enum(c.run.mode, kRunModeNames),
    "pipeline (in-flight weight swaps) or sync (generate a batch, then train)");
  v("run", "seed", c.run.seed, "Seed of prompts and sampling");
  v("run", "umask", c.run.umask,
    "File mode creation mask, octal (077: run data is 0600, directories 0700)");
  v("model", "path", c.model.path, "Hugging Face model directory (empty: created from preset)");
  v("model", "preset", c.model.preset, "Shape of a created model (tiny, 40m, qwen2.5-0.5b, ...)");
  v("model", "max_position_embeddings", c.model.max_position_embeddings,
    "Context of a created model (tokens)");
  v("model", "init_seed", c.model.init_seed, "Seed of a created model's random weights");
}

template <typename Visitor>
void VisitTaskFields(RunConfig& c, Visitor& v) {
  v("task", "name", Enum(c.task.name, kTaskNames),
    "arithmetic or guess_number (built-in), or prompts (train_file and eval_file)");
  v("task", "train_file", c.task.train_file,
    "prompts: JSONL of {\"text\" | \"messages\", \"reference\"} to train on");
  v("task", "eval_file", c.task.eval_file, "prompts: JSONL of held-out prompts (same format)");
  v("task", "min_digits", c.task.min_digits, "Fewest digits per operand");
  v("task", "max_digits", c.task.max_digits, "Most digits per operand");
  v("task", "operations", c.task.operations, "Operations drawn from, e.g. \"+-*\"");
  v("task", "eval_prompts", c.task.eval_prompts, "Held-out prompts of eval_before/eval_after");
  v("task", "samples_per_prompt", c.task.samples_per_prompt, "Samples per group");
  v("task", "max_tokens", c.task.max_tokens, "Completion length limit (tokens)");
  v("task", "temperature", c.task.temperature, "Sampling temperature");
  v("task", "top_p", c.task.top_p, "Nucleus sampling mass");
  v("task", "reward", c.task.reward,
    "Reward name (arithmetic, exact_match, numeric, regex, remote)");
  v("task", "reward_params", c.task.reward_params,
    "The reward's parameters, an object of strings (regex: pattern; remote: address)");
  v("task", "credit", Enum(c.task.credit, kArithmeticCreditNames),
    "Arithmetic reward: exact, or digits (partial credit per digit)");
  v("env", "name", c.env.name,
    "Agentic episodes: calculator, guess_number, or the environment at env.address (empty: "
    "none)");
  v("env", "address", c.env.address, "An EnvironmentService's host:port (empty: built in)");
  v("env", "params", c.env.params, "The environment's parameters, an object of strings");
  v("env", "max_turns", c.env.max_turns, "Model turns per episode (0: 8)");
  v("env", "max_tokens_per_turn", c.env.max_tokens_per_turn,
    "Tokens of one model turn (0: task.max_tokens)");
  v("env", "max_episode_tokens", c.env.max_episode_tokens,
    "Completion tokens of an episode, model and environment (0: no limit)");
  v("env", "timeout_s", c.env.timeout_s, "One environment call's budget, retries included (0: 30)");
  v("env", "tool_call_format", c.env.tool_call_format,
    "How the model writes tool calls: hermes, llama3_json, none; empty: from the chat template");
  v("agent", "name", c.agent.name, "Agents: the name passed to the agent's RunEpisode");
  v("agent", "address", c.agent.address,
    "Agents: an AgentService's host:port; the agent runs every episode (empty: none)");
  v("agent", "params", c.agent.params, "The agent's parameters, an object of strings");
  v("agent", "max_calls", c.agent.max_calls, "Endpoint calls per agent episode (0: 16)");
  v("agent", "max_tokens_per_call", c.agent.max_tokens_per_call,
    "Tokens of one call's answer (0: task.max_tokens)");
  v("agent", "max_episode_tokens", c.agent.max_episode_tokens,
    "Tokens of an agent's episode after its first prompt (0: no limit but the context)");
  v("agent", "timeout_s", c.agent.timeout_s, "An agent episode's wall time (0: 300)");
  v("agent", "tool_call_format", c.agent.tool_call_format,
    "How the model writes tool calls: hermes, llama3_json, none; empty: from the chat template");
  v("sft", "steps", c.sft.steps, "Supervised warm-start steps (0: none)");
  v("sft", "lr", c.sft.lr, "Warm-start learning rate");
  v("sft", "examples_per_step", c.sft.examples_per_step, "Warm-start examples per step");
  v("sft", "env_demo_fraction", c.sft.env_demo_fraction,
    "Built-in environments: share of warm-start examples that demonstrate it");
  v("eval", "every_versions", c.eval.every_versions,
    "Evaluation during training: held-out prompts every this many versions (0: none)");
  v("eval", "prompts", c.eval.prompts, "Held-out prompts per evaluation round");
  v("eval", "samples", c.eval.samples, "Samples per evaluation prompt (k of pass@k)");
  v("eval", "greedy", c.eval.greedy, "Evaluation samples at temperature 0 (else task.temperature)");
  v("eval", "pass_reward", c.eval.pass_reward, "A sample passes at a reward >= this (pass@k)");
}

template <typename Visitor>
void VisitCoordinatorFields(RunConfig& c, Visitor& v) {
  v("coordinator", "listen", c.coordinator.listen, "Where the coordinator binds (host:port)");
  v("coordinator", "address", c.coordinator.address,
    "Where the other roles reach the coordinator (empty: its listen address)");
  v("coordinator", "log", c.coordinator.log,
    "The durable prompt log (empty: <run dir>/coordinator/prompts.log)");
  v("coordinator", "lease_ms", c.coordinator.lease_ms,
    "Re-queue a lease not renewed within this (ms)");
  v("coordinator", "heartbeat_ms", c.coordinator.heartbeat_ms, "Actors' heartbeat period (ms)");
  v("coordinator", "max_attempts", c.coordinator.max_attempts,
    "Failed attempts (release, lease expiry, heartbeat drop) before a prompt is failed");
  v("coordinator", "max_stale_reruns", c.coordinator.max_stale_reruns,
    "Hand-backs by the learner (group older than learner.max_lag) before a prompt is failed");
  v("coordinator", "max_pending_prompts", c.coordinator.max_pending_prompts,
    "Prompts pending or in flight before submits get RESOURCE_EXHAUSTED");
  v("coordinator", "max_samples_per_prompt", c.coordinator.max_samples_per_prompt,
    "Largest group a submission may ask for");
  v("coordinator", "max_prompts_per_set", c.coordinator.max_prompts_per_set,
    "Most prompts one submission may carry");
  v("coordinator", "max_watch_streams", c.coordinator.max_watch_streams,
    "WatchPromptSet streams open at once; more get RESOURCE_EXHAUSTED");
  v("coordinator", "max_actors", c.coordinator.max_actors,
    "Actors registered at once (silent ones without leases are forgotten); more are refused");
  v("coordinator", "compact_log_mb", c.coordinator.compact_log_mb,
    "Compact the prompt log into a snapshot past this size (MiB)");
  v("coordinator", "retention_s", c.coordinator.retention_s,
    "Forget a finished prompt set this long after it finished (s; 0: never)");
  v("coordinator", "reward_addresses", c.coordinator.reward_addresses,
    "RewardService addresses (host:port) a prompt set may name; others are refused");
  v("coordinator", "env_addresses", c.coordinator.env_addresses,
    "EnvironmentService addresses (host:port) a prompt set may name; others are refused");
  v("coordinator", "max_env_timeout_s", c.coordinator.max_env_timeout_s,
    "The longest environment.timeout_s a prompt set may give one environment call (s)");
  v("coordinator", "agent_addresses", c.coordinator.agent_addresses,
    "AgentService addresses (host:port) a prompt set's agent may name; others are refused");
  v("coordinator", "max_agent_timeout_s", c.coordinator.max_agent_timeout_s,
    "The longest agent.timeout_s (an agent episode's wall time) a prompt set may give (s)");
  v("coordinator", "eval_max_actor_share", c.coordinator.eval_max_actor_share,
    "Evaluation sets' leases an actor may hold: this share of its prompt slots (at least 1)");
  v("coordinator", "max_restarts", c.coordinator.max_restarts,
    "prl run: restarts of the coordinator");
  v("coordinator", "adapters", c.coordinator.adapters,
    "A run of adapters: every prompt set names the LoRA adapter it trains (docs/tenants.md)");
  v("coordinator", "max_adapters", c.coordinator.max_adapters,
    "Live adapters at most, all tenants together");
  v("coordinator", "max_adapter_rank", c.coordinator.max_adapter_rank,
    "The largest rank a prompt set's new adapter may ask for");
  v("coordinator", "tenants_file", c.coordinator.tenants_file,
    "JSON file of the tenants' limits: the adapters each may train, its quotas (docs/tenants.md)");
}

template <typename Visitor>
void VisitActorFields(RunConfig& c, Visitor& v) {
  v("actors", "count", c.actors.count, "Actor processes prl run starts");
  v("actors", "device", Enum(c.actors.device, kDeviceTypeNames), "cpu or cuda");
  v("actors", "dtype", Enum(c.actors.dtype, kComputeDTypeNames),
    "fp32, or bf16 (CUDA: weights, activations and KV cache)");
  v("actors", "gpu_memory_fraction", c.actors.gpu_memory_fraction,
    "CUDA: share of the GPU's memory the KV cache takes");
  v("actors", "kv_cache_mb", c.actors.kv_cache_mb, "CPU: KV cache pool (MiB)");
  v("actors", "block_size", c.actors.block_size, "Tokens per KV block");
  v("actors", "max_num_seqs", c.actors.max_num_seqs, "Engine sequences in flight");
  v("actors", "max_num_batched_tokens", c.actors.max_num_batched_tokens,
    "Tokens per engine step (long prompts are chunked)");
  v("actors", "enable_prefix_caching", c.actors.enable_prefix_caching,
    "Reuse KV blocks of equal prompt prefixes");
  v("actors", "batch_invariant", c.actors.batch_invariant,
    "Bit-exact log-probs whatever the batch (slower)");
  v("actors", "cuda_graphs", c.actors.cuda_graphs, "CUDA: replay captured decode steps");
  v("actors", "double_buffered_weights", c.actors.double_buffered_weights,
    "CUDA: a second copy of the weights, so that a swap never pauses decoding");
  v("actors", "tuned_kernels", c.actors.tuned_kernels,
    "CUDA: the tuned decode kernels (GEMM search, flash decoding, split sampler)");
  v("actors", "norm_in_gemm", c.actors.norm_in_gemm,
    "CUDA, with tuned_kernels: RMSNorms fused into single-row decode projections");
  v("actors", "cuda_lora", c.actors.cuda_lora,
    "CUDA: LoRA adapters in the engine (written, not yet verified on a GPU)");
  v("actors", "max_prompts_in_flight", c.actors.max_prompts_in_flight,
    "Prompts leased and generating at once, per actor");
  v("actors", "env_calls_per_address", c.actors.env_calls_per_address,
    "Environment calls in flight to one environment address, per actor");
  v("actors", "env_outage_s", c.actors.env_outage_s,
    "How long episodes wait for an environment found down before they fail (s)");
  v("actors", "openai_listen", c.actors.openai_listen,
    "The OpenAI-compatible endpoint agents call (host:port; port 0: any free one)");
  v("actors", "openai_address", c.actors.openai_address,
    "The endpoint's host:port as agents reach it (empty: the bound address)");
  v("actors", "openai_max_connections", c.actors.openai_max_connections,
    "Connections the endpoint holds open at once (idle ones are shed first)");
  v("actors", "agent_episodes_per_address", c.actors.agent_episodes_per_address,
    "Agents' episodes running at once per agent address, per actor");
  v("actors", "replay_timeout_s", c.actors.replay_timeout_s,
    "How long a write waits while the replay buffer is full (s)");
  v("actors", "max_restarts", c.actors.max_restarts, "prl run: restarts of each actor");
}

template <typename Visitor>
void VisitLearnerFields(RunConfig& c, Visitor& v) {
  LearnerSection& l = c.learner;
  v("learner", "world_size", l.world_size, "Ranks (processes; one GPU each on CUDA)");
  v("learner", "device", Enum(l.device, kDeviceTypeNames), "cpu (Gloo) or cuda (NCCL)");
  v("learner", "dtype", Enum(l.dtype, kComputeDTypeNames),
    "fp32, or bf16 (CUDA: bf16 compute, fp32 master weights)");
  v("learner", "keep_logits_mb", l.keep_logits_mb,
    "Keep a micro-batch's LM-head logits for its backward when they fit this many MiB (0: when "
    "one logits chunk holds them)");
  v("learner", "steps", l.steps, "Optimizer steps (0: until stopped)");
  v("learner", "groups_per_step", l.groups_per_step, "Groups per optimizer step");
  v("learner", "loss", Enum(l.loss, learner::kLossKindNames), "Policy loss");
  v("learner", "normalization", Enum(l.normalization, learner::kLossNormalizationNames),
    "Loss denominator: tokens (all trained tokens of the step) or sequence");
  v("learner", "advantage", Enum(l.advantage, learner::kAdvantageEstimatorNames),
    "grpo ((r - mean) / (std + eps)) or dr_grpo (r - mean)");
  v("learner", "drop_uniform_groups", l.drop_uniform_groups,
    "Dynamic sampling: groups whose rewards are all equal are acknowledged untrained (their "
    "prompts done) and others take their place in the step");
  v("learner", "optimizer", Enum(l.optimizer, learner::kOptimizerKindNames), "adamw or sgd");
  v("learner", "lr", l.lr, "Learning rate");
  v("learner", "weight_decay", l.weight_decay, "Decoupled weight decay (matrices only)");
  v("learner", "beta1", l.beta1, "AdamW beta1");
  v("learner", "beta2", l.beta2, "AdamW beta2");
  v("learner", "max_grad_norm", l.max_grad_norm, "Global gradient-norm clipping (0: off)");
  v("learner", "tis_cap", l.tis_cap, "Importance-weight cap of reinforce_tis / decoupled_ppo");
  v("learner", "clip_low", l.clip_low, "PPO ratio clip below 1");
  v("learner", "clip_high", l.clip_high, "PPO ratio clip above 1");
  v("learner", "max_lag", l.max_lag, "Versions a token may lag when trained on");
  v("learner", "micro_batch_tokens", l.micro_batch_tokens, "Input tokens per micro-batch");
  v("learner", "adapter_pass_tokens", l.adapter_pass_tokens,
    "A run of adapters: the most input tokens one pass packs of several adapters' micro-batches "
    "on the shared base (0: each adapter its own passes, in turns)");
  v("learner", "activation_checkpointing",
    Enum(l.activation_checkpointing, kActivationCheckpointingNames),
    "Activations kept for the backward: none, selective (the MLP recomputed) or full (each "
    "layer's input only)");
  v("learner", "activation_budget_mb", l.activation_budget_mb,
    "MiB of activations a rank's pass may lay out (0: no budget): micro-batches split to fit, a "
    "sequence that cannot fit refused");
  v("learner", "context_parallel", l.context_parallel,
    "Ranks each sequence is split over (a group of consecutive ranks; 1: none)");
  v("learner", "context_parallel_attention",
    Enum(l.context_parallel_attention, kContextAttentionNames),
    "How attention crosses a split sequence: allgather (keys and values; any head count), "
    "ulysses (all-to-all over heads; the group must split the heads) or ring (k|v blocks around "
    "the group)");
  v("learner", "moe_routing", Enum(l.moe_routing, learner::kMoeRoutingNames),
    "Qwen3-MoE: recompute the experts of completion tokens, or replay the actor's");
  v("learner", "router_aux_loss_coef", l.router_aux_loss_coef,
    "Qwen3-MoE: the load-balancing loss's coefficient (0: off)");
  v("learner", "kl_coef", l.kl_coef,
    "KL penalty to a frozen reference model: its coefficient (0: off)");
  v("learner", "kl_estimator", Enum(l.kl_estimator, learner::kKlEstimatorNames),
    "KL estimator at the sampled tokens: k1, k2 or k3 (low_var_kl)");
  v("learner", "kl_penalty", Enum(l.kl_penalty, learner::kKlPenaltyNames),
    "loss (a loss term with its gradient) or reward (a per-token reward in the advantage)");
  v("learner", "kl_reference", l.kl_reference,
    "The reference model's weights (empty: the starting model, model.path)");
  v("learner", "lora_rank", l.lora_rank,
    "LoRA: train an adapter of this rank on the frozen base (0: every weight)");
  v("learner", "lora_alpha", l.lora_alpha, "LoRA: lora_alpha (scale alpha / r)");
  v("learner", "lora_rslora", l.lora_rslora, "LoRA: scale alpha / sqrt(r) (rsLoRA)");
  v("learner", "lora_targets", l.lora_targets,
    "LoRA: comma-separated q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or "
    "all-linear");
  v("learner", "lora_init", l.lora_init,
    "LoRA: a PEFT adapter directory to start from (its config sets rank, alpha, targets)");
  v("learner", "cuda_lora", l.cuda_lora,
    "CUDA: a LoRA learner on the GPU (written, not yet verified on a GPU)");
  v("learner", "cuda_context_parallel", l.cuda_context_parallel,
    "CUDA: context parallelism on the GPU with ulysses (written, not yet verified on a GPU)");
  v("learner", "batch_invariant", l.batch_invariant,
    "Forward in the batch-invariant order (with actors.batch_invariant: the actors' bits)");
  v("learner", "checkpoint_every", l.checkpoint_every, "Steps between checkpoints");
  v("learner", "keep_checkpoints", l.keep_checkpoints, "Newest checkpoints kept");
  v("learner", "checkpoint_dir", l.checkpoint_dir,
    "Sharded checkpoints (empty: <run dir>/checkpoints)");
  v("learner", "timeout_s", l.timeout_s, "Per-collective time-out (s)");
  v("learner", "report_file", l.report_file, "Append one JSON line per step here (empty: none)");
  v("learner", "max_restarts", l.max_restarts, "prl run: restarts of the learner");
}

template <typename Visitor>
void VisitSecurityFields(RunConfig& c, Visitor& v) {
  SecuritySection& s = c.security;
  v("security", "tls_cert_file", s.tls_cert_file,
    "This process's TLS certificate chain (PEM); empty: no TLS");
  v("security", "tls_key_file", s.tls_key_file, "The certificate's private key (PEM)");
  v("security", "tls_ca_file", s.tls_ca_file,
    "The CA that verifies servers (and clients with require_client_cert)");
  v("security", "require_client_cert", s.require_client_cert,
    "Servers demand a client certificate signed by the CA (mutual TLS)");
  v("security", "insecure", s.insecure,
    "Let non-loopback listeners serve plaintext without authentication");
  v("security", "client_token_file", s.client_token_file,
    "The bearer token of clients (PromptService); empty: no tokens");
  v("security", "actor_token_file", s.actor_token_file, "The bearer token of actors");
  v("security", "learner_token_file", s.learner_token_file, "The bearer token of the learner");
  v("security", "service_token_file", s.service_token_file,
    "prl env serve, prl reward serve: the bearer token callers must present");
  v("security", "service_token_files", s.service_token_files,
    "host:port -> token file: the credential sent to the user-written service there");
  v("security", "tenant_token_files", s.tenant_token_files,
    "tenant -> token file: a client token limited to that tenant (coordinator.tenants_file)");
  v("security", "cert_refresh_s", s.cert_refresh_s, "How often certificate files are re-read (s)");
}

template <typename Visitor>
void VisitServiceFields(RunConfig& c, Visitor& v) {
  v("replay", "capacity_mb", c.replay.capacity_mb, "Replay segment size (MiB)");
  v("replay", "adapter_capacity_mb", c.replay.adapter_capacity_mb,
    "A run of adapters: each adapter's replay segment size (MiB; allocated when it is made; "
    "0: twice its lag budget of the longest groups the model allows, 4 to 32 MiB)");
  v("replay", "lease_ms", c.replay.lease_ms, "Re-deliver a taken group not acked within this");
  v("replay", "drop_oldest", c.replay.drop_oldest,
    "When full, drop the oldest groups instead of making writers wait; their prompts are "
    "handed back to the coordinator by the learner and generated again (a dropped group is "
    "never a prompt done untrained)");
  v("replay", "listen", c.replay.listen, "prl replay serve: the gRPC ingest's address");
  v("replay", "address", c.replay.address,
    "Actors push to this remote ingest instead of the local segment (empty: local)");
  v("replay", "max_message_mb", c.replay.max_message_mb, "Largest push message (MiB)");
  v("replay", "write_timeout_ms", c.replay.write_timeout_ms,
    "How long a push waits for space before RESOURCE_EXHAUSTED (ms)");
  v("replay", "dead_letter_dir", c.replay.dead_letter_dir,
    "Refused groups, ingest.jsonl and learner.jsonl (empty: <run dir>/dead_letters)");
  v("broadcast", "transport", Enum(c.broadcast.transport, kWeightTransportNames),
    "shm or cuda_ipc (same node), grpc or nccl (across nodes)");
  v("broadcast", "listen", c.broadcast.listen, "grpc, nccl: where the learner serves weights");
  v("broadcast", "address", c.broadcast.address,
    "grpc, nccl: where actors reach the learner (empty: the listen address)");
  v("broadcast", "timeout_s", c.broadcast.timeout_s,
    "nccl: a broadcast to a dead actor fails; grpc: a stalled stream is cut (s)");
  v("reward", "listen", c.reward.listen, "prl reward serve: the RewardService's address");
  v("reward", "max_message_mb", c.reward.max_message_mb, "Largest Score message (MiB)");
  VisitSecurityFields(c, v);
  v("metrics", "enabled", c.metrics.enabled, "Serve Prometheus /metrics");
  v("metrics", "listen", c.metrics.listen,
    "This process's /metrics address (host:port; a port alone is loopback; port 0: any)");
  v("metrics", "base_port", c.metrics.base_port,
    "prl run: 0 for free ports, else coordinator base, learner base+1, actors base+2...");
}

template <typename Visitor>
void VisitFields(RunConfig& c, Visitor& v) {
  VisitRunFields(c, v);
  VisitTaskFields(c, v);
  VisitCoordinatorFields(c, v);
  VisitActorFields(c, v);
  VisitLearnerFields(c, v);
  VisitServiceFields(c, v);
}

}  // namespace prl::config::internal
