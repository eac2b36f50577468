// The group-normalization CPU reference (kernels/group_norm.h): the forward pass against a
// two-pass double reference, the gradients against finite differences of it, the per-example
// squared norms against explicit per-example gradients, in-place and skipped dx, and the empty
// batch. Shapes cover groups = 1, groups = channels and in between, spatial = 1 and > 1.
#include "kernels/group_norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/rng.h"
#include "tests/kernels/kernel_test_util.h"

namespace huddle::kernels {
namespace {

using test_util::ExpectAllNear;
using test_util::RandomVector;

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

size_t Values(const GroupNormShape& s) {
  return static_cast<size_t>(s.batch * s.channels * s.spatial);
}
size_t Stats(const GroupNormShape& s) { return static_cast<size_t>(s.batch * s.groups); }

// y = group_norm(x) · gamma + beta in double with two-pass statistics: the specification.
struct Reference {
  std::vector<double> y, mean, invstd;
};

Reference ReferenceForward(const GroupNormShape& s, const std::vector<double>& x,
                           const std::vector<double>& gamma, const std::vector<double>& beta,
                           double eps) {
  Reference ref{std::vector<double>(x.size()), {}, {}};
  const int64_t per_group = s.channels / s.groups, count = per_group * s.spatial;
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t g = 0; g < s.groups; ++g) {
      const int64_t base = (n * s.channels + g * per_group) * s.spatial;
      double mean = 0, var = 0;
      for (int64_t i = 0; i < count; ++i) mean += x[base + i];
      mean /= static_cast<double>(count);
      for (int64_t i = 0; i < count; ++i) var += std::pow(x[base + i] - mean, 2);
      var /= static_cast<double>(count);
      const double invstd = 1 / std::sqrt(var + eps);
      ref.mean.push_back(mean);
      ref.invstd.push_back(invstd);
      for (int64_t i = 0; i < count; ++i) {
        const int64_t c = g * per_group + i / s.spatial;
        ref.y[base + i] = (x[base + i] - mean) * invstd * gamma[c] + beta[c];
      }
    }
  }
  return ref;
}

// Random inputs of one shape and the kernels' forward and backward results on them.
struct Case {
  GroupNormShape s;
  std::vector<float> x, dy, gamma, beta;
  std::vector<float> y, mean, invstd, dgamma, dbeta, dx;
};

Case RunCase(const GroupNormShape& s, double eps, uint64_t seed) {
  Rng rng(DeriveSeed(200, seed));
  Case k;
  k.s = s;
  k.x = RandomVector(rng, static_cast<int64_t>(Values(s)), -2.0, 3.0);
  k.dy = RandomVector(rng, static_cast<int64_t>(Values(s)));
  k.gamma = RandomVector(rng, s.channels, -2.0, 2.0);
  k.beta = RandomVector(rng, s.channels);
  k.y.assign(Values(s), -99.0f);
  k.dx.assign(Values(s), -99.0f);
  k.mean.assign(Stats(s), -99.0f);
  k.invstd.assign(Stats(s), -99.0f);
  k.dgamma.assign(static_cast<size_t>(s.channels), -99.0f);
  k.dbeta.assign(static_cast<size_t>(s.channels), -99.0f);
  GroupNormForward(s, k.x.data(), k.gamma.data(), k.beta.data(), eps, k.y.data(), k.mean.data(),
                   k.invstd.data());
  GroupNormBackward(s, k.x.data(), k.dy.data(), k.gamma.data(), k.mean.data(), k.invstd.data(),
                    k.dgamma.data(), k.dbeta.data(), k.dx.data());
  return k;
}

const GroupNormShape kShapes[] = {
    {.batch = 2, .channels = 4, .spatial = 3, .groups = 1},  // LayerNorm-like
    {.batch = 2, .channels = 4, .spatial = 3, .groups = 2},
    {.batch = 2, .channels = 4, .spatial = 3, .groups = 4},   // InstanceNorm-like
    {.batch = 3, .channels = 6, .spatial = 1, .groups = 3},   // [batch, features] data
    {.batch = 1, .channels = 2, .spatial = 40, .groups = 1},  // more values than lanes
};

std::string Name(const GroupNormShape& s) {
  return testing::PrintToString(std::vector<int64_t>{s.batch, s.channels, s.spatial, s.groups});
}

