#include "learner/step_turns.h"

namespace prl::learner {

StepTurns::Turn::~Turn() {
  if (turns_ != nullptr) turns_->Release();
}

StepTurns::Turn StepTurns::Take() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t ticket = next_ticket_++;
  next_.wait(lock, [&] { return serving_ == ticket; });
  ++taken_;
  return Turn(this);
}

int64_t StepTurns::turns_taken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return taken_;
}

int64_t StepTurns::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(next_ticket_ - serving_) - (next_ticket_ > serving_ ? 1 : 0);
}

void StepTurns::Release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++serving_;
  }
  next_.notify_all();
}

}  // namespace prl::learner
