// DP-SGD: ghost norms against naive per-example gradients, exact clipping, the noise scale,
// Poisson sampling, option checks and learning.
#include "models/dp_sgd.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "common/rng.h"
#include "kernels/backend.h"
#include "models/internal/mlp_workspace.h"
#include "models/mlp.h"
#include "tests/models/test_data.h"

namespace huddle::models {
namespace {

using ::testing::HasSubstr;

// Each example's gradient of its own loss, by the ordinary backward pass on a batch of one.
std::vector<std::vector<double>> NaiveGradients(const MlpSpec& spec, const TensorList& params,
                                                const data::DatasetView& view) {
  auto backend = kernels::OpenCpuBackend();
  auto ws = internal::MlpWorkspace::Create(*backend, spec, 1, /*training=*/true).value();
  EXPECT_TRUE(ws->LoadData(view).ok());
  ws->UploadParams(params);
  std::vector<std::vector<double>> grads;
  for (int64_t i = 0; i < view.size(); ++i) {
    EXPECT_TRUE(ws->SetOrder({i}).ok());
    ws->Gather(0, 1);
    ws->Forward(1, /*training=*/true);
    ws->Backward(1);
    std::vector<double> flat;
    for (size_t p = 0; p < ws->num_params(); ++p) {
      flat.insert(flat.end(), ws->grad(p), ws->grad(p) + ws->param_size(p));
    }
    grads.push_back(std::move(flat));
  }
  return grads;
}

double Norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

std::vector<double> Flatten(const TensorList& params) {
  std::vector<double> flat;
  for (const auto& t : params) flat.insert(flat.end(), t.data.begin(), t.data.end());
  return flat;
}

const MlpSpec kSpec{8, {16}, 4};

TEST(DpSgdTest, GhostNormsEqualNaivePerExampleGradientNorms) {
  for (const MlpSpec& spec : {MlpSpec{5, {6, 4}, 3}, MlpSpec{8, {16}, 4}, MlpSpec{8, {}, 4}}) {
    const data::Dataset train = Blobs(37, spec.input_dim, spec.num_classes, 4);
    const TensorList params = InitMlp(spec, 8);
    const data::DatasetView view{&train, {}};
    // batch_size 10: several batches and a partial last one.
    auto norms = PerExampleGradientNorms(spec, params, view, 10);
    ASSERT_TRUE(norms.ok()) << norms.status();
    const auto naive = NaiveGradients(spec, params, view);
    ASSERT_EQ(norms->size(), naive.size());
    for (size_t i = 0; i < naive.size(); ++i) {
      const double expected = Norm(naive[i]);
      ASSERT_GT(expected, 0);
      EXPECT_NEAR((*norms)[i], expected, 1e-5 * expected) << "example " << i;
    }
  }
  const TensorList params = InitMlp(kSpec, 1);
  const data::Dataset d = Blobs(4, 8, 4, 1);
  EXPECT_FALSE(PerExampleGradientNorms(kSpec, params, {&d, {}}, 0).ok());
}

// TrainMlpDpSgd grows its buffers when a Poisson sample exceeds their capacity (rare: > 6 sd).
TEST(DpSgdTest, WorkspaceGrownByReserveMatchesOneBuiltLarge) {
  const MlpSpec spec{5, {6, 4}, 3};
  const data::Dataset train = Blobs(9, 5, 3, 4);
  const TensorList params = InitMlp(spec, 8);
  std::vector<int64_t> order(9);
  std::iota(order.begin(), order.end(), int64_t{0});
  auto backend = kernels::OpenCpuBackend();
  auto grown = internal::MlpWorkspace::Create(*backend, spec, 2, /*training=*/true).value();
  auto large = internal::MlpWorkspace::Create(*backend, spec, 9, /*training=*/true).value();
  for (auto* ws : {grown.get(), large.get()}) {
    ASSERT_TRUE(ws->LoadData({&train, {}}).ok());
    ws->UploadParams(params);
    ASSERT_TRUE(ws->SetOrder(order).ok());
  }
  grown->Gather(0, 2);
  grown->Forward(2, /*training=*/true);
  ASSERT_TRUE(grown->Reserve(9).ok());
  EXPECT_EQ(grown->capacity(), 9);
  for (auto* ws : {grown.get(), large.get()}) {
    ws->Gather(0, 9);
    ws->Forward(9, /*training=*/true);
    ws->Backward(9);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t size = grown->param_size(i);
    EXPECT_EQ(std::vector<float>(grown->grad(i), grown->grad(i) + size),
              std::vector<float>(large->grad(i), large->grad(i) + size));
  }
}

TEST(DpSgdTest, WithoutClippingOrNoiseOneStepIsTheFullBatchSgdStep) {
  const MlpSpec spec{5, {6, 4}, 3};
  const data::Dataset train = Blobs(40, 5, 3, 4);
  const TensorList initial = InitMlp(spec, 8);
  TrainOptions options;
  options.learning_rate = 0.1;
  options.weight_decay = 0.01;
  options.batch_size = 40;
  TensorList sgd = initial;
  auto plain = TrainMlp(spec, options, {&train, {}}, 1, &sgd);
  ASSERT_TRUE(plain.ok()) << plain.status();

  // q = 1 samples every example; mean of unclipped gradients = the full-batch gradient.
  DpSgdOptions dp;
  dp.noise_multiplier = 0;
  dp.clip_norm = 1e30;
  dp.expected_batch_size = 40;
  TensorList private_params = initial;
  auto source = privacy::NoiseSource::SeededForTesting(1);
  auto stats = TrainMlpDpSgd(spec, options, dp, {&train, {}}, source, &private_params);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->steps, 1);
  EXPECT_EQ(stats->train.steps, 1);
  EXPECT_EQ(stats->train.examples, 40);
  EXPECT_EQ(stats->sampling_rate, 1.0);
  EXPECT_FALSE(stats->private_noise);
  EXPECT_NEAR(stats->train.loss, plain->loss, 1e-9);
  EXPECT_EQ(stats->train.accuracy, plain->accuracy);
  for (size_t t = 0; t < sgd.size(); ++t) {
    for (size_t i = 0; i < sgd[t].data.size(); ++i) {
      EXPECT_NEAR(private_params[t].data[i], sgd[t].data[i], 1e-6) << sgd[t].name() << i;
    }
  }
}

TEST(DpSgdTest, SmallClipNormClipsEveryExampleExactly) {
  const MlpSpec spec{5, {6, 4}, 3};
  const data::Dataset train = Blobs(30, 5, 3, 4);
  const data::DatasetView view{&train, {}};
  const TensorList initial = InitMlp(spec, 8);
  constexpr double kClip = 1e-3;
  const auto naive = NaiveGradients(spec, initial, view);
  std::vector<double> expected(naive[0].size(), 0.0);
  for (const auto& g : naive) {
    const double norm = Norm(g);
    ASSERT_GT(norm, 10 * kClip);  // every example is clipped
    for (size_t k = 0; k < g.size(); ++k) expected[k] += g[k] * kClip / norm;
  }

  DpSgdOptions dp;
  dp.noise_multiplier = 0;
  dp.clip_norm = kClip;
  dp.expected_batch_size = 30;  // q = 1
  TrainOptions options;
  options.learning_rate = 1000;  // an O(1) update, recovered from the parameters to ~1e-7
  TensorList params = initial;
  auto source = privacy::NoiseSource::SeededForTesting(2);
  ASSERT_TRUE(TrainMlpDpSgd(spec, options, dp, view, source, &params).ok());

  // params = initial - lr * sum / expected_batch_size.
  const std::vector<double> before = Flatten(initial), after = Flatten(params);
  std::vector<double> sum(before.size());
  for (size_t k = 0; k < sum.size(); ++k) {
    sum[k] = (before[k] - after[k]) * 30 / options.learning_rate;
  }
  EXPECT_LE(Norm(sum), 30 * kClip * (1 + 1e-5));
  double largest = 0;
  for (double e : expected) largest = std::max(largest, std::abs(e));
  for (size_t k = 0; k < sum.size(); ++k) {
    EXPECT_NEAR(sum[k], expected[k], 1e-5 * largest) << "coordinate " << k;
  }
}

TEST(DpSgdTest, NoiseStandardDeviationOnTheUpdateIsZTimesClipOverBatchTimesLr) {
  const MlpSpec spec{32, {256}, 10};  // 11018 parameters: one noise draw each
  const data::Dataset train = Blobs(64, 32, 10, 3);
  const TensorList initial = InitMlp(spec, 8);
  DpSgdOptions dp;
  dp.noise_multiplier = 2.0;
  dp.clip_norm = 0.5;
  dp.expected_batch_size = 64;  // q = 1: both runs see the same batch
  TrainOptions options;
  options.learning_rate = 0.5;

  TensorList noisy = initial, clean = initial;
  auto source = privacy::NoiseSource::SeededForTesting(7);
  ASSERT_TRUE(TrainMlpDpSgd(spec, options, dp, {&train, {}}, source, &noisy).ok());
  dp.noise_multiplier = 0;
  auto source2 = privacy::NoiseSource::SeededForTesting(7);
  ASSERT_TRUE(TrainMlpDpSgd(spec, options, dp, {&train, {}}, source2, &clean).ok());

  const std::vector<double> a = Flatten(noisy), b = Flatten(clean);
  const auto count = static_cast<double>(a.size());
  double mean = 0, squares = 0, within_one_sd = 0;
  const double sd = 2.0 * 0.5 / 64 * 0.5;  // z * C / expected_batch_size * lr
  for (size_t k = 0; k < a.size(); ++k) {
    const double diff = b[k] - a[k];
    mean += diff;
    squares += diff * diff;
    if (std::abs(diff) < sd) within_one_sd += 1;
  }
  mean /= count;
  const double measured_sd = std::sqrt(squares / count - mean * mean);
  // Standard errors: sd / sqrt(N) for the mean, sd / sqrt(2N) (~0.7%) for the sd.
  EXPECT_NEAR(mean, 0.0, 4 * sd / std::sqrt(count));
  EXPECT_NEAR(measured_sd, sd, 0.03 * sd);
  EXPECT_NEAR(within_one_sd / count, 0.6827, 0.02);  // Gaussian, not e.g. uniform
}

TEST(DpSgdTest, PoissonBatchSizesHaveBinomialMeanAndVariance) {
  constexpr int64_t kN = 1000, kExpected = 50, kDraws = 2000;
  auto source = privacy::NoiseSource::SeededForTesting(3);
  std::vector<int64_t> rows;
  std::vector<int64_t> hits(kN, 0);
  double sum = 0, squares = 0;
  for (int64_t draw = 0; draw < kDraws; ++draw) {
    SamplePoissonBatch(kN, kExpected, source, &rows);
    ASSERT_TRUE(std::is_sorted(rows.begin(), rows.end()));
    ASSERT_TRUE(std::adjacent_find(rows.begin(), rows.end()) == rows.end());
    for (int64_t r : rows) {
      ASSERT_GE(r, 0);
      ASSERT_LT(r, kN);
      ++hits[static_cast<size_t>(r)];
    }
    const auto size = static_cast<double>(rows.size());
    sum += size;
    squares += size * size;
  }
  const double mean = sum / kDraws;
  const double variance = (squares - kDraws * mean * mean) / (kDraws - 1);
  const double q = static_cast<double>(kExpected) / kN;
  const double binomial_variance = kN * q * (1 - q);  // 47.5
  EXPECT_NEAR(mean, kExpected, 4 * std::sqrt(binomial_variance / kDraws));
  // sd of the sample variance ~ variance * sqrt(2 / draws) (~1.5 here).
  EXPECT_NEAR(variance, binomial_variance, 4 * binomial_variance * std::sqrt(2.0 / kDraws));
  // Every row is equally likely: the first and second halves get the same share.
  const double first_half = std::accumulate(hits.begin(), hits.begin() + kN / 2, 0.0);
  EXPECT_NEAR(first_half / sum, 0.5, 0.01);

  SamplePoissonBatch(kN, kN, source, &rows);
  EXPECT_EQ(rows.size(), static_cast<size_t>(kN));
  SamplePoissonBatch(kN, 0, source, &rows);
  EXPECT_TRUE(rows.empty());
}

// Rates whose base-256 expansion ties often or ends: 1/256 (one digit, then zeros), 255/256 and
// 1/3 (0x55 repeating: the comparison goes past the first byte 1 time in 256).
TEST(DpSgdTest, PoissonSamplingRateIsExactAtAwkwardRates) {
  auto source = privacy::NoiseSource::SeededForTesting(8);
  std::vector<int64_t> rows;
  for (const auto& [n, expected] :
       {std::pair<int64_t, int64_t>{256, 1}, {256, 255}, {3, 1}, {1'000'003, 333'334}}) {
    const int64_t draws = std::max<int64_t>(1, 2'000'000 / n);
    double hits = 0;
    for (int64_t d = 0; d < draws; ++d) {
      SamplePoissonBatch(n, expected, source, &rows);
      hits += static_cast<double>(rows.size());
    }
    const double trials = static_cast<double>(n) * static_cast<double>(draws);
    const double p = static_cast<double>(expected) / static_cast<double>(n);
    EXPECT_NEAR(hits / trials, p, 5 * std::sqrt(p * (1 - p) / trials)) << expected << "/" << n;
  }
}

TEST(DpSgdTest, TinySamplingRateTakesEveryStepIncludingEmptyBatches) {
  const data::Dataset train = Blobs(200, 8, 4, 1);
  TensorList params = InitMlp(kSpec, 5);
  DpSgdOptions dp;
  dp.expected_batch_size = 1;  // q = 1/200: about 37% of the steps sample nobody
  auto source = privacy::NoiseSource::SeededForTesting(4);
  auto stats = TrainMlpDpSgd(kSpec, TrainOptions{}, dp, {&train, {}}, source, &params);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->steps, 200);                                      // epochs / q
  EXPECT_NEAR(static_cast<double>(stats->train.examples), 200, 60);  // Poisson(200)
  EXPECT_DOUBLE_EQ(stats->sampling_rate, 0.005);
  const privacy::DpEvent event = stats->event();
  EXPECT_EQ(event.sampling_rate, 0.005);
  EXPECT_EQ(event.noise_multiplier, 1.0);
  EXPECT_EQ(event.steps, 200);
}

TEST(DpSgdTest, StepsAreEpochsOverTheSamplingRateRounded) {
  const data::Dataset train = Blobs(100, 8, 4, 1);
  TensorList params = InitMlp(kSpec, 5);
  DpSgdOptions dp;
  dp.expected_batch_size = 40;  // q = 0.4
  TrainOptions options;
  options.epochs = 3;  // 7.5 -> 8 steps
  auto source = privacy::NoiseSource::SeededForTesting(5);
  auto stats = TrainMlpDpSgd(kSpec, options, dp, {&train, {}}, source, &params);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->steps, 8);
}

TEST(DpSgdTest, LearnsSeparableBlobsAtModerateNoise) {
  const data::Dataset train = Blobs(2000, 8, 4, 1), test = Blobs(400, 8, 4, 2);
  TensorList params = InitMlp(kSpec, 5);
  DpSgdOptions dp;
  dp.noise_multiplier = 1.0;
  dp.clip_norm = 1.0;
  dp.expected_batch_size = 100;
  TrainOptions options;
  options.epochs = 5;  // 100 steps
  options.learning_rate = 0.5;
  auto source = privacy::NoiseSource::SeededForTesting(6);
  auto stats = TrainMlpDpSgd(kSpec, options, dp, {&train, {}}, source, &params);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->steps, 100);
  EXPECT_GT(stats->train.accuracy, 0.6);
  auto eval = EvaluateMlp(kSpec, params, {&test, {}});
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_GT(eval->accuracy, 0.9);  // chance is 0.25
}

