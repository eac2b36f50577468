// The parameter-server mode end to end, its ranks threads of this process talking ZeroMQ over
// 127.0.0.1 (datacenter/parameter_server.h): sync mode against the all-reduce mode, async
// training with a worker that vanishes, a resume, and the job's key.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "datacenter/parameter_server.h"
#include "kernels/backend.h"
#include "tests/models/test_data.h"
#include "tests/testing/tensors.h"

namespace huddle::datacenter {
namespace {

using huddle::testing::MaxAbsDiff;

const models::MlpSpec kSpec{20, {32, 16}, 4};

PsJob MakeJob(int servers, int workers, bool async, int64_t n) {
  PsJob job;
  job.spec = kSpec;
  job.train.epochs = 2;
  job.train.batch_size = 16;
  job.train.learning_rate = 0.05;
  job.train.momentum = 0.9;
  job.train.weight_decay = 1e-4;
  job.seed = 7;
  job.ps.servers = servers;
  job.ps.async = async;
  job.world_size = servers + workers;
  job.examples = n;
  job.timeout_ms = 5000;
  job.init = models::InitModel(kSpec, 100);
  return job;
}

struct PsRun {
  Status server0;
  PsStats stats;
  std::vector<Status> ranks;          // every rank's outcome
  std::vector<TrainingState> epochs;  // server 0's reports
};

// Runs every rank of `job` on threads; worker w's options from `worker_options(w)`.
PsRun RunJob(const PsJob& job, const data::Dataset& data, const TrainingState* resume = nullptr,
             const std::function<void(PsWorkerOptions&)>& tweak = {}) {
  auto server = transport::KvServer::Start("tcp://127.0.0.1:0", {}, job.auth);
  EXPECT_TRUE(server.ok());
  PsRun run;
  run.ranks.resize(static_cast<size_t>(job.world_size));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < job.world_size; ++r) {
    threads.emplace_back([&, r] {
      auto store = transport::OpenKvStore((*server)->url(), std::chrono::seconds(10), job.auth);
      if (!store.ok()) {
        run.ranks[r] = store.status();
        return;
      }
      if (r < job.ps.servers) {
        PsServerOptions o;
        o.server = static_cast<int>(r);
        if (r == 0) {
          o.resume = resume;
          o.on_epoch = [&](const EpochReport& e, const PsStats&) {
            run.epochs.push_back(*e.state);
            return absl::OkStatus();
          };
        }
        auto stats = RunPsServer(**store, job, o);
        run.ranks[r] = stats.status();
        if (r == 0 && stats.ok()) run.stats = *stats;
        return;
      }
      PsWorkerOptions o;
      o.worker = r - job.ps.servers;
      if (tweak) tweak(o);
      run.ranks[r] = RunPsWorker(**store, job, o, data::DatasetView{&data, {}}).status();
    });
  }
  for (auto& t : threads) t.join();
  run.server0 = run.ranks[0];
  return run;
}

// Sync mode without backups is the all-reduce mode's synchronous SGD: W workers x batch B take
// the global batch of W*B rows of the same order each step, averaged by rows. The all-reduce mode
// with W ranks x B equals one process with batch W*B up to float sums (data_parallel_test.cc);
// this compares with that one process (models::TrainModel) directly.
TEST(ParameterServer, SyncWithoutBackupsMatchesTheAllReduceMode) {
  const data::Dataset data = models::Blobs(1002, 20, 4, 5);  // a short last step: 1002 % 32 = 10
  TensorList reference = models::InitModel(kSpec, 100);
  models::TrainOptions train = MakeJob(1, 2, false, 1002).train;
  train.batch_size = 32;
  ASSERT_TRUE(models::TrainModel(kSpec, train, {&data, {}}, 7, &reference).ok());
  for (int servers : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << servers << " server(s)");
    const PsJob job = MakeJob(servers, 2, /*async=*/false, data.size());
    const PsRun run = RunJob(job, data);
    for (const Status& st : run.ranks) ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(run.epochs.size(), 2u);
    EXPECT_EQ(run.stats.steps, 2 * 32);  // ceil(1002 / 32) steps per epoch
    EXPECT_EQ(run.stats.late_dropped, 0);
    const double diff = MaxAbsDiff(run.epochs.back().params, reference);
    // Measured: about 1e-7 (the sum over workers is taken in double, in arrival order).
    EXPECT_LT(diff, 5e-5);
    std::printf("PS sync, %d server(s), 2 workers x 16 vs one process x 32: max |diff| %.3g\n",
                servers, diff);
    EXPECT_EQ(run.epochs.back().velocity.size(), reference.size()) << "momentum checkpointed";
  }
}

