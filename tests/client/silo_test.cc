// A silo (client/silo.h): ranks that are threads of this process, on CPU backends with Gloo over
// loopback TCP, trained as one federated client.
#include "client/silo.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "client/agent.h"
#include "common/rng.h"
#include "models/wire_spec.h"
#include "privacy/clip.h"
#include "tests/models/test_data.h"
#include "tests/testing/tensors.h"

namespace huddle::client {
namespace {

const models::MlpSpec kSpec{20, {32, 16}, 4};
// A silo's delta against a single client's: see TwoAndThreeRanksMakeTheSingleClientsUpdate.
constexpr double kDeltaTolerance = 5e-7;

SiloOptions CpuSilo(int64_t nproc) {
  SiloOptions o;
  o.nproc = nproc;
  o.device = {kernels::DeviceRequest::Kind::kCpu, 0};
  o.timeout = std::chrono::seconds(20);
  return o;
}

// One round's settings as the agent makes them: 2 epochs of momentum SGD, batch 32.
models::UpdateOptions RoundOptions(double clip_norm) {
  models::UpdateOptions o;
  o.train.epochs = 2;
  o.train.batch_size = 32;
  o.train.learning_rate = 0.05;
  o.train.momentum = 0.9;
  o.train.weight_decay = 1e-4;
  o.seed = 77;
  o.clip_norm = clip_norm;
  return o;
}

using huddle::testing::MaxAbsDiff;

class SiloTest : public ::testing::Test {
 protected:
  // 600 rows: a batch of 32 splits 16/16 over 2 ranks and 10/11/11 over 3; the last batch of
  // each epoch has 24 rows.
  data::Dataset data_ = models::Blobs(600, kSpec.input_dim, kSpec.num_classes, 3);
  data::DatasetView view_{&data_, {}};
  TensorList global_ = models::InitModel(kSpec, 5);
};

TEST_F(SiloTest, TwoAndThreeRanksMakeTheSingleClientsUpdate) {
  for (double clip : {0.0, 0.5}) {
    const models::UpdateOptions options = RoundOptions(clip);
    auto single = models::TrainUpdate(kSpec, options, view_, global_);
    ASSERT_TRUE(single.ok()) << single.status();
    if (clip > 0) {
      ASSERT_TRUE(single->clipped) << "the clip must bind for this case to test it";
    }
    for (int64_t nproc : {2, 3}) {
      SCOPED_TRACE(::testing::Message() << "nproc " << nproc << ", clip_norm " << clip);
      auto silo = Silo::Create(CpuSilo(nproc));
      ASSERT_TRUE(silo.ok()) << silo.status();
      EXPECT_EQ((*silo)->description(), fmt::format("{} x cpu", nproc));
      auto update = (*silo)->TrainUpdate(kSpec, options, view_, global_);
      ASSERT_TRUE(update.ok()) << update.status();
      // The same trajectory up to the order of float sums (partial GEMMs summed across ranks,
      // slices scaled by 16/32 or 11/32): 38 momentum steps, deltas O(0.01-1). Measured max
      // |delta difference|: 1.2e-7 (2 ranks) and 1.5e-7 (3 ranks) unclipped, 1.5e-8 clipped to
      // 0.5; norms agree to 3e-8 relative. Stated tolerance: kDeltaTolerance on every value,
      // 1e-7 relative on the norm.
      const double diff = MaxAbsDiff(update->delta, single->delta);
      std::printf("nproc %lld clip %.1f: max |delta difference| %.3g, norm %.9g vs %.9g\n",
                  static_cast<long long>(nproc), clip, diff, update->norm, single->norm);
      EXPECT_LT(diff, kDeltaTolerance);
      EXPECT_NEAR(update->norm, single->norm, 1e-7 * single->norm);
      EXPECT_EQ(update->clipped, single->clipped);
      if (clip > 0) {
        EXPECT_LE(privacy::L2Norm(update->delta), clip);
      }
      EXPECT_EQ(update->train.steps, single->train.steps);
      EXPECT_EQ(update->train.examples, single->train.examples);
      EXPECT_NEAR(update->train.loss, single->train.loss, 1e-5);
      EXPECT_NEAR(update->train.accuracy, single->train.accuracy, 0.002);
      EXPECT_FALSE(update->dp_sgd.has_value());
    }
  }
}

// A batch-norm model trains with the statistics of the silo's whole batch (SyncBatchNorm), so its
// update, running statistics included, is the single client's too.
TEST_F(SiloTest, BatchNormModelMakesTheSingleClientsUpdate) {
  const models::MlpSpec spec{20, {32, 16}, 4, /*batch_norm=*/true};
  const TensorList global = models::InitModel(spec, 5);
  const models::UpdateOptions options = RoundOptions(0);
  auto single = models::TrainUpdate(spec, options, view_, global);
  ASSERT_TRUE(single.ok()) << single.status();
  auto silo = Silo::Create(CpuSilo(3));
  ASSERT_TRUE(silo.ok()) << silo.status();
  auto update = (*silo)->TrainUpdate(spec, options, view_, global);
  ASSERT_TRUE(update.ok()) << update.status();
  ASSERT_EQ(update->delta.size(), models::Layout(spec).size());
  const double diff = MaxAbsDiff(update->delta, single->delta);
  std::printf("batch norm, nproc 3: max |delta difference| %.3g\n", diff);
  EXPECT_LT(diff, kDeltaTolerance);
  // The running statistics moved, and are part of the update.
  EXPECT_NE(update->delta.back().data, std::vector<float>(16, 0.0f));
}

TEST_F(SiloTest, RoundsReuseTheConnectedRanksAndRepeatBitwise) {
  auto silo = Silo::Create(CpuSilo(2));
  ASSERT_TRUE(silo.ok()) << silo.status();
  models::UpdateOptions options = RoundOptions(0);
  options.train.epochs = 1;
  TensorList first;
  for (uint64_t round = 1; round <= 3; ++round) {
    options.seed = round;
    auto update = (*silo)->TrainUpdate(kSpec, options, view_, global_);
    ASSERT_TRUE(update.ok()) << "round " << round << ": " << update.status();
    auto single = models::TrainUpdate(kSpec, options, view_, global_);
    ASSERT_TRUE(single.ok()) << single.status();
    EXPECT_LT(MaxAbsDiff(update->delta, single->delta), kDeltaTolerance) << "round " << round;
    if (round == 1) first = update->delta;
  }
  // The same seed again, on another silo: the same bits.
  auto other = Silo::Create(CpuSilo(2));
  ASSERT_TRUE(other.ok()) << other.status();
  options.seed = 1;
  auto again = (*other)->TrainUpdate(kSpec, options, view_, global_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(MaxAbsDiff(again->delta, first), 0.0);
}

// A silo's DP-SGD update is bitwise a single client's (models::TrainUpdate) given the same noise
// source state: the same sample, the same chunks wherever they are computed, their exact int64
// sum and rank 0's single draw of noise (models/dp_sgd.h). 300 expected rows of 600 make K = 2
// chunks: with 3 ranks, rank 0 computes none.
TEST_F(SiloTest, DpSgdUpdateIsBitwiseTheSingleClientsUpdate) {
  for (double clip : {0.0, 0.05}) {
    models::UpdateOptions options = RoundOptions(clip);
    options.dp_sgd.emplace();
    options.dp_sgd->noise_multiplier = 1.1;
    options.dp_sgd->clip_norm = 1.0;
    options.dp_sgd->expected_batch_size = 300;
    privacy::NoiseSource single_noise = privacy::NoiseSource::SeededForTesting(4);
    options.noise = &single_noise;
    auto single = models::TrainUpdate(kSpec, options, view_, global_);
    ASSERT_TRUE(single.ok()) << single.status();
    if (clip > 0) {
      ASSERT_TRUE(single->clipped) << "the update's clip must bind to test it";
    }
    for (int64_t nproc : {2, 3}) {
      SCOPED_TRACE(::testing::Message() << "nproc " << nproc << ", clip_norm " << clip);
      privacy::NoiseSource noise = privacy::NoiseSource::SeededForTesting(4);
      options.noise = &noise;
      auto silo = Silo::Create(CpuSilo(nproc));
      ASSERT_TRUE(silo.ok()) << silo.status();
      auto update = (*silo)->TrainUpdate(kSpec, options, view_, global_);
      ASSERT_TRUE(update.ok()) << update.status();
      ASSERT_EQ(update->delta.size(), single->delta.size());
      for (size_t t = 0; t < single->delta.size(); ++t) {
        const std::vector<float>& a = update->delta[t].data;
        const std::vector<float>& b = single->delta[t].data;
        ASSERT_EQ(a.size(), b.size());
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
            << single->delta[t].name();
      }
      EXPECT_EQ(update->norm, single->norm);
      EXPECT_EQ(update->clipped, single->clipped);
      EXPECT_EQ(update->dp_sgd->event().steps, single->dp_sgd->event().steps);
      EXPECT_EQ(update->dp_sgd->train.examples, single->dp_sgd->train.examples);
    }
  }
}

TEST_F(SiloTest, DpSgdSpendsTheSingleClientsEventAndTheAgentAccountsIt) {
  models::UpdateOptions options = RoundOptions(0);
  options.dp_sgd.emplace();
  options.dp_sgd->noise_multiplier = 1.1;
  options.dp_sgd->clip_norm = 1.0;
  options.dp_sgd->expected_batch_size = 64;
  privacy::NoiseSource noise = privacy::NoiseSource::SeededForTesting(4);
  options.noise = &noise;
  auto single = models::TrainUpdate(kSpec, options, view_, global_);
  ASSERT_TRUE(single.ok()) << single.status();
  auto silo = Silo::Create(CpuSilo(2));
  ASSERT_TRUE(silo.ok()) << silo.status();
  auto update = (*silo)->TrainUpdate(kSpec, options, view_, global_);
  ASSERT_TRUE(update.ok()) << update.status();
  ASSERT_TRUE(update->dp_sgd.has_value());
  // round(2 epochs * 600 / 64) = 19 steps of the 64/600-sampled Gaussian with z = 1.1.
  const privacy::DpEvent event = update->dp_sgd->event();
  EXPECT_EQ(event.steps, 19);
  EXPECT_DOUBLE_EQ(event.sampling_rate, 64.0 / 600.0);
  EXPECT_DOUBLE_EQ(event.noise_multiplier, 1.1);
  EXPECT_EQ(event.steps, single->dp_sgd->event().steps);
  EXPECT_DOUBLE_EQ(event.sampling_rate, single->dp_sgd->event().sampling_rate);
  EXPECT_FALSE(update->dp_sgd->private_noise) << "a seeded source is not private";
  EXPECT_EQ(update->train.steps, 19);

  // Through the agent: a fit instruction with DP-SGD trains in the silo and is accounted.
  ClientAgent agent("silo-1", &view_);
  agent.builtin()->set_silo(silo->get());
  agent.set_noise_source(privacy::NoiseSource::SeededForTesting(5));
  ASSERT_TRUE(
      agent.Handle(wire::MakeMessage(wire::Welcome{"job", models::ModelSpecToWire(kSpec), 500}))
          .ok());
  wire::FitInstruction fit;
  fit.model_version = 0;
  fit.train.epochs = 2;
  fit.train.learning_rate = 0.05;
  fit.train.dp_sgd = wire::DpSgdConfig{};
  fit.train.dp_sgd->noise_multiplier = 1.1;
  fit.train.dp_sgd->clip_norm = 1.0;
  fit.train.dp_sgd->expected_batch_size = 64;
  fit.seed = 9;
  fit.nonce = std::string(wire::kNonceBytes, 'n');
  wire::Message msg = wire::MakeMessage(fit, 1);
  for (const Tensor& t : global_) msg.tensors.push_back(wire::TensorPayload::CopyOf(t));
  auto replies = agent.Handle(msg);
  ASSERT_TRUE(replies.ok()) << replies.status();
  ASSERT_EQ(replies->size(), 1u);
  EXPECT_EQ((*replies)[0].type(), wire::MessageType::kUploadRequest);
  const auto& accounted = agent.privacy_guard().entries();
  ASSERT_EQ(accounted.size(), 1u);
  EXPECT_EQ(accounted[0].unit, privacy::kUnitExample);
  EXPECT_EQ(accounted[0].steps, 19);
  EXPECT_DOUBLE_EQ(accounted[0].sampling_rate, 64.0 / 600.0);
  EXPECT_DOUBLE_EQ(accounted[0].noise_multiplier, 1.1);
}

TEST_F(SiloTest, BadNprocAndTooFewGpusAreRefused) {
  for (int64_t nproc : {int64_t{0}, int64_t{-1}, kMaxSiloRanks + 1}) {
    auto silo = Silo::Create(CpuSilo(nproc));
    ASSERT_FALSE(silo.ok()) << nproc;
    EXPECT_TRUE(absl::IsInvalidArgument(silo.status())) << silo.status();
    EXPECT_NE(silo.status().message().find("silo.nproc is " + std::to_string(nproc)),
              absl::string_view::npos)
        << silo.status();
  }
  // One GPU more than the host has (none here, or in a build without CUDA).
  SiloOptions cuda = CpuSilo(kernels::CudaDeviceCount() + 1);
  cuda.device = {kernels::DeviceRequest::Kind::kCuda, 0};
  auto silo = Silo::Create(cuda);
  ASSERT_FALSE(silo.ok());
  const std::string message(silo.status().message());
  const StatusOr<int> gpus = kernels::CountCudaDevices();
  if (gpus.ok()) {
    EXPECT_TRUE(absl::IsInvalidArgument(silo.status())) << message;
    EXPECT_NE(message.find("GPU(s)"), std::string::npos) << message;
  } else {
    // No plugin, no CUDA library or no GPU: the reason the loader gives, named.
    EXPECT_TRUE(absl::IsFailedPrecondition(silo.status())) << message;
    EXPECT_NE(message.find(std::string(gpus.status().message())), std::string::npos) << message;
  }
}

TEST_F(SiloTest, AFailingRankIsAnErrorNamingItNotAHangAndTheNextRoundWorks) {
  std::atomic<bool> fail{true};
  SiloOptions o = CpuSilo(3);
  o.after_epoch_for_testing = [&](int rank, int64_t epoch) -> Status {
    if (fail && rank == 1 && epoch == 0) return absl::InternalError("injected device fault");
    return absl::OkStatus();
  };
  auto silo = Silo::Create(o);
  ASSERT_TRUE(silo.ok()) << silo.status();
  models::UpdateOptions options = RoundOptions(0);
  options.train.epochs = 3;
  const auto start = std::chrono::steady_clock::now();
  auto update = (*silo)->TrainUpdate(kSpec, options, view_, global_);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(update.ok());
  EXPECT_TRUE(absl::IsInternal(update.status())) << update.status();
  EXPECT_EQ(update.status().message(), "silo rank 1 of 3 (cpu): injected device fault");
  // Ranks 0 and 2 stop as soon as rank 1's connections close, not at the 20 s timeout.
  EXPECT_LT(seconds, 10.0);
  std::printf("a failing rank ended the round after %.2f s\n", seconds);

  fail = false;
  auto next = (*silo)->TrainUpdate(kSpec, options, view_, global_);
  ASSERT_TRUE(next.ok()) << next.status();
  auto single = models::TrainUpdate(kSpec, options, view_, global_);
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_LT(MaxAbsDiff(next->delta, single->delta), kDeltaTolerance);
}

TEST_F(SiloTest, BadRoundOptionsAreRefusedBeforeTraining) {
  auto silo = Silo::Create(CpuSilo(2));
  ASSERT_TRUE(silo.ok()) << silo.status();
  models::UpdateOptions options = RoundOptions(-1);
  auto update = (*silo)->TrainUpdate(kSpec, options, view_, global_);
  ASSERT_FALSE(update.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(update.status())) << update.status();
  options = RoundOptions(0);
  options.train.learning_rate = -1;
  update = (*silo)->TrainUpdate(kSpec, options, view_, global_);
  ASSERT_FALSE(update.ok());
  EXPECT_NE(update.status().message().find("learning_rate"), absl::string_view::npos)
      << update.status();
  // Every rank refused the same options; the group is connected again for the next round.
  update = (*silo)->TrainUpdate(kSpec, RoundOptions(0), view_, global_);
  EXPECT_TRUE(update.ok()) << update.status();
}

}  // namespace
}  // namespace huddle::client
