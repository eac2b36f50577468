// The batch-normalization CPU reference (kernels/batch_norm.h): normalisation, gradients against
// finite differences of a double-precision reference, the SyncBatchNorm property (sums of parts
// give the whole batch's results), running statistics, and the empty batch.
#include "kernels/batch_norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "common/rng.h"
#include "tests/kernels/kernel_test_util.h"

namespace huddle::kernels {
namespace {

using test_util::ExpectAllNear;
using test_util::RandomVector;

using Doubles = std::vector<double>;

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Per-feature statistics of a [batch, features, spatial] float buffer, from BatchNormSums +
// Moments.
struct Moments {
  std::vector<double> sums;
  std::vector<float> mean, invstd;
};

Moments ComputeMoments(const float* x, int64_t batch, int64_t features, double eps,
                       int64_t spatial = 1) {
  Moments m;
  m.sums.assign(static_cast<size_t>(2 * features), -1.0);
  m.mean.assign(static_cast<size_t>(features), -1.0f);
  m.invstd.assign(static_cast<size_t>(features), -1.0f);
  BatchNormSums(x, batch, features, spatial, m.sums.data());
  BatchNormMoments(m.sums.data(), batch * spatial, features, eps, m.mean.data(), m.invstd.data());
  return m;
}

// y = batch_norm(x) · gamma + beta in double with two-pass statistics: the specification.
std::vector<double> ReferenceForward(const std::vector<double>& x, int64_t batch, int64_t features,
                                     const std::vector<double>& gamma,
                                     const std::vector<double>& beta, double eps) {
  std::vector<double> y(x.size());
  for (int64_t f = 0; f < features; ++f) {
    double mean = 0, var = 0;
    for (int64_t r = 0; r < batch; ++r) mean += x[r * features + f];
    mean /= static_cast<double>(batch);
    for (int64_t r = 0; r < batch; ++r) {
      const double d = x[r * features + f] - mean;
      var += d * d;
    }
    var /= static_cast<double>(batch);
    for (int64_t r = 0; r < batch; ++r) {
      const int64_t i = r * features + f;
      y[i] = (x[i] - mean) / std::sqrt(var + eps) * gamma[f] + beta[f];
    }
  }
  return y;
}

TEST(BatchNormTest, SumsAreDoubleSumsInRowOrder) {
  constexpr int64_t kBatch = 37, kFeatures = 5;
  Rng rng(DeriveSeed(101));
  const auto x = RandomVector(rng, kBatch * kFeatures, -3.0, 3.0);
  const auto dy = RandomVector(rng, kBatch * kFeatures);
  const Moments m = ComputeMoments(x.data(), kBatch, kFeatures, kBatchNormDefaultEps);
  std::vector<double> backward(2 * kFeatures, -1.0);
  BatchNormBackwardSums(dy.data(), x.data(), m.mean.data(), m.invstd.data(), kBatch, kFeatures, 1,
                        backward.data());
  for (int64_t f = 0; f < kFeatures; ++f) {
    double s = 0, ss = 0, sdy = 0, sdyx = 0;
    for (int64_t r = 0; r < kBatch; ++r) {
      const int64_t i = r * kFeatures + f;
      const double v = x[i];
      s += v;
      ss += v * v;
      sdy += dy[i];
      sdyx += dy[i] * ((v - m.mean[f]) * m.invstd[f]);
    }
    // The documented order, so the same bits (EXPECT_EQ, not near).
    EXPECT_EQ(m.sums[f], s) << f;
    EXPECT_EQ(m.sums[kFeatures + f], ss) << f;
    EXPECT_EQ(backward[f], sdy) << f;
    EXPECT_EQ(backward[kFeatures + f], sdyx) << f;
  }
}

// (a) With gamma = 1 and beta = 0 every feature comes out with mean 0 and variance
// var / (var + eps) (1 up to eps), whatever its offset and scale; in place gives the same bits.
TEST(BatchNormTest, ForwardNormalizesEachFeature) {
  constexpr int64_t kBatch = 64, kFeatures = 7;
  constexpr double kEps = kBatchNormDefaultEps;
  Rng rng(DeriveSeed(102));
  std::vector<float> x(kBatch * kFeatures);
  for (int64_t f = 0; f < kFeatures; ++f) {
    const double offset = 10.0 * (rng.Uniform() - 0.5), scale = 0.5 + 3.0 * rng.Uniform();
    for (int64_t r = 0; r < kBatch; ++r) {
      x[r * kFeatures + f] = static_cast<float>(offset + scale * rng.Normal());
    }
  }
  const std::vector<float> ones(kFeatures, 1.0f), zeros(kFeatures, 0.0f);
  const Moments m = ComputeMoments(x.data(), kBatch, kFeatures, kEps);
  std::vector<float> y(x.size(), -99.0f);
  BatchNormForward(x.data(), kBatch, kFeatures, 1, m.mean.data(), m.invstd.data(), ones.data(),
                   zeros.data(), y.data());
  for (int64_t f = 0; f < kFeatures; ++f) {
    double x_mean = 0, x_var = 0, y_mean = 0, y_var = 0;
    for (int64_t r = 0; r < kBatch; ++r) {
      x_mean += x[r * kFeatures + f];
      y_mean += y[r * kFeatures + f];
    }
    x_mean /= kBatch;
    y_mean /= kBatch;
    for (int64_t r = 0; r < kBatch; ++r) {
      x_var += std::pow(x[r * kFeatures + f] - x_mean, 2);
      y_var += std::pow(y[r * kFeatures + f] - y_mean, 2);
    }
    x_var /= kBatch;
    y_var /= kBatch;
    // Float outputs of magnitude <= ~3: errors of a few 1e-7.
    EXPECT_NEAR(y_mean, 0.0, 1e-6) << "feature " << f;
    EXPECT_NEAR(y_var, x_var / (x_var + kEps), 1e-6) << "feature " << f;
    EXPECT_NEAR(y_var, 1.0, 1e-4) << "feature " << f;  // eps / var < 1e-4 here
  }
  std::vector<float> in_place = x;
  BatchNormForward(in_place.data(), kBatch, kFeatures, 1, m.mean.data(), m.invstd.data(),
                   ones.data(), zeros.data(), in_place.data());
  EXPECT_EQ(in_place, y);
}

// A feature whose rows are all equal has variance 0 (never negative): invstd = 1/sqrt(eps) and
// y = beta.
TEST(BatchNormTest, ConstantFeatureGivesBeta) {
  constexpr int64_t kBatch = 3, kFeatures = 2;
  const std::vector<float> x = {0.1f, -7.0f, 0.1f, 2.0f, 0.1f, 5.0f};
  const Moments m = ComputeMoments(x.data(), kBatch, kFeatures, 1e-3);
  EXPECT_EQ(m.mean[0], 0.1f);
  EXPECT_FLOAT_EQ(m.invstd[0], static_cast<float>(1.0 / std::sqrt(1e-3)));
  const std::vector<float> gamma = {2.0f, 1.0f}, beta = {0.25f, 0.0f};
  std::vector<float> y(x.size());
  BatchNormForward(x.data(), kBatch, kFeatures, 1, m.mean.data(), m.invstd.data(), gamma.data(),
                   beta.data(), y.data());
  for (int64_t r = 0; r < kBatch; ++r) EXPECT_EQ(y[r * kFeatures], 0.25f) << r;
}

// (b) dx, dgamma and dbeta of loss = Σ w ⊙ y (so dy = w) against central differences of the
// double-precision reference. The differences (step 1e-5 in double) are accurate to ~1e-9; the
// kernels round mean and invstd to float (relative 6e-8), so their gradients (of magnitude <= ~10
// here) are within a few 1e-6: atol 1e-5 + rtol 1e-4 holds with margin.
TEST(BatchNormTest, GradientsMatchFiniteDifferences) {
  constexpr int64_t kBatch = 6, kFeatures = 4;
  constexpr double kEps = 1e-3, kStep = 1e-5, kAtol = 1e-5, kRtol = 1e-4;
  Rng rng(DeriveSeed(103));
  const auto x = RandomVector(rng, kBatch * kFeatures, -2.0, 3.0);
  const auto gamma = RandomVector(rng, kFeatures, -2.0, 2.0);
  const auto beta = RandomVector(rng, kFeatures);
  const auto w = RandomVector(rng, kBatch * kFeatures);

  // The kernels: a whole training step of one rank.
  const Moments m = ComputeMoments(x.data(), kBatch, kFeatures, kEps);
  std::vector<float> y(x.size());
  BatchNormForward(x.data(), kBatch, kFeatures, 1, m.mean.data(), m.invstd.data(), gamma.data(),
                   beta.data(), y.data());
  std::vector<double> sums(2 * kFeatures);
  BatchNormBackwardSums(w.data(), x.data(), m.mean.data(), m.invstd.data(), kBatch, kFeatures, 1,
                        sums.data());
  const std::vector<float> dbeta(sums.begin(), sums.begin() + kFeatures);
  const std::vector<float> dgamma(sums.begin() + kFeatures, sums.end());
  std::vector<float> dx(x.size());
  BatchNormBackwardInput(w.data(), x.data(), m.mean.data(), m.invstd.data(), gamma.data(),
                         sums.data(), kBatch, kBatch, kFeatures, 1, dx.data());

  // The reference and its finite differences.
  std::vector<double> xd = ToDouble(x), gd = ToDouble(gamma), bd = ToDouble(beta);
  ExpectAllNear(y, ReferenceForward(xd, kBatch, kFeatures, gd, bd, kEps), 1e-5, 1e-5, "y");
  auto loss = [&] {
    const std::vector<double> yd = ReferenceForward(xd, kBatch, kFeatures, gd, bd, kEps);
    double total = 0;
    for (size_t i = 0; i < yd.size(); ++i) total += w[i] * yd[i];
    return total;
  };
  auto numeric = [&](std::vector<double>* values) {
    std::vector<double> grad(values->size());
    for (size_t i = 0; i < values->size(); ++i) {
      const double saved = (*values)[i];
      (*values)[i] = saved + kStep;
      const double plus = loss();
      (*values)[i] = saved - kStep;
      const double minus = loss();
      (*values)[i] = saved;
      grad[i] = (plus - minus) / (2 * kStep);
    }
    return grad;
  };
  ExpectAllNear(dx, numeric(&xd), kAtol, kRtol, "dx");
  ExpectAllNear(dgamma, numeric(&gd), kAtol, kRtol, "dgamma");
  ExpectAllNear(dbeta, numeric(&bd), kAtol, kRtol, "dbeta");
}

// (c) SyncBatchNorm: the 13 rows split between two ranks (5 + 8, and 0 + 13). Each rank sums its
// rows, the sums are added (the all-reduce), and every rank's mean, invstd and dx rows equal the
// whole batch's. Only the double summation order differs (relative ~13 · 2^-53 ≈ 1e-15), so the
// float results agree to their last rounding: within 1 ulp (1.2e-7 relative); rtol 1e-6 leaves
// margin. With an empty part, adding its zero sums is exact: the same bits.
TEST(BatchNormTest, SyncBatchNormPartsMatchWholeBatch) {
  constexpr int64_t kBatch = 13, kFeatures = 6;
  constexpr double kEps = kBatchNormDefaultEps, kRtol = 1e-6, kAtol = 1e-12;
  Rng rng(DeriveSeed(104));
  const auto x = RandomVector(rng, kBatch * kFeatures, -1.0, 2.0);
  const auto dy = RandomVector(rng, kBatch * kFeatures);
  const auto gamma = RandomVector(rng, kFeatures, 0.5, 1.5);

  // The whole batch on one rank.
  const Moments whole = ComputeMoments(x.data(), kBatch, kFeatures, kEps);
  std::vector<double> whole_backward(2 * kFeatures);
  BatchNormBackwardSums(dy.data(), x.data(), whole.mean.data(), whole.invstd.data(), kBatch,
                        kFeatures, 1, whole_backward.data());
  std::vector<float> whole_dx(x.size());
  BatchNormBackwardInput(dy.data(), x.data(), whole.mean.data(), whole.invstd.data(), gamma.data(),
                         whole_backward.data(), kBatch, kBatch, kFeatures, 1, whole_dx.data());

  for (const int64_t split : {int64_t{5}, int64_t{0}, int64_t{13}}) {
    SCOPED_TRACE(testing::Message() << "rows [0, " << split << ") and [" << split << ", 13)");
    const int64_t rows[2] = {split, kBatch - split};
    const float* x_part[2] = {x.data(), x.data() + split * kFeatures};
    const float* dy_part[2] = {dy.data(), dy.data() + split * kFeatures};
    const bool exact = split == 0 || split == kBatch;

    // Forward statistics: local sums, all-reduce, moments.
    std::vector<double> local[2], global(2 * kFeatures, 0.0);
    for (int k = 0; k < 2; ++k) {
      local[k].assign(2 * kFeatures, -1.0);
      BatchNormSums(x_part[k], rows[k], kFeatures, 1, local[k].data());
      for (int64_t i = 0; i < 2 * kFeatures; ++i) global[i] += local[k][i];
    }
    std::vector<float> mean(kFeatures), invstd(kFeatures);
    BatchNormMoments(global.data(), kBatch, kFeatures, kEps, mean.data(), invstd.data());
    if (exact) {
      EXPECT_EQ(mean, whole.mean);
      EXPECT_EQ(invstd, whole.invstd);
    }
    ExpectAllNear(mean, ToDouble(whole.mean), kAtol, kRtol, "mean");
    ExpectAllNear(invstd, ToDouble(whole.invstd), kAtol, kRtol, "invstd");

    // Backward: local sums with the global statistics, all-reduce, each part's dx.
    std::vector<double> global_backward(2 * kFeatures, 0.0);
    for (int k = 0; k < 2; ++k) {
      BatchNormBackwardSums(dy_part[k], x_part[k], mean.data(), invstd.data(), rows[k], kFeatures,
                            1, local[k].data());
      for (int64_t i = 0; i < 2 * kFeatures; ++i) global_backward[i] += local[k][i];
    }
    std::vector<float> dx(x.size(), -99.0f);
    for (int k = 0; k < 2; ++k) {
      float* dx_part = dx.data() + (k == 0 ? 0 : split * kFeatures);
      BatchNormBackwardInput(dy_part[k], x_part[k], mean.data(), invstd.data(), gamma.data(),
                             global_backward.data(), kBatch, rows[k], kFeatures, 1, dx_part);
    }
    if (exact) {
      EXPECT_EQ(dx, whole_dx);
    }
    ExpectAllNear(dx, ToDouble(whole_dx), kAtol, kRtol, "dx");
  }
}

// dx computed in place over dy, and over x, equals the out-of-place result.
TEST(BatchNormTest, BackwardInputInPlace) {
  constexpr int64_t kBatch = 9, kFeatures = 70;  // more features than one chunk of the CPU loop
  Rng rng(DeriveSeed(105));
  const auto x = RandomVector(rng, kBatch * kFeatures, -1.0, 2.0);
  const auto dy = RandomVector(rng, kBatch * kFeatures);
  const auto gamma = RandomVector(rng, kFeatures, 0.5, 1.5);
  const Moments m = ComputeMoments(x.data(), kBatch, kFeatures, kBatchNormDefaultEps);
  std::vector<double> sums(2 * kFeatures);
  BatchNormBackwardSums(dy.data(), x.data(), m.mean.data(), m.invstd.data(), kBatch, kFeatures, 1,
                        sums.data());
  std::vector<float> dx(x.size());
  BatchNormBackwardInput(dy.data(), x.data(), m.mean.data(), m.invstd.data(), gamma.data(),
                         sums.data(), kBatch, kBatch, kFeatures, 1, dx.data());
  std::vector<float> over_dy = dy, over_x = x;
  BatchNormBackwardInput(over_dy.data(), x.data(), m.mean.data(), m.invstd.data(), gamma.data(),
                         sums.data(), kBatch, kBatch, kFeatures, 1, over_dy.data());
  BatchNormBackwardInput(dy.data(), over_x.data(), m.mean.data(), m.invstd.data(), gamma.data(),
                         sums.data(), kBatch, kBatch, kFeatures, 1, over_x.data());
  EXPECT_EQ(over_dy, dx);
  EXPECT_EQ(over_x, dx);
}

// (d) Running statistics against a hand computation, momentum 0.1:
//   feature 0: rows 1, 2, 3, 4: mean 2.5, unbiased var 5/3
//   feature 1: rows 0, 0, 2, 2: mean 1,   unbiased var 4/3
TEST(BatchNormTest, RunningStatisticsMatchHandComputation) {
  const std::vector<float> x = {1, 0, 2, 0, 3, 2, 4, 2};
  std::vector<double> sums(4);
  BatchNormSums(x.data(), 4, 2, 1, sums.data());
  std::vector<float> running_mean = {0.5f, -1.0f}, running_var = {2.0f, 0.25f};
  BatchNormUpdateRunning(sums.data(), 4, 2, 0.1, running_mean.data(), running_var.data());
  // Float results of double computations: within 1 ulp.
  ExpectAllNear(running_mean, Doubles{0.9 * 0.5 + 0.1 * 2.5, 0.9 * -1.0 + 0.1 * 1.0}, 0, 1e-7,
                "mean");
  ExpectAllNear(running_var, Doubles{0.9 * 2.0 + 0.1 * 5.0 / 3.0, 0.9 * 0.25 + 0.1 * 4.0 / 3.0}, 0,
                1e-7, "var");

  // One row: the biased variance (0), not a division by zero.
  const std::vector<float> row = {3.0f, -2.0f};
  BatchNormSums(row.data(), 1, 2, 1, sums.data());
  running_mean = {0.5f, -1.0f};
  running_var = {2.0f, 0.25f};
  BatchNormUpdateRunning(sums.data(), 1, 2, 0.1, running_mean.data(), running_var.data());
  ExpectAllNear(running_mean, Doubles{0.9 * 0.5 + 0.1 * 3.0, 0.9 * -1.0 + 0.1 * -2.0}, 0, 1e-7,
                "mean");
  ExpectAllNear(running_var, Doubles{0.9 * 2.0, 0.9 * 0.25}, 0, 1e-7, "var");

  // Evaluation: invstd from the running variance, in place.
  std::vector<float> invstd = {0.75f, 0.0f};
  BatchNormInvStd(invstd.data(), 2, 0.25, invstd.data());
  ExpectAllNear(invstd, Doubles{1.0, 2.0}, 0, 0, "invstd");
}

// (e) A rank with no rows: both kinds of sums are zeros (overwritten, not left stale), and the
// element-wise steps write nothing.
TEST(BatchNormTest, EmptyBatch) {
  constexpr int64_t kFeatures = 3;
  const std::vector<float> mean(kFeatures, 0.5f), invstd(kFeatures, 2.0f), gamma(kFeatures, 1.0f);
  std::vector<double> sums(2 * kFeatures, 7.0);
  BatchNormSums(nullptr, 0, kFeatures, 1, sums.data());
  EXPECT_EQ(sums, std::vector<double>(2 * kFeatures, 0.0));
  sums.assign(2 * kFeatures, 7.0);
  BatchNormBackwardSums(nullptr, nullptr, mean.data(), invstd.data(), 0, kFeatures, 1, sums.data());
  EXPECT_EQ(sums, std::vector<double>(2 * kFeatures, 0.0));
  BatchNormForward(nullptr, 0, kFeatures, 1, mean.data(), invstd.data(), gamma.data(), gamma.data(),
                   nullptr);
  BatchNormBackwardInput(nullptr, nullptr, mean.data(), invstd.data(), gamma.data(), sums.data(),
                         /*count=*/5, 0, kFeatures, 1, nullptr);
}

// ---- BatchNorm2d: [batch, features, spatial] -------------------------------------------------

// Every kernel on [batch, features, spatial] data against the same kernels with spatial = 1 on
// the transposed [batch · spatial, features] rows (BatchNorm2d is BatchNorm1d over every pixel).
// Only the double summation order differs (lane sums per plane vs one running sum), so sums agree
// to ~1e-15 relative and every float output to its last rounding (1 ulp, rtol 1e-6 with margin).
TEST(BatchNorm2dTest, EqualsBatchNorm1dOnTransposedData) {
  constexpr double kEps = kBatchNormDefaultEps, kRtol = 1e-6, kAtol = 1e-7;
  for (const auto& [batch, features, spatial] :
       {std::tuple<int64_t, int64_t, int64_t>{3, 4, 5}, {2, 3, 70}, {5, 2, 1}}) {
    SCOPED_TRACE(testing::Message() << batch << " x " << features << " x " << spatial);
    Rng rng(DeriveSeed(106, batch, features * 1000 + spatial));
    const int64_t n = batch * features * spatial, rows = batch * spatial;
    const auto x = RandomVector(rng, n, -2.0, 3.0);
    const auto dy = RandomVector(rng, n);
    const auto gamma = RandomVector(rng, features, 0.5, 1.5);
    const auto beta = RandomVector(rng, features);
    // xt[r · spatial + s, f] = x[r, f, s].
    auto transpose = [&](const std::vector<float>& v) {
      std::vector<float> t(v.size());
      for (int64_t r = 0; r < batch; ++r) {
        for (int64_t f = 0; f < features; ++f) {
          for (int64_t s = 0; s < spatial; ++s) {
            t[(r * spatial + s) * features + f] = v[(r * features + f) * spatial + s];
          }
        }
      }
      return t;
    };
    const std::vector<float> xt = transpose(x), dyt = transpose(dy);

    struct Step {
      Moments m;
      std::vector<float> y, dx;
      std::vector<double> bsums;
    };
    auto run = [&](const std::vector<float>& xs, const std::vector<float>& dys, int64_t b,
                   int64_t sp) {
      Step st{ComputeMoments(xs.data(), b, features, kEps, sp), {}, {}, {}};
      st.y.assign(xs.size(), -99.0f);
      st.dx.assign(xs.size(), -99.0f);
      st.bsums.assign(2 * features, -1.0);
      BatchNormForward(xs.data(), b, features, sp, st.m.mean.data(), st.m.invstd.data(),
                       gamma.data(), beta.data(), st.y.data());
      BatchNormBackwardSums(dys.data(), xs.data(), st.m.mean.data(), st.m.invstd.data(), b,
                            features, sp, st.bsums.data());
      BatchNormBackwardInput(dys.data(), xs.data(), st.m.mean.data(), st.m.invstd.data(),
                             gamma.data(), st.bsums.data(), b * sp, b, features, sp, st.dx.data());
      return st;
    };
    const Step planar = run(x, dy, batch, spatial);
    const Step rowwise = run(xt, dyt, rows, 1);
    for (size_t i = 0; i < planar.m.sums.size(); ++i) {
      EXPECT_NEAR(planar.m.sums[i], rowwise.m.sums[i], 1e-13 * (1 + std::abs(rowwise.m.sums[i])));
      EXPECT_NEAR(planar.bsums[i], rowwise.bsums[i], 1e-13 * (1 + std::abs(rowwise.bsums[i])));
    }
    ExpectAllNear(planar.m.mean, ToDouble(rowwise.m.mean), kAtol, kRtol, "mean");
    ExpectAllNear(planar.m.invstd, ToDouble(rowwise.m.invstd), kAtol, kRtol, "invstd");
    ExpectAllNear(transpose(planar.y), ToDouble(rowwise.y), kAtol, kRtol, "y");
    ExpectAllNear(transpose(planar.dx), ToDouble(rowwise.dx), kAtol, kRtol, "dx");
    if (spatial == 1) {  // the same call: the same bits
      EXPECT_EQ(planar.m.sums, rowwise.m.sums);
      EXPECT_EQ(planar.dx, rowwise.dx);
    }
  }
}

// The documented summation order, bit for bit: per (row, feature) plane, 32 strided lanes added
// pairwise as a tree, then the plane totals in row order.
TEST(BatchNorm2dTest, SumsFollowTheDocumentedLaneOrder) {
  constexpr int64_t kBatch = 3, kFeatures = 2, kSpatial = 75;
  Rng rng(DeriveSeed(107));
  const auto x = RandomVector(rng, kBatch * kFeatures * kSpatial, -3.0, 3.0);
  const auto dy = RandomVector(rng, x.size());
  const Moments m = ComputeMoments(x.data(), kBatch, kFeatures, kBatchNormDefaultEps, kSpatial);
  std::vector<double> backward(2 * kFeatures, -1.0);
  BatchNormBackwardSums(dy.data(), x.data(), m.mean.data(), m.invstd.data(), kBatch, kFeatures,
                        kSpatial, backward.data());
  for (int64_t f = 0; f < kFeatures; ++f) {
    double s = 0, ss = 0, sdy = 0, sdyx = 0;
    for (int64_t r = 0; r < kBatch; ++r) {
      double lanes[4][32] = {};
      for (int64_t k = 0; k < kSpatial; ++k) {
        const int64_t i = (r * kFeatures + f) * kSpatial + k;
        const double v = x[i], xhat = (v - m.mean[f]) * m.invstd[f];
        lanes[0][k % 32] += v;
        lanes[1][k % 32] += v * v;
        lanes[2][k % 32] += dy[i];
        lanes[3][k % 32] += dy[i] * xhat;
      }
      for (auto& lane : lanes) {
        for (int o = 16; o > 0; o /= 2) {
          for (int l = 0; l < o; ++l) lane[l] += lane[l + o];
        }
      }
      s += lanes[0][0];
      ss += lanes[1][0];
      sdy += lanes[2][0];
      sdyx += lanes[3][0];
    }
    EXPECT_EQ(m.sums[f], s) << f;
    EXPECT_EQ(m.sums[kFeatures + f], ss) << f;
    EXPECT_EQ(backward[f], sdy) << f;
    EXPECT_EQ(backward[kFeatures + f], sdyx) << f;
  }
}

// With spatial > 1, dx in place over dy and over x equals the out-of-place result, and the
// forward in place equals the out-of-place forward.
TEST(BatchNorm2dTest, InPlace) {
  constexpr int64_t kBatch = 2, kFeatures = 3, kSpatial = 9, kN = kBatch * kFeatures * kSpatial;
  Rng rng(DeriveSeed(108));
  const auto x = RandomVector(rng, kN, -1.0, 2.0);
  const auto dy = RandomVector(rng, kN);
  const auto gamma = RandomVector(rng, kFeatures, 0.5, 1.5);
  const Moments m = ComputeMoments(x.data(), kBatch, kFeatures, kBatchNormDefaultEps, kSpatial);
  std::vector<float> y(kN), in_place = x;
  BatchNormForward(x.data(), kBatch, kFeatures, kSpatial, m.mean.data(), m.invstd.data(),
                   gamma.data(), gamma.data(), y.data());
  BatchNormForward(in_place.data(), kBatch, kFeatures, kSpatial, m.mean.data(), m.invstd.data(),
                   gamma.data(), gamma.data(), in_place.data());
  EXPECT_EQ(in_place, y);
  std::vector<double> sums(2 * kFeatures);
  BatchNormBackwardSums(dy.data(), x.data(), m.mean.data(), m.invstd.data(), kBatch, kFeatures,
                        kSpatial, sums.data());
  std::vector<float> dx(kN), over_dy = dy, over_x = x;
  BatchNormBackwardInput(dy.data(), x.data(), m.mean.data(), m.invstd.data(), gamma.data(),
                         sums.data(), kBatch * kSpatial, kBatch, kFeatures, kSpatial, dx.data());
  BatchNormBackwardInput(over_dy.data(), x.data(), m.mean.data(), m.invstd.data(), gamma.data(),
                         sums.data(), kBatch * kSpatial, kBatch, kFeatures, kSpatial,
                         over_dy.data());
  BatchNormBackwardInput(dy.data(), over_x.data(), m.mean.data(), m.invstd.data(), gamma.data(),
                         sums.data(), kBatch * kSpatial, kBatch, kFeatures, kSpatial,
                         over_x.data());
  EXPECT_EQ(over_dy, dx);
  EXPECT_EQ(over_x, dx);
}

}  // namespace
}  // namespace huddle::kernels
