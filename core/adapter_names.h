// The names of a LoRA adapter (docs/tenants.md), one rule for the run config (prl run's tenants)
// and the coordinator (every prompt set that names an adapter): the adapter's own name, and
// PEFT's module names it may target (model/lora.h).
#pragma once

#include <algorithm>
#include <iterator>
#include <string_view>

namespace prl {

inline constexpr size_t kMaxAdapterName = 64;

// 1 to 64 characters of [a-z0-9._-], starting with a letter or digit (a file name and a metric
// label as it is).
inline bool IsAdapterName(std::string_view name) {
  const auto allowed = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
  };
  return !name.empty() && name.size() <= kMaxAdapterName &&
         std::all_of(name.begin(), name.end(), allowed) && name[0] != '.' && name[0] != '_' &&
         name[0] != '-';
}

// PEFT's module names an adapter may target, and its shorthand for all of them.
inline constexpr const char* kAdapterTargets[] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "all-linear"};
inline constexpr int kMaxAdapterTargets = 8;

inline bool IsAdapterTarget(std::string_view name) {
  return std::find(std::begin(kAdapterTargets), std::end(kAdapterTargets), name) !=
         std::end(kAdapterTargets);
}

}  // namespace prl
