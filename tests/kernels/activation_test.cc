// ReluForward/ReluBackward against element-wise references, including exact zeros.
#include "kernels/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/kernels/kernel_test_util.h"

namespace huddle::kernels {
namespace {

using test_util::RandomVector;

TEST(ReluTest, ForwardClampsNegativesInPlace) {
  Rng rng(11);
  auto y = RandomVector(rng, 1001);
  y[0] = 0.0f;
  y[1] = -0.0f;
  const auto input = y;
  ReluForward(y.data(), static_cast<int64_t>(y.size()));
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_EQ(y[i], input[i] > 0.0f ? input[i] : 0.0f) << "i=" << i;
    EXPECT_GE(y[i], 0.0f);
  }
}

TEST(ReluTest, BackwardMasksWhereOutputIsNotPositive) {
  Rng rng(12);
  auto y = RandomVector(rng, 1001);
  ReluForward(y.data(), static_cast<int64_t>(y.size()));
  auto dy = RandomVector(rng, 1001);
  const auto upstream = dy;
  ReluBackward(y.data(), dy.data(), static_cast<int64_t>(dy.size()));
  int passed = 0;
  for (size_t i = 0; i < dy.size(); ++i) {
    EXPECT_EQ(dy[i], y[i] > 0.0f ? upstream[i] : 0.0f) << "i=" << i;
    passed += y[i] > 0.0f;
  }
  EXPECT_GT(passed, 300);  // both branches are exercised
  EXPECT_LT(passed, 700);
}

TEST(ReluTest, ZeroLengthIsANoOp) {
  float y = -1.0f;
  ReluForward(&y, 0);
  ReluBackward(&y, &y, 0);
  EXPECT_EQ(y, -1.0f);
}

// tanh within 2 ulp of the double-precision value (C library tanhf), including its saturation
// and odd symmetry.
TEST(TanhTest, ForwardMatchesDoubleTanh) {
  Rng rng(13);
  auto y = RandomVector(rng, 1001, -6.0, 6.0);
  y[0] = 0.0f;
  y[1] = 20.0f;
  y[2] = -20.0f;
  const auto input = y;
  TanhForward(y.data(), static_cast<int64_t>(y.size()));
  for (size_t i = 0; i < y.size(); ++i) {
    const double ref = std::tanh(static_cast<double>(input[i]));
    EXPECT_NEAR(y[i], ref, 2.4e-7 * std::abs(ref)) << "x=" << input[i];
  }
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 1.0f);
  EXPECT_EQ(y[2], -1.0f);
}

// dy · (1 - y²) rounded once from double, and against a central difference of tanh.
TEST(TanhTest, BackwardIsOneMinusOutputSquared) {
  Rng rng(14);
  auto y = RandomVector(rng, 1001, -3.0, 3.0);
  const auto x = y;
  TanhForward(y.data(), static_cast<int64_t>(y.size()));
  auto dy = RandomVector(rng, 1001);
  const auto upstream = dy;
  TanhBackward(y.data(), dy.data(), static_cast<int64_t>(dy.size()));
  for (size_t i = 0; i < dy.size(); ++i) {
    const double yd = y[i];
    EXPECT_EQ(dy[i], static_cast<float>(upstream[i] * (1.0 - yd * yd))) << "i=" << i;
    const double h = 1e-4, xd = x[i];
    const double numeric = (std::tanh(xd + h) - std::tanh(xd - h)) / (2 * h) * upstream[i];
    EXPECT_NEAR(dy[i], numeric, 1e-6) << "x=" << x[i];
  }
}

TEST(TanhTest, ZeroLengthIsANoOp) {
  float y = 0.5f;
  TanhForward(&y, 0);
  TanhBackward(&y, &y, 0);
  EXPECT_EQ(y, 0.5f);
}

}  // namespace
}  // namespace huddle::kernels
