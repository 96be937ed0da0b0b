#include "coordinator/pending_queue.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace prl::coordinator {
namespace {

using Entry = std::pair<std::string, int64_t>;
using SetVisit = PendingQueue::SetVisit;
using Visit = PendingQueue::Visit;

// Takes up to `n` entries in lease order, looking into every set.
std::vector<Entry> Take(PendingQueue& q, int n) {
  std::vector<Entry> taken;
  q.Scan([](const std::string&) { return SetVisit::kLook; },
         [&](const std::string& set, int64_t index) {
           if (static_cast<int>(taken.size()) == n) return Visit::kStop;
           taken.emplace_back(set, index);
           return Visit::kTake;
         });
  return taken;
}

TEST(PendingQueueTest, ReRunsComeFirstOldestFirstThenSetsInSubmissionOrder) {
  PendingQueue q;
  q.AddSet("a", 2);
  q.AddSet("b", 2);
  q.AddRerun("b", 7);
  q.AddRerun("a", 9);
  EXPECT_EQ(Take(q, 10),
            (std::vector<Entry>{{"b", 7}, {"a", 9}, {"a", 0}, {"a", 1}, {"b", 0}, {"b", 1}}));
  EXPECT_TRUE(q.empty());
}

TEST(PendingQueueTest, AStoppedScanKeepsTheRestInOrder) {
  PendingQueue q;
  q.AddSet("a", 3);
  EXPECT_EQ(Take(q, 1), (std::vector<Entry>{{"a", 0}}));
  EXPECT_EQ(Take(q, 5), (std::vector<Entry>{{"a", 1}, {"a", 2}}));
}

// The property the queue exists for: a set the actor cannot run costs one visit, whatever its
// size, and keeps every prompt for actors that can.
TEST(PendingQueueTest, ASetPassedOverIsNotVisitedPromptByPromptAndKeepsItsPlace) {
  PendingQueue q;
  q.AddSet("big", 100'000);
  q.AddSet("small", 2);
  int visits = 0;
  std::vector<Entry> taken;
  q.Scan([](const std::string& set) { return set == "big" ? SetVisit::kPass : SetVisit::kLook; },
         [&](const std::string& set, int64_t index) {
           ++visits;
           taken.emplace_back(set, index);
           return Visit::kTake;
         });
  EXPECT_EQ(visits, 2);
  EXPECT_EQ(taken, (std::vector<Entry>{{"small", 0}, {"small", 1}}));
  EXPECT_EQ(Take(q, 2), (std::vector<Entry>{{"big", 0}, {"big", 1}})) << "still at the head";
}

TEST(PendingQueueTest, KeptEntriesStayAndDroppedOnesAndDroppedSetsGo) {
  PendingQueue q;
  q.AddSet("done", 3);
  q.AddSet("a", 4);
  q.AddRerun("a", 2);  // stale: also in a's prompts
  std::vector<Entry> seen;
  q.Scan([](const std::string& set) { return set == "done" ? SetVisit::kDrop : SetVisit::kLook; },
         [&](const std::string& set, int64_t index) {
           seen.emplace_back(set, index);
           if (index == 2 && seen.size() == 1) return Visit::kDrop;  // the stale re-run
           return index % 2 == 1 ? Visit::kKeep : Visit::kTake;      // odd ones do not fit
         });
  EXPECT_EQ(seen, (std::vector<Entry>{{"a", 2}, {"a", 0}, {"a", 1}, {"a", 2}, {"a", 3}}));
  EXPECT_EQ(Take(q, 10), (std::vector<Entry>{{"a", 1}, {"a", 3}}));
  EXPECT_TRUE(q.empty());
}

TEST(PendingQueueTest, RemovedSetsLeaveNoEntry) {
  PendingQueue q;
  q.AddSet("old", 2);
  q.AddSet("new", 1);
  q.AddRerun("old", 1);
  q.RemoveSets([](const std::string& set) { return set == "old"; });
  EXPECT_EQ(Take(q, 10), (std::vector<Entry>{{"new", 0}}));
}

}  // namespace
}  // namespace prl::coordinator
