// ReluForward/ReluBackward against element-wise references, including exact zeros.
#include "kernels/activation.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace huddle::kernels
