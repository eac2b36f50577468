// SgdStep against a scalar reference over several steps, with and without momentum and decay.
#include "kernels/optimizer.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/kernels/kernel_test_util.h"

namespace huddle::kernels {
namespace {

using test_util::ExpectAllNear;
using test_util::RandomVector;

class SgdStepTest : public ::testing::TestWithParam<SgdHyper> {};

TEST_P(SgdStepTest, MatchesReferenceOverSeveralSteps) {
  const SgdHyper hyper = GetParam();
  const int64_t n = 1037;  // not a multiple of any vector width
  Rng rng(31);
  auto param = RandomVector(rng, n);
  std::vector<float> velocity(static_cast<size_t>(n), 0.0f);
  std::vector<double> ref_param(param.begin(), param.end());
  std::vector<double> ref_velocity(static_cast<size_t>(n), 0.0);
  for (int step = 0; step < 5; ++step) {
    const auto grad = RandomVector(rng, n);
    SgdStep(hyper, grad.data(), param.data(), hyper.momentum != 0.0f ? velocity.data() : nullptr,
            n);
    for (int64_t i = 0; i < n; ++i) {
      const double g = grad[i] + double{hyper.weight_decay} * ref_param[i];
      if (hyper.momentum != 0.0f) {
        ref_velocity[i] = hyper.momentum * ref_velocity[i] + g;
        ref_param[i] -= hyper.learning_rate * ref_velocity[i];
      } else {
        ref_param[i] -= hyper.learning_rate * g;
      }
    }
  }
  ExpectAllNear(param, ref_param, 1e-6, 1e-5, "param");
  if (hyper.momentum != 0.0f) {
    ExpectAllNear(velocity, ref_velocity, 1e-6, 1e-5, "velocity");
  }
}

INSTANTIATE_TEST_SUITE_P(Hyper, SgdStepTest,
                         ::testing::Values(SgdHyper{0.1f, 0.0f, 0.0f}, SgdHyper{0.05f, 0.0f, 1e-2f},
                                           SgdHyper{0.01f, 0.9f, 0.0f},
                                           SgdHyper{0.01f, 0.9f, 5e-4f}));

TEST(SgdStepTest, ZeroLearningRateLeavesParamsUnchanged) {
  std::vector<float> param = {1.0f, -2.0f};
  const std::vector<float> grad = {3.0f, 4.0f};
  SgdStep(SgdHyper{0.0f, 0.0f, 0.5f}, grad.data(), param.data(), nullptr, 2);
  EXPECT_EQ(param, (std::vector<float>{1.0f, -2.0f}));
}

}  // namespace
}  // namespace huddle::kernels
