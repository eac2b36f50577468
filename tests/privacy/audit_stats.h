// The statistics of Huddle's empirical DP audits (central DP through the coordinator,
// tests/coordinator/privacy_audit_test.cc; local DP through the client agent,
// tests/client/local_dp_audit_test.cc; distributed DP at the mechanism,
// tests/aggregation/distributed_dp_audit_test.cc), written here once, independently of the code
// they audit (no huddle::privacy function is used to judge a release).
//
// An audit sees three kinds of numbers, every one in units of the noise standard deviation that
// the accounting states (the claim under test):
//   - the attack statistic (the released coordinate the canary moves) in the canary's world and
//     in the neighbouring world, which the canary moves the other way or not at all;
//   - noise values: released coordinates minus what they would be without noise, independent and
//     N(0, (actual std / stated std)^2) when the mechanism adds the Gaussian it claims (Huddle's
//     noise is a discrete Gaussian of std >= 2^24 grid steps, or a sum of such: indistinguishable
//     from the continuous one at these sample sizes, its variance within 1e-15 of the parameter;
//     the float rounding of a release adds a relative ~1e-7 of the std).
// and runs three checks on them, each at false-alarm probability kAlpha per bound it computes:
//   (a) AuditThresholdAttack: a nonparametric lower bound on epsilon. Any (epsilon, delta)-DP
//       mechanism forces TPR <= e^epsilon FPR + delta on every test; the threshold is chosen on the
//       first half of the runs and its TPR and FPR bounded (Clopper-Pearson) on the second half,
//       so ln((TPR_lower - delta) / FPR_upper) exceeds the true epsilon with probability
//       <= 2 kAlpha, whatever the noise's shape. Semantic, but weak: with a few thousand runs it
//       can only refute gross errors.
//   (b) TestNoiseScale: the stated std, tested directly. Sum x^2 over k noise values is
//       sigma_ratio^2 chi^2_k; the claim (ratio >= 1) is rejected when the sum falls below the
//       kAlpha quantile of chi^2_k, computed exactly (regularized incomplete gamma). False alarm
//       <= kAlpha; a mechanism with half the std passes with probability
//       P(chi^2_k > 4 c_k) (log_miss_at_half), astronomically small for the k used here.
//   (c) AuditGaussianLoss: the privacy loss of a Gaussian mechanism, bounded from below. The shift
//       of the attack statistic between the worlds is bounded below (normal tail, kAlpha) and the
//       actual std above (chi-square, kAlpha), so mu = shift / std >= mu_lower with probability
//       >= 1 - 2 kAlpha, and the exact epsilon of a Gaussian mechanism of that mu (Balle and Wang
//       2018) is a lower bound on the epsilon of the release, given that its noise is Gaussian and
//       the same on every coordinate (what (b) tests, and what the mechanisms are built to be).
//       It sees what (b) cannot: a sensitivity larger than the accounting's (a clip or an
//       adjacency error) as well as too little noise. Its miss probability at half the std is
//       bounded by GaussianLossMissProbability.
// An audit refutes the claim if any check does: false alarm <= 5 kAlpha = 5e-7 per audit.
//
// Numerics: the binomial, normal and chi-square tails are evaluated in log space (lgamma, erfc,
// series and continued fractions to double precision); quantiles by bisection.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <ostream>
#include <span>
#include <vector>

