// The roles built from a RunConfig (roles/): every setting reaches the object it configures,
// a CUDA setting this build or machine cannot honour fails naming the key, and the weight
// transport the learner publishes on is the one its actors subscribe to.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "config/run_config.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_server.h"
#include "core/device.h"
#include "core/group_id.h"
#include "replay/ingest_server.h"
#include "reward/reward_service.h"
#include "roles/coordinator_role.h"
#include "roles/device_settings.h"
#include "roles/learner_rank.h"
#include "roles/learner_role.h"
#include "roles/learner_step_sink.h"
#include "roles/replay_role.h"
#include "roles/reward_role.h"
#include "roles/weight_transports.h"
#include "tests/learner/learner_testing.h"
#include "weight_broadcast/shm_transport.h"
#include "weight_broadcast/versioning.h"
#include "tests/free_port.h"

namespace prl::roles {
namespace {

using ::prl::testing::FreePort;

using ::testing::HasSubstr;

// The message of a CUDA request on this machine, which has no GPU: a CPU-only build names the
// build option, a CUDA build says no GPU is visible.
std::string NoCudaHere() { return CudaCompiled() ? "usable CUDA GPU" : "-DPRL_CUDA=ON"; }

bool HasGpu() { return CudaDeviceCount() > 0; }

TEST(DeviceSettingsTest, TheActorEngineTakesEverySettingOfItsSection) {
  config::ActorsSection a;
  a.kv_cache_mb = 48;
  a.block_size = 8;
  a.max_num_seqs = 12;
  a.max_num_batched_tokens = 512;
  a.enable_prefix_caching = false;
  a.batch_invariant = true;
  a.cuda_graphs = false;
  absl::StatusOr<EngineOptions> o = ActorEngineOptions(a);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->device.is_cpu());
  EXPECT_EQ(o->dtype, DType::kF32);
  EXPECT_EQ(o->kv_cache_bytes, int64_t{48} << 20);
  EXPECT_EQ(o->block_size, 8);
  EXPECT_EQ(o->max_num_seqs, 12);
  EXPECT_EQ(o->max_num_batched_tokens, 512);
  EXPECT_FALSE(o->enable_prefix_caching);
  EXPECT_TRUE(o->batch_invariant);
  EXPECT_FALSE(o->cuda_graphs);
}

TEST(DeviceSettingsTest, ACudaRoleThatCannotRunHereNamesItsKey) {
  if (HasGpu()) GTEST_SKIP() << "this machine has a GPU";
  config::ActorsSection a;
  a.device = DeviceType::kCuda;
  absl::Status actor = ActorEngineOptions(a).status();
  EXPECT_EQ(actor.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(actor.message(), HasSubstr("actors.device = cuda:0"));
  EXPECT_THAT(actor.message(), HasSubstr(NoCudaHere()));
  config::LearnerSection l;
  l.device = DeviceType::kCuda;
  absl::Status learner = LearnerRankDevice(l, 0).status();
  EXPECT_THAT(learner.message(), HasSubstr("learner.device = cuda"));
  EXPECT_THAT(learner.message(), HasSubstr(NoCudaHere()));
  config::RunConfig run;
  run.learner.device = DeviceType::kCuda;
  EXPECT_THAT(CheckRoleDevices(run).message(), HasSubstr("learner.device"));
}

TEST(DeviceSettingsTest, LearnerRanksOnTheCpuIgnoreLocalRankButABadOneIsAnError) {
  config::LearnerSection l;
  setenv("LOCAL_RANK", "3", 1);
  absl::StatusOr<Device> d = LearnerRankDevice(l, 1);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->is_cpu());
  setenv("LOCAL_RANK", "x", 1);
  EXPECT_THAT(LearnerRankDevice(l, 1).status().message(),
              HasSubstr("LOCAL_RANK: expected an integer >= 0, found 'x'"));
  unsetenv("LOCAL_RANK");
}

TEST(LearnerRankTest, StepOptimizerAndAdvantageSettingsComeFromTheSection) {
  config::LearnerSection l;
  l.loss = learner::LossKind::kPpoClip;
  l.normalization = learner::LossNormalization::kSequenceMean;
  l.clip_low = 0.1;
  l.clip_high = 0.3;
  l.tis_cap = 3;
  l.micro_batch_tokens = 1024;
  l.optimizer = learner::OptimizerKind::kSgd;
  l.lr = 0.5;
  l.weight_decay = 0.01;
  l.beta1 = 0.8;
  l.beta2 = 0.9;
  l.max_grad_norm = 2;
  l.advantage = learner::AdvantageEstimator::kDrGrpo;
  l.drop_uniform_groups = true;
  absl::StatusOr<learner::StepConfig> step = StepConfigFrom(l, 0.7f);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->loss.kind, learner::LossKind::kPpoClip);
  EXPECT_EQ(step->loss.normalization, learner::LossNormalization::kSequenceMean);
  EXPECT_DOUBLE_EQ(step->loss.clip_low, 0.1);
  EXPECT_DOUBLE_EQ(step->loss.clip_high, 0.3);
  EXPECT_DOUBLE_EQ(step->loss.tis_cap, 3);
  EXPECT_EQ(step->micro_batch_tokens, 1024);
  EXPECT_FLOAT_EQ(step->temperature, 0.7f);
  absl::StatusOr<learner::OptimizerConfig> opt = OptimizerConfigFrom(l);
  ASSERT_TRUE(opt.ok()) << opt.status();
  EXPECT_EQ(opt->kind, learner::OptimizerKind::kSgd);
  EXPECT_DOUBLE_EQ(opt->lr, 0.5);
  EXPECT_DOUBLE_EQ(opt->weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(opt->beta1, 0.8);
  EXPECT_DOUBLE_EQ(opt->beta2, 0.9);
  EXPECT_DOUBLE_EQ(opt->max_grad_norm, 2);
  const learner::AdvantageConfig adv = AdvantageConfigFrom(l);
  EXPECT_FALSE(adv.scale_by_std);
  EXPECT_TRUE(adv.drop_uniform_groups);
}

TEST(RoleSettingsTest, TheCoordinatorLearnerAndReplayTakeTheirSections) {
  config::RunConfig c;
  c.run.dir = "/tmp/run-x";
  c.run.mode = config::RunMode::kSync;
  c.coordinator.lease_ms = 4321;
  c.coordinator.heartbeat_ms = 321;
  c.coordinator.max_samples_per_prompt = 77;
  c.learner.max_lag = 2;
  c.learner.groups_per_step = 3;
  c.learner.steps = 9;
  c.learner.checkpoint_every = 4;
  c.learner.keep_checkpoints = 6;
  c.replay.capacity_mb = 24;
  c.replay.lease_ms = 1234;
  c.replay.drop_oldest = true;
  EXPECT_THAT(CoordinatorConfigFrom(c).status().message(), HasSubstr("model.path is empty"));
  const learner::LearnerServiceOptions s = LearnerServiceOptionsFrom(c);
  EXPECT_EQ(s.groups_per_step, 3);
  EXPECT_EQ(s.max_lag, 2);
  EXPECT_EQ(s.max_steps, 9);
  EXPECT_EQ(s.checkpoint.dir, "/tmp/run-x/checkpoints");
  EXPECT_EQ(s.checkpoint.every, 4);
  EXPECT_EQ(s.checkpoint.keep_last, 6);
  const ReplayConfig r = ReplayConfigFrom(c);
  EXPECT_EQ(r.capacity_bytes, int64_t{24} << 20);
  EXPECT_EQ(r.lease_ms, 1234);
  EXPECT_EQ(r.backpressure, BackpressurePolicy::kDropOldest);
}

// An adapter's replay segment, sized from its lag budget (replay.adapter_capacity_mb 0): its
// lag budget's groups of the longest sequences the model allows fit at once (no writer waits),
// and the size stays within 4..32 MiB; a set replay.adapter_capacity_mb wins.
TEST(AdapterReplaySegmentTest, HoldsItsLagBudgetOfTheLongestGroupsTheModelAllows) {
  config::RunConfig c;
  c.run.name = absl::StrCat("adapter-seg-", getpid());
  c.learner.max_lag = 1;
  c.learner.groups_per_step = 4;
  c.task.samples_per_prompt = 8;
  ModelConfig model;
  model.num_hidden_layers = 2;
  model.max_position_embeddings = 64;  // the tiny model's: the floor
  EXPECT_EQ(AdapterReplayCapacityBytes(c, model), int64_t{4} << 20);
  model.max_position_embeddings = 1 << 20;  // a long context: the ceiling
  EXPECT_EQ(AdapterReplayCapacityBytes(c, model), int64_t{32} << 20);
  c.replay.adapter_capacity_mb = 7;
  EXPECT_EQ(AdapterReplayCapacityBytes(c, model), int64_t{7} << 20);
  c.replay.adapter_capacity_mb = 0;
  c.learner.groups_per_step = 0;  // no lag budget: the ceiling
  EXPECT_EQ(AdapterReplayCapacityBytes(c, model), int64_t{32} << 20);
  c.learner.groups_per_step = 4;

  model.max_position_embeddings = 4096;  // 8 samples of up to 4096 tokens, 8 groups in budget
  const int64_t bytes = AdapterReplayCapacityBytes(c, model);
  EXPECT_GT(bytes, int64_t{4} << 20);
  EXPECT_LT(bytes, int64_t{32} << 20);
  model.num_experts = 8;  // a MoE model's records carry its routes: more room
  model.num_experts_per_tok = 2;
  EXPECT_GT(AdapterReplayCapacityBytes(c, model), bytes);
  model.num_experts = model.num_experts_per_tok = 0;

  const std::string name = absl::StrCat("prl-", c.run.name, "-replay-adapter");
  ReplayBuffer::Remove(name, true).IgnoreError();
  auto buffer = ReplayBuffer::Create(name, AdapterReplayConfigFrom(c, model));
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ((*buffer)->Stats().capacity_bytes, bytes);
  const int64_t budget_groups = (c.learner.max_lag + 1) * c.learner.groups_per_step;
  for (int64_t g = 0; g < budget_groups; ++g) {
    std::vector<RolloutRecord> group(c.task.samples_per_prompt);
    for (uint32_t i = 0; i < group.size(); ++i) {
      RolloutRecord& r = group[i];
      r.run_id = c.run.name;
      r.prompt_set_id = std::string(255, 's');
      r.actor_id = std::string(255, 'a');
      r.prompt_index = static_cast<uint64_t>(g);
      r.group_id = static_cast<uint64_t>(g + 1);
      r.sample_index = i;
      r.group_size = static_cast<uint32_t>(group.size());
      r.prompt_tokens = {1};
      r.completion_tokens.assign(model.max_position_embeddings - 1, 2);
      r.behaviour_logprobs.assign(r.completion_tokens.size(), -0.5f);
      r.token_versions.assign(r.completion_tokens.size(), 0);
    }
    // No wait: a writer of the budget's groups never waits for the learner.
    ASSERT_TRUE((*buffer)->WriteGroup(group, absl::ZeroDuration()).ok()) << "group " << g;
  }
  EXPECT_EQ((*buffer)->Stats().writer_waits, 0);
  buffer->reset();
  ReplayBuffer::Remove(name, true).IgnoreError();
}

class WeightTransportFactoryTest : public ::testing::TestWithParam<config::WeightTransport> {};

// The learner's publisher and an actor's subscriber built from one config meet, and a
// published version arrives bit for bit.
TEST_P(WeightTransportFactoryTest, ThePublisherAndSubscriberOfOneConfigMeet) {
  config::RunConfig c;
  c.run.name = absl::StrCat("roles-test-", getpid(), "-", static_cast<int>(GetParam()));
  c.broadcast.transport = GetParam();
  c.broadcast.listen = "127.0.0.1:0";
  const ModelConfig model = learner::testing::TinyConfig();
  absl::StatusOr<WeightEndpoint> endpoint = StartWeightPublisher(c, model, Device::Cpu());
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  if (GetParam() != config::WeightTransport::kShm) {
    // Actors dial the port the publisher bound.
    const size_t at = endpoint->description.rfind("port ");
    ASSERT_NE(at, std::string::npos) << endpoint->description;
    c.broadcast.address = "127.0.0.1:" + endpoint->description.substr(at + 5);
  }
  absl::StatusOr<std::unique_ptr<WeightSubscriber>> subscriber =
      OpenWeightSubscriber(c, model, Device::Cpu());
  ASSERT_TRUE(subscriber.ok()) << subscriber.status();
  ParameterSet weights = *ParameterSet::Allocate(model, Device::Cpu(), false);
  InitializeParameters(weights, 3);
  absl::StatusOr<VersionedWeights> got;
  // The collective group forms once the subscriber has announced itself: publish until a
  // version arrives (latest wins).
  for (int v = 0; v < 60; ++v) {
    ASSERT_TRUE(endpoint->publisher->Publish(v, weights).ok());
    got = (*subscriber)->WaitNewer(-1, absl::Milliseconds(500));
    if (got.ok()) break;
  }
  ASSERT_TRUE(got.ok()) << got.status();
  const int64_t n = weights.layout.num_elements();
  ASSERT_EQ(got->weights->layout.num_elements(), n);
  EXPECT_EQ(std::memcmp(got->weights->data(), weights.data(), n * sizeof(float)), 0);
  subscriber->reset();
  endpoint->publisher.reset();
  RemoveWeightTransportState(c);
  EXPECT_FALSE(InspectShmWeightSegment(c.weight_segment()).ok()) << "nothing left in /dev/shm";
}

// A restarted learner's publisher knows the newest version the run's transport published
// (shm: its segment; grpc and nccl: the version file beside the checkpoints) before any actor
// reconnects, so the learner numbers on above it (FirstVersionToPublish).
TEST_P(WeightTransportFactoryTest, ARestartedPublisherKnowsTheNewestVersionOfItsRun) {
  config::RunConfig c;
  c.run.name = absl::StrCat("roles-restart-", getpid(), "-", static_cast<int>(GetParam()));
  c.run.dir = absl::StrCat(::testing::TempDir(), "/", c.run.name);
  c.broadcast.transport = GetParam();
  c.broadcast.listen = "127.0.0.1:0";
  const ModelConfig model = learner::testing::TinyConfig();
  ParameterSet weights = *ParameterSet::Allocate(model, Device::Cpu(), false);
  InitializeParameters(weights, 3);
  {
    absl::StatusOr<WeightEndpoint> first = StartWeightPublisher(c, model, Device::Cpu());
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_TRUE(first->publisher->Publish(11, weights).ok());
  }
  absl::StatusOr<WeightEndpoint> second = StartWeightPublisher(c, model, Device::Cpu());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->publisher->newest_version(), 11);
  EXPECT_EQ(FirstVersionToPublish(/*learner_version=*/4, second->publisher->newest_version()), 12);
  EXPECT_FALSE(second->publisher->Publish(5, weights).ok()) << "versions continue upwards";
  second->publisher.reset();
  RemoveWeightTransportState(c);
  std::filesystem::remove_all(c.run.dir);
}

