#include "actor/lease_book.h"

#include "absl/time/clock.h"

namespace prl::actor {

int64_t LeaseBook::Room() const {
  std::lock_guard<std::mutex> lock(mu_);
  return max_in_flight_ - static_cast<int64_t>(held_.size());
}

void LeaseBook::Grant(const prl::v1::LeaseResponse& response) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const prl::v1::LeasedPrompt& lease : response.prompts()) {
    held_.insert(lease.lease_id());  // before the next heartbeat
    granted_.push_back({lease, response.min_weight_version(), absl::Now()});
  }
  changed_.notify_all();
}

std::deque<LeasedPrompt> LeaseBook::TakeGranted() {
  std::deque<LeasedPrompt> out;
  std::lock_guard<std::mutex> lock(mu_);
  out.swap(granted_);
  return out;
}

void LeaseBook::Requeue(std::deque<LeasedPrompt> waiting) {
  if (waiting.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  granted_.insert(granted_.begin(), std::make_move_iterator(waiting.begin()),
                  std::make_move_iterator(waiting.end()));
}

void LeaseBook::WaitForGranted(absl::Duration timeout, const std::function<bool()>& halted) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                    [&] { return !granted_.empty() || halted(); });
}

void LeaseBook::Generated(std::vector<GeneratedGroup> groups) {
  if (groups.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (GeneratedGroup& g : groups) generated_.push_back(std::move(g));
  changed_.notify_all();
}

std::optional<GeneratedGroup> LeaseBook::NextGenerated(absl::Duration timeout,
                                                       const std::function<bool()>& halted) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                    [&] { return !generated_.empty() || halted(); });
  if (generated_.empty() || halted()) return std::nullopt;
  GeneratedGroup next = std::move(generated_.front());
  generated_.pop_front();
  return next;
}

void LeaseBook::Drop(const std::string& lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  held_.erase(lease_id);
  changed_.notify_all();
}

void LeaseBook::Release(const std::string& lease_id, prl::v1::ReleaseReason reason,
                        const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  held_.erase(lease_id);
  prl::v1::ReleaseRequest& release = releases_.emplace_back();
  release.set_lease_id(lease_id);
  release.set_reason(reason);
  release.set_detail(std::string(why.message()));
  changed_.notify_all();
}

std::deque<prl::v1::ReleaseRequest> LeaseBook::TakeReleases() {
  std::deque<prl::v1::ReleaseRequest> out;
  std::lock_guard<std::mutex> lock(mu_);
  out.swap(releases_);
  return out;
}

std::vector<std::string> LeaseBook::HeldForHeartbeat() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> ids(held_.begin(), held_.end());
  for (const prl::v1::ReleaseRequest& r : releases_) ids.push_back(r.lease_id());
  return ids;
}

void LeaseBook::Wait(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, absl::ToChronoMilliseconds(timeout));
}

void LeaseBook::Wake() {
  std::lock_guard<std::mutex> lock(mu_);
  changed_.notify_all();
}

}  // namespace prl::actor
