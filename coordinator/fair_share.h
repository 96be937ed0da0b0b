// FairShare: one actor's prompt slots (ActorCapacity.max_prompts_in_flight) shared between the
// classes of prompt sets that want them, so that one environment's episodes — a hung
// environment's, a slow one's — never hold every slot while other sets' prompts wait
// (docs/environments.md, "Sharing an actor"). A class is a set's environment (its address, or
// "builtin:<name>"); every set without one is the class "".
//
// While other classes wait, a class holds at most share() = ceil(slots / classes that want the
// actor) of its slots: leasing skips a class at its share (MayTake), and a class above it gives
// back what the classes below their share can use and no free slot covers (ToReclaim: the
// coordinator asks the actor for those leases in its next heartbeat; they are re-queued, not
// failed attempts). A class alone takes every slot.
//
// Not thread-safe: built and used under the coordinator's mutex, per call.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "prl/v1/prompt.pb.h"

namespace prl::coordinator {

// The class of a prompt set (its environment), as above.
std::string ShareClassOf(const prl::v1::SubmitPromptSetRequest& request);

class FairShare {
 public:
  // `slots`: the actor's prompts in flight at most (0: unknown, nothing is limited); `held`: its
  // leases by class; `waiting`: the classes with pending prompts it can run.
  FairShare(int64_t slots, std::map<std::string, int64_t> held, std::set<std::string> waiting);

  int64_t share() const { return share_; }
  // Whether the actor may take one more lease of `klass` now (then counted as held): below its
  // share, or no other waiting class is below its share.
  bool MayTake(const std::string& klass);
  // Whether `klass` is at its share while another waiting class is below its own.
  bool Blocked(const std::string& klass) const;
  // Leases of each class above its share to give back now.
  std::map<std::string, int64_t> ToReclaim() const;

 private:
  bool OtherBelowShareWaits(const std::string& klass) const;

  int64_t slots_;
  std::map<std::string, int64_t> held_;
  std::set<std::string> waiting_;
  int64_t share_ = 0;
};

}  // namespace prl::coordinator
