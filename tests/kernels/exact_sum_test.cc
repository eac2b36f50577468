// The vectorised fixed-point kernel (kernels/exact_sum.h) against its scalar reference, at every
// length around the kernel's block and lane boundaries.
#include "kernels/exact_sum.h"

#include <bit>
#include <cfloat>
#include <cmath>
#include <vector>

#include "common/rng.h"
#include "gtest/gtest.h"

namespace huddle::kernels {
namespace {

std::vector<float> RandomValues(Rng& rng, size_t n, double max_abs) {
  std::vector<float> x(n);
  for (float& v : x) v = static_cast<float>((2 * rng.Uniform() - 1) * max_abs);
  return x;
}

TEST(ExactSumTest, AddMatchesReferenceAtEveryLength) {
  Rng rng(1);
  const double scale = std::ldexp(37.0, 17);  // weight 37, S = 17
  const uint32_t limit = AbsBitsLimit(1024.0);
  for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 511, 512, 513, 520, 1023, 1024, 1031, 5000}) {
    const std::vector<float> x = RandomValues(rng, n, 1024.0);
    std::vector<uint64_t> acc(n), expected(n);
    for (size_t i = 0; i < n; ++i) {
      acc[i] = expected[i] = rng.Next() >> 2;
      expected[i] += static_cast<uint64_t>(FixedPointReference(x[i], scale));
    }
    EXPECT_FALSE(AddFixedPoint(x.data(), n, scale, limit, acc.data())) << "n=" << n;
    EXPECT_EQ(acc, expected) << "n=" << n;
  }
}

TEST(ExactSumTest, RoundsHalfToEven) {
  const double scale = 1.0;
  for (auto [x, q] : {std::pair{0.5f, 0},
                      {1.5f, 2},
                      {2.5f, 2},
                      {-0.5f, 0},
                      {-1.5f, -2},
                      {-2.5f, -2},
                      {0.75f, 1},
                      {-0.25f, 0}}) {
    uint64_t acc = 0;
    EXPECT_FALSE(AddFixedPoint(&x, 1, scale, AbsBitsLimit(16.0), &acc));
    EXPECT_EQ(static_cast<int64_t>(acc), q) << x;
    EXPECT_EQ(FixedPointReference(x, scale), q) << x;
  }
}

TEST(ExactSumTest, LargestTermsAreExact) {
  // |x * scale| = 2^51 is the largest term the magic-constant conversion must handle.
  const float x[] = {1024.0f, -1024.0f, std::nextafter(1024.0f, 0.0f)};
  const double scale = std::ldexp(1.0, 41);
  uint64_t acc[3] = {0, 0, 0};
  EXPECT_FALSE(AddFixedPoint(x, 3, scale, AbsBitsLimit(1024.0), acc));
  EXPECT_EQ(static_cast<int64_t>(acc[0]), int64_t{1} << 51);
  EXPECT_EQ(static_cast<int64_t>(acc[1]), -(int64_t{1} << 51));
  EXPECT_EQ(static_cast<int64_t>(acc[2]), FixedPointReference(x[2], scale));
}

TEST(ExactSumTest, AbsBitsLimitIsTheLargestFloatNotAboveTheBound) {
  EXPECT_EQ(AbsBitsLimit(1024.0), std::bit_cast<uint32_t>(1024.0f));
  // 0.1f is slightly above 0.1, so the limit is the float just below it.
  const float below = std::nextafter(0.1f, 0.0f);
  EXPECT_EQ(AbsBitsLimit(0.1), std::bit_cast<uint32_t>(below));
  EXPECT_EQ(AbsBitsLimit(1e300), std::bit_cast<uint32_t>(FLT_MAX));
}

TEST(ExactSumTest, FlagsEveryBadValueAtEveryPosition) {
  const uint32_t limit = AbsBitsLimit(1.0);
  const float bad_values[] = {NAN, -NAN, INFINITY, -INFINITY, std::nextafter(1.0f, 2.0f), -2.0f};
  for (size_t n : {1, 8, 13, 600}) {
    for (size_t pos : {size_t{0}, n / 2, n - 1}) {
      for (float bad : bad_values) {
        std::vector<float> x(n, 0.25f);
        x[pos] = bad;
        std::vector<uint64_t> acc(n, 5);
        EXPECT_TRUE(AddFixedPoint(x.data(), n, 64.0, limit, acc.data())) << n << " " << pos;
        SubtractFixedPoint(x.data(), n, 64.0, acc.data());
        EXPECT_EQ(acc, std::vector<uint64_t>(n, 5)) << "rollback must be exact";
      }
    }
  }
  const float edge[] = {1.0f, -1.0f, 0.0f, -0.0f, FLT_MIN / 2};
  uint64_t acc[5] = {};
  EXPECT_FALSE(AddFixedPoint(edge, 5, 64.0, limit, acc));
}

TEST(ExactSumTest, ToFloatDividesAndReportsOverflow) {
  const uint64_t acc[] = {static_cast<uint64_t>(int64_t{-6}), 0, 3 << 10};
  float out[3];
  EXPECT_EQ(FixedPointToFloat(acc, 3, 1.0 / 1024, 0.5, out), -1);
  EXPECT_EQ(out[0], -6.0f / 1024 / 0.5f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], 6.0f);
  EXPECT_EQ(FixedPointToFloat(acc, 3, 1.0, 1e-300, out), 0);
}

}  // namespace
}  // namespace huddle::kernels
