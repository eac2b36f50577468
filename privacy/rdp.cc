// RDP of the Poisson-subsampled Gaussian and its conversion to (epsilon, delta).
#include "privacy/internal/rdp.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "privacy/accountant.h"
#include "privacy/internal/math.h"

namespace huddle::privacy {
namespace internal {
namespace {

// 21-point Gauss-Kronrod rule on [-1, 1] (QUADPACK qk21): abscissae, Kronrod weights, and the
// weights of the embedded 10-point Gauss rule (at the odd abscissae).
constexpr double kXgk[11] = {0.995657163025808080735527280689003,
                             0.973906528517171720077964012084452,
                             0.930157491355708226001207180059508,
                             0.865063366688984510732096688423493,
                             0.780817726586416897063717578345042,
                             0.679409568299024406234327365114874,
                             0.562757134668604683339000099272694,
                             0.433395394129247190799265943165784,
                             0.294392862701460198131126603103866,
                             0.148874338981631210884826001129720,
                             0.0};
constexpr double kWgk[11] = {
    0.011694638867371874278064396062192, 0.032558162307964727478818972459390,
    0.054755896574351996031381300244580, 0.075039674810919952767043140916190,
    0.093125454583697605535065465083366, 0.109387158802297641899210590325805,
    0.123491976262065851077958109831074, 0.134709217311473325928054001771707,
    0.142775938577060080797094273138717, 0.147739104901338491374841515972068,
    0.149445554002916905664936468389821};
constexpr double kWg[5] = {0.066671344308688137593568809893332, 0.149451349150580593145776339657697,
                           0.219086362515982043995534934228163, 0.269266719309996355091226921569469,
                           0.295524224714752870173892994651338};

// log of the integrand of A_alpha - 1 in t = x / sigma: phi(t) * h(w), where
// h(w) = (1 + w)^alpha - 1 - alpha w >= 0 and w = q (exp(L) - 1), L = t / sigma - 1 / (2 sigma^2).
class MomentIntegrand {
 public:
  MomentIntegrand(double q, double sigma, double alpha)
      : q_(q), sigma_(sigma), alpha_(alpha), log_q_(std::log(q)), log1m_q_(std::log1p(-q)) {}

  double LogValue(double t) const {
    const double l = t / sigma_ - 0.5 / (sigma_ * sigma_);
    double w = kInf;
    double log1p_w;
    if (l <= 700) {
      w = q_ * std::expm1(l);
      log1p_w = std::log1p(w);
    } else {
      log1p_w = LogAddExp(log1m_q_, log_q_ + l);
    }
    return -0.5 * t * t - kLogSqrt2Pi + LogH(w, log1p_w);
  }

 private:
  double LogH(double w, double log1p_w) const {
    const double aw = std::fabs(w);
    if (aw <= 0.5 && alpha_ * aw <= 2) {
      // Binomial series from the w^2 term: |term ratio| = |alpha - k| |w| / (k + 1) <= 2/3, so the
      // terms shrink from the first one and the direct formula's cancellation is avoided.
      double term = 0.5 * alpha_ * (alpha_ - 1) * w * w;
      double sum = term;
      for (int k = 2; k < 400 && std::fabs(term) > 1e-17 * std::fabs(sum); ++k) {
        term *= (alpha_ - k) / (k + 1) * w;
        sum += term;
      }
      return sum > 0 ? std::log(sum) : -kInf;
    }
    const double lp = alpha_ * log1p_w;
    if (lp > 700) {  // (1 + w)^alpha dominates; here w > 0
      const double log_linear = w < 1e290 ? std::log1p(alpha_ * w) : std::log(alpha_) + log1p_w;
      return lp + std::log1p(-std::exp(log_linear - lp));
    }
    const double h = std::expm1(lp) - alpha_ * w;
    return h > 0 ? std::log(h) : -kInf;
  }

