#include "config/run_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace prl::config {
namespace {

using ::testing::HasSubstr;

TEST(RunConfigTest, AnEmptyObjectGivesTheBuiltInDefaults) {
  absl::StatusOr<RunConfig> c = ParseRunConfig("{}", "cfg.json");
  ASSERT_TRUE(c.ok()) << c.status();
  const RunConfig d;
  EXPECT_EQ(c->run.mode, d.run.mode);
  EXPECT_EQ(c->learner.steps, d.learner.steps);
  EXPECT_EQ(c->run_dir(), "runs/quickstart");
}

TEST(RunConfigTest, GivenFieldsOverrideDefaultsAndOthersKeepThem) {
  absl::StatusOr<RunConfig> c = ParseRunConfig(
      R"({"run": {"mode": "sync", "dir": "/tmp/x"}, "learner": {"lr": 0.5, "steps": 7}})", "f");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->run.mode, RunMode::kSync);
  EXPECT_EQ(c->run_dir(), "/tmp/x");
  EXPECT_DOUBLE_EQ(c->learner.lr, 0.5);
  EXPECT_EQ(c->learner.steps, 7);
  EXPECT_EQ(c->actors.count, RunConfig().actors.count);
}

TEST(RunConfigTest, PrintedConfigParsesBackToTheSameValues) {
  RunConfig c;
  c.learner.lr = 0.125;
  c.task.reward = "exact_match";
  c.metrics.enabled = false;
  absl::StatusOr<RunConfig> back = ParseRunConfig(RunConfigToJson(c), "printed");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(RunConfigToJson(*back), RunConfigToJson(c));
}

