#include "privacy/noise.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace huddle::privacy {
namespace {

using u128 = unsigned __int128;

// One million draws per distribution check: about 0.2 s each (under a second with ASan).
constexpr int kDraws = 1'000'000;

// Kolmogorov-Smirnov critical value at significance 0.001: 1.949 / sqrt(n) (asymptotic; for a
// discrete distribution the test is conservative).
double KsCritical(int n) { return 1.949 / std::sqrt(static_cast<double>(n)); }

// Upper 0.001 quantile of chi-square with `df` degrees of freedom (Wilson-Hilferty; slightly
// above the exact value for small df, i.e. conservative: 14.1 vs 13.8 for df = 2).
double ChiSquareCritical(int df) {
  const double k = df;
  const double a = 2.0 / (9.0 * k);
  return k * std::pow(1 - a + 3.0902 * std::sqrt(a), 3);
}

std::vector<int64_t> Draw(uint64_t variance, int n, uint64_t seed) {
  auto gaussian = DiscreteGaussian::Create(variance);
  EXPECT_TRUE(gaussian.ok()) << gaussian.status();
  NoiseSource source = NoiseSource::SeededForTesting(seed);
  std::vector<int64_t> out(n);
  for (int64_t& k : out) k = gaussian->Sample(source);
  return out;
}

// The exact pmf of N_Z(0, s) on [-K, K] (K large enough that the rest is below 1e-300), index
// k + K.
struct Pmf {
  int64_t K;
  std::vector<double> p;
  double Cdf(int64_t k) const {  // P(X <= k)
    double sum = 0;
    for (int64_t j = -K; j <= std::min(k, K); ++j) sum += p[j + K];
    return sum;
  }
};
Pmf DiscreteGaussianPmf(double s) {
  Pmf pmf;
  pmf.K = static_cast<int64_t>(std::ceil(40 * std::sqrt(s))) + 40;
  pmf.p.resize(2 * pmf.K + 1);
  double z = 0;
  for (int64_t k = -pmf.K; k <= pmf.K; ++k) {
    pmf.p[k + pmf.K] = std::exp(-static_cast<double>(k * k) / (2 * s));
    z += pmf.p[k + pmf.K];
  }
  for (double& p : pmf.p) p /= z;
  return pmf;
}

struct Moments {
  double mean = 0;
  double variance = 0;
};
Moments SampleMoments(const std::vector<int64_t>& xs) {
  long double sum = 0;
  for (int64_t x : xs) sum += x;
  const long double mean = sum / xs.size();
  long double ss = 0;
  for (int64_t x : xs) ss += (x - mean) * (x - mean);
  return {static_cast<double>(mean), static_cast<double>(ss / (xs.size() - 1))};
}

// sup over the integers of |F_n(k) - F(k)| for the empirical CDF F_n of `xs` and an integer CDF
// `cdf`: between consecutive distinct sample values F_n is flat, so the sup is attained at a
// sample value x (F_n(x) vs F(x)) or just below one (F_n(x - 1) vs F(x - 1)).
template <typename Cdf>
double KsStatistic(std::vector<int64_t> xs, const Cdf& cdf) {
  std::sort(xs.begin(), xs.end());
  const double n = static_cast<double>(xs.size());
  double d = 0;
  for (size_t i = 0; i < xs.size();) {
    size_t j = i;
    while (j < xs.size() && xs[j] == xs[i]) ++j;
    d = std::max(d, std::fabs(static_cast<double>(j) / n - cdf(xs[i])));
    d = std::max(d, std::fabs(static_cast<double>(i) / n - cdf(xs[i] - 1)));
    i = j;
  }
  return d;
}

double NormalCdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// ---- NoiseSource
// ---------------------------------------------------------------------------------

std::vector<uint64_t> Words(NoiseSource& source, int n) {
  std::vector<uint64_t> out(n);
  for (uint64_t& w : out) w = source.NextU64();
  return out;
}

TEST(NoiseSourceTest, SeededIsReproducibleAcrossRefills) {
  NoiseSource a = NoiseSource::SeededForTesting(42);
  NoiseSource b = NoiseSource::SeededForTesting(42);
  EXPECT_EQ(Words(a, 20'000), Words(b, 20'000));  // 39 refills of 4 KiB
}

TEST(NoiseSourceTest, DifferentSeedsDiffer) {
  NoiseSource a = NoiseSource::SeededForTesting(42);
  NoiseSource b = NoiseSource::SeededForTesting(43);
  NoiseSource c = NoiseSource::SeededForTesting(0);
  const auto wa = Words(a, 64), wb = Words(b, 64), wc = Words(c, 64);
  EXPECT_NE(wa, wb);
  EXPECT_NE(wa, wc);
  EXPECT_NE(wb, wc);
}

TEST(NoiseSourceTest, SecureInstancesDiffer) {
  NoiseSource a = NoiseSource::Secure();
  NoiseSource b = NoiseSource::Secure();
  EXPECT_NE(Words(a, 4), Words(b, 4));
}

TEST(NoiseSourceTest, DescribesItself) {
  NoiseSource secure = NoiseSource::Secure();
  NoiseSource seeded = NoiseSource::SeededForTesting(1);
  EXPECT_TRUE(secure.is_private());
  EXPECT_EQ(secure.Describe(), "os-csprng");
  EXPECT_FALSE(seeded.is_private());
  EXPECT_EQ(seeded.Describe(), "seeded (NOT PRIVATE)");
}

TEST(NoiseSourceTest, MoveContinuesTheStream) {
  NoiseSource reference = NoiseSource::SeededForTesting(5);
  const auto expected = Words(reference, 1000);
  NoiseSource a = NoiseSource::SeededForTesting(5);
  const auto head = Words(a, 300);
  NoiseSource b = std::move(a);
  const auto middle = Words(b, 300);
  NoiseSource c = NoiseSource::SeededForTesting(99);
  c = std::move(b);
  EXPECT_FALSE(c.is_private());
  const auto tail = Words(c, 400);
  std::vector<uint64_t> all = head;
  all.insert(all.end(), middle.begin(), middle.end());
  all.insert(all.end(), tail.begin(), tail.end());
  EXPECT_EQ(all, expected);
}

TEST(NoiseSourceTest, MovedFromSourceIsNotPrivate) {
  NoiseSource a = NoiseSource::Secure();
  NoiseSource b = std::move(a);
  EXPECT_TRUE(b.is_private());
  EXPECT_FALSE(a.is_private());  // NOLINT(bugprone-use-after-move): its key is wiped
}

TEST(NoiseSourceTest, RefillsUseFreshNonces) {
  NoiseSource source = NoiseSource::SeededForTesting(3);
  const auto first = Words(source, 512);  // exactly one 4 KiB buffer
  const auto second = Words(source, 512);
  EXPECT_NE(first, second);
  // And no word repeats across the two buffers (a repeat has probability ~2^-44).
  std::vector<uint64_t> all = first;
  all.insert(all.end(), second.begin(), second.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end());
}

TEST(NoiseSourceTest, BitsAreBalanced) {
  NoiseSource source = NoiseSource::SeededForTesting(11);
  constexpr int n = 100'000;
  int ones[64] = {};
  for (int i = 0; i < n; ++i) {
    const uint64_t w = source.NextU64();
    for (int b = 0; b < 64; ++b) ones[b] += (w >> b) & 1;
  }
  // 5 standard errors of a Binomial(n, 1/2): 5 * sqrt(n) / 2.
  for (int b = 0; b < 64; ++b) EXPECT_NEAR(ones[b], n / 2, 5 * std::sqrt(n) / 2) << "bit " << b;
}

TEST(NoiseSourceTest, UniformBelowEdgeCases) {
  NoiseSource source = NoiseSource::SeededForTesting(8);
  EXPECT_EQ(source.UniformBelow(0), 0u);
  EXPECT_EQ(source.UniformBelow(1), 0u);
  EXPECT_EQ(source.UniformBelow128(0), 0u);
  EXPECT_EQ(source.UniformBelow128(1), 0u);
  const u128 two64 = static_cast<u128>(1) << 64;
  for (int i = 0; i < 1000; ++i) {
    EXPECT_LT(source.UniformBelow(~uint64_t{0}), ~uint64_t{0});
    EXPECT_LT(source.UniformBelow128(two64), two64);
    EXPECT_LT(source.UniformBelow128(two64 + 1), two64 + 1);
    const u128 big = ~static_cast<u128>(0) - 5;
    EXPECT_LT(source.UniformBelow128(big), big);
  }
}

// Chi-square of `counts` against the uniform distribution, at significance 0.001.
void ExpectUniform(const std::vector<int64_t>& counts, int64_t n, const std::string& what) {
  const double expected = static_cast<double>(n) / counts.size();
  double chi2 = 0;
  for (int64_t c : counts) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_LT(chi2, ChiSquareCritical(static_cast<int>(counts.size()) - 1)) << what;
}

TEST(NoiseSourceTest, UniformBelowIsUnbiasedOnSmallRanges) {
  NoiseSource source = NoiseSource::SeededForTesting(21);
  constexpr int64_t n = 300'000;
  for (uint64_t range : {2u, 3u, 5u, 7u, 10u, 100u}) {
    std::vector<int64_t> counts(range);
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t u = source.UniformBelow(range);
      ASSERT_LT(u, range);
      ++counts[u];
    }
    ExpectUniform(counts, n, "UniformBelow(" + std::to_string(range) + ")");
  }
}

