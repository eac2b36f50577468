// Every kernel of the CUDA backend against the CPU reference on seeded random inputs, compared by
// atol + rtol * |ref| (bit for bit where the math is shared: the update pipeline, the fixed-point
// fold, DP-SGD's grid sums), and one local epoch of training on each. Labelled `gpu`: every test
// skips itself, saying why, where this build made no CUDA plugin, the plugin does not load, or the
// machine has no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "common/rng.h"
#include "data/dataset.h"
#include "kernels/activation.h"
#include "kernels/backend.h"
#include "kernels/batch_norm.h"
#include "kernels/dense.h"
#include "kernels/dp.h"
#include "kernels/grid_sum.h"
#include "kernels/loss.h"
#include "kernels/optimizer.h"
#include "kernels/update.h"
#include "models/dp_sgd.h"
#include "models/model.h"
#include "models/trainer.h"
#include "models/update.h"
#include "privacy/clip.h"
#include "tests/kernels/gpu_fixture.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/models/test_data.h"

namespace huddle::kernels {
namespace {

using test_util::RandomVector;

class ParityTest : public test_util::GpuTest {
 protected:
  static void ExpectNear(const std::vector<float>& gpu, const std::vector<float>& cpu, double atol,
                         double rtol, const char* what) {
    std::vector<double> ref(cpu.begin(), cpu.end());
    test_util::ExpectAllNear(gpu, ref, atol, rtol, what);
  }
};

TEST_F(ParityTest, DenseForwardAndBackward) {
  for (const DenseShape s : {DenseShape{1, 1, 1}, DenseShape{7, 13, 5}, DenseShape{33, 128, 10},
                             DenseShape{256, 784, 128}}) {
    Rng rng(DeriveSeed(1, s.batch, s.in * 1000 + s.out));
    const auto x = RandomVector(rng, s.batch * s.in), w = RandomVector(rng, s.out * s.in);
    const auto bias = RandomVector(rng, s.out), dy = RandomVector(rng, s.batch * s.out);
    std::vector<float> y(static_cast<size_t>(s.batch * s.out)), dw(w.size()), db(bias.size()),
        dx(x.size());
    DenseForward(s, x.data(), w.data(), bias.data(), y.data());
    DenseBackward(s, x.data(), w.data(), dy.data(), dw.data(), db.data(), dx.data());
    DeviceBuffer gx = Upload(x), gw = Upload(w), gb = Upload(bias), gdy = Upload(dy);
    DeviceBuffer gy = Zeros<float>(y.size()), gdw = Zeros<float>(dw.size()),
                 gdb = Zeros<float>(db.size()), gdx = Zeros<float>(dx.size());
    gpu_->DenseForward(s, gx.as<float>(), gw.as<float>(), gb.as<float>(), gy.as<float>());
    gpu_->DenseBackward(s, gx.as<float>(), gw.as<float>(), gdy.as<float>(), gdw.as<float>(),
                        gdb.as<float>(), gdx.as<float>());
    ExpectNear(Download<float>(gy), y, 1e-4, 1e-4, "y");
    ExpectNear(Download<float>(gdw), dw, 1e-4, 1e-4, "dw");
    ExpectNear(Download<float>(gdb), db, 1e-4, 1e-4, "dbias");
    ExpectNear(Download<float>(gdx), dx, 1e-4, 1e-4, "dx");
  }
}

TEST_F(ParityTest, ReluSoftmaxCrossEntropyAndSgd) {
  Rng rng(2);
  const int64_t batch = 300, classes = 37, n = batch * classes;
  auto logits = RandomVector(rng, n, -5, 5);
  std::vector<int32_t> labels(batch);
  for (auto& l : labels) l = static_cast<int32_t>(rng.UniformInt(classes));
  // ReLU forward/backward are exact.
  std::vector<float> relu = logits, grad = RandomVector(rng, n);
  DeviceBuffer grelu = Upload(relu), ggrad = Upload(grad);
  ReluForward(relu.data(), n);
  ReluBackward(relu.data(), grad.data(), n);
  gpu_->ReluForward(grelu.as<float>(), n);
  gpu_->ReluBackward(grelu.as<float>(), ggrad.as<float>(), n);
  EXPECT_EQ(Download<float>(grelu), relu);
  EXPECT_EQ(Download<float>(ggrad), grad);
  // Softmax cross-entropy, in place, totals accumulated across two calls.
  std::vector<float> dlogits = logits;
  const LossTotals totals =
      SoftmaxCrossEntropy(dlogits.data(), labels.data(), batch, classes, dlogits.data());
  DeviceBuffer glogits = Upload(logits), glabels = Upload(labels);
  DeviceBuffer gtotals = Zeros<LossAccumulator>(1);
  gpu_->SoftmaxCrossEntropy(glogits.as<float>(), glabels.as<int32_t>(), batch, classes, nullptr,
                            gtotals.as<LossAccumulator>());
  gpu_->SoftmaxCrossEntropy(glogits.as<float>(), glabels.as<int32_t>(), batch, classes,
                            glogits.as<float>(), gtotals.as<LossAccumulator>());
  ExpectNear(Download<float>(glogits), dlogits, 1e-6, 1e-4, "dlogits");
  const LossAccumulator got = Download<LossAccumulator>(gtotals)[0];
  EXPECT_NEAR(got.loss_sum, 2 * totals.loss_sum, 1e-5 * std::abs(totals.loss_sum));
  EXPECT_EQ(got.correct, 2 * totals.correct);
  // SGD with and without momentum, three steps.
  for (const float momentum : {0.0f, 0.9f}) {
    const SgdHyper hyper{0.05f, momentum, 1e-3f};
    auto param = RandomVector(rng, 1001), g = RandomVector(rng, 1001);
    std::vector<float> velocity(param.size(), 0.0f);
    DeviceBuffer gp = Upload(param), gg = Upload(g), gv = Upload(velocity);
    for (int step = 0; step < 3; ++step) {
      SgdStep(hyper, g.data(), param.data(), velocity.data(), 1001);
      gpu_->SgdStep(hyper, gg.as<float>(), gp.as<float>(), gv.as<float>(), 1001);
    }
    ExpectNear(Download<float>(gp), param, 1e-6, 1e-5, "param");
  }
}

TEST_F(ParityTest, GatherAndGhostNormClipping) {
  Rng rng(3);
  const int64_t rows = 50, cols = 19, batch = 23, out = 11;
  const auto features = RandomVector(rng, rows * cols);
  std::vector<int32_t> labels(rows);
  std::iota(labels.begin(), labels.end(), 0);
  std::vector<int64_t> pick(batch);
  for (auto& r : pick) r = static_cast<int64_t>(rng.UniformInt(rows));
  std::vector<float> x(static_cast<size_t>(batch * cols));
  std::vector<int32_t> y(batch);
  GatherRows(features.data(), labels.data(), cols, pick.data(), batch, x.data(), y.data());
  DeviceBuffer gf = Upload(features), gl = Upload(labels), gpick = Upload(pick);
  DeviceBuffer gx = Zeros<float>(x.size()), gy = Zeros<int32_t>(y.size());
  gpu_->GatherRows(gf.as<float>(), gl.as<int32_t>(), cols, gpick.as<int64_t>(), batch,
                   gx.as<float>(), gy.as<int32_t>());
  EXPECT_EQ(Download<float>(gx), x);
  EXPECT_EQ(Download<int32_t>(gy), y);

  const auto d = RandomVector(rng, batch * out);
  std::vector<double> squared(batch, 0.5);
  AddGhostSquaredNorms(x.data(), cols, d.data(), out, batch, squared.data());
  DeviceBuffer gd = Upload(d), gsq = Upload(std::vector<double>(batch, 0.5));
  gpu_->AddGhostSquaredNorms(gx.as<float>(), cols, gd.as<float>(), out, batch, gsq.as<double>());
  const auto gsquared = Download<double>(gsq);
  for (int64_t i = 0; i < batch; ++i) EXPECT_NEAR(gsquared[i], squared[i], 1e-12 * squared[i]);

  const ClipFactorParams params{2.0, 3.0, 2.0};
  std::vector<float> factors(batch);
  ClipFactors(squared.data(), batch, params, factors.data());
  DeviceBuffer gfactors = Zeros<float>(batch);
  gpu_->ClipFactors(gsq.as<double>(), batch, params, gfactors.as<float>());
  ExpectNear(Download<float>(gfactors), factors, 0, 1e-6, "factors");
  std::vector<float> scaled = d;
  ScaleRows(scaled.data(), batch, out, factors.data());
  DeviceBuffer gscaled = Upload(d), gexact = Upload(factors);
  gpu_->ScaleRows(gscaled.as<float>(), batch, out, gexact.as<float>());
  EXPECT_EQ(Download<float>(gscaled), scaled);
}

// DP-SGD's exact sum (kernels/grid_sum.h): the grid rounding (half to even, refusals counted),
// the noise integers' addition and the conversion back to float, bit for bit.
TEST_F(ParityTest, GridSumKernelsAreTheSameBits) {
  for (const int64_t n : {int64_t{1}, int64_t{1000}, int64_t{300007}}) {
    SCOPED_TRACE(testing::Message() << "n " << n);
    Rng rng(DeriveSeed(5, static_cast<uint64_t>(n)));
    std::vector<float> x = RandomVector(rng, n, -3, 3);
    // Exact halves (1.5 and -2.5 units of 2^-19), a value past the limit, non-finite values and
    // a subnormal.
    x[0] = 0x1.8p-19f;
    if (n > 5) {
      x[1] = -0x1.4p-18f;
      x[2] = 1e30f;
      x[3] = std::nanf("");
      x[4] = -INFINITY;
      x[5] = 1e-40f;
    }
    std::vector<int64_t> noise(static_cast<size_t>(n));
    for (auto& k : noise) {
      k = static_cast<int64_t>(rng.UniformInt(int64_t{1} << 30)) - (int64_t{1} << 29);
    }
    for (const int exponent : {-19, -40, 3}) {
      std::vector<int64_t> acc(static_cast<size_t>(n) + 1, 7);
      std::vector<float> out(static_cast<size_t>(n));
      AccumulateOnGrid(x.data(), n, exponent, 0x1p61, acc.data(), acc.data() + n);
      AccumulateOnGrid(x.data(), n, exponent, 0x1p61, acc.data(), acc.data() + n);  // twice
      AddUnits(noise.data(), n, acc.data());
      UnitsToFloat(acc.data(), n, exponent, 2048.0, out.data());
      DeviceBuffer gx = Upload(x), gnoise = Upload(noise),
                   gacc = Upload(std::vector<int64_t>(static_cast<size_t>(n) + 1, 7)),
                   gout = Zeros<float>(out.size());
      gpu_->AccumulateOnGrid(gx.as<float>(), n, exponent, 0x1p61, gacc.as<int64_t>(),
                             gacc.as<int64_t>() + n);
      gpu_->AccumulateOnGrid(gx.as<float>(), n, exponent, 0x1p61, gacc.as<int64_t>(),
                             gacc.as<int64_t>() + n);
      gpu_->AddUnits(gnoise.as<int64_t>(), n, gacc.as<int64_t>());
      gpu_->UnitsToFloat(gacc.as<int64_t>(), n, exponent, 2048.0, gout.as<float>());
      EXPECT_EQ(Download<int64_t>(gacc), acc) << "exponent " << exponent;
      const std::vector<float> got = Download<float>(gout);
      ASSERT_EQ(got.size(), out.size());
      EXPECT_EQ(std::memcmp(got.data(), out.data(), out.size() * sizeof(float)), 0)
          << "exponent " << exponent;
    }
  }
}

TEST_F(ParityTest, UpdatePipelineIsTheSameBits) {
  for (const int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}, int64_t{3000001}}) {
    Rng rng(DeriveSeed(6, static_cast<uint64_t>(n)));
    const auto local = RandomVector(rng, n, -2, 2), global = RandomVector(rng, n);
    for (const double clip_norm : {0.0, 1.5}) {
      UpdatePipelineParams p;
      p.clip_norm = clip_norm;
      std::vector<float> values(static_cast<size_t>(n));
      std::vector<double> scratch(kUpdatePipelineScratch);
      UpdatePipelineStats stats;
      UpdatePipeline(p, local.data(), global.data(), n, values.data(), scratch.data(), &stats);
      DeviceBuffer gl = Upload(local), gg = Upload(global), gv = Zeros<float>(values.size()),
                   gs = Zeros<double>(kUpdatePipelineScratch),
                   gstats = Zeros<UpdatePipelineStats>(1);
      gpu_->UpdatePipeline(p, gl.as<float>(), gg.as<float>(), n, gv.as<float>(), gs.as<double>(),
                           gstats.as<UpdatePipelineStats>());
      const UpdatePipelineStats got = Download<UpdatePipelineStats>(gstats)[0];
      EXPECT_EQ(got.norm, stats.norm) << n;
      EXPECT_EQ(got.scale, stats.scale) << n;
      const std::vector<float> got_values = Download<float>(gv);
      ASSERT_EQ(got_values.size(), values.size());
      EXPECT_EQ(std::memcmp(got_values.data(), values.data(), values.size() * sizeof(float)), 0)
          << n << " clip " << clip_norm;
      // In place (out == local), as models::TrainUpdate runs it: the same bits.
      gpu_->UpdatePipeline(p, gl.as<float>(), gg.as<float>(), n, gl.as<float>(), gs.as<double>(),
                           gstats.as<UpdatePipelineStats>());
      const std::vector<float> in_place = Download<float>(gl);
      EXPECT_EQ(std::memcmp(in_place.data(), values.data(), values.size() * sizeof(float)), 0)
          << n << " clip " << clip_norm << " in place";
    }
  }
}