TEST(RunConfigTest, ErrorsNameTheFieldTheExpectationAndTheValue) {
  struct Case {
    const char* json;
    const char* message;
  } cases[] = {
      {R"({"learner": {"lr": -1}})", "learner.lr: expected a number > 0, found -1"},
      {R"({"learner": {"lr": "fast"}})", "learner.lr: expected a number, found \"fast\""},
      {R"({"run": {"mode": "async"}})", "run.mode: expected one of pipeline, sync; found 'async'"},
      {R"({"run": {"mode": 1}})", "run.mode: expected one of pipeline, sync; found 1"},
      {R"({"run": {"umask": "0999"}})",
       "run.umask: expected 1 to 4 octal digits of at most 0777, e.g. 077, found '0999'"},
      {R"({"run": {"umask": "01777"}})",
       "run.umask: expected 1 to 4 octal digits of at most 0777, e.g. 077, found '01777'"},
      {R"({"learner": {"advantage": "grpoo"}})",
       "learner.advantage: expected one of grpo, dr_grpo; found 'grpoo'"},
      {R"({"learner": {"loss": "ppo"}})",
       "learner.loss: expected one of reinforce_tis, ppo_clip, decoupled_ppo, icepop, cispo, "
       "gspo, sft; found 'ppo'"},
      {R"({"learner": {"optimizer": "adam"}})",
       "learner.optimizer: expected one of adamw, sgd; found 'adam'"},
      {R"({"learner": {"normalization": "token"}})",
       "learner.normalization: expected one of tokens, sequence; found 'token'"},
      {R"({"actors": {"device": "gpu"}})", "actors.device: expected one of cpu, cuda; found 'gpu'"},
      {R"({"learner": {"dtype": "fp16"}})",
       "learner.dtype: expected one of fp32, f32, bf16; found 'fp16'"},
      {R"({"learner": {"dtype": "bf16"}})",
       "learner.dtype: expected fp32 on the CPU (bf16 runs on CUDA only: set learner.device = "
       "cuda), found 'bf16'"},
      {R"({"task": {"credit": "partial"}})",
       "task.credit: expected one of exact, digits; found 'partial'"},
      {R"({"actors": {"gpu_memory_fraction": 1.5}})",
       "actors.gpu_memory_fraction: expected a number in (0, 1), found 1.5"},
      {R"({"coordinator": {"listen": "localhost"}})",
       "coordinator.listen: expected host:port with a port from 0 to 65535, found 'localhost'"},
      {R"({"broadcast": {"address": "h:70000"}})",
       "broadcast.address: expected host:port with a port from 0 to 65535, found 'h:70000'"},
      {R"({"actors": {"count": 0}})", "actors.count: expected 1 to 64, found 0"},
      {R"({"coordinator": {"max_attempts": 0}})", "coordinator.max_attempts: expected 1 to 1000"},
      {R"({"coordinator": {"max_stale_reruns": 0}})",
       "coordinator.max_stale_reruns: expected 1 to 1000"},
      {R"({"coordinator": {"max_stale_reruns": 1001}})",
       "coordinator.max_stale_reruns: expected 1 to 1000"},
      {R"({"actors": {"double_buffered_weights": 1}})", "actors.double_buffered_weights"},
      {R"({"actors": {"tuned_kernels": "yes"}})", "actors.tuned_kernels"},
      {R"({"actors": {"count": 2.5}})", "actors.count: expected an integer, found 2.5"},
      {R"({"task": {"samples_per_prompt": 1}})", "task.samples_per_prompt: expected 2 to 1024"},
      {R"({"task": {"samples_per_prompt": 32}, "actors": {"max_num_seqs": 16}})",
       "task.samples_per_prompt: expected at most actors.max_num_seqs (16: an actor's engine runs "
       "a prompt's samples together), found 32"},
      {R"({"learner": {"learning_rate": 1}})", "unknown key 'learner.learning_rate'"},
      {R"({"lerner": {}})", "unknown section 'lerner'"},
      {R"({"learner": 3})", "learner: expected an object, found 3"},
      {R"([1, 2])", "expected a JSON object at the top level"},
      {R"({"run": )", "not valid JSON"},
      {R"({"broadcast": {"transport": "ipc"}})",
       "broadcast.transport: expected one of shm, grpc, cuda_ipc, nccl; found 'ipc'"},
      {R"({"env": {"name": "chess"}})",
       "env.name: expected a built-in environment (calculator, guess_number) or an env.address, "
       "found 'chess'"},
      {R"({"env": {"address": "127.0.0.1:7000"}})",
       "env.name: expected the name of the environment env.address serves, found ''"},
      {R"({"task": {"name": "guess_number"}})",
       "env.name: expected guess_number (built in) for task.name = guess_number, found ''"},
      {R"({"env": {"name": "calculator", "max_tokens_per_turn": 7}})",
       "env.max_tokens_per_turn: expected 0 (task.max_tokens) to task.max_tokens (6), found 7"},
      {R"({"env": {"name": "calculator", "timeout_s": -1}})",
       "env.timeout_s: expected 0 (30) to coordinator.max_env_timeout_s (120), found -1"},
      {R"({"env": {"name": "calculator", "timeout_s": 200}})",
       "env.timeout_s: expected 0 (30) to coordinator.max_env_timeout_s (120), found 200"},
      {R"({"env": {"name": "calculator", "max_episode_tokens": 5}})",
       "env.max_episode_tokens: expected 0 (no limit) or at least a turn's tokens (6: "
       "env.max_tokens_per_turn, else task.max_tokens), found 5"},
      {R"({"coordinator": {"max_env_timeout_s": 0}})",
       "coordinator.max_env_timeout_s: expected 1 to 3600, found 0"},
      {R"({"actors": {"env_calls_per_address": 0}})",
       "actors.env_calls_per_address: expected 1 to 1024, found 0"},
      {R"({"actors": {"env_outage_s": -1}})", "actors.env_outage_s: expected 0 to 86400, found -1"},
      {R"({"sft": {"env_demo_fraction": 1.5}})",
       "sft.env_demo_fraction: expected a number in [0, 1], found 1.5"},
      {R"({"task": {"name": "guess_number"}, "env": {"name": "guess_number", "max_turns": 6}})",
       "env.max_turns: expected at least 7 (bisection's guesses over 1..100) with task.name = "
       "guess_number, found 6"},
      {R"({"task": {"name": "guess_number"},
           "env": {"name": "guess_number", "params": {"low": "x"}}})",
       "env.params.low: expected an integer, found 'x'"},
      {R"({"env": {"name": "guess_number"}})",
       "env.name: expected calculator (or none) for task.name = arithmetic"},
      {R"({"agent": {"name": "calc"}})",
       "agent.address: expected the AgentService's host:port when agent.name or agent.params is "
       "set, found ''"},
      {R"({"agent": {"address": "h"}})", "agent.address: expected host:port"},
      {R"({"agent": {"address": "127.0.0.1:7100"}, "env": {"name": "x", "address": "h:1"}})",
       "env.address: expected empty with an agent"},
      {R"({"agent": {"address": "127.0.0.1:7100", "max_calls": 2000}})",
       "agent.max_calls: expected 0 (16) to 1024, found 2000"},
      {R"({"agent": {"address": "127.0.0.1:7100", "max_tokens_per_call": 7}})",
       "agent.max_tokens_per_call: expected 0 (task.max_tokens) to task.max_tokens (6), found 7"},
      {R"({"agent": {"address": "127.0.0.1:7100", "max_episode_tokens": 5}})",
       "agent.max_episode_tokens: expected 0 (no limit) or at least a call's tokens (6), found 5"},
      {R"({"agent": {"address": "127.0.0.1:7100", "timeout_s": 4000}})",
       "agent.timeout_s: expected 0 (300) to coordinator.max_agent_timeout_s"},
      {R"({"agent": {"address": "127.0.0.1:7100", "tool_call_format": "xml"}})",
       "agent.tool_call_format: expected \"\" (from the chat template), hermes, llama3_json or "
       "none, found 'xml'"},
      {R"({"coordinator": {"max_agent_timeout_s": 0}})",
       "coordinator.max_agent_timeout_s: expected 1 to 86400, found 0"},
      {R"({"coordinator": {"agent_addresses": ["nohost"]}})",
       "coordinator.agent_addresses[0]: expected host:port"},
      {R"({"coordinator": {"adapters": true}})",
       "learner.lora_rank: expected > 0 with coordinator.adapters"},
      {R"({"coordinator": {"adapters": true}, "learner": {"lora_rank": 8},
           "broadcast": {"transport": "nccl"}})",
       "broadcast.transport: expected shm or grpc with coordinator.adapters"},
      {R"({"coordinator": {"adapters": true}, "learner": {"lora_rank": 8, "world_size": 2},
           "broadcast": {"transport": "grpc"}})",
       "learner.world_size: expected 1 with coordinator.adapters, unless the ranks train on the "
       "actors' node (broadcast.transport shm, replay.address empty) or each on a node of its own "
       "(broadcast.transport grpc, broadcast.address and replay.address naming each rank's "
       "servers with {rank}, e.g. 'prl-learner-{rank}.prl-learner:50062'), with "
       "learner.context_parallel 1, found 2"},
      {R"({"coordinator": {"adapters": true}, "learner": {"lora_rank": 8, "world_size": 2},
           "broadcast": {"transport": "grpc", "address": "l-{rank}:50062"},
           "replay": {"address": "prl-replay:50061"}})",
       "learner.world_size: expected 1 with coordinator.adapters, unless"},
      {R"({"broadcast": {"transport": "grpc", "address": "l-{rank}:50062"}})",
       "broadcast.address: expected no {rank} without coordinator.adapters (it names the learner "
       "rank an adapter is placed on), found 'l-{rank}:50062'"},
      {R"({"replay": {"address": "l-{rank}:50061"}})",
       "replay.address: expected no {rank} without coordinator.adapters"},
      {R"({"coordinator": {"max_adapter_rank": 0}})",
       "coordinator.max_adapter_rank: expected 1 to 1024, found 0"},
      {R"({"coordinator": {"tenants_file": "t.json"}})",
       "coordinator.tenants_file: expected set exactly when security.tenant_token_files is"},
      {R"({"actors": {"openai_listen": "localhost"}})",
       "actors.openai_listen: expected host:port with a port from 0 to 65535, found 'localhost'"},
      {R"({"actors": {"agent_episodes_per_address": 0}})",
       "actors.agent_episodes_per_address: expected 1 to 65536, found 0"},
      {R"({"learner": {"router_aux_loss_coef": -0.1}})",
       "learner.router_aux_loss_coef: expected a number >= 0 (0: off), found -0.1"},
      {R"({"learner": {"keep_logits_mb": -1}})",
       "learner.keep_logits_mb: expected 0 to 1048576 (MiB), found -1"},
      {R"({"learner": {"lora_rank": 8, "device": "cuda"}})",
       "learner.device: expected cpu with LoRA (learner.lora_rank or lora_init), or cuda with "
       "learner.cuda_lora (written, not yet verified on a GPU), found cuda"},
      {R"({"learner": {"lora_rank": 8}, "actors": {"device": "cuda"}})",
       "actors.device: expected cpu with LoRA adapters (learner.lora_rank, lora_init or "
       "coordinator.adapters), or cuda with actors.cuda_lora"},
      {R"({"coordinator": {"adapters": true}, "learner": {"lora_rank": 8},
           "actors": {"device": "cuda"}})",
       "actors.device: expected cpu with LoRA adapters"},
      {R"({"learner": {"world_size": 2, "context_parallel": 2, "device": "cuda"}})",
       "learner.context_parallel: expected 1 with learner.device = cuda or dtype bf16, unless "
       "learner.cuda_context_parallel with learner.context_parallel_attention = ulysses"},
      {R"({"learner": {"world_size": 2, "context_parallel": 2, "device": "cuda",
                       "cuda_context_parallel": true}})",
       "learner.context_parallel_attention = ulysses (written, not yet verified on a GPU), found 2"},
      {R"({"learner": {"context_parallel_attention": "stripes"}})",
       "learner.context_parallel_attention: expected one of allgather, ulysses, ring"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<RunConfig> parsed = ParseRunConfig(c.json, "my.json");
    ASSERT_FALSE(parsed.ok()) << c.json;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.message)) << c.json;
    EXPECT_THAT(parsed.status().message(), HasSubstr("my.json")) << c.json;
  }
}

