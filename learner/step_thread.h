// StepThread: the one thread on which a rank's trainers of a run of adapters run their steps
// (TrainStep), so that the rank has one OpenMP team. Each thread that enters an OpenMP region
// gets a team of its own, and an idle team's workers spin for a while (OMP_WAIT_POLICY's
// default) while the next trainer's team computes: with 16 trainers on 2 cores that took about
// a sixth of the learner's time (docs/benchmarks.md, "Tenants at scale").
//
// Thread-safety: Run from any thread; calls run one at a time, in the order they arrive.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace prl::learner {

class StepThread {
 public:
  StepThread();
  ~StepThread();  // joins the thread
  StepThread(const StepThread&) = delete;
  StepThread& operator=(const StepThread&) = delete;

  // Runs `work` on the thread and returns once it is done; what it throws is thrown here.
  void Run(const std::function<void()>& work);

 private:
  struct Job {
    const std::function<void()>* work;
    bool done = false;
    std::exception_ptr thrown;
  };
  void Loop();

  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Job*> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace prl::learner
