// Normalisation, tanh and dropout on the CUDA backend against the CPU reference on seeded random
// inputs: bit for bit where the math is shared (batch norm over planes, group norm, tanh's
// gradient, dropout), within a few ulp for tanh itself. Labelled `gpu`: every test skips itself,
// saying why, where this build made no CUDA plugin, the plugin does not load, or the machine has
// no GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include "common/rng.h"
#include "kernels/activation.h"
#include "kernels/backend.h"
#include "kernels/batch_norm.h"
#include "kernels/dropout.h"
#include "kernels/group_norm.h"
#include "tests/kernels/gpu_fixture.h"
#include "tests/kernels/kernel_test_util.h"

namespace huddle::kernels {
namespace {

using test_util::RandomVector;

using NormParityTest = test_util::GpuTest;

// A BatchNorm2d training step's chain, every stage bit for bit (kernels/batch_norm.h's order).
TEST_F(NormParityTest, BatchNorm2dIsTheSameBits) {
  for (const auto& [batch, features, spatial] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 1, 2}, {3, 5, 7}, {16, 8, 196}, {9, 3, 1000}}) {
    SCOPED_TRACE(testing::Message() << batch << " x " << features << " x " << spatial);
    Rng rng(DeriveSeed(400, batch, features * 10000 + spatial));
    const size_t f = static_cast<size_t>(features);
    const int64_t count = batch * spatial;
    const auto x = RandomVector(rng, batch * features * spatial, -3, 5);
    const auto dy = RandomVector(rng, static_cast<int64_t>(x.size()));
    const auto gamma = RandomVector(rng, features, 0.5, 1.5);
    const auto beta = RandomVector(rng, features);
    std::vector<double> sums(2 * f), bsums(2 * f);
    std::vector<float> mean(f), invstd(f), y(x.size()), dx(x.size());
    BatchNormSums(x.data(), batch, features, spatial, sums.data());
    BatchNormMoments(sums.data(), count, features, 1e-5, mean.data(), invstd.data());
    BatchNormForward(x.data(), batch, features, spatial, mean.data(), invstd.data(), gamma.data(),
                     beta.data(), y.data());
    BatchNormBackwardSums(dy.data(), x.data(), mean.data(), invstd.data(), batch, features, spatial,
                          bsums.data());
    BatchNormBackwardInput(dy.data(), x.data(), mean.data(), invstd.data(), gamma.data(),
                           bsums.data(), count, batch, features, spatial, dx.data());

    DeviceBuffer gx = Upload(x), gdy = Upload(dy), ggamma = Upload(gamma), gbeta = Upload(beta);
    DeviceBuffer gsums = Filled(2 * f, -1.0), gbsums = Filled(2 * f, -1.0);
    DeviceBuffer gmean = Filled(f, -1.0f), ginvstd = Filled(f, -1.0f);
    DeviceBuffer gy = Filled(x.size(), -1.0f), gdx = Filled(x.size(), -1.0f);
    gpu_->BatchNormSums(gx.as<float>(), batch, features, spatial, gsums.as<double>());
    gpu_->BatchNormMoments(gsums.as<double>(), count, features, 1e-5, gmean.as<float>(),
                           ginvstd.as<float>());
    gpu_->BatchNormForward(gx.as<float>(), batch, features, spatial, gmean.as<float>(),
                           ginvstd.as<float>(), ggamma.as<float>(), gbeta.as<float>(),
                           gy.as<float>());
    gpu_->BatchNormBackwardSums(gdy.as<float>(), gx.as<float>(), gmean.as<float>(),
                                ginvstd.as<float>(), batch, features, spatial, gbsums.as<double>());
    gpu_->BatchNormBackwardInput(gdy.as<float>(), gx.as<float>(), gmean.as<float>(),
                                 ginvstd.as<float>(), ggamma.as<float>(), gbsums.as<double>(),
                                 count, batch, features, spatial, gdx.as<float>());
    EXPECT_EQ(Download<double>(gsums), sums);
    EXPECT_EQ(Download<float>(gmean), mean);
    EXPECT_EQ(Download<float>(ginvstd), invstd);
    EXPECT_EQ(Download<float>(gy), y);
    EXPECT_EQ(Download<double>(gbsums), bsums);
    EXPECT_EQ(Download<float>(gdx), dx);
  }
}