// One local epoch from the same model and data order: losses agree to 1e-4 relative and every
// parameter to 1e-3 (float GEMMs sum in different orders; the difference stays at rounding level
// over an epoch of small steps).
// One epoch of momentum SGD on both backends from the same start: the models and their
// evaluations agree.
void ExpectOneEpochMatchesTheCpu(const models::ModelSpec& spec, Backend* gpu) {
  const data::Dataset train = models::Blobs(2048, 64, 10, 9);
  const TensorList initial = models::InitModel(spec, 10);
  models::TrainOptions options;
  options.batch_size = 256;
  options.learning_rate = 0.05;
  options.momentum = 0.9;
  TensorList on_cpu = initial, on_gpu = initial;
  auto cpu = models::TrainModel(spec, options, {&train, {}}, 11, &on_cpu);
  options.backend = gpu;
  auto gpu_run = models::TrainModel(spec, options, {&train, {}}, 11, &on_gpu);
  ASSERT_TRUE(cpu.ok() && gpu_run.ok());
  EXPECT_NEAR(gpu_run->loss, cpu->loss, 1e-4 * cpu->loss);
  EXPECT_EQ(gpu_run->steps, cpu->steps);
  for (size_t t = 0; t < on_cpu.size(); ++t) {
    std::vector<double> ref(on_cpu[t].data.begin(), on_cpu[t].data.end());
    test_util::ExpectAllNear(on_gpu[t].data, ref, 1e-3, 1e-3, on_cpu[t].spec.name);
  }
  // Evaluation too (a batch-norm model normalises with its running statistics there).
  auto eval_cpu = models::EvaluateModel(spec, on_cpu, {&train, {}});
  auto eval_gpu = models::EvaluateModel(spec, on_gpu, {&train, {}}, 1000, gpu);
  ASSERT_TRUE(eval_cpu.ok() && eval_gpu.ok());
  EXPECT_NEAR(eval_gpu->loss, eval_cpu->loss, 1e-3 * eval_cpu->loss);
}

