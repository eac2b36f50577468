// DP-SGD: ghost norms against naive per-example gradients, exact clipping, the noise scale,
// Poisson sampling, option checks and learning; the chunked exact sum (its grid and sensitivity
// bound, its independence of how chunks are spread over ranks, the exact noise on it).
#include "models/dp_sgd.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>

#include "common/rng.h"
#include "kernels/backend.h"
#include "kernels/flush_denormals.h"
#include "models/internal/net_workspace.h"
#include "models/internal/train_loops.h"
#include "models/model.h"
#include "tests/models/test_data.h"

namespace huddle::models {
namespace {

using ::testing::HasSubstr;

// Each example's gradient of its own loss, by the ordinary backward pass on a batch of one.
std::vector<std::vector<double>> NaiveGradients(const MlpSpec& spec, const TensorList& params,
                                                const data::DatasetView& view) {
  auto backend = kernels::OpenCpuBackend();
  auto ws = internal::NetWorkspace::Create(*backend, spec, 1, /*training=*/true).value();
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
    const TensorList params = InitModel(spec, 8);
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
  const TensorList params = InitModel(kSpec, 1);
  const data::Dataset d = Blobs(4, 8, 4, 1);
  EXPECT_FALSE(PerExampleGradientNorms(kSpec, params, {&d, {}}, 0).ok());
}

// TrainDpSgd grows its buffers when a Poisson sample exceeds their capacity (rare: > 6 sd).
TEST(DpSgdTest, WorkspaceGrownByReserveMatchesOneBuiltLarge) {
  const MlpSpec spec{5, {6, 4}, 3};
  const data::Dataset train = Blobs(9, 5, 3, 4);
  const TensorList params = InitModel(spec, 8);
  std::vector<int64_t> order(9);
  std::iota(order.begin(), order.end(), int64_t{0});
  auto backend = kernels::OpenCpuBackend();
  auto grown = internal::NetWorkspace::Create(*backend, spec, 2, /*training=*/true).value();
  auto large = internal::NetWorkspace::Create(*backend, spec, 9, /*training=*/true).value();
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
  const TensorList initial = InitModel(spec, 8);
  TrainOptions options;
  options.learning_rate = 0.1;
  options.weight_decay = 0.01;
  options.batch_size = 40;
  TensorList sgd = initial;
  auto plain = TrainModel(spec, options, {&train, {}}, 1, &sgd);
  ASSERT_TRUE(plain.ok()) << plain.status();

  // q = 1 samples every example; mean of unclipped gradients = the full-batch gradient.
  DpSgdOptions dp;
  dp.noise_multiplier = 0;
  dp.clip_norm = 1e30;
  dp.expected_batch_size = 40;
  TensorList private_params = initial;
  auto source = privacy::NoiseSource::SeededForTesting(1);
  auto stats = TrainDpSgd(spec, options, dp, {&train, {}}, source, &private_params);
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
  const TensorList initial = InitModel(spec, 8);
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
  ASSERT_TRUE(TrainDpSgd(spec, options, dp, view, source, &params).ok());

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
  const TensorList initial = InitModel(spec, 8);
  DpSgdOptions dp;
  dp.noise_multiplier = 2.0;
  dp.clip_norm = 0.5;
  dp.expected_batch_size = 64;  // q = 1: both runs see the same batch
  TrainOptions options;
  options.learning_rate = 0.5;

  TensorList noisy = initial, clean = initial;
  auto source = privacy::NoiseSource::SeededForTesting(7);
  ASSERT_TRUE(TrainDpSgd(spec, options, dp, {&train, {}}, source, &noisy).ok());
  dp.noise_multiplier = 0;
  auto source2 = privacy::NoiseSource::SeededForTesting(7);
  ASSERT_TRUE(TrainDpSgd(spec, options, dp, {&train, {}}, source2, &clean).ok());

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
  TensorList params = InitModel(kSpec, 5);
  DpSgdOptions dp;
  dp.expected_batch_size = 1;  // q = 1/200: about 37% of the steps sample nobody
  auto source = privacy::NoiseSource::SeededForTesting(4);
  auto stats = TrainDpSgd(kSpec, TrainOptions{}, dp, {&train, {}}, source, &params);
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
  TensorList params = InitModel(kSpec, 5);
  DpSgdOptions dp;
  dp.expected_batch_size = 40;  // q = 0.4
  TrainOptions options;
  options.epochs = 3;  // 7.5 -> 8 steps
  auto source = privacy::NoiseSource::SeededForTesting(5);
  auto stats = TrainDpSgd(kSpec, options, dp, {&train, {}}, source, &params);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->steps, 8);
}

TEST(DpSgdTest, LearnsSeparableBlobsAtModerateNoise) {
  const data::Dataset train = Blobs(2000, 8, 4, 1), test = Blobs(400, 8, 4, 2);
  TensorList params = InitModel(kSpec, 5);
  DpSgdOptions dp;
  dp.noise_multiplier = 1.0;
  dp.clip_norm = 1.0;
  dp.expected_batch_size = 100;
  TrainOptions options;
  options.epochs = 5;  // 100 steps
  options.learning_rate = 0.5;
  auto source = privacy::NoiseSource::SeededForTesting(6);
  auto stats = TrainDpSgd(kSpec, options, dp, {&train, {}}, source, &params);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->steps, 100);
  EXPECT_GT(stats->train.accuracy, 0.6);
  auto eval = EvaluateModel(kSpec, params, {&test, {}});
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_GT(eval->accuracy, 0.9);  // chance is 0.25
}

