// Quarantine for bad input: the check of a group against the model (every reason names the
// field, expected and found), the dead-letter file (one bounded line per group), the learner's
// Admit over a real segment, and the replay ingest refusing a poisoned group.
#include "replay/quarantine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include "absl/strings/str_cat.h"
#include "metrics/prl_metrics.h"
#include "nlohmann/json.hpp"
#include "replay/ingest_server.h"
#include "tests/status_testing.h"

namespace prl::testing {
namespace {

const ModelLimits kModel{/*vocab_size=*/100, /*max_position_embeddings=*/64};

// prl_replay_groups_dead_lettered_total exports every reason from 0 (metrics/prl_metrics.h):
// its list is this file's reasons, in order.
TEST(DeadLetterReasonTest, TheMetricsCatalogExportsEveryReason) {
  ASSERT_EQ(std::size(metrics::kDeadLetterReasons), size_t{kNumDeadLetterReasons});
  for (int i = 0; i < kNumDeadLetterReasons; ++i) {
    EXPECT_EQ(metrics::kDeadLetterReasons[i],
              DeadLetterReasonName(static_cast<DeadLetterReason>(i)));
  }
}

std::vector<RolloutRecord> Good(uint64_t prompt = 1, int n = 3) {
  std::vector<RolloutRecord> group(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    RolloutRecord& r = group[static_cast<size_t>(i)];
    r.run_id = "run";
    r.prompt_set_id = "ps-1";
    r.actor_id = "actor-0";
    r.prompt_index = prompt;
    r.group_id = prompt;
    r.sample_index = static_cast<uint32_t>(i);
    r.group_size = static_cast<uint32_t>(n);
    r.prompt_tokens = {1, 2, 3};
    r.completion_tokens = {4, 5, 6, 7};
    r.behaviour_logprobs = {-0.1f, -2.0f, 0.0f, -7.5f};
    r.token_versions = {3, 3, 4, 5};
  }
  return group;
}

struct Case {
  std::string name;
  std::function<void(std::vector<RolloutRecord>&)> poison;
  DeadLetterReason reason;
  std::string field, found;
};

// The learner's own limit (learner/activation_budget.h): a sequence its activation budget cannot
// hold is refused like one longer than the context, with the settings' account in `expected`.
TEST(GroupValidationTest, ASequenceOverTheLearnersBudgetIsRefusedWithItsAccount) {
  ModelLimits limits = kModel;
  limits.max_trained_tokens = 6;  // the records hold 3 + 4
  limits.max_trained_tokens_why = "learner.activation_budget_mb = 1 with ...";
  std::vector<RolloutRecord> group = Good();
  const std::optional<GroupProblem> p = ValidateGroup(group, limits, 10);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->reason, DeadLetterReason::kContext);
  EXPECT_EQ(p->expected, "at most 6 tokens (learner.activation_budget_mb = 1 with ...)");
  limits.max_trained_tokens = 7;
  EXPECT_FALSE(ValidateGroup(group, limits, 10).has_value());
}

TEST(GroupValidationTest, EachReasonNamesTheFieldExpectedAndFound) {
  const std::vector<Case> cases = {
      {"prompt token at the vocabulary", [](auto& g) { g[1].prompt_tokens[2] = 100; },
       DeadLetterReason::kTokenId, "records[1].prompt_tokens[2]", "100"},
      {"negative completion token", [](auto& g) { g[0].completion_tokens[3] = -1; },
       DeadLetterReason::kTokenId, "records[0].completion_tokens[3]", "-1"},
      {"longer than the context",
       [](auto& g) {
         g[2].completion_tokens.assign(62, 9);
         g[2].behaviour_logprobs.assign(62, -1.0f);
         g[2].token_versions.assign(62, 1);
       },
       DeadLetterReason::kContext, "records[2].prompt_tokens + .completion_tokens", "3 + 62 = 65"},
      {"a log-prob short", [](auto& g) { g[0].behaviour_logprobs.pop_back(); },
       DeadLetterReason::kShape, "records[0].behaviour_logprobs", "3 and 4"},
      {"a version too many", [](auto& g) { g[1].token_versions.push_back(1); },
       DeadLetterReason::kShape, "records[1].behaviour_logprobs", "4 and 5"},
      {"positive log-prob", [](auto& g) { g[2].behaviour_logprobs[1] = 0.5f; },
       DeadLetterReason::kLogprob, "records[2].behaviour_logprobs[1]", "0.5"},
      {"NaN log-prob", [](auto& g) { g[0].behaviour_logprobs[0] = std::nanf(""); },
       DeadLetterReason::kLogprob, "records[0].behaviour_logprobs[0]", "nan"},
      {"version from the future", [](auto& g) { g[1].token_versions[3] = 11; },
       DeadLetterReason::kFutureVersion, "records[1].token_versions[3]", "11"},
      {"negative version", [](auto& g) { g[0].token_versions[0] = -1; },
       DeadLetterReason::kFutureVersion, "records[0].token_versions[0]", "-1"},
      {"incomplete group", [](auto& g) { g.pop_back(); }, DeadLetterReason::kMalformed, "group",
       "group_size"},
  };
  EXPECT_FALSE(ValidateGroup(Good(), kModel, /*learner_version=*/10).has_value());
  for (const Case& c : cases) {
    std::vector<RolloutRecord> group = Good();
    c.poison(group);
    const std::optional<GroupProblem> p = ValidateGroup(group, kModel, 10);
    ASSERT_TRUE(p.has_value()) << c.name;
    EXPECT_EQ(DeadLetterReasonName(p->reason), DeadLetterReasonName(c.reason)) << c.name;
    EXPECT_NE(p->field.find(c.field), std::string::npos) << c.name << ": " << p->Describe();
    EXPECT_NE(p->found.find(c.found), std::string::npos) << c.name << ": " << p->Describe();
    EXPECT_FALSE(p->expected.empty()) << c.name;
  }
}

// A model's config as LimitsOfModel reads it (model/config.h's ModelConfig has these).
struct FakeModel {
  int64_t vocab_size = 100, max_position_embeddings = 64;
  int64_t moe_layers = 0, num_experts = 0, num_experts_per_tok = 0;
  int64_t num_moe_layers() const { return moe_layers; }
};

// MoE routes are checked at admission: a group whose routes the learner's model cannot replay
// is dead-lettered (reason "routes") instead of failing the training step on every restart.
TEST(GroupValidationTest, RoutesThatDoNotFitTheModelAreRefused) {
  const ModelLimits dense = LimitsOfModel(FakeModel{});
  const ModelLimits moe = LimitsOfModel(FakeModel{100, 64, 2, 4, 2});
  const auto routed = [](uint16_t layers, uint8_t k, size_t ids, uint8_t value) {
    std::vector<RolloutRecord> g = Good();
    g[1].route_layers = layers;
    g[1].route_top_k = k;
    g[1].routes.assign(ids, value);
    return g;
  };
  EXPECT_FALSE(ValidateGroup(Good(), dense, 10).has_value()) << "no routes: fine for any model";
  EXPECT_FALSE(ValidateGroup(routed(2, 2, 16, 3), moe, 10).has_value()) << "4 tokens x 2 x 2";
  struct RouteCase {
    std::string name;
    std::vector<RolloutRecord> group;
    ModelLimits limits;
    std::string field, found;
  };
  const std::vector<RouteCase> cases = {
      {"routes for a dense model", routed(2, 2, 16, 3), dense, "records[1].routes",
       "16 expert ids"},
      {"other layers", routed(3, 2, 24, 3), moe, "records[1].route_layers", "3 and 2"},
      {"other top-k", routed(2, 1, 8, 3), moe, "records[1].route_layers", "2 and 1"},
      {"too few ids", routed(2, 2, 15, 3), moe, "records[1].routes", "15"},
      {"an expert the model lacks", routed(2, 2, 16, 4), moe, "records[1].routes[0]", "4"},
  };
  for (const RouteCase& c : cases) {
    const std::optional<GroupProblem> p = ValidateGroup(c.group, c.limits, 10);
    ASSERT_TRUE(p.has_value()) << c.name;
    EXPECT_EQ(p->reason, DeadLetterReason::kRoutes) << c.name;
    EXPECT_NE(p->field.find(c.field), std::string::npos) << c.name << ": " << p->Describe();
    EXPECT_NE(p->found.find(c.found), std::string::npos) << c.name << ": " << p->Describe();
  }
}

TEST(GroupValidationTest, UnknownLimitsAndVersionsAreNotChecked) {
  std::vector<RolloutRecord> group = Good();
  group[0].prompt_tokens[0] = 5000;
  group[0].token_versions[0] = 1'000'000;
  EXPECT_FALSE(ValidateGroup(group, ModelLimits{}, INT64_MAX).has_value());
  EXPECT_TRUE(ValidateGroup(group, kModel, INT64_MAX).has_value()) << "the vocabulary is known";
}

class QuarantineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("prl_quarantine_test_", getpid(), "_", counter_++);
    std::filesystem::remove_all(dir_);
    path_ = (dir_ / "run" / "dead_letter.jsonl").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::vector<std::string> Lines() const {
    std::vector<std::string> out;
    std::ifstream in(path_);
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }

