#include "actor/lease_book.h"

#include <algorithm>

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

bool LeaseBook::Release(const std::string& lease_id, prl::v1::ReleaseReason reason,
                        const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (held_.erase(lease_id) == 0) return false;  // released or dropped already
  prl::v1::ReleaseRequest& release = releases_.emplace_back();
  release.set_lease_id(lease_id);
  release.set_reason(reason);
  release.set_detail(std::string(why.message()));
  changed_.notify_all();
  return true;
}

void LeaseBook::GiveBack(const std::vector<std::string>& reclaimed,
                         const std::vector<std::string>& lost) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto granted = [&](const std::string& id) {  // not in the engine yet: handled here
    auto it = std::find_if(granted_.begin(), granted_.end(),
                           [&](const LeasedPrompt& l) { return l.lease.lease_id() == id; });
    if (it == granted_.end()) return false;
    granted_.erase(it);
    return true;
  };
  for (const std::string& id : reclaimed) {
    if (held_.count(id) == 0) continue;
    if (!granted(id)) {
      given_back_.reclaimed.push_back(id);
      continue;
    }
    held_.erase(id);
    prl::v1::ReleaseRequest& release = releases_.emplace_back();
    release.set_lease_id(id);
    release.set_reason(prl::v1::RELEASE_REASON_RECLAIMED);
    release.set_detail("reclaimed for a fair share of the actor before it started");
  }
  for (const std::string& id : lost) {
    if (held_.count(id) == 0) continue;
    if (granted(id)) {
      held_.erase(id);
    } else {
      given_back_.lost.push_back(id);
    }
  }
  changed_.notify_all();
}

LeaseBook::GivenBack LeaseBook::TakeGivenBack() {
  std::lock_guard<std::mutex> lock(mu_);
  GivenBack out;
  std::swap(out, given_back_);
  return out;
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
