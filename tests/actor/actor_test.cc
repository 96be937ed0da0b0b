// The actor against a real coordinator (gRPC on loopback), a real shared-memory replay buffer
// and a real shared-memory weight broadcaster, in one process.
#include "actor/actor.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_server.h"
#include "reward/verifiers.h"
#include "task/arithmetic_task.h"
#include "task/char_text_codec.h"
#include "task/char_tokenizer.h"
#include "tests/actor/actor_testing.h"
#include "weight_broadcast/shm_transport.h"

namespace prl::actor {
namespace {

namespace v1 = prl::v1;

class ActorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tag_ = absl::StrCat("prl-actor-test-", getpid(), "-", n_++);
    dir_ = std::filesystem::temp_directory_path() / tag_;
    std::filesystem::remove_all(dir_);
    config_ = TinyCharModel();
    if (moe_) {  // Qwen3-MoE: 4 experts, top 2
      SetArchitecture(Architecture::kQwen3Moe, /*attention_bias=*/false, &config_);
      config_.num_experts = 4;
      config_.num_experts_per_tok = 2;
      config_.moe_intermediate_size = 16;
    }
    auto weights = ParameterSet::Allocate(config_, Device::Cpu(), false);
    ASSERT_TRUE(weights.ok());
    InitializeParameters(*weights, 7, 0.5f);
    weights_ = std::make_shared<const ParameterSet>(std::move(*weights));

    coordinator::CoordinatorConfig cc;
    cc.log_path = (dir_ / "prompts.log").string();
    cc.vocab_size = config_.vocab_size + coordinator_vocab_extra_;
    cc.max_position_embeddings = config_.max_position_embeddings;
    cc.lease_ms = lease_ms_;
    cc.heartbeat_ms = 200;
    cc.text = std::make_shared<task::CharTextCodec>();
    cc.reward_addresses = {"127.0.0.1:1"};  // nobody serves it
    cc.env_addresses = {"127.0.0.1:1"};     // nor this
    cc.validate_reward = [](const v1::RewardSpec& spec) {
      reward::RewardSpec parsed{spec.name(), {spec.params().begin(), spec.params().end()}};
      return reward::MakeRewardFunction(parsed).status();
    };
    coordinator_ = *coordinator::Coordinator::Open(cc);
    server_ = *coordinator::CoordinatorServer::Start(coordinator_.get(), "127.0.0.1:0");

    ReplayConfig rc;
    rc.capacity_bytes = 16 << 20;
    ReplayBuffer::Remove(tag_, true).IgnoreError();
    replay_ = *ReplayBuffer::Create(tag_, rc);
    publisher_ = *ShmWeightPublisher::Create(tag_ + "-weights", config_);
    subscriber_ = *ShmWeightSubscriber::Open(tag_ + "-weights", config_);

    options_.coordinator = absl::StrCat("127.0.0.1:", server_->port());
    options_.name = "test-actor";
    options_.run_id = "run-1";
    options_.engine.kv_cache_bytes = 4 << 20;
    options_.text = std::make_shared<task::CharTextCodec>();
  }

  void TearDown() override {
    StopActor();
    server_.reset();
    replay_.reset();
    ReplayBuffer::Remove(tag_, true).IgnoreError();
    subscriber_.reset();
    publisher_.reset();
    std::filesystem::remove(std::filesystem::path("/dev/shm") / (tag_ + "-weights"));
    std::filesystem::remove_all(dir_);
  }