INSTANTIATE_TEST_SUITE_P(Transports, WeightTransportFactoryTest,
                         ::testing::Values(config::WeightTransport::kShm,
                                           config::WeightTransport::kGrpc,
                                           config::WeightTransport::kNccl),
                         [](const auto& info) {
                           return std::string(EnumName(config::kWeightTransportNames, info.param));
                         });

TEST(CudaIpcTransportTest, WithoutAGpuTheFactoryGivesAClearError) {
  if (HasGpu()) GTEST_SKIP() << "this machine has a GPU";
  config::RunConfig c;
  c.run.name = absl::StrCat("roles-test-ipc-", getpid());
  c.broadcast.transport = config::WeightTransport::kCudaIpc;
  absl::StatusOr<WeightEndpoint> endpoint =
      StartWeightPublisher(c, learner::testing::TinyConfig(), Device::Cuda(0));
  ASSERT_FALSE(endpoint.ok());
  EXPECT_FALSE(endpoint.status().message().empty());
  RemoveWeightTransportState(c);
}

TEST(RewardRoleTest, ServesTheRunsTaskRewardToRemoteClients) {
  config::RunConfig c;
  c.task.reward = "arithmetic";
  c.task.credit = config::ArithmeticCredit::kDigits;
  EXPECT_EQ(TaskRewardSpec(c).params.at("credit"), "digits");
  c.task.reward = "exact_match";
  EXPECT_TRUE(TaskRewardSpec(c).params.empty());
  // A free port, then the role on it; a client scores through it.
  auto probe = reward::RewardServer::Start(
      [](absl::Span<const reward::RewardInput>) {
        return absl::StatusOr<std::vector<reward::RewardResult>>(
            std::vector<reward::RewardResult>{});
      },
      {.address = "127.0.0.1:0"});
  ASSERT_TRUE(probe.ok()) << probe.status();
  const int port = (*probe)->port();
  (*probe)->Shutdown();
  probe->reset();
  c.reward.listen = absl::StrCat("127.0.0.1:", port);
  std::atomic<bool> stop{false};
  absl::Status served;
  std::thread role([&] { served = RunRewardRole(c, stop); });
  auto client = reward::RemoteReward::Connect({.address = c.reward.listen, .max_attempts = 20});
  ASSERT_TRUE(client.ok()) << client.status();
  reward::RewardInput right, wrong;
  right.completion = "42";
  right.reference = "42";
  wrong.completion = "41";
  wrong.reference = "42";
  const reward::RewardInput inputs[] = {right, wrong};
  absl::StatusOr<std::vector<reward::RewardResult>> scored = (*client)->ScoreBatch(inputs);
  stop = true;
  role.join();
  ASSERT_TRUE(scored.ok()) << scored.status();
  ASSERT_EQ(scored->size(), 2u);
  EXPECT_EQ((*scored)[0].reward, 1.0);
  EXPECT_EQ((*scored)[1].reward, 0.0);
  EXPECT_TRUE(served.ok()) << served;
}

