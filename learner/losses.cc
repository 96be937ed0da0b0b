#include "learner/losses.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "core/status_macros.h"

namespace prl::learner {
namespace {

// `field` must be finite and within [lo, hi] (or (lo, hi] etc. as the flags say).
absl::Status CheckRange(absl::string_view field, double value, double lo, bool lo_open, double hi,
                        bool hi_open) {
  const bool ok = std::isfinite(value) && (lo_open ? value > lo : value >= lo) &&
                  (hi_open ? value < hi : value <= hi);
  if (ok) return absl::OkStatus();
  std::string expected =
      std::isinf(hi) ? absl::StrCat(lo_open ? "> " : ">= ", lo)
                     : absl::StrCat("in ", lo_open ? "(" : "[", lo, ", ", hi, hi_open ? ")" : "]");
  return absl::InvalidArgumentError(
      absl::StrCat("loss config: ", field, " must be finite and ", expected, ", found ", value));
}

constexpr double kInf = std::numeric_limits<double>::infinity();

double Clip(double x, double lo, double hi) { return std::min(std::max(x, lo), hi); }

// The per-token loss l_t, its derivative dl_t/dpi_t (gspo: d(sum_{t' in i} l_t')/dpi_t), the
// importance weight w_t applied to it and whether a clip, cap or mask acted on it.
struct TokenTerm {
  double loss = 0;
  double grad = 0;
  double weight = 1;
  bool clipped = false;
};

// PPO's surrogate -min(ratio A, clip(ratio, 1 - low, 1 + high) A), ratio = exp(x), with its
// derivative with respect to x: -ratio A where the unclipped term is the minimum, else 0.
TokenTerm PpoSurrogate(double ratio, double a, double low, double high) {
  const double unclipped = ratio * a;
  const double clipped = Clip(ratio, 1.0 - low, 1.0 + high) * a;
  if (unclipped <= clipped) return {-unclipped, -unclipped, ratio, false};
  return {-clipped, 0.0, ratio, true};
}

// Every token-level loss; gspo is sequence-level (SequenceTerm).
TokenTerm TokenLoss(const LossConfig& c, double pi, double mu, double prox, double a) {
  const double r = std::exp(pi - mu);
  switch (c.kind) {
    case LossKind::kReinforceTis: {
      // l = -sg(min(r, c)) A pi;  dl/dpi = -min(r, c) A
      const double w = std::min(r, c.tis_cap);
      return {-w * a * pi, -w * a, w, r > c.tis_cap};
    }
    case LossKind::kPpoClip:
      // l = -min(r A, clip(r, 1 - low, 1 + high) A);  dl/dpi = -r A unclipped, else 0
      return PpoSurrogate(r, a, c.clip_low, c.clip_high);
    case LossKind::kDecoupledPpo: {
      // q = exp(pi - prox), b = sg(min(exp(prox - mu), c));
      // l = -b min(q A, clip(q, 1 - low, 1 + high) A);  dl/dpi = -b q A unclipped, else 0
      const double behaviour = std::exp(prox - mu);
      const double b = std::min(behaviour, c.tis_cap);
      const TokenTerm p = PpoSurrogate(std::exp(pi - prox), a, c.clip_low, c.clip_high);
      return {b * p.loss, b * p.grad, b, p.clipped || behaviour > c.tis_cap};
    }
    case LossKind::kIcepop: {
      // M(k) = k if low <= k <= high else 0, k = sg(r);  l = -M(k) A pi;  dl/dpi = -M(k) A
      const bool kept = r >= c.icepop_low && r <= c.icepop_high;
      const double m = kept ? r : 0.0;
      return {-m * a * pi, -m * a, m, !kept};
    }
    case LossKind::kCispo: {
      // w = sg(clip(r, 1 - low, 1 + high));  l = -w A pi;  dl/dpi = -w A
      const double w = Clip(r, 1.0 - c.cispo_clip_low, 1.0 + c.cispo_clip_high);
      return {-w * a * pi, -w * a, w, w != r};
    }
    case LossKind::kSft:
      // l = -pi;  dl/dpi = -1
      return {-pi, -1.0, 1.0, false};
    case LossKind::kGspo:
      break;
  }
  PRL_CHECK(false, "TokenLoss called for a sequence-level loss");
  return {};
}

// gspo over one sequence i: s_i = exp(mean_t(pi_t - mu_t)),
// L_i = -min(s_i A_i, clip(s_i, 1 - low, 1 + high) A_i), carried by each of its n_i tokens, so
// d(sum_t l_t)/dpi_t = n_i dL_i/dpi_t = n_i (1 / n_i) dL_i/dlog(s_i) = -s_i A_i unclipped, else 0.
// log_ratio_sum: sum_t (pi_t - mu_t) over the sequence's n trained tokens.
TokenTerm SequenceTerm(const LossConfig& c, double log_ratio_sum, int64_t n, double a) {
  return PpoSurrogate(std::exp(log_ratio_sum / static_cast<double>(n)), a, c.gspo_clip_low,
                      c.gspo_clip_high);
}

absl::Status CheckSize(absl::string_view name, size_t found, size_t n, bool may_be_empty) {
  if (found == n || (may_be_empty && found == 0)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("loss inputs: ", name, " has ", found,
                                                 " elements, expected ", n, " (the size of pi)",
                                                 may_be_empty ? " or 0" : ""));
}

absl::Status CheckFinite(absl::string_view name, absl::Span<const float> values, int64_t t,
                         int64_t seq) {
  if (values.empty() || std::isfinite(values[t])) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("loss inputs: ", name, "[", t, "] = ", values[t],
                                                 " (token ", t, ", sequence ", seq,
                                                 ") is not finite"));
}

absl::Status ValidateInputs(const LossConfig& config, const LossInputs& in,
                            const LossNormalizer& normalizer, size_t dpi_size) {
  const size_t n = in.pi.size();
  const bool sft = config.kind == LossKind::kSft;
  const bool decoupled = config.kind == LossKind::kDecoupledPpo;
  PRL_RETURN_IF_ERROR(CheckSize("mu", in.mu.size(), n, /*may_be_empty=*/sft));
  PRL_RETURN_IF_ERROR(CheckSize("prox", in.prox.size(), n, /*may_be_empty=*/!decoupled));
  PRL_RETURN_IF_ERROR(CheckSize("advantages", in.advantages.size(), n, /*may_be_empty=*/sft));
  PRL_RETURN_IF_ERROR(CheckSize("dpi", dpi_size, n, /*may_be_empty=*/false));
  const bool kl = config.kl.enabled();
  PRL_RETURN_IF_ERROR(CheckSize("ref", in.ref.size(), n, /*may_be_empty=*/!kl));
  PRL_RETURN_IF_ERROR(CheckSize("penalty_after", in.penalty_after.size(), n, true));
  if (kl && config.kl.penalty == KlPenalty::kReward) {
    PRL_RETURN_IF_ERROR(CheckSize("mu (for kl_penalty reward)", in.mu.size(), n, false));
  }
  const auto& off = in.seq_offsets;
  if (off.empty() || off.front() != 0 || static_cast<size_t>(off.back()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss inputs: seq_offsets must start at 0 and end at ", n, " (the size of pi), found ",
        off.empty() ? std::string("no offsets")
                    : absl::StrCat("first ", off.front(), ", last ", off.back())));
  }
  int64_t sequences = 0;
  for (size_t s = 0; s + 1 < off.size(); ++s) {
    if (off[s + 1] < off[s]) {
      return absl::InvalidArgumentError(
          absl::StrCat("loss inputs: seq_offsets[", s + 1, "] = ", off[s + 1],
                       " is less than seq_offsets[", s, "] = ", off[s]));
    }
    sequences += off[s + 1] > off[s];
  }
  for (size_t s = 0; s + 1 < off.size(); ++s) {
    for (int64_t t = off[s]; t < off[s + 1]; ++t) {
      PRL_RETURN_IF_ERROR(CheckFinite("pi", in.pi, t, s));
      PRL_RETURN_IF_ERROR(CheckFinite("mu", in.mu, t, s));
      if (decoupled) PRL_RETURN_IF_ERROR(CheckFinite("prox", in.prox, t, s));
      if (kl) PRL_RETURN_IF_ERROR(CheckFinite("ref", in.ref, t, s));
      if (!sft) PRL_RETURN_IF_ERROR(CheckFinite("advantages", in.advantages, t, s));
      if (config.kind == LossKind::kGspo && in.advantages[t] != in.advantages[off[s]]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "loss inputs: gspo needs one advantage per sequence, but sequence ", s, " has ",
            in.advantages[off[s]], " on its first token and ", in.advantages[t], " on token ", t));
      }
    }
  }
  if (n == 0) return absl::OkStatus();
  const bool by_tokens = config.normalization == LossNormalization::kGlobalTokens;
  const double count = by_tokens ? normalizer.tokens : normalizer.sequences;
  const double needed = by_tokens ? static_cast<double>(n) : static_cast<double>(sequences);
  if (!std::isfinite(count) || count < needed) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss normalizer: ", by_tokens ? "tokens" : "sequences",
                     " (the step's total) must be finite and >= this micro-batch's ", needed,
                     ", found ", count));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateLossConfig(const LossConfig& c) {
  PRL_RETURN_IF_ERROR(CheckRange("tis_cap", c.tis_cap, 0, true, kInf, false));
  PRL_RETURN_IF_ERROR(CheckRange("clip_low", c.clip_low, 0, false, 1, true));
  PRL_RETURN_IF_ERROR(CheckRange("clip_high", c.clip_high, 0, false, kInf, false));
  PRL_RETURN_IF_ERROR(CheckRange("icepop_low", c.icepop_low, 0, false, kInf, false));
  PRL_RETURN_IF_ERROR(CheckRange("icepop_high", c.icepop_high, c.icepop_low, true, kInf, false));
  // cispo_clip_low = 1 is the MiniMax-M1 default: a lower bound of 0, i.e. none (r > 0).
  PRL_RETURN_IF_ERROR(CheckRange("cispo_clip_low", c.cispo_clip_low, 0, false, 1, false));
  PRL_RETURN_IF_ERROR(CheckRange("cispo_clip_high", c.cispo_clip_high, 0, false, kInf, false));
  PRL_RETURN_IF_ERROR(CheckRange("gspo_clip_low", c.gspo_clip_low, 0, false, 1, true));
  PRL_RETURN_IF_ERROR(CheckRange("gspo_clip_high", c.gspo_clip_high, 0, false, kInf, false));
  PRL_RETURN_IF_ERROR(CheckRange("kl.coef", c.kl.coef, 0, false, kInf, false));
  return absl::OkStatus();
}