TEST_F(ParityTest, OneEpochOfTrainingMatchesTheCpu) {
  ExpectOneEpochMatchesTheCpu(models::MlpSpec{64, {128, 32}, 10}, gpu_.get());
}

// A CNN with every layer kind (models/model.h) on 1x8x8 inputs.
models::ModelSpec ParityCnn(bool batch_norm) {
  using models::LayerKind;
  models::ModelSpec spec;
  spec.input = {1, 8, 8};
  spec.layers = {{.kind = LayerKind::kConv2d, .out = 8, .kernel = 3, .padding = 1},
                 batch_norm ? models::LayerSpec{.kind = LayerKind::kBatchNorm}
                            : models::LayerSpec{.kind = LayerKind::kGroupNorm, .groups = 4},
                 {.kind = LayerKind::kRelu},
                 {.kind = LayerKind::kMaxPool2d, .kernel = 2},
                 {.kind = LayerKind::kConv2d, .out = 8, .kernel = 3, .stride = 2, .padding = 1},
                 {.kind = LayerKind::kTanh},
                 {.kind = LayerKind::kAvgPool2d, .kernel = 2},
                 {.kind = LayerKind::kFlatten},
                 {.kind = LayerKind::kDropout, .rate = 0.25},
                 {.kind = LayerKind::kDense, .out = 10}};
  return spec;
}

