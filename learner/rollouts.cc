#include "learner/rollouts.h"

#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace prl::learner {

namespace {

absl::Status Bad(const std::string& where, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", message));
}

absl::StatusOr<std::vector<int32_t>> Tokens(const nlohmann::json& j, const char* key,
                                            const std::string& where, const ModelConfig& config) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) {
    return Bad(where, absl::StrCat("\"", key, "\" must be a list of token ids"));
  }
  std::vector<int32_t> out;
  out.reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& t = (*it)[i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= config.vocab_size) {
      return Bad(where, absl::StrCat(key, "[", i, "] = ", t.dump(), " is not a token id in [0, ",
                                     config.vocab_size, ")"));
    }
    out.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  if (out.empty()) return Bad(where, absl::StrCat("\"", key, "\" is empty"));
  return out;
}

absl::Status CheckKeys(const nlohmann::json& j, const std::string& where) {
  static const char* kKeys[] = {"prompt", "completion", "behaviour_logprobs", "advantage", "reward",
                                "group",  "versions",   "sources"};
  for (const auto& [key, unused] : j.items()) {
    bool known = false;
    for (const char* k : kKeys) known |= key == k;
    if (!known) {
      return Bad(where, absl::StrCat("unknown key '", key,
                                     "' (expected prompt, completion, behaviour_logprobs, and "
                                     "advantage or reward + group; optional versions, sources)"));
    }
  }
  return absl::OkStatus();
}

// One finite log-probability <= 0 per completion token.
absl::Status ParseLogprobs(const nlohmann::json& j, const std::string& where, TrainSample* s) {
  auto lp = j.find("behaviour_logprobs");
  if (lp == j.end() || !lp->is_array()) {
    return Bad(where, "\"behaviour_logprobs\" must be a list of floats");
  }
  if (lp->size() != s->completion.size()) {
    return Bad(where, absl::StrCat("\"behaviour_logprobs\" has ", lp->size(),
                                   " entries; expected one per completion token (",
                                   s->completion.size(), ")"));
  }
  for (size_t i = 0; i < lp->size(); ++i) {
    const nlohmann::json& v = (*lp)[i];
    const double x = v.is_number() ? v.get<double>() : NAN;
    if (!std::isfinite(x) || x > 0) {
      return Bad(where, absl::StrCat("behaviour_logprobs[", i, "] = ", v.dump(),
                                     "; expected a finite log-probability <= 0"));
    }
    s->behaviour_logprobs.push_back(static_cast<float>(x));
  }
  return absl::OkStatus();
}

// Optional: one weight version >= 0 per completion token.
absl::Status ParseVersions(const nlohmann::json& j, const std::string& where, TrainSample* s) {
  auto v = j.find("versions");
  if (v == j.end()) return absl::OkStatus();
  if (!v->is_array() || v->size() != s->completion.size()) {
    return Bad(where, absl::StrCat("\"versions\" must list one weight version per completion "
                                   "token (",
                                   s->completion.size(), ")"));
  }
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_number_integer() || (*v)[i].get<int64_t>() < 0) {
      return Bad(where, absl::StrCat("versions[", i, "] = ", (*v)[i].dump(),
                                     "; expected an integer >= 0"));
    }
    s->versions.push_back((*v)[i].get<int64_t>());
  }
  return absl::OkStatus();
}

// Optional: an episode's token sources, one per completion token: 0 (the model's, trained) or 1
// (an environment's, context only); the first is 0.
absl::Status ParseSources(const nlohmann::json& j, const std::string& where, TrainSample* s) {
  auto v = j.find("sources");
  if (v == j.end()) return absl::OkStatus();
  if (!v->is_array() || v->size() != s->completion.size()) {
    return Bad(where, absl::StrCat("\"sources\" must list one source (0 model, 1 environment) "
                                   "per completion token (",
                                   s->completion.size(), ")"));
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const nlohmann::json& x = (*v)[i];
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > 1 ||
        (i == 0 && x.get<int64_t>() != 0)) {
      return Bad(where, absl::StrCat("sources[", i, "] = ", x.dump(), "; expected ",
                                     i == 0 ? "0 (an episode starts with the model)"
                                            : "0 (model) or 1 (environment)"));
    }
    s->sources.push_back(static_cast<uint8_t>(x.get<int64_t>()));
  }
  return absl::OkStatus();
}

