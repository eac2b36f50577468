// Data-parallel training with Gloo among ranks that are threads of this process (loopback TCP).
#include "datacenter/data_parallel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <optional>
#include <thread>

#include "common/file_util.h"
#include "datacenter/checkpoint.h"
#include "tests/models/test_data.h"
#include "tests/testing/tensors.h"

namespace huddle::datacenter {
namespace {

using huddle::testing::BitwiseEqual;
using huddle::testing::MaxAbsDiff;
using std::chrono::milliseconds;

const models::MlpSpec kSpec{20, {32, 16}, 4};

struct RankResult {
  Status status;
  DataParallelStats stats;
  TensorList params;
};

DataParallelOptions BaseOptions(int64_t batch) {
  DataParallelOptions o;
  o.train.epochs = 2;
  o.train.batch_size = batch;
  o.train.learning_rate = 0.05;
  o.train.momentum = 0.9;
  o.train.weight_decay = 1e-4;
  o.seed = 7;
  o.checksum_every = 1;
  return o;
}

// Trains on `world` threads; rank r's options come from options(r), its data from data_of(r) when
// given. Every rank starts from a different initialisation: rank 0's must win.
std::vector<RankResult> TrainModel(const models::ModelSpec& spec, int world,
                                   const data::Dataset& data,
                                   const std::function<DataParallelOptions(int)>& options,
                                   milliseconds timeout = milliseconds(30000),
                                   const std::function<const data::Dataset*(int)>& data_of = {}) {
  auto server = transport::KvServer::Start("tcp://127.0.0.1:0");
  EXPECT_TRUE(server.ok());
  std::vector<RankResult> results(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto store = transport::OpenKvStore((*server)->url());
      CollectiveOptions co;
      co.rank = r;
      co.world_size = world;
      co.timeout = timeout;
      auto collective = ConnectGloo(**store, co);
      if (!collective.ok()) {
        results[r].status = collective.status();
        return;
      }
      results[r].params = models::InitModel(spec, 100 + r);
      const data::Dataset* mine = data_of ? data_of(r) : &data;
      auto stats = TrainDataParallel(**collective, spec, options(r), data::DatasetView{mine, {}},
                                     &results[r].params);
      results[r].status = stats.status();
      if (stats.ok()) results[r].stats = *stats;
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

std::vector<RankResult> Train(int world, const data::Dataset& data,
                              const std::function<DataParallelOptions(int)>& options,
                              milliseconds timeout = milliseconds(30000),
                              const std::function<const data::Dataset*(int)>& data_of = {}) {
  return TrainModel(kSpec, world, data, options, timeout, data_of);
}

// Trains 2 ranks with options(r) until rank 0 has written its state after the first epoch (then
// every rank stops, as if killed), and reads that checkpoint back.
StatusOr<TrainingState> CheckpointAfterFirstEpoch(
    const models::MlpSpec& spec, const data::Dataset& data,
    const std::function<DataParallelOptions(int)>& options, const std::string& name) {
  const std::string path = ::testing::TempDir() + "/" + name;
  auto stopped = TrainModel(spec, 2, data, [&](int r) {
    DataParallelOptions o = options(r);
    o.state_on_rank0 = true;
    o.on_epoch = [path, r](const EpochReport& report) -> Status {
      if (r != 0) {
        EXPECT_EQ(report.state, nullptr);  // the state is rank 0's alone
      } else if (report.state == nullptr) {
        return absl::InternalError("rank 0 has no state");
      } else {
        HUDDLE_RETURN_IF_ERROR(WriteTrainingState(path, *report.state));
      }
      return absl::AbortedError("killed after the first epoch");
    };
    return o;
  });
  EXPECT_TRUE(absl::IsAborted(stopped[0].status)) << stopped[0].status;
  return ReadTrainingState(path);
}

// The same 2 ranks resumed from `saved` (read by rank 0 only).
std::vector<RankResult> ResumeFrom(const models::MlpSpec& spec, const data::Dataset& data,
                                   const std::function<DataParallelOptions(int)>& options,
                                   const TrainingState& saved) {
  return TrainModel(spec, 2, data, [&](int r) {
    DataParallelOptions o = options(r);
    if (r == 0) o.resume = &saved;
    return o;
  });
}

TEST(DataParallel, ReplicasAreBitwiseIdenticalAndMatchOneRankWithTheGlobalBatch) {
  // 1000 rows: with 4 ranks x 16 the last global batch (40 rows) splits 10/10/10/10, with 2 x 16
  // it splits 20/20; the single rank takes it whole.
  const data::Dataset data = models::Blobs(1000, kSpec.input_dim, kSpec.num_classes, 3);
  for (int world : {2, 4}) {
    SCOPED_TRACE(::testing::Message() << "world " << world);
    auto ranks = Train(world, data, [](int) { return BaseOptions(16); });
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(ranks[r].status.ok()) << "rank " << r << ": " << ranks[r].status;
      EXPECT_TRUE(BitwiseEqual(ranks[r].params, ranks[0].params)) << "rank " << r;
      EXPECT_EQ(ranks[r].stats.steps, 2 * ((1000 + 16 * world - 1) / (16 * world)));
      EXPECT_EQ(ranks[r].stats.checksums, ranks[r].stats.steps + 1);
      EXPECT_EQ(ranks[r].stats.loss, ranks[0].stats.loss);
    }
    auto one = Train(1, data, [&](int) { return BaseOptions(16 * world); });
    ASSERT_TRUE(one[0].status.ok()) << one[0].status;
    EXPECT_FALSE(BitwiseEqual(one[0].params, models::InitModel(kSpec, 100)));
    // The same trajectory up to the order of float sums (per-rank partial GEMMs summed across
    // ranks instead of one GEMM): parameters are O(0.1-1), and 64 steps of momentum SGD amplify
    // the rounding differences to ~1e-5 at most (measured: 2.4e-7 for 2 ranks, 1.1e-5 for 4).
    // Stated tolerance: 5e-5 absolute on every parameter.
    const double diff = MaxAbsDiff(ranks[0].params, one[0].params);
    EXPECT_LT(diff, 5e-5) << "world " << world;
    std::printf("world %d x batch 16 vs 1 x batch %d: max |param difference| %.3g\n", world,
                16 * world, diff);
    EXPECT_NEAR(ranks[0].stats.loss, one[0].stats.loss, 1e-5);
    EXPECT_NEAR(ranks[0].stats.accuracy, one[0].stats.accuracy, 0.002);
  }
}

TEST(DataParallel, RanksWithoutRowsInTheLastBatchContributeZeros) {
  // 66 rows, 4 ranks x 16: the last global batch has 2 rows, so ranks 0 and 2 get none.
  const data::Dataset data = models::Blobs(66, kSpec.input_dim, kSpec.num_classes, 8);
  auto ranks = Train(4, data, [](int) { return BaseOptions(16); });
  auto one = Train(1, data, [](int) { return BaseOptions(64); });
  ASSERT_TRUE(one[0].status.ok()) << one[0].status;
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(ranks[r].status.ok()) << "rank " << r << ": " << ranks[r].status;
    EXPECT_TRUE(BitwiseEqual(ranks[r].params, ranks[0].params)) << "rank " << r;
  }
  EXPECT_EQ(ranks[0].stats.examples, 2 * 16);  // two epochs of one full slice and one empty one
  EXPECT_EQ(ranks[1].stats.examples, 2 * 17);
  EXPECT_LT(MaxAbsDiff(ranks[0].params, one[0].params), 5e-5);
}

// SyncBatchNorm: batch norm over the global batch, from per-rank sums. N ranks x batch b must
// train the model one process trains with batch N*b (batch statistics of the concatenated batch,
// and the running statistics too), also when the slices are uneven or empty.
TEST(DataParallel, SyncBatchNormMatchesOneProcessOnTheConcatenatedBatch) {
  const models::MlpSpec spec{20, {32, 16}, 4, /*batch_norm=*/true};
  struct Case {
    int world;
    int64_t rows;
  };
  // 1002 rows: the last global batch is 42 rows, split 21/21 or 10/11/10/11. 66 rows with 4 x 16:
  // the last global batch has 2 rows, so ranks 0 and 2 have none and still take part.
  for (const Case c : {Case{2, 1002}, Case{4, 1002}, Case{4, 66}}) {
    SCOPED_TRACE(::testing::Message() << "world " << c.world << ", " << c.rows << " rows");
    const data::Dataset data = models::Blobs(c.rows, spec.input_dim, spec.num_classes, 5);
    auto ranks = TrainModel(spec, c.world, data, [](int) { return BaseOptions(16); });
    for (int r = 0; r < c.world; ++r) {
      ASSERT_TRUE(ranks[r].status.ok()) << "rank " << r << ": " << ranks[r].status;
      EXPECT_TRUE(BitwiseEqual(ranks[r].params, ranks[0].params)) << "rank " << r;
    }
    auto one = TrainModel(spec, 1, data, [&](int) { return BaseOptions(16 * c.world); });
    ASSERT_TRUE(one[0].status.ok()) << one[0].status;
    // One process is TrainModel's own loop: the same bits as the client's trainer.
    TensorList client = models::InitModel(spec, 100);
    models::TrainOptions train = BaseOptions(16 * c.world).train;
    ASSERT_TRUE(models::TrainModel(spec, train, {&data, {}}, 7, &client).ok());
    EXPECT_TRUE(BitwiseEqual(client, one[0].params));
    // Measured: at most 4.8e-7 (every parameter and running statistic, O(0.1-1)); the sums of
    // the statistics and of the gradients are taken in another order. Stated tolerance: 5e-5,
    // as for the model without batch norm. (With per-rank batch statistics instead, the sums not
    // all-reduced, the ranks' running statistics differ and the replica check stops the job.)
    const double diff = MaxAbsDiff(ranks[0].params, one[0].params);
    EXPECT_LT(diff, 5e-5);
    std::printf("SyncBN world %d x batch 16 vs 1 x batch %d, %lld rows: max |difference| %.3g\n",
                c.world, 16 * c.world, static_cast<long long>(c.rows), diff);
    // The running statistics moved, identically.
    const size_t running_mean = models::NumTrainable(spec);
    EXPECT_NE(ranks[0].params[running_mean].data, std::vector<float>(32, 0.0f));
  }
}

// Dropout's masks are drawn by each row's position in the global batch, not in the rank's slice,
// so N ranks x batch b train the model one process trains with batch N*b, dropout included.
// Would have failed before: every rank drew the masks of rows 0.. of its own slice.
TEST(DataParallel, DropoutMasksDoNotDependOnTheNumberOfRanks) {
  models::ModelSpec spec = models::MlpSpec{20, {32}, 4};
  ASSERT_EQ(spec.layers[1].kind, models::LayerKind::kRelu);
  spec.layers.insert(spec.layers.begin() + 2, {.kind = models::LayerKind::kDropout, .rate = 0.5});
  const data::Dataset data = models::Blobs(1000, 20, 4, 6);
  for (int world : {2, 4}) {
    SCOPED_TRACE(::testing::Message() << "world " << world);
    auto ranks = TrainModel(spec, world, data, [](int) { return BaseOptions(16); });
    for (int r = 0; r < world; ++r) ASSERT_TRUE(ranks[r].status.ok()) << ranks[r].status;
    auto one = TrainModel(spec, 1, data, [&](int) { return BaseOptions(16 * world); });
    ASSERT_TRUE(one[0].status.ok()) << one[0].status;
    // As without dropout: only the order of the float sums differs.
    EXPECT_LT(MaxAbsDiff(ranks[0].params, one[0].params), 5e-5);
  }
}

TEST(DataParallel, BucketingAndOverlapDoNotChangeTheResult) {
  const data::Dataset data = models::Blobs(300, kSpec.input_dim, kSpec.num_classes, 4);
  auto reference = Train(2, data, [](int) { return BaseOptions(8); });
  ASSERT_TRUE(reference[0].status.ok()) << reference[0].status;
  EXPECT_EQ(reference[0].stats.buckets, 1);  // the whole model fits the first bucket
  auto many = Train(2, data, [](int) {
    DataParallelOptions o = BaseOptions(8);
    o.first_bucket_bytes = 4;
    o.bucket_bytes = 4;
    return o;
  });
  ASSERT_TRUE(many[0].status.ok()) << many[0].status;
  EXPECT_EQ(many[0].stats.buckets, 6);  // one per parameter
  auto serial = Train(2, data, [](int) {
    DataParallelOptions o = BaseOptions(8);
    o.overlap = false;
    o.bucket_bytes = o.first_bucket_bytes = 1000;
    return o;
  });
  ASSERT_TRUE(serial[0].status.ok()) << serial[0].status;
  // Two ranks: each element is one addition, whatever the bucketing.
  EXPECT_TRUE(BitwiseEqual(many[0].params, reference[0].params));
  EXPECT_TRUE(BitwiseEqual(serial[0].params, reference[0].params));
  EXPECT_GT(many[0].stats.bytes_reduced, 0);
}

TEST(DataParallel, DivergedReplicasStopTheJobNamingStepAndRank) {
  const data::Dataset data = models::Blobs(200, kSpec.input_dim, kSpec.num_classes, 5);
  // Rank 2's memory flips one bit of a weight after step 2, as failing hardware would.
  auto ranks = Train(3, data, [](int r) {
    DataParallelOptions o = BaseOptions(8);
    o.checksum_every = 3;
    if (r == 2) {
      o.after_step_for_testing = [](int64_t step, float* params, int64_t) {
        if (step == 2) params[5] = std::nextafter(params[5], 1.0f);
      };
    }
    return o;
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(absl::IsDataLoss(ranks[r].status)) << "rank " << r << ": " << ranks[r].status;
    EXPECT_NE(ranks[r].status.message().find("at step 3"), std::string::npos) << ranks[r].status;
    EXPECT_NE(ranks[r].status.message().find("rank(s) 2 differ"), std::string::npos)
        << ranks[r].status;
  }
}

TEST(DataParallel, ARankThatStopsEndsTheOthersWithAnError) {
  const data::Dataset data = models::Blobs(400, kSpec.input_dim, kSpec.num_classes, 6);
  auto start = std::chrono::steady_clock::now();
  auto ranks = Train(
      3, data,
      [](int r) {
        DataParallelOptions o = BaseOptions(8);
        o.train.epochs = 3;
        if (r == 1) {
          o.on_epoch = [](const EpochReport&) { return absl::AbortedError("rank 1 stops"); };
        }
        return o;
      },
      milliseconds(5000));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_TRUE(absl::IsAborted(ranks[1].status)) << ranks[1].status;
  for (int r : {0, 2}) {
    EXPECT_TRUE(absl::IsUnavailable(ranks[r].status) || absl::IsDeadlineExceeded(ranks[r].status))
        << "rank " << r << ": " << ranks[r].status;
  }
}

TEST(DataParallel, RanksWithADifferentConfigurationOrDataRefuseToStart) {
  const data::Dataset data = models::Blobs(200, kSpec.input_dim, kSpec.num_classes, 5);
  auto ranks = Train(3, data, [](int r) {
    DataParallelOptions o = BaseOptions(8);
    if (r == 2) o.train.learning_rate = 0.06;
    return o;
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(absl::IsFailedPrecondition(ranks[r].status)) << "rank " << r << ranks[r].status;
    EXPECT_NE(ranks[r].status.message().find("rank(s) 2 have a different"), std::string::npos)
        << ranks[r].status;
    EXPECT_EQ(ranks[r].stats.steps, 0);
  }
  data::Dataset relabelled = data;
  relabelled.labels[17] = (relabelled.labels[17] + 1) % 4;
  ranks = Train(
      2, data, [](int) { return BaseOptions(8); }, milliseconds(30000),
      [&](int r) { return r == 1 ? &relabelled : &data; });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(ranks[r].status.message().find("rank(s) 1 hold different training data"),
              std::string::npos)
        << ranks[r].status;
  }
}

// Issue 18: the agreement covered the data's size and labels only, so a rank with poisoned
// examples of the right shape trained. Now one changed feature value is refused at start-up on
// every rank, naming the rank.
TEST(DataParallel, ARankWithPoisonedExamplesOfTheRightShapeIsRefused) {
  const data::Dataset data = models::Blobs(200, kSpec.input_dim, kSpec.num_classes, 5);
  data::Dataset poisoned = data;
  poisoned.features[123] += 0.5f;  // row 6; its label and the data's size unchanged
  auto ranks = Train(
      3, data, [](int) { return BaseOptions(8); }, milliseconds(30000),
      [&](int r) { return r == 2 ? &poisoned : &data; });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(absl::IsFailedPrecondition(ranks[r].status)) << "rank " << r << ranks[r].status;
    EXPECT_NE(ranks[r].status.message().find("rank(s) 2 hold different training data"),
              std::string::npos)
        << ranks[r].status;
    EXPECT_EQ(ranks[r].stats.steps, 0);
  }
}

// Issue 18: a stop (a signal) took effect only at the end of an epoch. Now a stop requested on
// ONE rank mid-epoch ends every rank after the same step (the next multiple of
// stop_check_every), rank 0 hands over the state reached, and a resume from it ends with the
// bits of an uninterrupted run, the last epoch's loss included.
TEST(DataParallel, AStopMidEpochEndsEveryRankAtTheSameStepAndResumesExactly) {
  const data::Dataset data = models::Blobs(300, kSpec.input_dim, kSpec.num_classes, 8);
  auto options = [](int) {
    DataParallelOptions o = BaseOptions(8);
    o.train.epochs = 3;
    o.stop_check_every = 4;
    return o;
  };
  auto straight = Train(2, data, options);
  ASSERT_TRUE(straight[0].status.ok()) << straight[0].status;

  // 19 steps of 16 rows per epoch: the flag goes up on rank 1 after step 25 (epoch 1, row 96),
  // so every rank stops after step 28, 9 global batches (144 rows) into epoch 1.
  std::atomic<bool> stop_on_rank1{false}, never{false};
  std::optional<TrainingState> saved;
  auto stopped = Train(2, data, [&](int r) {
    DataParallelOptions o = options(r);
    o.state_on_rank0 = true;
    o.stop = r == 1 ? &stop_on_rank1 : &never;
    if (r == 1) {
      o.after_step_for_testing = [&](int64_t step, float*, int64_t) {
        if (step == 25) stop_on_rank1 = true;
      };
    }
    if (r == 0)
      o.on_stop = [&](const TrainingState& s) -> Status {
        saved = s;
        return absl::OkStatus();
      };
    return o;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(absl::IsCancelled(stopped[r].status)) << "rank " << r << stopped[r].status;
    EXPECT_NE(stopped[r].status.message().find("after step 28"), std::string::npos)
        << stopped[r].status;
  }
  ASSERT_TRUE(saved.has_value());
  EXPECT_EQ(saved->steps, 28);
  EXPECT_EQ(saved->epochs_done, 1);
  EXPECT_EQ(saved->epoch_rows, 9 * 16);
  EXPECT_GT(saved->epoch_correct, 0);
  // Through the checkpoint file, as the command does.
  const std::string path = ::testing::TempDir() + "/dc_stop_checkpoint.bin";
  ASSERT_TRUE(WriteTrainingState(path, *saved).ok());
  auto back = ReadTrainingState(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->epoch_rows, saved->epoch_rows);
  EXPECT_EQ(back->epoch_loss_sum, saved->epoch_loss_sum);
  auto resumed = ResumeFrom(kSpec, data, options, *back);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(resumed[r].status.ok()) << resumed[r].status;
    EXPECT_TRUE(BitwiseEqual(resumed[r].params, straight[0].params)) << "rank " << r;
    EXPECT_EQ(resumed[r].stats.steps, straight[0].stats.steps);
    EXPECT_EQ(resumed[r].stats.loss, straight[0].stats.loss);
    EXPECT_EQ(resumed[r].stats.accuracy, straight[0].stats.accuracy);
  }
}

// A job stopped after its first epoch and resumed from rank 0's checkpoint ends with the same
// bits as one that ran straight through; the other ranks need no copy of the checkpoint.
TEST(DataParallel, ResumeFromACheckpointEqualsAnUninterruptedRun) {
  const data::Dataset data = models::Blobs(300, kSpec.input_dim, kSpec.num_classes, 8);
  auto options = [](int) {
    DataParallelOptions o = BaseOptions(8);
    o.train.epochs = 3;
    return o;
  };
  auto straight = Train(2, data, options);
  ASSERT_TRUE(straight[0].status.ok()) << straight[0].status;

  auto saved = CheckpointAfterFirstEpoch(kSpec, data, options, "dc_resume_checkpoint.bin");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->epochs_done, 1);
  EXPECT_EQ(saved->steps, (300 + 15) / 16);
  EXPECT_EQ(saved->seed, 7u);
  EXPECT_EQ(saved->world_size, 2);
  EXPECT_EQ(saved->velocity.size(), saved->params.size());  // momentum 0.9
  auto resumed = ResumeFrom(kSpec, data, options, *saved);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(resumed[r].status.ok()) << resumed[r].status;
    EXPECT_TRUE(BitwiseEqual(resumed[r].params, straight[0].params)) << "rank " << r;
    EXPECT_EQ(resumed[r].stats.steps, straight[0].stats.steps);
    EXPECT_EQ(resumed[r].stats.loss, straight[0].stats.loss);
  }

