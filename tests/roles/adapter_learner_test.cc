// A run of adapters end to end in one process, as `prl run` starts its roles (docs/tenants.md):
// a coordinator of adapters, the learner role (roles/adapter_learner.h: one trainer per
// adapter on one frozen base) and the actor role, over real gRPC and shared memory. Each
// adapter's sets train that adapter alone: its versions advance and its checkpoints are
// written under its own directory; deleting an adapter stops its trainer and removes its
// segments while the other adapter trains on. Across nodes (broadcast.transport grpc and the
// replay role's remote ingest) the same holds with no adapter's versions in shared memory.
#include "roles/adapter_learner.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "checkpoint/hf_model_dir.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_server.h"
#include "model/parameters.h"
#include "replay/replay_buffer.h"
#include "roles/actor_role.h"
#include "roles/adapter_segments.h"
#include "roles/replay_role.h"
#include "tests/actor/actor_testing.h"
#include "tests/free_port.h"
#include "tests/metrics/http_test_client.h"
#include "weight_broadcast/shm_transport.h"

namespace prl::roles {
namespace {

namespace v1 = prl::v1;
namespace fs = std::filesystem;

class AdapterLearnerTest : public ::testing::Test {
 protected:
  void SetUp() override { SetUpWith(/*learner_ranks=*/1); }
  void SetUpWith(int learner_ranks) {
    dir_ = fs::temp_directory_path() / absl::StrCat("prl-adapter-learner-", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    auto weights = ParameterSet::Allocate(actor::TinyCharModel(), Device::Cpu(), false);
    ASSERT_TRUE(weights.ok());
    InitializeParameters(*weights, 3, 0.5f);
    ASSERT_TRUE(SaveModel((dir_ / "model").string(), *weights).ok());

    coordinator::CoordinatorConfig cc;
    cc.log_path = (dir_ / "prompts.log").string();
    cc.vocab_size = 22;
    cc.max_position_embeddings = 64;
    cc.validate_reward = [](const v1::RewardSpec&) { return absl::OkStatus(); };
    cc.adapters = true;
    cc.adapter_defaults.set_rank(4);
    cc.adapter_defaults.set_alpha(8);
    cc.adapter_defaults.add_target_modules("all-linear");
    cc.adapter_defaults.set_learning_rate(1e-2);
    cc.max_lag = 2;
    cc.groups_per_step = 2;
    cc.learner_ranks = learner_ranks;
    coordinator_ = *coordinator::Coordinator::Open(cc);
    server_ = *coordinator::CoordinatorServer::Start(coordinator_.get(), "127.0.0.1:0");

    c_.run.name = absl::StrCat("adapter-learner-", getpid());
    c_.run.dir = (dir_ / "run").string();
    c_.model.path = (dir_ / "model").string();
    c_.coordinator.listen = absl::StrCat("127.0.0.1:", server_->port());
    c_.coordinator.adapters = true;
    c_.learner.lora_rank = 4;
    c_.learner.lora_alpha = 8;
    c_.learner.lora_targets = "all-linear";
    c_.learner.groups_per_step = 2;
    c_.learner.max_lag = 2;
    c_.learner.checkpoint_every = 1;
    c_.learner.world_size = learner_ranks;
    c_.actors.max_prompts_in_flight = 4;
    c_.actors.kv_cache_mb = 4;
  }
  void TearDown() override {
    stop_ = true;
    if (actor_.joinable()) actor_.join();
    if (learner_.joinable()) learner_.join();
    if (second_learner_.joinable()) second_learner_.join();
    if (replay_.joinable()) replay_.join();
    if (second_replay_.joinable()) second_replay_.join();
    EXPECT_TRUE(second_learned_.ok()) << "learner rank 1: " << second_learned_;
    EXPECT_TRUE(second_replayed_.ok()) << "replay beside rank 1: " << second_replayed_;
    EXPECT_TRUE(learned_.ok()) << "learner: " << learned_;
    EXPECT_TRUE(replayed_.ok()) << "replay: " << replayed_;
    EXPECT_TRUE(acted_.ok()) << "actor: " << acted_;
    // A learner leaves its adapters' segments for its successor: the test removes them.
    const v1::ListAdaptersResponse adapters = coordinator_->ListAdapters();
    for (const v1::AdapterStatus& a : adapters.adapters()) {
      ReplayBuffer::Remove(AdapterReplaySegment(c_, a.adapter_id()), true).IgnoreError();
      RemoveShmWeightSegment(AdapterWeightSegment(c_, a.adapter_id())).IgnoreError();
    }
    server_.reset();
    coordinator_.reset();
    fs::remove_all(dir_);
  }

  void Start() {
    collective::RendezvousConfig rendezvous;
    rendezvous.file_store_dir = (dir_ / "store").string();
    rendezvous.world_size = c_.learner.world_size;
    fs::create_directories(rendezvous.file_store_dir);
    for (int rank = 0; rank < 2; ++rank) {  // each rank's node: its own addresses, if any
      node_[rank] = c_;
      if (on_node_) on_node_(node_[rank], rank);
    }
    learner_ = std::thread([this, rendezvous] {
      learned_ = RunAdapterLearner(node_[0], rendezvous, stop_);
      ended_ = true;
    });
    if (c_.learner.world_size == 2) {  // the second rank, in this process too
      second_learner_ = std::thread([this, rendezvous]() mutable {
        rendezvous.rank = 1;
        second_learned_ = RunAdapterLearner(node_[1], rendezvous, stop_);
        ended_ = true;
      });
    }
    actor_ = std::thread([this] {
      acted_ = RunActorRole(c_, {"actor-0"}, stop_);
      ended_ = true;
    });
    if (!c_.replay.address.empty()) {  // the replay role beside the learner (beside each rank's)
      replay_config_[0] = node_[0];
      if (replay_metrics_port_[0] > 0) {
        replay_config_[0].metrics.listen = absl::StrCat("127.0.0.1:", replay_metrics_port_[0]);
      }
      replay_ = std::thread([this] {
        replayed_ = RunReplayRole(replay_config_[0], "", stop_);
        ended_ = true;
      });
    }
    if (!c_.replay.address.empty() && on_node_ && c_.learner.world_size == 2) {
      replay_config_[1] = node_[1];
      if (replay_metrics_port_[1] > 0) {
        replay_config_[1].metrics.listen = absl::StrCat("127.0.0.1:", replay_metrics_port_[1]);
      }
      second_replay_ = std::thread([this] {
        second_replayed_ = RunReplayRole(replay_config_[1], "", stop_);
        ended_ = true;
      });
    }
  }

  std::string Submit(const std::string& adapter, int prompts, int samples = 4) {
    v1::SubmitPromptSetRequest r;
    for (int i = 0; i < prompts; ++i) {
      v1::Prompt* p = r.add_prompts();
      p->mutable_tokens()->add_ids(1 + i % 7);
      p->mutable_tokens()->add_ids(2 + i % 5);
      p->set_reference("3");
    }
    r.set_samples_per_prompt(samples);
    r.mutable_sampling()->set_temperature(1.0f);
    r.mutable_sampling()->set_top_p(1.0f);
    r.mutable_sampling()->set_max_tokens(4);
    r.mutable_reward()->set_name("exact_match");
    r.mutable_adapter()->set_name(adapter);
    auto submitted = coordinator_->Submit(r);
    EXPECT_TRUE(submitted.ok()) << submitted.status();
    return submitted.ok() ? submitted->prompt_set_id() : "";
  }

  v1::AdapterStatus Adapter(const std::string& name) {
    const v1::ListAdaptersResponse list = coordinator_->ListAdapters();
    for (const v1::AdapterStatus& a : list.adapters()) {
      if (a.spec().name() == name) return a;
    }
    return {};
  }

  // Waits until math and code both reach `version`; says where they are otherwise.
  ::testing::AssertionResult BothReach(int64_t version) {
    if (WaitFor([&] {
          return Adapter("math").version() >= version && Adapter("code").version() >= version;
        })) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure()
           << "math " << Adapter("math").version() << ", code " << Adapter("code").version()
           << (ended_ ? " (a role ended)" : "");
  }

  bool WaitFor(const std::function<bool()>& done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(300);
    while (!done()) {
      // A role that ended says why below (one that ended after it was done is fine).
      if (absl::Now() > deadline || ended_) return done();
      absl::SleepFor(absl::Milliseconds(20));
    }
    return true;
  }

  fs::path dir_;
  config::RunConfig c_;
  std::unique_ptr<coordinator::Coordinator> coordinator_;
  std::unique_ptr<coordinator::CoordinatorServer> server_;
  std::atomic<bool> stop_{false}, ended_{false};
  // Each learner rank's config (c_ with on_node_'s changes: a node's own addresses), and the
  // replay role's beside it.
  std::function<void(config::RunConfig& node, int rank)> on_node_;
  config::RunConfig node_[2], replay_config_[2];
  int replay_metrics_port_[2] = {0, 0};  // the replay roles' /metrics (0: any free port)
  std::thread learner_, second_learner_, actor_, replay_, second_replay_;
  absl::Status learned_, second_learned_, acted_, replayed_, second_replayed_;
};

TEST_F(AdapterLearnerTest, EachAdapterTrainsOnItsOwnSetsAndADeletedOneIsFreed) {
  Start();
  Submit("math", 12);
  Submit("code", 12);
  // Each adapter steps on its own groups: both reach version 3 (the learner reports each).
  ASSERT_TRUE(BothReach(3));
  const v1::AdapterStatus math = Adapter("math"), code = Adapter("code");
  EXPECT_EQ(math.groups_consumed() % 2, 0);  // whole steps of 2 groups
  for (const v1::AdapterStatus* a : {&math, &code}) {
    const fs::path checkpoints = fs::path(c_.checkpoint_dir()) / "adapters" / a->adapter_id();
    EXPECT_TRUE(fs::exists(checkpoints)) << checkpoints;
  }
  // Deleting code: its trainer stops and its segments are removed; math trains on.
  const fs::path code_weights = fs::path("/dev/shm") / AdapterWeightSegment(c_, code.adapter_id());
  ASSERT_TRUE(fs::exists(code_weights));
  ASSERT_TRUE(coordinator_->DeleteAdapter("code").ok());
  ASSERT_TRUE(WaitFor([&] { return !fs::exists(code_weights); }));
  const int64_t before = Adapter("math").version();
  Submit("math", 8);
  ASSERT_TRUE(WaitFor([&] { return Adapter("math").version() >= before + 2; }));
}

// learner.adapter_pass_tokens 0: the adapters step in turns, each with its own passes, on the
// rank's one step thread (the path CUDA takes), and both still learn on their own groups.
TEST_F(AdapterLearnerTest, InTurnsWithoutJointPassesEachAdapterTrainsOnItsOwnSets) {
  c_.learner.adapter_pass_tokens = 0;
  Start();
  Submit("math", 12);
  Submit("code", 12);
  ASSERT_TRUE(BothReach(3));
  EXPECT_EQ(Adapter("math").groups_consumed() % 2, 0);  // whole steps of 2 groups
  EXPECT_EQ(Adapter("code").groups_consumed() % 2, 0);
}

// Actors on another node: each adapter's versions stream from the learner's gRPC weight server
// (no weight segment of any adapter), its groups go through the replay role's remote ingest into
// its own replay, and deleting an adapter stops its stream while the other trains on.
TEST_F(AdapterLearnerTest, AcrossNodesVersionsTravelOverGrpcAndGroupsThroughTheIngest) {
  c_.broadcast.transport = config::WeightTransport::kGrpc;
  c_.broadcast.listen = absl::StrCat("127.0.0.1:", ::prl::testing::FreePort());
  c_.replay.listen = absl::StrCat("127.0.0.1:", ::prl::testing::FreePort());
  c_.replay.address = c_.replay.listen;
  ASSERT_TRUE(config::ValidateRunConfig(c_).ok()) << config::ValidateRunConfig(c_);
  Start();
  Submit("math", 12);
  Submit("code", 12);
  ASSERT_TRUE(BothReach(3));
  const v1::AdapterStatus math = Adapter("math"), code = Adapter("code");
  for (const v1::AdapterStatus* a : {&math, &code}) {
    EXPECT_FALSE(fs::exists(fs::path("/dev/shm") / AdapterWeightSegment(c_, a->adapter_id())))
        << "versions over gRPC, not shared memory";
    EXPECT_TRUE(fs::exists(fs::path(c_.checkpoint_dir()) / "adapters" / a->adapter_id() /
                           "weight_version"))
        << "each adapter's newest version kept for a restarted learner";
  }
  // The coordinator refused no group: every one entered its own adapter's replay.
  EXPECT_EQ(coordinator_->Stats().rejected_groups, 0);
  const fs::path code_replay = fs::path("/dev/shm") / AdapterReplaySegment(c_, code.adapter_id());
  ASSERT_TRUE(fs::exists(code_replay));
  ASSERT_TRUE(coordinator_->DeleteAdapter("code").ok());
  ASSERT_TRUE(WaitFor([&] { return !fs::exists(code_replay); }));
  const int64_t before = Adapter("math").version();
  Submit("math", 8);
  ASSERT_TRUE(WaitFor([&] { return Adapter("math").version() >= before + 2; }));
}

// Two learner ranks (learner.world_size 2, one node): the coordinator places math on rank 0 and
// code on rank 1, and each rank trains the adapter placed on it (its own trainer over a world of
// one, the base file shared): both advance, and a deleted adapter's rank frees it.
class TwoRankAdapterLearnerTest : public AdapterLearnerTest {
 protected:
  void SetUp() override { SetUpWith(/*learner_ranks=*/2); }
};

TEST_F(TwoRankAdapterLearnerTest, EachRankTrainsTheAdaptersPlacedOnIt) {
  ASSERT_TRUE(config::ValidateRunConfig(c_).ok()) << config::ValidateRunConfig(c_);
  Start();
  Submit("math", 12);
  Submit("code", 12);
  ASSERT_TRUE(BothReach(3));
  EXPECT_EQ(Adapter("math").learner_rank(), 0);
  EXPECT_EQ(Adapter("code").learner_rank(), 1);
  const fs::path code_replay =
      fs::path("/dev/shm") / AdapterReplaySegment(c_, Adapter("code").adapter_id());
  ASSERT_TRUE(coordinator_->DeleteAdapter("code").ok());
  ASSERT_TRUE(WaitFor([&] { return !fs::exists(code_replay); })) << "rank 1 removes its segments";
  Submit("late", 8);  // placed on rank 1 again (the least loaded)
  ASSERT_TRUE(WaitFor([&] { return Adapter("late").version() >= 2; }));
  EXPECT_EQ(Adapter("late").learner_rank(), 1);
}

// Each rank on a node of its own (learner.world_size 2, broadcast.transport grpc): rank r's
// weight server and the replay ingest beside it listen on a host of their own (127.0.r.1), and
// the actor reaches them through {rank} in broadcast.address and replay.address. Each adapter's
// versions come from the rank it is placed on (the other rank never makes it: a stream from
// there would wait for ever and the adapter would never step), and its groups go through that
// rank's ingest: math's groups have 4 samples and code's 2, and each ingest wrote only groups of
// its own adapter's size, every prompt's at least.
TEST_F(TwoRankAdapterLearnerTest, AcrossNodesEachAdaptersVersionsAndGroupsGoToItsRanksServers) {
  c_.broadcast.transport = config::WeightTransport::kGrpc;
  c_.broadcast.address = absl::StrCat("127.0.{rank}.1:", ::prl::testing::FreePort());
  c_.replay.address = absl::StrCat("127.0.{rank}.1:", ::prl::testing::FreePort());
  ASSERT_TRUE(config::ValidateRunConfig(c_).ok()) << config::ValidateRunConfig(c_);
  on_node_ = [this](config::RunConfig& node, int rank) {
    node.broadcast.listen = config::AtLearnerRank(c_.broadcast.address, rank);
    node.replay.listen = config::AtLearnerRank(c_.replay.address, rank);
  };
  replay_metrics_port_[0] = ::prl::testing::FreePort();
  replay_metrics_port_[1] = ::prl::testing::FreePort();
  Start();
  Submit("math", 12, /*samples=*/4);
  Submit("code", 8, /*samples=*/2);
  ASSERT_TRUE(BothReach(3));
  EXPECT_EQ(Adapter("math").learner_rank(), 0);
  EXPECT_EQ(Adapter("code").learner_rank(), 1);
  // What each ingest wrote: prl_replay_ingest_groups_total and _records_total.
  const auto ingested = [&](int rank) {
    std::pair<double, double> groups_records = {-1, -1};
    absl::StatusOr<std::string> page = metrics::HttpGet(replay_metrics_port_[rank], "/metrics");
    if (!page.ok()) return groups_records;
    for (absl::string_view line : absl::StrSplit(*page, '\n')) {
      double value = 0;
      const size_t space = line.rfind(' ');
      if (space == absl::string_view::npos || !absl::SimpleAtod(line.substr(space + 1), &value)) {
        continue;
      }
      if (absl::StartsWith(line, "prl_replay_ingest_groups_total ")) groups_records.first = value;
      if (absl::StartsWith(line, "prl_replay_ingest_records_total ")) {
        groups_records.second = value;
      }
    }
    return groups_records;
  };
  ASSERT_TRUE(WaitFor([&] { return ingested(0).first >= 12 && ingested(1).first >= 8; }))
      << "rank 0's ingest wrote " << ingested(0).first << " groups, rank 1's " << ingested(1).first;
  const auto [groups0, records0] = ingested(0);
  const auto [groups1, records1] = ingested(1);
  EXPECT_EQ(records0, 4 * groups0) << "rank 0's ingest wrote only math's groups";
  EXPECT_EQ(records1, 2 * groups1) << "rank 1's ingest wrote only code's groups";
  EXPECT_EQ(coordinator_->Stats().rejected_groups, 0);
  for (const char* name : {"math", "code"}) {
    EXPECT_FALSE(
        fs::exists(fs::path("/dev/shm") / AdapterWeightSegment(c_, Adapter(name).adapter_id())))
        << name << "'s versions over gRPC, not shared memory";
  }
}

// Segments of an adapter deleted while no learner ran (the learner removes a deleted adapter's
// segments when it hears of the deletion): the next learner removes them when it first hears
// which adapters live, and keeps the live ones'.
TEST_F(AdapterLearnerTest, AStartingLearnerRemovesTheSegmentsOfAdaptersDeletedWhileItWasDown) {
  const std::string leaked = AdapterReplaySegment(c_, "ad-0123456789ab");
  auto left = ReplayBuffer::Create(leaked, ReplayConfigFrom(c_));
  ASSERT_TRUE(left.ok()) << left.status();
  left->reset();
  ASSERT_TRUE(fs::exists(fs::path("/dev/shm") / leaked));
  Submit("math", 4);
  Start();
  ASSERT_TRUE(WaitFor([&] { return Adapter("math").version() >= 1; }));
  EXPECT_FALSE(fs::exists(fs::path("/dev/shm") / leaked));
  EXPECT_TRUE(
      fs::exists(fs::path("/dev/shm") / AdapterReplaySegment(c_, Adapter("math").adapter_id())));
}

// prl run's tenants: the learner ends by itself once every tenant's adapter has taken its
// learner.steps steps, and not before: after code's steps alone it still trains math (had it
// ended, math would never step).
TEST_F(AdapterLearnerTest, WithTenantsTheLearnerEndsOnceEveryTenantTookItsSteps) {
  c_.learner.steps = 2;
  c_.tenants.resize(2);
  c_.tenants[0].name = "math";
  c_.tenants[1].name = "code";
  Submit("code", 12);
  Start();
  ASSERT_TRUE(WaitFor([&] { return Adapter("code").version() >= 2; }));
  Submit("math", 12);
  ASSERT_TRUE(WaitFor([&] { return Adapter("math").version() >= 2; }))
      << "the learner ended before math took its steps";
  learner_.join();  // it ends by itself
  EXPECT_TRUE(learned_.ok()) << learned_;
  EXPECT_EQ(Adapter("math").version(), 2);
  EXPECT_EQ(Adapter("code").version(), 2);
}

}  // namespace
}  // namespace prl::roles
