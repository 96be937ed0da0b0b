// RunConfig: the one file that describes a run (docs/architecture.md, "Config"). `prl run`
// reads it to start every process, and every role (`prl coordinator`, `prl actor`, `prl
// learner serve`, `prl replay serve`) and tool (`prl learner step|train`) reads the same file
// with --config; their remaining flags are shorthands for keys of this file. Every default is
// stated here, once; docs/configuration.md lists every key (a test keeps the two equal).
//
// Format: JSON, every section and key optional (the defaults are the built-in quickstart: a
// tiny model created on the fly, a supervised warm-start, then RL on the arithmetic task).
// Unknown sections or keys, values of the wrong type or out of range, and misspelt
// enumerations are errors naming the field (`learner.lr: expected a number > 0, found -1`,
// `learner.advantage: expected one of grpo, dr_grpo; found 'grpoo'`).
//
// Units are in the names: _mb (MiB), _ms (milliseconds), _s (seconds). Addresses are
// host:port; `listen` keys are where a server binds (loopback by default; port 0: any free
// port), `address` keys are where clients reach it (empty: the listen address).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "config/learner_kinds.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/enum_names.h"
#include "core/service_defaults.h"
#include "model/activation_checkpointing.h"
#include "model/context_parallel.h"

namespace prl::config {

enum class RunMode { kPipeline, kSync };
inline constexpr NamedValue<RunMode> kRunModeNames[] = {{"pipeline", RunMode::kPipeline},
                                                        {"sync", RunMode::kSync}};

// How the learner's weights reach the actors (weight_broadcast/).
enum class WeightTransport { kShm, kGrpc, kCudaIpc, kNccl };
inline constexpr NamedValue<WeightTransport> kWeightTransportNames[] = {
    {"shm", WeightTransport::kShm},
    {"grpc", WeightTransport::kGrpc},
    {"cuda_ipc", WeightTransport::kCudaIpc},
    {"nccl", WeightTransport::kNccl}};

// The run's task: the built-in arithmetic problems, the built-in guessing game's secrets
// (with env.name = guess_number), or prompts from the user's files.
enum class TaskName { kArithmetic, kGuessNumber, kPrompts };
inline constexpr NamedValue<TaskName> kTaskNames[] = {{"arithmetic", TaskName::kArithmetic},
                                                      {"guess_number", TaskName::kGuessNumber},
                                                      {"prompts", TaskName::kPrompts}};

// The arithmetic reward's credit: exact (1 iff the answer is right) or digits (partial credit
// per digit, a denser signal for small models). Evaluation is always exact.
enum class ArithmeticCredit { kExact, kDigits };
inline constexpr NamedValue<ArithmeticCredit> kArithmeticCreditNames[] = {
    {"exact", ArithmeticCredit::kExact}, {"digits", ArithmeticCredit::kDigits}};

struct RunSection {
  std::string name = "quickstart";
  std::string dir;  // default: runs/<name>
  RunMode mode = RunMode::kPipeline;
  uint64_t seed = 1;
  // The file mode creation mask of every prl command that reads the run config (octal):
  // "077" keeps run data private (files 0600, directories 0700); "027" lets the group read.
  std::string umask = "077";
};

// run.umask's value: 1 to 4 octal digits of at most 0777; -1 for anything else.
int ParseUmask(const std::string& text);

struct ModelSection {
  std::string path;             // a Hugging Face model directory; empty: created from preset
  std::string preset = "tiny";  // model/presets.h, used when path is empty
  int64_t max_position_embeddings = 64;  // of a created model
  uint64_t init_seed = 1;
};

struct TaskSection {
  // arithmetic: the built-in task (prompts, held-out split, verifier); prompts: train_file and
  // eval_file, JSONL lines {"text" | "messages", "reference"}, scored by `reward`.
  TaskName name = TaskName::kArithmetic;
  std::string train_file, eval_file;
  int min_digits = 1, max_digits = 3;
  std::string operations = "+";
  int64_t eval_prompts = 1000;  // held-out prompts for eval_before / eval_after
  int32_t samples_per_prompt = 8;
  int32_t max_tokens = 6;
  double temperature = 1.0;
  double top_p = 1.0;
  std::string reward = "arithmetic";
  std::map<std::string, std::string> reward_params;  // e.g. {"pattern": ...} for regex
  ArithmeticCredit credit = ArithmeticCredit::kExact;
};

// Agentic episodes for `prl run`'s task (docs/environments.md): every prompt of the run, in
// training and in the held-out evaluation, is an episode against this environment, scored by
// it (task.reward is not used). Empty name: one completion per prompt, as before.
struct EnvSection {
  std::string name;     // calculator, guess_number (built in), or the name address serves
  std::string address;  // an EnvironmentService host:port; empty: built in. prl run allows it
                        // (coordinator.env_addresses) for its own coordinator
  std::map<std::string, std::string> params;  // StartEpisode's parameters, e.g. call_open
  int32_t max_turns = 0;                      // model turns per episode; 0: 8
  int32_t max_tokens_per_turn = 0;            // 0: task.max_tokens
  int32_t max_episode_tokens = 0;             // model and environment tokens; 0: no limit
  double timeout_s = 0;                       // one call's budget, retries included; 0: 30
  // How the model writes tool calls (episode/tool_calls.h): hermes, llama3_json, none; "": read
  // from the model's chat template.
  std::string tool_call_format;
};

// Agents for `prl run`'s task (docs/agents.md): every prompt of the run, in training and in the
// held-out evaluation, is an episode run by the user's agent at this address (an AgentService),
// which calls the actors' OpenAI-compatible endpoint and returns the episode's reward
// (task.reward is not used). With a built-in env.name beside it, that environment's
// demonstrations warm-start the model and the agent runs the episodes. Empty address: none.
struct AgentSection {
  std::string name;     // passed to RunEpisode
  std::string address;  // the AgentService's host:port; prl run allows it for its coordinator
  std::map<std::string, std::string> params;  // RunEpisode's parameters
  int32_t max_calls = 0;                      // endpoint calls per episode; 0: 16
  int32_t max_tokens_per_call = 0;            // 0: task.max_tokens
  int32_t max_episode_tokens = 0;             // 0: no limit but the context
  double timeout_s = 0;                       // the episode's wall time; 0: 300
  std::string tool_call_format;               // as env.tool_call_format
};

// The supervised warm-start before RL (steps 0: none). The defaults take the tiny model to
// about 57% greedy held-out accuracy in ~30 s on 2 cores: room for RL, and groups of samples
// that disagree often enough for GRPO to have a signal.
struct SftSection {
  int64_t steps = 2000;
  double lr = 3e-3;
  int64_t examples_per_step = 128;
  // With a built-in environment (env.name): the share of the warm-start's examples that
  // demonstrate it (runner/demonstrations.h: the calculator's examples call the tool, the rest
  // answer at once), so that RL starts from a model that sometimes uses it.
  double env_demo_fraction = 0.25;
};

// prl run's evaluation during training (docs/operations.md, "Evaluation during training"):
// the task's held-out prompts submitted once as an evaluation set (SubmitPromptSetRequest.eval),
// which the coordinator runs on the actors at learner version 0 and every every_versions
// versions after, never trained on; summary.json holds the curve.
struct EvalSection {
  int64_t every_versions = 100;  // 0: no evaluation during training
  int64_t prompts = 128;  // held-out prompts per round: the first of them (at most task.eval_prompts)
  int32_t samples = 1;          // k, samples per prompt (pass@k)
  bool greedy = true;           // temperature 0; false: task.temperature
  double pass_reward = 1.0;     // a sample passes at a reward >= this
};

struct CoordinatorSection {
  std::string listen = "127.0.0.1:50051";
  std::string address;  // where actors, the learner and clients reach it; empty: listen
  std::string log;      // the durable prompt log; empty: <run dir>/coordinator/prompts.log
  int64_t lease_ms = defaults::kLeaseMs;
  int64_t heartbeat_ms = defaults::kHeartbeatMs;
  // Failed attempts (released by its actor, lease expired, dropped from a heartbeat) after
  // which a prompt is failed, visibly, instead of re-queued. 3: an actor crash or two is
  // retried, a prompt that kills or is refused by every actor is not retried forever.
  int32_t max_attempts = defaults::kMaxAttempts;
  // Hand-backs by the learner (its group came in older than learner.max_lag) after which a
  // prompt is failed. Counted apart from max_attempts (staleness is the pipeline's doing); a
  // re-run starts from the learner's newest weights, so only a prompt whose rollouts outlast
  // max_lag steps again and again reaches it.
  int32_t max_stale_reruns = defaults::kMaxStaleReruns;
  int64_t max_pending_prompts =
      defaults::kMaxPendingPrompts;  // pending or in flight, all sets; then submits wait
  int32_t max_samples_per_prompt = defaults::kMaxSamplesPerPrompt;
  int64_t max_prompts_per_set = defaults::kMaxPromptsPerSet;  // prompts in one submission
  int max_watch_streams = 64;                                 // WatchPromptSet streams open at once
  int64_t max_actors =
      defaults::kMaxActors;  // registered and alive; silent ones holding no lease are forgotten
  // The log is rewritten as a snapshot of the live state past this size (and twice the last
  // snapshot's), so it stays within a constant factor of the live state.
  int64_t compact_log_mb = defaults::kCompactLogMb;
  // A finished (done or cancelled) set is forgotten this long after it finished, with its
  // idempotency key; 0: kept forever. A day: long enough for any client to read its result.
  int64_t retention_s = defaults::kRetentionS;
  // The RewardService addresses a prompt set may name (reward "remote", params.address); any
  // other is refused at submission.
  std::vector<std::string> reward_addresses;
  // The EnvironmentService addresses a prompt set's environment may name
  // (docs/environments.md); any other is refused at submission. Built-in ones need none.
  std::vector<std::string> env_addresses;
  // The longest env.timeout_s a prompt set may give one environment call (retries included):
  // a hung environment holds an actor's prompt slots at most this long per attempt.
  double max_env_timeout_s = 120;
  // The AgentService addresses a prompt set's agent may name (docs/agents.md); any other is
  // refused at submission.
  std::vector<std::string> agent_addresses;
  // The longest agent.timeout_s (an agent's episode, wall time) a prompt set may give.
  double max_agent_timeout_s = 600;
  // Evaluation sets' leases (SubmitPromptSetRequest.eval) an actor may hold: this share of its
  // prompt slots (at least 1), outside the lag budget, so that training never waits for them.
  double eval_max_actor_share = 0.25;
  int max_restarts = 3;  // by prl run's supervisor
  // Tenants (docs/tenants.md): a run of adapters, where every prompt set names the LoRA adapter
  // it trains on the shared base model (made by the first set that names it from the set's
  // settings and learner.lora_*), each adapter with its own lag budget.
  bool adapters = false;
  int64_t max_adapters = 64;      // live adapters, all tenants together
  int32_t max_adapter_rank = 256;
  // A JSON file of the tenants' limits by tenant name (docs/tenants.md): the adapter names each
  // may train and its quotas. Its names are security.tenant_token_files'. Empty: no tenants.
  std::string tenants_file;
};

struct ActorsSection {
  int count = 2;  // prl run's actor processes
  DeviceType device = DeviceType::kCpu;
  DType dtype = DType::kF32;
  // CUDA: the share of the GPU's memory the KV cache takes (vLLM's gpu_memory_utilization,
  // for the cache alone). On the CPU the pool is kv_cache_mb.
  double gpu_memory_fraction = 0.2;
  int64_t kv_cache_mb = defaults::kKvCacheMb;
  int32_t block_size = defaults::kBlockSize;  // tokens per KV block (vLLM's default)
  int32_t max_num_seqs = defaults::kMaxNumSeqs;
  int32_t max_num_batched_tokens = defaults::kMaxNumBatchedTokens;
  bool enable_prefix_caching = true;
  bool batch_invariant = false;  // bit-exact log-probs whatever the batch; slower
  bool cuda_graphs = true;
  // CUDA: a second copy of the weights in the compute dtype, so that a weight swap converts
  // beside decoding and never pauses it (inference_engine/engine.h).
  bool double_buffered_weights = true;
  // CUDA, fast order: the tuned decode kernels (EngineOptions::tuned_kernels: cuBLASLt algorithm
  // search, residuals in the GEMMs, fused RoPE + KV write, flash-decoding attention without a
  // per-layer tile plan, split-vocabulary sampling). Verified on an H200 (docs/benchmarks.md):
  // 1.3-2.5x the default decode; false keeps the kernels of before.
  bool tuned_kernels = true;
  // CUDA, with tuned_kernels: the RMSNorms fused into the projections of single-row decode steps
  // (EngineOptions::norm_in_gemm). Verified on an H200: 1.15x decode at batch 1.
  bool norm_in_gemm = true;
  // CUDA: LoRA adapters in the engine (EngineOptions::cuda_lora): a LoRA learner's versions and
  // a run of adapters' adapters on a GPU actor. Written, not yet run on a GPU: off (a CUDA actor
  // with adapters is refused, naming this key) until a GPU session passes CudaEngineLoraTest.
  bool cuda_lora = false;
  int32_t max_prompts_in_flight = 8;
  // Agentic episodes (docs/environments.md): environment calls one actor makes to one
  // environment (address) at once; a hung environment blocks only its own.
  int32_t env_calls_per_address = 16;
  // How long an environment found down (UNAVAILABLE after a call's retries) may stay down while
  // its episodes wait for it, probed with backoff, before they fail their attempts, visibly: a
  // restart or a short outage costs no attempt.
  double env_outage_s = 300;
  // Agents (docs/agents.md): the OpenAI-compatible endpoint each actor serves them. Loopback
  // by default (port 0: any free one); another address needs TLS (security.tls_*) or
  // security.insecure. openai_address: the host:port agents are told to call ("": the bound
  // address). Agents' episodes running at once per agent address (each RunEpisode is one).
  std::string openai_listen = "127.0.0.1:0";
  std::string openai_address;
  // Connections the endpoint holds open at once: past it, one that is not generating is shed
  // (openai/connection_table.h); 503 only when all are generating (docs/security.md).
  int32_t openai_max_connections = 256;
  int32_t agent_episodes_per_address = 256;
  double replay_timeout_s = 60;  // how long a write waits while the replay buffer is full
  int max_restarts = 5;          // per actor, by prl run's supervisor
};

struct LearnerSection {
  int world_size = 1;
  DeviceType device = DeviceType::kCpu;
  DType dtype = DType::kF32;
  // The LM head's logits of a micro-batch kept from its forward for its backward when every
  // trained row's fit this many MiB (TransformerOptions::keep_logits_bytes; 0: only when one
  // logits chunk holds them anyway). Memory for speed: one logits GEMM fewer per micro-batch.
  // The CPU keeps them; CUDA recomputes them until a GPU session has verified it.
  int64_t keep_logits_mb = 0;
  int64_t steps = 2000;  // RL optimizer steps (0: until stopped; prl run needs >= 1)
  int64_t groups_per_step = 16;
  learner::LossKind loss = learner::LossKind::kReinforceTis;
  learner::LossNormalization normalization = learner::LossNormalization::kGlobalTokens;
  learner::AdvantageEstimator advantage = learner::AdvantageEstimator::kGrpo;
  bool drop_uniform_groups = false;
  learner::OptimizerKind optimizer = learner::OptimizerKind::kAdamW;
  // Measured on the quickstart (300 steps from the same warm start): 1e-4 gains the most
  // held-out accuracy, 3e-4 half as much, 1e-3 collapses the policy.
  double lr = 1e-4;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.95;
  double max_grad_norm = 1.0;  // 0: no clipping
  double tis_cap = 2.0;
  double clip_low = 0.2, clip_high = 0.2;
  int64_t max_lag = defaults::kMaxLag;
  int64_t micro_batch_tokens = 4096;
  // A run of adapters (docs/tenants.md): the most input tokens one joint pass packs of several
  // adapters' micro-batches on the shared base (learner/joint_step.h); 0: the adapters step in
  // turns, each with its own passes.
  // 4096: the activations of one micro-batch of learner.micro_batch_tokens' default.
  int64_t adapter_pass_tokens = 4096;
  // Activations a training pass keeps for its backward (model/activation_checkpointing.h):
  // none, selective (the MLP recomputed) or full (each layer's input only); docs/learner.md
  // "Long sequences".
  ActivationCheckpointing activation_checkpointing = ActivationCheckpointing::kNone;
  // The most MiB a rank's training pass may lay out for activations and scratch (0: no
  // budget): micro-batches are split to fit, and a sequence that cannot fit alone is refused
  // before it runs (dead-lettered, its prompt failed), naming the settings that would fit it.
  int64_t activation_budget_mb = 0;
  // Context parallelism (model/context_parallel.h): each sequence split over groups of this
  // many consecutive ranks (world_size a multiple of it); 1: none. CPU and fp32 for now.
  int context_parallel = 1;
  // How attention crosses the split (model/context_parallel.h): allgather (the group's keys and
  // values, any head count), ulysses (all-to-all over heads; learner.context_parallel must split
  // the heads) or ring (k|v blocks around the group).
  ContextAttention context_parallel_attention = ContextAttention::kAllGather;
  // recompute: the CPU's fp32 and the batch-invariant modes route as the actor did, so there is
  // nothing to replay; replay is for the modes that cannot promise it.
  learner::MoeRouting moe_routing = learner::MoeRouting::kRecompute;
  // Qwen3-MoE's load-balancing loss (transformers' router_aux_loss_coef; docs/models.md); 0:
  // off. RL fine-tuning runs without it (a released model's routers are already balanced).
  double router_aux_loss_coef = 0.0;
  // The learner's forward in the batch-invariant order (kernels/reduction_order.h): with
  // actors.batch_invariant, its log-probs and Qwen3-MoE routes equal the actors' bit for bit
  // on the CPU (slower GEMMs). Off: the fast order, equal to within rounding.
  bool batch_invariant = false;
  // The KL penalty to a frozen reference model (learner/reference_kl.h): coefficient (0: off,
  // no reference is loaded), estimator, where it acts, and the reference's weights (empty:
  // the starting model, model.path).
  double kl_coef = 0.0;
  learner::KlEstimator kl_estimator = learner::KlEstimator::kK3;
  learner::KlPenalty kl_penalty = learner::KlPenalty::kLoss;
  std::string kl_reference;
  // LoRA (model/lora.h, docs/learner.md): lora_rank > 0 trains an adapter of that rank on the
  // frozen base (FSDP over the adapter; learner/fsdp.h) instead of every weight; 0: full
  // fine-tuning. lora_targets: PEFT's module names, comma-separated, or all-linear.
  // lora_init: a PEFT adapter directory to start from (its adapter_config.json sets the rank,
  // alpha and targets; lora_rank stays 0); empty: a new adapter (A random, B zero).
  int64_t lora_rank = 0;
  double lora_alpha = 16;
  bool lora_rslora = false;
  std::string lora_targets = "q_proj,k_proj,v_proj,o_proj";
  std::string lora_init;
  bool lora() const { return lora_rank > 0 || !lora_init.empty(); }
  // CUDA: a LoRA learner on the GPU (TransformerOptions::cuda_lora: the frozen base on the GPU in
  // learner.dtype, the adapter in F32). Written, not yet run on a GPU: off (LoRA with
  // learner.device = cuda is refused, naming this key) until a GPU session passes cuda_lora_test.
  bool cuda_lora = false;
  // CUDA: context parallelism on the GPU, Ulysses only (TransformerOptions::cuda_context_parallel:
  // the CUDA attention over each rank's heads, the group over NCCL). Written, not yet run on a
  // GPU: off (learner.context_parallel > 1 with learner.device = cuda is refused, naming this key).
  bool cuda_context_parallel = false;
  int64_t checkpoint_every = 100;
  int keep_checkpoints = 2;
  std::string checkpoint_dir;  // empty: <run dir>/checkpoints
  double timeout_s = 300;      // per collective: a dead rank becomes an error after this
  std::string report_file;     // one JSON line per step (learner/step_report.h); empty: none
  int max_restarts = 3;
};

struct ReplaySection {
  int64_t capacity_mb = defaults::kReplayCapacityMb;
  // A run of adapters: each adapter's own segment (every page is allocated when it is made, so
  // that a full /dev/shm is an error then, never a SIGBUS later: N adapters take N times this).
  // Its lag budget bounds what it holds; a full one makes the actors' writes wait. 0: sized from
  // the lag budget (roles/replay_role.h, AdapterReplayCapacityBytes), 4 to 32 MiB.
  int64_t adapter_capacity_mb = 0;
  int64_t lease_ms =
      defaults::kReplayLeaseMs;  // a taken group not acked within this is delivered again
  bool drop_oldest = false;      // when full: drop the oldest groups instead of making writers wait
  std::string listen = "127.0.0.1:50061";  // `prl replay serve`'s gRPC ingest
  std::string address;  // non-empty: actors push to this remote ingest instead of the segment
  int64_t max_message_mb = 256;
  int64_t write_timeout_ms = 10'000;  // a push waits this long for space
  // Groups refused as bad input (replay/quarantine.h), one JSONL file per checker: ingest.jsonl
  // (prl replay serve) and learner.jsonl; empty: <run dir>/dead_letters.
  std::string dead_letter_dir;
};

struct BroadcastSection {
  WeightTransport transport = WeightTransport::kShm;
  std::string listen = "127.0.0.1:50062";  // grpc and nccl: the learner's endpoint
  std::string address;                     // where actors reach it; empty: listen
  double timeout_s = 30;                   // nccl: a broadcast to a dead actor fails after this
};

// `prl reward serve`: the run's task reward (task.reward, task.credit) as a gRPC RewardService,
// for prompt sets whose reward is {"name": "remote", "params": {"address": ...}}.
struct RewardSection {
  std::string listen = "127.0.0.1:50071";
  int64_t max_message_mb = 64;
};

// Trust (rpc/security.h, docs/security.md): TLS and mutual TLS on every gRPC server and
// client, bearer tokens per role, and the rule for non-loopback listeners.
struct SecuritySection {
  std::string tls_cert_file, tls_key_file;  // this process's certificate chain and key (PEM)
  std::string tls_ca_file;                  // the CA that verifies peers (PEM)
  bool require_client_cert = false;         // mutual TLS
  bool insecure = false;                    // non-loopback listeners may serve plaintext
  std::string client_token_file, actor_token_file, learner_token_file;
  // The token prl's user-facing services (prl env serve, prl reward serve) accept, as the
  // `service` role: what an actor presents through service_token_files.
  std::string service_token_file;
  // host:port -> a token file: the credential actors present to the user-written service
  // (environment, remote reward) at that address, and to no other. A role's token never goes
  // to those services.
  std::map<std::string, std::string> service_token_files;
  // Tenants (docs/tenants.md): tenant name -> the token file of its client token, limited to
  // what coordinator.tenants_file allows it.
  std::map<std::string, std::string> tenant_token_files;
  int cert_refresh_s = 10;  // certificate files are checked for changes this often
};

struct MetricsSection {
  bool enabled = true;
  std::string listen = "127.0.0.1:0";  // this process's /metrics (port 0: any free port)
  int base_port = 0;  // prl run: 0 free ports; else coordinator base, learner base+1, actors +2..
};

// A tenant of `prl run` (docs/tenants.md): the LoRA adapter it trains on the run's shared base
// and its task. Its task, env and agent are the run's sections with the tenant's keys over them
// (RunConfig::ForTenant); its adapter's settings, 0 or empty, are learner.lora_*'s and
// learner.lr (as SubmitPromptSetRequest.adapter's).
struct TenantSection {
  std::string name;  // its adapter's name (1 to 64 of [a-z0-9._-])
  TaskSection task;
  EnvSection env;
  AgentSection agent;
  struct Adapter {
    int32_t rank = 0;
    double alpha = 0;
    bool rslora = false;
    std::vector<std::string> target_modules;
    double learning_rate = 0;
  } adapter;
};

struct RunConfig {
  RunSection run;
  ModelSection model;
  TaskSection task;
  EnvSection env;
  AgentSection agent;
  SftSection sft;
  EvalSection eval;
  CoordinatorSection coordinator;
  ActorsSection actors;
  LearnerSection learner;
  ReplaySection replay;
  BroadcastSection broadcast;
  RewardSection reward;
  SecuritySection security;
  MetricsSection metrics;
  // prl run with tenants (a list in the file: {"name", "task", "env", "agent", "adapter"}),
  // each training its own adapter (needs coordinator.adapters); empty: one model.
  std::vector<TenantSection> tenants;

