#include "coordinator/pending_queue.h"

#include <algorithm>

namespace prl::coordinator {

void PendingQueue::AddSet(const std::string& set_id, int64_t prompts) {
  if (prompts <= 0) return;
  std::deque<int64_t> indexes(static_cast<size_t>(prompts));
  for (int64_t i = 0; i < prompts; ++i) indexes[static_cast<size_t>(i)] = i;
  sets_.emplace_back(set_id, std::move(indexes));
}

void PendingQueue::AddRerun(const std::string& set_id, int64_t index) {
  reruns_.emplace_back(set_id, index);
}

void PendingQueue::RemoveSets(const std::function<bool(const std::string&)>& retired) {
  reruns_.erase(std::remove_if(reruns_.begin(), reruns_.end(),
                               [&](const auto& entry) { return retired(entry.first); }),
                reruns_.end());
  sets_.remove_if([&](const auto& set) { return retired(set.first); });
}

}  // namespace prl::coordinator
