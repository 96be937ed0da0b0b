#include "coordinator/ids.h"

#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace prl::coordinator {

std::string RandomHex() {
  static std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("%016x", rng());
}

std::string LeaseId(const std::string& set_id, int64_t index) {
  return absl::StrCat(set_id, ":", index, ":", RandomHex().substr(0, 8));
}

bool ParseLeaseId(const std::string& lease_id, std::string* set_id, int64_t* index) {
  std::vector<std::string> parts = absl::StrSplit(lease_id, ':');
  return parts.size() == 3 && absl::SimpleAtoi(parts[1], index) && (*set_id = parts[0], true);
}

}  // namespace prl::coordinator