TEST_F(ParityTest, OneEpochOfCnnTrainingMatchesTheCpu) {
  ExpectOneEpochMatchesTheCpu(ParityCnn(/*batch_norm=*/false), gpu_.get());
  ExpectOneEpochMatchesTheCpu(ParityCnn(/*batch_norm=*/true), gpu_.get());
}

// The batch-norm kernels are written to give the same bits on both backends (the same double
// operations in the same order, kernels/batch_norm.h): a SyncBatchNorm step's chain, compared
// bit for bit at every stage.
TEST_F(ParityTest, BatchNormKernelsAreTheSameBits) {
  for (const auto& [batch, features] : {std::pair<int64_t, int64_t>{1, 1}, {7, 13}, {256, 300}}) {
    SCOPED_TRACE(testing::Message() << batch << " x " << features);
    Rng rng(DeriveSeed(12, batch, features));
    const auto x = RandomVector(rng, batch * features, -3, 5);
    const auto dy = RandomVector(rng, batch * features);
    const auto gamma = RandomVector(rng, features, 0.5, 1.5);
    const auto beta = RandomVector(rng, features);
    const size_t f = static_cast<size_t>(features), n = x.size();
    std::vector<double> sums(2 * f), bsums(2 * f);
    std::vector<float> mean(f), invstd(f), rmean(f, 0.0f), rvar(f, 1.0f), y(n), dx(n), dgamma(f),
        dbeta(f), eval_invstd(f);
    BatchNormSums(x.data(), batch, features, 1, sums.data());
    BatchNormMoments(sums.data(), batch, features, 1e-5, mean.data(), invstd.data());
    BatchNormUpdateRunning(sums.data(), batch, features, 0.1, rmean.data(), rvar.data());
    BatchNormForward(x.data(), batch, features, 1, mean.data(), invstd.data(), gamma.data(),
                     beta.data(), y.data());
    BatchNormBackwardSums(dy.data(), x.data(), mean.data(), invstd.data(), batch, features, 1,
                          bsums.data());
    BatchNormParamGrads(bsums.data(), features, dgamma.data(), dbeta.data());
    BatchNormBackwardInput(dy.data(), x.data(), mean.data(), invstd.data(), gamma.data(),
                           bsums.data(), batch, batch, features, 1, dx.data());
    BatchNormInvStd(rvar.data(), features, 1e-5, eval_invstd.data());

    DeviceBuffer gx = Upload(x), gdy = Upload(dy), ggamma = Upload(gamma), gbeta = Upload(beta);
    DeviceBuffer gsums = Zeros<double>(2 * f), gbsums = Zeros<double>(2 * f);
    DeviceBuffer gmean = Zeros<float>(f), ginvstd = Zeros<float>(f), gy = Zeros<float>(n),
                 gdx = Zeros<float>(n), gdgamma = Zeros<float>(f), gdbeta = Zeros<float>(f),
                 geval = Zeros<float>(f);
    DeviceBuffer grmean = Upload(std::vector<float>(f, 0.0f));
    DeviceBuffer grvar = Upload(std::vector<float>(f, 1.0f));
    gpu_->BatchNormSums(gx.as<float>(), batch, features, 1, gsums.as<double>());
    gpu_->BatchNormMoments(gsums.as<double>(), batch, features, 1e-5, gmean.as<float>(),
                           ginvstd.as<float>());
    gpu_->BatchNormUpdateRunning(gsums.as<double>(), batch, features, 0.1, grmean.as<float>(),
                                 grvar.as<float>());
    gpu_->BatchNormForward(gx.as<float>(), batch, features, 1, gmean.as<float>(),
                           ginvstd.as<float>(), ggamma.as<float>(), gbeta.as<float>(),
                           gy.as<float>());
    gpu_->BatchNormBackwardSums(gdy.as<float>(), gx.as<float>(), gmean.as<float>(),
                                ginvstd.as<float>(), batch, features, 1, gbsums.as<double>());
    gpu_->BatchNormParamGrads(gbsums.as<double>(), features, gdgamma.as<float>(),
                              gdbeta.as<float>());
    gpu_->BatchNormBackwardInput(gdy.as<float>(), gx.as<float>(), gmean.as<float>(),
                                 ginvstd.as<float>(), ggamma.as<float>(), gbsums.as<double>(),
                                 batch, batch, features, 1, gdx.as<float>());
    gpu_->BatchNormInvStd(grvar.as<float>(), features, 1e-5, geval.as<float>());
    EXPECT_EQ(Download<double>(gsums), sums);
    EXPECT_EQ(Download<float>(gmean), mean);
    EXPECT_EQ(Download<float>(ginvstd), invstd);
    EXPECT_EQ(Download<float>(grmean), rmean);
    EXPECT_EQ(Download<float>(grvar), rvar);
    EXPECT_EQ(Download<float>(gy), y);
    EXPECT_EQ(Download<double>(gbsums), bsums);
    EXPECT_EQ(Download<float>(gdgamma), dgamma);
    EXPECT_EQ(Download<float>(gdbeta), dbeta);
    EXPECT_EQ(Download<float>(gdx), dx);
    EXPECT_EQ(Download<float>(geval), eval_invstd);
  }
}