TEST(ParameterServer, AsyncTrainsAndGoesOnWhenAWorkerVanishes) {
  const data::Dataset data = models::Blobs(1200, 20, 4, 6);
  PsJob job = MakeJob(2, 3, /*async=*/true, data.size());
  job.timeout_ms = 1500;
  job.ps.staleness_bound = 4;
  const PsRun run = RunJob(job, data, nullptr, [](PsWorkerOptions& o) {
    if (o.worker == 2) o.vanish_after_step = [](int64_t steps) { return steps == 5; };
  });
  ASSERT_TRUE(run.server0.ok()) << run.server0;
  EXPECT_TRUE(run.ranks[1].ok()) << run.ranks[1];
  EXPECT_TRUE(run.ranks[2].ok() && run.ranks[3].ok());
  EXPECT_TRUE(absl::IsAborted(run.ranks[4])) << run.ranks[4];
  EXPECT_EQ(run.stats.dead_ranks, std::vector<int64_t>{4});
  // Every batch of both epochs counted once (75 per epoch), the dead one's included or re-run.
  EXPECT_EQ(run.stats.gradients, 2 * 75);
  EXPECT_GE(run.stats.steps, 2 * 75);
  EXPECT_LE(run.stats.staleness_max, 2 + 4 + 1);
  ASSERT_EQ(run.epochs.size(), 2u);
  models::EvalStats before = *models::EvaluateModel(kSpec, job.init, {&data, {}});
  models::EvalStats after = *models::EvaluateModel(kSpec, run.epochs.back().params, {&data, {}});
  EXPECT_GT(after.accuracy, 0.9);
  EXPECT_LT(after.loss, before.loss);
}

TEST(ParameterServer, ResumesFromAnEpochsStateAsTheUninterruptedSyncRun) {
  const data::Dataset data = models::Blobs(600, 20, 4, 8);
  PsJob job = MakeJob(2, 2, /*async=*/false, data.size());
  const PsRun whole = RunJob(job, data);
  ASSERT_TRUE(whole.server0.ok()) << whole.server0;
  ASSERT_EQ(whole.epochs.size(), 2u);
  // A resume from the first epoch's state: the second epoch again, from the restored shards.
  const TrainingState after_one = whole.epochs[0];
  const PsRun resumed = RunJob(job, data, &after_one);
  ASSERT_TRUE(resumed.server0.ok()) << resumed.server0;
  ASSERT_EQ(resumed.epochs.size(), 1u);
  EXPECT_EQ(resumed.epochs[0].epochs_done, 2);
  EXPECT_EQ(resumed.epochs[0].steps, whole.epochs[1].steps);
  // Sync mode with two workers: the same sums in at most two orders.
  EXPECT_LT(MaxAbsDiff(resumed.epochs[0].params, whole.epochs[1].params), 1e-5);
  EXPECT_LT(MaxAbsDiff(resumed.epochs[0].velocity, whole.epochs[1].velocity), 1e-5);
}

