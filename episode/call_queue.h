// CallQueue: the threads that make one environment's calls (episode/environment_pool.h). Jobs
// run in arrival order on at most max_threads threads, started as jobs need them: a hung
// environment ties up only its own queue's threads, and the calls of every other environment
// go on.
//
// Thread-safety: Post from any thread; Shutdown (or the destructor) once, from one thread. Jobs
// still queued at Shutdown are dropped; the running ones are waited for (make them return:
// Environment::Shutdown cancels an environment's calls).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace prl::episode {

class CallQueue {
 public:
  explicit CallQueue(int max_threads);
  ~CallQueue();
  CallQueue(const CallQueue&) = delete;
  CallQueue& operator=(const CallQueue&) = delete;

  void Post(std::function<void()> job);
  void Shutdown();
  // Jobs queued or running.
  int64_t pending() const;

 private:
  void Run();

  const int max_threads_;
  mutable std::mutex mu_;
  std::condition_variable work_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  int idle_ = 0, running_ = 0;
  bool stopping_ = false;
};

}  // namespace prl::episode