TEST(ReplayRoleTest, AdmitsOnlyGroupsOfThisRunWithAnOpenLease) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/prl_replay_role_", getpid());
  std::filesystem::create_directories(dir);
  coordinator::CoordinatorConfig cc;
  cc.log_path = dir + "/prompts.log";
  cc.vocab_size = 16;
  cc.max_position_embeddings = 32;
  cc.validate_reward = [](const v1::RewardSpec&) { return absl::OkStatus(); };
  auto coordinator = *coordinator::Coordinator::Open(cc);
  auto coordinator_server =
      *coordinator::CoordinatorServer::Start(coordinator.get(), "127.0.0.1:0");
  v1::SubmitPromptSetRequest submit;
  submit.add_prompts()->mutable_tokens()->add_ids(1);
  submit.add_prompts()->mutable_tokens()->add_ids(2);
  submit.set_samples_per_prompt(1);
  submit.mutable_sampling()->set_max_tokens(4);
  submit.mutable_sampling()->set_temperature(1.0f);
  submit.mutable_sampling()->set_top_p(1.0f);
  submit.mutable_reward()->set_name("exact_match");
  const std::string set_id = coordinator->Submit(submit)->prompt_set_id();
  const std::string actor = coordinator->RegisterActor("a")->actor_id();
  v1::LeaseRequest lease;
  lease.set_actor_id(actor);
  lease.set_max_prompts(1);
  auto leased = coordinator->Lease(lease);
  ASSERT_TRUE(leased.ok()) << leased.status();
  ASSERT_EQ(leased->prompts_size(), 1);

  config::RunConfig c;
  c.run.name = absl::StrCat("roles-test-", getpid());
  c.coordinator.listen = absl::StrCat("127.0.0.1:", coordinator_server->port());
  c.replay.listen = absl::StrCat("127.0.0.1:", FreePort());
  c.replay.capacity_mb = 4;
  ReplayBuffer::Remove(c.replay_segment(), true).IgnoreError();
  auto buffer = ReplayBuffer::Create(c.replay_segment(), ReplayConfigFrom(c));  // the learner's
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::atomic<bool> stop{false};
  absl::Status served;
  std::thread role([&] { served = RunReplayRole(c, "", stop); });
  auto client = ReplayPushClient::Connect(c.replay.listen);
  ASSERT_TRUE(client.ok()) << client.status();
  auto group = [&](const std::string& run, int64_t index, uint64_t group_id) {
    RolloutRecord r;
    r.run_id = run;
    r.prompt_set_id = set_id;
    r.actor_id = "a";
    r.prompt_index = static_cast<uint64_t>(index);
    r.group_id = group_id;
    r.group_size = 1;
    r.prompt_tokens = {1};
    r.completion_tokens = {3};
    r.behaviour_logprobs = {-0.5f};
    r.token_versions = {0};
    return std::vector<std::vector<RolloutRecord>>{{r}};
  };
  const v1::LeasedPrompt& open = leased->prompts(0);
  const uint64_t group_id = GroupIdOfLease(open.lease_id());
  PushResult result;
  // The role may still be starting: the first push retries until it is served.
  absl::Status pushed = absl::UnavailableError("not tried");
  for (int i = 0; i < 100 && absl::IsUnavailable(pushed); ++i) {
    pushed = (*client)->Push(group(c.run.name, open.prompt_index(), group_id), &result,
                             absl::Seconds(5));
    if (absl::IsUnavailable(pushed)) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(pushed.ok()) << pushed;
  const absl::Status guessed = (*client)->Push(group(c.run.name, open.prompt_index(), group_id + 1),
                                               &result, absl::Seconds(5));
  EXPECT_EQ(guessed.code(), absl::StatusCode::kFailedPrecondition) << guessed;
  const absl::Status unleased = (*client)->Push(
      group(c.run.name, 1 - open.prompt_index(), group_id), &result, absl::Seconds(5));
  EXPECT_EQ(unleased.code(), absl::StatusCode::kFailedPrecondition) << unleased;
  const absl::Status other_run = (*client)->Push(
      group("another-run", open.prompt_index(), group_id), &result, absl::Seconds(5));
  EXPECT_EQ(other_run.code(), absl::StatusCode::kPermissionDenied) << other_run;
  EXPECT_THAT(other_run.message(), HasSubstr("another-run"));

  // Exactly the admitted group is in the segment.
  TakeOptions take;
  take.max_groups = 8;
  auto taken = (*buffer)->Take(take);
  ASSERT_TRUE(taken.ok()) << taken.status();
  ASSERT_EQ(taken->size(), 1u);
  EXPECT_EQ((*taken)[0].Decode()->at(0).group_id, group_id);
  stop = true;
  role.join();
  buffer->reset();
  EXPECT_TRUE(served.ok()) << served;
  EXPECT_EQ(coordinator->Stats().rejected_groups, 2);
  ReplayBuffer::Remove(c.replay_segment(), true).IgnoreError();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace prl::roles

namespace prl::roles {
namespace {

// learner.drop_uniform_groups: the groups a learner drops before its first step would count
// against the lag budget until its first progress report; StepSink::Started makes it report
// from the start (LearnerServiceOptions::on_started), so the coordinator hears the resumed
// version before any step.
TEST(StepSinkTest, AfterStartedTheLearnersProgressReachesTheCoordinatorBeforeAnyStep) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/prl_step_sink_", getpid());
  std::filesystem::create_directories(dir);
  coordinator::CoordinatorConfig cc;
  cc.log_path = dir + "/prompts.log";
  cc.vocab_size = 16;
  cc.max_position_embeddings = 32;
  auto coordinator = *coordinator::Coordinator::Open(cc);
  auto server = *coordinator::CoordinatorServer::Start(coordinator.get(), "127.0.0.1:0");
  config::RunConfig c;
  c.run.name = absl::StrCat("step-sink-test-", getpid());
  c.coordinator.listen = absl::StrCat("127.0.0.1:", server->port());
  ReplayConfig rc;
  rc.capacity_bytes = 1 << 16;
  ReplayBuffer::Remove(c.replay_segment(), true).IgnoreError();
  auto buffer = ReplayBuffer::Create(c.replay_segment(), rc);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  prometheus::Registry registry;
  auto sink = StepSink::Create(c, registry, buffer->get());
  ASSERT_TRUE(sink.ok()) << sink.status();
  (*sink)->Started(3, 12);
  // The reporter's next round (every second) reports it: wait for that event.
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (coordinator->Stats().learner_version != 3 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(coordinator->Stats().learner_version, 3);
  EXPECT_EQ(coordinator->Stats().groups_consumed, 12);
  sink->reset();
  buffer->reset();
  ReplayBuffer::Remove(c.replay_segment(), true).IgnoreError();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace prl::roles
