// The defaults that a library's option struct and the run config (config/run_config.h) share,
// stated once: the coordinator's (coordinator/coordinator.h), the inference engine's
// (inference_engine/engine.h) and the replay buffer's (replay/replay_buffer.h) option structs
// and the run config's sections both initialise from these, so `prl run` and a program that
// uses a library directly start from the same values. Units in the names.
#pragma once

#include <cstdint>

namespace prl::defaults {

// Coordinator (config: coordinator.*).
inline constexpr int64_t kLeaseMs = 30'000;  // a lease neither completed nor renewed expires
inline constexpr int64_t kHeartbeatMs = 1'000;
inline constexpr int32_t kMaxAttempts = 3;      // failed attempts before a prompt is failed
inline constexpr int32_t kMaxStaleReruns = 10;  // learner hand-backs before a prompt is failed
inline constexpr int64_t kMaxPendingPrompts = 100'000;
inline constexpr int32_t kMaxSamplesPerPrompt = 1024;
inline constexpr int64_t kMaxPromptsPerSet = 100'000;
inline constexpr int64_t kMaxActors = 1024;
inline constexpr int64_t kCompactLogMb = 64;
inline constexpr int64_t kRetentionS = 86'400;  // a finished set is forgotten after a day
inline constexpr int64_t kMaxLag = 4;           // learner versions (config: learner.max_lag)

// Inference engine (config: actors.*).
inline constexpr int64_t kKvCacheMb = 256;
inline constexpr int32_t kBlockSize = 16;  // tokens per KV block (vLLM's default)
inline constexpr int32_t kMaxNumSeqs = 64;
inline constexpr int32_t kMaxNumBatchedTokens = 2048;

// Replay buffer (config: replay.*).
inline constexpr int64_t kReplayCapacityMb = 256;
inline constexpr int64_t kReplayLeaseMs = 60'000;  // a taken group not acked is delivered again

}  // namespace prl::defaults
