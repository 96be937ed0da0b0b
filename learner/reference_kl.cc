#include "learner/reference_kl.h"

#include <cmath>

namespace prl::learner {

KlTerm KlEstimate(KlEstimator estimator, double d) {
  switch (estimator) {
    case KlEstimator::kK1:
      return {d, 1.0};
    case KlEstimator::kK2:
      return {0.5 * d * d, d};
    case KlEstimator::kK3: {
      const double k3 = std::exp(-d) - 1.0 + d;
      if (k3 > kK3Clamp) return {kK3Clamp, 0.0};
      return {k3, 1.0 - std::exp(-d)};
    }
  }
  return {};
}

}  // namespace prl::learner
