#include "replay/group_validation.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "replay/rollout_group.h"

namespace prl {

namespace {

GroupProblem Problem(DeadLetterReason reason, std::string field, std::string expected,
                     std::string found) {
  return GroupProblem{reason, std::move(field), std::move(expected), std::move(found)};
}

std::optional<GroupProblem> CheckTokens(absl::Span<const int32_t> ids, const std::string& field,
                                        int64_t vocab_size) {
  if (vocab_size <= 0) return std::nullopt;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return Problem(DeadLetterReason::kTokenId, absl::StrCat(field, "[", i, "]"),
                     absl::StrCat("a token id in [0, ", vocab_size, ")"), absl::StrCat(ids[i]));
    }
  }
  return std::nullopt;
}

// A record's routes against the model (ModelLimits::check_routes): a dense model replays none;
// a MoE model's are (completion tokens, its MoE layers, its top-k) expert ids below its experts.
std::optional<GroupProblem> CheckRoutes(const RolloutRecord& r, const std::string& at,
                                        const ModelLimits& limits) {
  if (!limits.check_routes || r.routes.empty()) return std::nullopt;
  if (limits.moe_layers == 0) {
    return Problem(DeadLetterReason::kRoutes, at + ".routes", "none (the model is dense)",
                   absl::StrCat(r.routes.size(), " expert ids"));
  }
  if (r.route_layers != limits.moe_layers || r.route_top_k != limits.top_k) {
    return Problem(DeadLetterReason::kRoutes, at + ".route_layers, .route_top_k",
                   absl::StrCat(limits.moe_layers, " and ", limits.top_k, " (the model's)"),
                   absl::StrCat(r.route_layers, " and ", static_cast<int>(r.route_top_k)));
  }
  const size_t expected = r.completion_tokens.size() * limits.moe_layers * limits.top_k;
  if (r.routes.size() != expected) {
    return Problem(DeadLetterReason::kRoutes, at + ".routes",
                   absl::StrCat(expected, " expert ids (tokens x layers x top-k)"),
                   absl::StrCat(r.routes.size()));
  }
  for (size_t i = 0; i < r.routes.size(); ++i) {
    if (r.routes[i] >= limits.num_experts) {
      return Problem(DeadLetterReason::kRoutes, absl::StrCat(at, ".routes[", i, "]"),
                     absl::StrCat("an expert id in [0, ", limits.num_experts, ")"),
                     absl::StrCat(static_cast<int>(r.routes[i])));
    }
  }
  return std::nullopt;
}

std::optional<GroupProblem> CheckRecord(const RolloutRecord& r, const std::string& at,
                                        const ModelLimits& limits, int64_t learner_version) {
  const size_t n = r.completion_tokens.size();
  if (r.behaviour_logprobs.size() != n || r.token_versions.size() != n) {
    return Problem(DeadLetterReason::kShape, at + ".behaviour_logprobs, .token_versions",
                   absl::StrCat(n, " each (one per completion token)"),
                   absl::StrCat(r.behaviour_logprobs.size(), " and ", r.token_versions.size()));
  }
  if (auto p = CheckTokens(r.prompt_tokens, at + ".prompt_tokens", limits.vocab_size)) return p;
  if (auto p = CheckTokens(r.completion_tokens, at + ".completion_tokens", limits.vocab_size)) {
    return p;
  }
  const auto length = static_cast<int64_t>(r.prompt_tokens.size() + n);
  if (limits.max_position_embeddings > 0 && length > limits.max_position_embeddings) {
    return Problem(DeadLetterReason::kContext, at + ".prompt_tokens + .completion_tokens",
                   absl::StrCat("at most ", limits.max_position_embeddings,
                                " tokens (max_position_embeddings)"),
                   absl::StrCat(r.prompt_tokens.size(), " + ", n, " = ", length));
  }
  if (limits.max_trained_tokens > 0 && length > limits.max_trained_tokens) {
    return Problem(DeadLetterReason::kContext, at + ".prompt_tokens + .completion_tokens",
                   absl::StrCat("at most ", limits.max_trained_tokens, " tokens (",
                                limits.max_trained_tokens_why, ")"),
                   absl::StrCat(r.prompt_tokens.size(), " + ", n, " = ", length));
  }
  for (size_t i = 0; i < n; ++i) {
    const float lp = r.behaviour_logprobs[i];
    if (!std::isfinite(lp) || lp > 0.0f) {
      return Problem(DeadLetterReason::kLogprob, absl::StrCat(at, ".behaviour_logprobs[", i, "]"),
                     "a finite log-probability <= 0", absl::StrCat(lp));
    }
  }
  if (auto p = CheckRoutes(r, at, limits)) return p;
  for (size_t i = 0; i < n; ++i) {
    const int64_t v = r.token_versions[i];
    if (v < 0 || v > learner_version) {
      return Problem(DeadLetterReason::kFutureVersion, absl::StrCat(at, ".token_versions[", i, "]"),
                     learner_version == INT64_MAX
                         ? std::string("a weight version >= 0")
                         : absl::StrCat("a weight version in [0, ", learner_version,
                                        "] (not above the learner's)"),
                     absl::StrCat(v));
    }
  }
  return std::nullopt;
}

}  // namespace

absl::string_view DeadLetterReasonName(DeadLetterReason reason) {
  switch (reason) {
    case DeadLetterReason::kTokenId:
      return "token_id";
    case DeadLetterReason::kContext:
      return "context";
    case DeadLetterReason::kShape:
      return "shape";
    case DeadLetterReason::kLogprob:
      return "logprob";
    case DeadLetterReason::kFutureVersion:
      return "future_version";
    case DeadLetterReason::kMalformed:
      return "malformed";
    case DeadLetterReason::kCorrupt:
      return "corrupt";
    case DeadLetterReason::kRoutes:
      return "routes";
  }
  return "malformed";
}

std::string GroupProblem::Describe() const {
  return absl::StrCat(field, ": expected ", expected, ", found ", found);
}

std::optional<GroupProblem> ValidateGroup(absl::Span<const RolloutRecord> records,
                                          const ModelLimits& limits, int64_t learner_version) {
  // The model's limits first: they name the field precisely; then everything else a group
  // must be (DescribeGroup's errors already name record, field, expected and found).
  for (size_t i = 0; i < records.size(); ++i) {
    if (auto p =
            CheckRecord(records[i], absl::StrCat("records[", i, "]"), limits, learner_version)) {
      return p;
    }
  }
  const absl::StatusOr<GroupInfo> group = DescribeGroup(records);
  if (!group.ok()) {
    return Problem(DeadLetterReason::kMalformed, "group", "a complete, valid group",
                   std::string(group.status().message()));
  }
  return std::nullopt;
}

}  // namespace prl
