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
  EXPECT_EQ(c->run.mode, "sync");
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
      {R"({"run": {"mode": "async"}})", "run.mode: expected pipeline or sync, found 'async'"},
      {R"({"actors": {"count": 0}})", "actors.count: expected 1 to 64, found 0"},
      {R"({"actors": {"count": 2.5}})", "actors.count: expected an integer, found 2.5"},
      {R"({"task": {"samples_per_prompt": 1}})", "task.samples_per_prompt: expected 2 to 1024"},
      {R"({"learner": {"learning_rate": 1}})", "unknown key 'learner.learning_rate'"},
      {R"({"lerner": {}})", "unknown section 'lerner'"},
      {R"({"learner": 3})", "learner: expected an object, found 3"},
      {R"([1, 2])", "expected a JSON object at the top level"},
      {R"({"run": )", "not valid JSON"},
      {R"({"broadcast": {"transport": "nccl"}})", "broadcast.transport: expected shm or grpc"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<RunConfig> parsed = ParseRunConfig(c.json, "my.json");
    ASSERT_FALSE(parsed.ok()) << c.json;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.message)) << c.json;
    EXPECT_THAT(parsed.status().message(), HasSubstr("my.json")) << c.json;
  }
}

TEST(RunConfigTest, OverridesSetSingleFieldsAndAreValidatedLikeTheFile) {
  absl::StatusOr<RunConfig> c =
      ParseRunConfig(R"({"learner": {"lr": 0.5}})", "f", {"learner.lr=0.25", "run.mode=sync"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->learner.lr, 0.25);
  EXPECT_EQ(c->run.mode, "sync");
  EXPECT_THAT(ParseRunConfig("{}", "f", {"learner.steps=0"}).status().message(),
              HasSubstr("learner.steps: expected >= 1, found 0"));
  EXPECT_THAT(ParseRunConfig("{}", "f", {"lr=1"}).status().message(),
              HasSubstr("--set: expected section.key=value"));
  EXPECT_THAT(ParseRunConfig("{}", "f", {"learner.rate=1"}).status().message(),
              HasSubstr("unknown key 'learner.rate'"));
}

TEST(RunConfigTest, EveryProcessDerivesTheSameNamesAndPathsFromTheRun) {
  absl::StatusOr<RunConfig> c = ParseRunConfig(R"({"run": {"name": "exp7", "dir": "/d"}})", "f");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->checkpoint_dir(), "/d/checkpoints");
  EXPECT_EQ(c->prompt_log(), "/d/coordinator/prompts.log");
  EXPECT_EQ(c->replay_segment(), "prl-exp7-replay");
  EXPECT_EQ(c->weight_segment(), "prl-exp7-weights");
  // Two runs on one node never share shared memory.
  absl::StatusOr<RunConfig> other = ParseRunConfig(R"({"run": {"name": "exp8"}})", "f");
  EXPECT_NE(other->replay_segment(), c->replay_segment());
}

TEST(RunConfigTest, AMissingFileIsNotFoundNamingThePath) {
  absl::StatusOr<RunConfig> c = LoadRunConfig("/nonexistent/run.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("/nonexistent/run.json"));
}

}  // namespace
}  // namespace prl::config
