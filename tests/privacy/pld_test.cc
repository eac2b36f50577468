// Internals of the PLD accountant: FFT, composition, the connect-the-dots discretization and
// the epsilon/delta conversions (the end-to-end numbers are in accountant_test.cc).
#include "privacy/internal/pld.h"

#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <random>
#include <vector>

namespace huddle::privacy::internal {
namespace {

std::vector<double> DirectConvolution(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out(a.size() + b.size() - 1, 0.0);
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < b.size(); ++j) out[i + j] += a[i] * b[j];
  }
  return out;
}

TEST(PldFft, MatchesNaiveDftAndRoundTrips) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1, 1);
  const size_t n = 64;
  std::vector<std::complex<double>> x(n);
  for (auto& c : x) c = {u(rng), u(rng)};
  std::vector<std::complex<double>> y = x;
  Fft(y, false);
  for (size_t k = 0; k < n; ++k) {
    std::complex<double> sum = 0;
    for (size_t j = 0; j < n; ++j) sum += x[j] * std::polar(1.0, -2 * M_PI * double(j * k % n) / n);
    EXPECT_LT(std::abs(sum - y[k]), 1e-13);  // absolute, on values of size ~8
  }
  Fft(y, true);
  for (size_t j = 0; j < n; ++j) EXPECT_LT(std::abs(y[j] - x[j]), 1e-15);
}

TEST(PldCompose, MatchesDirectConvolution) {
  PldPmf a{1e-3, -5, {0.1, 0.2, 0.3, 0.25, 0.15}, 0.0};
  PldPmf b;
  b.discretization = 1e-3;
  b.lower_loss = 3;
  b.probs.assign(100, 0.0);
  for (size_t i = 0; i < 100; ++i) b.probs[i] = std::exp(-0.05 * double(i));
  double total = 0;
  for (double p : b.probs) total += p;
  for (double& p : b.probs) p *= 0.99 / total;
  b.infinity_mass = 0.01;
  auto c = Compose(a, b, 0.0);
  ASSERT_TRUE(c.ok());
  const std::vector<double> expected = DirectConvolution(a.probs, b.probs);
  ASSERT_EQ(c->probs.size(), expected.size());
  EXPECT_EQ(c->lower_loss, -2);
  EXPECT_DOUBLE_EQ(c->infinity_mass, 0.01);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(c->probs[i], expected[i], 1e-16);
  // Self-composition (FFT power) against repeated direct convolution, without truncation.
  auto s = SelfCompose(a, 6, 0.0);
  ASSERT_TRUE(s.ok());
  std::vector<double> direct = a.probs;
  for (int i = 1; i < 6; ++i) direct = DirectConvolution(direct, a.probs);
  ASSERT_EQ(s->probs.size(), direct.size());
  EXPECT_EQ(s->lower_loss, -30);
  for (size_t i = 0; i < direct.size(); ++i) EXPECT_NEAR(s->probs[i], direct[i], 1e-16);
}

TEST(PldCompose, TruncationIsPessimistic) {
  // The truncated self-composition has at most 1e-15 more mass at +infinity and a window no
  // larger than the full one; delta never decreases by more than rounding.
  auto pld = SubsampledGaussianPld(0.05, 1.0, 1e-3);
  ASSERT_TRUE(pld.ok());
  auto full = SelfCompose(pld->remove, 20, 0.0);
  auto cut = SelfCompose(pld->remove, 20);
  ASSERT_TRUE(full.ok() && cut.ok());
  EXPECT_LT(cut->probs.size(), full->probs.size());
  EXPECT_NEAR(cut->infinity_mass - full->infinity_mass, 1e-15, 1e-17);
  for (double eps : {0.0, 0.5, 1.0, 2.0}) {
    EXPECT_GE(DeltaForEpsilon(*cut, eps), DeltaForEpsilon(*full, eps) - 1e-14) << eps;
  }
}

TEST(PldDiscretization, ConnectTheDotsIsAnUpperBound) {
  for (double q : {0.01, 0.3, 1.0}) {
    auto pld = SubsampledGaussianPld(q, 0.9, 1e-3);
    ASSERT_TRUE(pld.ok());
    ASSERT_EQ(pld->add.has_value(), q < 1);
    for (bool add : {false, true}) {
      if (add && !pld->add) continue;
      const PldPmf& pmf = add ? *pld->add : pld->remove;
      double mass = pmf.infinity_mass;
      for (double p : pmf.probs) {
        EXPECT_GE(p, 0);
        mass += p;
      }
      EXPECT_NEAR(mass, 1, 1e-9) << q << " " << add;
      // At the grid points the discretized delta(eps) equals the exact one (connect the dots),
      // and between them it lies above (pessimistic); checked to 1e-12 absolute.
      for (double eps : {0.0, 0.1234, 0.5, 1.0, 2.5}) {
        const double exact = SubsampledGaussianHockeyStick(q, 0.9, add, eps);
        EXPECT_GE(DeltaForEpsilon(pmf, eps), exact - 1e-12) << q << " " << add << " " << eps;
        EXPECT_LE(DeltaForEpsilon(pmf, eps), exact + 1e-3) << q << " " << add << " " << eps;
      }
    }
  }
}

TEST(PldConversion, EpsilonAndDeltaAreInverse) {
  auto pld = SubsampledGaussianPld(0.1, 1.2, 1e-4);
  ASSERT_TRUE(pld.ok());
  auto pmf = SelfCompose(pld->remove, 50);
  ASSERT_TRUE(pmf.ok());
  for (double delta : {1e-3, 1e-5, 1e-8}) {
    const double eps = EpsilonForDelta(*pmf, delta);
    EXPECT_NEAR(DeltaForEpsilon(*pmf, eps), delta, 1e-9 * delta) << delta;
    EXPECT_GT(DeltaForEpsilon(*pmf, eps - 1e-6), delta) << delta;
  }
  EXPECT_EQ(EpsilonForDelta(PldPmf{}, 1e-5), 0);  // the identity
  EXPECT_EQ(EpsilonForDelta(PldPmf{1e-4, 0, {0.5}, 0.5}, 0.1),
            std::numeric_limits<double>::infinity());
}

TEST(PldDiscretization, RefusesHugeGrids) {
  auto pld = SubsampledGaussianPld(0.5, 0.05, 1e-5);  // losses up to ~200 nats at 1e-5 apart
  ASSERT_FALSE(pld.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(pld.status())) << pld.status();
}

}  // namespace
}  // namespace huddle::privacy::internal