// Group norm forward, backward (with and without dx, and dx over dy) and per-example norms, bit
// for bit, over groups = 1, = channels and in between, spatial = 1 and > 1.
TEST_F(NormParityTest, GroupNormIsTheSameBits) {
  const GroupNormShape shapes[] = {
      {.batch = 1, .channels = 1, .spatial = 1, .groups = 1},
      {.batch = 5, .channels = 6, .spatial = 1, .groups = 3},
      {.batch = 4, .channels = 8, .spatial = 49, .groups = 1},
      {.batch = 4, .channels = 8, .spatial = 49, .groups = 8},
      {.batch = 9, .channels = 32, .spatial = 256, .groups = 4},
      {.batch = 3, .channels = 12, .spatial = 1000, .groups = 6},
  };
  for (const GroupNormShape& s : shapes) {
    SCOPED_TRACE(testing::Message() << s.batch << " x " << s.channels << " x " << s.spatial
                                    << ", groups " << s.groups);
    Rng rng(DeriveSeed(401, s.batch * s.channels, s.spatial * 100 + s.groups));
    const int64_t n = s.batch * s.channels * s.spatial;
    const size_t c = static_cast<size_t>(s.channels),
                 stats = static_cast<size_t>(s.batch * s.groups);
    const auto x = RandomVector(rng, n, -3, 5);
    const auto dy = RandomVector(rng, n);
    const auto gamma = RandomVector(rng, s.channels, -1.5, 1.5);
    const auto beta = RandomVector(rng, s.channels);
    std::vector<float> y(x.size()), mean(stats), invstd(stats), dgamma(c), dbeta(c), dx(x.size());
    std::vector<double> squared(static_cast<size_t>(s.batch), 0.25);
    GroupNormForward(s, x.data(), gamma.data(), beta.data(), 1e-5, y.data(), mean.data(),
                     invstd.data());
    GroupNormBackward(s, x.data(), dy.data(), gamma.data(), mean.data(), invstd.data(),
                      dgamma.data(), dbeta.data(), dx.data());
    AddGroupNormSquaredNorms(s, x.data(), dy.data(), mean.data(), invstd.data(), squared.data());

    DeviceBuffer gx = Upload(x), gdy = Upload(dy), ggamma = Upload(gamma), gbeta = Upload(beta);
    DeviceBuffer gy = Filled(x.size(), -1.0f), gmean = Filled(stats, -1.0f),
                 ginvstd = Filled(stats, -1.0f), gdgamma = Filled(c, -1.0f),
                 gdbeta = Filled(c, -1.0f), gdx = Filled(x.size(), -1.0f),
                 gsquared = Filled(static_cast<size_t>(s.batch), 0.25);
    gpu_->GroupNormForward(s, gx.as<float>(), ggamma.as<float>(), gbeta.as<float>(), 1e-5,
                           gy.as<float>(), gmean.as<float>(), ginvstd.as<float>());
    gpu_->GroupNormBackward(s, gx.as<float>(), gdy.as<float>(), ggamma.as<float>(),
                            gmean.as<float>(), ginvstd.as<float>(), gdgamma.as<float>(),
                            gdbeta.as<float>(), gdx.as<float>());
    gpu_->AddGroupNormSquaredNorms(s, gx.as<float>(), gdy.as<float>(), gmean.as<float>(),
                                   ginvstd.as<float>(), gsquared.as<double>());
    EXPECT_EQ(Download<float>(gmean), mean);
    EXPECT_EQ(Download<float>(ginvstd), invstd);
    EXPECT_EQ(Download<float>(gy), y);
    EXPECT_EQ(Download<float>(gdgamma), dgamma);
    EXPECT_EQ(Download<float>(gdbeta), dbeta);
    EXPECT_EQ(Download<float>(gdx), dx);
    EXPECT_EQ(Download<double>(gsquared), squared);

    // dx skipped, then dx written over dy.
    DeviceBuffer gdgamma2 = Filled(c, -1.0f), gdbeta2 = Filled(c, -1.0f);
    gpu_->GroupNormBackward(s, gx.as<float>(), gdy.as<float>(), ggamma.as<float>(),
                            gmean.as<float>(), ginvstd.as<float>(), gdgamma2.as<float>(),
                            gdbeta2.as<float>(), nullptr);
    EXPECT_EQ(Download<float>(gdgamma2), dgamma);
    EXPECT_EQ(Download<float>(gdbeta2), dbeta);
    gpu_->GroupNormBackward(s, gx.as<float>(), gdy.as<float>(), ggamma.as<float>(),
                            gmean.as<float>(), ginvstd.as<float>(), gdgamma2.as<float>(),
                            gdbeta2.as<float>(), gdy.as<float>());
    EXPECT_EQ(Download<float>(gdy), dx);
  }
}

// Tanh within a few ulp (the two libraries' tanhf), its gradient and dropout bit for bit.
TEST_F(NormParityTest, TanhAndDropout) {
  for (const int64_t n : {int64_t{1}, int64_t{1000}, int64_t{300007}}) {
    SCOPED_TRACE(testing::Message() << "n " << n);
    Rng rng(DeriveSeed(402, static_cast<uint64_t>(n)));
    std::vector<float> y = RandomVector(rng, n, -6, 6), dy = RandomVector(rng, n);
    DeviceBuffer gy = Upload(y), gdy = Upload(dy);
    TanhForward(y.data(), n);
    gpu_->TanhForward(gy.as<float>(), n);
    const std::vector<float> got = Download<float>(gy);
    std::vector<double> ref(y.begin(), y.end());
    test_util::ExpectAllNear(got, ref, 1e-7, 5e-7, "tanh");
    // The gradient from the same (CPU) outputs on both.
    gpu_->CopyToDevice(gy.data(), y.data(), gy.bytes());
    TanhBackward(y.data(), dy.data(), n);
    gpu_->TanhBackward(gy.as<float>(), gdy.as<float>(), n);
    EXPECT_EQ(Download<float>(gdy), dy);

    for (const float p : {0.0f, 0.2f, 0.5f}) {
      std::vector<float> v = RandomVector(rng, n);
      DeviceBuffer gv = Upload(v);
      DropoutForward(v.data(), n, p, 77, 1234567);
      gpu_->DropoutForward(gv.as<float>(), n, p, 77, 1234567);
      EXPECT_EQ(Download<float>(gv), v) << "forward p " << p;
      DropoutBackward(v.data(), n, p, 77, 1234567);
      gpu_->DropoutBackward(gv.as<float>(), n, p, 77, 1234567);
      EXPECT_EQ(Download<float>(gv), v) << "backward p " << p;
    }
  }
}

}  // namespace
}  // namespace huddle::kernels