// Either "advantage", or "reward" with "group".
absl::Status ParseAdvantage(const nlohmann::json& j, const std::string& where, TrainSample* s) {
  const bool has_adv = j.contains("advantage");
  const bool has_reward = j.contains("reward") || j.contains("group");
  if (has_adv == has_reward) {
    return Bad(where, has_adv ? "give either \"advantage\" or \"reward\" + \"group\", not both"
                              : "missing \"advantage\" (or \"reward\" and \"group\")");
  }
  if (has_adv) {
    const nlohmann::json& a = j["advantage"];
    if (!a.is_number() || !std::isfinite(a.get<double>())) {
      return Bad(where, absl::StrCat("\"advantage\" = ", a.dump(), "; expected a finite number"));
    }
    s->has_advantage = true;
    s->advantage = a.get<double>();
    return absl::OkStatus();
  }
  auto r = j.find("reward");
  auto g = j.find("group");
  if (r == j.end() || !r->is_number() || !std::isfinite(r->get<double>())) {
    return Bad(where, "\"reward\" must be a finite number (with \"group\")");
  }
  if (g == j.end() || !g->is_string() || g->get<std::string>().empty()) {
    return Bad(where, "\"group\" must be a non-empty string (with \"reward\")");
  }
  s->reward = r->get<double>();
  s->group = g->get<std::string>();
  return absl::OkStatus();
}

absl::StatusOr<TrainSample> ParseLine(const std::string& text, const std::string& where,
                                      const ModelConfig& config) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return Bad(where, absl::StrCat("malformed JSON: ", e.what()));
  }
  if (!j.is_object()) return Bad(where, "expected a JSON object");
  PRL_RETURN_IF_ERROR(CheckKeys(j, where));
  TrainSample s;
  PRL_ASSIGN_OR_RETURN(s.prompt, Tokens(j, "prompt", where, config));
  PRL_ASSIGN_OR_RETURN(s.completion, Tokens(j, "completion", where, config));
  const int64_t length = static_cast<int64_t>(s.prompt.size() + s.completion.size());
  if (length > config.max_position_embeddings) {
    return Bad(where, absl::StrCat("prompt + completion = ", length,
                                   " tokens is longer than the model's max_position_embeddings = ",
                                   config.max_position_embeddings));
  }
  PRL_RETURN_IF_ERROR(ParseLogprobs(j, where, &s));
  PRL_RETURN_IF_ERROR(ParseVersions(j, where, &s));
  PRL_RETURN_IF_ERROR(ParseSources(j, where, &s));
  PRL_RETURN_IF_ERROR(ParseAdvantage(j, where, &s));
  return s;
}

}  // namespace

absl::StatusOr<std::vector<TrainSample>> ReadTrainSamples(const std::string& path,
                                                          const ModelConfig& config) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open rollouts file ", path));
  std::vector<TrainSample> samples;
  std::string text;
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    PRL_ASSIGN_OR_RETURN(TrainSample s,
                         ParseLine(text, absl::StrCat(path, " line ", line), config));
    if (!samples.empty() && s.has_advantage != samples[0].has_advantage) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, " line ", line, ": mixes lines with \"advantage\" and lines with \"reward\"",
          " + \"group\"; use one form for the whole file"));
    }
    samples.push_back(std::move(s));
  }
  if (samples.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no rollouts (the file is empty)"));
  }
  return samples;
}

absl::StatusOr<Advantages> ApplyGroupAdvantages(std::vector<TrainSample>* samples,
                                                const AdvantageConfig& config) {
  Advantages report;
  if (samples->empty() || samples->front().has_advantage) return report;
  std::vector<double> rewards;
  std::vector<std::string> groups;
  for (const TrainSample& s : *samples) {
    rewards.push_back(s.reward);
    groups.push_back(s.group);
  }
  PRL_ASSIGN_OR_RETURN(report, GroupAdvantages(rewards, groups, config));
  std::vector<TrainSample> kept;
  for (size_t i = 0; i < samples->size(); ++i) {
    if (!report.kept[i]) continue;
    (*samples)[i].advantage = report.advantage[i];
    (*samples)[i].has_advantage = true;
    kept.push_back(std::move((*samples)[i]));
  }
  *samples = std::move(kept);
  return report;
}

}  // namespace prl::learner
