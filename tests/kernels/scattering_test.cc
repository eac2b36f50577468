// The scattering transform (kernels/scattering.h) against kymatio's Scattering2D
// (tests/data/scattering_reference.json, made by scripts/make_scattering_reference.sh), and its
// shape and determinism.
#include "kernels/scattering.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

namespace huddle::kernels {
namespace {

// The input scripts/scattering_reference.py builds: channel c of pixel (i, j) is
// sin((0.3 + 0.1 c) i) cos(0.2 j) + 0.01 i j, in float arithmetic.
std::vector<float> Image(int64_t channels, int64_t h, int64_t w) {
  std::vector<float> x;
  for (int64_t c = 0; c < channels; ++c) {
    const auto a = static_cast<float>(0.3 + 0.1 * static_cast<double>(c));
    for (int64_t i = 0; i < h; ++i) {
      for (int64_t j = 0; j < w; ++j) {
        const auto fi = static_cast<float>(i), fj = static_cast<float>(j);
        x.push_back(std::sin(a * fi) * std::cos(0.2f * fj) + 0.01f * fi * fj);
      }
    }
  }
  return x;
}

TEST(ScatteringTest, MatchesKymatio) {
  std::ifstream in(HUDDLE_SCATTERING_REFERENCE);
  ASSERT_TRUE(in) << HUDDLE_SCATTERING_REFERENCE;
  const nlohmann::json ref = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(ref.is_discarded());
  ASSERT_EQ(ref["cases"].size(), 3u);
  for (const nlohmann::json& c : ref["cases"]) {
    const ScatteringShape shape{c["channels"], c["height"], c["width"], c["scales"], c["angles"]};
    SCOPED_TRACE(testing::Message() << shape.channels << "x" << shape.height << "x" << shape.width
                                    << " J" << shape.scales << " L" << shape.angles);
    const ScatteringPlan plan = MakeScatteringPlan(shape);
    ASSERT_EQ(plan.out_h, c["out_h"].get<int64_t>());
    ASSERT_EQ(plan.out_w, c["out_w"].get<int64_t>());
    const int64_t channels = shape.channels * plan.paths, size = plan.out_h * plan.out_w;
    ASSERT_EQ(static_cast<int64_t>(c["sums"].size()), channels);
    // Two copies of the image: the batch dimension must not mix examples.
    std::vector<float> x = Image(shape.channels, shape.height, shape.width);
    x.insert(x.end(), x.begin(), x.end());
    std::vector<float> out(static_cast<size_t>(2 * channels * size), std::nanf(""));
    ScatteringForward(plan, x.data(), 2, out.data());
    for (int64_t k = 0; k < channels; ++k) {
      double sum = 0, weighted = 0;
      for (int64_t p = 0; p < size; ++p) {
        const float v = out[static_cast<size_t>(k * size + p)];
        // (Equal to float rounding: Eigen's GEMM kernels round rows of a block differently; up
        // to 2e-6 relative measured with the AVX-512 variant's 16-wide blocks.)
        ASSERT_NEAR(v, out[static_cast<size_t>((channels + k) * size + p)],
                    5e-6 * (std::abs(v) + 1e-3))
            << "channel " << k;
        sum += v;
        weighted += v * static_cast<double>(p + 1);
      }
      // float32 throughout (kymatio: float32 FFTs); relative 1e-4 of the channel's scale.
      const double want = c["sums"][static_cast<size_t>(k)];
      const double want_weighted = c["weighted_sums"][static_cast<size_t>(k)];
      EXPECT_NEAR(sum, want, 1e-4 * std::abs(want) + 1e-5) << "channel " << k;
      EXPECT_NEAR(weighted, want_weighted, 1e-4 * std::abs(want_weighted) + 1e-4)
          << "channel " << k;
    }
  }
}

TEST(ScatteringTest, PathsAndOutputShape) {
  EXPECT_EQ(ScatteringPaths(2, 8), 81);
  EXPECT_EQ(ScatteringPaths(1, 4), 5);
  EXPECT_EQ(ScatteringPaths(3, 2), 19);
  const ScatteringPlan plan = MakeScatteringPlan({3, 30, 17, 2, 6});
  EXPECT_EQ(plan.paths, 1 + 12 + 36);
  EXPECT_EQ(plan.out_h, 7);  // floor(30 / 4)
  EXPECT_EQ(plan.out_w, 4);  // floor(17 / 4)
}

// A larger grid transforms in smaller chunks (the scratch bound): 20 three-channel images are 60
// signals, more than one chunk here; each image's result is the one it gets alone.
TEST(ScatteringTest, ChunksOfABatchGiveEachImagesOwnTransform) {
  const ScatteringPlan plan = MakeScatteringPlan({3, 64, 48, 3, 4});
  const int64_t in_size = 3 * 64 * 48, out_size = 3 * plan.paths * plan.out_h * plan.out_w;
  std::vector<float> x;
  for (int64_t b = 0; b < 20; ++b) {
    for (int64_t k = 0; k < in_size; ++k) {
      x.push_back(std::sin(0.01f * static_cast<float>(k * (b + 1))));
    }
  }
  std::vector<float> all(static_cast<size_t>(20 * out_size));
  ScatteringForward(plan, x.data(), 20, all.data());
  for (int64_t b : {0, 13, 19}) {
    std::vector<float> one(static_cast<size_t>(out_size));
    ScatteringForward(plan, x.data() + b * in_size, 1, one.data());
    for (int64_t k = 0; k < out_size; ++k) {
      const float v = all[static_cast<size_t>(b * out_size + k)];
      ASSERT_NEAR(v, one[static_cast<size_t>(k)], 1e-5 * (std::abs(v) + 1e-2))
          << "image " << b << ", value " << k;
    }
  }
}

}  // namespace
}  // namespace huddle::kernels