// Float outputs of double computations from float-rounded statistics: a few 1e-7 relative.
TEST(GroupNormTest, ForwardMatchesTwoPassReference) {
  constexpr double kEps = kGroupNormDefaultEps;
  for (int i = 0; i < 5; ++i) {
    const GroupNormShape& s = kShapes[i];
    SCOPED_TRACE(Name(s));
    const Case k = RunCase(s, kEps, static_cast<uint64_t>(i));
    const Reference ref =
        ReferenceForward(s, ToDouble(k.x), ToDouble(k.gamma), ToDouble(k.beta), kEps);
    ExpectAllNear(k.mean, ref.mean, 1e-7, 1e-6, "mean");
    ExpectAllNear(k.invstd, ref.invstd, 0, 1e-6, "invstd");
    ExpectAllNear(k.y, ref.y, 1e-6, 1e-5, "y");
    std::vector<float> in_place = k.x, mean(Stats(s)), invstd(Stats(s));
    GroupNormForward(s, in_place.data(), k.gamma.data(), k.beta.data(), kEps, in_place.data(),
                     mean.data(), invstd.data());
    EXPECT_EQ(in_place, k.y);
  }
}

// dx, dgamma and dbeta of loss = Σ dy ⊙ y against central differences of the double reference
// (step 1e-5: accurate to ~1e-9). The kernels use float-rounded mean and invstd (relative 6e-8),
// so gradients of magnitude <= ~10 are within a few 1e-6: atol 1e-5 + rtol 1e-4 has margin.
TEST(GroupNormTest, GradientsMatchFiniteDifferences) {
  constexpr double kEps = 1e-3, kStep = 1e-5, kAtol = 1e-5, kRtol = 1e-4;
  for (int i = 0; i < 5; ++i) {
    const GroupNormShape& s = kShapes[i];
    SCOPED_TRACE(Name(s));
    const Case k = RunCase(s, kEps, static_cast<uint64_t>(10 + i));
    std::vector<double> xd = ToDouble(k.x), gd = ToDouble(k.gamma), bd = ToDouble(k.beta);
    auto loss = [&] {
      const std::vector<double> y = ReferenceForward(s, xd, gd, bd, kEps).y;
      double total = 0;
      for (size_t j = 0; j < y.size(); ++j) total += k.dy[j] * y[j];
      return total;
    };
    auto numeric = [&](std::vector<double>* values) {
      std::vector<double> grad(values->size());
      for (size_t j = 0; j < values->size(); ++j) {
        const double saved = (*values)[j];
        (*values)[j] = saved + kStep;
        const double plus = loss();
        (*values)[j] = saved - kStep;
        const double minus = loss();
        (*values)[j] = saved;
        grad[j] = (plus - minus) / (2 * kStep);
      }
      return grad;
    };
    ExpectAllNear(k.dx, numeric(&xd), kAtol, kRtol, "dx");
    ExpectAllNear(k.dgamma, numeric(&gd), kAtol, kRtol, "dgamma");
    ExpectAllNear(k.dbeta, numeric(&bd), kAtol, kRtol, "dbeta");
  }
}

