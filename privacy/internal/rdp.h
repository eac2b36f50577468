// Internals of the RDP accountant, exposed for tests.
#pragma once

#include <cstdint>

#include "common/status.h"

namespace huddle::privacy::internal {

// A_alpha = E_{x ~ N(0, sigma^2)} [((1 - q) + q exp((2x - 1) / (2 sigma^2)))^alpha] is the moment
// whose log / (alpha - 1) is the RDP of the subsampled Gaussian. These return log(A_alpha - 1),
// which keeps full relative precision when A_alpha is within rounding of 1 (tiny q or huge sigma).
// Both require 0 < q < 1, 0 < sigma < inf, alpha > 1.

// Work bounds of the two exact methods (each call then takes at most a few milliseconds).
// The binomial sum takes alpha terms: integer orders up to kMaxBinomialOrder.
inline constexpr int64_t kMaxBinomialOrder = 100000;
// The quadrature first scans [-40, alpha / sigma + 40] on a grid of step 0.5 for the mass:
// QuadratureGridPoints(sigma, alpha) points, at most kMaxQuadraturePoints (alpha / sigma up to
// ~32700; the default orders need it only below z ~ 3e-4, where the closed form below is exact).
inline constexpr int64_t kMaxQuadraturePoints = int64_t{1} << 16;
double QuadratureGridPoints(double sigma, double alpha);  // a double: it may exceed int64

// Integer alpha: the finite binomial sum sum_{i>=2} C(alpha, i) (1-q)^(alpha-i) q^i
// (exp((i^2 - i) / (2 sigma^2)) - 1) (every term positive), in log space.
// NaN if alpha > kMaxBinomialOrder.
double LogAMinus1Integer(double q, double sigma, int64_t alpha);

// Any alpha: adaptive 21-point Gauss-Kronrod quadrature of the defining integral, written as
// E[(1 + w)^alpha - 1 - alpha w] with w = q (exp(L) - 1) (E[w] = 0, so the linear term, the only
// one that could cancel, is removed and the integrand is non-negative). NaN if the grid would
// exceed kMaxQuadraturePoints.
double LogAMinus1Quadrature(double q, double sigma, double alpha);

// The one-step RDP where the dominant binomial term settles it (tiny sigma or huge alpha), in
// closed form. With c = (alpha - 1) / (2 sigma^2), A_alpha lies between E[(q e^L)^alpha] =
// q^alpha e^(alpha c) (dropping 1 - q >= 0) and (1 - q + q e^c)^alpha (Minkowski's inequality in
// L^alpha: ||1 - q + q e^L||_alpha <= 1 - q + q ||e^L||_alpha), so
//   alpha / (2 sigma^2) + alpha / (alpha - 1) log q  <=  RDP  <=  that + alpha / (alpha - 1)
//   log1p(u),  u = (1 - q) / q e^-c.
// Returns the upper end when the two ends agree to 1e-15 relative (+inf when alpha / (2 sigma^2)
// overflows: the RDP exceeds the largest double), ResourceExhausted naming the work limits
// otherwise. Requires 0 < q < 1, 0 < sigma < inf, 1 < alpha < inf.
StatusOr<double> DominantTermRdp(double q, double sigma, double alpha);

}  // namespace huddle::privacy::internal