  std::filesystem::path dir_;
  std::string path_;
  static inline int counter_ = 0;
};

TEST_F(QuarantineTest, ALineNamesTheGroupAndTheProblemAndStaysBoundedHoweverLargeTheGroup) {
  Quarantine q(ModelLimits{100, 2'000'000}, path_, "ingest");
  std::vector<RolloutRecord> group = Good(42, 2);
  for (RolloutRecord& r : group) {
    r.run_id = std::string(255, 'r');  // the longest ids a record may carry
    r.actor_id = std::string(255, 'a');
    r.completion_tokens.assign(1'000'000, 7);
    r.behaviour_logprobs.assign(1'000'000, -1.0f);
    r.token_versions.assign(1'000'000, 0);
  }
  group[1].completion_tokens.back() = 1000;  // outside the vocabulary
  EXPECT_TRUE(IsError(q.Check(group, 10), absl::StatusCode::kInvalidArgument,
                      {"quarantined (token_id)", "records[1].completion_tokens[999999]", path_}));
  EXPECT_TRUE(q.Check(Good(43), 10).ok());
  const std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_LT(lines[0].size(), 4096u);
  const nlohmann::json j = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(j["source"], "ingest");
  EXPECT_EQ(j["prompt_set_id"], "ps-1");
  EXPECT_EQ(j["prompt_index"], 42);
  EXPECT_EQ(j["records"], 2);
  EXPECT_EQ(j["reason"], "token_id");
  EXPECT_EQ(j["expected"], "a token id in [0, 100)");
  EXPECT_EQ(j["found"], "1000");
  EXPECT_GT(j["unix_time"].get<double>(), 1.6e9);
  const QuarantineCounts counts = q.counts();
  EXPECT_EQ(counts.by_reason[static_cast<int>(DeadLetterReason::kTokenId)], 1);
  EXPECT_EQ(counts.total(), 1);
}