  // A checkpoint of another run (another seed) is refused on every rank.
  TrainingState other = *saved;
  other.seed = 8;
  auto refused = ResumeFrom(kSpec, data, options, other);
  EXPECT_NE(refused[0].status.message().find("seed 8"), std::string::npos) << refused[0].status;
  EXPECT_NE(refused[1].status.message().find("rank 0 refused"), std::string::npos)
      << refused[1].status;

  // So is one of another model, and every rank learns it (not only rank 0).
  TrainingState wrong = *saved;
  wrong.params = models::InitModel(models::MlpSpec{20, {8}, 4}, 1);
  refused = ResumeFrom(kSpec, data, options, wrong);
  EXPECT_NE(refused[0].status.message().find("does not fit this model"), std::string::npos)
      << refused[0].status;
  EXPECT_NE(refused[1].status.message().find("rank 0 refused"), std::string::npos)
      << refused[1].status;
}

// A batch-norm model's checkpoint carries the running statistics (with the parameters) and the
// momentum of the trained tensors only; resuming from it continues the same run bitwise.
TEST(DataParallel, BatchNormResumeEqualsAnUninterruptedRun) {
  const models::MlpSpec spec{20, {32, 16}, 4, /*batch_norm=*/true};
  const data::Dataset data = models::Blobs(300, spec.input_dim, spec.num_classes, 8);
  auto options = [](int) {
    DataParallelOptions o = BaseOptions(8);
    o.train.epochs = 2;
    return o;
  };
  auto straight = TrainModel(spec, 2, data, options);
  ASSERT_TRUE(straight[0].status.ok()) << straight[0].status;
  auto saved = CheckpointAfterFirstEpoch(spec, data, options, "dc_bn_resume_checkpoint.bin");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->params.size(), models::Layout(spec).size());
  EXPECT_EQ(saved->velocity.size(), models::NumTrainable(spec));
  auto resumed = ResumeFrom(spec, data, options, *saved);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(resumed[r].status.ok()) << resumed[r].status;
    EXPECT_TRUE(BitwiseEqual(resumed[r].params, straight[0].params)) << "rank " << r;
  }
}

