#include "learner/joint_step.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "learner/activation_budget.h"
#include "learner/step_passes.h"

namespace prl::learner {

absl::Status CheckAdapterStep(const AdapterStep& s) {
  const StepConfig& config = *s.config;
  PRL_RETURN_IF_ERROR(ValidateStepConfig(config));
  if (config.loss.kl.enabled() && config.reference == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kl_coef: ", config.loss.kl.coef, " needs a reference model, found none"));
  }
  PRL_RETURN_IF_ERROR(CheckRoutes(s.samples, s.model->config()));
  if (config.activation_budget_bytes > 0) {
    PRL_RETURN_IF_ERROR(CheckBudget(*s.model, s.samples, config.activation_budget_bytes));
  }
  return absl::OkStatus();
}

absl::Status CheckJointStep(absl::Span<const AdapterStep> steps) {
  if (steps.empty()) return absl::InvalidArgumentError("joint step: no adapters' steps");
  const AdapterStep& first = steps[0];
  for (size_t i = 0; i < steps.size(); ++i) {
    const AdapterStep& s = steps[i];
    const auto refuse = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat("joint step: adapter step ", i, ": ", what));
    };
    if (s.model == nullptr || s.optimizer == nullptr || s.config == nullptr) {
      return refuse("expected a model, an optimizer and a step config, found none");
    }
    if (s.samples.empty()) return refuse("expected samples, found none");
    if (s.model->lora_layout() == nullptr || s.model->world_size() != 1) {
      return refuse(absl::StrCat(
          "expected an adapter's model at world size 1, found ",
          s.model->lora_layout() == nullptr ? "a model of every weight" : "world size ",
          s.model->lora_layout() == nullptr ? 0 : s.model->world_size()));
    }
    if (s.model->frozen_base() != first.model->frozen_base()) {
      return refuse("expected the first step's frozen base, found another");
    }
    if (!s.model->device().is_cpu() ||
        s.model->transformer_options().compute_dtype != DType::kF32) {
      return refuse(absl::StrCat("expected the CPU in fp32, found ", s.model->device().ToString(),
                                 " ", DTypeName(s.model->transformer_options().compute_dtype)));
    }
    if (s.model->context() != nullptr) {
      return refuse("expected no context parallelism, found a context group");
    }
    if (s.config->temperature != first.config->temperature) {
      return refuse(absl::StrCat("expected the first step's temperature ",
                                 first.config->temperature, ", found ", s.config->temperature));
    }
    if (s.config->router_aux_loss_coef != 0 && s.model->config().num_moe_layers() > 0) {
      return refuse(absl::StrCat(
          "expected no load-balancing loss coefficient (it would be over the joint batch), "
          "found ",
          s.config->router_aux_loss_coef));
    }
  }
  return absl::OkStatus();
}