TEST_F(QuarantineTest, AdmitPassesGoodGroupsAndDeadLettersBadAndCorruptOnes) {
  const std::string segment = absl::StrCat("prl-test-quarantine-", getpid());
  ReplayBuffer::Remove(segment, true).IgnoreError();
  ReplayConfig config;
  config.capacity_bytes = 1 << 20;
  auto buffer = *ReplayBuffer::Create(segment, config);
  std::vector<RolloutRecord> future = Good(2);
  future[0].token_versions[0] = 8;
  ASSERT_TRUE(buffer->WriteGroup(Good(1), absl::Seconds(1)).ok());
  ASSERT_TRUE(buffer->WriteGroup(future, absl::Seconds(1)).ok());
  ASSERT_TRUE(buffer->WriteGroup(Good(3), absl::Seconds(1)).ok());
  TakeOptions take;
  take.max_groups = 3;
  std::vector<LeasedGroup> leased = *buffer->Take(take);
  ASSERT_EQ(leased.size(), 3u);
  Quarantine q(kModel, path_, "learner");
  EXPECT_TRUE(q.Admit(leased[0], /*learner_version=*/7).has_value());
  EXPECT_FALSE(q.Admit(leased[1], 7).has_value()) << "version 8 is from the future at 7";
  LeasedGroup corrupt = leased[2];
  corrupt.checksum ^= 1;
  EXPECT_FALSE(q.Admit(corrupt, 7).has_value());
  const std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(lines[0])["reason"], "future_version");
  const nlohmann::json corrupt_line = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(corrupt_line["reason"], "corrupt");
  EXPECT_EQ(corrupt_line["records"], 3);
  EXPECT_EQ(corrupt_line["group_key"].get<std::string>().size(), 16u);
  buffer.reset();
  ReplayBuffer::Remove(segment, true).IgnoreError();
}

