// The exact grid sums of kernels/grid_sum.h (CPU reference): round half to even onto the grid,
// refusals counted and never added, exact and order-free integer totals with two's-complement
// wrap-around, and the documented conversion back to float. (CPU-GPU bit parity:
// backend_parity_test.cc.)
#include "kernels/grid_sum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "common/rng.h"
#include "kernels/backend.h"
#include "tests/kernels/kernel_test_util.h"

namespace huddle::kernels {
namespace {

constexpr double kNoLimit = 0x1p62;

// AccumulateOnGrid into a zero accumulator; returns it with the rejected count appended.
std::vector<int64_t> OnGrid(const std::vector<float>& x, int exponent, double limit = kNoLimit) {
  std::vector<int64_t> acc(x.size() + 1, 0);
  AccumulateOnGrid(x.data(), static_cast<int64_t>(x.size()), exponent, limit, acc.data(),
                   acc.data() + x.size());
  return acc;
}

TEST(AccumulateOnGridTest, RoundsHalfToEvenInGridUnits) {
  // Grid 2^-2 = 0.25: x / g = 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.4, 0.6, -0.6, 3.
  const std::vector<float> x = {0.125f,  0.375f, 0.625f, -0.125f, -0.375f,
                                -0.625f, 0.1f,   0.15f,  -0.15f,  0.75f};
  const std::vector<int64_t> expected = {0, 2, 2, 0, -2, -2, 0, 1, -1, 3, /*rejected*/ 0};
  EXPECT_EQ(OnGrid(x, -2), expected);
  // A coarse grid (2^3) and a fine one (2^-30) on the same values.
  EXPECT_EQ(OnGrid({12.0f, 20.0f, -4.0f, 100.0f}, 3),
            (std::vector<int64_t>{2, 2, 0, 12, 0}));  // 1.5 -> 2, 2.5 -> 2, -0.5 -> 0, 12.5 -> 12
  EXPECT_EQ(OnGrid({1.0f, -0.5f}, -30), (std::vector<int64_t>{1 << 30, -(1 << 29), 0}));
}

TEST(AccumulateOnGridTest, LargeValuesAreExactUpToTheLimit) {
  // 2^62 units exactly at the limit is accepted; one float step above is refused.
  const float at_limit = 0x1p40f;  // 2^40 / 2^-22 = 2^62
  const float above = std::nextafter(at_limit, INFINITY);
  auto acc = OnGrid({at_limit, -at_limit, above, 3.0f}, -22);
  EXPECT_EQ(acc[0], int64_t{1} << 62);
  EXPECT_EQ(acc[1], -(int64_t{1} << 62));
  EXPECT_EQ(acc[2], 0);                 // refused: adds nothing
  EXPECT_EQ(acc[3], int64_t{3} << 22);  // exact
  EXPECT_EQ(acc[4], 1);                 // one refusal
  // A smaller limit refuses by magnitude, both signs; below it everything is exact.
  acc = OnGrid({10.0f, -10.0f, 9.75f, -9.75f}, -2, 39.0);
  EXPECT_EQ(acc, (std::vector<int64_t>{0, 0, 39, -39, 2}));
}

TEST(AccumulateOnGridTest, NonFiniteValuesAreRefusedAndCounted) {
  const std::vector<float> x = {1.0f, std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY,
                                -2.0f};
  std::vector<int64_t> acc = {5, 5, 5, 5, 5, /*rejected*/ 10};
  AccumulateOnGrid(x.data(), 5, 0, kNoLimit, acc.data(), acc.data() + 5);
  EXPECT_EQ(acc, (std::vector<int64_t>{6, 5, 5, 5, 3, 13}));
  // A grid so fine that a finite float overflows the double product: refused too.
  acc.assign(2, 0);
  const float big = 0x1p100f;
  AccumulateOnGrid(&big, 1, -1000, kNoLimit, acc.data(), acc.data() + 1);
  EXPECT_EQ(acc, (std::vector<int64_t>{0, 1}));
}

TEST(AccumulateOnGridTest, IntegerTotalsDoNotDependOnSplitOrOrder) {
  Rng rng(1);
  const int64_t n = 1000;
  std::vector<std::vector<float>> parts;
  for (int p = 0; p < 7; ++p) parts.push_back(test_util::RandomVector(rng, n, -50, 50));
  auto total = [&](const std::vector<int>& order) {
    std::vector<int64_t> acc(n + 1, 0);
    for (int p : order) AccumulateOnGrid(parts[p].data(), n, -20, kNoLimit, acc.data(), &acc[n]);
    return acc;
  };
  std::vector<int> order(parts.size());
  std::iota(order.begin(), order.end(), 0);
  const std::vector<int64_t> forward = total(order);
  std::reverse(order.begin(), order.end());
  EXPECT_EQ(total(order), forward);
  // Summing partial accumulators (as ranks do) gives the same integers.
  std::vector<int64_t> first = total({0, 1, 2}), second = total({3, 4, 5, 6});
  AddUnits(second.data(), n + 1, first.data());
  EXPECT_EQ(first, forward);
}

TEST(AddUnitsTest, WrapsModulo2To64AndIsExactWhenTheTotalFits) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  const int64_t min = std::numeric_limits<int64_t>::min();
  std::vector<int64_t> acc = {max, min, 5};
  const std::vector<int64_t> add = {1, -1, -7};
  AddUnits(add.data(), 3, acc.data());
  EXPECT_EQ(acc, (std::vector<int64_t>{min, max, -2}));
  // Wrapped partial sums still end exact when the true total is in range.
  const std::vector<int64_t> back = {-1, 1, 0};
  AddUnits(back.data(), 3, acc.data());
  EXPECT_EQ(acc, (std::vector<int64_t>{max, min, -2}));
}

TEST(UnitsToFloatTest, IsTheDocumentedFormula) {
  Rng rng(2);
  std::vector<int64_t> acc;
  for (int i = 0; i < 2000; ++i) {
    const auto magnitude = static_cast<int64_t>(rng.Uniform() * 0x1p60);
    acc.push_back(i % 2 == 0 ? magnitude : -magnitude);
  }
  acc.push_back(0);
  acc.push_back(std::numeric_limits<int64_t>::max());
  acc.push_back(std::numeric_limits<int64_t>::min());
  for (const int exponent : {-40, -24, 0, 7}) {
    for (const double divisor : {1.0, 3.0, 2048.0, 60000.0}) {
      std::vector<float> out(acc.size());
      UnitsToFloat(acc.data(), static_cast<int64_t>(acc.size()), exponent, divisor, out.data());
      for (size_t i = 0; i < acc.size(); ++i) {
        const double v = (static_cast<double>(acc[i]) * std::ldexp(1.0, exponent)) / divisor;
        const float expected = std::fabs(v) < 0x1p-126 ? std::copysign(0.0f, static_cast<float>(v))
                                                       : static_cast<float>(v);
        ASSERT_EQ(std::signbit(out[i]), std::signbit(expected)) << i;
        ASSERT_EQ(out[i], expected) << i << " exponent " << exponent << " divisor " << divisor;
      }
    }
  }
}

TEST(UnitsToFloatTest, TinyResultsAreSignedZerosAndHugeOnesInfinite) {
  const std::vector<int64_t> acc = {1, -1, 3, int64_t{1} << 62};
  std::vector<float> out(acc.size());
  UnitsToFloat(acc.data(), 3, -140, 1.0, out.data());  // 2^-140: below the normal floats
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_FALSE(std::signbit(out[0]));
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_TRUE(std::signbit(out[1]));
  UnitsToFloat(acc.data(), 1, -126, 1.0, out.data());  // exactly the smallest normal float
  EXPECT_EQ(out[0], 0x1p-126f);
  UnitsToFloat(acc.data() + 3, 1, 100, 1.0, out.data());  // 2^162
  EXPECT_EQ(out[0], INFINITY);
}

TEST(GridSumTest, TheCpuBackendRunsTheReferences) {
  auto backend = OpenCpuBackend();
  const std::vector<float> x = {0.375f, -1.25f, NAN};
  std::vector<int64_t> acc(4, 0);
  backend->AccumulateOnGrid(x.data(), 3, -2, kNoLimit, acc.data(), acc.data() + 3);
  EXPECT_EQ(acc, (std::vector<int64_t>{2, -5, 0, 1}));
  const std::vector<int64_t> noise = {1, 1, 1};
  backend->AddUnits(noise.data(), 3, acc.data());
  std::vector<float> out(3);
  backend->UnitsToFloat(acc.data(), 3, -2, 2.0, out.data());
  EXPECT_EQ(out, (std::vector<float>{0.375f, -0.5f, 0.125f}));
}

}  // namespace
}  // namespace huddle::kernels