TEST(DataParallel, DamagedCheckpointsAreRefused) {
  TrainingState s;
  s.epochs_done = 2;
  s.steps = 40;
  s.seed = 3;
  s.world_size = 4;
  s.batch_size = 16;
  s.seconds = 1.5;
  s.params = models::InitModel(kSpec, 1);
  const std::string path = ::testing::TempDir() + "/dc_checkpoint.bin";
  ASSERT_TRUE(WriteTrainingState(path, s).ok());
  auto back = ReadTrainingState(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->steps, 40);
  EXPECT_EQ(back->seconds, 1.5);
  EXPECT_TRUE(BitwiseEqual(back->params, s.params));
  EXPECT_TRUE(back->velocity.empty());

  auto bytes = ReadFile(path);
  ASSERT_TRUE(bytes.ok());
  std::string flipped = *bytes;
  flipped[flipped.size() / 2] ^= 0x01;
  ASSERT_TRUE(WriteFileAtomic(path, flipped).ok());
  auto bad = ReadTrainingState(path);
  EXPECT_TRUE(absl::IsDataLoss(bad.status())) << bad.status();
  EXPECT_NE(bad.status().message().find("damaged"), std::string::npos) << bad.status();
  ASSERT_TRUE(WriteFileAtomic(path, bytes->substr(0, 20)).ok());
  EXPECT_TRUE(absl::IsDataLoss(ReadTrainingState(path).status()));
  ASSERT_TRUE(WriteFileAtomic(path, "HUDDLEM1" + bytes->substr(8)).ok());
  EXPECT_NE(ReadTrainingState(path).status().message().find("bad magic"), std::string::npos);
}

