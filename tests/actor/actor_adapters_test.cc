// A run of adapters on an actor (docs/tenants.md, actor/adapter_channels.h): against a real
// coordinator of adapters (gRPC on loopback), the actor serves each adapter its leases name from
// that adapter's own shared-memory segments (roles/adapter_segments.h), opened once the learner
// made them: every group lands in its adapter's replay segment, its tokens carry the adapter's
// version, and its behaviour log-probs are the learner's under that adapter bit for bit (the
// batch-invariant mode) while both adapters' prompts share the engine's batches. A lease that
// needs a newer version of its adapter waits for it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "actor/actor.h"
#include "actor/adapter_channels.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_server.h"
#include "model/lora.h"
#include "model/parameters.h"
#include "model/transformer.h"
#include "replay/replay_buffer.h"
#include "reward/verifiers.h"
#include "roles/adapter_segments.h"
#include "task/arithmetic_task.h"
#include "task/char_text_codec.h"
#include "task/char_tokenizer.h"
#include "tests/actor/actor_testing.h"
#include "weight_broadcast/shm_transport.h"

namespace prl::actor {
namespace {

namespace v1 = prl::v1;

// A trained-looking adapter (B random, not zero) of the coordinator's settings.
std::unique_ptr<LoraSet> TrainedAdapter(const ModelConfig& c, const v1::AdapterSpec& spec,
                                        uint64_t seed) {
  auto set = std::make_unique<LoraSet>(
      *LoraSet::Allocate(c, roles::LoraConfigOf(spec), Device::Cpu(), false));
  InitializeLora(*set, seed);
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<float> n(0.0f, 0.5f);
  for (const LoraEntry& e : set->layout.entries()) {
    if (e.is_a) continue;
    for (int64_t i = 0; i < e.numel; ++i) set->data()[e.offset + i] = n(rng);
  }
  return set;
}

// The learner's log-probs of a record's completion under the adapter (batch-invariant order).
std::vector<float> LearnerLogprobs(const ParameterSet& weights, const LoraSet& adapter,
                                   const RolloutRecord& r) {
  Transformer model(weights.config, Device::Cpu(),
                    {.reduction_order = kernels::ReductionOrder::kBatchInvariant});
  ModelParams params = weights.params;
  params.lora = &adapter.params;
  std::vector<int32_t> seq = r.prompt_tokens;
  seq.insert(seq.end(), r.completion_tokens.begin(), r.completion_tokens.end());
  PackedBatch batch;
  batch.AddScored(seq, static_cast<int64_t>(r.prompt_tokens.size()));
  std::vector<float> lp(batch.num_tokens());
  EXPECT_TRUE(model.Forward(params, batch, r.sampling.temperature, absl::MakeSpan(lp), false).ok());
  return std::vector<float>(lp.begin() + r.prompt_tokens.size() - 1, lp.end());
}

class ActorAdaptersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    run_.run.name = absl::StrCat("actor-adapters-", getpid());
    dir_ = std::filesystem::temp_directory_path() / run_.run.name;
    std::filesystem::remove_all(dir_);
    model_ = TinyCharModel();
    auto weights = ParameterSet::Allocate(model_, Device::Cpu(), false);
    ASSERT_TRUE(weights.ok());
    InitializeParameters(*weights, 7, 0.5f);
    weights_ = std::make_shared<const ParameterSet>(std::move(*weights));

    coordinator::CoordinatorConfig cc;
    cc.log_path = (dir_ / "prompts.log").string();
    cc.vocab_size = model_.vocab_size;
    cc.max_position_embeddings = model_.max_position_embeddings;
    cc.lease_ms = 5'000;
    cc.heartbeat_ms = 200;
    cc.sync = true;  // a lease asks for its adapter's newest version (LeasedAdapter.min_version)
    cc.text = std::make_shared<task::CharTextCodec>();
    cc.validate_reward = [](const v1::RewardSpec& spec) {
      reward::RewardSpec parsed{spec.name(), {spec.params().begin(), spec.params().end()}};
      return reward::MakeRewardFunction(parsed).status();
    };
    cc.adapters = true;
    cc.adapter_defaults.set_rank(4);
    cc.adapter_defaults.set_alpha(8);
    cc.adapter_defaults.add_target_modules("all-linear");
    coordinator_ = *coordinator::Coordinator::Open(cc);
    server_ = *coordinator::CoordinatorServer::Start(coordinator_.get(), "127.0.0.1:0");

    options_.coordinator = absl::StrCat("127.0.0.1:", server_->port());
    options_.name = "adapters-actor";
    options_.run_id = run_.run.name;
    options_.engine.kv_cache_bytes = 4 << 20;
    options_.engine.batch_invariant = true;
    options_.text = std::make_shared<task::CharTextCodec>();
    options_.adapters =
        std::make_shared<AdapterChannels>(roles::AdapterChannelOpener(run_, model_));
  }