// Dead letters are run data: the file is the owner's alone. The first of each reason is said on
// stderr (a run whose every group is refused must not look idle), later ones only counted.
TEST_F(QuarantineTest, TheFileIsPrivateAndTheFirstDeadLetterOfAReasonIsSaidOnStderr) {
  Quarantine q(ModelLimits{100, 2'000'000}, path_, "learner");
  std::vector<RolloutRecord> bad = Good(5);
  bad[0].completion_tokens[0] = 1000;
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(q.Check(bad, 10).ok());
  bad[0].prompt_index = 6;
  EXPECT_FALSE(q.Check(bad, 10).ok());
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(said, ::testing::HasSubstr("learner: dead-lettered a group (reason token_id)"));
  EXPECT_THAT(said, ::testing::HasSubstr("expected a token id in [0, 100), found 1000"));
  EXPECT_THAT(said, ::testing::HasSubstr(path_));
  EXPECT_EQ(said.find("dead-lettered"), said.rfind("dead-lettered")) << "once per reason";
  EXPECT_EQ(Lines().size(), 2u);
  EXPECT_EQ(std::filesystem::status(path_).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

TEST_F(QuarantineTest, AnUnwritableFileStillQuarantinesAndCountsTheWriteError) {
  Quarantine q(kModel, "/proc/prl-no-such-dir/dead_letter.jsonl", "learner");
  std::vector<RolloutRecord> group = Good();
  group[0].prompt_tokens[0] = 100;
  EXPECT_FALSE(q.Check(group, 10).ok());
  const QuarantineCounts counts = q.counts();
  EXPECT_EQ(counts.total(), 1);
  EXPECT_EQ(counts.write_errors, 1);
}

TEST_F(QuarantineTest, TheIngestRefusesAPoisonedGroupBeforeWritingIt) {
  const std::string segment = absl::StrCat("prl-test-quarantine-ingest-", getpid());
  ReplayBuffer::Remove(segment, true).IgnoreError();
  ReplayConfig config;
  config.capacity_bytes = 1 << 20;
  auto buffer = *ReplayBuffer::Create(segment, config);
  IngestOptions options;
  options.address = "127.0.0.1:0";
  options.model = kModel;
  options.dead_letter_path = path_;
  options.learner_version = [] { return int64_t{10}; };
  auto server = *ReplayIngestServer::Start(buffer.get(), options);
  auto client = *ReplayPushClient::Connect(absl::StrCat("127.0.0.1:", server->port()));
  std::vector<RolloutRecord> poisoned = Good(2);
  poisoned[2].completion_tokens[0] = 100;
  PushResult result;
  const absl::Status pushed = client->Push({Good(1), poisoned, Good(3)}, &result);
  EXPECT_TRUE(
      IsError(pushed, absl::StatusCode::kInvalidArgument,
              {"push message 1", "quarantined (token_id)", "records[2].completion_tokens[0]"}));
  EXPECT_EQ(result.groups_accepted, 1u);
  EXPECT_EQ(buffer->Stats().groups_in, 1) << "the poisoned group was never written";
  EXPECT_EQ(server->dead_letters().by_reason[static_cast<int>(DeadLetterReason::kTokenId)], 1);
  ASSERT_EQ(Lines().size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(Lines()[0])["source"], "ingest");
  server.reset();
  buffer.reset();
  ReplayBuffer::Remove(segment, true).IgnoreError();
}

}  // namespace
}  // namespace prl::testing
