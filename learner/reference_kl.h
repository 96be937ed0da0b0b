// The KL penalty to a frozen reference model, per sampled token.
//
// With d = log pi(x_t) - log ref(x_t) at a token x_t sampled from pi (Schulman, "Approximating
// KL divergence"), each estimator's expectation under pi is KL(pi || ref):
//   k1 = d                                  (unbiased, high variance, can be negative)
//   k2 = d^2 / 2                            (biased, low variance, >= 0)
//   k3 = exp(-d) - 1 + d, clamped to <= 10  (unbiased, low variance, >= 0; verl's low_var_kl)
// and the derivative of each with respect to log pi: 1, d, 1 - exp(-d) (0 where k3 is clamped).
//
// learner.kl_penalty = loss adds kl_coef * k_t to the loss of token t (normalised like the
// policy loss, learner/losses.h) with its gradient. reward makes -kl_coef * k_t a per-token
// reward evaluated at the behaviour log-probs mu_t (the policy that sampled the token, as verl
// and AReaL evaluate their reward penalty at the rollout policy), so it carries no gradient:
// token t's advantage becomes A_i - kl_coef * sum_{u >= t} k_u (the penalty's return to go,
// undiscounted); gspo's sequence advantage takes the whole sequence's sum.
#pragma once

#include "config/learner_kinds.h"

namespace prl::learner {

struct KlConfig {
  double coef = 0.0;  // 0: off
  KlEstimator estimator = KlEstimator::kK3;
  KlPenalty penalty = KlPenalty::kLoss;
  bool enabled() const { return coef > 0; }
};

// k3 above this is clamped (verl's low_var_kl clamps to [-10, 10]; k3 >= 0).
inline constexpr double kK3Clamp = 10.0;

struct KlTerm {
  double value = 0;  // k(d)
  double grad = 0;   // dk/dlog pi
};
// The estimator at d = log pi - log ref.
KlTerm KlEstimate(KlEstimator estimator, double d);

}  // namespace prl::learner
