// Internals of the RDP accountant, exposed for tests.
#pragma once

#include <cstdint>

namespace huddle::privacy::internal {

// A_alpha = E_{x ~ N(0, sigma^2)} [((1 - q) + q exp((2x - 1) / (2 sigma^2)))^alpha] is the moment
// whose log / (alpha - 1) is the RDP of the subsampled Gaussian. These return log(A_alpha - 1),
// which keeps full relative precision when A_alpha is within rounding of 1 (tiny q or huge sigma).
// Both require 0 < q < 1, 0 < sigma < inf, alpha > 1.

// Integer alpha: the finite binomial sum sum_{i>=2} C(alpha, i) (1-q)^(alpha-i) q^i
// (exp((i^2 - i) / (2 sigma^2)) - 1) (every term positive), in log space.
double LogAMinus1Integer(double q, double sigma, int64_t alpha);

// Any alpha: adaptive 21-point Gauss-Kronrod quadrature of the defining integral, written as
// E[(1 + w)^alpha - 1 - alpha w] with w = q (exp(L) - 1) (E[w] = 0, so the linear term, the only
// one that could cancel, is removed and the integrand is non-negative).
double LogAMinus1Quadrature(double q, double sigma, double alpha);

}  // namespace huddle::privacy::internal
