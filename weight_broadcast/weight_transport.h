// The in-flight weight broadcaster: the learner publishes (version, weights) after each
// optimizer step; every actor subscribes, receives newer versions in the background and hands
// them to its engine (Engine::SwapWeights), so that generation never waits for a transfer.
//
//   learner:  int64_t version = FirstVersionToPublish(checkpoint_version,
//                                                     publisher->newest_version());
//             PRL_RETURN_IF_ERROR(publisher->Publish(version++, params));  // every step
//   actor:    PRL_ASSIGN_OR_RETURN(auto next, subscriber->TakeNewer(engine->version()));
//             if (next) engine->SwapWeights(next->weights, next->version);
// The subscriber's device (its options) must be the engine's: a CUDA engine swaps in a
// ParameterSet on its GPU (a device-to-device copy into its compute weights), a CPU engine one
// on the CPU.
//
// One publisher/subscriber interface, one transport per medium:
//   - shm_transport.h:        same node, a shared-memory segment with two seqlocked slots;
//   - cuda_ipc_transport.h:   same node, GPU: two device buffers mapped with CUDA IPC handles,
//                             described by a seqlocked shared-memory control segment;
//   - grpc_transport.h:       across nodes, a gRPC server stream of checksummed chunks;
//   - collective_transport.h: across nodes, a broadcast over a collective group (NCCL on CUDA
//                             devices, Gloo on the CPU) re-formed as subscribers come and go.
// The interface speaks only of versions and ParameterSets (whose Buffer knows its device),
// never of bytes on the wire. What the transports share lives beside it: the handshake
// (handshake.h), the version rule (versioning.h) and the receiving mailbox (mailbox.h).
//
// Semantics shared by every transport:
//   - Versions are int64 in [0, 2^62) and strictly increase per publisher; a restarted
//     publisher learns the newest version its transport still knows of (newest_version) so
//     that the learner continues above it (versioning.h): shm and cuda_ipc from their
//     segment, grpc and nccl from a version file (version_file.h) and reporting subscribers.
//   - Latest wins: a subscriber gets the newest complete version, never a queue. A subscriber
//     slower than the learner skips intermediate versions (counted in versions_skipped).
//   - A subscriber never exposes a torn or corrupted version; every ParameterSet it returns is
//     fresh (or recycled only once nobody else holds it) and never written again, so an engine
//     may keep running on an older shared_ptr while the next version is being received.
//   - The subscriber's model config must match the publisher's: a mismatch is a
//     FailedPrecondition naming the first differing config.json field (ModelFingerprint),
//     found by the one handshake check of handshake.h.
//
// What a version holds (WeightSpec): a model's parameters, or one LoRA adapter of a model
// (model/lora.h; a LoRA learner publishes its adapter alone, so bytes and transfer time are
// the adapter's). A publisher and its subscribers agree on the spec like on the model: an
// adapter's rank, alpha and targets are fields of the fingerprint. Subscribers of an adapter
// spec receive LoraSets (VersionedWeights::adapter), the others ParameterSets.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "model/lora.h"
#include "model/parameters.h"

namespace prl {

// What one version of a publisher holds: `model`'s parameters, or with `adapter` one LoRA
// adapter of `model` (its weights alone).
struct WeightSpec {
  WeightSpec(const ModelConfig& model) : model(model) {}  // NOLINT: a model's parameters
  WeightSpec(const ModelConfig& model, const LoraConfig& adapter)
      : model(model), adapter(adapter) {}
  ModelConfig model;
  std::optional<LoraConfig> adapter;
};
// ModelFingerprint(spec.model), and for an adapter its settings as more fields
// ("lora_r=8 lora_alpha=16 lora_rslora=false lora_targets=q_proj,v_proj").
std::string WeightFingerprint(const WeightSpec& spec);
// The model's config (ValidateModelConfig) and the adapter's settings for it
// (ValidateLoraConfig): every transport checks its spec when it is created.
absl::Status ValidateWeightSpec(const WeightSpec& spec);
// Bytes of one version (fp32) of a valid spec: the model's parameters or the adapter's.
int64_t WeightBytes(const WeightSpec& spec);

// One version's bytes as a publisher reads them, from a ParameterSet or a LoraSet.
struct WeightView {
  std::string fingerprint;  // WeightFingerprint of what it holds
  const void* data = nullptr;
  Device device;
  size_t bytes = 0;