TEST(DpSgdTest, SeededRunsAreReproducibleAndSecureNoiseIsReportedPrivate) {
  const data::Dataset train = Blobs(100, 8, 4, 1);
  DpSgdOptions dp;
  dp.expected_batch_size = 10;
  TensorList a = InitModel(kSpec, 5), b = a, c = a;
  auto sa = privacy::NoiseSource::SeededForTesting(9);
  auto sb = privacy::NoiseSource::SeededForTesting(9);
  auto sc = privacy::NoiseSource::SeededForTesting(10);
  ASSERT_TRUE(TrainDpSgd(kSpec, {}, dp, {&train, {}}, sa, &a).ok());
  ASSERT_TRUE(TrainDpSgd(kSpec, {}, dp, {&train, {}}, sb, &b).ok());
  ASSERT_TRUE(TrainDpSgd(kSpec, {}, dp, {&train, {}}, sc, &c).ok());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].data, b[i].data) << a[i].name();
  EXPECT_NE(a[0].data, c[0].data);

  auto secure = privacy::NoiseSource::Secure();
  auto stats = TrainDpSgd(kSpec, {}, dp, {&train, {}}, secure, &a);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->private_noise);
  dp.noise_multiplier = 0;  // no noise: not private whatever the source
  stats = TrainDpSgd(kSpec, {}, dp, {&train, {}}, secure, &a);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_FALSE(stats->private_noise);
}

