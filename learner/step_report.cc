#include "learner/step_report.h"

#include <set>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace prl::learner {

namespace {

using Json = nlohmann::ordered_json;

// Every field once: the writer and the reader walk this list.
template <typename Visitor>
void VisitFields(StepReport& r, Visitor& v) {
  v("step", r.step);
  v("version", r.version);
  v("unix_time", r.unix_time);
  v("groups", r.groups);
  v("samples", r.samples);
  v("mean_reward", r.mean_reward);
  v("loss", r.loss);
  v("mean_ratio", r.mean_ratio);
  v("max_ratio", r.max_ratio);
  v("clipped_fraction", r.clipped_fraction);
  v("effective_sample_size", r.effective_sample_size);
  v("kl_behaviour_learner", r.kl_behaviour_learner);
  v("entropy", r.entropy);
  v("grad_norm", r.grad_norm);
  v("lr", r.lr);
  v("lag_mean", r.lag_mean);
  v("lag_max", r.lag_max);
  v("trained_tokens", r.trained_tokens);
  v("input_tokens", r.input_tokens);
  v("completion_tokens", r.completion_tokens);
  v("completion_tokens_max", r.completion_tokens_max, /*optional=*/true);  // added later
  v("routed_tokens", r.routed_tokens, /*optional=*/true);
  v("route_mismatch_fraction", r.route_mismatch_fraction, /*optional=*/true);
  v("lagged_routed_tokens", r.lagged_routed_tokens, /*optional=*/true);
  v("lagged_route_mismatch_fraction", r.lagged_route_mismatch_fraction, /*optional=*/true);
  v("router_aux_loss", r.router_aux_loss, /*optional=*/true);
  v("multi_turn_fraction", r.multi_turn_fraction, /*optional=*/true);
  v("step_seconds", r.step_seconds);
  v("publish_seconds", r.publish_seconds);
  v("dropped_stale", r.dropped_stale);
  v("duplicate_groups", r.duplicate_groups);
  v("stale_requeued", r.stale_requeued);
  v("dropped_stale_total", r.dropped_stale_total, /*optional=*/true);  // added later
  v("duplicate_groups_total", r.duplicate_groups_total, /*optional=*/true);
  v("stale_requeued_total", r.stale_requeued_total, /*optional=*/true);
  v("dropped_uniform", r.dropped_uniform, /*optional=*/true);
  v("policy_entropy", r.policy_entropy, /*optional=*/true);
  v("dropped_uniform_total", r.dropped_uniform_total, /*optional=*/true);
  v("reference_kl", r.reference_kl, /*optional=*/true);
  v("peak_activation_bytes", r.peak_activation_bytes, /*optional=*/true);
}

struct Writer {
  Json& j;
  template <typename T>
  void operator()(const char* key, T& value, bool /*optional*/ = false) {
    j[key] = value;
  }
};

struct Reader {
  const Json& j;
  absl::Status status;
  std::set<std::string> seen;
  // An optional field that is missing keeps its default.
  template <typename T>
  void operator()(const char* key, T& value, bool optional = false) {
    if (!status.ok()) return;
    seen.insert(key);
    auto it = j.find(key);
    if (it == j.end() && optional) return;
    if (it == j.end()) {
      status =
          absl::InvalidArgumentError(absl::StrCat("step report: field '", key, "' is missing"));
      return;
    }
    const bool ok = std::is_integral_v<T> ? it->is_number_integer() : it->is_number();
    if (!ok) {
      status = absl::InvalidArgumentError(
          absl::StrCat("step report: field '", key, "': expected ",
                       std::is_integral_v<T> ? "an integer" : "a number", ", found ", it->dump()));
      return;
    }
    value = it->get<T>();
  }
};

// The optional "evals" array, strictly: each entry an object of exactly its six fields.
absl::StatusOr<std::vector<EvalPoint>> ParseEvals(const Json& j) {
  if (!j.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step report: field 'evals': expected an array, found ", j.dump()));
  }
  std::vector<EvalPoint> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const Json& e = j[i];
    const std::string where = absl::StrCat("step report: evals[", i, "]");
    if (!e.is_object() || e.size() != 6 || !e.contains("set") || !e["set"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": expected {\"set\", \"version\", \"mean_reward\", \"pass_at_k\", \"k\", "
                 "\"prompts\"}, found ", e.dump()));
    }
    EvalPoint p;
    p.set = e["set"].get<std::string>();
    Reader reader{e, absl::OkStatus(), {}};
    reader("version", p.version);
    reader("mean_reward", p.mean_reward);
    reader("pass_at_k", p.pass_at_k);
    reader("k", p.k);
    reader("prompts", p.prompts);
    if (!reader.status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", reader.status.message()));
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

void SetStepResult(const StepResult& result, double lr, StepReport* r) {
  const LossStats& l = result.stats.loss;
  r->loss = l.loss;
  r->mean_ratio = l.mean_ratio();
  r->max_ratio = l.ratio_max;
  r->clipped_fraction = l.clipped_fraction();
  r->effective_sample_size = l.effective_sample_size();
  r->kl_behaviour_learner = l.kl();
  r->entropy = l.entropy();
  r->policy_entropy = result.stats.policy_entropy;
  r->reference_kl = result.stats.reference_kl;
  r->grad_norm = result.optimizer.grad_norm;
  r->lr = lr;
  r->lag_mean = result.stats.lag_mean;
  r->lag_max = result.stats.lag_max;
  r->trained_tokens = static_cast<int64_t>(l.tokens);
  r->input_tokens = result.stats.input_tokens;
  r->routed_tokens = result.stats.routed_tokens;
  const StepStats& s = result.stats;
  r->route_mismatch_fraction =
      s.routed_tokens > 0 ? static_cast<double>(s.route_mismatches) / s.routed_tokens : 0.0;
  r->lagged_routed_tokens = s.lagged_routed_tokens;
  r->lagged_route_mismatch_fraction =
      s.lagged_routed_tokens > 0
          ? static_cast<double>(s.lagged_route_mismatches) / s.lagged_routed_tokens
          : 0.0;
  r->router_aux_loss = s.router_aux_loss;
  r->peak_activation_bytes = s.peak_activation_bytes;
  r->step_seconds = result.stats.seconds;
}

std::string StepReportToJson(const StepReport& report) {
  StepReport copy = report;
  Json j = Json::object();
  Writer writer{j};
  VisitFields(copy, writer);
  if (!report.evals.empty()) {
    Json evals = Json::array();
    for (const EvalPoint& e : report.evals) {
      evals.push_back({{"set", e.set},
                       {"version", e.version},
                       {"mean_reward", e.mean_reward},
                       {"pass_at_k", e.pass_at_k},
                       {"k", e.k},
                       {"prompts", e.prompts}});
    }
    j["evals"] = evals;
  }
  return j.dump();
}

absl::StatusOr<StepReport> ParseStepReport(absl::string_view json_line) {
  const Json j = Json::parse(json_line.begin(), json_line.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step report: expected one JSON object, found '", json_line, "'"));
  }
  StepReport report;
  Reader reader{j, absl::OkStatus(), {}};
  VisitFields(report, reader);
  if (!reader.status.ok()) return reader.status;
  reader.seen.insert("evals");
  if (j.contains("evals")) {
    PRL_ASSIGN_OR_RETURN(report.evals, ParseEvals(j["evals"]));
  }
  for (const auto& [key, unused] : j.items()) {
    if (!reader.seen.count(key)) {
      return absl::InvalidArgumentError(absl::StrCat("step report: unknown field '", key,
                                                     "' (known: ", absl::StrJoin(reader.seen, ", "),
                                                     ")"));
    }
  }
  return report;
}

}  // namespace prl::learner