// LoRA on CUDA is written but not yet verified on a GPU: each role takes it only when asked.
TEST(RunConfigTest, LoraOnCudaIsTakenOnlyWithEachRolesCudaLoraKey) {
  absl::StatusOr<RunConfig> on = ParseRunConfig(
      R"({"learner": {"lora_rank": 8, "device": "cuda", "cuda_lora": true},
          "actors": {"device": "cuda", "cuda_lora": true}})",
      "my.json");
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->learner.cuda_lora);
  EXPECT_TRUE(on->actors.cuda_lora);
  absl::StatusOr<RunConfig> off = ParseRunConfig("{}", "my.json");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->learner.cuda_lora);
  EXPECT_FALSE(off->actors.cuda_lora);
  // Context parallelism on CUDA is written (Ulysses) but not yet verified either.
  absl::StatusOr<RunConfig> context = ParseRunConfig(
      R"({"learner": {"world_size": 2, "context_parallel": 2, "device": "cuda",
                      "cuda_context_parallel": true, "context_parallel_attention": "ulysses"}})",
      "my.json");
  ASSERT_TRUE(context.ok()) << context.status();
  EXPECT_TRUE(context->learner.cuda_context_parallel);
  EXPECT_FALSE(off->learner.cuda_context_parallel);
  // Without LoRA the keys change nothing, and a full fine-tune on CUDA needs neither.
  EXPECT_TRUE(
      ParseRunConfig(R"({"learner": {"device": "cuda"}, "actors": {"device": "cuda"}})", "my.json")
          .ok());
}

