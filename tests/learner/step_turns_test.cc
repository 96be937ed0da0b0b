// StepTurns (learner/step_turns.h): trainers are served in the order they asked, one at a time;
// and CommThread (learner/comm_thread.h): their steps run on one thread.
#include "learner/step_turns.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "learner/comm_thread.h"

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

// CommThread (learner/comm_thread.h), as a run of adapters' trainers use it for their steps:
// every caller's work runs on that one thread (one OpenMP team), one at a time, the future is
// ready once it is done, and what it throws is thrown by the future's get.
TEST(CommThreadTest, EveryCallersWorkRunsOnTheOneThreadOneAtATime) {
  CommThread step_thread;
  std::mutex mu;
  std::set<std::thread::id> ran_on;
  std::atomic<int> inside{0}, most_inside{0}, done{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < 4; ++i) {
    callers.emplace_back([&] {
      for (int j = 0; j < 25; ++j) {
        step_thread
            .Submit([&] {
              most_inside = std::max(most_inside.load(), ++inside);
              {
                std::lock_guard<std::mutex> lock(mu);
                ran_on.insert(std::this_thread::get_id());
              }
              --inside;
              ++done;
              return absl::OkStatus();
            })
            .get();
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(done.load(), 100);
  EXPECT_EQ(most_inside.load(), 1);
  ASSERT_EQ(ran_on.size(), 1u);
  EXPECT_NE(*ran_on.begin(), std::this_thread::get_id());
  EXPECT_THROW(step_thread
                   .Submit([]() -> absl::Status { throw std::runtime_error("out of memory"); })
                   .get(),
               std::runtime_error);
  EXPECT_TRUE(step_thread.Submit([] { return absl::OkStatus(); }).get().ok());  // it lives on
}

}  // namespace
}  // namespace prl::learner
