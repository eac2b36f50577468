// The dropout CPU reference (kernels/dropout.h): the hash is SplitMix64, the keep fraction is
// 1 - p, kept values are scaled by 1 / (1 - p), the mask is a pure function of (seed, offset + i)
// (so backward matches forward and a split call matches the whole), and p = 0 is the identity.
#include "kernels/dropout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/rng.h"
#include "tests/kernels/kernel_test_util.h"

namespace huddle::kernels {
namespace {

using test_util::RandomVector;

// Values in [1, 2): never zero, so a zero output means "dropped".
std::vector<float> NonZero(int64_t n, uint64_t seed) {
  Rng rng(DeriveSeed(300, seed));
  return RandomVector(rng, n, 1.0, 2.0);
}

// The mask's words are SplitMix64's stream: from state 0 its first output is the published
// 0xe220a8397b1dcdaf. Pinned so that a refactor cannot silently change every mask.
TEST(DropoutTest, HashIsSplitMix64) {
  EXPECT_EQ(dropout_math::Hash(0, 0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(dropout_math::Hash(42, 7), 0x272404a0a3926552ull);
  EXPECT_EQ(dropout_math::DropThreshold(0.0f), 0u);
  EXPECT_EQ(dropout_math::DropThreshold(0.5f), uint64_t{1} << 63);
  EXPECT_EQ(dropout_math::DropThreshold(0.25f), uint64_t{1} << 62);
}

// Keep fraction within 5 standard deviations of 1 - p (n = 100000: sd <= 0.0016), and every kept
// value is x / (1 - p) to float rounding.
TEST(DropoutTest, KeepsAboutOneMinusPAndScales) {
  constexpr int64_t kN = 100000;
  for (const float p : {0.1f, 0.5f, 0.9f}) {
    SCOPED_TRACE(testing::Message() << "p " << p);
    const auto x = NonZero(kN, 1);
    std::vector<float> y = x;
    DropoutForward(y.data(), kN, p, /*seed=*/7, /*offset=*/0);
    int64_t kept = 0;
    for (int64_t i = 0; i < kN; ++i) {
      if (y[i] == 0.0f) continue;
      ++kept;
      ASSERT_NEAR(y[i], x[i] / (1.0 - p), 1.2e-7 * y[i]) << i;
    }
    const double sd = std::sqrt(p * (1.0 - p) / kN);
    EXPECT_NEAR(static_cast<double>(kept) / kN, 1.0 - p, 5 * sd);
  }
}

TEST(DropoutTest, ZeroProbabilityIsTheIdentity) {
  auto x = NonZero(1000, 2);
  x[0] = -0.0f;
  x[1] = 1e-40f;
  const auto before = x;
  DropoutForward(x.data(), 1000, 0.0f, 3, 4);
  EXPECT_EQ(0, std::memcmp(x.data(), before.data(), x.size() * sizeof(float)));
  DropoutBackward(x.data(), 1000, 0.0f, 3, 4);
  EXPECT_EQ(0, std::memcmp(x.data(), before.data(), x.size() * sizeof(float)));
}

// The same (seed, offset) gives the same mask; another seed or offset another one; a call on the
// tail [k, n) with offset + k equals the tail of the whole call; backward drops exactly the
// elements forward dropped and scales the rest alike.
TEST(DropoutTest, MaskIsAPureFunctionOfSeedAndCounter) {
  constexpr int64_t kN = 4096, kSplit = 1000;
  constexpr float kP = 0.3f;
  const auto x = NonZero(kN, 3);
  auto run = [&](uint64_t seed, uint64_t offset) {
    std::vector<float> y = x;
    DropoutForward(y.data(), kN, kP, seed, offset);
    return y;
  };
  const std::vector<float> a = run(11, 100);
  EXPECT_EQ(run(11, 100), a);
  EXPECT_NE(run(12, 100), a);
  EXPECT_NE(run(11, 101), a);

  std::vector<float> tail(x.begin() + kSplit, x.end());
  DropoutForward(tail.data(), kN - kSplit, kP, 11, 100 + kSplit);
  EXPECT_EQ(tail, std::vector<float>(a.begin() + kSplit, a.end()));

  std::vector<float> dy = x;
  DropoutBackward(dy.data(), kN, kP, 11, 100);
  EXPECT_EQ(dy, a);  // dy = x here, so the same mask and scale give the same values
}

TEST(DropoutTest, ZeroLengthIsANoOp) {
  float v = 5.0f;
  DropoutForward(&v, 0, 0.5f, 1, 2);
  DropoutBackward(&v, 0, 0.5f, 1, 2);
  EXPECT_EQ(v, 5.0f);
}

}  // namespace
}  // namespace huddle::kernels