void LossStats::Merge(const LossStats& o) {
  loss += o.loss;
  tokens += o.tokens;
  sequences += o.sequences;
  ratio_sum += o.ratio_sum;
  ratio_max = std::max(ratio_max, o.ratio_max);
  clipped += o.clipped;
  weight_sum += o.weight_sum;
  weight_sq_sum += o.weight_sq_sum;
  kl_sum += o.kl_sum;
  neg_logprob_sum += o.neg_logprob_sum;
  ref_kl_sum += o.ref_kl_sum;
}

std::vector<double> LossStats::ToVector() const {
  return {loss,       tokens,        sequences, ratio_sum,       clipped,   weight_sum,
          weight_sq_sum, kl_sum,    neg_logprob_sum, ref_kl_sum, ratio_max};
}

LossStats LossStats::FromVector(absl::Span<const double> v) {
  PRL_CHECK(v.size() == kNumSums + 1, "LossStats::FromVector needs ", kNumSums + 1, " values, got ",
            v.size());
  LossStats s;
  s.loss = v[0];
  s.tokens = v[1];
  s.sequences = v[2];
  s.ratio_sum = v[3];
  s.clipped = v[4];
  s.weight_sum = v[5];
  s.weight_sq_sum = v[6];
  s.kl_sum = v[7];
  s.neg_logprob_sum = v[8];
  s.ref_kl_sum = v[9];
  s.ratio_max = v[10];
  return s;
}

