// Attacks on a running service (docs/security.md), each while a legitimate run goes on beside
// it: a coordinator, a replay ingest that admits only leased groups, an honest actor leasing,
// pushing and completing, and a learner taking groups and reporting progress, all over real
// gRPC with role tokens; a metrics endpoint on Boost.Beast. Each attack must get its error, and
// at the end every prompt of the run is trained exactly once and nothing else entered the
// buffer. ctest label `attack` (ctest -L attack).
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <prometheus/registry.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_server.h"
#include "core/group_id.h"
#include "metrics/metrics_server.h"
#include "prl/v1/environment.grpc.pb.h"
#include "prl/v1/prompt.grpc.pb.h"
#include "replay/ingest_server.h"
#include "replay/replay_buffer.h"
#include "replay/rollout_group.h"
#include "roles/replay_role.h"
#include "rpc/grpc_util.h"
#include "rpc/security.h"
#include "tests/episode/episode_testing.h"

namespace prl {
namespace {

namespace fs = std::filesystem;
namespace v1 = prl::v1;
using rpc::Role;

constexpr int kPrompts = 120;  // the legitimate run's prompt set
constexpr int kSamples = 2;

std::chrono::system_clock::time_point In(int seconds) {
  return std::chrono::system_clock::now() + std::chrono::seconds(seconds);
}

// A group of `samples` records for `prompt_index` under the lease whose group id is `group_id`.
std::vector<RolloutRecord> Group(const std::string& run, const std::string& set,
                                 int64_t prompt_index, uint64_t group_id) {
  std::vector<RolloutRecord> group(kSamples);
  for (int i = 0; i < kSamples; ++i) {
    RolloutRecord& r = group[i];
    r.run_id = run;
    r.prompt_set_id = set;
    r.actor_id = "honest";
    r.prompt_index = static_cast<uint64_t>(prompt_index);
    r.group_id = group_id;
    r.sample_index = static_cast<uint32_t>(i);
    r.group_size = kSamples;
    r.prompt_tokens = {1, 2};
    r.completion_tokens = {3};
    r.behaviour_logprobs = {-0.5f};
    r.token_versions = {0};
  }
  return group;
}

// One HTTP/1.1 connection to 127.0.0.1:port (-1 when refused).
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  return fd;
}

// GET /metrics: the status line of the answer ("" when none came).
std::string Scrape(int port) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: prl\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string answer(256, '\0');
  const ssize_t n = read(fd, answer.data(), answer.size());
  close(fd);
  answer.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return answer.substr(0, answer.find("\r\n"));
}

class AttackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / absl::StrCat("prl_attack_test_", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* role : {"client", "actor", "learner"}) {
      std::ofstream(dir_ / role) << role << "-token-" << getpid() << "\n";
    }
    settings_.client_token_file = (dir_ / "client").string();
    settings_.actor_token_file = (dir_ / "actor").string();
    settings_.learner_token_file = (dir_ / "learner").string();
    run_.run.name = absl::StrCat("attack-", getpid());

    ASSERT_TRUE(rpc::ConfigureSecurity(settings_, std::nullopt).ok());  // the coordinator
    coordinator::CoordinatorConfig cc;
    cc.log_path = (dir_ / "prompts.log").string();
    cc.vocab_size = 16;
    cc.max_position_embeddings = 64;
    cc.max_prompts_per_set = 1000;
    cc.reward_addresses = {"verifier.internal:50071"};
    cc.validate_reward = [](const v1::RewardSpec&) { return absl::OkStatus(); };
    coordinator_ = *coordinator::Coordinator::Open(cc);
    server_ = *coordinator::CoordinatorServer::Start(coordinator_.get(), "127.0.0.1:0",
                                                     /*max_watch_streams=*/64);
    run_.coordinator.listen = absl::StrCat("127.0.0.1:", server_->port());

    ReplayConfig rc;
    rc.capacity_bytes = 16 << 20;
    ReplayBuffer::Remove(run_.replay_segment(), true).IgnoreError();
    buffer_ = *ReplayBuffer::Create(run_.replay_segment(), rc);
    ASSERT_TRUE(rpc::ConfigureSecurity(settings_, Role::kLearner).ok());  // the replay ingest
    IngestOptions ingest;
    ingest.address = "127.0.0.1:0";
    ingest.max_message_bytes = 1 << 20;
    ingest.admit = roles::AdmitLeasedGroups(run_);
    ingest_ = *ReplayIngestServer::Start(buffer_.get(), ingest);
    learner_ = Control();
    actor_ = Control(Role::kActor);
    attacker_ = Control(Role::kActor);  // a compromised actor: it holds the actor token
    actor_push_ = Push(Role::kActor);
    attacker_push_ = Push(Role::kActor);
    client_push_ = Push(Role::kClient);
    client_ = Prompts(Role::kClient);
    ASSERT_TRUE(rpc::ConfigureSecurity(settings_, std::nullopt).ok());
    anonymous_ = v1::ActorControl::NewStub(Channel());

    registry_ = std::make_shared<prometheus::Registry>();
    metrics::MetricsServerOptions mo;
    mo.request_timeout_ms = 2000;
    metrics_ = *metrics::MetricsServer::Start(mo, registry_);
  }

  void TearDown() override {
    metrics_.reset();
    ingest_.reset();
    server_.reset();
    buffer_.reset();
    ReplayBuffer::Remove(run_.replay_segment(), true).IgnoreError();
    ASSERT_TRUE(rpc::ConfigureSecurity({}, std::nullopt).ok());
    fs::remove_all(dir_);
  }

  std::shared_ptr<grpc::Channel> Channel() {
    return rpc::NewChannel(run_.coordinator.listen, rpc::ChannelArgs(int64_t{8} << 20));
  }
  std::unique_ptr<v1::ActorControl::Stub> Control(std::optional<Role> role = Role::kLearner) {
    EXPECT_TRUE(rpc::ConfigureSecurity(settings_, role).ok());
    return v1::ActorControl::NewStub(Channel());
  }
  std::unique_ptr<v1::PromptService::Stub> Prompts(Role role) {
    EXPECT_TRUE(rpc::ConfigureSecurity(settings_, role).ok());
    return v1::PromptService::NewStub(Channel());
  }
  std::unique_ptr<ReplayPushClient> Push(Role role) {
    EXPECT_TRUE(rpc::ConfigureSecurity(settings_, role).ok());
    return *ReplayPushClient::Connect(absl::StrCat("127.0.0.1:", ingest_->port()), 8 << 20);
  }

  v1::SubmitPromptSetRequest Request(int prompts) const {
    v1::SubmitPromptSetRequest r;
    for (int i = 0; i < prompts; ++i) r.add_prompts()->mutable_tokens()->add_ids(1 + i % 10);
    r.set_samples_per_prompt(kSamples);
    r.mutable_sampling()->set_max_tokens(4);
    r.mutable_sampling()->set_temperature(1.0f);
    r.mutable_sampling()->set_top_p(1.0f);
    r.mutable_reward()->set_name("exact_match");
    return r;
  }

  // The honest actor: lease, push the group, complete, heartbeat, until the set is done. Every
  // lease id it gets is "snooped" into `snooped_` for the attacker; it completes its first lease
  // only once `first_lease_released_` (an actor slow to complete: the attacker meets an open
  // lease). It leases its last kHeldBack prompts only once the attack is over, so that every
  // attack meets a running set.
  void HonestActor(const std::string& set) {
    grpc::ClientContext rctx;
    v1::RegisterRequest reg;
    reg.set_actor_name("honest");
    v1::RegisterResponse registered;
    ASSERT_TRUE(actor_->Register(&rctx, reg, &registered).ok());
    const auto deadline = In(120);
    while (coordinator_->Get(set)->prompts_done() < kPrompts) {
      ASSERT_LT(std::chrono::system_clock::now(), deadline) << "the legitimate run stalled";
      if (!attack_done_ && coordinator_->Get(set)->prompts_done() >= kPrompts - kHeldBack) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      grpc::ClientContext lctx;
      v1::LeaseRequest lease;
      lease.set_actor_id(registered.actor_id());
      lease.set_max_prompts(static_cast<int32_t>(
          std::min<int64_t>(4, kPrompts - kHeldBack - coordinator_->Get(set)->prompts_done())));
      if (attack_done_) lease.set_max_prompts(4);
      v1::LeaseResponse leased;
      ASSERT_TRUE(actor_->LeasePrompts(&lctx, lease, &leased).ok());
      for (const v1::LeasedPrompt& p : leased.prompts()) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          snooped_.push_back(p.lease_id());
        }
        PushResult pushed;
        ASSERT_TRUE(
            actor_push_
                ->Push({Group(run_.run.name, set, p.prompt_index(), GroupIdOfLease(p.lease_id()))},
                       &pushed, absl::Seconds(30))
                .ok());
        for (int i = 0; i < 2000 && !first_lease_released_; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        grpc::ClientContext cctx;
        v1::CompleteRequest done;
        done.set_actor_id(registered.actor_id());
        done.set_lease_id(p.lease_id());
        done.mutable_result()->set_prompt_index(p.prompt_index());
        for (int i = 0; i < p.samples(); ++i) {
          done.mutable_result()->add_rewards(1.0);
          done.mutable_result()->add_completion_tokens(1);
        }
        v1::CompleteResponse accepted;
        const grpc::Status completed = actor_->Complete(&cctx, done, &accepted);
        ASSERT_TRUE(completed.ok()) << completed.error_message();
      }
      grpc::ClientContext hctx;
      v1::HeartbeatRequest beat;
      beat.set_actor_id(registered.actor_id());
      v1::HeartbeatResponse answer;
      ASSERT_TRUE(actor_->Heartbeat(&hctx, beat, &answer).ok());
      if (leased.prompts().empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // The learner: takes groups, counts each prompt it trains on, reports its progress.
  void Learner() {
    int64_t consumed = 0;
    const auto deadline = In(120);
    while (consumed < kPrompts && std::chrono::system_clock::now() < deadline) {
      TakeOptions take;
      take.max_groups = 8;
      take.timeout = absl::Milliseconds(100);
      auto groups = buffer_->Take(take);
      ASSERT_TRUE(groups.ok()) << groups.status();
      for (const LeasedGroup& g : *groups) {
        auto records = DecodeGroup(g.payload);
        ASSERT_TRUE(records.ok()) << records.status();
        std::lock_guard<std::mutex> lock(mu_);
        ++trained_[static_cast<int64_t>(records->front().prompt_index)];
        ASSERT_TRUE(buffer_->Ack(g).ok());
        ++consumed;
      }
      grpc::ClientContext ctx;
      v1::LearnerProgressRequest progress;
      progress.set_version(consumed / 8);
      progress.set_groups_consumed(consumed);
      v1::LearnerProgressResponse ignored;
      const grpc::Status reported = learner_->ReportLearnerProgress(&ctx, progress, &ignored);
      ASSERT_TRUE(reported.ok()) << reported.error_message();
      learner_reported_ = true;
    }
  }

  void DuringARun(const std::function<void(const std::string& set)>& attack);

  std::string NextSnoopedLease() {
    for (int i = 0; i < 2000; ++i) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!snooped_.empty()) return snooped_.back();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ADD_FAILURE() << "the honest actor never leased";
    return "";
  }

  fs::path dir_;
  rpc::SecuritySettings settings_;
  config::RunConfig run_;
  std::unique_ptr<coordinator::Coordinator> coordinator_;
  std::unique_ptr<coordinator::CoordinatorServer> server_;
  std::unique_ptr<ReplayBuffer> buffer_;
  std::unique_ptr<ReplayIngestServer> ingest_;
  std::unique_ptr<v1::ActorControl::Stub> learner_, actor_, attacker_, anonymous_;
  std::unique_ptr<ReplayPushClient> actor_push_, attacker_push_, client_push_;
  std::unique_ptr<v1::PromptService::Stub> client_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<metrics::MetricsServer> metrics_;
  static constexpr int kHeldBack = 8;
  std::atomic<bool> attack_done_{false};
  std::atomic<bool> learner_reported_{false};
  std::atomic<bool> first_lease_released_{true};
  std::mutex mu_;
  std::vector<std::string> snooped_;
  std::map<int64_t, int> trained_;  // prompt index -> times trained
};

