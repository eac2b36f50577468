// Conv2d and pooling kernels against naive loops over the definitions (in double) on seeded
// random inputs: forward, backward, DP-SGD's per-example norms (both the ghost and the direct
// method), max pooling with ties and padding, average pooling counting the padding.
#include "kernels/conv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/pool.h"
#include "tests/kernels/kernel_test_util.h"

namespace huddle::kernels {
namespace {

using test_util::ExpectAllNear;
using test_util::RandomVector;

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-4;

size_t Size(int64_t n) { return static_cast<size_t>(n); }

// Conv2dShape{batch, in, H, W, out, kh, kw, sh, sw, ph, pw}.
Conv2dShape Conv(int64_t batch, int64_t in, int64_t h, int64_t w, int64_t out, int64_t kh,
                 int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  return Conv2dShape{batch, in, h, w, out, kh, kw, sh, sw, ph, pw};
}

std::string Describe(const Conv2dShape& s) {
  return "x[" + std::to_string(s.batch) + "," + std::to_string(s.in_channels) + "," +
         std::to_string(s.height) + "," + std::to_string(s.width) + "] conv " +
         std::to_string(s.out_channels) + " " + std::to_string(s.kernel_h) + "x" +
         std::to_string(s.kernel_w) + " stride " + std::to_string(s.stride_h) + "," +
         std::to_string(s.stride_w) + " pad " + std::to_string(s.pad_h) + "," +
         std::to_string(s.pad_w);
}

// Calls f(i, o, c, oh, ow, ki, kj, x_index, y_index, w_index) for every product of the
// convolution that reads a real (not padding) input element.
template <typename F>
void ForEachProduct(const Conv2dShape& s, F f) {
  const int64_t oh_n = s.out_height(), ow_n = s.out_width();
  for (int64_t i = 0; i < s.batch; ++i) {
    for (int64_t o = 0; o < s.out_channels; ++o) {
      for (int64_t oh = 0; oh < oh_n; ++oh) {
        for (int64_t ow = 0; ow < ow_n; ++ow) {
          const int64_t y_index = ((i * s.out_channels + o) * oh_n + oh) * ow_n + ow;
          for (int64_t c = 0; c < s.in_channels; ++c) {
            for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
              for (int64_t kj = 0; kj < s.kernel_w; ++kj) {
                const int64_t ih = oh * s.stride_h - s.pad_h + ki;
                const int64_t iw = ow * s.stride_w - s.pad_w + kj;
                if (ih < 0 || ih >= s.height || iw < 0 || iw >= s.width) continue;
                const int64_t x_index = ((i * s.in_channels + c) * s.height + ih) * s.width + iw;
                const int64_t w_index =
                    ((o * s.in_channels + c) * s.kernel_h + ki) * s.kernel_w + kj;
                f(i, o, x_index, y_index, w_index);
              }
            }
          }
        }
      }
    }
  }
}

std::vector<double> ReferenceForward(const Conv2dShape& s, const std::vector<float>& x,
                                     const std::vector<float>& w, const std::vector<float>& bias) {
  std::vector<double> y(Size(s.batch * s.out_channels * s.out_height() * s.out_width()));
  const int64_t positions = s.out_height() * s.out_width();
  for (size_t k = 0; k < y.size(); ++k) y[k] = bias[(k / Size(positions)) % Size(s.out_channels)];
  ForEachProduct(s, [&](int64_t, int64_t, int64_t xi, int64_t yi, int64_t wi) {
    y[Size(yi)] += double{x[Size(xi)]} * w[Size(wi)];
  });
  return y;
}

struct ReferenceGrads {
  std::vector<double> dw, dbias, dx;
};

ReferenceGrads ReferenceBackward(const Conv2dShape& s, const std::vector<float>& x,
                                 const std::vector<float>& w, const std::vector<float>& dy) {
  ReferenceGrads g;
  g.dw.assign(w.size(), 0.0);
  g.dbias.assign(Size(s.out_channels), 0.0);
  g.dx.assign(x.size(), 0.0);
  const int64_t positions = s.out_height() * s.out_width();
  for (size_t k = 0; k < dy.size(); ++k)
    g.dbias[(k / Size(positions)) % Size(s.out_channels)] += dy[k];
  ForEachProduct(s, [&](int64_t, int64_t, int64_t xi, int64_t yi, int64_t wi) {
    g.dw[Size(wi)] += double{dy[Size(yi)]} * x[Size(xi)];
    g.dx[Size(xi)] += double{dy[Size(yi)]} * w[Size(wi)];
  });
  return g;
}

// Scratch that holds garbage: the kernels must not rely on its contents.
std::vector<float> Scratch(const Conv2dShape& s) {
  return std::vector<float>(Size(Conv2dScratchFloats(s)), std::numeric_limits<float>::quiet_NaN());
}

class Conv2dTest : public ::testing::TestWithParam<Conv2dShape> {};

TEST_P(Conv2dTest, ForwardMatchesDirectLoops) {
  const Conv2dShape s = GetParam();
  Rng rng(DeriveSeed(1, s.batch * 100 + s.in_channels, s.height * 100 + s.width));
  const auto x = RandomVector(rng, s.batch * s.in_channels * s.height * s.width);
  const auto w = RandomVector(rng, s.out_channels * s.in_channels * s.kernel_h * s.kernel_w);
  const auto bias = RandomVector(rng, s.out_channels);
  std::vector<float> y(Size(s.batch * s.out_channels * s.out_height() * s.out_width()), -99.0f);
  auto scratch = Scratch(s);
  Conv2dForward(s, x.data(), w.data(), bias.data(), y.data(), scratch.data());
  ExpectAllNear(y, ReferenceForward(s, x, w, bias), kAtol, kRtol, Describe(s) + " y");
}

TEST_P(Conv2dTest, BackwardMatchesDirectLoops) {
  const Conv2dShape s = GetParam();
  Rng rng(DeriveSeed(2, s.batch * 100 + s.in_channels, s.height * 100 + s.width));
  const auto x = RandomVector(rng, s.batch * s.in_channels * s.height * s.width);
  const auto w = RandomVector(rng, s.out_channels * s.in_channels * s.kernel_h * s.kernel_w);
  const auto dy = RandomVector(rng, s.batch * s.out_channels * s.out_height() * s.out_width());
  // Stale values in the outputs prove they are overwritten, not accumulated.
  std::vector<float> dw(w.size(), 7.0f), dbias(Size(s.out_channels), 7.0f), dx(x.size(), 7.0f);
  auto scratch = Scratch(s);
  Conv2dBackward(s, x.data(), w.data(), dy.data(), dw.data(), dbias.data(), dx.data(),
                 scratch.data());
  const ReferenceGrads ref = ReferenceBackward(s, x, w, dy);
  const std::string what = Describe(s);
  ExpectAllNear(dw, ref.dw, 1e-4, kRtol, what + " dw");
  ExpectAllNear(dbias, ref.dbias, 1e-4, kRtol, what + " dbias");
  ExpectAllNear(dx, ref.dx, 1e-4, kRtol, what + " dx");

  // Without dx (a first layer): the same weight gradients.
  std::vector<float> dw2(w.size(), 7.0f), dbias2(Size(s.out_channels), 7.0f);
  Conv2dBackward(s, x.data(), w.data(), dy.data(), dw2.data(), dbias2.data(), nullptr,
                 scratch.data());
  EXPECT_EQ(dw2, dw) << what;
  EXPECT_EQ(dbias2, dbias) << what;
}

// Σ over examples of the squared norms of each example's own gradient, from the reference
// backward pass on that example alone.
TEST_P(Conv2dTest, SquaredNormsMatchPerExampleGradients) {
  const Conv2dShape s = GetParam();
  Rng rng(DeriveSeed(3, s.batch * 100 + s.in_channels, s.height * 100 + s.width));
  const int64_t x_size = s.in_channels * s.height * s.width;
  const int64_t y_size = s.out_channels * s.out_height() * s.out_width();
  const auto x = RandomVector(rng, s.batch * x_size);
  const auto dy = RandomVector(rng, s.batch * y_size);
  const std::vector<float> w(Size(s.out_channels * s.in_channels * s.kernel_h * s.kernel_w));
  std::vector<double> norms(Size(s.batch), 0.5);  // added to
  auto scratch = Scratch(s);
  AddConv2dSquaredNorms(s, x.data(), dy.data(), norms.data(), scratch.data());
  Conv2dShape one = s;
  one.batch = 1;
  std::vector<double> expected(Size(s.batch));
  for (int64_t i = 0; i < s.batch; ++i) {
    const std::vector<float> x_i(x.begin() + i * x_size, x.begin() + (i + 1) * x_size);
    const std::vector<float> dy_i(dy.begin() + i * y_size, dy.begin() + (i + 1) * y_size);
    const ReferenceGrads g = ReferenceBackward(one, x_i, w, dy_i);
    double sum = 0.5;
    for (double v : g.dw) sum += v * v;
    for (double v : g.dbias) sum += v * v;
    expected[Size(i)] = sum;
  }
  for (int64_t i = 0; i < s.batch; ++i) {
    EXPECT_NEAR(norms[Size(i)], expected[Size(i)], 1e-4 * expected[Size(i)])
        << Describe(s) << " example " << i
        << (Conv2dUsesGhostNorm(s) ? " (ghost norm)" : " (direct)");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Conv2dTest,
    ::testing::Values(Conv(1, 1, 5, 5, 2, 3, 3, 1, 1, 0, 0),   // plain 3x3, batch 1
                      Conv(3, 2, 7, 6, 4, 3, 2, 2, 1, 1, 0),   // non-square, stride 2, padding
                      Conv(3, 3, 5, 4, 5, 1, 1, 1, 1, 0, 0),   // 1x1: no unfolding
                      Conv(2, 2, 6, 5, 3, 1, 1, 2, 2, 1, 1),   // 1x1 with stride and padding
                      Conv(3, 1, 9, 9, 2, 5, 5, 1, 1, 2, 2),   // MNIST-like 5x5, pad 2
                      Conv(1, 2, 5, 7, 3, 3, 3, 3, 2, 1, 2),   // stride 3x2, pad wider than half
                      Conv(3, 8, 5, 5, 16, 3, 3, 2, 2, 1, 1),  // ghost norm (P = 9)
                      Conv(2, 6, 4, 4, 12, 3, 3, 1, 1, 0, 0)   // ghost norm, 1x1... P = 4
                      ));

TEST(Conv2dNormMethodTest, TestedShapesCoverBothMethods) {
  EXPECT_TRUE(Conv2dUsesGhostNorm(Conv(3, 8, 5, 5, 16, 3, 3, 2, 2, 1, 1)));
  EXPECT_TRUE(Conv2dUsesGhostNorm(Conv(2, 6, 4, 4, 12, 3, 3, 1, 1, 0, 0)));
  EXPECT_FALSE(Conv2dUsesGhostNorm(Conv(3, 1, 9, 9, 2, 5, 5, 1, 1, 2, 2)));
  EXPECT_FALSE(Conv2dUsesGhostNorm(Conv(3, 2, 7, 6, 4, 3, 2, 2, 1, 1, 0)));
  // MNIST CNN layers: large P, direct; a deep layer on a 4x4 map, ghost.
  EXPECT_FALSE(Conv2dUsesGhostNorm(Conv(64, 1, 28, 28, 32, 5, 5, 1, 1, 2, 2)));
  EXPECT_FALSE(Conv2dUsesGhostNorm(Conv(64, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2)));
  EXPECT_TRUE(Conv2dUsesGhostNorm(Conv(64, 128, 4, 4, 128, 3, 3, 1, 1, 1, 1)));
}

TEST(Conv2dScratchTest, CoversOneExampleAndStaysBounded) {
  for (const Conv2dShape& s :
       {Conv(64, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2), Conv(2, 1, 5, 5, 1, 3, 3, 1, 1, 1, 1),
        Conv(3, 256, 64, 64, 64, 3, 3, 1, 1, 1, 1)}) {
    const int64_t k = s.in_channels * s.kernel_h * s.kernel_w, p = s.out_height() * s.out_width();
    const int64_t examples = Conv2dScratchExamples(s);
    EXPECT_GE(examples, 1) << Describe(s);
    EXPECT_LE(examples, s.batch) << Describe(s);
    EXPECT_EQ(Conv2dScratchFloats(s), examples * Conv2dScratchFloatsPerExample(s)) << Describe(s);
    EXPECT_GE(Conv2dScratchFloatsPerExample(s), k * p + s.out_channels * p) << Describe(s);
    EXPECT_TRUE(Conv2dScratchFloats(s) <= (int64_t{1} << 22) || examples == 1) << Describe(s);
  }
}

// ---- Pooling ----------------------------------------------------------------------------------

// Pool2dShape{batch, channels, H, W, kh, kw, sh, sw, ph, pw}.
Pool2dShape Pool(int64_t batch, int64_t channels, int64_t h, int64_t w, int64_t kh, int64_t kw,
                 int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  return Pool2dShape{batch, channels, h, w, kh, kw, sh, sw, ph, pw};
}

int64_t OutputSize(const Pool2dShape& s) {
  return s.batch * s.channels * s.out_height() * s.out_width();
}

// Calls f(output index, input index or -1 for padding) for every window cell, in row-major
// window order.
template <typename F>
void ForEachWindowCell(const Pool2dShape& s, F f) {
  const int64_t oh_n = s.out_height(), ow_n = s.out_width();
  for (int64_t plane = 0; plane < s.batch * s.channels; ++plane) {
    for (int64_t oh = 0; oh < oh_n; ++oh) {
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        const int64_t o = (plane * oh_n + oh) * ow_n + ow;
        for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
          for (int64_t kj = 0; kj < s.kernel_w; ++kj) {
            const int64_t h = oh * s.stride_h - s.pad_h + ki, w = ow * s.stride_w - s.pad_w + kj;
            const bool inside = h >= 0 && h < s.height && w >= 0 && w < s.width;
            f(o, inside ? (plane * s.height + h) * s.width + w : -1);
          }
        }
      }
    }
  }
}

