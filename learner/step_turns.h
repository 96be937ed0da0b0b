// StepTurns: the trainers of a run of adapters (docs/tenants.md) take turns, one step at a
// time, in the order they became ready: an adapter whose step's groups are in waits behind those
// that were ready before it, so every adapter with a step's worth of groups steps in turn (a
// ticket lock), and one trainer's collectives never interleave with another's on their shared
// communicator.
//
// Thread-safety: any thread; a Turn is held by one thread and released when it is destroyed.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace prl::learner {

class StepTurns {
 public:
  class Turn {
   public:
    explicit Turn(StepTurns* turns) : turns_(turns) {}
    Turn(Turn&& other) noexcept : turns_(other.turns_) { other.turns_ = nullptr; }
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;
    Turn& operator=(Turn&&) = delete;
    ~Turn();

   private:
    StepTurns* turns_;
  };

  // Waits for this caller's turn (callers are served in the order they asked).
  Turn Take();
  int64_t turns_taken() const;
  // Callers waiting for a turn now.
  int64_t waiting() const;

 private:
  void Release();

  mutable std::mutex mu_;
  std::condition_variable next_;
  uint64_t next_ticket_ = 0, serving_ = 0;
  int64_t taken_ = 0;
};

}  // namespace prl::learner