// Runs `attack` while a legitimate run of kPrompts prompts goes on; then checks that every
// prompt was trained exactly once and nothing else entered the buffer.
void AttackTest::DuringARun(const std::function<void(const std::string& set)>& attack) {
  grpc::ClientContext ctx;
  v1::SubmitPromptSetResponse submitted;
  ASSERT_TRUE(client_->SubmitPromptSet(&ctx, Request(kPrompts), &submitted).ok());
  const std::string set = submitted.prompt_set_id();
  std::thread actor([&] { HonestActor(set); });
  std::thread learner([&] { Learner(); });
  attack(set);
  attack_done_ = true;
  first_lease_released_ = true;
  actor.join();
  learner.join();
  EXPECT_EQ(coordinator_->Get(set)->prompts_done(), kPrompts);
  std::lock_guard<std::mutex> lock(mu_);
  ASSERT_EQ(trained_.size(), static_cast<size_t>(kPrompts)) << "prompts lost or foreign groups";
  for (const auto& [index, times] : trained_) {
    ASSERT_TRUE(index >= 0 && index < kPrompts) << index;
    EXPECT_EQ(times, 1) << "prompt " << index;
  }
  TakeOptions take;
  EXPECT_TRUE(buffer_->Take(take)->empty()) << "a group beyond the run's entered the buffer";
}