class Pool2dTest : public ::testing::TestWithParam<Pool2dShape> {};

TEST_P(Pool2dTest, MaxForwardAndBackwardMatchLoops) {
  const Pool2dShape s = GetParam();
  Rng rng(DeriveSeed(4, s.height, s.width * 10 + s.kernel_h));
  // Values from {-2, -1, 0}: many ties, and windows over padding whose maximum is negative.
  std::vector<float> x(Size(s.batch * s.channels * s.height * s.width));
  for (float& v : x) v = -static_cast<float>(rng.UniformInt(3));
  const auto dy = RandomVector(rng, OutputSize(s));
  std::vector<double> y_ref(Size(OutputSize(s)), -INFINITY), dx_ref(x.size(), 0.0);
  std::vector<int64_t> arg_ref(y_ref.size(), -1);
  ForEachWindowCell(s, [&](int64_t o, int64_t i) {
    if (i >= 0 && x[Size(i)] > y_ref[Size(o)]) {
      y_ref[Size(o)] = x[Size(i)];
      arg_ref[Size(o)] = i;
    }
  });
  const int64_t plane = s.height * s.width;
  for (size_t o = 0; o < y_ref.size(); ++o) dx_ref[Size(arg_ref[o])] += dy[o];

  std::vector<float> y(y_ref.size(), 9.0f), dx(x.size(), 9.0f);
  std::vector<int32_t> argmax(y_ref.size(), -7);
  MaxPool2dForward(s, x.data(), y.data(), argmax.data());
  for (size_t o = 0; o < y.size(); ++o) {
    ASSERT_EQ(y[o], y_ref[o]) << "output " << o;
    ASSERT_EQ(argmax[o], arg_ref[o] % plane) << "output " << o;
  }
  MaxPool2dBackward(s, dy.data(), argmax.data(), dx.data());
  ExpectAllNear(dx, dx_ref, kAtol, kRtol, "max pool dx");
}

