// The step's samples as bytes: what rank 0 broadcasts to every rank (learner/learner_service.h)
// and what the step journal keeps on disk (learner/step_journal.h).
//
// Each sample travels as a rollout record in the replay buffer's binary layout
// (replay/record_encoder.h; one codec wherever prl stores records), carrying its prompt,
// completion, behaviour log-probs, token versions and sources (an episode's environment
// tokens), its MoE routes, its reward, and its advantage as the
// reward component "advantage". Decoding treats the bytes as untrusted, as the replay buffer
// does (a damaged or foreign journal file is an error naming the sample, never a crash).
//
// Layout: the magic "PRLSTEP1", a u64 count (kStopCount: the stop signal, nothing follows),
// then per sample a u64 byte length and the record (a multiple of 8 bytes), little-endian.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "learner/rollouts.h"

namespace prl::learner {

// Requires one behaviour log-prob and one token version per completion token, and an
// advantage, on every sample; else InvalidArgument naming the sample and field.
absl::StatusOr<std::vector<uint8_t>> EncodeStepSamples(absl::Span<const TrainSample> samples);
// The bytes that tell every rank to stop.
std::vector<uint8_t> EncodeStopSignal();
// nullopt: the stop signal. Samples come back with their advantage (has_advantage) and reward.
absl::StatusOr<std::optional<std::vector<TrainSample>>> DecodeStepSamples(
    absl::Span<const uint8_t> bytes);

}  // namespace prl::learner