TEST_F(AttackTest, AForeignActorCannotCompleteALeaseItDoesNotHold) {
  first_lease_released_ = false;
  DuringARun([&](const std::string& set) {
    grpc::ClientContext rctx;
    v1::RegisterRequest reg;
    reg.set_actor_name("mallory");
    v1::RegisterResponse mallory;
    ASSERT_TRUE(attacker_->Register(&rctx, reg, &mallory).ok());
    const std::string stolen = NextSnoopedLease();
    for (const std::string& lease :
         {stolen, stolen.substr(0, stolen.rfind(':') + 1) + "0123456789abcdef"}) {
      grpc::ClientContext ctx;
      v1::CompleteRequest forged;
      forged.set_actor_id(mallory.actor_id());
      forged.set_lease_id(lease);
      forged.mutable_result()->add_rewards(1.0);
      forged.mutable_result()->add_rewards(1.0);
      v1::CompleteResponse answer;
      EXPECT_EQ(attacker_->Complete(&ctx, forged, &answer).error_code(),
                grpc::StatusCode::FAILED_PRECONDITION);
    }
    EXPECT_EQ(coordinator_->Get(set)->prompts_done(), 0) << "a forged completion counted";
    first_lease_released_ = true;
  });
  EXPECT_GE(coordinator_->Stats().rejected_completions, 2);
}

