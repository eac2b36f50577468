// TrainUpdate: the same training as TrainModel / TrainDpSgd, then delta, norm and clipping by the
// update pipeline; errors.
#include "models/update.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "privacy/clip.h"
#include "tests/models/test_data.h"

namespace huddle::models {
namespace {

using ::testing::HasSubstr;

class TrainUpdateTest : public ::testing::Test {
 protected:
  TrainUpdateTest() : data_(Blobs(96, 6, 3, 11)) {
    view_.base = &data_;
    for (int64_t r = 89; r >= 0; --r) view_.indices.push_back(r);  // a view, not the whole set
    options_.train.batch_size = 16;
    options_.train.learning_rate = 0.2;
    options_.train.momentum = 0.5;
    options_.seed = 7;
  }

  // local - global by the public trainer, for comparison.
  TensorList ReferenceDelta(const TensorList& local) const {
    TensorList delta = local;
    for (size_t t = 0; t < delta.size(); ++t) {
      for (size_t i = 0; i < delta[t].data.size(); ++i) delta[t].data[i] -= global_[t].data[i];
    }
    return delta;
  }

  const MlpSpec spec_{6, {10, 5}, 3};  // biases of 10, 5, 3 floats exercise the layout's gaps
  const TensorList global_ = InitModel(spec_, 3);
  data::Dataset data_;
  data::DatasetView view_;
  UpdateOptions options_;
};

TEST_F(TrainUpdateTest, WithoutClippingTheDeltaIsExactlyLocalMinusGlobal) {
  TensorList local = global_;
  auto trained = TrainModel(spec_, options_.train, view_, options_.seed, &local);
  ASSERT_TRUE(trained.ok()) << trained.status();
  auto update = TrainUpdate(spec_, options_, view_, global_);
  ASSERT_TRUE(update.ok()) << update.status();
  const TensorList expected = ReferenceDelta(local);
  ASSERT_EQ(update->delta.size(), expected.size());
  for (size_t t = 0; t < expected.size(); ++t) {
    EXPECT_EQ(update->delta[t].spec, expected[t].spec);
    EXPECT_EQ(update->delta[t].data, expected[t].data) << expected[t].name();
  }
  EXPECT_FALSE(update->clipped);
  EXPECT_NEAR(update->norm, privacy::L2Norm(expected), 1e-12 * update->norm);
  EXPECT_EQ(update->train.steps, trained->steps);
  EXPECT_EQ(update->train.loss, trained->loss);
  EXPECT_EQ(update->train.accuracy, trained->accuracy);
  EXPECT_FALSE(update->dp_sgd.has_value());
}

TEST_F(TrainUpdateTest, ClippingScalesTheDeltaToTheBound) {
  TensorList local = global_;
  ASSERT_TRUE(TrainModel(spec_, options_.train, view_, options_.seed, &local).ok());
  const TensorList unclipped = ReferenceDelta(local);
  const double norm = privacy::L2Norm(unclipped);
  ASSERT_GT(norm, 0.1);
  options_.clip_norm = norm / 4;
  auto update = TrainUpdate(spec_, options_, view_, global_);
  ASSERT_TRUE(update.ok()) << update.status();
  EXPECT_TRUE(update->clipped);
  EXPECT_NEAR(update->norm, norm, 1e-12 * norm);
  const double after = privacy::L2Norm(update->delta);
  EXPECT_LE(after, options_.clip_norm);
  EXPECT_GT(after, options_.clip_norm * (1 - 1e-5));
  for (size_t t = 0; t < unclipped.size(); ++t) {
    for (size_t i = 0; i < unclipped[t].data.size(); ++i) {
      EXPECT_NEAR(update->delta[t].data[i], unclipped[t].data[i] / 4,
                  1e-6 * std::abs(unclipped[t].data[i]) + 1e-12);
    }
  }
  // A bound above the norm leaves the delta alone.
  options_.clip_norm = norm * 2;
  auto loose = TrainUpdate(spec_, options_, view_, global_);
  ASSERT_TRUE(loose.ok());
  EXPECT_FALSE(loose->clipped);
  for (size_t t = 0; t < unclipped.size(); ++t) EXPECT_EQ(loose->delta[t].data, unclipped[t].data);
}

TEST_F(TrainUpdateTest, DpSgdTrainsAsTrainDpSgdWithTheSameNoise) {
  DpSgdOptions dp;
  dp.noise_multiplier = 0.7;
  dp.clip_norm = 0.5;
  dp.expected_batch_size = 24;
  options_.train.epochs = 2;
  TensorList local = global_;
  auto reference_noise = privacy::NoiseSource::SeededForTesting(42);
  auto trained = TrainDpSgd(spec_, options_.train, dp, view_, reference_noise, &local);
  ASSERT_TRUE(trained.ok()) << trained.status();

  auto noise = privacy::NoiseSource::SeededForTesting(42);
  options_.dp_sgd = dp;
  options_.noise = &noise;
  auto update = TrainUpdate(spec_, options_, view_, global_);
  ASSERT_TRUE(update.ok()) << update.status();
  ASSERT_TRUE(update->dp_sgd.has_value());
  EXPECT_EQ(update->dp_sgd->steps, trained->steps);
  EXPECT_EQ(update->dp_sgd->event().sampling_rate, trained->event().sampling_rate);
  EXPECT_EQ(update->train.examples, trained->train.examples);
  const TensorList expected = ReferenceDelta(local);
  for (size_t t = 0; t < expected.size(); ++t) {
    EXPECT_EQ(update->delta[t].data, expected[t].data) << expected[t].name();
  }
}

TEST_F(TrainUpdateTest, BadOptionsAreRefusedNamingTheField) {
  options_.clip_norm = -1;
  auto negative = TrainUpdate(spec_, options_, view_, global_);
  ASSERT_FALSE(negative.ok());
  EXPECT_THAT(std::string(negative.status().message()), HasSubstr("clip_norm"));

  options_.clip_norm = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(TrainUpdate(spec_, options_, view_, global_).ok());

  options_.clip_norm = 1;
  options_.dp_sgd = DpSgdOptions{};
  auto no_noise = TrainUpdate(spec_, options_, view_, global_);
  ASSERT_FALSE(no_noise.ok());
  EXPECT_THAT(std::string(no_noise.status().message()), HasSubstr("NoiseSource"));

  options_.dp_sgd.reset();
  options_.train.learning_rate = 0;
  auto lr = TrainUpdate(spec_, options_, view_, global_);
  ASSERT_FALSE(lr.ok());
  EXPECT_THAT(std::string(lr.status().message()), HasSubstr("learning_rate"));

  options_.train.learning_rate = 0.1;
  TensorList wrong = global_;
  wrong.pop_back();
  EXPECT_TRUE(absl::IsInvalidArgument(TrainUpdate(spec_, options_, view_, wrong).status()));
}

TEST_F(TrainUpdateTest, ADivergedRunReturnsNoUpdate) {
  options_.train.learning_rate = 1e30;
  auto update = TrainUpdate(spec_, options_, view_, global_);
  ASSERT_FALSE(update.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(update.status())) << update.status();
  EXPECT_THAT(std::string(update.status().message()), HasSubstr("diverged"));
}

}  // namespace
}  // namespace huddle::models