  void StartActor(GroupWriter writer = nullptr) {
    if (!writer) writer = LocalReplayWriter(replay_.get(), absl::Seconds(10));
    auto a = Actor::Create(weights_, 0, std::move(writer), subscriber_.get(), options_);
    ASSERT_TRUE(a.ok()) << a.status();
    actor_ = std::move(*a);
    thread_ = std::thread([this] { result_ = actor_->Run(&stop_); });
  }
  void StopActor() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  std::string Submit(int prompts, int samples, const std::string& reward = "arithmetic",
                     std::map<std::string, std::string> params = {}, int64_t eval_every = 0) {
    task::ArithmeticConfig tc;
    auto problems = task::GenerateProblems(tc, task::Split::kTrain, 3, prompts);
    EXPECT_TRUE(problems.ok());
    v1::SubmitPromptSetRequest r;
    for (const auto& p : *problems) {
      v1::Prompt* q = r.add_prompts();
      q->set_text(p.prompt);
      q->set_reference(p.answer);
    }
    r.set_samples_per_prompt(samples);
    r.mutable_sampling()->set_temperature(1.0f);
    r.mutable_sampling()->set_top_p(1.0f);
    r.mutable_sampling()->set_max_tokens(5);
    r.mutable_sampling()->add_stop_token_ids(task::CharTokenizer().eos_id());
    r.mutable_reward()->set_name(reward);
    for (const auto& [k, v] : params) (*r.mutable_reward()->mutable_params())[k] = v;
    r.mutable_eval()->set_every_versions(eval_every);
    auto submitted = coordinator_->Submit(r);
    EXPECT_TRUE(submitted.ok()) << submitted.status();
    return submitted->prompt_set_id();
  }

  // Agentic episodes: `prompts` prompts (text "(1-100)=") whose reference is the secret, run
  // against `env`.
  std::string SubmitEpisodes(int prompts, int samples, const v1::EnvironmentSpec& env) {
    v1::SubmitPromptSetRequest r;
    for (int i = 0; i < prompts; ++i) {
      v1::Prompt* q = r.add_prompts();
      q->set_text("(1-100)=");
      q->set_reference(std::to_string(17 + 23 * i));
    }
    r.set_samples_per_prompt(samples);
    r.mutable_sampling()->set_temperature(1.0f);
    r.mutable_sampling()->set_top_p(1.0f);
    r.mutable_sampling()->set_max_tokens(4);
    r.mutable_sampling()->add_stop_token_ids(task::CharTokenizer().eos_id());
    *r.mutable_environment() = env;
    auto submitted = coordinator_->Submit(r);
    EXPECT_TRUE(submitted.ok()) << submitted.status();
    return submitted.ok() ? submitted->prompt_set_id() : "";
  }