  void TearDown() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    server_.reset();
    for (auto& [id, made] : made_) {
      made.publisher.reset();
      made.replay.reset();
      ReplayBuffer::Remove(roles::AdapterReplaySegment(run_, id), true).IgnoreError();
      std::filesystem::remove(std::filesystem::path("/dev/shm") /
                              roles::AdapterWeightSegment(run_, id));
    }
    std::filesystem::remove_all(dir_);
  }

  void StartActor() {
    // Every group goes to its adapter's segment: the run's own writer is never called.
    GroupWriter none = [](absl::Span<const RolloutRecord>) {
      return absl::InternalError("a group of no adapter");
    };
    auto a = Actor::Create(weights_, 0, std::move(none), nullptr, options_);
    ASSERT_TRUE(a.ok()) << a.status();
    actor_ = std::move(*a);
    thread_ = std::thread([this] { result_ = actor_->Run(&stop_); });
  }

  std::string Submit(const std::string& adapter, int prompts) {
    task::ArithmeticConfig tc;
    auto problems = task::GenerateProblems(tc, task::Split::kTrain, 3, prompts);
    EXPECT_TRUE(problems.ok());
    v1::SubmitPromptSetRequest r;
    for (const auto& p : *problems) {
      v1::Prompt* q = r.add_prompts();
      q->set_text(p.prompt);
      q->set_reference(p.answer);
    }
    r.set_samples_per_prompt(2);
    r.mutable_sampling()->set_temperature(1.0f);
    r.mutable_sampling()->set_top_p(1.0f);
    r.mutable_sampling()->set_max_tokens(6);
    r.mutable_reward()->set_name("arithmetic");
    r.mutable_adapter()->set_name(adapter);
    auto submitted = coordinator_->Submit(r);
    EXPECT_TRUE(submitted.ok()) << submitted.status();
    return submitted.ok() ? submitted->prompt_set_id() : "";
  }

  v1::AdapterStatus AdapterNamed(const std::string& name) {
    const v1::ListAdaptersResponse list = coordinator_->ListAdapters();
    for (const v1::AdapterStatus& a : list.adapters()) {
      if (a.spec().name() == name) return a;
    }
    ADD_FAILURE() << "no adapter " << name;
    return {};
  }

  // The learner's part: the adapter's segments, and a version of it published.
  struct Made {
    std::unique_ptr<ReplayBuffer> replay;
    std::unique_ptr<ShmWeightPublisher> publisher;
    std::map<int64_t, std::shared_ptr<LoraSet>> versions;
  };
  void Make(const v1::AdapterStatus& a) {
    Made& m = made_[a.adapter_id()];
    ReplayConfig rc;
    rc.capacity_bytes = 4 << 20;
    const std::string replay = roles::AdapterReplaySegment(run_, a.adapter_id());
    ReplayBuffer::Remove(replay, true).IgnoreError();
    m.replay = *ReplayBuffer::Create(replay, rc);
    auto publisher = ShmWeightPublisher::Create(roles::AdapterWeightSegment(run_, a.adapter_id()),
                                                WeightSpec(model_, roles::LoraConfigOf(a.spec())));
    ASSERT_TRUE(publisher.ok()) << publisher.status();
    m.publisher = *std::move(publisher);
  }
  void Publish(const v1::AdapterStatus& a, int64_t version, uint64_t seed) {
    Made& m = made_.at(a.adapter_id());
    std::shared_ptr<LoraSet> set = TrainedAdapter(model_, a.spec(), seed);
    ASSERT_TRUE(m.publisher->Publish(version, *set).ok());
    m.versions[version] = set;
  }

  bool WaitFor(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(120)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!done()) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return true;
  }
  bool Done(const std::string& set) {
    return coordinator_->Get(set)->state() == v1::PROMPT_SET_STATE_DONE;
  }

  std::vector<std::vector<RolloutRecord>> TakeAll(const std::string& adapter_id) {
    std::vector<std::vector<RolloutRecord>> groups;
    TakeOptions take;
    take.max_groups = 64;
    ReplayBuffer& replay = *made_.at(adapter_id).replay;
    for (;;) {
      auto taken = replay.Take(take);
      EXPECT_TRUE(taken.ok());
      if (!taken.ok() || taken->empty()) break;
      for (const LeasedGroup& g : *taken) {
        auto records = g.Decode();
        EXPECT_TRUE(records.ok()) << records.status();
        groups.push_back(*records);
        EXPECT_TRUE(replay.Ack(g).ok());
      }
    }
    return groups;
  }

  config::RunConfig run_;
  std::filesystem::path dir_;
  ModelConfig model_;
  std::shared_ptr<const ParameterSet> weights_;
  std::unique_ptr<coordinator::Coordinator> coordinator_;
  std::unique_ptr<coordinator::CoordinatorServer> server_;
  std::map<std::string, Made> made_;
  ActorOptions options_;
  std::unique_ptr<Actor> actor_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  absl::Status result_;
};