namespace huddle::testing::audit {

// The failure probability of every confidence bound an audit computes.
inline constexpr double kAlpha = 1e-7;
// At most 5 bounds fail on a mechanism that keeps its claim: 2 (a) + 1 (b) + 2 (c).
inline constexpr double kFalseAlarm = 5 * kAlpha;

// ---- The normal distribution and the Gaussian mechanism -----------------------------------------

// P(Z > x), Z ~ N(0, 1).
inline double NormalTail(double x) { return 0.5 * std::erfc(x / std::sqrt(2.0)); }

// The x with NormalTail(x) = p, p in (0, 1).
inline double NormalTailQuantile(double p) {
  double lo = -40, hi = 40;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (NormalTail(mid) > p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

// The exact delta(epsilon) of a Gaussian mechanism whose output moves by mu standard deviations
// between neighbours (Balle and Wang 2018, Thm. 8).
inline double GaussianDelta(double mu, double epsilon) {
  return NormalTail(epsilon / mu - mu / 2) - std::exp(epsilon) * NormalTail(epsilon / mu + mu / 2);
}

// The smallest epsilon >= 0 with GaussianDelta(mu, epsilon) <= delta (0 for mu <= 0).
inline double GaussianEpsilon(double mu, double delta) {
  if (!(mu > 0) || GaussianDelta(mu, 0) <= delta) return 0;
  double lo = 0, hi = 1;
  for (int i = 0; i < 64 && GaussianDelta(mu, hi) > delta; ++i) hi *= 2;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (GaussianDelta(mu, mid) > delta ? lo : hi) = mid;
  }
  return hi;
}

// The mu of the Gaussian mechanism whose epsilon at delta is `epsilon`.
inline double GaussianMu(double epsilon, double delta) {
  double lo = 0, hi = 1000;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (GaussianEpsilon(mid, delta) < epsilon ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

// ---- Binomial tails and Clopper-Pearson bounds -------------------------------------------------

// ln P(X = k), X ~ Bin(n, p), 0 < p < 1.
inline double LogBinomial(int64_t n, int64_t k, double p) {
  const auto nn = static_cast<double>(n), kk = static_cast<double>(k);
  return std::lgamma(nn + 1) - std::lgamma(kk + 1) - std::lgamma(nn - kk + 1) + kk * std::log(p) +
         (nn - kk) * std::log1p(-p);
}
// P(X <= k) and P(X >= k).
inline double BinomialAtMost(int64_t n, int64_t k, double p) {
  double s = 0;
  for (int64_t i = 0; i <= k; ++i) s += std::exp(LogBinomial(n, i, p));
  return std::min(1.0, s);
}
inline double BinomialAtLeast(int64_t n, int64_t k, double p) {
  double s = 0;
  for (int64_t i = k; i <= n; ++i) s += std::exp(LogBinomial(n, i, p));
  return std::min(1.0, s);
}
// One-sided Clopper-Pearson bounds on p from k successes in n, each wrong with probability
// <= alpha.
inline double ClopperPearsonUpper(int64_t n, int64_t k, double alpha) {
  if (k >= n) return 1;
  double lo = static_cast<double>(k) / static_cast<double>(n), hi = 1;
  for (int i = 0; i < 100; ++i) {
    const double mid = (lo + hi) / 2;
    (BinomialAtMost(n, k, mid) > alpha ? lo : hi) = mid;
  }
  return hi;
}
inline double ClopperPearsonLower(int64_t n, int64_t k, double alpha) {
  if (k <= 0) return 0;
  double lo = 0, hi = static_cast<double>(k) / static_cast<double>(n);
  for (int i = 0; i < 100; ++i) {
    const double mid = (lo + hi) / 2;
    (BinomialAtLeast(n, k, mid) > alpha ? hi : lo) = mid;
  }
  return lo;
}

// ---- The chi-square distribution ---------------------------------------------------------------

namespace internal {
// ln P(a, x), the regularized lower incomplete gamma function, by its power series (x < a + 1).
inline double LogGammaSeries(double a, double x) {
  double term = 1 / a, sum = term;
  for (int n = 1; n < 10'000'000; ++n) {
    term *= x / (a + n);
    sum += term;
    if (term < sum * 1e-17) break;
  }
  return std::log(sum) - x + a * std::log(x) - std::lgamma(a);
}
// ln Q(a, x) = ln(1 - P(a, x)) by its continued fraction (x >= a + 1; modified Lentz).
inline double LogGammaContinuedFraction(double a, double x) {
  constexpr double kTiny = 1e-300;
  double b = x + 1 - a, c = 1 / kTiny, d = 1 / b, h = d;
  for (int i = 1; i < 10'000'000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = b + an / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    const double step = d * c;
    h *= step;
    if (std::fabs(step - 1) < 1e-16) break;
  }
  return std::log(h) - x + a * std::log(x) - std::lgamma(a);
}
}  // namespace internal

// ln P(chi^2_k <= x) and ln P(chi^2_k > x), for k > 0 degrees of freedom, exact to double precision
// (-inf where the probability is 0).
inline double LogChiSquareCdf(double x, double k) {
  if (!(x > 0)) return -std::numeric_limits<double>::infinity();
  const double a = k / 2, y = x / 2;
  if (y < a + 1) return internal::LogGammaSeries(a, y);
  return std::log1p(-std::exp(internal::LogGammaContinuedFraction(a, y)));
}
inline double LogChiSquareSurvival(double x, double k) {
  if (!(x > 0)) return 0;
  const double a = k / 2, y = x / 2;
  if (y >= a + 1) return internal::LogGammaContinuedFraction(a, y);
  return std::log1p(-std::exp(internal::LogGammaSeries(a, y)));
}
// The c with P(chi^2_k <= c) = p (p in (0, 1/2]), and the c with P(chi^2_k > c) = p.
inline double ChiSquareLowerQuantile(double p, double k) {
  double lo = 0, hi = k + 2;  // the median is below k
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (LogChiSquareCdf(mid, k) < std::log(p) ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}
inline double ChiSquareUpperQuantile(double p, double k) {
  double lo = 0, hi = k + 2;
  for (int i = 0; i < 200 && LogChiSquareSurvival(hi, k) > std::log(p); ++i) hi *= 2;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (LogChiSquareSurvival(mid, k) > std::log(p) ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}
// The Wilson-Hilferty approximation of P(chi^2_k <= x), for cross-checks.
inline double WilsonHilfertyCdf(double x, double k) {
  const double v = 2 / (9 * k);
  return NormalTail(-(std::cbrt(x / k) - (1 - v)) / std::sqrt(v));
}

// ---- The checks --------------------------------------------------------------------------------

// What one audit measured: see the header comment.
struct Samples {
  std::vector<double> canary;     // the attack statistic in the canary's world
  std::vector<double> neighbour;  // and in the neighbouring world (a smaller mean)
  std::vector<double> noise;      // noise values, in stated-std units
};

// (a) The threshold attack "statistic > t".
struct ThresholdAttack {
  double threshold = 0;
  int64_t trials_canary = 0;  // runs of each world in the evaluation half
  int64_t trials_neighbour = 0;
  int64_t true_positives = 0;
  int64_t false_positives = 0;
  double tpr_lower = 0;
  double fpr_upper = 1;
  double epsilon_lower_bound = 0;  // wrong (above the true epsilon) w.p. <= 2 alpha
};

namespace internal {
inline ThresholdAttack Evaluate(double t, std::span<const double> canary,
                                std::span<const double> neighbour, double delta, double alpha) {
  ThresholdAttack a;
  a.threshold = t;
  a.trials_canary = static_cast<int64_t>(canary.size());
  a.trials_neighbour = static_cast<int64_t>(neighbour.size());
  a.true_positives = std::count_if(canary.begin(), canary.end(), [&](double s) { return s > t; });
  a.false_positives =
      std::count_if(neighbour.begin(), neighbour.end(), [&](double s) { return s > t; });
  a.tpr_lower = ClopperPearsonLower(a.trials_canary, a.true_positives, alpha);
  a.fpr_upper = ClopperPearsonUpper(a.trials_neighbour, a.false_positives, alpha);
  a.epsilon_lower_bound =
      a.tpr_lower > delta ? std::max(0.0, std::log((a.tpr_lower - delta) / a.fpr_upper)) : 0;
  return a;
}
}  // namespace internal

// The threshold is the best of a few (the neighbour's top 1, 2, 4, ... values) on the first half
// of each world's runs, by their lower bound at a looser confidence (kSelectAlpha: it only
// chooses); the bound is computed on the second half alone, at `alpha`.
inline ThresholdAttack AuditThresholdAttack(std::span<const double> canary,
                                            std::span<const double> neighbour, double delta,
                                            double alpha = kAlpha) {
  constexpr double kSelectAlpha = 1e-3;
  const size_t hc = canary.size() / 2, hn = neighbour.size() / 2;
  std::vector<double> chooser(neighbour.begin(), neighbour.begin() + hn);
  std::sort(chooser.begin(), chooser.end(), std::greater<>());
  ThresholdAttack best;
  bool any = false;
  for (size_t k = 0; k < chooser.size(); k = k == 0 ? 1 : 2 * k) {
    const ThresholdAttack a =
        internal::Evaluate(chooser[k], canary.first(hc), neighbour.first(hn), delta, kSelectAlpha);
    if (!any || a.epsilon_lower_bound > best.epsilon_lower_bound) best = a;
    any = true;
  }
  return internal::Evaluate(best.threshold, canary.subspan(hc), neighbour.subspan(hn), delta,
                            alpha);
}

// (b) The noise scale against the stated std.
struct NoiseScale {
  int64_t dof = 0;              // k: noise values
  double variance_ratio = 0;    // sum x^2 / k: (actual std / stated std)^2, estimated
  double critical_ratio = 0;    // too little noise below this: P(chi^2_k < k * it) = alpha
  double log_p_value = 0;       // ln P(chi^2_k <= sum x^2): so little variance at the stated std
  double log_miss_at_half = 0;  // ln P(chi^2_k / 4 >= k * critical_ratio): half the std passes
  bool too_little_noise = false;
};

inline NoiseScale TestNoiseScale(std::span<const double> noise, double alpha = kAlpha) {
  NoiseScale r;
  r.dof = static_cast<int64_t>(noise.size());
  const auto k = static_cast<double>(r.dof);
  double sum = 0;
  for (double x : noise) sum += x * x;
  r.variance_ratio = sum / k;
  const double critical = ChiSquareLowerQuantile(alpha, k);
  r.critical_ratio = critical / k;
  r.log_p_value = LogChiSquareCdf(sum, k);
  r.log_miss_at_half = LogChiSquareSurvival(4 * critical, k);
  r.too_little_noise = sum < critical;
  return r;
}

// (c) The Gaussian privacy loss.
struct GaussianLoss {
  double shift = 0;                // mean(canary) - mean(neighbour), stated-std units
  double sigma_upper = 0;          // the actual std is at most this (stated-std units)
  double mu_lower = 0;             // the shift in actual stds is at least this
  double epsilon_lower_bound = 0;  // the exact epsilon of a Gaussian mechanism of mu_lower
};

inline GaussianLoss AuditGaussianLoss(std::span<const double> canary,
                                      std::span<const double> neighbour, const NoiseScale& noise,
                                      double delta, double alpha = kAlpha) {
  auto mean = [](std::span<const double> v) {
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  };
  GaussianLoss g;
  g.shift = mean(canary) - mean(neighbour);
  const auto k = static_cast<double>(noise.dof);
  g.sigma_upper = std::sqrt(noise.variance_ratio * k / ChiSquareLowerQuantile(alpha, k));
  const double spread = std::sqrt(1.0 / static_cast<double>(canary.size()) +
                                  1.0 / static_cast<double>(neighbour.size()));
  g.mu_lower = std::max(0.0, g.shift / g.sigma_upper - NormalTailQuantile(alpha) * spread);
  g.epsilon_lower_bound = GaussianEpsilon(g.mu_lower, delta);
  return g;
}

// An upper bound on the probability that (c) does NOT refute `stated_epsilon` when the release is
// a Gaussian mechanism of mu = mu_actual (in its own std), measured with these sample sizes:
// P(sigma_upper > r sigma) + P(mean difference < r (mu* + z_alpha s) sigma), r^2 the ratio of the
// (1 - 1e-12) and alpha chi-square quantiles, mu* = GaussianMu(stated_epsilon).
inline double GaussianLossMissProbability(int64_t n_canary, int64_t n_neighbour, int64_t dof,
                                          double mu_actual, double stated_epsilon, double delta,
                                          double alpha = kAlpha) {
  constexpr double kSlack = 1e-12;
  const auto k = static_cast<double>(dof);
  const double r = std::sqrt(ChiSquareUpperQuantile(kSlack, k) / ChiSquareLowerQuantile(alpha, k));
  const double spread =
      std::sqrt(1.0 / static_cast<double>(n_canary) + 1.0 / static_cast<double>(n_neighbour));
  const double needed =
      r * (GaussianMu(stated_epsilon, delta) + NormalTailQuantile(alpha) * spread);
  return kSlack + NormalTail((mu_actual - needed) / spread);
}

// All three.
struct Audit {
  ThresholdAttack attack;
  NoiseScale scale;
  GaussianLoss gaussian;
  // The release contradicts the claim (stated_epsilon at delta, the stated std).
  bool Refutes(double stated_epsilon) const {
    return attack.epsilon_lower_bound > stated_epsilon || scale.too_little_noise ||
           gaussian.epsilon_lower_bound > stated_epsilon;
  }
};

inline Audit RunAudit(const Samples& s, double delta) {
  Audit a;
  a.attack = AuditThresholdAttack(s.canary, s.neighbour, delta);
  a.scale = TestNoiseScale(s.noise);
  a.gaussian = AuditGaussianLoss(s.canary, s.neighbour, a.scale, delta);
  return a;
}

// The figures, one line each, for the test's output.
inline void Print(std::ostream& out, const char* what, const Audit& a, double stated_epsilon) {
  out << what << " (stated epsilon " << stated_epsilon << "):\n"
      << "  (a) threshold attack: epsilon >= " << a.attack.epsilon_lower_bound << " (threshold "
      << a.attack.threshold << ", TP " << a.attack.true_positives << "/" << a.attack.trials_canary
      << ", FP " << a.attack.false_positives << "/" << a.attack.trials_neighbour
      << ", TPR >= " << a.attack.tpr_lower << ", FPR <= " << a.attack.fpr_upper << ")\n"
      << "  (b) noise scale: variance ratio " << a.scale.variance_ratio << " over " << a.scale.dof
      << " values (too little noise below " << a.scale.critical_ratio << "), p-value 10^"
      << a.scale.log_p_value / std::log(10.0)
      << (a.scale.too_little_noise ? ": REJECTED" : ": consistent") << "\n"
      << "  (c) Gaussian loss: shift " << a.gaussian.shift << ", std <= " << a.gaussian.sigma_upper
      << ", mu >= " << a.gaussian.mu_lower << ", epsilon >= " << a.gaussian.epsilon_lower_bound
      << "\n"
      << "  verdict: " << (a.Refutes(stated_epsilon) ? "REFUTES the claim" : "consistent") << "\n";
}

}  // namespace huddle::testing::audit