  bool WaitDone(const std::string& id, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (coordinator_->Get(id)->state() == v1::PROMPT_SET_STATE_DONE) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  std::vector<std::vector<RolloutRecord>> TakeAll() {
    std::vector<std::vector<RolloutRecord>> groups;
    TakeOptions take;
    take.max_groups = 64;
    for (;;) {
      auto taken = replay_->Take(take);
      EXPECT_TRUE(taken.ok());
      if (taken->empty()) break;
      for (const LeasedGroup& g : *taken) {
        auto records = g.Decode();
        EXPECT_TRUE(records.ok()) << records.status();
        groups.push_back(*records);
        EXPECT_TRUE(replay_->Ack(g).ok());
      }
    }
    return groups;
  }

  bool moe_ = false;  // set by a derived fixture's constructor
  int64_t lease_ms_ = 5'000;
  int32_t coordinator_vocab_extra_ = 0;  // the coordinator's model has more tokens than ours
  std::string tag_;
  std::filesystem::path dir_;
  ModelConfig config_;
  std::shared_ptr<const ParameterSet> weights_;
  std::unique_ptr<coordinator::Coordinator> coordinator_;
  std::unique_ptr<coordinator::CoordinatorServer> server_;
  std::unique_ptr<ReplayBuffer> replay_;
  std::unique_ptr<ShmWeightPublisher> publisher_;
  std::unique_ptr<ShmWeightSubscriber> subscriber_;
  ActorOptions options_;
  std::unique_ptr<Actor> actor_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  absl::Status result_;
  static inline int n_ = 0;
};

TEST_F(ActorTest, EveryLeasedPromptBecomesOneScoredGroupInTheReplayBuffer) {
  const std::string id = Submit(6, 3);
  StartActor();
  ASSERT_TRUE(WaitDone(id, absl::Seconds(120)));
  StopActor();
  ASSERT_TRUE(result_.ok()) << result_;
  const auto groups = TakeAll();
  ASSERT_EQ(groups.size(), 6u);
  std::set<uint64_t> prompts;
  const task::CharTokenizer tok;
  for (const auto& g : groups) {
    ASSERT_EQ(g.size(), 3u);
    prompts.insert(g[0].prompt_index);
    for (const RolloutRecord& r : g) {
      EXPECT_EQ(r.run_id, "run-1");
      EXPECT_EQ(r.prompt_set_id, id);
      EXPECT_EQ(r.group_size, 3u);
      EXPECT_EQ(r.completion_tokens.size(), r.behaviour_logprobs.size());
      for (int64_t v : r.token_versions) EXPECT_EQ(v, 0);
      // The reward is the arithmetic verifier's on the decoded completion.
      std::vector<int32_t> visible = r.completion_tokens;
      if (r.finish_reason == RolloutFinishReason::kStop) visible.pop_back();
      const std::string prompt = *tok.Decode(r.prompt_tokens);
      const std::string answer = std::to_string(
          std::stoi(prompt.substr(0, prompt.find('+'))) +
          std::stoi(prompt.substr(prompt.find('+') + 1, prompt.find('=') - prompt.find('+') - 1)));
      EXPECT_EQ(r.reward, *tok.Decode(visible) == answer ? 1.0 : 0.0);
    }
  }
  EXPECT_EQ(prompts.size(), 6u);
  const auto status = coordinator_->Get(id);
  EXPECT_EQ(status->prompts_done(), 6);
  EXPECT_EQ(actor_->stats().groups_written, 6);
}

// An evaluation set's groups (LeasedPrompt.eval) are scored and reported for its round, and
// never written to the replay buffer (docs/operations.md, "Evaluation during training").
TEST_F(ActorTest, AnEvaluationSetsGroupsAreScoredAndReportedButNeverWritten) {
  const std::string id = Submit(4, 2, "arithmetic", {}, /*eval_every=*/5);
  StartActor();
  const absl::Time deadline = absl::Now() + absl::Seconds(120);  // (a bound, not the event)
  while (coordinator_->Get(id)->eval_rounds_size() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  StopActor();
  ASSERT_TRUE(result_.ok()) << result_;
  const auto status = coordinator_->Get(id);
  ASSERT_EQ(status->eval_rounds_size(), 1);
  EXPECT_EQ(status->eval_rounds(0).prompts(), 4);
  EXPECT_EQ(status->eval_rounds(0).samples(), 8);
  EXPECT_TRUE(TakeAll().empty()) << "an evaluation group reached the replay buffer";
  EXPECT_EQ(actor_->stats().eval_groups, 4);
  EXPECT_EQ(actor_->stats().groups_written, 0);
  EXPECT_GT(actor_->stats().tokens_generated, 0);
}

class ActorMoeTest : public ActorTest {
 protected:
  ActorMoeTest() { moe_ = true; }
};

// A Qwen3-MoE actor's records carry its engine's routes: per completion token, the top-2 of
// the model's MoE layer (replay/rollout_record.h).
TEST_F(ActorMoeTest, RecordsCarryTheEnginesRoutes) {
  const std::string id = Submit(2, 2);
  StartActor();
  ASSERT_TRUE(WaitDone(id, absl::Seconds(120)));
  StopActor();
  ASSERT_TRUE(result_.ok()) << result_;
  const auto groups = TakeAll();
  ASSERT_EQ(groups.size(), 2u);
  for (const auto& g : groups) {
    for (const RolloutRecord& r : g) {
      EXPECT_EQ(r.route_layers, 1);
      EXPECT_EQ(r.route_top_k, 2);
      ASSERT_EQ(r.routes.size(), r.completion_tokens.size() * 2);
      for (size_t t = 0; t < r.completion_tokens.size(); ++t) {
        EXPECT_LT(r.routes[2 * t], 4);
        EXPECT_LT(r.routes[2 * t + 1], 4);
        EXPECT_NE(r.routes[2 * t], r.routes[2 * t + 1]);
      }
    }
  }
}

TEST_F(ActorTest, TokensAfterAWeightSwapCarryTheNewVersion) {
  StartActor();
  const std::string first = Submit(2, 2);
  ASSERT_TRUE(WaitDone(first, absl::Seconds(120)));
  ASSERT_TRUE(publisher_->Publish(1, *weights_).ok());
  // The actor swaps between two engine steps; wait until it reports version 1.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (actor_->stats().weight_version != 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(actor_->stats().weight_version, 1);
  const std::string second = Submit(2, 2);
  ASSERT_TRUE(WaitDone(second, absl::Seconds(120)));
  StopActor();
  ASSERT_TRUE(result_.ok()) << result_;
  for (const auto& g : TakeAll()) {
    const int64_t expected = g[0].prompt_set_id == first ? 0 : 1;
    for (const RolloutRecord& r : g) {
      for (int64_t v : r.token_versions) EXPECT_EQ(v, expected) << r.prompt_set_id;
    }
  }
}

// A re-run of a group the learner handed back as stale asks for the learner's newest weights
// (LeaseResponse.min_weight_version): it waits aside for them while the engine generates other
// prompts, and its tokens come from that version or newer.
TEST_F(ActorTest, AReRunWaitsForNewerWeightsWithoutPausingOtherPrompts) {
  StartActor();
  const std::string stale = Submit(1, 2);
  ASSERT_TRUE(WaitDone(stale, absl::Seconds(120)));
  ASSERT_TRUE(coordinator_->LearnerProgress(2, 1, 0).ok());
  v1::ReopenPromptsRequest back;
  v1::ReopenPromptsRequest::Prompt* p = back.add_prompts();
  p->set_prompt_set_id(stale);
  p->set_prompt_index(0);
  p->set_reason("stale: test");
  ASSERT_EQ(coordinator_->Reopen(back)->reopened(), 1);
  // The re-run is leased (in flight) but waits for version 2; a later set still finishes.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (coordinator_->Get(stale)->prompts_in_flight() != 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(coordinator_->Get(stale)->prompts_in_flight(), 1);
  const std::string other = Submit(3, 2);
  ASSERT_TRUE(WaitDone(other, absl::Seconds(120)));
  EXPECT_EQ(coordinator_->Get(stale)->prompts_done(), 0) << "generated before version 2 came";
  ASSERT_TRUE(publisher_->Publish(1, *weights_).ok());
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(coordinator_->Get(stale)->prompts_done(), 0) << "version 1 is not enough";
  ASSERT_TRUE(publisher_->Publish(2, *weights_).ok());
  ASSERT_TRUE(WaitDone(stale, absl::Seconds(120)));
  StopActor();
  ASSERT_TRUE(result_.ok()) << result_;
  int reruns = 0;
  for (const auto& g : TakeAll()) {
    if (g[0].prompt_set_id != stale) continue;
    for (const RolloutRecord& r : g) {
      if (r.min_version() >= 2) ++reruns;
    }
  }
  EXPECT_EQ(reruns, 2) << "both samples of the re-run from version 2";
}

TEST_F(ActorTest, AFailingRewardFailsTheWholeGroupVisiblyAndWritesNothing) {
  // A remote reward nobody serves: every attempt fails.
  const std::string id = Submit(
      1, 2, "remote", {{"address", "127.0.0.1:1"}, {"attempts", "1"}, {"timeout_ms", "200"}});
  StartActor();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (actor_->stats().reward_failures == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  StopActor();
  EXPECT_GE(actor_->stats().reward_failures, 1);
  EXPECT_EQ(actor_->stats().groups_written, 0);
  EXPECT_TRUE(TakeAll().empty());
  EXPECT_EQ(coordinator_->Get(id)->prompts_done(), 0);
}

TEST_F(ActorTest, AGroupRefusedForALostLeaseIsDroppedAndItsPromptReRun) {
  // The remote replay refuses a group whose lease is no longer open (FailedPrecondition): the
  // actor keeps working, and the prompt's lease expires and is generated again.
  const std::string id = Submit(2, 2);
  auto refusals = std::make_shared<std::atomic<int>>(2);
  GroupWriter local = LocalReplayWriter(replay_.get(), absl::Seconds(10));
  StartActor([refusals, local](absl::Span<const RolloutRecord> group) {
    if (refusals->fetch_sub(1) > 0) return absl::FailedPreconditionError("no open lease");
    return local(group);
  });
  ASSERT_TRUE(WaitDone(id, absl::Seconds(60)));
  StopActor();
  ASSERT_TRUE(result_.ok()) << result_;
  EXPECT_EQ(actor_->stats().lost_leases, 2);
  EXPECT_EQ(TakeAll().size(), 2u);
  EXPECT_EQ(coordinator_->Get(id)->prompts_done(), 2);
}

TEST_F(ActorTest, AnUnavailableReplayIsRetriedAndTheActorGoesOn) {
  // A remote ingest restarting: two pushes fail UNAVAILABLE, then it is back.
  const std::string id = Submit(2, 2);
  auto failures = std::make_shared<std::atomic<int>>(2);
  GroupWriter local = LocalReplayWriter(replay_.get(), absl::Seconds(10));
  StartActor([failures, local](absl::Span<const RolloutRecord> group) {
    if (failures->fetch_sub(1) > 0) return absl::UnavailableError("connection refused");
    return local(group);
  });
  ASSERT_TRUE(WaitDone(id, absl::Seconds(60)));
  StopActor();
  ASSERT_TRUE(result_.ok()) << result_;
  EXPECT_EQ(TakeAll().size(), 2u) << "each group written once, after the retries";
  EXPECT_EQ(coordinator_->Stats().leases_expired, 0);
}

TEST_F(ActorTest, ABlockedReplayWriteNeitherPausesGenerationNorLosesLeases) {
  // A lease of 600 ms, renewed by heartbeats every 200 ms, and a first write that blocks for
  // 2 s (a full replay buffer, or a slow remote ingest): the lease must be renewed meanwhile,
  // and prompts leased meanwhile must be generated meanwhile.
  lease_ms_ = 600;
  TearDown();
  stop_ = false;
  SetUp();
  const std::string first = Submit(1, 2);
  auto generated_while_blocked = std::make_shared<std::atomic<int64_t>>(-1);
  GroupWriter local = LocalReplayWriter(replay_.get(), absl::Seconds(10));
  auto calls = std::make_shared<std::atomic<int>>(0);
  StartActor([this, local, calls, generated_while_blocked](absl::Span<const RolloutRecord> g) {
    if (calls->fetch_add(1) == 0) {
      absl::SleepFor(absl::Seconds(2));
      generated_while_blocked->store(actor_->stats().groups_generated);
    }
    return local(g);
  });
  absl::SleepFor(absl::Milliseconds(300));  // the first group is being written by now
  const std::string second = Submit(2, 2);
  ASSERT_TRUE(WaitDone(first, absl::Seconds(60)));
  ASSERT_TRUE(WaitDone(second, absl::Seconds(60)));
  StopActor();
  ASSERT_TRUE(result_.ok()) << result_;
  EXPECT_EQ(coordinator_->Stats().leases_expired, 0) << "a lease expired while its group waited";
  EXPECT_EQ(actor_->stats().lost_leases, 0);
  EXPECT_EQ(TakeAll().size(), 3u) << "each prompt exactly once";
  EXPECT_EQ(generated_while_blocked->load(), 3) << "generation paused while a write blocked";
}

TEST_F(ActorTest, AnActorIsNeverLeasedAGroupAboveItsEnginesCapacity) {
  // 100 samples per prompt; the engine runs max_num_seqs = 64 sequences.
  ASSERT_EQ(options_.engine.max_num_seqs, 64);
  const std::string big = Submit(1, 100);
  const std::string small = Submit(2, 2);
  StartActor();
  ASSERT_TRUE(WaitDone(small, absl::Seconds(60)));
  StopActor();
  ASSERT_TRUE(result_.ok()) << result_;
  const v1::PromptSetStatus s = *coordinator_->Get(big);
  EXPECT_EQ(s.prompts_pending(), 1);
  EXPECT_EQ(s.prompts_failed(), 0);
  EXPECT_EQ(actor_->stats().leases_released, 0);
  EXPECT_EQ(coordinator_->Stats().prompts_leased["test-actor"], 2);
  EXPECT_EQ(s.message(), "no registered actor can run samples_per_prompt 100 (largest: 64)");
}

TEST_F(ActorTest, AGroupItsEngineRefusesIsReleasedWithTheEnginesReason) {
  // The coordinator's model has a larger vocabulary than the actor's: it accepts a prompt the
  // engine refuses. Each attempt is released at once; after max_attempts the prompt fails.
  coordinator_vocab_extra_ = 8;
  TearDown();
  stop_ = false;
  SetUp();
  v1::SubmitPromptSetRequest r;
  r.add_prompts()->mutable_tokens()->add_ids(static_cast<int32_t>(config_.vocab_size) + 1);
  r.set_samples_per_prompt(2);
  r.mutable_sampling()->set_temperature(1.0f);
  r.mutable_sampling()->set_top_p(1.0f);
  r.mutable_sampling()->set_max_tokens(5);
  r.mutable_sampling()->add_stop_token_ids(task::CharTokenizer().eos_id());
  r.mutable_reward()->set_name("arithmetic");
  const std::string id = coordinator_->Submit(r)->prompt_set_id();
  StartActor();
  ASSERT_TRUE(WaitDone(id, absl::Seconds(30)));
  StopActor();
  ASSERT_TRUE(result_.ok()) << result_;
  const v1::PromptSetStatus s = *coordinator_->Get(id);
  EXPECT_EQ(s.prompts_failed(), 1);
  ASSERT_EQ(s.failed_prompts_size(), 1);
  EXPECT_NE(s.failed_prompts(0).reason().find("its engine refused the group"), std::string::npos)
      << s.failed_prompts(0).reason();
  EXPECT_NE(s.failed_prompts(0).reason().find("is not a token id"), std::string::npos)
      << s.failed_prompts(0).reason();
  EXPECT_EQ(actor_->stats().leases_released, 3);
  EXPECT_EQ(coordinator_->Stats().leases_dropped, 0) << "released, not left to a heartbeat";
  EXPECT_EQ(coordinator_->Stats().leases_expired, 0);
}

TEST_F(ActorTest, AGroupWhoseRewardFailsIsReleasedAndItsPromptFailsAfterMaxAttempts) {
  const std::string id = Submit(
      1, 2, "remote", {{"address", "127.0.0.1:1"}, {"attempts", "1"}, {"timeout_ms", "200"}});
  StartActor();
  ASSERT_TRUE(WaitDone(id, absl::Seconds(60)));
  StopActor();
  ASSERT_TRUE(result_.ok()) << result_;
  const v1::PromptSetStatus s = *coordinator_->Get(id);
  EXPECT_EQ(s.prompts_failed(), 1);
  EXPECT_EQ(s.prompts_done(), 0);
  ASSERT_EQ(s.failed_prompts_size(), 1);
  EXPECT_EQ(s.failed_prompts(0).attempts(), 3);
  EXPECT_NE(s.failed_prompts(0).reason().find("the group's reward failed"), std::string::npos)
      << s.failed_prompts(0).reason();
  EXPECT_EQ(actor_->stats().reward_failures, 3);
  EXPECT_EQ(actor_->stats().leases_released, 3);
  EXPECT_TRUE(TakeAll().empty());
}

// Agentic episodes with the built-in guessing game: every sample runs turns until it guesses
// the secret or runs out of guesses; its record holds the model's turns and the game's replies
// (source 1, log-prob 0, the version of the token before), where each turn ends, and the
// episode reward.
TEST_F(ActorTest, EpisodesRunTurnsAgainstTheEnvironmentAndRecordEveryToken) {
  v1::EnvironmentSpec env;
  env.set_name("guess_number");
  env.set_max_turns(3);
  (*env.mutable_parameters())["higher_text"] = "+";
  (*env.mutable_parameters())["lower_text"] = "-";
  (*env.mutable_parameters())["rules_text"] = "#";
  const std::string id = SubmitEpisodes(3, 2, env);
  StartActor();
  ASSERT_TRUE(WaitDone(id, absl::Seconds(120)));
  StopActor();
  ASSERT_TRUE(result_.ok()) << result_;
  const auto groups = TakeAll();
  ASSERT_EQ(groups.size(), 3u);
  int replies = 0;
  for (const auto& g : groups) {
    for (const RolloutRecord& r : g) {
      ASSERT_TRUE(ValidateRecord(r).ok()) << ValidateRecord(r);
      ASSERT_EQ(r.token_sources.size(), r.completion_tokens.size());
      ASSERT_GE(r.turn_ends.size(), 1u);
      ASSERT_LE(r.turn_ends.size(), 3u);
      EXPECT_EQ(r.turn_ends.back(), r.completion_tokens.size()) << "the last turn is the model's";
      EXPECT_TRUE(r.reward == 0.0 || r.reward == 1.0);
      if (r.reward == 0.0) {
        EXPECT_EQ(r.turn_ends.size(), 3u) << "out of guesses after 3";
      }
      for (size_t t = 0; t < r.token_sources.size(); ++t) {
        if (r.token_sources[t] == 1) {
          ++replies;
          EXPECT_EQ(r.behaviour_logprobs[t], 0.0f);
        }
      }
      // Between two turns, exactly the reply: "+\n", "-\n" or "#\n".
      for (size_t k = 0; k + 1 < r.turn_ends.size(); ++k) {
        const size_t at = r.turn_ends[k];
        ASSERT_LT(at + 1, r.token_sources.size());
        EXPECT_EQ(r.token_sources[at], 1);
        EXPECT_EQ(r.token_sources[at + 1], 1);
        EXPECT_EQ(r.token_sources[at + 2], 0) << "the next turn starts after the reply";
      }
    }
  }
  EXPECT_GT(replies, 0) << "some episode went on after a reply";
}

// An environment that stays down longer than the outage budget (its groups wait for it first)
// fails the group's attempt (released, counted), never a made-up reward; after
// coordinator.max_attempts the prompt fails naming the environment.
TEST_F(ActorTest, AnEnvironmentDownBeyondTheOutageBudgetFailsTheAttemptAndThenThePrompt) {
  options_.env_outage_budget = absl::Milliseconds(300);
  v1::EnvironmentSpec env;
  env.set_name("remote-game");
  env.set_address("127.0.0.1:1");
  env.set_timeout_s(0.5);
  const std::string id = SubmitEpisodes(1, 2, env);
  StartActor();
  ASSERT_TRUE(WaitDone(id, absl::Seconds(120)));
  StopActor();
  const v1::PromptSetStatus s = *coordinator_->Get(id);
  EXPECT_EQ(s.prompts_failed(), 1);
  ASSERT_EQ(s.failed_prompts_size(), 1);
  EXPECT_NE(s.failed_prompts(0).reason().find("environment at 127.0.0.1:1"), std::string::npos)
      << s.failed_prompts(0).reason();
  EXPECT_TRUE(TakeAll().empty()) << "nothing written";
  EXPECT_GE(actor_->stats().leases_released, 1);
}

}  // namespace
}  // namespace prl::actor
