#include "learner/comm_thread.h"

#include <utility>

namespace prl::learner {

CommThread::CommThread() : thread_([this] { Loop(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_future<absl::Status> CommThread::Submit(std::function<absl::Status()> fn) {
  std::packaged_task<absl::Status()> task(std::move(fn));
  std::shared_future<absl::Status> result = task.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return result;
}

void CommThread::Loop() {
  for (;;) {
    std::packaged_task<absl::Status()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace prl::learner