// n = 3 * 2^62: plain modulo of a 64-bit word would put thirds at 1/2, 1/4, 1/4.
TEST(NoiseSourceTest, UniformBelowIsUnbiasedOnLargeRanges) {
  NoiseSource source = NoiseSource::SeededForTesting(22);
  constexpr int64_t n = 300'000;
  {
    const uint64_t range = uint64_t{3} << 62;
    std::vector<int64_t> thirds(3);
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t u = source.UniformBelow(range);
      ASSERT_LT(u, range);
      ++thirds[u >> 62];
    }
    ExpectUniform(thirds, n, "UniformBelow(3 * 2^62)");
  }
  {
    const u128 range = static_cast<u128>(3) << 100;
    std::vector<int64_t> thirds(3);
    for (int64_t i = 0; i < n; ++i) {
      const u128 u = source.UniformBelow128(range);
      ASSERT_TRUE(u < range);
      ++thirds[static_cast<int>(u >> 100)];
    }
    ExpectUniform(thirds, n, "UniformBelow128(3 * 2^100)");
  }
  {
    // Low word matters: [0, 5 * 2^64 + 2^63) in 11 halves of 2^63.
    const u128 range = (static_cast<u128>(5) << 64) + (static_cast<u128>(1) << 63);
    std::vector<int64_t> halves(11);
    for (int64_t i = 0; i < n; ++i) {
      const u128 u = source.UniformBelow128(range);
      ASSERT_TRUE(u < range);
      ++halves[static_cast<int>(u >> 63)];
    }
    ExpectUniform(halves, n, "UniformBelow128(5.5 * 2^64)");
  }
}