TEST_F(AttackTest, LearnerProgressCannotJumpAheadOrComeFromAnotherRole) {
  DuringARun([&](const std::string&) {
    // After the learner's first report (before it, any version is the learner's numbering).
    while (!learner_reported_) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    v1::LearnerProgressRequest jump;
    jump.set_version(1'000'000);
    jump.set_groups_consumed(1'000'000'000);
    v1::LearnerProgressResponse ignored;
    grpc::ClientContext a, b, c;
    EXPECT_EQ(learner_->ReportLearnerProgress(&a, jump, &ignored).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(attacker_->ReportLearnerProgress(&b, jump, &ignored).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(anonymous_->ReportLearnerProgress(&c, jump, &ignored).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  });
  EXPECT_GE(coordinator_->Stats().rejected_progress, 1);
  EXPECT_LT(coordinator_->Stats().learner_version, 1'000'000);
}

TEST_F(AttackTest, OnlyGroupsOfAnOpenLeaseOfThisRunEnterTheBuffer) {
  DuringARun([&](const std::string& set) {
    PushResult result;
    const absl::Status guessed =
        attacker_push_->Push({Group(run_.run.name, set, 3, 0x5eed)}, &result);
    EXPECT_EQ(guessed.code(), absl::StatusCode::kFailedPrecondition) << guessed;
    const absl::Status other_run = attacker_push_->Push({Group("other", set, 3, 1)}, &result);
    EXPECT_EQ(other_run.code(), absl::StatusCode::kPermissionDenied) << other_run;
    const absl::Status client = client_push_->Push({Group(run_.run.name, set, 3, 1)}, &result);
    EXPECT_EQ(client.code(), absl::StatusCode::kPermissionDenied) << client;
    // Records of one group that name different actors (or prompts) are not one lease's.
    std::vector<RolloutRecord> mixed = Group(run_.run.name, set, 3, 1);
    mixed[1].actor_id = "mallory";
    const absl::Status two_actors = attacker_push_->Push({mixed}, &result);
    EXPECT_EQ(two_actors.code(), absl::StatusCode::kInvalidArgument) << two_actors;
    EXPECT_TRUE(absl::StrContains(two_actors.message(), "actor_id")) << two_actors;
    mixed = Group(run_.run.name, set, 3, 1);
    mixed[1].prompt_index = 4;
    const absl::Status two_prompts = attacker_push_->Push({mixed}, &result);
    EXPECT_TRUE(absl::StrContains(two_prompts.message(), "prompt_index")) << two_prompts;
    // Larger than the ingest's messages (1 MiB): refused before it is read.
    std::vector<RolloutRecord> huge = Group(run_.run.name, set, 3, 1);
    huge[0].completion_tokens.assign(600'000, 3);
    huge[0].behaviour_logprobs.assign(600'000, -0.5f);
    huge[0].token_versions.assign(600'000, 0);
    const absl::Status oversized = attacker_push_->Push({huge}, &result);
    EXPECT_EQ(oversized.code(), absl::StatusCode::kResourceExhausted) << oversized;
  });
  EXPECT_GE(coordinator_->Stats().rejected_groups, 1);
}

TEST_F(AttackTest, ARemoteRewardMayNameOnlyAnAllowedAddress) {
  DuringARun([&](const std::string&) {
    v1::SubmitPromptSetRequest r = Request(1);
    r.mutable_reward()->set_name("remote");
    (*r.mutable_reward()->mutable_params())["address"] = "169.254.169.254:80";
    grpc::ClientContext ctx;
    v1::SubmitPromptSetResponse answer;
    const grpc::Status refused = client_->SubmitPromptSet(&ctx, r, &answer);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(refused.error_message().find("coordinator.reward_addresses"), std::string::npos)
        << refused.error_message();
  });
}

// An environment is third-party code: one that an operator allow-listed but somebody else runs
// harvests the headers of every call an actor's episodes make to it. It must never see a role's
// token — only the credential configured for its own address.
class HarvestingEnvironment final : public v1::EnvironmentService::Service {
 public:
  grpc::Status StartEpisode(grpc::ServerContext* c, const v1::StartEpisodeRequest*,
                            v1::StartEpisodeResponse*) override {
    Harvest(*c);
    return grpc::Status::OK;
  }
  grpc::Status Step(grpc::ServerContext* c, const v1::StepRequest*,
                    v1::StepResponse* answer) override {
    Harvest(*c);
    answer->set_done(true);
    answer->set_episode_reward(1.0);
    return grpc::Status::OK;
  }
  grpc::Status EndEpisode(grpc::ServerContext* c, const v1::EndEpisodeRequest*,
                          v1::EndEpisodeResponse*) override {
    Harvest(*c);
    return grpc::Status::OK;
  }
  std::vector<std::string> harvested() {
    std::lock_guard<std::mutex> lock(mu_);
    return harvested_;
  }

 private:
  void Harvest(const grpc::ServerContext& c) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string headers;
    for (const auto& [key, value] : c.client_metadata()) {
      absl::StrAppend(&headers, std::string(key.data(), key.size()), "=",
                      std::string(value.data(), value.size()), ";");
    }
    harvested_.push_back(headers);
  }
  std::mutex mu_;
  std::vector<std::string> harvested_;
};

TEST_F(AttackTest, AnEnvironmentNeverSeesARoleTokenOnlyItsOwnCredential) {
  HarvestingEnvironment harvester;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&harvester);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  std::ofstream((dir_ / "env-credential").string()) << "env-credential-for-this-address\n";
  DuringARun([&](const std::string&) {
    // An actor process: its role token configured, and the environment's own credential.
    rpc::SecuritySettings actor = settings_;
    actor.service_token_files[address] = (dir_ / "env-credential").string();
    ASSERT_TRUE(rpc::ConfigureSecurity(actor, Role::kActor).ok());
    episode::testing::EpisodeLoop loop;
    v1::EnvironmentSpec spec = episode::testing::RemoteSpec(address);
    spec.set_name("harvester");
    ASSERT_TRUE(loop.episodes().Add(episode::testing::EpisodeGroup("g", spec)).ok());
    ASSERT_TRUE(loop.RunToEnd());
    ASSERT_EQ(loop.finished().size(), 1u);
    ASSERT_TRUE(rpc::ConfigureSecurity(settings_, std::nullopt).ok());
  });
  const std::vector<std::string> harvested = harvester.harvested();
  ASSERT_GE(harvested.size(), 4u) << "two episodes started and stepped";
  for (const std::string& headers : harvested) {
    for (const char* secret : {"actor-token", "learner-token", "client-token"}) {
      EXPECT_EQ(headers.find(secret), std::string::npos) << secret << " in " << headers;
    }
    EXPECT_NE(headers.find("authorization=Bearer env-credential-for-this-address"),
              std::string::npos)
        << headers;
  }
}

TEST_F(AttackTest, OversizedSubmissionsAreRefusedNamingTheField) {
  DuringARun([&](const std::string&) {
    v1::SubmitPromptSetResponse answer;
    v1::SubmitPromptSetRequest long_text = Request(1);
    long_text.mutable_prompts(0)->set_text(std::string(2 << 20, 'a'));
    grpc::ClientContext a, b, c;
    const grpc::Status text = client_->SubmitPromptSet(&a, long_text, &answer);
    EXPECT_EQ(text.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(text.error_message().find("prompts[0]"), std::string::npos) << text.error_message();
    EXPECT_EQ(client_->SubmitPromptSet(&b, Request(1001), &answer).error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
    v1::ListPromptSetsRequest page;
    page.set_page_size(5000);
    v1::ListPromptSetsResponse listed;
    EXPECT_EQ(client_->ListPromptSets(&c, page, &listed).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  });
  EXPECT_EQ(coordinator_->List().size(), 1u) << "only the run's set was accepted";
}

TEST_F(AttackTest, TenThousandListCallsAreAnsweredAndBounded) {
  DuringARun([&](const std::string&) {
    v1::ListPromptSetsRequest page;
    page.set_page_size(1000);
    for (int i = 0; i < 10'000; ++i) {
      grpc::ClientContext ctx;
      v1::ListPromptSetsResponse listed;
      const grpc::Status status = client_->ListPromptSets(&ctx, page, &listed);
      ASSERT_TRUE(status.ok()) << i << ": " << status.error_message();
      ASSERT_LE(listed.prompt_sets_size(), 1000);
    }
  });
}

TEST_F(AttackTest, AThousandWatchStreamsGetTheCapAndTheRestAreRefused) {
  DuringARun([&](const std::string& set) {
    v1::WatchPromptSetRequest watch;
    watch.set_prompt_set_id(set);
    std::vector<std::unique_ptr<grpc::ClientContext>> open;
    std::vector<std::unique_ptr<grpc::ClientReader<v1::PromptSetEvent>>> readers;
    int admitted = 0, refused = 0;
    for (int i = 0; i < 1000; ++i) {
      auto ctx = std::make_unique<grpc::ClientContext>();
      auto reader = client_->WatchPromptSet(ctx.get(), watch);
      v1::PromptSetEvent first;
      if (reader->Read(&first)) {
        ++admitted;
        open.push_back(std::move(ctx));
        readers.push_back(std::move(reader));
        continue;
      }
      const grpc::Status status = reader->Finish();
      // A stream of a set that finished meanwhile ends OK; the others are refused.
      if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++refused;
    }
    EXPECT_EQ(coordinator_->Get(set)->state(), v1::PROMPT_SET_STATE_RUNNING);
    EXPECT_EQ(admitted, 64);
    EXPECT_EQ(refused, 1000 - 64);
    for (auto& ctx : open) ctx->TryCancel();
    for (auto& reader : readers) reader->Finish().error_code();
  });
}

TEST_F(AttackTest, ASlowlorisOnMetricsNeitherHoldsItsConnectionsNorDelaysScrapes) {
  DuringARun([&](const std::string&) {
    std::vector<int> slow;
    for (int i = 0; i < 32; ++i) {
      const int fd = Connect(metrics_->port());
      ASSERT_GE(fd, 0);
      const std::string partial = "GET /metrics HTTP/1.1\r\nHost:";  // and never the rest
      ASSERT_EQ(write(fd, partial.data(), partial.size()), static_cast<ssize_t>(partial.size()));
      slow.push_back(fd);
    }
    for (int i = 0; i < 10; ++i) {
      const auto start = std::chrono::steady_clock::now();
      EXPECT_EQ(Scrape(metrics_->port()), "HTTP/1.1 200 OK");
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
    }
    // Each slow connection is closed at its deadline (2 s): its read ends.
    for (const int fd : slow) {
      char byte;
      EXPECT_LE(read(fd, &byte, 1), 0);
      close(fd);
    }
    EXPECT_EQ(Scrape(metrics_->port()), "HTTP/1.1 200 OK");
  });
}

}  // namespace
}  // namespace prl