double LossStats::mean_ratio() const { return tokens > 0 ? ratio_sum / tokens : 0.0; }
double LossStats::clipped_fraction() const { return tokens > 0 ? clipped / tokens : 0.0; }
double LossStats::effective_sample_size() const {
  return tokens > 0 && weight_sq_sum > 0 ? weight_sum * weight_sum / (tokens * weight_sq_sum) : 0.0;
}
double LossStats::kl() const { return tokens > 0 ? kl_sum / tokens : 0.0; }
double LossStats::entropy() const { return tokens > 0 ? neg_logprob_sum / tokens : 0.0; }
double LossStats::reference_kl() const { return tokens > 0 ? ref_kl_sum / tokens : 0.0; }

absl::Status ComputeLoss(const LossConfig& config, const LossInputs& in,
                         const LossNormalizer& normalizer, absl::Span<float> dpi,
                         LossStats* stats) {
  PRL_CHECK(stats != nullptr, "ComputeLoss needs stats");
  PRL_RETURN_IF_ERROR(ValidateLossConfig(config));
  PRL_RETURN_IF_ERROR(ValidateInputs(config, in, normalizer, dpi.size()));
  const bool has_mu = !in.mu.empty();
  const bool has_advantages = !in.advantages.empty();
  const bool has_prox = !in.prox.empty();
  const KlConfig& kl = config.kl;
  const bool kl_loss = kl.enabled() && kl.penalty == KlPenalty::kLoss;
  const bool kl_reward = kl.enabled() && kl.penalty == KlPenalty::kReward;
  LossStats sums;
  double loss = 0;
  std::vector<double> advantage;  // one sequence's, with kl_penalty reward's return to go
  for (size_t s = 0; s + 1 < in.seq_offsets.size(); ++s) {
    const int64_t begin = in.seq_offsets[s], len = in.seq_offsets[s + 1] - begin;
    if (len == 0) continue;
    // kGlobalTokens: sum_t l_t / tokens;  kSequenceMean: sum_i (1 / n_i) sum_{t in i} l_t / S.
    const int64_t n_i = in.seq_trained_tokens.empty() ? len : in.seq_trained_tokens[s];
    const double scale = config.normalization == LossNormalization::kGlobalTokens
                             ? 1.0 / normalizer.tokens
                             : 1.0 / (static_cast<double>(n_i) * normalizer.sequences);
    // A_t = A_i - coef sum_{u >= t} k(mu_u - ref_u) (learner/reference_kl.h); else A_i.
    advantage.assign(len, 0.0);
    double penalty_to_go = 0;
    for (int64_t t = begin + len - 1; t >= begin; --t) {
      if (kl_reward) {
        penalty_to_go += kl.coef * KlEstimate(kl.estimator, double{in.mu[t]} - in.ref[t]).value;
      }
      const double elsewhere = in.penalty_after.empty() ? 0.0 : in.penalty_after[t];
      advantage[t - begin] =
          (has_advantages ? double{in.advantages[t]} : 0.0) - penalty_to_go - elsewhere;
    }
    TokenTerm sequence_term;
    if (config.kind == LossKind::kGspo) {
      double log_ratio_sum = 0;
      for (int64_t t = begin; t < begin + len; ++t) {
        log_ratio_sum += double{in.pi[t]} - double{in.mu[t]};
      }
      if (!in.seq_log_ratio_sums.empty()) log_ratio_sum = in.seq_log_ratio_sums[s];  // the group's
      sequence_term = SequenceTerm(config, log_ratio_sum, n_i, advantage[0]);
    }
    double sequence_loss = 0;
    for (int64_t t = begin; t < begin + len; ++t) {
      const double pi = in.pi[t];
      const double mu = has_mu ? double{in.mu[t]} : 0.0;
      TokenTerm term = config.kind == LossKind::kGspo
                           ? sequence_term
                           : TokenLoss(config, pi, mu, has_prox ? double{in.prox[t]} : 0.0,
                                       advantage[t - begin]);
      if (kl.enabled()) {
        const KlTerm k = KlEstimate(kl.estimator, pi - in.ref[t]);
        sums.ref_kl_sum += k.value;
        if (kl_loss) {  // l_t += coef k_t;  dl_t/dpi_t += coef dk_t/dpi_t
          term.loss += kl.coef * k.value;
          term.grad += kl.coef * k.grad;
        }
      }
      sequence_loss += term.loss;
      dpi[t] = static_cast<float>(scale * term.grad);
      if (has_mu) {
        // r = exp(pi - mu); k3 = (r - 1) - log r
        const double r = std::exp(pi - mu);
        sums.ratio_sum += r;
        sums.ratio_max = std::max(sums.ratio_max, r);
        sums.kl_sum += (r - 1.0) - (pi - mu);
      }
      sums.clipped += term.clipped;
      sums.weight_sum += term.weight;
      sums.weight_sq_sum += term.weight * term.weight;
      sums.neg_logprob_sum -= pi;
    }
    loss += scale * sequence_loss;
    sums.tokens += static_cast<double>(len);
    sums.sequences += 1;
  }
  sums.loss = loss;
  stats->Merge(sums);
  return absl::OkStatus();
}

}  // namespace prl::learner