TEST(RunConfigTest, AnAgentSectionReadsEveryKeyAndTheEndpointDefaultsToLoopback) {
  const absl::StatusOr<RunConfig> c = ParseRunConfig(
      R"({"task": {"max_tokens": 40},
          "agent": {"name": "calc", "address": "127.0.0.1:7100", "params": {"tools": "on"},
                    "max_calls": 4, "max_tokens_per_call": 20, "max_episode_tokens": 60,
                    "timeout_s": 30, "tool_call_format": "hermes"}})",
      "my.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->agent.name, "calc");
  EXPECT_EQ(c->agent.address, "127.0.0.1:7100");
  EXPECT_EQ(c->agent.params.at("tools"), "on");
  EXPECT_EQ(c->agent.max_calls, 4);
  EXPECT_EQ(c->agent.max_tokens_per_call, 20);
  EXPECT_EQ(c->agent.max_episode_tokens, 60);
  EXPECT_EQ(c->agent.timeout_s, 30);
  EXPECT_EQ(c->agent.tool_call_format, "hermes");
  EXPECT_EQ(c->actors.openai_listen, "127.0.0.1:0");
}

TEST(RunConfigTest, OverridesSetSingleFieldsAndAreValidatedLikeTheFile) {
  absl::StatusOr<RunConfig> c =
      ParseRunConfig(R"({"learner": {"lr": 0.5}})", "f", {"learner.lr=0.25", "run.mode=sync"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->learner.lr, 0.25);
  EXPECT_EQ(c->run.mode, RunMode::kSync);
  EXPECT_THAT(ParseRunConfig("{}", "f", {"learner.steps=-1"}).status().message(),
              HasSubstr("learner.steps: expected >= 0 (0: until stopped), found -1"));
  EXPECT_THAT(ParseRunConfig("{}", "f", {"lr=1"}).status().message(),
              HasSubstr("--set: expected section.key=value"));
  EXPECT_THAT(ParseRunConfig("{}", "f", {"learner.rate=1"}).status().message(),
              HasSubstr("unknown key 'learner.rate'"));
}

// A run of adapters whose learner ranks are on nodes of their own: the actors' addresses name
// {rank}, each adapter's rank's servers.
TEST(RunConfigTest, ARunOfAdaptersReachesEachLearnerRankThroughRankAddresses) {
  absl::StatusOr<RunConfig> c = ParseRunConfig(
      R"({"coordinator": {"adapters": true}, "learner": {"lora_rank": 8, "world_size": 2},
          "broadcast": {"transport": "grpc", "address": "prl-learner-{rank}.prl-learner:50062"},
          "replay": {"address": "prl-learner-{rank}.prl-learner:50061"}})",
      "f");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(AtLearnerRank(c->broadcast.address, 1), "prl-learner-1.prl-learner:50062");
  EXPECT_EQ(AtLearnerRank(c->replay.address, 0), "prl-learner-0.prl-learner:50061");
  EXPECT_EQ(AtLearnerRank("prl-replay:50061", 3), "prl-replay:50061");
}