// Each example's squared parameter-gradient norm against its explicit gradient: the backward
// pass run on that example alone. Those dgamma_n, dbeta_n are floats (rounded once from the same
// double sums), so the norms agree to float rounding (rtol 1e-6); the norms are added to what the
// buffer held.
TEST(GroupNormTest, SquaredNormsMatchPerExampleGradients) {
  for (int i = 0; i < 5; ++i) {
    const GroupNormShape& s = kShapes[i];
    SCOPED_TRACE(Name(s));
    const Case k = RunCase(s, kGroupNormDefaultEps, static_cast<uint64_t>(20 + i));
    std::vector<double> squared(static_cast<size_t>(s.batch), 0.5);
    AddGroupNormSquaredNorms(s, k.x.data(), k.dy.data(), k.mean.data(), k.invstd.data(),
                             squared.data());
    const GroupNormShape one{
        .batch = 1, .channels = s.channels, .spatial = s.spatial, .groups = s.groups};
    const int64_t values = s.channels * s.spatial;
    std::vector<double> sum_dgamma(static_cast<size_t>(s.channels), 0.0);
    for (int64_t n = 0; n < s.batch; ++n) {
      std::vector<float> dgamma(static_cast<size_t>(s.channels)), dbeta(dgamma.size());
      GroupNormBackward(one, k.x.data() + n * values, k.dy.data() + n * values, k.gamma.data(),
                        k.mean.data() + n * s.groups, k.invstd.data() + n * s.groups, dgamma.data(),
                        dbeta.data(), nullptr);
      double expected = 0.5;
      for (int64_t c = 0; c < s.channels; ++c) {
        expected +=
            static_cast<double>(dgamma[c]) * dgamma[c] + static_cast<double>(dbeta[c]) * dbeta[c];
        sum_dgamma[c] += dgamma[c];
      }
      EXPECT_NEAR(squared[n], expected, 1e-6 * expected) << "example " << n;
    }
    // The batch's dgamma is the sum of the examples'.
    ExpectAllNear(k.dgamma, sum_dgamma, 1e-6, 1e-6, "dgamma");
  }
}

// dx == nullptr skips the input gradient only; dx over dy or over x gives the same bits.
TEST(GroupNormTest, SkippedAndInPlaceInputGradient) {
  const GroupNormShape& s = kShapes[1];
  const Case k = RunCase(s, kGroupNormDefaultEps, 30);
  std::vector<float> dgamma(k.dgamma.size()), dbeta(k.dbeta.size());
  GroupNormBackward(s, k.x.data(), k.dy.data(), k.gamma.data(), k.mean.data(), k.invstd.data(),
                    dgamma.data(), dbeta.data(), nullptr);
  EXPECT_EQ(dgamma, k.dgamma);
  EXPECT_EQ(dbeta, k.dbeta);
  std::vector<float> over_dy = k.dy, over_x = k.x;
  GroupNormBackward(s, k.x.data(), over_dy.data(), k.gamma.data(), k.mean.data(), k.invstd.data(),
                    dgamma.data(), dbeta.data(), over_dy.data());
  EXPECT_EQ(over_dy, k.dx);
  GroupNormBackward(s, over_x.data(), k.dy.data(), k.gamma.data(), k.mean.data(), k.invstd.data(),
                    dgamma.data(), dbeta.data(), over_x.data());
  EXPECT_EQ(over_x, k.dx);
}

// A group whose values are all equal normalises to beta (variance 0, never negative).
TEST(GroupNormTest, ConstantGroupGivesBeta) {
  const GroupNormShape s{.batch = 1, .channels = 2, .spatial = 2, .groups = 1};
  const std::vector<float> x(4, 0.75f), gamma = {2.0f, -1.0f}, beta = {0.25f, -0.5f};
  std::vector<float> y(4), mean(1), invstd(1);
  GroupNormForward(s, x.data(), gamma.data(), beta.data(), 1e-3, y.data(), mean.data(),
                   invstd.data());
  EXPECT_EQ(mean[0], 0.75f);
  EXPECT_FLOAT_EQ(invstd[0], static_cast<float>(1.0 / std::sqrt(1e-3)));
  EXPECT_EQ(y, (std::vector<float>{0.25f, 0.25f, -0.5f, -0.5f}));
}

// No examples: dgamma and dbeta are zeros (overwritten), nothing else is touched.
TEST(GroupNormTest, EmptyBatch) {
  const GroupNormShape s{.batch = 0, .channels = 3, .spatial = 4, .groups = 3};
  const std::vector<float> gamma(3, 1.0f);
  std::vector<float> dgamma(3, 7.0f), dbeta(3, 7.0f);
  GroupNormForward(s, nullptr, gamma.data(), gamma.data(), 1e-5, nullptr, nullptr, nullptr);
  GroupNormBackward(s, nullptr, nullptr, gamma.data(), nullptr, nullptr, dgamma.data(),
                    dbeta.data(), nullptr);
  AddGroupNormSquaredNorms(s, nullptr, nullptr, nullptr, nullptr, nullptr);
  EXPECT_EQ(dgamma, std::vector<float>(3, 0.0f));
  EXPECT_EQ(dbeta, std::vector<float>(3, 0.0f));
}

}  // namespace
}  // namespace huddle::kernels
