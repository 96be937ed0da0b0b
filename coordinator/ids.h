// The ids the coordinator hands out: prompt sets ("ps-" + 12 hex digits), actors ("actor-" +
// 10) and leases. A lease id names its prompt, so that a Complete arriving after a coordinator
// restart (when the lease table is gone) still finds it: "<set id>:<prompt index>:<nonce>".
//
// Thread-safety: RandomHex (and LeaseId) share one generator: call them under the
// coordinator's mutex.
#pragma once

#include <cstdint>
#include <string>

namespace prl::coordinator {

// 16 random hex digits.
std::string RandomHex();
std::string LeaseId(const std::string& set_id, int64_t index);
// The set and prompt a lease id names; false if it is not a lease id.
bool ParseLeaseId(const std::string& lease_id, std::string* set_id, int64_t* index);

}  // namespace prl::coordinator
