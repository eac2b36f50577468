// The audit statistics (tests/privacy/audit_stats.h) against closed forms, the accountant's own
// analytic Gaussian, and their stated error rates on simulated data.
#include "tests/privacy/audit_stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <random>
#include <vector>

#include "privacy/accountant.h"

namespace huddle::testing::audit {
namespace {

TEST(AuditStatsTest, ChiSquareTailsMatchTheClosedFormsFarIntoTheTails) {
  for (double x : {1e-6, 0.01, 0.5, 1.0, 2.0, 5.0, 20.0, 100.0, 2000.0}) {
    // k = 2: P(chi^2 > x) = exp(-x / 2); k = 4: exp(-x / 2) (1 + x / 2); k = 1: erfc(sqrt(x / 2)).
    EXPECT_NEAR(LogChiSquareSurvival(x, 2), -x / 2, 1e-9 * (1 + x)) << x;
    EXPECT_NEAR(LogChiSquareSurvival(x, 4), -x / 2 + std::log1p(x / 2), 1e-9 * (1 + x)) << x;
    EXPECT_NEAR(LogChiSquareCdf(x, 2), std::log(-std::expm1(-x / 2)), 1e-9) << x;
    if (x < 500) {
      EXPECT_NEAR(LogChiSquareCdf(x, 1), std::log(std::erf(std::sqrt(x / 2))), 1e-9) << x;
      EXPECT_NEAR(LogChiSquareSurvival(x, 1), std::log(std::erfc(std::sqrt(x / 2))), 1e-9) << x;
    }
  }
  // Quantiles invert the tails; for many degrees of freedom Wilson-Hilferty agrees.
  for (double k : {10.0, 1000.0, 100000.0}) {
    const double lower = ChiSquareLowerQuantile(1e-7, k);
    EXPECT_NEAR(LogChiSquareCdf(lower, k), std::log(1e-7), 1e-9) << k;
    const double upper = ChiSquareUpperQuantile(1e-12, k);
    EXPECT_NEAR(LogChiSquareSurvival(upper, k), std::log(1e-12), 1e-9) << k;
    if (k >= 1000) {
      EXPECT_NEAR(std::log(WilsonHilfertyCdf(lower, k)), std::log(1e-7), 0.05) << k;
    }
  }
}

TEST(AuditStatsTest, TheGaussianEpsilonIsTheAccountantsAnalyticOne) {
  EXPECT_NEAR(NormalTailQuantile(1e-7), 5.199337582, 1e-8);
  for (double z : {0.5, 1.0, 2.0, 4.0, 10.0}) {
    auto want = privacy::AnalyticGaussianEpsilon(z, 1e-5);
    ASSERT_TRUE(want.ok());
    EXPECT_NEAR(GaussianEpsilon(1 / z, 1e-5), *want, 1e-9 * (1 + *want)) << z;
    EXPECT_NEAR(GaussianMu(*want, 1e-5), 1 / z, 1e-9) << z;
  }
}

TEST(AuditStatsTest, ClopperPearsonBoundsAreExactAtTheEdges) {
  // 0 of n: P(X = 0) = (1 - p)^n = alpha at the upper bound; n of n: p^n = alpha at the lower.
  EXPECT_NEAR(ClopperPearsonUpper(500, 0, 1e-7), 1 - std::pow(1e-7, 1.0 / 500), 1e-12);
  EXPECT_NEAR(ClopperPearsonLower(500, 500, 1e-7), std::pow(1e-7, 1.0 / 500), 1e-12);
}

// The checks' error rates at a loose alpha, where a simulation can see them: the noise-scale test
// rejects N(0, 1) noise at rate alpha and half-std noise always; the Gaussian bound on mu holds.
TEST(AuditStatsTest, TheChecksKeepTheirErrorRatesOnSimulatedGaussians) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal;
  constexpr double kLoose = 0.05;
  constexpr int kTrials = 4000;
  int rejected = 0, rejected_half = 0, mu_too_high = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    std::vector<double> noise(20), half(20), canary(20), neighbour(20);
    for (double& x : noise) x = normal(rng);
    for (double& x : half) x = normal(rng) / 2;
    for (double& x : canary) x = 0.5 + normal(rng);
    for (double& x : neighbour) x = normal(rng);
    const NoiseScale scale = TestNoiseScale(noise, kLoose);
    rejected += scale.too_little_noise;
    rejected_half += TestNoiseScale(half, kLoose).too_little_noise;
    // Failure of either bound, each at kLoose / 2: at most kLoose together.
    mu_too_high += AuditGaussianLoss(canary, neighbour, scale, 1e-5, kLoose / 2).mu_lower > 0.5;
  }
  std::cout << "at alpha " << kLoose << " over " << kTrials << " trials: N(0, 1) rejected "
            << rejected << " times, half the std " << rejected_half << ", mu bound wrong "
            << mu_too_high << "\n";
  EXPECT_NEAR(rejected, kLoose * kTrials, 4 * std::sqrt(kLoose * kTrials));
  EXPECT_GT(rejected_half, 0.99 * kTrials);
  EXPECT_LT(mu_too_high, kLoose * kTrials);
}

}  // namespace
}  // namespace huddle::testing::audit