TEST(ParameterServer, BackupWorkerStepsDropTheLateGradient) {
  const data::Dataset data = models::Blobs(480, 20, 4, 9);
  PsJob job = MakeJob(1, 3, /*async=*/false, data.size());
  job.ps.backup_workers = 1;
  const PsRun run = RunJob(job, data, nullptr, [](PsWorkerOptions& o) {
    if (o.worker == 0) o.sleep_ms_per_step = 20;  // the slow one, usually the backup
  });
  for (const Status& st : run.ranks) ASSERT_TRUE(st.ok()) << st;
  // 30 batches per epoch in steps of 3: 10 steps per epoch, each taking 2 gradients.
  EXPECT_EQ(run.stats.steps, 20);
  EXPECT_EQ(run.stats.gradients, 40);
  // At most one late gradient per step (a step's third batch is not run at all when the two
  // others close the step before anyone takes it); the slow worker is late in most steps.
  EXPECT_GE(run.stats.late_dropped, 1);
  EXPECT_LE(run.stats.late_dropped, 20);
}

TEST(ParameterServer, WithTheJobsKeyOnlyItsHoldersAreServed) {
  const data::Dataset data = models::Blobs(200, 20, 4, 10);
  PsJob job = MakeJob(1, 1, /*async=*/true, data.size());
  job.train.epochs = 1;
  auto auth = transport::GenerateKvAuth();
  ASSERT_TRUE(auth.ok());
  job.auth = *auth;
  const PsRun run = RunJob(job, data);
  for (const Status& st : run.ranks) ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(run.stats.gradients, 13);
}

// A worker configured differently from the servers (here its learning rate) is told so at its
// first request, naming both configurations, instead of waiting out its timeout.
TEST(ParameterServer, AWorkerConfiguredDifferentlyIsToldWhatDiffers) {
  const data::Dataset data = models::Blobs(200, 20, 4, 10);
  PsJob job = MakeJob(1, 1, /*async=*/true, data.size());
  job.timeout_ms = 3000;
  PsJob other = job;
  other.train.learning_rate = 0.1;
  auto server = transport::KvServer::Start("tcp://127.0.0.1:0", {}, std::nullopt);
  ASSERT_TRUE(server.ok());
  Status server_status, worker_status;
  std::thread ps([&] {
    auto store = transport::OpenKvStore((*server)->url(), std::chrono::seconds(10), std::nullopt);
    ASSERT_TRUE(store.ok());
    server_status = RunPsServer(**store, job, PsServerOptions{}).status();
  });
  const auto start = std::chrono::steady_clock::now();
  {
    auto store = transport::OpenKvStore((*server)->url(), std::chrono::seconds(10), std::nullopt);
    ASSERT_TRUE(store.ok());
    worker_status = RunPsWorker(**store, other, PsWorkerOptions{}, {&data, {}}).status();
  }
  const auto took = std::chrono::steady_clock::now() - start;
  ps.join();
  EXPECT_TRUE(absl::IsFailedPrecondition(worker_status)) << worker_status;
  EXPECT_NE(worker_status.message().find("configured differently"), std::string_view::npos)
      << worker_status;
  EXPECT_NE(worker_status.message().find("learning rate 0.05"), std::string_view::npos);
  EXPECT_NE(worker_status.message().find("(this rank's job:"), std::string_view::npos);
  EXPECT_NE(worker_status.message().find("learning rate 0.1"), std::string_view::npos);
  EXPECT_LT(took, std::chrono::milliseconds(job.timeout_ms));
  EXPECT_FALSE(server_status.ok());  // its only worker never came
}

TEST(ParameterServer, RefusesLayoutsThatCannotWork) {
  PsJob job = MakeJob(2, 0, true, 100);
  EXPECT_NE(ValidatePsJob(job).message().find("at least one rank must be left for a worker"),
            std::string::npos);
  job = MakeJob(1, 2, false, 100);
  job.ps.backup_workers = 2;
  EXPECT_NE(ValidatePsJob(job).message().find("backup_workers is 2 with 2 workers"),
            std::string::npos);
}

}  // namespace
}  // namespace huddle::datacenter