TEST_P(Pool2dTest, AvgForwardAndBackwardMatchLoops) {
  const Pool2dShape s = GetParam();
  Rng rng(DeriveSeed(5, s.height, s.width * 10 + s.kernel_h));
  const auto x = RandomVector(rng, s.batch * s.channels * s.height * s.width);
  const auto dy = RandomVector(rng, OutputSize(s));
  const double count = static_cast<double>(s.kernel_h * s.kernel_w);
  std::vector<double> y_ref(Size(OutputSize(s)), 0.0), dx_ref(x.size(), 0.0);
  ForEachWindowCell(s, [&](int64_t o, int64_t i) {
    if (i < 0) return;  // padding: a zero, still counted in the divisor
    y_ref[Size(o)] += x[Size(i)] / count;
    dx_ref[Size(i)] += dy[Size(o)] / count;
  });
  std::vector<float> y(y_ref.size(), 9.0f), dx(x.size(), 9.0f);
  AvgPool2dForward(s, x.data(), y.data());
  AvgPool2dBackward(s, dy.data(), dx.data());
  ExpectAllNear(y, y_ref, kAtol, kRtol, "avg pool y");
  ExpectAllNear(dx, dx_ref, kAtol, kRtol, "avg pool dx");
}

INSTANTIATE_TEST_SUITE_P(Shapes, Pool2dTest,
                         ::testing::Values(Pool(2, 3, 6, 6, 2, 2, 2, 2, 0, 0),  // the usual 2x2
                                           Pool(2, 2, 7, 5, 2, 2, 2, 2, 0, 0),  // on odd sizes
                                           Pool(1, 2, 5, 7, 3, 3, 2, 2, 1, 1),  // overlap, pad
                                           Pool(2, 1, 4, 5, 3, 2, 1, 2, 1, 1),  // non-square
                                           Pool(1, 1, 7, 7, 3, 3, 3, 3, 0, 0)   // floor drops
                                           ));