TEST_F(ActorAdaptersTest, EachAdaptersGroupsGoToItsSegmentsWithItsVersionAndItsBits) {
  ASSERT_NO_FATAL_FAILURE(StartActor());
  const std::string math_set = Submit("math", 3);
  const std::string code_set = Submit("code", 3);
  const v1::AdapterStatus math = AdapterNamed("math"), code = AdapterNamed("code");
  // The actor holds the leases before the learner has made the adapters: they wait for them.
  ASSERT_TRUE(WaitFor([&] { return coordinator_->Stats().prompts_in_flight == 6; }));
  Make(math);
  Make(code);
  Publish(math, 0, 41);
  Publish(code, 0, 42);
  ASSERT_TRUE(WaitFor([&] { return Done(math_set) && Done(code_set); }));
  // A newer version of math: the learner reports it, so the next lease of math asks for it.
  Publish(math, 3, 43);
  v1::LearnerProgressRequest progress;
  v1::AdapterProgress* p = progress.add_adapters();
  p->set_adapter_id(math.adapter_id());
  p->set_version(3);
  ASSERT_TRUE(coordinator_->LearnerProgress(progress).ok());
  const std::string math_again = Submit("math", 2);
  ASSERT_TRUE(WaitFor([&] { return Done(math_again); }));
  stop_ = true;
  thread_.join();
  ASSERT_TRUE(result_.ok()) << result_;

  int64_t checked = 0;
  for (const v1::AdapterStatus* a : {&math, &code}) {
    const Made& made = made_.at(a->adapter_id());
    const Made& other = made_.at((a == &math ? code : math).adapter_id());
    std::vector<std::vector<RolloutRecord>> groups = TakeAll(a->adapter_id());
    EXPECT_EQ(groups.size(), a == &math ? 5u : 3u) << a->spec().name();
    for (const std::vector<RolloutRecord>& g : groups) {
      for (const RolloutRecord& r : g) {
        // Its own adapter's sets only, every token of the version its lease needed.
        const int64_t version = r.prompt_set_id == math_again ? 3 : 0;
        EXPECT_EQ(r.prompt_set_id == code_set, a == &code) << r.prompt_set_id;
        for (int64_t v : r.token_versions) EXPECT_EQ(v, version) << r.prompt_set_id;
        // The learner's log-probs under that adapter and version, bit for bit; not the other's.
        const std::vector<float> want = LearnerLogprobs(*weights_, *made.versions.at(version), r);
        ASSERT_EQ(want, r.behaviour_logprobs) << a->spec().name() << " " << r.prompt_set_id;
        EXPECT_NE(LearnerLogprobs(*weights_, *other.versions.at(0), r), r.behaviour_logprobs);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 2 * (3 + 3 + 2));
}

}  // namespace
}  // namespace prl::actor

namespace prl::actor {
namespace {

// An adapter whose versions never come (its learner never made it, or it was deleted) costs
// only its own prompts: they are given back when the wait ends (here at once) and fail after
// coordinator.max_attempts with the reason, while another adapter's set completes and the actor
// goes on. When the learner removes an adapter's segments, the actor closes its channel.
TEST_F(ActorAdaptersTest, AnAdapterThatNeverArrivesCostsOnlyItsOwnPromptsAndAGoneOneIsClosed) {
  const std::string math_set = Submit("math", 2);
  const v1::AdapterStatus math = AdapterNamed("math");
  Make(math);
  Publish(math, 0, 51);
  options_.weight_wait_timeout = absl::ZeroDuration();
  ASSERT_NO_FATAL_FAILURE(StartActor());
  const std::string ghost_set = Submit("ghost", 1);
  ASSERT_TRUE(WaitFor([&] {
    return Done(math_set) && coordinator_->Get(ghost_set)->state() == v1::PROMPT_SET_STATE_DONE;
  }));
  const v1::PromptSetStatus ghost = *coordinator_->Get(ghost_set);
  EXPECT_EQ(ghost.prompts_failed(), 1);
  ASSERT_EQ(ghost.failed_prompts_size(), 1);
  EXPECT_NE(ghost.failed_prompts(0).reason().find("has not arrived"), std::string::npos)
      << ghost.failed_prompts(0).reason();
  EXPECT_EQ(coordinator_->Get(math_set)->prompts_done(), 2);
  // The learner removes math's segments (it was deleted): the actor closes its channel.
  ASSERT_EQ(options_.adapters->open(), std::vector<std::string>{math.adapter_id()});
  made_.at(math.adapter_id()).publisher.reset();
  ASSERT_TRUE(RemoveShmWeightSegment(roles::AdapterWeightSegment(run_, math.adapter_id())).ok());
  ASSERT_TRUE(WaitFor([&] { return options_.adapters->open().empty(); }));
  stop_ = true;
  thread_.join();
  EXPECT_TRUE(result_.ok()) << result_;
}

}  // namespace
}  // namespace prl::actor
