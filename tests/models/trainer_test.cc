// The one training loop (models/trainer.h): its gradient-synchronisation seam is called as the
// datacenter trainer relies on (every layer, last to first, once per step, then FinishStep), a
// sync at world 1 changes no bit, a sync's error stops training, and bad loop options are
// refused with the field named.
#include "models/trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/models/test_data.h"

namespace huddle::models {
namespace {

using ::testing::HasSubstr;

// Records the calls; optionally fails FinishStep at a given step.
class RecordingSync final : public GradientSync {
 public:
  void StartStep(int64_t global_rows) override {
    calls.push_back("start " + std::to_string(global_rows));
  }
  void LayerDone(size_t layer) override { calls.push_back("layer " + std::to_string(layer)); }
  Status FinishStep() override {
    calls.push_back("finish");
    if (++steps == fail_at) return absl::UnavailableError("rank 1 is gone");
    return absl::OkStatus();
  }
  void AllReduceBatchNormSums(double* /*sums*/, int64_t /*count*/) override {
    calls.push_back("bn");
  }
  Status AllReduceUnits(std::span<int64_t> /*units*/) override {
    calls.push_back("units");
    return absl::OkStatus();
  }
  std::vector<std::string> calls;
  int steps = 0;
  int fail_at = -1;
};

ModelSpec SmallCnn() {
  ModelSpec spec;
  spec.input = {1, 6, 6};
  spec.layers = {{.kind = LayerKind::kConv2d, .out = 3, .kernel = 3},
                 {.kind = LayerKind::kRelu},
                 {.kind = LayerKind::kFlatten},
                 {.kind = LayerKind::kDense, .out = 4}};
  return spec;
}

TrainOptions Options() {
  TrainOptions o;
  o.epochs = 2;
  o.batch_size = 8;
  o.learning_rate = 0.1;
  o.momentum = 0.5;
  return o;
}

TensorList Train(const ModelSpec& spec, const data::Dataset& d, GradientSync* sync) {
  Trainer::Loop loop;
  loop.seed = 3;
  loop.sync = sync;
  auto trainer = Trainer::Create(spec, Options(), {&d, {}}, loop);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  TensorList params = InitModel(spec, 2);
  (*trainer)->UploadParams(params);
  EXPECT_TRUE((*trainer)->TrainEpochs(0, 0, {}, {}).ok());
  EXPECT_EQ((*trainer)->steps(), 2 * 3);  // 20 rows in batches of 8: 3 steps an epoch
  EXPECT_EQ((*trainer)->examples(), 2 * 20);
  EXPECT_TRUE((*trainer)->DownloadParams(&params).ok());
  return params;
}

TEST(TrainerTest, TheSyncSeesEveryLayerLastToFirstOnceAStepAndChangesNoBitAtWorldOne) {
  const ModelSpec spec = SmallCnn();
  const data::Dataset d = Blobs(20, 36, 4, 1);
  RecordingSync sync;
  const TensorList with = Train(spec, d, &sync);
  const TensorList without = Train(spec, d, nullptr);
  for (size_t t = 0; t < with.size(); ++t) {
    EXPECT_EQ(std::memcmp(with[t].data.data(), without[t].data.data(),
                          with[t].data.size() * sizeof(float)),
              0)
        << with[t].name();
  }
  // Per step: start (global rows), layers 3, 2, 1, 0, finish; the last batch has 4 rows.
  const std::vector<std::string> step8 = {"start 8", "layer 3", "layer 2",
                                          "layer 1", "layer 0", "finish"};
  ASSERT_EQ(sync.calls.size(), 6 * step8.size());
  for (size_t s = 0; s < 6; ++s) {
    for (size_t k = 1; k < step8.size(); ++k) {
      EXPECT_EQ(sync.calls[s * step8.size() + k], step8[k]) << "step " << s;
    }
    EXPECT_EQ(sync.calls[s * step8.size()], s % 3 == 2 ? "start 4" : "start 8") << "step " << s;
  }
}

TEST(TrainerTest, ASyncErrorStopsTrainingWithIt) {
  const ModelSpec spec = SmallCnn();
  const data::Dataset d = Blobs(20, 36, 4, 1);
  RecordingSync sync;
  sync.fail_at = 2;
  Trainer::Loop loop;
  loop.sync = &sync;
  auto trainer = Trainer::Create(spec, Options(), {&d, {}}, loop).value();
  trainer->UploadParams(InitModel(spec, 2));
  int after = 0;
  const Status s = trainer->TrainEpochs(0, 0,
                                        [&](int64_t) {
                                          ++after;
                                          return absl::OkStatus();
                                        },
                                        {});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(after, 1) << "the failed step is not reported as done";
  EXPECT_EQ(trainer->steps(), 1);
}

TEST(TrainerTest, LoopOptionsAreChecked) {
  const ModelSpec spec = SmallCnn();
  const data::Dataset d = Blobs(20, 36, 4, 1);
  Trainer::Loop two;
  two.world = 2;
  auto no_sync = Trainer::Create(spec, Options(), {&d, {}}, two);
  EXPECT_THAT(no_sync.status().message(), HasSubstr("GradientSync"));
  Trainer::Loop bad_rank;
  bad_rank.rank = 1;
  EXPECT_THAT(Trainer::Create(spec, Options(), {&d, {}}, bad_rank).status().message(),
              HasSubstr("rank 1 of a world of 1"));
  Trainer::Loop negative;
  negative.global_batch = -1;
  EXPECT_THAT(Trainer::Create(spec, Options(), {&d, {}}, negative).status().message(),
              HasSubstr("global batch is -1"));
  TrainOptions zero = Options();
  zero.batch_size = 0;
  EXPECT_THAT(Trainer::Create(spec, zero, {&d, {}}, {}).status().message(),
              HasSubstr("batch_size is 0"));
  const data::Dataset wrong = Blobs(20, 35, 4, 1);
  EXPECT_THAT(Trainer::Create(spec, Options(), {&wrong, {}}, {}).status().message(),
              HasSubstr("35 features"));
  // The wrong trainer for the call.
  auto sgd = Trainer::Create(spec, Options(), {&d, {}}, {}).value();
  auto sampling = privacy::NoiseSource::SeededForTesting(1);
  EXPECT_EQ(sgd->TrainDpSgd(0, sampling, {}, {}).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace huddle::models
