// The convolution and pooling kernels of the CUDA backend against the CPU reference on seeded
// random inputs (atol + rtol * |ref|; the pooling kernels bit for bit). Labelled `gpu`: every test
// skips itself, saying why, where this build made no CUDA plugin, the plugin does not load, or the
// machine has no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/rng.h"
#include "kernels/backend.h"
#include "kernels/conv.h"
#include "kernels/pool.h"
#include "tests/kernels/gpu_fixture.h"
#include "tests/kernels/kernel_test_util.h"

namespace huddle::kernels {
namespace {

using test_util::RandomVector;

size_t Size(int64_t n) { return static_cast<size_t>(n); }

class ConvParityTest : public test_util::GpuTest {
 protected:
  // Within 1e-4 relative, or 1e-5 of the tensor's largest magnitude (sums of thousands of
  // products rounded in a different order lose that much near zero).
  static void ExpectNear(const std::vector<float>& gpu, const std::vector<float>& cpu,
                         const std::string& what) {
    std::vector<double> ref(cpu.begin(), cpu.end());
    double scale = 1.0;
    for (double v : ref) scale = std::max(scale, std::abs(v));
    test_util::ExpectAllNear(gpu, ref, 1e-5 * scale, 1e-4, what);
  }
};

Conv2dShape Conv(int64_t batch, int64_t in, int64_t h, int64_t w, int64_t out, int64_t kh,
                 int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  return Conv2dShape{batch, in, h, w, out, kh, kw, sh, sw, ph, pw};
}

TEST_F(ConvParityTest, Conv2dForwardBackwardAndNorms) {
  const std::vector<Conv2dShape> shapes = {
      Conv(1, 1, 5, 5, 2, 3, 3, 1, 1, 0, 0),      Conv(3, 2, 7, 6, 4, 3, 2, 2, 1, 1, 0),
      Conv(3, 3, 5, 4, 5, 1, 1, 1, 1, 0, 0),      Conv(2, 2, 6, 5, 3, 1, 1, 2, 2, 1, 1),
      Conv(1, 2, 5, 7, 3, 3, 3, 3, 2, 1, 2),      Conv(3, 8, 5, 5, 16, 3, 3, 2, 2, 1, 1),
      Conv(64, 1, 28, 28, 32, 5, 5, 1, 1, 2, 2),  Conv(64, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2),
      Conv(40, 16, 32, 32, 32, 3, 3, 1, 1, 1, 1),  // several chunks of examples
      Conv(20, 64, 4, 4, 64, 3, 3, 1, 1, 1, 1),    // ghost norm
  };
  for (const Conv2dShape& s : shapes) {
    const std::string what = "shape " + std::to_string(s.batch) + "x" +
                             std::to_string(s.in_channels) + "x" + std::to_string(s.height) + " k" +
                             std::to_string(s.kernel_h);
    Rng rng(DeriveSeed(7, s.batch * 100 + s.in_channels, s.height * 100 + s.kernel_h));
    const auto x = RandomVector(rng, s.batch * s.in_channels * s.height * s.width);
    const auto w = RandomVector(rng, s.out_channels * s.in_channels * s.kernel_h * s.kernel_w);
    const auto bias = RandomVector(rng, s.out_channels);
    const int64_t y_size = s.batch * s.out_channels * s.out_height() * s.out_width();
    const auto dy = RandomVector(rng, y_size);
    std::vector<float> scratch(Size(Conv2dScratchFloats(s)));
    std::vector<float> y(Size(y_size)), dw(w.size()), db(bias.size()), dx(x.size());
    std::vector<double> norms(Size(s.batch), 0.25);
    Conv2dForward(s, x.data(), w.data(), bias.data(), y.data(), scratch.data());
    Conv2dBackward(s, x.data(), w.data(), dy.data(), dw.data(), db.data(), dx.data(),
                   scratch.data());
    AddConv2dSquaredNorms(s, x.data(), dy.data(), norms.data(), scratch.data());

    DeviceBuffer gx = Upload(x), gw = Upload(w), gb = Upload(bias), gdy = Upload(dy);
    DeviceBuffer gscratch = Filled<float>(scratch.size(), 1e30f);
    DeviceBuffer gy = Filled<float>(y.size(), 9), gdw = Filled<float>(dw.size(), 9),
                 gdb = Filled<float>(db.size(), 9), gdx = Filled<float>(dx.size(), 9);
    DeviceBuffer gnorms = Filled<double>(norms.size(), 0.25);
    gpu_->Conv2dForward(s, gx.as<float>(), gw.as<float>(), gb.as<float>(), gy.as<float>(),
                        gscratch.as<float>());
    gpu_->Conv2dBackward(s, gx.as<float>(), gw.as<float>(), gdy.as<float>(), gdw.as<float>(),
                         gdb.as<float>(), gdx.as<float>(), gscratch.as<float>());
    gpu_->AddConv2dSquaredNorms(s, gx.as<float>(), gdy.as<float>(), gnorms.as<double>(),
                                gscratch.as<float>());
    ExpectNear(Download<float>(gy), y, what + " y");
    const std::vector<float> gpu_dw = Download<float>(gdw);
    ExpectNear(gpu_dw, dw, what + " dw");
    ExpectNear(Download<float>(gdb), db, what + " dbias");
    ExpectNear(Download<float>(gdx), dx, what + " dx");
    const std::vector<double> gpu_norms = Download<double>(gnorms);
    for (size_t i = 0; i < norms.size(); ++i) {
      EXPECT_NEAR(gpu_norms[i], norms[i], 1e-4 * norms[i]) << what << " norm " << i;
    }

    // Without dx: the same weight gradients, bit for bit (the GEMMs and sums run in a fixed order).
    gpu_->Conv2dBackward(s, gx.as<float>(), gw.as<float>(), gdy.as<float>(), gdw.as<float>(),
                         gdb.as<float>(), nullptr, gscratch.as<float>());
    EXPECT_EQ(Download<float>(gdw), gpu_dw) << what << " dw (no dx)";
  }
}

TEST_F(ConvParityTest, PoolingMatchesBitForBit) {
  for (const Pool2dShape& s :
       {Pool2dShape{2, 3, 6, 6, 2, 2, 2, 2, 0, 0}, Pool2dShape{1, 2, 5, 7, 3, 3, 2, 2, 1, 1},
        Pool2dShape{2, 1, 4, 5, 3, 2, 1, 2, 1, 1}, Pool2dShape{64, 32, 28, 28, 2, 2, 2, 2, 0, 0}}) {
    Rng rng(DeriveSeed(8, s.height, s.channels));
    std::vector<float> x(Size(s.batch * s.channels * s.height * s.width));
    for (float& v : x) v = static_cast<float>(rng.UniformInt(5)) - 2.0f;  // ties
    const int64_t y_size = s.batch * s.channels * s.out_height() * s.out_width();
    const auto dy = RandomVector(rng, y_size);
    std::vector<float> y(Size(y_size)), avg(Size(y_size)), dx(x.size()), avg_dx(x.size());
    std::vector<int32_t> argmax(Size(y_size));
    MaxPool2dForward(s, x.data(), y.data(), argmax.data());
    MaxPool2dBackward(s, dy.data(), argmax.data(), dx.data());
    AvgPool2dForward(s, x.data(), avg.data());
    AvgPool2dBackward(s, dy.data(), avg_dx.data());

    DeviceBuffer gx = Upload(x), gdy = Upload(dy);
    DeviceBuffer gy = Filled<float>(y.size(), 9), gavg = Filled<float>(avg.size(), 9);
    DeviceBuffer gdx = Filled<float>(dx.size(), 9), gavg_dx = Filled<float>(dx.size(), 9);
    DeviceBuffer gargmax = Filled<int32_t>(argmax.size(), -1);
    gpu_->MaxPool2dForward(s, gx.as<float>(), gy.as<float>(), gargmax.as<int32_t>());
    gpu_->MaxPool2dBackward(s, gdy.as<float>(), gargmax.as<int32_t>(), gdx.as<float>());
    gpu_->AvgPool2dForward(s, gx.as<float>(), gavg.as<float>());
    gpu_->AvgPool2dBackward(s, gdy.as<float>(), gavg_dx.as<float>());
    EXPECT_EQ(Download<float>(gy), y);
    EXPECT_EQ(Download<int32_t>(gargmax), argmax);
    EXPECT_EQ(Download<float>(gdx), dx);
    EXPECT_EQ(Download<float>(gavg), avg);
    EXPECT_EQ(Download<float>(gavg_dx), avg_dx);
  }
}

}  // namespace
}  // namespace huddle::kernels