  // This run as the tenant sees it: the tenant's task, env and agent, no tenants.
  RunConfig ForTenant(const TenantSection& tenant) const;

  // Names and paths every process of a run derives from the file, so that the roles and
  // prl run (which cleans them up) always agree.
  std::string run_dir() const { return run.dir.empty() ? "runs/" + run.name : run.dir; }
  std::string checkpoint_dir() const {
    return learner.checkpoint_dir.empty() ? run_dir() + "/checkpoints" : learner.checkpoint_dir;
  }
  // The newest weight version a network transport (grpc, nccl) published, beside the
  // checkpoints it continues (weight_broadcast/version_file.h); shm and cuda_ipc keep it in
  // their segment.
  std::string weight_version_file() const { return checkpoint_dir() + "/weight_version"; }
  // The dead-letter file of one checker ("ingest", "learner").
  std::string dead_letter_file(const std::string& checker) const {
    return (replay.dead_letter_dir.empty() ? run_dir() + "/dead_letters" : replay.dead_letter_dir) +
           "/" + checker + ".jsonl";
  }
  std::string prompt_log() const {
    return coordinator.log.empty() ? run_dir() + "/coordinator/prompts.log" : coordinator.log;
  }
  std::string coordinator_address() const {
    return coordinator.address.empty() ? coordinator.listen : coordinator.address;
  }
  std::string weights_address() const {
    return broadcast.address.empty() ? broadcast.listen : broadcast.address;
  }
  // The run's shared-memory segments (one replay and one weight segment per run and node).
  std::string replay_segment() const { return "prl-" + run.name + "-replay"; }
  std::string weight_segment() const { return "prl-" + run.name + "-weights"; }
};

// One key of the file, for --help texts and docs: "learner.lr", its help line, and its value
// in `config` as JSON text.
struct ConfigKey {
  std::string key;
  std::string help;
  std::string value_json;
};
std::vector<ConfigKey> ListConfigKeys(const RunConfig& config = RunConfig());

// Parses and validates JSON text; `origin` (a file name) prefixes every error. `overrides`
// ("section.key=value", the value parsed as JSON when it is valid JSON, else taken as a
// string) apply in order after the text.
absl::StatusOr<RunConfig> ParseRunConfig(absl::string_view json_text, absl::string_view origin,
                                         const std::vector<std::string>& overrides = {});
// Reads the file (empty path: the built-in defaults), applies `overrides`, validates.
absl::StatusOr<RunConfig> LoadRunConfig(const std::string& path,
                                        const std::vector<std::string>& overrides = {});
// The effective configuration as JSON (every field), for --print-config and run directories.
std::string RunConfigToJson(const RunConfig& config);
// Checks ranges and cross-field rules; errors name the field.
absl::Status ValidateRunConfig(const RunConfig& config);

// "{rank}" in an actor's broadcast.address or replay.address (a run of adapters whose learner
// ranks are on other nodes, docs/tenants.md): each adapter's versions and groups go to the
// servers of the learner rank it is placed on (LeasedAdapter.learner_rank), e.g.
// "prl-learner-{rank}.prl-learner:50062".
inline constexpr absl::string_view kLearnerRankPlaceholder = "{rank}";
// `address` with every "{rank}" replaced by `rank` (unchanged without one).
std::string AtLearnerRank(absl::string_view address, int32_t rank);
// The actors' addresses that name {rank}, with their keys ("broadcast.address",
// "replay.address", in that order).
std::vector<std::pair<std::string, std::string>> LearnerRankAddresses(const RunConfig& config);

}  // namespace prl::config