TEST(RunConfigTest, EveryProcessDerivesTheSameNamesAndPathsFromTheRun) {
  absl::StatusOr<RunConfig> c = ParseRunConfig(R"({"run": {"name": "exp7", "dir": "/d"}})", "f");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->checkpoint_dir(), "/d/checkpoints");
  EXPECT_EQ(c->prompt_log(), "/d/coordinator/prompts.log");
  // Explicit paths win over the derived ones.
  absl::StatusOr<RunConfig> explicit_paths = ParseRunConfig(
      R"({"learner": {"checkpoint_dir": "/ckpt"}, "coordinator": {"log": "/log/p.log"}})", "f");
  ASSERT_TRUE(explicit_paths.ok()) << explicit_paths.status();
  EXPECT_EQ(explicit_paths->checkpoint_dir(), "/ckpt");
  EXPECT_EQ(explicit_paths->prompt_log(), "/log/p.log");
  EXPECT_EQ(c->replay_segment(), "prl-exp7-replay");
  EXPECT_EQ(c->weight_segment(), "prl-exp7-weights");
  // Two runs on one node never share shared memory.
  absl::StatusOr<RunConfig> other = ParseRunConfig(R"({"run": {"name": "exp8"}})", "f");
  EXPECT_NE(other->replay_segment(), c->replay_segment());
}