// A hand-worked case: padding (PyTorch's -inf) never wins over negative inputs, ties go to the
// first cell in row-major order, and overlapping windows add their gradients.
TEST(MaxPool2dTest, NegativeInputsTiesAndOverlap) {
  const Pool2dShape s = Pool(1, 1, 2, 2, 2, 2, 1, 1, 1, 1);  // 3x3 output
  const std::vector<float> x = {-3, -1,                      //
                                -1, -4};
  std::vector<float> y(9);
  std::vector<int32_t> argmax(9);
  MaxPool2dForward(s, x.data(), y.data(), argmax.data());
  EXPECT_EQ(y, (std::vector<float>{-3, -1, -1, -1, -1, -1, -1, -1, -4}));
  EXPECT_EQ(argmax, (std::vector<int32_t>{0, 1, 1, 2, 1, 1, 2, 2, 3}));
  std::vector<float> dx(4);
  MaxPool2dBackward(s, std::vector<float>(9, 1.0f).data(), argmax.data(), dx.data());
  EXPECT_EQ(dx, (std::vector<float>{1, 4, 3, 1}));
}

// A NaN counts as larger than any number (PyTorch's rule), the first NaN of a window winning;
// infinities of both signs in one window are no NaN.
TEST(MaxPool2dTest, NanWinsAndInfinitiesDoNot) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = INFINITY;
  const Pool2dShape s = Pool(1, 1, 2, 6, 2, 2, 2, 2, 0, 0);  // three 2x2 windows
  const std::vector<float> x = {1,   nan, -inf, inf,  5, 6,  //
                                nan, 3,   2,    -inf, 7, nan};
  std::vector<float> y(3);
  std::vector<int32_t> argmax(3);
  MaxPool2dForward(s, x.data(), y.data(), argmax.data());
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(argmax[0], 1);
  EXPECT_EQ(y[1], inf);
  EXPECT_EQ(argmax[1], 3);
  EXPECT_TRUE(std::isnan(y[2]));
  EXPECT_EQ(argmax[2], 11);
}

TEST(AvgPool2dTest, PaddingCountsInTheDivisor) {
  const Pool2dShape s = Pool(1, 1, 2, 2, 2, 2, 2, 2, 1, 1);  // 2x2 output, one cell each
  const std::vector<float> x = {4, 8, 12, 16};
  std::vector<float> y(4), dx(4);
  AvgPool2dForward(s, x.data(), y.data());
  EXPECT_EQ(y, (std::vector<float>{1, 2, 3, 4}));
  AvgPool2dBackward(s, std::vector<float>{4, 4, 4, 4}.data(), dx.data());
  EXPECT_EQ(dx, (std::vector<float>{1, 1, 1, 1}));
}

}  // namespace
}  // namespace huddle::kernels
