// SetThroughput: each prompt set's leases and completed groups since this coordinator started,
// by the set's name (SubmitPromptSetRequest.name), for the metrics
// prl_prompt_set_leases_total{set} and prl_prompt_set_groups_completed_total{set}: whether the
// sets are leased and finished in proportion to their weights (coordinator/lease_scheduler.h).
//
// Sets that share a name (the chunks of one stream) share a series. The label's cardinality is
// bounded: the first kMaxNames names seen get a series each, and sets of later names count
// under kOtherName; a set without a name counts under kUnnamed.
//
// Not thread-safe: the coordinator calls it under its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace prl::coordinator {

class SetThroughput {
 public:
  struct Counts {
    int64_t leases = 0;            // prompts leased (a re-run again)
    int64_t groups_completed = 0;  // completions accepted
  };
  static constexpr size_t kMaxNames = 100;
  static constexpr const char* kOtherName = "_other";
  static constexpr const char* kUnnamed = "_unnamed";

  void Leased(const std::string& set_name) { ++Of(set_name).leases; }
  void Completed(const std::string& set_name) { ++Of(set_name).groups_completed; }
  // By label: at most kMaxNames names and kOtherName.
  const std::map<std::string, Counts>& by_name() const { return by_name_; }

 private:
  Counts& Of(const std::string& set_name);

  std::map<std::string, Counts> by_name_;
  size_t names_ = 0;  // names with a series of their own
};

}  // namespace prl::coordinator