TEST(RunConfigTest, EveryEnumerationReadsAndPrintsByItsNames) {
  absl::StatusOr<RunConfig> c = ParseRunConfig(
      R"({"run": {"mode": "sync"}, "learner": {"loss": "gspo", "advantage": "dr_grpo",
          "optimizer": "sgd", "normalization": "sequence", "device": "cuda", "dtype": "bf16"},
          "actors": {"device": "cuda", "dtype": "bf16"}, "task": {"credit": "digits"},
          "broadcast": {"transport": "cuda_ipc"}})",
      "f");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->learner.loss, learner::LossKind::kGspo);
  EXPECT_EQ(c->learner.advantage, learner::AdvantageEstimator::kDrGrpo);
  EXPECT_EQ(c->learner.optimizer, learner::OptimizerKind::kSgd);
  EXPECT_EQ(c->learner.normalization, learner::LossNormalization::kSequenceMean);
  EXPECT_EQ(c->learner.device, DeviceType::kCuda);
  EXPECT_EQ(c->learner.dtype, DType::kBF16);
  EXPECT_EQ(c->actors.dtype, DType::kBF16);
  EXPECT_EQ(c->task.credit, ArithmeticCredit::kDigits);
  EXPECT_EQ(c->broadcast.transport, WeightTransport::kCudaIpc);
  // Printed back by name, and "f32" (an accepted spelling) prints as the canonical "fp32".
  const std::string printed = RunConfigToJson(*c);
  EXPECT_THAT(printed, HasSubstr(R"("loss": "gspo")"));
  EXPECT_THAT(printed, HasSubstr(R"("transport": "cuda_ipc")"));
  absl::StatusOr<RunConfig> f32 = ParseRunConfig(R"({"actors": {"dtype": "f32"}})", "f");
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_THAT(RunConfigToJson(*f32), HasSubstr(R"("dtype": "fp32")"));
}

TEST(RunConfigTest, StringKeysTakeOverridesThatLookLikeNumbersAsText) {
  absl::StatusOr<RunConfig> c =
      ParseRunConfig("{}", "f", {"run.name=123", "learner.loss=sft", "model.path=\"/m\""});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->run.name, "123");
  EXPECT_EQ(c->learner.loss, learner::LossKind::kSft);
  EXPECT_EQ(c->model.path, "/m");
  // Numeric keys still need numbers.
  EXPECT_THAT(ParseRunConfig("{}", "f", {"learner.lr=fast"}).status().message(),
              HasSubstr("learner.lr: expected a number, found \"fast\""));
}

TEST(RunConfigTest, ListenAndAddressKeysDeriveWhereClientsConnect) {
  absl::StatusOr<RunConfig> c = ParseRunConfig(
      R"({"coordinator": {"listen": "0.0.0.0:7000"}, "broadcast": {"listen": "0.0.0.0:7001",
          "address": "learner-0.learner:7001"}})",
      "f");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->coordinator_address(), "0.0.0.0:7000");
  EXPECT_EQ(c->weights_address(), "learner-0.learner:7001");
  EXPECT_EQ(RunConfig().coordinator_address(), RunConfig().coordinator.listen);
}

TEST(RunConfigTest, EveryKeyHasHelpAndItsDefault) {
  const std::vector<ConfigKey> keys = ListConfigKeys();
  ASSERT_GT(keys.size(), 80u);
  for (const ConfigKey& k : keys) {
    EXPECT_FALSE(k.help.empty()) << k.key;
    EXPECT_FALSE(k.value_json.empty()) << k.key;
  }
  EXPECT_EQ(keys.front().key, "run.name");
  EXPECT_EQ(keys.front().value_json, "\"quickstart\"");
}