// DP-SGD across ranks is the single-process release, bit for bit: the same secret Poisson sample
// (from rank 0's key, the key TrainDpSgd draws first), the same chunks computed wherever they
// land, their exact int64 sum, ONE draw of exact discrete Gaussian noise (rank 0's) per step.
// With the same seeded source N ranks end with exactly the parameters of models::TrainDpSgd
// (before: within 1.8e-7, the ranks' float partial sums added in another order, and un-noised
// partial sums of ranks 1.. added after rank 0's noise). Two settings: K = 2 chunks for 300
// expected rows of 600 (with 3 ranks, rank 0 has no chunk); and q = 1/200 with K = 1, where
// ~37% of the steps sample nobody and all ranks but the last have no chunk. The first setting also
// with dropout: masks drawn by the step and the row's position in the sample, not by the chunk's
// rank (would have failed before: a rank counted its own chunks' passes, from row 0 each).
TEST(DataParallel, DpSgdAcrossRanksIsBitwiseTheSingleProcessRelease) {
  struct Setting {
    int64_t n, expected_batch, steps;
    bool dropout = false;
  };
  for (const Setting& setting :
       {Setting{600, 300, 4}, Setting{200, 1, 400}, Setting{600, 300, 4, true}}) {
    SCOPED_TRACE(::testing::Message() << "n " << setting.n << ", expected batch "
                                      << setting.expected_batch << ", dropout " << setting.dropout);
    models::ModelSpec spec = kSpec;
    if (setting.dropout) {
      ASSERT_EQ(spec.layers[1].kind, models::LayerKind::kRelu);
      spec.layers.insert(spec.layers.begin() + 2,
                         {.kind = models::LayerKind::kDropout, .rate = 0.5});
    }
    const data::Dataset data = models::Blobs(setting.n, kSpec.input_dim, kSpec.num_classes, 9);
    const models::DpSgdOptions dp{1.0, 0.5, setting.expected_batch};
    DataParallelOptions base = BaseOptions(8);
    base.train.learning_rate = 0.5;
    base.seed = 0;  // TrainDpSgd's dropout seed
    // Single process: models::TrainDpSgd from rank 0's initialisation.
    TensorList single = models::InitModel(spec, 100);
    auto single_noise = privacy::NoiseSource::SeededForTesting(11);
    auto single_stats = models::TrainDpSgd(spec, base.train, dp, data::DatasetView{&data, {}},
                                           single_noise, &single);
    ASSERT_TRUE(single_stats.ok()) << single_stats.status();
    ASSERT_EQ(single_stats->steps, setting.steps);
    for (int world : {1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << "world " << world);
      std::vector<privacy::NoiseSource> noise;
      for (int r = 0; r < world; ++r) noise.push_back(privacy::NoiseSource::SeededForTesting(11));
      auto ranks = TrainModel(spec, world, data, [&](int r) {
        DataParallelOptions o = base;
        o.dp_sgd = DataParallelDpSgd{dp, &noise[r]};
        return o;
      });
      int64_t examples = 0;
      for (int r = 0; r < world; ++r) {
        ASSERT_TRUE(ranks[r].status.ok()) << "rank " << r << ": " << ranks[r].status;
        EXPECT_TRUE(BitwiseEqual(ranks[r].params, single)) << "rank " << r;
        ASSERT_TRUE(ranks[r].stats.dp_event.has_value());
        EXPECT_EQ(ranks[r].stats.dp_event->steps, setting.steps);
        EXPECT_EQ(ranks[r].stats.buckets, 1);
        examples += ranks[r].stats.examples;
      }
      EXPECT_EQ(examples, single_stats->train.examples);  // the same sample, split by chunks
      EXPECT_DOUBLE_EQ(ranks[0].stats.dp_event->sampling_rate,
                       static_cast<double>(setting.expected_batch) / setting.n);
      EXPECT_EQ(ranks[0].stats.dp_event->noise_multiplier, 1.0);
      EXPECT_FALSE(ranks[0].stats.private_noise);  // seeded: NOT private
      if (world == 3) {
        EXPECT_EQ(ranks[0].stats.examples, 0) << "rank 0 has no chunk";
        EXPECT_GT(ranks[2].stats.examples, 0);
      }
      if (world > 1) {
        // The int64 accumulators (trainable parameters + 1 values) went through the collective.
        EXPECT_GT(ranks[0].stats.bytes_reduced, 0);
      }
    }
  }
}