TEST_F(ParityTest, OneEpochOfBatchNormTrainingMatchesTheCpu) {
  ExpectOneEpochMatchesTheCpu(models::MlpSpec{64, {128, 32}, 10, /*batch_norm=*/true}, gpu_.get());
}

// DP-SGD with and without noise: the same Poisson draws and the same exact discrete Gaussian
// noise integers (same seeded source, drawn on the host for both devices), the same clipping;
// the chunks' float GEMMs differ by rounding only, which the grid sums carry into the released
// gradients at rounding level.
TEST_F(ParityTest, DpSgdMatchesTheCpu) {
  for (const auto& [spec, z] :
       {std::pair<models::ModelSpec, double>{models::MlpSpec{64, {32}, 10}, 0.0},
        {models::MlpSpec{64, {32}, 10}, 1.0},
        {ParityCnn(/*batch_norm=*/false), 1.0}}) {
    SCOPED_TRACE(testing::Message() << models::DescribeModel(spec) << ", noise multiplier " << z);
    const data::Dataset train = models::Blobs(1024, 64, 10, 12);
    const TensorList initial = models::InitModel(spec, 13);
    models::TrainOptions options;
    options.learning_rate = 0.1;
    models::DpSgdOptions dp;
    dp.noise_multiplier = z;
    dp.clip_norm = 0.5;
    dp.expected_batch_size = 300;  // two chunks
    TensorList on_cpu = initial, on_gpu = initial;
    auto cpu_source = privacy::NoiseSource::SeededForTesting(14);
    auto gpu_source = privacy::NoiseSource::SeededForTesting(14);
    auto cpu = models::TrainDpSgd(spec, options, dp, {&train, {}}, cpu_source, &on_cpu);
    options.backend = gpu_.get();
    auto gpu = models::TrainDpSgd(spec, options, dp, {&train, {}}, gpu_source, &on_gpu);
    ASSERT_TRUE(cpu.ok() && gpu.ok());
    EXPECT_EQ(gpu->train.examples, cpu->train.examples);
    for (size_t t = 0; t < on_cpu.size(); ++t) {
      std::vector<double> ref(on_cpu[t].data.begin(), on_cpu[t].data.end());
      test_util::ExpectAllNear(on_gpu[t].data, ref, 1e-3, 1e-3, on_cpu[t].spec.name);
    }
  }
}