TEST(RunConfigTest, AMissingFileIsNotFoundNamingThePath) {
  absl::StatusOr<RunConfig> c = LoadRunConfig("/nonexistent/run.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("/nonexistent/run.json"));
}

}  // namespace
}  // namespace prl::config

namespace prl::config {
namespace {

using ::testing::HasSubstr;

// Two tenants over the run's task: each keeps the run's keys it does not name.
constexpr char kTenants[] = R"({
  "task": {"max_digits": 2, "eval_prompts": 50},
  "coordinator": {"adapters": true},
  "learner": {"lora_rank": 8},
  "tenants": [
    {"name": "add", "task": {"operations": "+"}},
    {"name": "sub", "task": {"operations": "-", "max_tokens": 7}, "env": {"name": "calculator"},
     "adapter": {"rank": 4, "alpha": 8, "rslora": true, "target_modules": ["q_proj"],
                 "learning_rate": 0.002}}
  ]
})";

TEST(TenantsConfigTest, EachTenantsTaskIsTheRunsWithItsOwnKeysOver) {
  absl::StatusOr<RunConfig> c = ParseRunConfig(kTenants, "t.json");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->tenants.size(), 2u);
  const TenantSection& add = c->tenants[0];
  const TenantSection& sub = c->tenants[1];
  EXPECT_EQ(add.name, "add");
  EXPECT_EQ(add.task.operations, "+");
  EXPECT_EQ(add.task.max_digits, 2);  // the run's
  EXPECT_EQ(add.task.max_tokens, RunConfig().task.max_tokens);
  EXPECT_EQ(add.adapter.rank, 0);  // learner.lora_rank's, filled in by the coordinator
  EXPECT_EQ(sub.task.operations, "-");
  EXPECT_EQ(sub.task.max_tokens, 7);
  EXPECT_EQ(sub.task.eval_prompts, 50);
  EXPECT_EQ(sub.env.name, "calculator");
  EXPECT_TRUE(add.env.name.empty());
  EXPECT_EQ(sub.adapter.rank, 4);
  EXPECT_DOUBLE_EQ(sub.adapter.alpha, 8);
  EXPECT_TRUE(sub.adapter.rslora);
  EXPECT_EQ(sub.adapter.target_modules, std::vector<std::string>{"q_proj"});
  EXPECT_DOUBLE_EQ(sub.adapter.learning_rate, 0.002);
  // The run as a tenant sees it: its task, no tenants, the rest the run's.
  const RunConfig as_sub = c->ForTenant(sub);
  EXPECT_TRUE(as_sub.tenants.empty());
  EXPECT_EQ(as_sub.task.operations, "-");
  EXPECT_EQ(as_sub.env.name, "calculator");
  EXPECT_EQ(as_sub.learner.lora_rank, 8);
}

TEST(TenantsConfigTest, ThePrintedConfigReadsBackTheSameTenants) {
  absl::StatusOr<RunConfig> c = ParseRunConfig(kTenants, "t.json");
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string printed = RunConfigToJson(*c);
  absl::StatusOr<RunConfig> back = ParseRunConfig(printed, "printed");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(RunConfigToJson(*back), printed);
  ASSERT_EQ(back->tenants.size(), 2u);
  EXPECT_EQ(back->tenants[1].task.max_tokens, 7);
  EXPECT_TRUE(back->tenants[1].adapter.rslora);
}

