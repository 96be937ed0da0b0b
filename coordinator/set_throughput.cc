#include "coordinator/set_throughput.h"

namespace prl::coordinator {

SetThroughput::Counts& SetThroughput::Of(const std::string& set_name) {
  const std::string& name = set_name.empty() ? std::string(kUnnamed) : set_name;
  auto it = by_name_.find(name);
  if (it != by_name_.end()) return it->second;
  if (names_ >= kMaxNames) return by_name_[kOtherName];
  ++names_;
  return by_name_[name];
}

}  // namespace prl::coordinator
