// The learner's step report (learner/step_report.h): what the learner writes is what prl run
// reads, and a report that lost, renamed or retyped a field is an error naming it, never a
// silent zero in a summary.
#include "learner/step_report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"

namespace prl::learner {
namespace {

using ::testing::HasSubstr;

StepReport Example() {
  StepReport r;
  r.step = 12;
  r.version = 13;
  r.unix_time = 1.7e9 + 0.25;
  r.groups = 16;
  r.samples = 128;
  r.mean_reward = 0.625;
  r.loss = -0.0125;
  r.mean_ratio = 1.001;
  r.max_ratio = 1.5;
  r.clipped_fraction = 0.03;
  r.effective_sample_size = 0.97;
  r.kl_behaviour_learner = 1e-4;
  r.entropy = 1.25;
  r.grad_norm = 0.5;
  r.lr = 1e-4;
  r.lag_mean = 2.5;
  r.lag_max = 4;
  r.trained_tokens = 900;
  r.input_tokens = 2000;
  r.completion_tokens = 950;
  r.completion_tokens_max = 40;
  r.step_seconds = 0.75;
  r.publish_seconds = 0.01;
  r.dropped_stale = 3;
  r.dropped_stale_total = 7;
  r.stale_requeued_total = 2;
  return r;
}

TEST(StepReportTest, WhatIsWrittenReadsBackExactly) {
  const StepReport r = Example();
  absl::StatusOr<StepReport> back = ParseStepReport(StepReportToJson(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(StepReportToJson(*back), StepReportToJson(r));
  EXPECT_EQ(back->step, 12);
  EXPECT_EQ(back->dropped_stale, 3);
  EXPECT_EQ(back->dropped_stale_total, 7);
  EXPECT_EQ(back->stale_requeued_total, 2);
  EXPECT_DOUBLE_EQ(back->unix_time, r.unix_time);
  EXPECT_EQ(StepReportToJson(r).find('\n'), std::string::npos) << "one line per step";
}

// Reports written before completion_tokens_max existed (a resumed run's steps.jsonl) still read.
TEST(StepReportTest, AReportWithoutTheLongestCompletionReadsItAsZero) {
  nlohmann::json j = nlohmann::json::parse(StepReportToJson(Example()));
  j.erase("completion_tokens_max");
  absl::StatusOr<StepReport> back = ParseStepReport(j.dump());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->completion_tokens_max, 0);
  EXPECT_EQ(back->completion_tokens, 950);
}

TEST(StepReportTest, AMissingRenamedOrMistypedFieldIsAnErrorNamingIt) {
  nlohmann::json j = nlohmann::json::parse(StepReportToJson(Example()));
  nlohmann::json missing = j;
  missing.erase("completion_tokens");
  EXPECT_THAT(ParseStepReport(missing.dump()).status().message(),
              HasSubstr("field 'completion_tokens' is missing"));
  nlohmann::json renamed = j;
  renamed["reward"] = renamed["mean_reward"];
  renamed.erase("mean_reward");
  EXPECT_THAT(ParseStepReport(renamed.dump()).status().message(),
              HasSubstr("field 'mean_reward' is missing"));
  nlohmann::json extra = j;
  extra["rewards"] = 1;
  EXPECT_THAT(ParseStepReport(extra.dump()).status().message(),
              HasSubstr("unknown field 'rewards'"));
  nlohmann::json mistyped = j;
  mistyped["steps"] = nullptr;
  mistyped.erase("steps");
  mistyped["step"] = 1.5;
  EXPECT_THAT(ParseStepReport(mistyped.dump()).status().message(),
              HasSubstr("field 'step': expected an integer, found 1.5"));
  mistyped = j;
  mistyped["loss"] = "low";
  EXPECT_THAT(ParseStepReport(mistyped.dump()).status().message(),
              HasSubstr("field 'loss': expected a number, found \"low\""));
  EXPECT_THAT(ParseStepReport("step 3").status().message(), HasSubstr("expected one JSON object"));
}

// The evaluation rounds a step report carries (docs/operations.md, "Evaluation during
// training"): absent when none, read back exactly, and strict like every other field.
TEST(StepReportTest, EvaluationRoundsReadBackAndAMalformedOneIsAnErrorNamingIt) {
  StepReport r = Example();
  EXPECT_EQ(StepReportToJson(r).find("evals"), std::string::npos);
  r.evals = {{"held-out", 25, 0.5, 0.75, 4, 64}, {"other", 20, 0.0, 0.0, 1, 8}};
  absl::StatusOr<StepReport> back = ParseStepReport(StepReportToJson(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->evals, r.evals);
  nlohmann::json j = nlohmann::json::parse(StepReportToJson(r));
  nlohmann::json bad = j;
  bad["evals"][1]["pass_at_k"] = "high";
  EXPECT_THAT(ParseStepReport(bad.dump()).status().message(),
              HasSubstr("evals[1]: step report: field 'pass_at_k': expected a number"));
  bad = j;
  bad["evals"][0].erase("set");
  EXPECT_THAT(ParseStepReport(bad.dump()).status().message(), HasSubstr("evals[0]: expected"));
  bad = j;
  bad["evals"] = 3;
  EXPECT_THAT(ParseStepReport(bad.dump()).status().message(),
              HasSubstr("field 'evals': expected an array"));
}

TEST(StepReportTest, SetStepResultTakesTheLossStatisticsOfTheStep) {
  StepResult result;
  result.stats.loss.loss = 0.5;
  result.stats.loss.tokens = 10;
  result.stats.loss.ratio_sum = 12;
  result.stats.loss.ratio_max = 2;
  result.stats.loss.clipped = 1;
  result.stats.input_tokens = 30;
  result.stats.lag_mean = 1.5;
  result.stats.lag_max = 3;
  result.stats.seconds = 0.25;
  result.optimizer.grad_norm = 7;
  StepReport r;
  SetStepResult(result, 0.01, &r);
  EXPECT_DOUBLE_EQ(r.loss, 0.5);
  EXPECT_DOUBLE_EQ(r.mean_ratio, 1.2);
  EXPECT_DOUBLE_EQ(r.max_ratio, 2);
  EXPECT_DOUBLE_EQ(r.clipped_fraction, 0.1);
  EXPECT_EQ(r.trained_tokens, 10);
  EXPECT_EQ(r.input_tokens, 30);
  EXPECT_DOUBLE_EQ(r.lag_mean, 1.5);
  EXPECT_DOUBLE_EQ(r.lag_max, 3);
  EXPECT_DOUBLE_EQ(r.step_seconds, 0.25);
  EXPECT_DOUBLE_EQ(r.grad_norm, 7);
  EXPECT_DOUBLE_EQ(r.lr, 0.01);
}

}  // namespace
}  // namespace prl::learner
