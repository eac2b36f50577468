#include "common/rng.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "gtest/gtest.h"

namespace huddle {
namespace {

TEST(RngTest, SameSeedSameStream) {
  Rng a(42), b(42), c(43);
  bool differs = false;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t x = a.Next();
    ASSERT_EQ(x, b.Next());
    differs |= x != c.Next();
  }
  EXPECT_TRUE(differs);
}

TEST(RngTest, SeedsThroughSplitMix64) {
  // The first SplitMix64 output for state 0 is a published test value.
  EXPECT_EQ(Rng(0).state()[0], 0xe220a8397b1dcdafULL);
}

TEST(RngTest, SavedStateContinuesTheSameStream) {
  Rng a(7);
  for (int i = 0; i < 10; ++i) a.Next();
  const Rng::State saved = a.state();
  std::vector<double> expected;
  for (int i = 0; i < 100; ++i) expected.push_back(a.Normal() + a.Uniform());
  Rng b(12345);
  b.set_state(saved);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(b.Normal() + b.Uniform(), expected[i]);
}

TEST(RngTest, DeriveSeedSeparatesStreams) {
  EXPECT_EQ(DeriveSeed(1, 2, 3), DeriveSeed(1, 2, 3));
  std::set<uint64_t> seeds;
  for (uint64_t round = 0; round < 20; ++round) {
    for (uint64_t client = 0; client < 20; ++client) seeds.insert(DeriveSeed(99, round, client));
  }
  EXPECT_EQ(seeds.size(), 400u);
  EXPECT_NE(DeriveSeed(1, 2, 0), DeriveSeed(1, 0, 2));
}

TEST(RngTest, UniformIntStaysInRangeAndIsRoughlyUniform) {
  Rng rng(3);
  EXPECT_EQ(rng.UniformInt(1), 0u);
  constexpr int kBuckets = 10, kDraws = 100000;
  std::vector<int> counts(kBuckets);
  for (int i = 0; i < kDraws; ++i) {
    const uint64_t x = rng.UniformInt(kBuckets);
    ASSERT_LT(x, static_cast<uint64_t>(kBuckets));
    ++counts[x];
  }
  // Each count is ~Binomial(1e5, 0.1): sd 95. Allow 6 sd.
  for (int c : counts) EXPECT_NEAR(c, kDraws / kBuckets, 570);
  // A range that is not a power of two and close to 2^64 still lands in range.
  const uint64_t big = (uint64_t{1} << 63) + 12345;
  double mean = 0;
  for (int i = 0; i < 10000; ++i) {
    const uint64_t x = rng.UniformInt(big);
    ASSERT_LT(x, big);
    mean += static_cast<double>(x) / static_cast<double>(big) / 10000;
  }
  EXPECT_NEAR(mean, 0.5, 0.02);
}

TEST(RngTest, UniformIsInTheUnitInterval) {
  Rng rng(4);
  double sum = 0;
  for (int i = 0; i < 100000; ++i) {
    const double u = rng.Uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.006);  // sd 0.0009
}

TEST(RngTest, NormalHasMeanZeroAndVarianceOne) {
  Rng rng(5);
  constexpr int kN = 200000;
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < kN; ++i) {
    const double x = rng.Normal();
    sum += x;
    sum_sq += x * x;
  }
  const double mean = sum / kN;
  EXPECT_NEAR(mean, 0.0, 0.012);                      // sd 0.0022
  EXPECT_NEAR(sum_sq / kN - mean * mean, 1.0, 0.02);  // sd 0.0032
}

TEST(RngTest, GammaHasMeanAndVarianceEqualToShape) {
  Rng rng(6);
  for (double shape : {0.3, 1.0, 2.5, 10.0}) {
    constexpr int kN = 100000;
    double sum = 0, sum_sq = 0;
    for (int i = 0; i < kN; ++i) {
      const double x = rng.Gamma(shape);
      ASSERT_GE(x, 0.0);
      sum += x;
      sum_sq += x * x;
    }
    const double mean = sum / kN;
    // sd of the mean is sqrt(shape / kN); allow 6 sd.
    EXPECT_NEAR(mean, shape, 6 * std::sqrt(shape / kN)) << shape;
    EXPECT_NEAR(sum_sq / kN - mean * mean, shape, 0.05 * shape + 0.02) << shape;
  }
}

TEST(RngTest, ShuffleIsADeterministicPermutation) {
  std::vector<int> a(100), b;
  std::iota(a.begin(), a.end(), 0);
  b = a;
  Rng r1(8), r2(8);
  r1.Shuffle(a);
  r2.Shuffle(b);
  EXPECT_EQ(a, b);
  std::vector<int> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> identity(100);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(a, identity);
}

}  // namespace
}  // namespace huddle
