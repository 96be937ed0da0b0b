#include "learner/step_batcher.h"

#include <algorithm>
#include <exception>

#include "absl/strings/str_cat.h"

namespace prl::learner {

StepBatcher::StepBatcher(StepTurns* turns, int64_t pass_tokens)
    : turns_(turns), pass_tokens_(pass_tokens), thread_([this] { Loop(); }) {}

StepBatcher::~StepBatcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

std::unique_ptr<StepBatcher::Member> StepBatcher::Join() {
  std::unique_ptr<Member> m(new Member(this));
  std::lock_guard<std::mutex> lock(mu_);
  members_.emplace_back(m.get(), State::kBusy);
  return m;
}

StepBatcher::Member::~Member() {
  {
    std::lock_guard<std::mutex> lock(batcher_->mu_);
    std::erase_if(batcher_->members_, [this](const auto& m) { return m.first == this; });
  }
  batcher_->changed_.notify_all();  // a round may have waited for it
}

void StepBatcher::Set(const Member* member, State state) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [m, s] : members_) {
      if (m == member) s = state;
    }
  }
  changed_.notify_all();
}

void StepBatcher::Member::Busy() { batcher_->Set(this, State::kBusy); }

void StepBatcher::Member::Waiting() { batcher_->Set(this, State::kWaiting); }

absl::StatusOr<StepResult> StepBatcher::Member::Train(const AdapterStep& step) {
  Request request{this, step};
  std::unique_lock<std::mutex> lock(batcher_->mu_);
  if (batcher_->stop_) return absl::CancelledError("the step batcher stopped");
  batcher_->queued_.push_back(&request);
  for (auto& [m, s] : batcher_->members_) {
    if (m == this) s = State::kQueued;
  }
  batcher_->changed_.notify_all();
  batcher_->changed_.wait(lock, [&] { return request.done; });
  return std::move(request.result);
}

int64_t StepBatcher::rounds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rounds_;
}

int64_t StepBatcher::steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return steps_;
}

bool StepBatcher::RoundCanStart() const {
  return !queued_.empty() && std::none_of(members_.begin(), members_.end(),
                                          [](const auto& m) { return m.second == State::kBusy; });
}

void StepBatcher::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    changed_.wait(lock, [&] { return stop_ || RoundCanStart(); });
    if (stop_) break;
    std::vector<Request*> round = std::exchange(queued_, {});
    lock.unlock();
    RunRound(round);
    lock.lock();
    ++rounds_;
    steps_ += static_cast<int64_t>(round.size());
    for (Request* r : round) {
      r->done = true;
      for (auto& [m, state] : members_) {  // publishing next: the next round waits for it
        if (m == r->member) state = State::kBusy;
      }
    }
    changed_.notify_all();
  }
  for (Request* r : queued_) {  // (none once every member is gone)
    r->result = absl::CancelledError("the step batcher stopped");
    r->done = true;
  }
  changed_.notify_all();
}

void StepBatcher::RunRound(std::vector<Request*>& round) {
  const StepTurns::Turn turn = turns_->Take();
  try {
    // Each step's own errors are its alone.
    std::vector<Request*> joint;
    std::vector<AdapterStep> steps;
    for (Request* r : round) {
      const absl::Status own = CheckAdapterStep(r->step);
      if (!own.ok()) {
        r->result = own;
        continue;
      }
      joint.push_back(r);
      steps.push_back(r->step);
    }
    if (steps.empty()) return;
    if (!CheckJointStep(steps).ok()) {  // one after another
      for (Request* r : joint) {
        const AdapterStep& s = r->step;
        r->result = TrainStep(*s.model, *s.optimizer, s.samples, *s.config, s.learner_version);
      }
      return;
    }
    absl::StatusOr<std::vector<StepResult>> results = TrainJointStep(steps, pass_tokens_);
    for (size_t i = 0; i < joint.size(); ++i) {
      joint[i]->result = results.ok() ? absl::StatusOr<StepResult>((*results)[i])
                                      : absl::StatusOr<StepResult>(results.status());
    }
  } catch (const std::exception& e) {  // (an allocation): the round's steps fail, not the rank
    for (Request* r : round) {
      r->result = absl::ResourceExhaustedError(absl::StrCat("joint step: ", e.what()));
    }
  }
}

}  // namespace prl::learner
