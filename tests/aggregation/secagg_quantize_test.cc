// Quantization for secure aggregation: the plan keeps every admissible sum from wrapping, rounding
// is unbiased, and the decoded sum is the sum of the rounded values.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "aggregation/secagg/quantize.h"

namespace huddle::aggregation::secagg {
namespace {

QuantizeRequest Request(double clip, uint32_t members, int64_t dim) {
  QuantizeRequest r;
  r.clip_norm = clip;
  r.members = members;
  r.dim = dim;
  return r;
}

TEST(Quantize, ThePlanKeepsTheLargestSumBelowHalfTheModulus) {
  for (uint32_t n : {2u, 10u, 100u, 1000u}) {
    for (double clip : {0.01, 1.0, 5.0, 1e4}) {
      auto plan = PlanQuantization(Request(clip, n, 100000));
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_EQ(plan->bits, 32) << n << " " << clip;
      const double per_member = clip * plan->Scale() + 1;
      EXPECT_LT(n * per_member, std::ldexp(1.0, 31));
      // The largest such exponent: one more would not fit.
      EXPECT_GE(n * (clip * plan->Scale() * 2 + 1), std::ldexp(1.0, 31)) << n << " " << clip;
      EXPECT_GE(clip * plan->Scale(), std::ldexp(1.0, kMinPrecisionBits));
    }
  }
  // Too many members for 32 bits at the minimum precision: 64.
  auto wide = PlanQuantization(Request(1.0, 1u << 20, 1000));
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(wide->bits, 64);
  QuantizeRequest forced = Request(1.0, 10, 1000);
  forced.bits = 64;
  EXPECT_EQ(PlanQuantization(forced)->bits, 64);
}

TEST(Quantize, DistributedNoiseIsCalibratedForTheFewestSurvivors) {
  QuantizeRequest r = Request(1.0, 100, 101770);
  r.noise_multiplier = 1.1;
  r.min_survivors = 80;
  auto plan = PlanQuantization(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Any 80 members' noise sums to at least (z Delta)^2, Delta including the rounding's growth.
  const double delta = plan->Scale() + std::sqrt(101770.0);
  EXPECT_DOUBLE_EQ(plan->sensitivity, delta);
  EXPECT_GE(80.0 * static_cast<double>(plan->noise_variance), 1.1 * 1.1 * delta * delta);
  EXPECT_LE(static_cast<double>(plan->noise_variance), std::ldexp(1.0, 52));
  // The noise's tail is inside the modulus too.
  const double tail = std::sqrt(2 * (64 * std::log(2.0) + std::log(2.0 * 101770)));
  EXPECT_LT(100 * (plan->Scale() + 1) +
                tail * std::sqrt(100.0 * static_cast<double>(plan->noise_variance)),
            std::ldexp(1.0, 31));
}

// 64-bit words with distributed noise (examples/dp_distributed.yaml with bits: 64) once hung the
// coordinator: the finest 64-bit grid asks for a variance above 2^52, where adding 1 to a double
// changes nothing. The plan now takes a coarser grid, whose variance the sampler can draw.
TEST(Quantize, SixtyFourBitWordsWithDistributedNoiseTakeAGridTheSamplerCanDraw) {
  QuantizeRequest r = Request(1.0, 1000, 50890);
  r.noise_multiplier = 9.01;
  r.min_survivors = 850;
  r.bits = 64;
  auto plan = PlanQuantization(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->bits, 64);
  EXPECT_LE(static_cast<double>(plan->noise_variance), std::ldexp(1.0, 52));
  EXPECT_GE(std::sqrt(850.0 * static_cast<double>(plan->noise_variance)) / plan->sensitivity,
            9.01);
  // The largest grid whose variance fits: one step finer would not.
  const double finer = GridSensitivity(1.0, plan->scale_exponent + 1, 50890);
  EXPECT_GT(9.01 * 9.01 * finer * finer / 850, std::ldexp(1.0, 52));
}

TEST(Quantize, BadRequestsAreRefused) {
  EXPECT_FALSE(PlanQuantization(Request(0, 10, 10)).ok());
  EXPECT_FALSE(PlanQuantization(Request(std::nan(""), 10, 10)).ok());
  EXPECT_FALSE(PlanQuantization(Request(1, 0, 10)).ok());
  EXPECT_FALSE(PlanQuantization(Request(1, 10, 0)).ok());
  QuantizeRequest r = Request(1, 10, 10);
  r.min_survivors = 11;
  EXPECT_FALSE(PlanQuantization(r).ok());
  r = Request(1, 10, 10);
  r.bits = 16;
  EXPECT_FALSE(PlanQuantization(r).ok());
}

TEST(Quantize, RoundingIsUnbiasedAndWithinOneStep) {
  std::mt19937_64 rng(5);
  const std::vector<float> x = {0.3f, -0.3f, 1.0f / 3, -2.5f, 0.0f, 1e-9f};
  const int e = 4;  // steps of 1/16
  std::vector<double> mean(x.size(), 0);
  const int trials = 20000;
  std::vector<uint64_t> q(x.size());
  std::vector<float> back(x.size());
  for (int t = 0; t < trials; ++t) {
    ASSERT_TRUE(Quantize(
                    x, e, 32, [&] { return rng(); }, q)
                    .ok());
    Decode(q, 32, e, back);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_LE(std::fabs(back[i] - x[i]), 1.0 / 16 + 1e-7) << i;
      mean[i] += back[i] / trials;
    }
  }
  for (size_t i = 0; i < x.size(); ++i) {
    // Standard error of the mean: at most 0.5 / 16 / sqrt(trials) = 2.2e-4.
    EXPECT_NEAR(mean[i], x[i], 1.2e-3) << i;
  }
  std::vector<float> bad = {std::nanf("")};
  EXPECT_FALSE(Quantize(
                   bad, e, 32, [&] { return rng(); }, std::span(q).first(1))
                   .ok());
}

TEST(Quantize, TheSumOfEveryMembersExtremeDecodesExactly) {
  // n members each at +C (and then -C) in every coordinate: the worst case the plan admits.
  for (int bits : {32, 64}) {
    QuantizeRequest r = Request(2.0, 1000, 4);
    r.bits = bits;
    auto plan = PlanQuantization(r);
    ASSERT_TRUE(plan.ok());
    for (float sign : {1.0f, -1.0f}) {
      const std::vector<float> x(4, sign * 2.0f);
      std::vector<uint64_t> sum(4, 0), q(4);
      for (int m = 0; m < 1000; ++m) {
        ASSERT_TRUE(Quantize(
                        x, plan->scale_exponent, bits, [] { return 0; }, q)
                        .ok());
        for (size_t i = 0; i < 4; ++i) sum[i] += q[i];
      }
      std::vector<float> decoded(4);
      Decode(sum, bits, plan->scale_exponent, decoded);
      for (float v : decoded) EXPECT_FLOAT_EQ(v, sign * 2000.0f) << bits;
    }
  }
}

TEST(Quantize, SignedAdditionWrapsModuloTheWidth) {
  std::vector<uint64_t> w = {0, 5, 0xffffffffu};
  AddSigned(std::vector<int64_t>{-1, -10, 1}, 32, w);
  EXPECT_EQ(w[0], 0xffffffffu);
  EXPECT_EQ(w[1], 0xfffffffbu);
  EXPECT_EQ(w[2], 0u);
  std::vector<float> out(3);
  Decode(w, 32, 0, out);
  EXPECT_EQ(out[0], -1.0f);
  EXPECT_EQ(out[1], -5.0f);
  EXPECT_EQ(out[2], 0.0f);
}

}  // namespace
}  // namespace huddle::aggregation::secagg
