// The handshake every weight transport runs before any weights move: what a publisher states
// about the versions it sends, and the one check a subscriber (or a server, for its clients)
// applies to it. A mismatch is FailedPrecondition naming the first thing that differs, with
// both values: the transport, then the model (the first differing config.json field, from
// ModelFingerprint), then the bytes of one version, then the data path.
//
//   shm, cuda_ipc: the segment header holds the publisher's side;
//   grpc:          the first chunk of every version carries the publisher's config.json, and
//                  the Subscribe request the subscriber's fingerprint;
//   nccl:          the rendezvous store holds EncodeHandshake(publisher).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/config.h"
#include "model/parameters.h"
#include "weight_broadcast/weight_transport.h"

namespace prl {

struct WeightHandshake {
  std::string transport;          // "shm", "grpc", "cuda_ipc", "nccl"
  std::string model_fingerprint;  // WeightFingerprint(spec)
  int64_t weight_bytes = 0;       // one version: the fp32 ParameterSet (or LoraSet) buffer
  // The medium both sides must share, where the transport has a choice; "" where it has none.
  // nccl: "gloo (cpu)" or "nccl (cuda)", chosen by each side's device.
  std::string data_path;
};

// This process's side of the handshake (weight_transport.h's WeightFingerprint and
// WeightBytes of `spec`).
WeightHandshake LocalHandshake(absl::string_view transport, const WeightSpec& spec,
                               absl::string_view data_path = "");

// OK if `published` (the publisher's side) and `local` agree; otherwise FailedPrecondition
// prefixed with `where` (the segment or server), e.g. "weight server 10.0.0.1:5000: model
// config mismatch: hidden_size is 512 in the published model but 256 in this process's model
// config (...)".
absl::Status CheckHandshake(const WeightHandshake& published, const WeightHandshake& local,
                            absl::string_view where);

// The weights handed to a publisher's Publish must be its model's: FailedPrecondition naming
// the first differing config.json field, or InvalidArgument for a buffer of another size.
absl::Status CheckPublishedWeights(const WeightHandshake& publisher, const WeightView& weights,
                                   absl::string_view where);

// The handshake as text, for transports that carry it as bytes: five lines,
// "prl-weights-v1", "transport=...", "weight_bytes=...", "data_path=...", "fingerprint=...".
// Decode errors are DataLoss naming `where`.
std::string EncodeHandshake(const WeightHandshake& handshake);
absl::StatusOr<WeightHandshake> DecodeHandshake(absl::string_view text, absl::string_view where);

}  // namespace prl