// The loss curve of one epoch, step by step (the figure of issue 5): the same model, data order and
// steps on both devices; every step's batch loss agrees to 1e-4 relative. The largest deviation is
// printed and recorded as the test property max_relative_loss_deviation.
TEST_F(ParityTest, LossCurveOfOneEpochMatchesTheCpu) {
  const models::MlpSpec spec{784, {128}, 10};
  const data::Dataset train = models::Blobs(8192, 784, 10, 21);
  const TensorList initial = models::InitModel(spec, 22);
  const data::DatasetView view{&train, {}};
  std::vector<int64_t> order(static_cast<size_t>(train.size()));
  std::iota(order.begin(), order.end(), int64_t{0});
  Rng(23).Shuffle(order);
  auto curve = [&](Backend& device) {
    models::TrainOptions options;
    options.learning_rate = 0.05;
    options.momentum = 0.9;
    options.batch_size = 256;
    options.backend = &device;
    auto trainer = models::Trainer::Create(spec, options, view, {}).value();
    trainer->UploadParams(initial);
    EXPECT_TRUE(trainer->SetOrder(order).ok());
    std::vector<double> losses;
    for (int64_t begin = 0; begin < train.size(); begin += 256) {
      trainer->ResetTotals();
      EXPECT_TRUE(trainer->SgdStep(begin, 256).ok());
      losses.push_back(trainer->ReadTotals()->loss_sum / 256);  // a test may wait every step
    }
    return losses;
  };
  auto cpu_backend = OpenCpuBackend();
  const std::vector<double> cpu = curve(*cpu_backend);
  const std::vector<double> gpu = curve(*gpu_);
  ASSERT_EQ(cpu.size(), gpu.size());
  double worst = 0;
  for (size_t k = 0; k < cpu.size(); ++k) {
    EXPECT_NEAR(gpu[k], cpu[k], 1e-4 * cpu[k]) << "step " << k;
    worst = std::max(worst, std::abs(gpu[k] - cpu[k]) / cpu[k]);
  }
  std::printf(
      "loss curve, %zu steps: first %.6f / %.6f, last %.6f / %.6f (cpu / gpu); "
      "max relative deviation %.3g\n",
      cpu.size(), cpu.front(), gpu.front(), cpu.back(), gpu.back(), worst);
  RecordProperty("max_relative_loss_deviation", std::to_string(worst));
}

