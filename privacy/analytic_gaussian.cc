// The exact (epsilon, delta) curve of the Gaussian mechanism (Balle and Wang 2018, Theorem 8).
#include <algorithm>
#include <cmath>

#include "privacy/accountant.h"
#include "privacy/internal/math.h"

namespace huddle::privacy {

double AnalyticGaussianDelta(double z, double epsilon) {
  if (std::isnan(z) || std::isnan(epsilon) || z < 0) return std::nan("");
  if (std::isinf(z) || epsilon == internal::kInf) return 0;
  if (z == 0) return 1;
  // delta = Phi(a - b) - e^eps Phi(-a - b) with a = 1 / (2z), b = eps z. Both terms are taken in
  // log space (they underflow long before their difference stops mattering) and subtracted as
  // T1 (1 - exp(log T2 - log T1)); erfc keeps each one relatively accurate in the tail.
  const double a = 0.5 / z;
  const double b = epsilon * z;
  const double log_t1 = internal::LogNdtr(a - b);
  const double log_t2 = epsilon + internal::LogNdtr(-a - b);
  if (log_t2 >= log_t1) return 0;
  return std::clamp(std::exp(log_t1) * -std::expm1(log_t2 - log_t1), 0.0, 1.0);
}

StatusOr<double> AnalyticGaussianEpsilon(double z, double delta) {
  if (!(z >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("noise multiplier must be >= 0, got ", z));
  }
  if (!(delta > 0 && delta < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("delta must be in (0, 1), got ", delta));
  }
  if (z == 0) return internal::kInf;
  if (std::isinf(z) || AnalyticGaussianDelta(z, 0) <= delta) return 0.0;
  // delta(eps) decreases in eps: bracket, then bisect to the last bit, returning the upper end
  // (delta(hi) <= delta always holds).
  double lo = 0;
  double hi = 1;
  while (AnalyticGaussianDelta(z, hi) > delta) {
    lo = hi;
    hi *= 2;
    if (hi > 1e300) return internal::kInf;
  }
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (mid <= lo || mid >= hi) break;
    if (AnalyticGaussianDelta(z, mid) > delta) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return hi;
}

}  // namespace huddle::privacy
