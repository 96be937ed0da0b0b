#include "replay/rollout_record.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/status_macros.h"
#include "core/xxhash_inline.h"
#include "replay/record_internal.h"

namespace prl {

namespace {

using replay_internal::FirstBad;
using replay_internal::Invalid;
using replay_internal::kMaxCount;
using replay_internal::NotFinite;

// Offset of the first byte that does not start a valid UTF-8 sequence (overlong forms,
// surrogates and code points past U+10FFFF are invalid, as in protobuf); npos if none.
size_t FirstInvalidUtf8(absl::string_view s) {
  static constexpr uint32_t kMinCodePoint[5] = {0, 0, 0x80, 0x800, 0x10000};
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return i;
    }
    if (s.size() - i < len) return i;
    for (size_t k = 1; k < len; ++k) {
      const uint8_t cc = static_cast<uint8_t>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < kMinCodePoint[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return absl::string_view::npos;
}

absl::Status ValidateName(absl::string_view field, const std::string& name) {
  if (name.size() > kMaxRecordIdBytes) {
    return Invalid(field, absl::StrCat("at most ", kMaxRecordIdBytes, " bytes"),
                   absl::StrCat(name.size(), " bytes"));
  }
  if (const size_t bad = FirstInvalidUtf8(name); bad != absl::string_view::npos) {
    return Invalid(
        field, "valid UTF-8",
        absl::StrCat("byte 0x", absl::Hex(static_cast<uint8_t>(name[bad])), " at offset ", bad));
  }
  return absl::OkStatus();
}

absl::Status ValidateCount(absl::string_view field, size_t count) {
  if (count > kMaxCount) return Invalid(field, "fewer than 2^32 entries", count);
  return absl::OkStatus();
}

absl::Status ValidateTokens(absl::string_view field, absl::Span<const int32_t> tokens) {
  PRL_RETURN_IF_ERROR(ValidateCount(field, tokens.size()));
  const size_t bad = FirstBad(tokens.data(), tokens.size(), [](int32_t t) { return t < 0; });
  if (bad != tokens.size()) {
    return Invalid(absl::StrCat(field, "[", bad, "]"), "a token id >= 0", tokens[bad]);
  }
  return absl::OkStatus();
}

absl::Status ValidateSampling(const RolloutSampling& s) {
  if (!(s.temperature >= 0.0f) || !std::isfinite(s.temperature)) {
    return Invalid("sampling.temperature", ">= 0 and finite", s.temperature);
  }
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) return Invalid("sampling.top_p", "in (0, 1]", s.top_p);
  if (s.top_k < 0) return Invalid("sampling.top_k", ">= 0 (0 disables)", s.top_k);
  if (s.max_tokens < 0) return Invalid("sampling.max_tokens", ">= 0", s.max_tokens);
  return ValidateTokens("sampling.stop_token_ids", s.stop_token_ids);
}

absl::Status ValidateRewardComponents(const RolloutRecord& r) {
  PRL_RETURN_IF_ERROR(ValidateCount("reward_components", r.reward_components.size()));
  // Sorted (name, position) pairs find duplicates in O(R log R): R comes from untrusted bytes.
  std::vector<std::pair<absl::string_view, size_t>> names;
  names.reserve(r.reward_components.size());
  for (size_t i = 0; i < r.reward_components.size(); ++i) {
    const auto& [name, value] = r.reward_components[i];
    const std::string field = absl::StrCat("reward_components[", i, "]");
    if (name.empty()) return Invalid(field + ".name", "a non-empty name", "\"\"");
    PRL_RETURN_IF_ERROR(ValidateName(field + ".name", name));
    if (!std::isfinite(value)) return Invalid(field + ".value", "a finite number", value);
    names.emplace_back(name, i);
  }
  std::sort(names.begin(), names.end());
  for (size_t i = 1; i < names.size(); ++i) {
    if (names[i].first == names[i - 1].first) {
      return Invalid(absl::StrCat("reward_components[", names[i].second, "].name"),
                     "distinct names",
                     absl::StrCat("\"", names[i].first, "\" again (also reward_components[",
                                  names[i - 1].second, "])"));
    }
  }
  return absl::OkStatus();
}

// The per-token arrays' sizes; with scan_values, also every completion token id, log-prob and
// version (EncodeGroupToWithChecksum runs those scans on its own, while copying).
absl::Status ValidatePerTokenArrays(const RolloutRecord& r, bool scan_values) {
  const size_t n = r.completion_tokens.size();
  PRL_RETURN_IF_ERROR(ValidateCount("completion_tokens", n));
  const std::string one_each = absl::StrCat("one per completion token (", n, ")");
  if (r.behaviour_logprobs.size() != n) {
    return Invalid("behaviour_logprobs", one_each, r.behaviour_logprobs.size());
  }
  if (r.token_versions.size() != n)
    return Invalid("token_versions", one_each, r.token_versions.size());
  if (!scan_values) return absl::OkStatus();
  PRL_RETURN_IF_ERROR(ValidateTokens("completion_tokens", r.completion_tokens));
  const auto& lp = r.behaviour_logprobs;
  const size_t bad_lp = FirstBad(lp.data(), lp.size(), NotFinite);
  if (bad_lp != lp.size()) {
    return Invalid(absl::StrCat("behaviour_logprobs[", bad_lp, "]"), "a finite log-probability",
                   lp[bad_lp]);
  }
  const auto& v = r.token_versions;
  const size_t bad_v = FirstBad(v.data(), v.size(), [](int64_t x) { return x < 0; });
  if (bad_v != v.size()) {
    return Invalid(absl::StrCat("token_versions[", bad_v, "]"), "a weight version >= 0", v[bad_v]);
  }
  return absl::OkStatus();
}

// token_sources (with the environment tokens' log-probs and versions), turns and routes: the
// episode and MoE fields.
absl::Status ValidateEpisode(const RolloutRecord& r) {
  const size_t n = r.completion_tokens.size();
  if (!r.token_sources.empty()) {
    if (r.token_sources.size() != n) {
      return Invalid("token_sources", absl::StrCat("none or one per completion token (", n, ")"),
                     r.token_sources.size());
    }
    for (size_t t = 0; t < n; ++t) {
      const uint8_t source = r.token_sources[t];
      if (source > static_cast<uint8_t>(TokenSource::kEnvironment)) {
        return Invalid(absl::StrCat("token_sources[", t, "]"), "0 (model) or 1 (environment)",
                       static_cast<int>(source));
      }
      if (source == static_cast<uint8_t>(TokenSource::kModel)) continue;
      if (t == 0) return Invalid("token_sources[0]", "0: an episode starts with the model", 1);
      if (r.behaviour_logprobs[t] != 0.0f) {
        return Invalid(absl::StrCat("behaviour_logprobs[", t, "]"),
                       "0 for an environment token", r.behaviour_logprobs[t]);
      }
      if (r.token_versions[t] != r.token_versions[t - 1]) {
        return Invalid(absl::StrCat("token_versions[", t, "]"),
                       absl::StrCat("the version of the token before it (",
                                    r.token_versions[t - 1], ") for an environment token"),
                       r.token_versions[t]);
      }
    }
  }
  if (r.turn_rewards.size() != r.turn_ends.size()) {
    return Invalid("turn_rewards", absl::StrCat("one per turn (", r.turn_ends.size(), ")"),
                   r.turn_rewards.size());
  }
  PRL_RETURN_IF_ERROR(ValidateCount("turn_ends", r.turn_ends.size()));
  for (size_t i = 0; i < r.turn_ends.size(); ++i) {
    const uint32_t lower = i == 0 ? 0 : r.turn_ends[i - 1];
    if (r.turn_ends[i] <= lower || r.turn_ends[i] > n) {
      return Invalid(absl::StrCat("turn_ends[", i, "]"),
                     absl::StrCat("above ", lower, " and at most ", n, " (the completion tokens)"),
                     r.turn_ends[i]);
    }
    if (!std::isfinite(r.turn_rewards[i])) {
      return Invalid(absl::StrCat("turn_rewards[", i, "]"), "a finite number", r.turn_rewards[i]);
    }
  }
  if ((r.route_layers == 0) != (r.route_top_k == 0)) {
    return Invalid("route_top_k", absl::StrCat(r.route_layers == 0 ? "0" : ">= 1",
                                               " with route_layers ", r.route_layers),
                   static_cast<int>(r.route_top_k));
  }
  const uint64_t route_bytes = uint64_t{n} * r.route_layers * r.route_top_k;
  if (route_bytes > kMaxCount) return Invalid("routes", "fewer than 2^32 expert ids", route_bytes);
  if (r.routes.size() != route_bytes) {
    return Invalid("routes",
                   absl::StrCat(route_bytes, " expert ids (", n, " tokens x ", r.route_layers,
                                " layers x top ", static_cast<int>(r.route_top_k), ")"),
                   r.routes.size());
  }
  return absl::OkStatus();
}

}  // namespace

int64_t RolloutRecord::model_tokens() const {
  if (token_sources.empty()) return static_cast<int64_t>(completion_tokens.size());
  return std::count(token_sources.begin(), token_sources.end(),
                    static_cast<uint8_t>(TokenSource::kModel));
}

int64_t RolloutRecord::min_version() const {
  if (token_versions.empty()) return std::numeric_limits<int64_t>::max();
  return *std::min_element(token_versions.begin(), token_versions.end());
}

uint64_t RolloutRecord::GroupKey() const {
  // Length prefixes keep ("ab", "c") and ("a", "bc") apart.
  std::string key;
  key.reserve(32 + run_id.size() + prompt_set_id.size());
  auto put_u64 = [&key](uint64_t v) { key.append(reinterpret_cast<const char*>(&v), 8); };
  put_u64(run_id.size());
  key += run_id;
  put_u64(prompt_set_id.size());
  key += prompt_set_id;
  put_u64(prompt_index);
  put_u64(group_id);
  return XXH3_64bits(key.data(), key.size());
}

namespace replay_internal {

absl::Status ValidateRecordWith(const RolloutRecord& r, bool scan_values) {
  PRL_RETURN_IF_ERROR(ValidateName("run_id", r.run_id));
  PRL_RETURN_IF_ERROR(ValidateName("prompt_set_id", r.prompt_set_id));
  PRL_RETURN_IF_ERROR(ValidateName("actor_id", r.actor_id));
  if (r.group_size < 1) return Invalid("group_size", ">= 1", r.group_size);
  if (r.sample_index >= r.group_size) {
    return Invalid("sample_index", absl::StrCat("< group_size (", r.group_size, ")"),
                   r.sample_index);
  }
  if (r.segments < 1) return Invalid("segments", ">= 1", r.segments);
  if (r.segment >= r.segments) {
    return Invalid("segment", absl::StrCat("< segments (", r.segments, ")"), r.segment);
  }
  PRL_RETURN_IF_ERROR(ValidateTokens("prompt_tokens", r.prompt_tokens));
  PRL_RETURN_IF_ERROR(ValidatePerTokenArrays(r, scan_values));
  PRL_RETURN_IF_ERROR(ValidateEpisode(r));
  if (!std::isfinite(r.reward)) return Invalid("reward", "a finite number", r.reward);
  PRL_RETURN_IF_ERROR(ValidateRewardComponents(r));
  const auto reason = static_cast<int>(r.finish_reason);
  if (reason < 1 || reason > 3) {
    return Invalid("finish_reason", "1 (length), 2 (stop) or 3 (abort)", reason);
  }
  PRL_RETURN_IF_ERROR(ValidateSampling(r.sampling));
  if (r.created_unix_nanos < 0) return Invalid("created_unix_nanos", ">= 0", r.created_unix_nanos);
  if (r.finished_unix_nanos < r.created_unix_nanos) {
    return Invalid("finished_unix_nanos",
                   absl::StrCat(">= created_unix_nanos (", r.created_unix_nanos, ")"),
                   r.finished_unix_nanos);
  }
  return absl::OkStatus();
}

}  // namespace replay_internal

absl::Status ValidateRecord(const RolloutRecord& r) {
  return replay_internal::ValidateRecordWith(r, /*scan_values=*/true);
}

}  // namespace prl