TEST(DpSgdTest, RejectsBadInputsWithoutTouchingParamsOrDrawingNoise) {
  const data::Dataset train = Blobs(20, 8, 4, 1);
  const TensorList initial = InitModel(kSpec, 5);
  TensorList params = initial;
  auto source = privacy::NoiseSource::SeededForTesting(11);
  auto error = [&](const MlpSpec& spec, const TrainOptions& options, const DpSgdOptions& dp,
                   const data::DatasetView& view) {
    auto result = TrainDpSgd(spec, options, dp, view, source, &params);
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
  EXPECT_EQ(TrainDpSgd(kSpec, {}, dp, view, source, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);

  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(params[i].data, initial[i].data);
  auto fresh = privacy::NoiseSource::SeededForTesting(11);
  EXPECT_EQ(source.NextU64(), fresh.NextU64());  // no randomness was spent
}

TEST(DpSgdTest, DivergenceIsAnError) {
  const data::Dataset train = Blobs(64, 8, 4, 1);
  TensorList params = InitModel(kSpec, 5);
  TrainOptions options;
  options.epochs = 20;
  options.learning_rate = 1e38;
  DpSgdOptions dp;
  dp.expected_batch_size = 16;
  auto source = privacy::NoiseSource::SeededForTesting(12);
  auto result = TrainDpSgd(kSpec, options, dp, {&train, {}}, source, &params);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(result.status().message(), HasSubstr("diverged"));
}

// ---- The chunked exact sum (models/internal/train_loops.h) ----

// The grid satisfies the sensitivity bound stated in models/dp_sgd.h: noise std >= z (C + K g
// sqrt(d)), i.e. z times the clip norm plus the 2K grid roundings that may differ between
// neighbouring data sets; and a chunk's largest legitimate sum fits its share of 62 bits.
TEST(DpSgdChunksTest, GridCoversTheClipNormAndEveryChunksRounding) {
  const MlpSpec spec{784, {128}, 10};  // d = 101,770
  const int64_t d = 101'770;
  for (const double z : {0.3, 1.0, 1.9287, 8.0}) {
    for (const double clip : {1e-3, 0.5, 1.0, 40.0}) {
      for (const auto& [n, m] : {std::pair<int64_t, int64_t>{60'000, 2048},
                                 {60'000, 256},
                                 {1'000'000, 65'536},
                                 {100, 100},
                                 {7, 3}}) {
        SCOPED_TRACE(testing::Message() << "z " << z << " C " << clip << " n " << n << " m " << m);
        auto plan = internal::PlanDpSgd(spec, TrainOptions{}, DpSgdOptions{z, clip, m}, n);
        ASSERT_TRUE(plan.ok()) << plan.status();
        const int64_t k = (m + 255) / 256;
        EXPECT_EQ(plan->chunks, k);
        ASSERT_TRUE(plan->add_noise);
        using ld = long double;
        const ld g = std::ldexp(1.0L, plan->grid.exponent);
        const ld needed = static_cast<ld>(z) *
                          (static_cast<ld>(clip) + static_cast<ld>(k) * g * std::sqrt(ld(d)));
        EXPECT_GE(static_cast<ld>(plan->grid.variance) * g * g, needed * needed);
        EXPECT_GE(std::sqrt(static_cast<double>(plan->grid.variance)), 0x1p24);
        // K chunks of at most chunk_limit units each, plus noise of at most 2^37: below 2^63.
        EXPECT_LE(static_cast<ld>(plan->chunk_limit) * k, std::ldexp(1.0L, 62) * (1 + 1e-15L));
        const int64_t longest = plan->chunk_begin(1) - plan->chunk_begin(0);
        EXPECT_LE(4 * static_cast<ld>(longest) * clip / g, static_cast<ld>(plan->chunk_limit));
      }
    }
  }
  // Without noise the grid is the finest on which the (norm-capped) chunk sums fit.
  auto plain = internal::PlanDpSgd(spec, TrainOptions{}, DpSgdOptions{0, 1e30, 2048}, 60'000);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->add_noise);
  const long double g = std::ldexp(1.0L, plain->grid.exponent);
  EXPECT_LE(4 * 7500 * 256.0L / g, plain->chunk_limit);
  EXPECT_GT(4 * 7500 * 256.0L / (g / 2), plain->chunk_limit);
  // A noise multiplier too small for the data set's exact sum is refused up front.
  auto tiny = internal::PlanDpSgd(spec, TrainOptions{}, DpSgdOptions{1e-7, 1, 256}, 60'000);
  EXPECT_EQ(tiny.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tiny.status().message(), HasSubstr("noise_multiplier"));
}

TEST(DpSgdChunksTest, ChunksAreContiguousPositionRangesOfTheView) {
  auto plan = internal::PlanDpSgd(kSpec, TrainOptions{}, DpSgdOptions{1, 1, 700}, 1000);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->chunks, 3);  // ceil(700 / 256)
  // chunk(i) = floor(3 i / 1000): [0, 334), [334, 667), [667, 1000).
  EXPECT_EQ(plan->chunk_begin(0), 0);
  EXPECT_EQ(plan->chunk_begin(1), 334);
  EXPECT_EQ(plan->chunk_begin(2), 667);
  EXPECT_EQ(plan->chunk_begin(3), 1000);
  for (int64_t i : {0, 333, 334, 666, 667, 999}) {
    const int64_t j = 3 * i / 1000;
    EXPECT_LE(plan->chunk_begin(j), i);
    EXPECT_LT(i, plan->chunk_begin(j + 1));
  }
}

// A step on `world` steppers (one per rank, sharing one CPU backend), each rank's accumulator
// captured where the all-reduce would sum it; returns the captured accumulators (one per rank;
// for world 1 the stepper's own) and, per rank, the released gradient it went on to compute from
// its un-reduced accumulator.
struct RankCapture {
  std::vector<int64_t> units;  // before the all-reduce (world 1: the whole sum)
  std::vector<float> grads;    // the packed ws.grad() after the step (world 1: the release)
  int64_t rows = 0;
};

class DpSgdStepperTest : public ::testing::Test {
 protected:
  static constexpr int64_t kN = 1000;
  const MlpSpec spec_{12, {16}, 4};
  const data::Dataset data_ = Blobs(kN, 12, 4, 3);
  const TensorList params_ = InitModel(spec_, 4);
  std::unique_ptr<kernels::Backend> backend_ = kernels::OpenCpuBackend();

  std::vector<RankCapture> Run(const internal::DpSgdPlan& plan, const DpSgdOptions& dp, int world,
                               const std::vector<int64_t>& sample, uint64_t noise_seed) {
    kernels::FlushDenormalsScope flush;
    std::vector<RankCapture> out(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      auto ws = internal::NetWorkspace::Create(*backend_, spec_, 8, true).value();
      EXPECT_TRUE(ws->LoadData({&data_, {}}).ok());
      ws->UploadParams(params_);
      auto noise = privacy::NoiseSource::SeededForTesting(noise_seed);
      auto stepper =
          internal::DpSgdStepper::Create(*ws, plan, TrainOptions{}, dp, &noise, r, world);
      EXPECT_TRUE(stepper.ok()) << stepper.status();
      internal::DpSgdStepper& s = **stepper;
      RankCapture& capture = out[static_cast<size_t>(r)];
      auto copy_units = [&] {
        capture.units.assign(s.units(), s.units() + s.units_count());
        return absl::OkStatus();
      };
      s.set_all_reduce(copy_units);
      auto rows = s.Gradient(sample, 0);
      EXPECT_TRUE(rows.ok()) << rows.status();
      capture.rows = rows.value_or(-1);
      if (world == 1) (void)copy_units();
      capture.grads.assign(ws->grads_base(), ws->grads_base() + ws->trainable_span());
    }
    return out;
  }

  // The ranks' accumulators added as the int64 all-reduce adds them.
  static std::vector<int64_t> Reduce(const std::vector<RankCapture>& ranks) {
    std::vector<int64_t> sum(ranks[0].units.size(), 0);
    for (const RankCapture& r : ranks) {
      for (size_t i = 0; i < sum.size(); ++i) {
        sum[i] =
            static_cast<int64_t>(static_cast<uint64_t>(sum[i]) + static_cast<uint64_t>(r.units[i]));
      }
    }
    return sum;
  }
};

// Would have failed before: the summed float partial sums of the ranks depended on the split
// (and were released un-noised on every rank but 0). Now the integer sum, and hence the noised
// release, is the same whatever the number of ranks, including ranks without a chunk.
TEST_F(DpSgdStepperTest, IntegerSumIsTheSameHoweverTheChunksAreSpreadOverRanks) {
  const DpSgdOptions dp{1.0, 0.3, 700};  // K = 3
  auto plan = internal::PlanDpSgd(spec_, TrainOptions{}, dp, kN);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<int64_t> sample;
  auto sampling = privacy::NoiseSource::SeededForTesting(21);
  SamplePoissonBatch(kN, 700, sampling, &sample);
  const std::vector<RankCapture> one = Run(*plan, dp, 1, sample, 5);
  EXPECT_EQ(one[0].rows, static_cast<int64_t>(sample.size()));
  EXPECT_EQ(one[0].units.back(), 0);  // nothing refused
  for (int world : {2, 3, 4, 5}) {
    SCOPED_TRACE(testing::Message() << "world " << world);
    const std::vector<RankCapture> ranks = Run(*plan, dp, world, sample, 5);
    EXPECT_EQ(Reduce(ranks), one[0].units);
    int64_t rows = 0;
    for (const RankCapture& r : ranks) rows += r.rows;
    EXPECT_EQ(rows, static_cast<int64_t>(sample.size()));
    if (world > 3) {
      EXPECT_EQ(ranks[0].rows, 0) << "K = 3 chunks: rank 0 of " << world << " has none";
    }
  }
}

// The release is an exact function of the integer sum plus the noise: the noised accumulator
// minus the noiseless one (same grid) is exactly the discrete Gaussian integers an identically
// seeded source gives, one per parameter in layout order; and the gradient is
// float((units * g) / expected_batch_size).
TEST_F(DpSgdStepperTest, NoiseIsExactDiscreteGaussianIntegersOnTheExactSum) {
  const DpSgdOptions dp{1.0, 0.3, 700};
  auto plan = internal::PlanDpSgd(spec_, TrainOptions{}, dp, kN);
  ASSERT_TRUE(plan.ok()) << plan.status();
  internal::DpSgdPlan clean_plan = *plan;
  clean_plan.add_noise = false;  // the same grid, no noise
  std::vector<int64_t> sample;
  auto sampling = privacy::NoiseSource::SeededForTesting(22);
  SamplePoissonBatch(kN, 700, sampling, &sample);
  const RankCapture noised = Run(*plan, dp, 1, sample, 6)[0];
  const RankCapture clean = Run(clean_plan, dp, 1, sample, 6)[0];

  auto gaussian = privacy::DiscreteGaussian::Create(plan->grid.variance).value();
  auto source = privacy::NoiseSource::SeededForTesting(6);
  auto backend = kernels::OpenCpuBackend();
  auto ws = internal::NetWorkspace::Create(*backend, spec_, 1, true).value();
  std::vector<int64_t> expected_noise(static_cast<size_t>(ws->trainable_span()) + 1, 0);
  for (size_t p = 0; p < ws->num_trainable(); ++p) {
    for (int64_t k = 0; k < ws->param_size(p); ++k) {
      expected_noise[static_cast<size_t>(ws->param_offset(p) + k)] = gaussian.Sample(source);
    }
  }
  std::vector<int64_t> difference(noised.units.size());
  for (size_t i = 0; i < difference.size(); ++i) difference[i] = noised.units[i] - clean.units[i];
  EXPECT_EQ(difference, expected_noise);
  const double g = std::ldexp(1.0, plan->grid.exponent);
  for (size_t i = 0; i + 1 < noised.units.size(); ++i) {
    const float expected = static_cast<float>((static_cast<double>(noised.units[i]) * g) / 700.0);
    ASSERT_EQ(noised.grads[i], expected) << i;
  }
  // With noise on rank 0 only, the ranks' accumulators still add up to the same noised sum.
  EXPECT_EQ(Reduce(Run(*plan, dp, 3, sample, 6)), noised.units);
}

// The noise of step s + 1 is drawn on a second thread during step s: the released noise of
// consecutive steps is still the source's next draws in order, step after step, as if drawn in
// line (layout order, gaps zero), and nothing past the run's last step is drawn.
TEST_F(DpSgdStepperTest, NoiseOfConsecutiveStepsIsTheSourcesNextDrawsInOrder) {
  const DpSgdOptions dp{1.0, 0.3, 250};  // round(1000 / 250) = 4 steps
  auto plan = internal::PlanDpSgd(spec_, TrainOptions{}, dp, kN);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->steps, 4);
  internal::DpSgdPlan clean_plan = *plan;
  clean_plan.add_noise = false;
  std::vector<int64_t> sample;
  auto sampling = privacy::NoiseSource::SeededForTesting(23);
  SamplePoissonBatch(kN, 250, sampling, &sample);
  kernels::FlushDenormalsScope flush;
  // Each step's accumulator (Gradient does not move the parameters: the noiseless sums repeat).
  auto run = [&](const internal::DpSgdPlan& p, privacy::NoiseSource& noise) {
    auto ws = internal::NetWorkspace::Create(*backend_, spec_, p.capacity, true).value();
    EXPECT_TRUE(ws->LoadData({&data_, {}}).ok());
    ws->UploadParams(params_);
    auto stepper = internal::DpSgdStepper::Create(*ws, p, TrainOptions{}, dp, &noise).value();
    std::vector<std::vector<int64_t>> units;
    for (int64_t step = 0; step < p.steps; ++step) {
      EXPECT_TRUE(stepper->Gradient(sample, step).ok());
      units.emplace_back(stepper->units(), stepper->units() + stepper->units_count());
    }
    return units;
  };
  auto source = privacy::NoiseSource::SeededForTesting(9);
  auto unused = privacy::NoiseSource::SeededForTesting(9);
  const auto noised = run(*plan, source);
  const auto clean = run(clean_plan, unused);

  auto gaussian = privacy::DiscreteGaussian::Create(plan->grid.variance).value();
  auto expected_source = privacy::NoiseSource::SeededForTesting(9);
  auto ws = internal::NetWorkspace::Create(*backend_, spec_, 1, true).value();
  for (int64_t step = 0; step < 4; ++step) {
    std::vector<int64_t> expected(static_cast<size_t>(ws->trainable_span()) + 1, 0);
    for (size_t p = 0; p < ws->num_trainable(); ++p) {
      for (int64_t k = 0; k < ws->param_size(p); ++k) {
        expected[static_cast<size_t>(ws->param_offset(p) + k)] = gaussian.Sample(expected_source);
      }
    }
    std::vector<int64_t> difference(expected.size());
    for (size_t i = 0; i < difference.size(); ++i) {
      difference[i] = noised[static_cast<size_t>(step)][i] - clean[static_cast<size_t>(step)][i];
    }
    EXPECT_EQ(difference, expected) << "step " << step;
  }
  // The source is left exactly after the last step's draws.
  EXPECT_EQ(source.NextU64(), expected_source.NextU64());
}

// A single process's run is the stepper's: TrainDpSgd equals stepping by hand with the
// sampling key drawn first from the source (the key a data-parallel rank 0 broadcasts).
TEST_F(DpSgdStepperTest, TrainDpSgdIsTheStepperWithTheSamplingKeyDrawnFirst) {
  const DpSgdOptions dp{1.0, 0.3, 300};
  TrainOptions options;
  options.learning_rate = 0.2;
  options.momentum = 0.5;
  options.epochs = 2;  // round(2 * 1000 / 300) = 7 steps
  TensorList trained = params_;
  auto noise = privacy::NoiseSource::SeededForTesting(8);
  ASSERT_TRUE(TrainDpSgd(spec_, options, dp, {&data_, {}}, noise, &trained).ok());

  kernels::FlushDenormalsScope flush;
  auto plan = internal::PlanDpSgd(spec_, options, dp, kN).value();
  auto ws = internal::NetWorkspace::Create(*backend_, spec_, plan.capacity, true).value();
  ASSERT_TRUE(ws->LoadData({&data_, {}}).ok());
  ws->UploadParams(params_);
  auto by_hand = privacy::NoiseSource::SeededForTesting(8);
  auto sampling = privacy::NoiseSource::FromSharedKey(internal::DrawSamplingKey(by_hand), false);
  auto stepper = internal::DpSgdStepper::Create(*ws, plan, options, dp, &by_hand).value();
  std::vector<int64_t> sample;
  for (int64_t step = 0; step < 7; ++step) {
    SamplePoissonBatch(kN, 300, sampling, &sample);
    ASSERT_TRUE(stepper->Step(sample, step).ok());
  }
  TensorList stepped = params_;
  ASSERT_TRUE(ws->DownloadParams(&stepped).ok());
  for (size_t t = 0; t < stepped.size(); ++t) {
    ASSERT_EQ(stepped[t].data.size(), trained[t].data.size());
    EXPECT_EQ(std::memcmp(stepped[t].data.data(), trained[t].data.data(),
                          trained[t].data.size() * sizeof(float)),
              0)
        << trained[t].name();
  }
}

}  // namespace
}  // namespace huddle::models