// The client's round on each device (models/update.h): training, delta and clipping agree, and the
// GPU's clipped delta honours the bound as the coordinator measures it.
TEST_F(ParityTest, TrainUpdateMatchesTheCpu) {
  const models::MlpSpec spec{64, {128, 32}, 10};
  const data::Dataset train = models::Blobs(2048, 64, 10, 31);
  const TensorList global = models::InitModel(spec, 32);
  models::UpdateOptions options;
  options.train.batch_size = 128;
  options.train.learning_rate = 0.05;
  options.seed = 33;
  options.clip_norm = 0.25;
  auto cpu = models::TrainUpdate(spec, options, {&train, {}}, global);
  options.train.backend = gpu_.get();
  auto gpu = models::TrainUpdate(spec, options, {&train, {}}, global);
  ASSERT_TRUE(cpu.ok() && gpu.ok());
  EXPECT_NEAR(gpu->norm, cpu->norm, 1e-3 * cpu->norm);
  EXPECT_EQ(gpu->clipped, cpu->clipped);
  EXPECT_LE(privacy::L2Norm(gpu->delta), options.clip_norm);
  for (size_t t = 0; t < cpu->delta.size(); ++t) {
    std::vector<double> ref(cpu->delta[t].data.begin(), cpu->delta[t].data.end());
    test_util::ExpectAllNear(gpu->delta[t].data, ref, 1e-5, 1e-3, cpu->delta[t].spec.name);
  }
}

}  // namespace
}  // namespace huddle::kernels
