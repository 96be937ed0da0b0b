// CommThread: one thread that runs work in submission order. A rank's collectives run on one,
// so that communication (prefetching the next unit, reduce-scattering the last one's gradient)
// overlaps computation while every rank still issues the same collectives in the same order.
// A run of adapters' trainers run their steps on one (roles/adapter_learner.cc), so that the
// rank has one OpenMP team: each thread entering an OpenMP region gets a team of its own, whose
// idle workers spin while another trainer's team computes.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "absl/status/status.h"

namespace prl::learner {

class CommThread {
 public:
  CommThread();
  ~CommThread();  // runs what is queued, then joins
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues fn; the future yields its status. After a failure, later work still runs (the
  // communicator itself refuses it, so errors surface in order).
  std::shared_future<absl::Status> Submit(std::function<absl::Status()> fn);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<absl::Status()>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace prl::learner