// ---- DiscreteGaussian
// ----------------------------------------------------------------------------

TEST(DiscreteGaussianTest, CreateChecksTheVariance) {
  EXPECT_EQ(DiscreteGaussian::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DiscreteGaussian::Create((uint64_t{1} << 52) + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DiscreteGaussian::Create(~uint64_t{0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(DiscreteGaussian::Create(1).ok());
  auto max = DiscreteGaussian::Create(uint64_t{1} << 52);
  ASSERT_TRUE(max.ok());
  EXPECT_EQ(max->variance(), uint64_t{1} << 52);
}

// Small s: t = 2, 2, 2, 3 (s = 1, 2, 3, 4), the regime where floor(sqrt) and the bias matter most.
// Chi-square against the exact pmf, tails pooled so that every bin expects >= 20.
TEST(DiscreteGaussianTest, SmallVariancesMatchTheExactPmf) {
  for (uint64_t s : {1u, 2u, 3u, 4u, 7u}) {
    const Pmf pmf = DiscreteGaussianPmf(static_cast<double>(s));
    const int n = kDraws / 4;
    const auto xs = Draw(s, n, 100 + s);
    std::map<int64_t, int64_t> counts;
    for (int64_t x : xs) ++counts[x];
    // Bins: (-inf, -m], -m+1 .. m-1, [m, inf) with the largest m whose tail expects >= 20.
    int64_t m = 1;
    while (n * (1 - pmf.Cdf(m)) >= 20) ++m;
    --m;
    double chi2 = 0;
    int bins = 0;
    auto add = [&](double expected_p, int64_t observed) {
      const double e = expected_p * n;
      chi2 += (observed - e) * (observed - e) / e;
      ++bins;
    };
    int64_t low = 0, high = 0;
    for (const auto& [k, c] : counts) {
      if (k <= -m) low += c;
      if (k >= m) high += c;
    }
    add(pmf.Cdf(-m), low);
    for (int64_t k = -m + 1; k <= m - 1; ++k) add(pmf.p[k + pmf.K], counts[k]);
    add(1 - pmf.Cdf(m - 1), high);
    EXPECT_LT(chi2, ChiSquareCritical(bins - 1)) << "s = " << s << ", " << bins << " bins";
  }
}

TEST(DiscreteGaussianTest, Variance100MatchesTheDiscreteGaussian) {
  constexpr uint64_t s = 100;
  const Pmf pmf = DiscreteGaussianPmf(s);
  double exact_variance = 0, exact_fourth = 0, exact_tail = 0;
  for (int64_t k = -pmf.K; k <= pmf.K; ++k) {
    const double p = pmf.p[k + pmf.K];
    exact_variance += p * k * k;
    exact_fourth += p * k * k * k * k;
    if (std::abs(k) > 30) exact_tail += p;  // |k| > 3 sqrt(s)
  }
  // For integer s the discrete Gaussian's variance is below s by about 8 pi^2 s^2 exp(-2 pi^2 s):
  // invisible at s = 100, but it is the exact value that is tested.
  EXPECT_LE(exact_variance, static_cast<double>(s) + 1e-9);
  EXPECT_NEAR(exact_variance, static_cast<double>(s), 1e-6);

  const auto xs = Draw(s, kDraws, 1234);
  const double n = xs.size();
  const Moments m = SampleMoments(xs);
  // Mean: 5 standard errors. Variance: 5 standard errors of the sample variance,
  // sqrt((mu4 - sigma^4) / n), i.e. about 0.7% of s for n = 10^6.
  EXPECT_NEAR(m.mean, 0, 5 * std::sqrt(exact_variance / n));
  const double variance_se = std::sqrt((exact_fourth - exact_variance * exact_variance) / n);
  EXPECT_NEAR(m.variance, exact_variance, 5 * variance_se);

  const double d = KsStatistic(xs, [&](int64_t k) {
    return k < -pmf.K ? 0.0 : k >= pmf.K ? 1.0 : pmf.Cdf(k);
  });
  EXPECT_LT(d, KsCritical(static_cast<int>(n))) << "KS statistic vs the exact discrete CDF";

  // P(|k| > 3 sqrt(s)): within 5 binomial standard errors.
  const double tail =
      std::count_if(xs.begin(), xs.end(), [](int64_t k) { return k > 30 || k < -30; });
  EXPECT_NEAR(tail / n, exact_tail, 5 * std::sqrt(exact_tail * (1 - exact_tail) / n));
}

TEST(DiscreteGaussianTest, KsStatisticCatchesAWrongVariance) {
  // The KS test has power: draws with s = 110 fail against the s = 100 CDF.
  const Pmf pmf = DiscreteGaussianPmf(100);
  const auto xs = Draw(110, kDraws, 77);
  const double d = KsStatistic(xs, [&](int64_t k) {
    return k < -pmf.K ? 0.0 : k >= pmf.K ? 1.0 : pmf.Cdf(k);
  });
  EXPECT_GT(d, KsCritical(static_cast<int>(xs.size())));
}

TEST(DiscreteGaussianTest, Variance2To48MatchesTheNormal) {
  constexpr uint64_t s = uint64_t{1} << 48;
  const double sigma = std::ldexp(1.0, 24);
  const auto xs = Draw(s, kDraws, 4321);
  const double n = xs.size();
  const Moments m = SampleMoments(xs);
  // At this scale N_Z(0, s) and N(0, s) agree to ~1e-15 in CDF and moments.
  EXPECT_NEAR(m.mean, 0, 5 * sigma / std::sqrt(n));
  EXPECT_NEAR(m.variance / static_cast<double>(s), 1.0, 5 * std::sqrt(2 / n));
  // F(k) = P(X <= k) = Phi((k + 1/2) / sigma) up to the midpoint rule's ~1e-16.
  const double d = KsStatistic(xs, [&](int64_t k) { return NormalCdf((k + 0.5) / sigma); });
  EXPECT_LT(d, KsCritical(static_cast<int>(n))) << "KS statistic vs the normal CDF";
  const double exact_tail = 2 * NormalCdf(-3.0);  // 0.0027
  const double tail = std::count_if(xs.begin(), xs.end(), [&](int64_t k) {
    return std::fabs(static_cast<double>(k)) > 3 * sigma;
  });
  EXPECT_NEAR(tail / n, exact_tail, 5 * std::sqrt(exact_tail * (1 - exact_tail) / n));
}

// The largest variance exercises the 128-bit bounds: den = 2 s t^2 ~ 2^105.
TEST(DiscreteGaussianTest, LargestVarianceIsSane) {
  constexpr uint64_t s = uint64_t{1} << 52;
  const double sigma = std::ldexp(1.0, 26);
  const int n = kDraws / 10;
  const auto xs = Draw(s, n, 9);
  const Moments m = SampleMoments(xs);
  EXPECT_NEAR(m.mean, 0, 5 * sigma / std::sqrt(n));
  EXPECT_NEAR(m.variance / static_cast<double>(s), 1.0, 5 * std::sqrt(2.0 / n));
  const double d = KsStatistic(xs, [&](int64_t k) { return NormalCdf((k + 0.5) / sigma); });
  EXPECT_LT(d, KsCritical(n));
}

TEST(DiscreteGaussianTest, SeededSamplesAreReproducible) {
  EXPECT_EQ(Draw(1000, 5000, 17), Draw(1000, 5000, 17));
  EXPECT_NE(Draw(1000, 5000, 17), Draw(1000, 5000, 18));
}

// ---- NoiseGridFor
// --------------------------------------------------------------------------------

TEST(NoiseGridTest, InvariantsHold) {
  std::vector<std::tuple<double, double, int64_t>> cases = {
      {1000.0, 1.0, 250'000'000},  // z sqrt(d) / 2 = 7.9e6, just under the 2^23 limit
      {1e-12, 1e-12, 1},
      {1.0, 1e-250, 1},  // grid ~2^-854
      {1.0, 1e280, 7},   // grid ~2^906
  };
  for (double z : {0.3, 1.0, 1.1, 5.0, 100.0}) {
    for (double sensitivity : {1e-6, 0.1, 1.0, 3.7, 1e6}) {
      for (int64_t dim : {int64_t{1}, int64_t{1000}, int64_t{101'770}, int64_t{10'000'000}}) {
        cases.emplace_back(z, sensitivity, dim);
      }
    }
  }
  for (const auto& [z, sensitivity, dim] : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "z " << z << " sensitivity " << sensitivity << " dim " << dim);
    auto grid = NoiseGridFor(z, sensitivity, dim);
    ASSERT_TRUE(grid.ok()) << grid.status();
    const double g = grid->grid();
    EXPECT_EQ(g, std::ldexp(1.0, grid->exponent));
    // sqrt(s) in [2^24, 2^25] (the ceiling and a 2^-47 safety margin may pass 2^25 by a hair).
    const double root = std::sqrt(static_cast<double>(grid->variance));
    EXPECT_GE(root, std::ldexp(1.0, 24));
    EXPECT_LE(root, std::ldexp(1.0, 25) * (1 + 1e-12));
    // The privacy invariant, in wider arithmetic: sqrt(s) * g >= z (Delta + g sqrt(d) / 2).
    using ld = long double;
    const ld needed =
        static_cast<ld>(z) *
        (static_cast<ld>(sensitivity) + static_cast<ld>(g) * std::sqrt(static_cast<ld>(dim)) / 2);
    EXPECT_GE(static_cast<ld>(grid->variance) * g * g, needed * needed);
    EXPECT_GE(grid->stddev(), static_cast<double>(needed) * (1 - 1e-15));
    // And not much more than needed.
    EXPECT_LE(grid->stddev(), static_cast<double>(needed) * (1 + 1e-12));
    // The exponent is the largest with z D / g >= 2^24: one step coarser falls short.
    const ld g2 = static_cast<ld>(g) * 2;
    const ld r2 = static_cast<ld>(z) *
                  (static_cast<ld>(sensitivity) + g2 * std::sqrt(static_cast<ld>(dim)) / 2) / g2;
    EXPECT_LT(r2, std::ldexp(1.0L, 24) * (1 + 1e-15L));
  }
}

// With R roundings (DP-SGD's exact sum of K chunks: R = 2K), the noise covers the sensitivity
// plus R half-grid moves: sqrt(s) g >= z (Delta + R g sqrt(d) / 2), and no more than needed.
TEST(NoiseGridTest, SeveralRoundingsAreCovered) {
  for (const int64_t roundings : {int64_t{1}, int64_t{2}, int64_t{16}, int64_t{512}}) {
    for (const double z : {0.5, 1.0, 1.9287, 7.0}) {
      for (const int64_t dim : {int64_t{1}, int64_t{101'770}, int64_t{10'000'000}}) {
        SCOPED_TRACE(::testing::Message()
                     << "roundings " << roundings << " z " << z << " dim " << dim);
        auto grid = NoiseGridFor(z, 1.0, dim, roundings);
        ASSERT_TRUE(grid.ok()) << grid.status();
        using ld = long double;
        const ld g = std::ldexp(1.0L, grid->exponent);
        const ld needed =
            static_cast<ld>(z) * (1.0L + static_cast<ld>(roundings) * g * std::sqrt(ld(dim)) / 2);
        EXPECT_GE(static_cast<ld>(grid->variance) * g * g, needed * needed);
        EXPECT_LE(grid->stddev(), static_cast<double>(needed) * (1 + 1e-12));
        EXPECT_GE(std::sqrt(static_cast<double>(grid->variance)), std::ldexp(1.0, 24));
      }
    }
  }
  // One rounding is the default.
  EXPECT_EQ(NoiseGridFor(1.3, 0.7, 5000)->variance, NoiseGridFor(1.3, 0.7, 5000, 1)->variance);
  // The rounding term z R sqrt(d) / 2 must stay below 2^23; R outside [1, 2^40] is refused.
  EXPECT_FALSE(NoiseGridFor(1000.0, 1.0, 250'000'000, 2).ok());
  EXPECT_FALSE(NoiseGridFor(1.0, 1.0, 10, 0).ok());
  EXPECT_FALSE(NoiseGridFor(1.0, 1.0, 10, (int64_t{1} << 40) + 1).ok());
}

TEST(NoiseGridTest, RejectsInvalidArguments) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (auto [z, sensitivity, dim] : std::vector<std::tuple<double, double, int64_t>>{
           {0, 1, 10},
           {-1, 1, 10},
           {nan, 1, 10},
           {inf, 1, 10},
           {1, 0, 10},
           {1, -2, 10},
           {1, nan, 10},
           {1, inf, 10},
           {1, 1, 0},
           {1, 1, -5},
           {1e4, 1, int64_t{1} << 40},  // z sqrt(d) / 2 > 2^23
           {1e300, 1e300, 10},          // z * sensitivity overflows
           {1e-200, 1e-200, 10},        // grid far below 2^-1000
       }) {
    auto grid = NoiseGridFor(z, sensitivity, dim);
    EXPECT_EQ(grid.status().code(), absl::StatusCode::kInvalidArgument)
        << z << " " << sensitivity << " " << dim;
  }
}

// ---- AddDiscreteGaussianNoise
// --------------------------------------------------------------------

std::vector<float> RandomValues(size_t n, uint64_t seed, double scale) {
  NoiseSource source = NoiseSource::SeededForTesting(seed);
  std::vector<float> v(n);
  for (float& x : v) {
    const double u = static_cast<double>(source.NextU64() >> 11) * 0x1p-53;  // [0, 1)
    x = static_cast<float>((2 * u - 1) * scale);
  }
  return v;
}

TEST(AddNoiseTest, ComputesExactlyOnTheGrid) {
  constexpr size_t n = 20'000;
  auto grid = NoiseGridFor(1.0, 1.0, n);
  ASSERT_TRUE(grid.ok());
  const double g = grid->grid();
  const std::vector<float> input = RandomValues(n, 5, 0.05);
  std::vector<float> values = input;
  NoiseSource source = NoiseSource::SeededForTesting(31);
  ASSERT_TRUE(AddDiscreteGaussianNoise(values, *grid, source).ok());
  // Replay: the same seed gives the same k_i, consumed in index order.
  NoiseSource replay = NoiseSource::SeededForTesting(31);
  auto gaussian = DiscreteGaussian::Create(grid->variance);
  ASSERT_TRUE(gaussian.ok());
  for (size_t i = 0; i < n; ++i) {
    const double units = std::nearbyint(static_cast<double>(input[i]) / g);  // ties to even
    const int64_t k = gaussian->Sample(replay);
    const float expected = static_cast<float>((static_cast<int64_t>(units) + k) * g);
    ASSERT_EQ(values[i], expected) << i;
    // On the grid: an integer number of grid steps.
    const double steps = static_cast<double>(values[i]) / g;
    ASSERT_EQ(steps, std::floor(steps)) << i;
  }
}

TEST(AddNoiseTest, RoundsHalfToEven) {
  // grid 2^-1: 0.25 is half a unit, 0.75 one and a half, ...
  const NoiseGrid grid{-1, 1};
  std::vector<float> values = {0.25f,  0.75f,  1.25f, 1.75f, -0.25f,
                               -0.75f, -1.25f, 0.2f,  0.3f,  0.0f};
  const std::vector<int64_t> expected_units = {0, 2, 2, 4, 0, -2, -2, 0, 1, 0};
  NoiseSource source = NoiseSource::SeededForTesting(2);
  ASSERT_TRUE(AddDiscreteGaussianNoise(values, grid, source).ok());
  NoiseSource replay = NoiseSource::SeededForTesting(2);
  auto gaussian = DiscreteGaussian::Create(1);
  ASSERT_TRUE(gaussian.ok());
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t k = gaussian->Sample(replay);
    EXPECT_EQ(static_cast<int64_t>(values[i] * 2) - k, expected_units[i]) << i;
  }
}

TEST(AddNoiseTest, NoiseHasTheGridsMeanAndStddev) {
  const size_t n = kDraws / 5;
  auto grid = NoiseGridFor(0.8, 2.0, static_cast<int64_t>(n));
  ASSERT_TRUE(grid.ok());
  const double sigma = grid->stddev();
  EXPECT_NEAR(sigma, 1.6, 1.6 * 1e-4);  // z (Delta + g sqrt(d) / 2), g ~ 2^-23.6
  const std::vector<float> input = RandomValues(n, 6, 3.0);
  std::vector<float> values = input;
  NoiseSource source = NoiseSource::SeededForTesting(32);
  ASSERT_TRUE(AddDiscreteGaussianNoise(values, *grid, source).ok());
  long double sum = 0, sum_sq = 0;
  for (size_t i = 0; i < n; ++i) {
    const long double d = static_cast<long double>(values[i]) - input[i];
    sum += d;
    sum_sq += d * d;
  }
  const double mean = static_cast<double>(sum / n);
  const double stddev = static_cast<double>(std::sqrt(sum_sq / n - (sum / n) * (sum / n)));
  EXPECT_NEAR(mean, 0, 5 * sigma / std::sqrt(static_cast<double>(n)));
  // Standard error of the sample stddev: sigma / sqrt(2n).
  EXPECT_NEAR(stddev, sigma, 5 * sigma / std::sqrt(2.0 * n));
}

TEST(AddNoiseTest, RejectsNonFiniteNamingTheIndex) {
  auto grid = NoiseGridFor(1.0, 1.0, 16);
  ASSERT_TRUE(grid.ok());
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> values = RandomValues(16, 7, 1.0);
    values[13] = bad;
    const std::vector<float> before = values;
    NoiseSource source = NoiseSource::SeededForTesting(1);
    const Status st = AddDiscreteGaussianNoise(values, *grid, source);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(st.message()).find("index 13"), std::string::npos) << st;
    EXPECT_EQ(std::memcmp(values.data(), before.data(), values.size() * sizeof(float)), 0);
  }
}

TEST(AddNoiseTest, RejectsValuesBeyond2To62Units) {
  auto grid = NoiseGridFor(1.0, 1.0, 16);  // g ~ 2^-24
  ASSERT_TRUE(grid.ok());
  std::vector<float> values(16, 0.5f);
  values[9] = 1e30f;
  const std::vector<float> before = values;
  NoiseSource source = NoiseSource::SeededForTesting(1);
  const Status st = AddDiscreteGaussianNoise(values, *grid, source);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("index 9"), std::string::npos) << st;
  EXPECT_EQ(values, before);
  // FLT_MAX on a grid of 2^-900 overflows the double product: still an error, not UB.
  values[9] = FLT_MAX;
  const std::vector<float> before_max = values;
  EXPECT_FALSE(AddDiscreteGaussianNoise(values, NoiseGrid{-900, 100}, source).ok());
  EXPECT_EQ(values, before_max);
}

TEST(AddNoiseTest, RejectsAnInvalidGrid) {
  std::vector<float> values(4, 1.0f);
  NoiseSource source = NoiseSource::SeededForTesting(1);
  EXPECT_FALSE(AddDiscreteGaussianNoise(values, NoiseGrid{-20, 0}, source).ok());
  EXPECT_FALSE(
      AddDiscreteGaussianNoise(values, NoiseGrid{-20, (uint64_t{1} << 52) + 1}, source).ok());
  EXPECT_FALSE(AddDiscreteGaussianNoise(values, NoiseGrid{5000, 100}, source).ok());
  EXPECT_EQ(values, std::vector<float>(4, 1.0f));
  std::vector<float> empty;
  EXPECT_TRUE(AddDiscreteGaussianNoise(empty, NoiseGrid{-20, 100}, source).ok());
}

}  // namespace
}  // namespace huddle::privacy
