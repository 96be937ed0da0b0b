// The replay buffer's remote ingest: a gRPC ReplayService (proto/prl/v1/replay.proto) on the
// learner's node, so that actors on other machines can push groups into the local segment,
// and the client they push with.
//
// Each PushRequest carries one complete group, checked against the model
// (replay/group_validation.h) and written atomically (WriteGroup); a bad group is quarantined
// (replay/quarantine.h: one line in the dead-letter file, counted by reason) and ends the
// stream with INVALID_ARGUMENT naming the reason, record and field; a buffer that stays full
// past write_timeout ends it with RESOURCE_EXHAUSTED. Groups accepted before an error stay
// accepted; PushResponse counts them. Message limits are raised to max_message_bytes to fit
// the largest record. Health checking and reflection are on. In a run of adapters each push
// names its adapter and enters that adapter's buffer (IngestOptions.adapter_buffer).
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "prl/v1/replay.grpc.pb.h"
#include "replay/quarantine.h"
#include "replay/replay_buffer.h"

namespace prl {

struct IngestOptions {
  std::string address = "127.0.0.1:50061";  // loopback by default; port 0 picks a free one
  int64_t max_message_bytes = int64_t{256} << 20;
  absl::Duration write_timeout = absl::Seconds(10);  // per group, while the buffer is full
  // The model groups are checked against (vocab_size 0: the record invariants only), where
  // refused groups are recorded (empty: counted only), and the learner's weight version for
  // "not from the future" (null: versions are checked >= 0 only).
  ModelLimits model;
  std::string dead_letter_path;
  std::function<int64_t()> learner_version;
  // Decides whether a decoded group may enter the buffer its push names (PushRequest.adapter_id;
  // empty: the run's): the replay role admits only groups of its run, from the actor that holds
  // their prompt's lease, of that lease's adapter; null: every valid group. A refused group
  // ends the stream with the status admit returned.
  std::function<absl::Status(absl::Span<const RolloutRecord> group, const std::string& adapter_id)>
      admit;
  // A run of adapters (docs/tenants.md): the replay of an adapter, by its id; an error ends the
  // stream with it (UNAVAILABLE: not made yet, the actor retries). Null: a push that names an
  // adapter is refused (INVALID_ARGUMENT naming adapter_id).
  std::function<absl::StatusOr<std::shared_ptr<ReplayBuffer>>(const std::string& adapter_id)>
      adapter_buffer;
  // Told of each group written (its records); null: nobody. Called on the push's thread:
  // thread-safe.
  std::function<void(size_t records)> on_written;
};

class ReplayIngestServer {
 public:
  // Serves `buffer` (which must outlive the server) until Shutdown or destruction; null with
  // options.adapter_buffer: a run of adapters, whose every push names its adapter.
  static absl::StatusOr<std::unique_ptr<ReplayIngestServer>> Start(ReplayBuffer* buffer,
                                                                   const IngestOptions& options);
  ~ReplayIngestServer();

  int port() const { return port_; }
  void Shutdown();
  void Wait();  // blocks until shutdown
  // Groups refused so far, by reason (for prl_replay_groups_dead_lettered_total).
  QuarantineCounts dead_letters() const;

 private:
  class Service;
  ReplayIngestServer() = default;

  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

struct PushResult {
  uint64_t groups_accepted = 0;
  uint64_t records_accepted = 0;
};

// Pushes groups to a remote ingest over one stream. A server-side error (RESOURCE_EXHAUSTED,
// INVALID_ARGUMENT, ...) comes back as the status; accepted counts are in `result` either way.
class ReplayPushClient {
 public:
  static absl::StatusOr<std::unique_ptr<ReplayPushClient>> Connect(
      const std::string& target, int64_t max_message_bytes = int64_t{256} << 20);
  // `adapter_id`: the adapter whose replay the groups enter (a run of adapters); empty: the
  // run's.
  absl::Status Push(const std::vector<std::vector<RolloutRecord>>& groups, PushResult* result,
                    absl::Duration deadline = absl::Seconds(60),
                    const std::string& adapter_id = "");

 private:
  std::unique_ptr<v1::ReplayService::Stub> stub_;
};

}  // namespace prl
