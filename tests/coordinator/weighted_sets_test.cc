// Weighted prompt sets through the coordinator (coordinator/lease_scheduler.h): sets with
// prompts to lease share the leases in proportion to their weights, within the lag budget and
// across a restart; a weight out of range is refused naming the field; leases and completed
// groups are counted per set name, in bounded series (coordinator/set_throughput.h).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "coordinator/set_throughput.h"
#include "tests/coordinator/coordinator_fixture.h"
#include "tests/status_testing.h"

namespace prl::coordinator {
namespace {

using ::prl::testing::IsError;

class WeightedSetsTest : public CoordinatorTest {
 protected:
  static v1::SubmitPromptSetRequest Weighted(int prompts, double weight,
                                             const std::string& name = "test") {
    v1::SubmitPromptSetRequest r = Request(prompts);
    r.set_weight(weight);
    r.set_name(name);
    return r;
  }
  // Leases `n` prompts in calls of up to `per_call` each; the leases per set.
  static std::map<std::string, int> LeaseMany(Coordinator& c, const std::string& actor, int n,
                                              int per_call) {
    std::map<std::string, int> leased;
    for (int taken = 0; taken < n;) {
      absl::StatusOr<v1::LeaseResponse> r = c.Lease(LeaseOf(actor, std::min(per_call, n - taken)));
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok() || r->prompts_size() == 0) break;
      for (const v1::LeasedPrompt& p : r->prompts()) ++leased[p.prompt_set_id()];
      taken += r->prompts_size();
    }
    return leased;
  }
  // `leased[set]` is within 2% of `total` of `share` * total.
  static void ExpectShare(const std::map<std::string, int>& leased, const std::string& set,
                          double share, int total) {
    const auto it = leased.find(set);
    const int n = it == leased.end() ? 0 : it->second;
    EXPECT_NEAR(static_cast<double>(n) / total, share, 0.02)
        << set << " got " << n << " of " << total << " leases";
  }
};

// Two sets of weights 1 and 3, both with plenty of prompts: over 1,000 leases (calls of 8, as
// an actor asks) they are leased 1:3, and a restarted coordinator keeps their weights (from the
// log's snapshot: it was compacted).
TEST_F(WeightedSetsTest, SetsAreLeasedInProportionToTheirWeightsAcrossARestart) {
  config_.compact_log_bytes = 4096;
  std::string light, heavy;
  {
    auto c = Open();
    light = c->Submit(Weighted(2000, 1))->prompt_set_id();
    heavy = c->Submit(Weighted(2000, 3))->prompt_set_id();
    EXPECT_GT(c->Stats().log_compactions, 0);
    EXPECT_DOUBLE_EQ(c->Get(heavy)->weight(), 3);
    const std::string actor = c->RegisterActor("a")->actor_id();
    const std::map<std::string, int> leased = LeaseMany(*c, actor, 1000, 8);
    ExpectShare(leased, light, 0.25, 1000);
    ExpectShare(leased, heavy, 0.75, 1000);
  }
  auto c = Open();  // the leases are gone: every prompt is pending again
  EXPECT_DOUBLE_EQ(c->Get(light)->weight(), 1);
  EXPECT_DOUBLE_EQ(c->Get(heavy)->weight(), 3);
  const std::string actor = c->RegisterActor("b")->actor_id();
  const std::map<std::string, int> leased = LeaseMany(*c, actor, 1000, 1);
  ExpectShare(leased, light, 0.25, 1000);
  ExpectShare(leased, heavy, 0.75, 1000);
}

// The lag budget decides how many prompts are leased, the weights which: with a budget of 4
// groups ahead of the learner, every step's leases still go 1:3, and so do the completed
// groups the coordinator counts per set name (the metrics' per-set throughput).
TEST_F(WeightedSetsTest, WithinTheLagBudgetTheWeightsChooseWhichSetIsLeased) {
  config_.max_lag = 1;
  config_.groups_per_step = 2;  // (1 + 1) * 2 = 4 groups ahead of the learner
  auto c = Open();
  const std::string light = c->Submit(Weighted(1000, 1, "light"))->prompt_set_id();
  const std::string heavy = c->Submit(Weighted(1000, 3, "heavy"))->prompt_set_id();
  const std::string actor = c->RegisterActor("a")->actor_id();
  std::map<std::string, int> leased;
  for (int step = 1; step <= 100; ++step) {
    const absl::StatusOr<v1::LeaseResponse> r = c->Lease(LeaseOf(actor, 100));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->prompts_size(), 4) << "the budget";
    for (const v1::LeasedPrompt& p : r->prompts()) {
      ++leased[p.prompt_set_id()];
      ASSERT_TRUE(c->Complete(Done(actor, p)).ok());
    }
    ASSERT_TRUE(c->LearnerProgress(step, 4 * step).ok());  // trained on: the budget frees
  }
  ExpectShare(leased, light, 0.25, 400);
  ExpectShare(leased, heavy, 0.75, 400);
  const std::map<std::string, SetThroughput::Counts> by_name = c->Stats().set_throughput;
  ASSERT_EQ(by_name.size(), 2u);
  EXPECT_EQ(by_name.at("light").leases, leased[light]);
  EXPECT_EQ(by_name.at("light").groups_completed, leased[light]);
  EXPECT_EQ(by_name.at("heavy").leases, leased[heavy]);
  EXPECT_EQ(by_name.at("heavy").groups_completed, leased[heavy]);
}

// Per-set series stay bounded whatever names clients choose: the first 100 names get their
// own, later ones count together.
TEST(SetThroughputTest, TheFirstHundredNamesGetASeriesAndLaterOnesCountTogether) {
  SetThroughput t;
  for (int i = 0; i < 150; ++i) t.Leased(absl::StrCat("set ", i));
  t.Completed("set 7");
  t.Completed("set 140");
  t.Leased("");
  const std::map<std::string, SetThroughput::Counts>& by_name = t.by_name();
  EXPECT_EQ(by_name.size(), SetThroughput::kMaxNames + 1);
  EXPECT_EQ(by_name.at("set 7").groups_completed, 1);
  EXPECT_EQ(by_name.count("set 140"), 0u);
  EXPECT_EQ(by_name.at(SetThroughput::kOtherName).leases, 51) << "50 late names and the unnamed";
  EXPECT_EQ(by_name.at(SetThroughput::kOtherName).groups_completed, 1);
}

// Unset (0) is 1; anything else outside 0.001..1000, or not a number, is refused naming the
// field, and nothing is accepted.
TEST_F(WeightedSetsTest, AWeightOutsideItsRangeIsRefusedNamingTheField) {
  auto c = Open();
  for (double bad : {-1.0, 1e-4, 1e4, std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_TRUE(IsError(c->Submit(Weighted(1, bad)).status(), absl::StatusCode::kInvalidArgument,
                        {"weight: expected 0 (unset: 1) or 0.001 to 1000, found"}))
        << bad;
  }
  EXPECT_EQ(c->List().size(), 0u);
  const std::string unset = c->Submit(Request(1))->prompt_set_id();
  EXPECT_DOUBLE_EQ(c->Get(unset)->weight(), 1);
  EXPECT_TRUE(c->Submit(Weighted(1, 1000)).ok());
  EXPECT_TRUE(c->Submit(Weighted(1, 0.001)).ok());
}

}  // namespace
}  // namespace prl::coordinator
