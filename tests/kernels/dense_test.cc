// DenseForward/DenseBackward against naive triple-loop references on seeded random inputs.
#include "kernels/dense.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/kernels/kernel_test_util.h"

namespace huddle::kernels {
namespace {

using test_util::ExpectAllNear;
using test_util::RandomVector;

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-4;

// y[b,o] = Σ_i x[b,i] w[o,i] + bias[o], in double.
std::vector<double> ReferenceForward(const DenseShape& s, const std::vector<float>& x,
                                     const std::vector<float>& w, const std::vector<float>& bias) {
  std::vector<double> y(static_cast<size_t>(s.batch * s.out));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t o = 0; o < s.out; ++o) {
      double acc = bias[o];
      for (int64_t i = 0; i < s.in; ++i) acc += double{x[b * s.in + i]} * w[o * s.in + i];
      y[b * s.out + o] = acc;
    }
  }
  return y;
}

struct ReferenceGrads {
  std::vector<double> dw, dbias, dx;
};

ReferenceGrads ReferenceBackward(const DenseShape& s, const std::vector<float>& x,
                                 const std::vector<float>& w, const std::vector<float>& dy) {
  ReferenceGrads g;
  g.dw.assign(static_cast<size_t>(s.out * s.in), 0.0);
  g.dbias.assign(static_cast<size_t>(s.out), 0.0);
  g.dx.assign(static_cast<size_t>(s.batch * s.in), 0.0);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t o = 0; o < s.out; ++o) {
      const double d = dy[b * s.out + o];
      g.dbias[o] += d;
      for (int64_t i = 0; i < s.in; ++i) {
        g.dw[o * s.in + i] += d * x[b * s.in + i];
        g.dx[b * s.in + i] += d * w[o * s.in + i];
      }
    }
  }
  return g;
}

class DenseTest : public ::testing::TestWithParam<DenseShape> {};

TEST_P(DenseTest, ForwardMatchesReference) {
  const DenseShape s = GetParam();
  Rng rng(DeriveSeed(1, s.batch, s.in * 1000 + s.out));
  const auto x = RandomVector(rng, s.batch * s.in);
  const auto w = RandomVector(rng, s.out * s.in);
  const auto bias = RandomVector(rng, s.out);
  std::vector<float> y(static_cast<size_t>(s.batch * s.out), -99.0f);  // must be overwritten
  DenseForward(s, x.data(), w.data(), bias.data(), y.data());
  ExpectAllNear(y, ReferenceForward(s, x, w, bias), kAtol, kRtol, "y");
}

TEST_P(DenseTest, BackwardMatchesReference) {
  const DenseShape s = GetParam();
  Rng rng(DeriveSeed(2, s.batch, s.in * 1000 + s.out));
  const auto x = RandomVector(rng, s.batch * s.in);
  const auto w = RandomVector(rng, s.out * s.in);
  const auto dy = RandomVector(rng, s.batch * s.out);
  // Stale values in the outputs prove they are overwritten, not accumulated.
  std::vector<float> dw(static_cast<size_t>(s.out * s.in), 7.0f);
  std::vector<float> dbias(static_cast<size_t>(s.out), 7.0f);
  std::vector<float> dx(static_cast<size_t>(s.batch * s.in), 7.0f);
  DenseBackward(s, x.data(), w.data(), dy.data(), dw.data(), dbias.data(), dx.data());
  const ReferenceGrads ref = ReferenceBackward(s, x, w, dy);
  ExpectAllNear(dw, ref.dw, kAtol, kRtol, "dw");
  ExpectAllNear(dbias, ref.dbias, kAtol, kRtol, "dbias");
  ExpectAllNear(dx, ref.dx, kAtol, kRtol, "dx");
}

TEST_P(DenseTest, BackwardWithoutInputGradient) {
  const DenseShape s = GetParam();
  Rng rng(DeriveSeed(3, s.batch, s.in * 1000 + s.out));
  const auto x = RandomVector(rng, s.batch * s.in);
  const auto w = RandomVector(rng, s.out * s.in);
  const auto dy = RandomVector(rng, s.batch * s.out);
  std::vector<float> dw(static_cast<size_t>(s.out * s.in));
  std::vector<float> dbias(static_cast<size_t>(s.out));
  DenseBackward(s, x.data(), w.data(), dy.data(), dw.data(), dbias.data(), /*dx=*/nullptr);
  const ReferenceGrads ref = ReferenceBackward(s, x, w, dy);
  ExpectAllNear(dw, ref.dw, kAtol, kRtol, "dw");
  ExpectAllNear(dbias, ref.dbias, kAtol, kRtol, "dbias");
}

// Degenerate sizes, odd sizes that defeat SIMD blocking, and the real MLP's first layer.
INSTANTIATE_TEST_SUITE_P(Shapes, DenseTest,
                         ::testing::Values(DenseShape{1, 1, 1}, DenseShape{1, 7, 3},
                                           DenseShape{5, 1, 4}, DenseShape{3, 5, 1},
                                           DenseShape{17, 33, 9}, DenseShape{32, 784, 128},
                                           DenseShape{29, 128, 10}));

}  // namespace
}  // namespace huddle::kernels
