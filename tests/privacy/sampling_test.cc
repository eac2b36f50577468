#include "privacy/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

namespace huddle::privacy {
namespace {

// A source whose words are scripted, to check the comparison digit by digit.
TEST(BernoulliTrialTest, EdgeCasesNeedNoRandomness) {
  NoiseSource source = NoiseSource::SeededForTesting(1);
  EXPECT_FALSE(BernoulliTrial(0.0, source));
  EXPECT_FALSE(BernoulliTrial(-1.0, source));
  EXPECT_FALSE(BernoulliTrial(std::nan(""), source));
  EXPECT_TRUE(BernoulliTrial(1.0, source));
  EXPECT_TRUE(BernoulliTrial(2.0, source));
}

TEST(BernoulliTrialTest, FrequencyMatchesTheRateIncludingTinyAndSubnormalRates) {
  NoiseSource source = NoiseSource::SeededForTesting(7);
  for (double p : {0.5, 0.1, 0.9, 1.0 / 3.0, 0.001}) {
    constexpr int kTrials = 200000;
    int hits = 0;
    for (int i = 0; i < kTrials; ++i) hits += BernoulliTrial(p, source);
    const double sd = std::sqrt(p * (1 - p) / kTrials);
    EXPECT_NEAR(hits / static_cast<double>(kTrials), p, 6 * sd) << p;
  }
  // Rates far below 2^-64 still terminate (a few words) and essentially never succeed.
  for (double p : {1e-30, 5e-324}) {
    int hits = 0;
    for (int i = 0; i < 1000; ++i) hits += BernoulliTrial(p, source);
    EXPECT_EQ(hits, 0) << p;
  }
}

TEST(BernoulliTrialTest, HalfIsDecidedByTheFirstBit) {
  // p = 1/2 = 0.1000... in binary: U < 1/2 iff U's top bit is 0.
  NoiseSource a = NoiseSource::SeededForTesting(3);
  NoiseSource b = NoiseSource::SeededForTesting(3);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t word = b.NextU64();
    EXPECT_EQ(BernoulliTrial(0.5, a), (word >> 63) == 0);
  }
}

TEST(SecretShuffleTest, IsAPermutationAndVaries) {
  NoiseSource source = NoiseSource::SeededForTesting(5);
  std::vector<int> items = {0, 1, 2, 3, 4, 5, 6, 7};
  std::set<std::vector<int>> seen;
  for (int i = 0; i < 50; ++i) {
    std::vector<int> copy = items;
    SecretShuffle(&copy, source);
    EXPECT_EQ(std::set<int>(copy.begin(), copy.end()).size(), items.size());
    seen.insert(copy);
  }
  EXPECT_GT(seen.size(), 40u);
}

}  // namespace
}  // namespace huddle::privacy
