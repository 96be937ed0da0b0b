// StepTurns (learner/step_turns.h): trainers are served in the order they asked, one at a time.
#include "learner/step_turns.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace prl::learner {
namespace {

// While one holds a turn, three others ask in a known order (each asks once the previous is
// queued behind the holder): they are served in that order, never two at once.
TEST(StepTurnsTest, CallersAreServedOneAtATimeInTheOrderTheyAsked) {
  StepTurns turns;
  std::optional<StepTurns::Turn> held(turns.Take());
  std::mutex mu;
  std::vector<int> served;
  std::atomic<int> inside{0}, most_inside{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    const int64_t queued_before = turns.waiting();
    threads.emplace_back([&, i] {
      StepTurns::Turn turn = turns.Take();
      most_inside = std::max(most_inside.load(), ++inside);
      {
        std::lock_guard<std::mutex> lock(mu);
        served.push_back(i);
      }
      --inside;
    });
    // The next asks only once this one is queued: the order of asking is known.
    while (turns.waiting() == queued_before) std::this_thread::yield();
  }
  held.reset();
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(served, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(most_inside.load(), 1);
  EXPECT_EQ(turns.turns_taken(), 4);
}

}  // namespace
}  // namespace prl::learner
