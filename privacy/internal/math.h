// Numerical helpers shared by the privacy accountants (not part of the public API).
#pragma once

#include <cmath>
#include <limits>

namespace huddle::privacy::internal {

inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr double kLogSqrt2Pi = 0.91893853320467274178;  // log(sqrt(2 pi))

// log(exp(a) + exp(b)), exact for -inf arguments.
inline double LogAddExp(double a, double b) {
  if (a < b) std::swap(a, b);
  if (b == -kInf) return a;
  return a + std::log1p(std::exp(b - a));
}

// log(1 + exp(s)) without overflow.
inline double Log1pExp(double s) {
  return s > 0 ? s + std::log1p(std::exp(-s)) : std::log1p(std::exp(s));
}

// log(exp(c) - 1) for c > 0, without overflow and exact for tiny c.
inline double LogExpm1(double c) {
  return c > 30 ? c + std::log1p(-std::exp(-c)) : std::log(std::expm1(c));
}

// Standard normal CDF Phi(x); relatively accurate for x < 0 (the lower tail), absolutely for x > 0.
inline double Ndtr(double x) { return 0.5 * std::erfc(-x * 0.70710678118654752440); }

// log Phi(x), relatively accurate in both tails (asymptotic series below -30, where erfc
// would underflow).
inline double LogNdtr(double x) {
  if (x > 5) return std::log1p(-Ndtr(-x));
  if (x > -30) return std::log(Ndtr(x));
  // Phi(x) = phi(x)/|x| * (1 - 1/x^2 + 3/x^4 - 15/x^6 + ...) for x -> -inf.
  const double inv_x2 = 1.0 / (x * x);
  double term = 1.0;
  double series = 1.0;
  for (int k = 1; k <= 12; ++k) {
    term *= -(2.0 * k - 1.0) * inv_x2;
    series += term;
  }
  return -0.5 * x * x - kLogSqrt2Pi - std::log(-x) + std::log(series);
}

// The x <= 0 with log Phi(x) = log_p, for log_p < log(1/2): Newton's method on the concave
// LogNdtr, started left of the root (where the tangent stays above it), converges monotonically.
inline double NdtriFromLog(double log_p) {
  double x = -std::sqrt(-2.0 * log_p);  // left of the root: Phi(-s) <= exp(-s^2/2) / 2
  for (int i = 0; i < 100; ++i) {
    const double log_cdf = LogNdtr(x);
    const double log_pdf = -0.5 * x * x - kLogSqrt2Pi;
    const double step = (log_cdf - log_p) / std::exp(log_pdf - log_cdf);
    x -= step;
    if (std::fabs(step) <= 1e-16 * std::fabs(x)) break;
  }
  return x;
}

}  // namespace huddle::privacy::internal