// A DP-SGD run resumed from its checkpoint continues at the checkpoint's step (with fresh
// randomness) and accounts for all steps; a checkpoint of the other kind is refused.
TEST(DataParallel, DpSgdResumesAtItsStepAndCountsEveryStep) {
  const data::Dataset data = models::Blobs(600, kSpec.input_dim, kSpec.num_classes, 9);
  std::vector<privacy::NoiseSource> noise;
  for (int r = 0; r < 2; ++r) noise.push_back(privacy::NoiseSource::SeededForTesting(5 + r));
  auto dp_options = [&](int r) {
    DataParallelOptions o = BaseOptions(8);
    o.dp_sgd = DataParallelDpSgd{models::DpSgdOptions{1.0, 0.5, 60}, &noise[r]};
    return o;
  };
  auto saved = CheckpointAfterFirstEpoch(kSpec, data, dp_options, "dc_dp_checkpoint.bin");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_TRUE(saved->dp_sgd);
  EXPECT_EQ(saved->steps, 10);  // one epoch = ceil(600 / 60) steps
  auto resumed = ResumeFrom(kSpec, data, dp_options, *saved);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(resumed[r].status.ok()) << resumed[r].status;
    EXPECT_EQ(resumed[r].stats.steps, 20);
    EXPECT_EQ(resumed[r].stats.dp_event->steps, 20);  // the spend of every step, not 10
    EXPECT_TRUE(BitwiseEqual(resumed[r].params, resumed[0].params));
  }
  EXPECT_FALSE(BitwiseEqual(resumed[0].params, saved->params));  // it trained on
  // A DP-SGD checkpoint does not continue a run without DP-SGD (nor the reverse).
  auto refused = ResumeFrom(
      kSpec, data, [](int) { return BaseOptions(8); }, *saved);
  EXPECT_NE(refused[0].status.message().find("written by a DP-SGD run"), std::string::npos)
      << refused[0].status;
}

TEST(DataParallel, RefusesBadOptions) {
  DataParallelOptions o = BaseOptions(8);
  o.bucket_bytes = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateDataParallelOptions(o)));
  o = BaseOptions(8);
  o.checksum_every = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateDataParallelOptions(o)));
  o = BaseOptions(0);
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateDataParallelOptions(o)));
}

}  // namespace
}  // namespace huddle::datacenter
