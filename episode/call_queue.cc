#include "episode/call_queue.h"

#include <algorithm>

namespace prl::episode {

CallQueue::CallQueue(int max_threads) : max_threads_(std::max(1, max_threads)) {}

CallQueue::~CallQueue() { Shutdown(); }

void CallQueue::Post(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  jobs_.push_back(std::move(job));
  // A job no idle thread will take starts a thread, up to the cap.
  if (idle_ < static_cast<int>(jobs_.size()) && static_cast<int>(threads_.size()) < max_threads_) {
    ++idle_;  // counted idle until it takes its first job
    threads_.emplace_back([this] { Run(); });
  }
  work_.notify_one();
}

void CallQueue::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (stopping_) return;
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    --idle_;
    ++running_;
    lock.unlock();
    job();
    lock.lock();
    --running_;
    ++idle_;
  }
}

void CallQueue::Shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    jobs_.clear();
    threads.swap(threads_);
  }
  work_.notify_all();
  for (std::thread& t : threads) t.join();
}

int64_t CallQueue::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(jobs_.size()) + running_;
}

}  // namespace prl::episode
