// EnvironmentPool: the environments an actor's episodes run against, by prompt set spec:
// prl's built-in ones in-process (one shared instance per name), or a user's EnvironmentService
// through a retrying client per address and time budget (env/remote_environment.h; the
// coordinator allowed the address).
//
// Thread-safety: For may be called from any thread.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "env/environment.h"
#include "prl/v1/prompt.pb.h"

namespace prl::actor {

class EnvironmentPool {
 public:
  absl::StatusOr<std::shared_ptr<env::Environment>> For(const prl::v1::EnvironmentSpec& spec);

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<env::Environment>> by_key_;
};

}  // namespace prl::actor
