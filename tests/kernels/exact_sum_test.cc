// The vectorised fixed-point kernels (kernels/exact_sum.h) against their scalar reference, at every
// length around the kernels' block and lane boundaries.
#include "kernels/exact_sum.h"

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
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
    EXPECT_LE(AddFixedPoint(x.data(), n, scale, acc.data()), limit) << "n=" << n;
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
    EXPECT_LE(AddFixedPoint(&x, 1, scale, &acc), AbsBitsLimit(16.0));
    EXPECT_EQ(static_cast<int64_t>(acc), q) << x;
    EXPECT_EQ(FixedPointReference(x, scale), q) << x;
  }
}

TEST(ExactSumTest, LargestTermsAreExact) {
  // |x * scale| = 2^51 is the largest term the magic-constant conversion must handle.
  const float x[] = {1024.0f, -1024.0f, std::nextafter(1024.0f, 0.0f)};
  const double scale = std::ldexp(1.0, 41);
  uint64_t acc[3] = {0, 0, 0};
  EXPECT_EQ(AddFixedPoint(x, 3, scale, acc), AbsBitsLimit(1024.0));
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
        EXPECT_GT(AddFixedPoint(x.data(), n, 64.0, acc.data()), limit) << n << " " << pos;
        SubtractFixedPoint(x.data(), n, 64.0, acc.data());
        EXPECT_EQ(acc, std::vector<uint64_t>(n, 5)) << "rollback must be exact";
      }
    }
  }
  const float edge[] = {1.0f, -1.0f, 0.0f, -0.0f, FLT_MIN / 2};
  uint64_t acc[5] = {};
  EXPECT_EQ(AddFixedPoint(edge, 5, 64.0, acc), limit);
}

TEST(ExactSumTest, ToFloatDividesAndReportsOverflow) {
  const uint64_t acc[] = {static_cast<uint64_t>(int64_t{-6}), 0, 3 << 10};
  float out[3];
  EXPECT_EQ(FixedPointToFloat(acc, nullptr, 3, 1.0 / 1024, 0.5, out), -1);
  EXPECT_EQ(out[0], -6.0f / 1024 / 0.5f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], 6.0f);
  EXPECT_EQ(FixedPointToFloat(acc, nullptr, 3, 1.0, 1e-300, out), 0);
}

TEST(ExactSumTest, NarrowAddMatchesReferenceAtEveryLength) {
  Rng rng(2);
  const double scale = std::ldexp(37.0, 17);  // terms up to 37 * 2^17 * 4 < 2^25
  for (size_t n : {0, 1, 7, 8, 9, 511, 512, 513, 1031, 5000}) {
    const std::vector<float> x = RandomValues(rng, n, 4.0);
    std::vector<int32_t> narrow(n), expected(n);
    for (size_t i = 0; i < n; ++i) {
      narrow[i] = expected[i] = static_cast<int32_t>(rng.UniformInt(1 << 30)) - (1 << 29);
      expected[i] += static_cast<int32_t>(FixedPointReference(x[i], scale));
    }
    AddFixedPointNarrow(x.data(), n, scale, narrow.data());
    EXPECT_EQ(narrow, expected) << "n=" << n;
  }
  // At the edge of the int32 range, both signs.
  const float edge[] = {1.0f, -1.0f};
  int32_t sums[] = {INT32_MAX - 4, INT32_MIN + 4};
  AddFixedPointNarrow(edge, 2, 4.0, sums);
  EXPECT_EQ(sums[0], INT32_MAX);
  EXPECT_EQ(sums[1], INT32_MIN);
}

TEST(ExactSumTest, LargestValueAndTermBoundBoundEveryTerm) {
  Rng rng(3);
  const double scale = std::ldexp(1000.0, 31);
  for (size_t n : {1, 8, 600, 5000}) {
    const std::vector<float> x = RandomValues(rng, n, 0.01);
    std::vector<uint64_t> wide(n);
    std::vector<int32_t> narrow(n);
    const uint32_t bits = AddFixedPoint(x.data(), n, scale, wide.data());
    EXPECT_EQ(AddFixedPointNarrow(x.data(), n, scale, narrow.data()), bits);
    float largest = 0;
    int64_t largest_term = 0;
    for (float v : x) {
      largest = std::max(largest, std::fabs(v));
      largest_term = std::max(largest_term, std::abs(FixedPointReference(v, scale)));
    }
    EXPECT_EQ(bits, std::bit_cast<uint32_t>(largest)) << "n=" << n;
    EXPECT_GE(TermBound(bits, scale), largest_term);
    EXPECT_LE(TermBound(bits, scale), largest_term + 1);
  }
  uint64_t unused = 0;
  EXPECT_EQ(AddFixedPoint(nullptr, 0, 1.0, &unused), 0u);
}

// Terms far outside the int32 range wrap the partial sums; subtracting them restores every bit.
TEST(ExactSumTest, NarrowSubtractUndoesWrappedAdds) {
  Rng rng(4);
  const double scale = std::ldexp(1.0, 40);
  for (size_t n : {1, 9, 513, 2000}) {
    const std::vector<float> x = RandomValues(rng, n, 1000.0);
    std::vector<int32_t> narrow(n);
    for (int32_t& v : narrow) v = static_cast<int32_t>(rng.Next());
    const std::vector<int32_t> before = narrow;
    AddFixedPointNarrow(x.data(), n, scale, narrow.data());
    EXPECT_NE(narrow, before);
    SubtractFixedPointNarrow(x.data(), n, scale, narrow.data());
    EXPECT_EQ(narrow, before) << "n=" << n;
  }
}

TEST(ExactSumTest, MoveNarrowToWideKeepsTheSum) {
  int32_t narrow[] = {-7, INT32_MAX, INT32_MIN, 0};
  uint64_t wide[] = {3, 1, static_cast<uint64_t>(int64_t{-5}), 9};
  MoveNarrowToWide(narrow, 4, wide);
  EXPECT_EQ(static_cast<int64_t>(wide[0]), -4);
  EXPECT_EQ(static_cast<int64_t>(wide[1]), int64_t{INT32_MAX} + 1);
  EXPECT_EQ(static_cast<int64_t>(wide[2]), int64_t{INT32_MIN} - 5);
  EXPECT_EQ(static_cast<int64_t>(wide[3]), 9);
  for (int32_t v : narrow) EXPECT_EQ(v, 0);
  // FixedPointToFloat reads the two parts as one sum.
  const uint64_t acc[] = {static_cast<uint64_t>(int64_t{-6}), 1 << 12};
  const int32_t partial[] = {2, -(1 << 11)};
  float out[2];
  EXPECT_EQ(FixedPointToFloat(acc, partial, 2, 1.0 / 1024, 1.0, out), -1);
  EXPECT_EQ(out[0], -4.0f / 1024);
  EXPECT_EQ(out[1], 2.0f);
}

}  // namespace
}  // namespace huddle::kernels
