// The coordinator's bounded, durable state (declared in coordinator.h): the prompt log
// compacted into the prompt sets' snapshot (coordinator/prompt_sets_snapshot.cc), and finished
// sets retired after retention_s together with their leases.
#include <algorithm>
#include <cstdio>
#include <iterator>
#include <vector>

#include "coordinator/coordinator.h"

namespace prl::coordinator {

void Coordinator::CompactIfDueLocked() {
  const PromptLogStats log = log_->stats();
  if (log.bytes <=
      std::max({config_.compact_log_bytes, 2 * log.snapshot_bytes, compact_retry_bytes_})) {
    return;
  }
  // The adapters first: a replay meets each before its sets.
  std::vector<prl::v1::LogRecord> snapshot = adapters_.Snapshot();
  std::vector<prl::v1::LogRecord> sets = sets_.Snapshot();
  snapshot.insert(snapshot.end(), std::make_move_iterator(sets.begin()),
                  std::make_move_iterator(sets.end()));
  const absl::Status compacted = log_->Compact(snapshot);
  if (!compacted.ok()) {
    // The old log stays in use (Compact says so otherwise, and the next append fails).
    compact_retry_bytes_ = 2 * log.bytes;
    std::fprintf(
        stderr, "coordinator: cannot compact the prompt log (%s); retrying at %lld bytes\n",
        std::string(compacted.message()).c_str(), static_cast<long long>(compact_retry_bytes_));
    return;
  }
  ++stats_.log_compactions;
}

void Coordinator::RetireFinishedLocked(absl::Time now) {
  const std::vector<std::string> retired = sets_.Retire(now, config_.retention_s);
  if (retired.empty()) return;
  const auto is_retired = [&](const std::string& id) {
    return std::binary_search(retired.begin(), retired.end(), id);  // Retire returns them sorted
  };
  leases_.EndSets(is_retired);
  scheduler_.RemoveSets(is_retired);
  adapters_.RemoveSets(is_retired);
  changed_.notify_all();  // watchers of a retired set find it gone
}

}  // namespace prl::coordinator