  double q_, sigma_, alpha_, log_q_, log1m_q_;
};

struct Piece {
  double lo, hi, value, error;
};

// GK21 of exp(f.LogValue(t) - shift) over [lo, hi]. The error estimate |K - G| is zeroed once it
// is within the rounding noise of the integrand: the exponent -t^2/2 + log h cancels terms of
// size ~t^2, so each value carries a relative error ~eps * t^2 that no subdivision removes.
Piece Kronrod21(const MomentIntegrand& f, double shift, double lo, double hi) {
  const double center = 0.5 * (lo + hi);
  const double half = 0.5 * (hi - lo);
  double kronrod = 0;
  double gauss = 0;
  double magnitude = 1;
  for (int j = 0; j < 11; ++j) {
    double fsum = 0;
    for (double sign : {1.0, -1.0}) {
      if (j == 10 && sign < 0) break;  // the centre once
      const double t = center + sign * half * kXgk[j];
      const double log_value = f.LogValue(t);
      fsum += std::exp(log_value - shift);
      if (std::isfinite(log_value)) magnitude = std::max(magnitude, t * t + std::fabs(log_value));
    }
    kronrod += kWgk[j] * fsum;
    if (j % 2 == 1) gauss += kWg[j / 2] * fsum;
  }
  const double value = half * kronrod;
  double error = half * std::fabs(kronrod - gauss);
  if (error <= 16 * std::numeric_limits<double>::epsilon() * magnitude * std::fabs(value)) {
    error = 0;
  }
  return {lo, hi, value, error};
}

}  // namespace

double QuadratureGridPoints(double sigma, double alpha) {
  // As LogAMinus1Quadrature computes its grid (the same expression, so the same rounding).
  const double a = -40;
  const double b = std::max(alpha, 0.5) / sigma + 40;
  return std::ceil((b - a) / 0.5) + 1;
}

double LogAMinus1Integer(double q, double sigma, int64_t alpha) {
  if (alpha > kMaxBinomialOrder) return std::nan("");
  const double log_q = std::log(q);
  const double log1m_q = std::log1p(-q);
  const double inv_2s2 = 0.5 / (sigma * sigma);
  const double n = static_cast<double>(alpha);
  std::vector<double> terms;
  terms.reserve(static_cast<size_t>(alpha));
  // log C(alpha, i), accumulated with Neumaier compensation so its error stays ~1 ulp.
  double log_binom = 0;
  double compensation = 0;
  double max_term = -kInf;
  for (int64_t i = 1; i <= alpha; ++i) {
    const double di = static_cast<double>(i);
    const double inc = std::log((n - di + 1) / di);
    const double sum = log_binom + inc;
    compensation +=
        std::fabs(log_binom) >= std::fabs(inc) ? (log_binom - sum) + inc : (inc - sum) + log_binom;
    log_binom = sum;
    if (i < 2) continue;
    const double term = (log_binom + compensation) + di * log_q + (n - di) * log1m_q +
                        LogExpm1((di * di - di) * inv_2s2);
    terms.push_back(term);
    max_term = std::max(max_term, term);
  }
  if (max_term == -kInf) return -kInf;  // every term underflowed: A_alpha - 1 = 0 in double
  double sum = 0;
  for (double t : terms) sum += std::exp(t - max_term);
  return max_term + std::log(sum);
}

double LogAMinus1Quadrature(double q, double sigma, double alpha) {
  const MomentIntegrand f(q, sigma, alpha);
  // The integrand is a continuous mixture of unit-width Gaussians in t centred in
  // [0, alpha / sigma] (exactly so for integer alpha: the binomial terms); 40 widths past either
  // end leaves out a fraction below exp(-800). Its log has curvature >= -1, so no feature is
  // narrower than a standard normal and a 0.5 grid finds where the mass is.
  const double a = -40;
  const double b = std::max(alpha, 0.5) / sigma + 40;
  const double step = 0.5;
  if (!(QuadratureGridPoints(sigma, alpha) <= static_cast<double>(kMaxQuadraturePoints))) {
    return std::nan("");
  }
  const auto n = static_cast<int64_t>(std::ceil((b - a) / step)) + 1;
  std::vector<double> grid(static_cast<size_t>(n));
  double shift = -kInf;
  for (int64_t i = 0; i < n; ++i) {
    grid[static_cast<size_t>(i)] = f.LogValue(a + step * static_cast<double>(i));
    shift = std::max(shift, grid[static_cast<size_t>(i)]);
  }
  if (shift == -kInf) return -kInf;
  int64_t first = 0;
  int64_t last = n - 1;
  while (grid[static_cast<size_t>(first)] < shift - 60) ++first;
  while (grid[static_cast<size_t>(last)] < shift - 60) --last;
  const double lo = std::max(a, a + step * static_cast<double>(first - 2));
  const double hi = std::min(b, a + step * static_cast<double>(last + 2));

  // Adaptive GK21 from pieces no wider than 2 (the Gaussian width scale): bisect the piece with
  // the largest error estimate until the total estimate is below 1e-14 of the integral (or every
  // piece is down to rounding noise).
  const int pieces = std::max(1, static_cast<int>(std::ceil((hi - lo) / 2)));
  std::vector<Piece> work;
  for (int i = 0; i < pieces; ++i) {
    work.push_back(Kronrod21(f, shift, lo + (hi - lo) * i / pieces,
                             i + 1 == pieces ? hi : lo + (hi - lo) * (i + 1) / pieces));
  }
  for (int iter = 0; iter < 2000; ++iter) {
    double total = 0;
    double error = 0;
    size_t worst = 0;
    for (size_t i = 0; i < work.size(); ++i) {
      total += work[i].value;
      error += work[i].error;
      if (work[i].error > work[worst].error) worst = i;
    }
    if (error <= 1e-14 * total) break;
    const Piece p = work[worst];
    const double mid = 0.5 * (p.lo + p.hi);
    work[worst] = Kronrod21(f, shift, p.lo, mid);
    work.push_back(Kronrod21(f, shift, mid, p.hi));
  }
  double total = 0;
  for (const Piece& p : work) total += p.value;
  return shift + std::log(total);
}

StatusOr<double> DominantTermRdp(double q, double sigma, double alpha) {
  const double log_q = std::log(q);
  const double c = (alpha - 1) * (0.5 / sigma / sigma);
  const double lower = alpha * (0.5 / sigma / sigma) + alpha / (alpha - 1) * log_q;
  if (lower == kInf) return kInf;
  const double u = std::exp(std::log1p(-q) - log_q - c);
  const double upper = lower + alpha / (alpha - 1) * std::log1p(u);
  if (upper > 0 && upper - lower <= 1e-15 * upper) return upper;
  return absl::ResourceExhaustedError(fmt::format(
      "the RDP at order {} with noise multiplier {} and sampling rate {} is beyond the "
      "accountant's work limits (a binomial sum of at most {} terms, a quadrature grid of at most "
      "{} points: order / noise multiplier <= ~{}): use a smaller order or a larger noise "
      "multiplier",
      alpha, sigma, q, kMaxBinomialOrder, kMaxQuadraturePoints, kMaxQuadraturePoints / 2 - 80));
}

}  // namespace internal

const std::vector<double>& DefaultRdpOrders() {
  static const std::vector<double>* const kOrders = [] {
    auto* orders = new std::vector<double>;
    for (int k = 11; k <= 109; ++k) orders->push_back(k / 10.0);  // k / 10: no accumulated drift
    for (int a = 11; a <= 63; ++a) orders->push_back(a);
    for (int a : {128, 256, 512, 1024}) orders->push_back(a);
    return orders;
  }();
  return *kOrders;
}

StatusOr<double> SubsampledGaussianRdp(double q, double z, double alpha) {
  if (!(q >= 0 && q <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("sampling rate must be in [0, 1], got ", q));
  }
  if (!(z >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("noise multiplier must be >= 0, got ", z));
  }
  if (!(alpha > 1) || (alpha > kMaxRdpOrder && !std::isinf(alpha))) {
    return absl::InvalidArgumentError(
        absl::StrCat("Renyi order must be in (1, ", kMaxRdpOrder, "] or +inf, got ", alpha));
  }
  if (q == 0 || std::isinf(z)) return 0.0;
  if (z == 0 || std::isinf(alpha)) return internal::kInf;
  if (q == 1) return alpha / (2 * z * z);
  // The exact methods where their work is bounded and their exponents finite; else the
  // dominant term, which is exact there (or an error naming the limits).
  const bool binomial =
      alpha == std::floor(alpha) && alpha <= static_cast<double>(internal::kMaxBinomialOrder);
  double log_a_minus_1;
  if (binomial && std::isfinite((alpha * alpha - alpha) * (0.5 / (z * z)))) {
    log_a_minus_1 = internal::LogAMinus1Integer(q, z, static_cast<int64_t>(alpha));
  } else if (!binomial && internal::QuadratureGridPoints(z, alpha) <=
                              static_cast<double>(internal::kMaxQuadraturePoints)) {
    log_a_minus_1 = internal::LogAMinus1Quadrature(q, z, alpha);
  } else {
    return internal::DominantTermRdp(q, z, alpha);
  }
  return internal::Log1pExp(log_a_minus_1) / (alpha - 1);
}

StatusOr<RdpEpsilon> RdpToEpsilon(std::span<const double> orders, std::span<const double> rdp,
                                  double delta) {
  if (orders.empty() || orders.size() != rdp.size()) {
    return absl::InvalidArgumentError("orders and rdp must be non-empty and of equal length");
  }
  if (!(delta > 0 && delta < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("delta must be in (0, 1), got ", delta));
  }
  RdpEpsilon best{internal::kInf, orders[0]};
  for (size_t i = 0; i < orders.size(); ++i) {
    const double a = orders[i];
    const double r = rdp[i];
    if (!(a >= 1) || std::isinf(a)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Renyi orders must be finite and >= 1, got ", a));
    }
    if (!(r >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat("Renyi divergences must be >= 0, got ", r));
    }
    double eps;
    if (delta * delta + std::expm1(-r) > 0) {
      eps = 0;  // delta <= sqrt(1 - exp(-KL)) and KL <= rdp: (0, delta)-DP already
    } else if (a > 1.01) {
      eps = r + std::log1p(-1 / a) - std::log(delta * a) / (a - 1);
    } else {
      eps = internal::kInf;  // the conversion is unstable as alpha -> 1 (as in dp_accounting)
    }
    if (eps < best.epsilon) best = {eps, a};  // strict: the first minimiser, like np.argmin
  }
  best.epsilon = std::max(0.0, best.epsilon);
  return best;
}

}  // namespace huddle::privacy
