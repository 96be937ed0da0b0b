// AdapterChannels: a run of adapters on an actor (docs/tenants.md) — for each adapter its
// leases name, where its versions come from (a weight subscriber of the adapter alone) and
// where its groups go (a writer), opened on first use: the learner makes both when it first
// hears of the adapter, so until then Open is NotFound and the prompt waits. A channel whose
// adapter was deleted (its segments are gone) is closed, freeing its mappings.
//
// Owns: the open channels, by adapter id. Thread-safety: every method from any thread (the
// engine loop opens and polls, the finisher writes).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "actor/actor_options.h"
#include "prl/v1/prompt.pb.h"
#include "weight_broadcast/weight_transport.h"

namespace prl::actor {

class AdapterChannels {
 public:
  struct Channel {
    std::unique_ptr<WeightSubscriber> weights;  // the adapter's versions (WeightSpec.adapter)
    GroupWriter write_group;                    // its groups
    // Whether the adapter's segments are gone (the learner removed them: it was deleted); null:
    // never. A gone channel is closed, so that its mappings are freed.
    std::function<bool()> gone;
  };
  // Opens an adapter's channel; NotFound while the learner has not made it yet.
  using Opener = std::function<absl::StatusOr<Channel>(const prl::v1::LeasedAdapter& adapter)>;

  explicit AdapterChannels(Opener open) : open_(std::move(open)) {}

  // The adapter's channel, opened on first use; NotFound while it is not made yet.
  absl::Status Open(const prl::v1::LeasedAdapter& adapter);
  // The newest version of an open adapter newer than `have`, or nullopt; NotFound when it is
  // not open.
  absl::StatusOr<std::optional<VersionedWeights>> TakeNewer(const std::string& adapter_id,
                                                            int64_t have);
  // Writes a group of an open adapter; NotFound when it is not open.
  absl::Status Write(const std::string& adapter_id, absl::Span<const RolloutRecord> group);
  void Close(const std::string& adapter_id);
  // The open channels whose adapter is gone (Channel::gone).
  std::vector<std::string> Gone() const;
  std::vector<std::string> open() const;

 private:
  std::shared_ptr<Channel> Find(const std::string& adapter_id) const;

  Opener open_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Channel>> channels_;
};

}  // namespace prl::actor
