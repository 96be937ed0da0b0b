#include "learner/step_thread.h"

namespace prl::learner {

StepThread::StepThread() : thread_([this] { Loop(); }) {}

StepThread::~StepThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void StepThread::Run(const std::function<void()>& work) {
  Job job{&work};
  std::unique_lock<std::mutex> lock(mu_);
  jobs_.push_back(&job);
  changed_.notify_all();
  changed_.wait(lock, [&] { return job.done; });
  if (job.thrown) std::rethrow_exception(job.thrown);
}

void StepThread::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, nothing left
    Job* job = jobs_.front();
    jobs_.pop_front();
    lock.unlock();
    try {
      (*job->work)();
    } catch (...) {
      job->thrown = std::current_exception();
    }
    lock.lock();
    job->done = true;
    changed_.notify_all();
  }
}

}  // namespace prl::learner