TEST(DpSgdTest, SeededRunsAreReproducibleAndSecureNoiseIsReportedPrivate) {
  const data::Dataset train = Blobs(100, 8, 4, 1);
  DpSgdOptions dp;
  dp.expected_batch_size = 10;
  TensorList a = InitMlp(kSpec, 5), b = a, c = a;
  auto sa = privacy::NoiseSource::SeededForTesting(9);
  auto sb = privacy::NoiseSource::SeededForTesting(9);
  auto sc = privacy::NoiseSource::SeededForTesting(10);
  ASSERT_TRUE(TrainMlpDpSgd(kSpec, {}, dp, {&train, {}}, sa, &a).ok());
  ASSERT_TRUE(TrainMlpDpSgd(kSpec, {}, dp, {&train, {}}, sb, &b).ok());
  ASSERT_TRUE(TrainMlpDpSgd(kSpec, {}, dp, {&train, {}}, sc, &c).ok());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].data, b[i].data) << a[i].name();
  EXPECT_NE(a[0].data, c[0].data);

  auto secure = privacy::NoiseSource::Secure();
  auto stats = TrainMlpDpSgd(kSpec, {}, dp, {&train, {}}, secure, &a);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->private_noise);
  dp.noise_multiplier = 0;  // no noise: not private whatever the source
  stats = TrainMlpDpSgd(kSpec, {}, dp, {&train, {}}, secure, &a);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_FALSE(stats->private_noise);
}

