// The lease scheduler on its own (coordinator/lease_scheduler.h): lease order within a set,
// sets passed over whole, stale entries dropped, and the weighted round robin's shares.
#include "coordinator/lease_scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace prl::coordinator {
namespace {

using Entry = std::pair<std::string, int64_t>;
using SetCheck = LeaseScheduler::SetCheck;
using PromptCheck = LeaseScheduler::PromptCheck;

SetCheck Open(const std::string&) { return SetCheck::kOpen; }
PromptCheck Runs(const std::string&, int64_t) { return PromptCheck::kRuns; }

// Takes up to `n` prompts in one round with the given checks.
template <typename SetChecker = decltype(&Open), typename PromptChecker = decltype(&Runs)>
std::vector<Entry> Take(LeaseScheduler& s, int n, SetChecker set_check = &Open,
                        PromptChecker prompt_check = &Runs) {
  std::vector<Entry> taken;
  LeaseScheduler::Round round = s.StartRound(set_check, prompt_check);
  while (static_cast<int>(taken.size()) < n) {
    const std::optional<PromptRef> next = round.Next();
    if (!next.has_value()) break;
    taken.emplace_back(next->set_id, next->index);
  }
  return taken;
}

// Leases taken per set over `n` prompts, one round per prompt (one lease call each).
std::map<std::string, int> SharesOver(LeaseScheduler& s, int n) {
  std::map<std::string, int> leased;
  for (int i = 0; i < n; ++i) {
    const std::vector<Entry> one = Take(s, 1);
    if (one.empty()) break;
    ++leased[one[0].first];
  }
  return leased;
}

// Each set's share of `total` leases is within 2% (of all leases) of its weight's share.
void ExpectShares(const std::map<std::string, int>& leased,
                  const std::map<std::string, double>& weights, int total) {
  double sum = 0;
  for (const auto& [set, w] : weights) sum += w;
  int counted = 0;
  for (const auto& [set, w] : weights) {
    const auto it = leased.find(set);
    const int n = it == leased.end() ? 0 : it->second;
    counted += n;
    EXPECT_NEAR(static_cast<double>(n) / total, w / sum, 0.02)
        << set << ": " << n << " of " << total << " leases for weight " << w << " of " << sum;
  }
  EXPECT_EQ(counted, total);
}

TEST(LeaseSchedulerTest, ASetsReRunsComeFirstOldestFirstThenItsPromptsInIndexOrder) {
  LeaseScheduler s;
  s.AddSet("a", 3, 1);
  s.AddRerun("a", 9);
  s.AddRerun("a", 7);
  EXPECT_EQ(Take(s, 10), (std::vector<Entry>{{"a", 9}, {"a", 7}, {"a", 0}, {"a", 1}, {"a", 2}}));
  EXPECT_TRUE(s.empty());
  s.AddRerun("a", 1);  // a set drained and then re-run (a completed prompt handed back)
  s.AddRerun("unknown", 0);
  EXPECT_EQ(Take(s, 10), (std::vector<Entry>{{"a", 1}}));
}

TEST(LeaseSchedulerTest, EqualWeightsAlternateAndTiesGoToTheEarlierSet) {
  LeaseScheduler s;
  s.AddSet("a", 3, 1);
  s.AddSet("b", 3, 1);
  EXPECT_EQ(Take(s, 10),
            (std::vector<Entry>{{"a", 0}, {"b", 0}, {"a", 1}, {"b", 1}, {"a", 2}, {"b", 2}}));
}

TEST(LeaseSchedulerTest, WeightsOneAndThreeInterleaveSmoothly) {
  LeaseScheduler s;
  s.AddSet("a", 100, 1);
  s.AddSet("b", 100, 3);
  std::string order;
  for (const Entry& e : Take(s, 8)) order += e.first;
  EXPECT_EQ(order, "babbbabb");
}

// The property weights exist for: over 1,000 leases each set's share is within 2% of its
// weight's share, for integer and for uneven weights.
TEST(LeaseSchedulerTest, OverAThousandLeasesEachSetsShareIsWithinTwoPercentOfItsWeight) {
  for (const std::map<std::string, double>& weights :
       {std::map<std::string, double>{{"a", 1}, {"b", 2}, {"c", 5}},
        std::map<std::string, double>{{"a", 0.3}, {"b", 1.7}, {"c", 3.14}, {"d", 0.001}},
        std::map<std::string, double>{{"a", 1000}, {"b", 1}}}) {
    LeaseScheduler s;
    for (const auto& [set, w] : weights) s.AddSet(set, 10'000, w);
    ExpectShares(SharesOver(s, 1000), weights, 1000);
  }
}

// Tenants: a tenant with ten sets (a flood) and two tenants with one set each share the leases
// equally by tenant, within 2%; within a tenant its sets share its part by weight.
TEST(LeaseSchedulerTest, TenantsShareEquallyWhateverTheirNumberOfSets) {
  LeaseScheduler s;
  std::map<std::string, double> flood_sets;
  for (int i = 0; i < 10; ++i) {
    const std::string id = "flood-" + std::to_string(i);
    s.AddSet(id, 10'000, i < 5 ? 1 : 3, "tenant:flood");
    flood_sets[id] = i < 5 ? 1 : 3;
  }
  s.AddSet("a", 10'000, 1, "tenant:a");
  s.AddSet("b", 10'000, 5, "tenant:b");  // a set's weight counts within its tenant only
  const std::map<std::string, int> leased = SharesOver(s, 3000);
  int flood = 0;
  for (const auto& [id, w] : flood_sets) flood += leased.count(id) ? leased.at(id) : 0;
  EXPECT_NEAR(flood / 3000.0, 1.0 / 3, 0.02) << flood;
  EXPECT_NEAR(leased.at("a") / 3000.0, 1.0 / 3, 0.02) << leased.at("a");
  EXPECT_NEAR(leased.at("b") / 3000.0, 1.0 / 3, 0.02) << leased.at("b");
  // Within the flooding tenant, its sets by weight (1 : 3).
  std::map<std::string, int> within;
  for (const auto& [id, w] : flood_sets) within[id] = leased.count(id) ? leased.at(id) : 0;
  ExpectShares(within, flood_sets, flood);
}

// A set that runs dry drops out and the others keep their proportion between them; it earned
// no credit meanwhile, so a re-run of it later is leased in turn, not in a burst.
TEST(LeaseSchedulerTest, ASetWithoutPromptsIsSkippedAndTheOthersKeepTheirProportion) {
  LeaseScheduler s;
  s.AddSet("a", 10'000, 1);
  s.AddSet("b", 10, 2);
  s.AddSet("c", 10'000, 5);
  const std::map<std::string, int> first = SharesOver(s, 40);
  EXPECT_EQ(first.at("b"), 10);
  ExpectShares(SharesOver(s, 1000), {{"a", 1}, {"c", 5}}, 1000);
  s.AddRerun("b", 3);
  s.AddRerun("b", 4);
  const std::vector<Entry> next = Take(s, 8);
  int of_b = 0;
  for (const Entry& e : next) of_b += e.first == "b" ? 1 : 0;
  EXPECT_EQ(of_b, 2) << "the re-runs are leased among the next 8";
  EXPECT_NE(next[0].first, "b") << "but not as a burst of credit saved while it was empty";
}

// A set that waits (its class at its fair share) or that the actor cannot run neither earns
// nor pays: the open sets share the leases by their own weights, and the waiting set gets its
// own share as soon as it is open again.
TEST(LeaseSchedulerTest, SetsThatAreNotOpenEarnNoCredit) {
  LeaseScheduler s;
  s.AddSet("a", 10'000, 1);
  s.AddSet("b", 10'000, 1);
  s.AddSet("c", 10'000, 2);
  std::map<std::string, int> leased;
  for (int i = 0; i < 300; ++i) {
    for (const Entry& e : Take(s, 1, [](const std::string& set) {
           return set == "c" ? SetCheck::kWait : SetCheck::kOpen;
         })) {
      ++leased[e.first];
    }
  }
  ExpectShares(leased, {{"a", 1}, {"b", 1}}, 300);
  std::string order;
  for (const Entry& e : Take(s, 4)) order += e.first;
  EXPECT_EQ(order, "cabc") << "c takes its half again, no more";
}

// The property the per-set queues exist for: a set the actor cannot run costs one visit per
// round, whatever its size, and keeps every prompt for actors that can.
TEST(LeaseSchedulerTest, ASetPassedOverIsNotVisitedPromptByPromptAndKeepsItsPlace) {
  LeaseScheduler s;
  s.AddSet("big", 100'000, 1);
  s.AddSet("small", 2, 1);
  int set_checks = 0, prompt_checks = 0;
  const std::vector<Entry> taken = Take(
      s, 10,
      [&](const std::string& set) {
        set_checks += set == "big" ? 1 : 0;
        return set == "big" ? SetCheck::kPass : SetCheck::kOpen;
      },
      [&](const std::string&, int64_t) {
        ++prompt_checks;
        return PromptCheck::kRuns;
      });
  EXPECT_EQ(taken, (std::vector<Entry>{{"small", 0}, {"small", 1}}));
  EXPECT_EQ(set_checks, 1) << "passed once for the whole round";
  EXPECT_EQ(prompt_checks, 2);
  EXPECT_EQ(Take(s, 2), (std::vector<Entry>{{"big", 0}, {"big", 1}})) << "still at its head";
}

// Prompts the actor cannot run keep their place (and are not looked at again in the round),
// stale ones and a finished set's are dropped.
TEST(LeaseSchedulerTest, KeptEntriesStayAndDroppedOnesAndDroppedSetsGo) {
  LeaseScheduler s;
  s.AddSet("done", 3, 1);
  s.AddSet("a", 4, 1);
  s.AddRerun("a", 2);  // stale: also among a's prompts
  std::vector<Entry> seen;
  bool stale_dropped = false;
  const std::vector<Entry> taken = Take(
      s, 10,
      [](const std::string& set) { return set == "done" ? SetCheck::kDrop : SetCheck::kOpen; },
      [&](const std::string& set, int64_t index) {
        seen.emplace_back(set, index);
        if (index == 2 && !stale_dropped) {
          stale_dropped = true;
          return PromptCheck::kDrop;  // the stale re-run
        }
        return index % 2 == 1 ? PromptCheck::kKeep : PromptCheck::kRuns;  // odd ones do not fit
      });
  EXPECT_EQ(taken, (std::vector<Entry>{{"a", 0}, {"a", 2}}));
  EXPECT_EQ(seen, (std::vector<Entry>{{"a", 2}, {"a", 0}, {"a", 1}, {"a", 2}, {"a", 3}}))
      << "each entry looked at once";
  EXPECT_EQ(Take(s, 10), (std::vector<Entry>{{"a", 1}, {"a", 3}}));
  EXPECT_TRUE(s.empty());
}

TEST(LeaseSchedulerTest, RemovedSetsLeaveNoEntry) {
  LeaseScheduler s;
  s.AddSet("old", 2, 1);
  s.AddSet("new", 1, 1);
  s.AddRerun("old", 1);
  s.RemoveSets([](const std::string& set) { return set == "old"; });
  EXPECT_EQ(Take(s, 10), (std::vector<Entry>{{"new", 0}}));
  s.AddRerun("old", 0);  // forgotten: ignored
  EXPECT_TRUE(s.empty());
}

}  // namespace
}  // namespace prl::coordinator
