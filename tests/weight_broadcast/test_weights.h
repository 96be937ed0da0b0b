// Test support for the weight transports: weights whose every 32-bit word is a function of
// (version, index), so that a receiver can check a whole version bit for bit without having
// seen what was published; models sized for the test at hand; the TakeNewer latency check.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/parameters.h"
#include "model/presets.h"
#include "weight_broadcast/weight_transport.h"

namespace prl::testing {

inline uint32_t PatternWord(int64_t version, uint64_t index) {
  return static_cast<uint32_t>(index * 0x9e3779b1u) ^
         static_cast<uint32_t>(static_cast<uint64_t>(version) * 0x85ebca77u + 0x165667b1u);
}

inline void FillPattern(const ParameterSet& set, int64_t version) {
  auto* words = static_cast<uint32_t*>(set.buffer.data());
  const uint64_t n = set.buffer.bytes() / 4;
  for (uint64_t i = 0; i < n; ++i) words[i] = PatternWord(version, i);
}

// "" if `set` holds exactly version `version`'s pattern, else where it first differs.
inline std::string CheckPattern(const ParameterSet& set, int64_t version) {
  const auto* words = static_cast<const uint32_t*>(set.buffer.data());
  const uint64_t n = set.buffer.bytes() / 4;
  for (uint64_t i = 0; i < n; ++i) {
    if (words[i] != PatternWord(version, i)) {
      return absl::StrCat("version ", version, ": word ", i, " of ", n, " is ", words[i],
                          ", expected ", PatternWord(version, i));
    }
  }
  return "";
}

// The "tiny" preset with its vocabulary resized so that the weights take about `mib` MiB (the
// embedding dominates: vocab x 64 floats).
inline ModelConfig ModelOfMiB(int64_t mib) {
  ModelConfig config = *PresetConfig("tiny");
  config.vocab_size = std::max<int64_t>(512, (mib << 20) / (64 * 4));
  return config;
}

// Runs `learner` (which publishes and returns) on its own thread while this one calls
// subscriber.TakeNewer every millisecond, as an actor's loop would between engine steps, and
// checks that no call waited for the transfers going on meanwhile. A TakeNewer that copied on
// the caller's thread, or waited for the receiver's lock, would spend about half a transfer or
// more in one call per version; one such call is allowed for a preemption of the test itself.
inline void ExpectTakeNewerNeverBlocks(WeightSubscriber& subscriber,
                                       const std::function<void()>& learner) {
  std::atomic<bool> done{false};
  std::thread publishing([&] {
    learner();
    done = true;
  });
  std::vector<double> ms;
  int64_t have = -1;
  while (!done) {
    const auto start = std::chrono::steady_clock::now();
    auto next = subscriber.TakeNewer(have);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
    EXPECT_TRUE(next.ok()) << next.status();
    if (next.ok() && next->has_value()) have = (*next)->version;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  publishing.join();
  const SubscriberStats s = subscriber.stats();
  ASSERT_GE(s.versions_received, 2);
  const double transfer_ms = 1e3 * s.total_transfer_seconds / s.versions_received;
  std::sort(ms.begin(), ms.end());
  const auto slow = ms.end() - std::lower_bound(ms.begin(), ms.end(), transfer_ms / 2);
  std::printf(
      "TakeNewer: %zu calls during %lld transfers of %.1f ms each: median %.4f ms, "
      "p99 %.4f ms, max %.3f ms\n",
      ms.size(), static_cast<long long>(s.versions_received), transfer_ms, ms[ms.size() / 2],
      ms[ms.size() * 99 / 100], ms.back());
  EXPECT_LT(ms[ms.size() / 2], 1.0);
  EXPECT_LE(slow, 1) << slow << " calls took half a transfer or more";
}

}  // namespace prl::testing
