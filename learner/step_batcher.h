// StepBatcher: the trainers of a run of adapters on one rank (roles/adapter_learner.h) hand it
// their steps, and it trains every step handed in meanwhile as one joint step
// (learner/joint_step.h: one set of passes over the shared frozen base), on its own thread (one
// OpenMP team), holding a turn (learner/step_turns.h) so that no trainer's collectives or passes
// run beside it.
//
// When a round starts: as soon as a step is waiting and no member is busy, that is between its
// last round and its next step (publishing, checkpointing, or taking groups that are in). A
// member that waits for groups (Waiting) does not hold the others back; one whose step is
// coming shortly is waited for, so that adapters that are all ready step together rather than
// splitting into cohorts. Each step's own errors (its samples, its settings) fail that step
// alone; steps that cannot be joint (CheckJointStep) train one after another in the round.
//
// Thread-safety: any thread. A Member is used by its trainer's thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "learner/joint_step.h"
#include "learner/step_turns.h"
#include "learner/train_step.h"

namespace prl::learner {

class StepBatcher {
 public:
  // pass_tokens: TrainJointStep's. `turns` must outlive this.
  StepBatcher(StepTurns* turns, int64_t pass_tokens);
  ~StepBatcher();  // after every Member is gone
  StepBatcher(const StepBatcher&) = delete;
  StepBatcher& operator=(const StepBatcher&) = delete;

  class Member {
   public:
    ~Member();  // leaves: rounds no longer wait for it
    Member(const Member&) = delete;
    Member& operator=(const Member&) = delete;
    // Working toward its next step (the state after joining and after each round).
    void Busy();
    // Waiting for groups: rounds start without it.
    void Waiting();
    // Trains `step` in the next round; returns when that round is done.
    absl::StatusOr<StepResult> Train(const AdapterStep& step);

   private:
    friend class StepBatcher;
    explicit Member(StepBatcher* batcher) : batcher_(batcher) {}
    StepBatcher* batcher_;
  };
  std::unique_ptr<Member> Join();

  // Rounds run and steps trained so far (steps / rounds: the mean adapters per round).
  int64_t rounds() const;
  int64_t steps() const;

 private:
  enum class State { kBusy, kWaiting, kQueued };
  struct Request {
    const Member* member;
    AdapterStep step;
    absl::StatusOr<StepResult> result = absl::UnknownError("not trained");
    bool done = false;
  };
  void Loop();
  bool RoundCanStart() const;  // (mu_ held)
  void RunRound(std::vector<Request*>& round);
  void Set(const Member* member, State state);

  StepTurns* const turns_;
  const int64_t pass_tokens_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::vector<std::pair<const Member*, State>> members_;
  std::vector<Request*> queued_;
  int64_t rounds_ = 0, steps_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace prl::learner