TEST(TenantsConfigTest, ATenantsErrorsNameItsIndexNameKeyAndValue) {
  const std::string head = R"({"coordinator": {"adapters": true}, "learner": {"lora_rank": 8},
                               "tenants": )";
  const struct {
    const char* tenants;
    const char* message;
  } cases[] = {
      {R"({"name": "a"})", "tenants: expected a list of objects"},
      {R"([{"task": {}}])", "tenants[0]: expected an object with a \"name\""},
      {R"([{"name": "a", "tasks": {}}])", "tenants[0] ('a'): unknown key 'tasks'"},
      {R"([{"name": "a", "task": 3}])", "tenants[0] ('a').task: expected an object, found 3"},
      {R"([{"name": "a"}, {"name": "b", "task": {"operationz": "+"}}])",
       "tenants[1] ('b'): unknown key 'task.operationz'"},
      {R"([{"name": "a", "task": {"max_digits": "2"}}])",
       "tenants[0] ('a'): task.max_digits: expected an integer, found \"2\""},
      {R"([{"name": "a", "adapter": {"rank": -1}}])",
       "tenants[0] ('a').adapter.rank: expected an integer >= 0"},
      {R"([{"name": "a", "adapter": {"rnak": 4}}])", "tenants[0] ('a').adapter.rnak: unknown key"},
      {R"([{"name": "a", "adapter": {"target_modules": "q_proj"}}])",
       "tenants[0] ('a').adapter.target_modules: expected a list of strings"},
      {R"([{"name": "A b"}])", "tenants[0].name: expected 1 to 64 characters of [a-z0-9._-]"},
      {R"([{"name": "a"}, {"name": "a"}])", "tenants[1].name: expected a name no other tenant has"},
      {R"([{"name": "a", "adapter": {"rank": 300}}])",
       "tenants[0].adapter.rank: expected 0 (learner.lora_rank) to 256"},
      {R"([{"name": "a", "task": {"samples_per_prompt": 1}}])",
       "tenants[0] ('a'): task.samples_per_prompt: expected"},
      // What the coordinator would refuse only after the warm-start is refused at once.
      {R"([{"name": "a", "adapter": {"learning_rate": 2}}])",
       "tenants[0].adapter.learning_rate: expected 0 (learner.lr) or in (0, 1], found 2"},
      {R"([{"name": "a", "adapter": {"target_modules": ["q_proj", "lm_head"]}}])",
       "tenants[0].adapter.target_modules[1]: expected one of q_proj, k_proj"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<RunConfig> parsed = ParseRunConfig(head + c.tenants + "}", "t.json");
    ASSERT_FALSE(parsed.ok()) << c.tenants;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.message)) << c.tenants;
  }
}

// The run's bounds on adapters hold for its tenants: how many, and the default rank.
TEST(TenantsConfigTest, TenantsStayWithinTheRunsAdapterBounds) {
  absl::StatusOr<RunConfig> c = ParseRunConfig(
      R"({"coordinator": {"adapters": true, "max_adapters": 1}, "learner": {"lora_rank": 8},
          "tenants": [{"name": "a"}, {"name": "b"}]})",
      "t.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(),
              HasSubstr("tenants: expected at most coordinator.max_adapters (1) tenants, found 2"));
  c = ParseRunConfig(R"({"coordinator": {"adapters": true, "max_adapter_rank": 4},
                         "learner": {"lora_rank": 8}})",
                     "t.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(),
              HasSubstr("learner.lora_rank: expected at most coordinator.max_adapter_rank (4)"));
}

TEST(TenantsConfigTest, TenantsNeedARunOfAdapters) {
  absl::StatusOr<RunConfig> c =
      ParseRunConfig(R"({"learner": {"lora_rank": 8}, "tenants": [{"name": "a"}]})", "t.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(),
              HasSubstr("coordinator.adapters: expected true with tenants (each tenant trains its "
                        "own adapter), found false"));
}

TEST(TenantsConfigTest, ARunOfAdaptersCrossesNodesOverGrpcAndTheRemoteIngest) {
  absl::StatusOr<RunConfig> c = ParseRunConfig(
      R"({"coordinator": {"adapters": true}, "learner": {"lora_rank": 8},
          "broadcast": {"transport": "grpc", "address": "learner:50062"},
          "replay": {"address": "learner:50061"}})",
      "fleet.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->broadcast.transport, WeightTransport::kGrpc);
  EXPECT_EQ(c->replay.address, "learner:50061");
}

}  // namespace
}  // namespace prl::config