namespace {

// One adapter's step in progress.
struct Planned {
  const AdapterStep* step;
  std::vector<std::vector<int>> plan;  // its micro-batches
  StepTotals totals;
  RankSums sums;
};

// Micro-batch `pass` of every adapter that has one, grouped into joint passes of at most
// pass_tokens input tokens that fit the budget (0: none); indices into `planned`.
std::vector<std::vector<int>> JointPasses(const std::vector<Planned>& planned, size_t pass,
                                          int64_t pass_tokens, int64_t budget_bytes) {
  std::vector<std::vector<int>> passes;
  int64_t tokens = 0, seqs = 0;
  for (int k = 0; k < static_cast<int>(planned.size()); ++k) {
    const Planned& p = planned[k];
    if (pass >= p.plan.size()) continue;
    int64_t n = 0;
    for (int i : p.plan[pass]) n += p.step->samples[i].input_tokens();
    const int64_t m = static_cast<int64_t>(p.plan[pass].size());
    bool fits = !passes.empty() && tokens + n <= pass_tokens;
    if (fits && budget_bytes > 0) {
      const int64_t segments = static_cast<int64_t>(passes.back().size()) + 1;
      const auto joint_bytes = [&](const Planned& q) {
        PassPlanner planner = PlannerOf(*q.step->model);
        planner.lora_segments = segments;
        return planner.PassBytes(tokens + n, seqs + m);
      };
      for (int j : passes.back()) {  // the largest adapter rank among them decides the scratch
        fits = fits && joint_bytes(planned[j]) <= budget_bytes;
      }
      fits = fits && joint_bytes(p) <= budget_bytes;
    }
    if (!fits) {
      passes.emplace_back();
      tokens = seqs = 0;
    }
    passes.back().push_back(k);
    tokens += n;
    seqs += m;
  }
  return passes;
}

// One joint pass: each member's micro-batch `pass`, packed; forward, each adapter's loss and
// the gradient at its log-probs, backward.
absl::Status RunJointPass(std::vector<Planned>& planned, const std::vector<int>& members,
                          size_t pass) {
  std::vector<MicroBatch> mbs;
  std::vector<std::vector<float>> refs;
  std::vector<FsdpModel::JointSegment> segments;
  PackedBatch joint;
  FsdpModel& lead = *planned[members[0]].step->model;
  const ModelConfig& config = lead.config();
  const int64_t LK = config.num_moe_layers() * config.num_experts_per_tok;
  bool replayed = false;
  for (int k : members) {
    const AdapterStep& s = *planned[k].step;
    mbs.push_back(BuildMicroBatch(s.samples, planned[k].plan[pass], config, s.config->moe_routing,
                                  s.learner_version));
    PRL_ASSIGN_OR_RETURN(std::vector<float> ref,
                         ReferenceLogprobs(*s.model, mbs.back(), *s.config, nullptr));
    refs.push_back(std::move(ref));
    replayed = replayed || !mbs.back().batch.routes.empty();
  }
  for (size_t j = 0; j < members.size(); ++j) {
    const PackedBatch& b = mbs[j].batch;
    const int64_t begin = joint.num_tokens();
    for (int64_t q = 0; q < b.num_seqs(); ++q) {
      const auto first = b.tokens.begin() + b.cu_seqlens[q],
                 last = b.tokens.begin() + b.cu_seqlens[q + 1];
      joint.Add({&*first, static_cast<size_t>(last - first)},
                {b.targets.data() + b.cu_seqlens[q], static_cast<size_t>(last - first)});
    }
    if (replayed) {  // every member's rows: its replayed routes, or the router's choice
      if (b.routes.empty()) {
        joint.routes.insert(joint.routes.end(), b.num_tokens() * LK, PackedBatch::kRouted);
      } else {
        joint.routes.insert(joint.routes.end(), b.routes.begin(), b.routes.end());
      }
    }
    segments.push_back({planned[members[j]].step->model, begin, joint.num_tokens()});
  }
  const float temperature = planned[members[0]].step->config->temperature;
  std::vector<float> logprobs(joint.num_tokens(), 0.0f);
  PRL_RETURN_IF_ERROR(lead.JointForward(joint, temperature, absl::MakeSpan(logprobs), segments));
  const absl::Span<const float> entropies = lead.entropies();
  const absl::Span<const uint8_t> routes = lead.recomputed_routes();
  const absl::Span<const double> lb = lead.segment_load_balancing_losses();
  std::vector<float> dlogprobs(joint.num_tokens(), 0.0f);
  for (size_t j = 0; j < members.size(); ++j) {
    Planned& p = planned[members[j]];
    const int64_t begin = segments[j].begin, T = segments[j].end - begin;
    CountRouteMismatches(mbs[j], routes.subspan(begin * LK, T * LK), config, &p.sums);
    double tokens = 0;
    for (int i : p.plan[pass]) tokens += static_cast<double>(p.step->samples[i].input_tokens());
    if (!lb.empty() && p.totals.input_tokens > 0) {
      p.sums.router_aux_loss += tokens / p.totals.input_tokens * lb[j];
    }
    PRL_ASSIGN_OR_RETURN(const std::vector<float> d,
                         PassGradient(mbs[j], *p.step->config, p.totals.normalizer,
                                      absl::MakeConstSpan(logprobs).subspan(begin, T),
                                      entropies.subspan(begin, T), refs[j], &p.sums, nullptr));
    std::copy(d.begin(), d.end(), dlogprobs.begin() + begin);
  }
  PRL_RETURN_IF_ERROR(lead.JointBackward(dlogprobs));
  for (int k : members) {
    Planned& p = planned[k];
    p.sums.peak_activation_bytes =
        std::max(p.sums.peak_activation_bytes, static_cast<double>(lead.last_pass_bytes()));
    p.sums.AddLags(p.step->samples, p.plan[pass], p.step->learner_version);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<StepStats>> AccumulateJointGradients(
    absl::Span<const AdapterStep> steps, int64_t pass_tokens) {
  const auto start = std::chrono::steady_clock::now();
  PRL_RETURN_IF_ERROR(CheckJointStep(steps));
  if (pass_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("joint step: pass_tokens: expected >= 1, found ", pass_tokens));
  }
  std::vector<Planned> planned;
  size_t passes = 0;
  int64_t budget = 0;  // the tightest of the adapters' activation budgets
  for (const AdapterStep& s : steps) {
    const StepConfig& config = *s.config;
    PRL_RETURN_IF_ERROR(CheckAdapterStep(s));
    PassFits fits;
    if (config.activation_budget_bytes > 0) {
      fits = [planner = PlannerOf(*s.model), b = config.activation_budget_bytes](
                 int64_t tokens, int64_t seqs) { return planner.PassBytes(tokens, seqs) <= b; };
      budget = budget == 0 ? config.activation_budget_bytes
                           : std::min(budget, config.activation_budget_bytes);
    }
    Planned p{&s, PlanMicroBatches(s.samples, 0, 1, config.micro_batch_tokens, fits), {}, {}};
    PRL_RETURN_IF_ERROR(s.model->ZeroGrad());
    PRL_ASSIGN_OR_RETURN(p.totals, AgreeTotals(*s.model, s.samples, p.plan, true));
    passes = std::max(passes, p.plan.size());
    planned.push_back(std::move(p));
  }
  for (size_t pass = 0; pass < passes; ++pass) {
    for (const std::vector<int>& members : JointPasses(planned, pass, pass_tokens, budget)) {
      PRL_RETURN_IF_ERROR(RunJointPass(planned, members, pass));
    }
  }
  std::vector<StepStats> stats(planned.size());
  for (size_t k = 0; k < planned.size(); ++k) {
    stats[k].micro_batches = planned[k].totals.passes;
    PRL_RETURN_IF_ERROR(ReduceStats(*planned[k].step->model, planned[k].sums, &stats[k]));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (StepStats& s : stats) s.seconds = seconds;
  return stats;
}

absl::StatusOr<std::vector<StepResult>> TrainJointStep(absl::Span<const AdapterStep> steps,
                                                       int64_t pass_tokens) {
  const auto start = std::chrono::steady_clock::now();
  PRL_ASSIGN_OR_RETURN(const std::vector<StepStats> stats,
                       AccumulateJointGradients(steps, pass_tokens));
  std::vector<StepResult> results(steps.size());
  for (size_t k = 0; k < steps.size(); ++k) {
    results[k].stats = stats[k];
    PRL_ASSIGN_OR_RETURN(results[k].optimizer, steps[k].optimizer->Step());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (StepResult& r : results) r.stats.seconds = seconds;
  return results;
}

}  // namespace prl::learner