  static WeightView Of(const ParameterSet& weights);
  static WeightView Of(const LoraSet& adapter);
};

struct VersionedWeights {
  int64_t version = -1;
  std::shared_ptr<const ParameterSet> weights;  // a model's parameters (else null)
  std::shared_ptr<const LoraSet> adapter;       // an adapter spec's version (else null)
};

struct PublisherStats {
  int64_t versions_published = 0;
  int64_t last_version = -1;        // -1: nothing published yet
  int64_t version_bytes = 0;        // bytes of one version (the fp32 buffer)
  double last_publish_seconds = 0;  // time the learner spent in the last Publish
  double total_publish_seconds = 0;
  // Streaming transports (gRPC, nccl): subscribers connected now, what was sent to them, and
  // the versions jumped over because a subscriber (nccl: the group) was still busy.
  int64_t subscribers = 0;
  int64_t versions_sent = 0;
  int64_t bytes_sent = 0;
  int64_t versions_skipped = 0;
  int64_t stalled_streams_cut = 0;  // gRPC: streams cut for falling behind (stall_timeout)
  // nccl: groups formed (each membership change, or a failed broadcast, forms a new one) and
  // the last reason a group ended or could not form.
  int64_t groups_formed = 0;
  int64_t groups_failed = 0;
  std::string last_error;
};

struct SubscriberStats {
  int64_t versions_received = 0;
  int64_t last_version = -1;  // newest version received; -1: none yet
  // Gaps in the version numbers received: v then w counts w - v - 1 (versions published while
  // this subscriber was busy, which it will never see).
  int64_t versions_skipped = 0;
  int64_t bytes_received = 0;
  double last_transfer_seconds = 0;  // one version, from its first byte to exposable
  double total_transfer_seconds = 0;
  int64_t retries = 0;            // shm, cuda_ipc: copies redone because the publisher lapped them
  int64_t reconnects = 0;         // gRPC: streams re-opened after a break; nccl: groups re-joined
  int64_t checksum_failures = 0;  // gRPC, nccl: versions rejected (and fetched again)
  // nccl: versions received that were not newer than the one held (a publisher that numbered
  // below what this subscriber has), dropped.
  int64_t versions_ignored = 0;
  std::string last_error;  // the last transient error (e.g. the server went away)
};

// Publishes versions of one model's weights. Thread-safety: Publish from one thread at a time;
// stats() from any thread.
class WeightPublisher {
 public:
  virtual ~WeightPublisher() = default;
  // Makes `weights` (its config must be the publisher's) visible as `version`, which must be
  // greater than every version published before. Copies the weights: the caller may change
  // them as soon as Publish returns. Never waits for a subscriber. A publisher of an adapter
  // spec publishes LoraSets of that adapter's settings.
  absl::Status Publish(int64_t version, const ParameterSet& weights) {
    return PublishWeights(version, WeightView::Of(weights));
  }
  absl::Status Publish(int64_t version, const LoraSet& adapter) {
    return PublishWeights(version, WeightView::Of(adapter));
  }
  // The transport's half of Publish.
  virtual absl::Status PublishWeights(int64_t version, const WeightView& weights) = 0;
  // The newest version this publisher knows of: published by it, still held by the transport
  // from an earlier publisher, or reported by subscribers; -1 if none. A learner that starts
  // numbers its next version with FirstVersionToPublish(its own, newest_version()).
  virtual int64_t newest_version() const = 0;
  virtual PublisherStats stats() const = 0;
};

// Receives versions in the background. Thread-safety: every method from any thread.
class WeightSubscriber {
 public:
  virtual ~WeightSubscriber() = default;
  // The newest complete version newer than `have`, or nullopt. Never blocks on a transfer in
  // progress (the background receiver is never waited for). Errors are permanent ones (a model
  // mismatch); transient ones (a broken stream) are retried and show in stats().last_error.
  virtual absl::StatusOr<std::optional<VersionedWeights>> TakeNewer(int64_t have) = 0;
  // Same, waiting up to `timeout` for one: DeadlineExceeded if none arrived in time.
  virtual absl::StatusOr<VersionedWeights> WaitNewer(int64_t have, absl::Duration timeout) = 0;
  virtual SubscriberStats stats() const = 0;
};

// What must be equal between a publisher's and a subscriber's model: every config.json field
// that shapes the weights or the math, as "key=value" words separated by spaces, e.g.
// "architecture=Qwen2ForCausalLM hidden_size=512 ... qkv_bias=true". Floats are exact.
std::string ModelFingerprint(const ModelConfig& config);

// OK if the fingerprints are equal; otherwise FailedPrecondition naming the first differing
// field with both values, e.g. "hidden_size is 512 in the published model but 256 in this
// process's model config". `where` prefixes the message (the segment or server).
absl::Status CheckSameModel(absl::string_view published, absl::string_view local,
                            absl::string_view where);

}  // namespace prl