TEST(DpSgdTest, RejectsBadInputsWithoutTouchingParamsOrDrawingNoise) {
  const data::Dataset train = Blobs(20, 8, 4, 1);
  const TensorList initial = InitMlp(kSpec, 5);
  TensorList params = initial;
  auto source = privacy::NoiseSource::SeededForTesting(11);
  auto error = [&](const MlpSpec& spec, const TrainOptions& options, const DpSgdOptions& dp,
                   const data::DatasetView& view) {
    auto result = TrainMlpDpSgd(spec, options, dp, view, source, &params);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(result.status().message());
  };
  const data::DatasetView view{&train, {}};
  DpSgdOptions dp;
  dp.expected_batch_size = 10;
  auto with = [&](auto mutate) {
    DpSgdOptions copy = dp;
    mutate(copy);
    return copy;
  };
  EXPECT_THAT(error(kSpec, {}, with([](auto& o) { o.noise_multiplier = -1; }), view),
              HasSubstr("noise_multiplier"));
  EXPECT_THAT(error(kSpec, {}, with([](auto& o) { o.noise_multiplier = NAN; }), view),
              HasSubstr("noise_multiplier"));
  EXPECT_THAT(error(kSpec, {}, with([](auto& o) { o.noise_multiplier = INFINITY; }), view),
              HasSubstr("noise_multiplier"));
  EXPECT_THAT(error(kSpec, {}, with([](auto& o) { o.clip_norm = 0; }), view),
              HasSubstr("clip_norm"));
  EXPECT_THAT(error(kSpec, {}, with([](auto& o) { o.clip_norm = INFINITY; }), view),
              HasSubstr("clip_norm"));
  EXPECT_THAT(error(kSpec, {}, with([](auto& o) { o.expected_batch_size = 0; }), view),
              HasSubstr("expected_batch_size"));
  EXPECT_THAT(error(kSpec, {}, with([](auto& o) { o.expected_batch_size = 21; }), view),
              HasSubstr("expected_batch_size is 21; it must be in [1, 20]"));
  // z * sqrt(212 parameters) / 2 > 2^23: the noise grid cannot be built.
  EXPECT_THAT(error(kSpec, {}, with([](auto& o) { o.noise_multiplier = 2e6; }), view),
              HasSubstr("noise multiplier"));

  TrainOptions bad;
  bad.epochs = 0;
  EXPECT_THAT(error(kSpec, bad, dp, view), HasSubstr("epochs"));
  bad = {};
  bad.learning_rate = 0;
  EXPECT_THAT(error(kSpec, bad, dp, view), HasSubstr("learning_rate"));
  bad = {};
  bad.momentum = 1;
  EXPECT_THAT(error(kSpec, bad, dp, view), HasSubstr("momentum"));
  bad = {};
  bad.batch_size = 0;  // ignored: the batch is Poisson
  bad.epochs = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(error(kSpec, bad, dp, view), HasSubstr("overflows"));

  data::Dataset bad_label = train;
  bad_label.labels[3] = 4;
  EXPECT_THAT(error(kSpec, {}, dp, {&bad_label, {}}), HasSubstr("example 3 has label 4"));
  EXPECT_THAT(error(MlpSpec{8, {32}, 4}, {}, dp, view), HasSubstr("fc0.weight"));
  EXPECT_THAT(error(kSpec, {}, dp, {&train, {20}}), HasSubstr("20"));
  const data::Dataset empty{8, 4, {}, {}};
  EXPECT_THAT(error(kSpec, {}, dp, {&empty, {}}), HasSubstr("no examples"));
  EXPECT_EQ(TrainMlpDpSgd(kSpec, {}, dp, view, source, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);

  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(params[i].data, initial[i].data);
  auto fresh = privacy::NoiseSource::SeededForTesting(11);
  EXPECT_EQ(source.NextU64(), fresh.NextU64());  // no randomness was spent
}

TEST(DpSgdTest, DivergenceIsAnError) {
  const data::Dataset train = Blobs(64, 8, 4, 1);
  TensorList params = InitMlp(kSpec, 5);
  TrainOptions options;
  options.epochs = 20;
  options.learning_rate = 1e38;
  DpSgdOptions dp;
  dp.expected_batch_size = 16;
  auto source = privacy::NoiseSource::SeededForTesting(12);
  auto result = TrainMlpDpSgd(kSpec, options, dp, {&train, {}}, source, &params);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(result.status().message(), HasSubstr("diverged"));
}

}  // namespace
}  // namespace huddle::models
