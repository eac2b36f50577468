// Coordinator behaviour in simulated time: rounds, determinism under any arrival order, hostile
// and failing clients, quorum, checkpoints and resume.
#include "coordinator/coordinator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "aggregation/server_optimizer.h"
#include "common/file_util.h"
#include "common/time_format.h"
#include "coordinator/checkpoint.h"
#include "privacy/ledger.h"
#include "tests/coordinator/fake_federation.h"
#include "tests/coordinator/run_job.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tensors.h"

namespace huddle::coordinator {
namespace {

using testing::Behaviour;
using testing::FakeFederation;
using testing::ManualClock;
using testing::SyntheticClient;

class CoordinatorTest : public ::testing::Test {
 protected:
  CoordinatorOptions Options(int64_t rounds, int64_t cohort) {
    CoordinatorOptions o;
    o.job_name = "test";
    o.seed = 7;
    o.rounds = rounds;
    o.model = models::MlpSpec{6, {5}, 3};
    o.cohort.size = cohort;
    o.min_clients = cohort;
    o.quorum = 1;
    o.upload_slots = 2;
    o.round_deadline_ms = 60'000;
    o.client_timeout_ms = 0;
    o.eval_every = 0;
    return o;
  }

  std::vector<SyntheticClient> Clients(int n, uint64_t examples_step = 10) {
    std::vector<SyntheticClient> out;
    for (int i = 0; i < n; ++i) {
      out.push_back({"c" + std::to_string(i), Behaviour::kHonest, 50 + examples_step * i});
    }
    return out;
  }

  // Runs a job; returns the final model and the metrics of every round.
  TensorList RunJob(const CoordinatorOptions& o, std::vector<SyntheticClient> clients,
                    uint64_t delivery_seed, std::vector<RoundMetrics>* metrics = nullptr,
                    FakeFederation** keep = nullptr, bool authenticated = false,
                    const std::function<void(FakeFederation&)>& before = {}) {
    testing::JobRun job = testing::RunJob(o, {.clients = std::move(clients),
                                              .delivery_seed = delivery_seed,
                                              .authenticated = authenticated,
                                              .before = before});
    EXPECT_TRUE(job.status.ok()) << job.status;
    if (metrics) metrics->insert(metrics->end(), job.metrics.begin(), job.metrics.end());
    if (keep) {
      *keep = job.federation.release();  // the test inspects and frees it
    }
    return std::move(job.model);
  }

  // A fresh directory (not yet created: the coordinator makes it), removed after the test.
  std::string TempDir(const std::string& name) { return dirs_.Make("coord_" + name, false); }
  testing::TempDirs dirs_;
};

TEST_F(CoordinatorTest, RoundsCompleteAndApplyTheWeightedMean) {
  CoordinatorOptions o = Options(1, 4);
  std::vector<RoundMetrics> metrics;
  TensorList model = RunJob(o, Clients(4), 1, &metrics);
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_EQ(metrics[0].clients_sampled, 4);
  EXPECT_EQ(metrics[0].results, 4);
  EXPECT_EQ(metrics[0].dropped, 0);
  EXPECT_TRUE(metrics[0].updated);
  // One upload duration per contributing member.
  ASSERT_EQ(metrics[0].upload_seconds.size(), 4u);
  for (double s : metrics[0].upload_seconds) EXPECT_GE(s, 0);

  // Expected: init + sum_k n_k d_k / sum_k n_k, in double.
  TensorList expected = models::InitModel(o.model, DeriveSeed(o.seed, 0x696e6974));
  const ModelLayout layout = models::Layout(o.model);
  std::vector<SyntheticClient> clients = Clients(4);
  double total = 0;
  for (const auto& c : clients) total += static_cast<double>(c.num_examples);
  for (size_t t = 0; t < layout.size(); ++t) {
    for (size_t i = 0; i < expected[t].data.size(); ++i) {
      double sum = 0;
      for (const auto& c : clients) {
        sum +=
            static_cast<double>(c.num_examples) * testing::HonestDelta(layout, 1, c.id)[t].data[i];
      }
      EXPECT_NEAR(model[t].data[i], expected[t].data[i] + sum / total, 1e-6) << t << " " << i;
    }
  }
}

TEST_F(CoordinatorTest, ArrivalOrderDoesNotChangeTheModelBitwise) {
  CoordinatorOptions o = Options(3, 12);
  const TensorList reference = RunJob(o, Clients(12), 1);
  for (uint64_t seed = 2; seed < 8; ++seed) {
    EXPECT_TRUE(testing::BitwiseEqual(RunJob(o, Clients(12), seed), reference))
        << "delivery seed " << seed;
  }
}

TEST_F(CoordinatorTest, HostileAndBrokenClientsChangeNothing) {
  CoordinatorOptions o = Options(2, 9);
  o.min_clients = 9;
  // Without a norm bound, so that 'huge' meets the |value| bound (a norm bound clips it instead).
  o.auto_norm_factor = 0;
  std::vector<SyntheticClient> clients = Clients(4);
  const TensorList honest_only = [&] {
    CoordinatorOptions h = o;
    h.cohort.size = 4;
    h.min_clients = 4;
    return RunJob(h, clients, 3);
  }();
  clients.push_back({"nan", Behaviour::kNaN, 100});
  clients.push_back({"shape", Behaviour::kWrongShape, 100});
  clients.push_back({"late", Behaviour::kWrongRound, 100});
  clients.push_back({"eager", Behaviour::kUnsolicited, 100});
  clients.push_back({"huge", Behaviour::kHugeValue, 100});
  std::vector<RoundMetrics> metrics;
  FakeFederation* fed = nullptr;
  TensorList model = RunJob(o, clients, 4, &metrics, &fed);
  std::unique_ptr<FakeFederation> owned(fed);
  EXPECT_TRUE(testing::BitwiseEqual(model, honest_only));
  ASSERT_EQ(metrics.size(), 2u);
  for (const RoundMetrics& m : metrics) {
    EXPECT_EQ(m.clients_sampled, 9);
    EXPECT_EQ(m.results, 4);
    EXPECT_EQ(m.dropped, 5);
    EXPECT_GE(m.rejected, 4);  // nan, shape, huge, unsolicited
    EXPECT_GE(m.stale, 1);     // wrong round
  }
  EXPECT_EQ(fed->ErrorsSent("nan", wire::ErrorCode::kInvalidUpdate), 2);
  EXPECT_EQ(fed->ErrorsSent("shape", wire::ErrorCode::kInvalidUpdate), 2);
  EXPECT_EQ(fed->ErrorsSent("huge", wire::ErrorCode::kInvalidUpdate), 2);
  EXPECT_EQ(fed->ErrorsSent("late", wire::ErrorCode::kWrongRound), 2);
  EXPECT_EQ(fed->ErrorsSent("eager", wire::ErrorCode::kRejected), 2);
}

TEST_F(CoordinatorTest, ReplayedResultsAreRefusedByTheirNonce) {
  CoordinatorOptions o = Options(3, 5);
  std::vector<SyntheticClient> clients = Clients(4);
  clients.push_back({"replayer", Behaviour::kReplay, 100});
  std::vector<RoundMetrics> metrics;
  FakeFederation* fed = nullptr;
  RunJob(o, clients, 2, &metrics, &fed);
  std::unique_ptr<FakeFederation> owned(fed);
  ASSERT_EQ(metrics.size(), 3u);
  EXPECT_EQ(metrics[0].results, 5);  // its first result answers its first instruction
  for (size_t r = 1; r < 3; ++r) {
    EXPECT_EQ(metrics[r].results, 4) << "round " << r + 1;
    EXPECT_EQ(metrics[r].rejected, 1) << "round " << r + 1;
  }
  EXPECT_EQ(fed->ErrorsSent("replayer", wire::ErrorCode::kInvalidUpdate), 2);
}

TEST_F(CoordinatorTest, AnUploadRequestWithAnotherNonceIsRefused) {
  CoordinatorOptions o = Options(2, 3);
  const TensorList reference = [&] {
    CoordinatorOptions h = o;
    h.cohort.size = 2;
    h.min_clients = 2;
    return RunJob(h, Clients(2), 1);
  }();
  std::vector<SyntheticClient> clients = Clients(2);
  clients.push_back({"forger", Behaviour::kWrongNonce, 100});
  std::vector<RoundMetrics> metrics;
  FakeFederation* fed = nullptr;
  TensorList model = RunJob(o, clients, 1, &metrics, &fed);
  std::unique_ptr<FakeFederation> owned(fed);
  EXPECT_TRUE(testing::BitwiseEqual(model, reference));
  EXPECT_EQ(fed->ErrorsSent("forger", wire::ErrorCode::kRejected), 2);
  for (const RoundMetrics& m : metrics) EXPECT_EQ(m.rejected, 1);
}

TEST_F(CoordinatorTest, AnEnrolledClientCannotJoinOrSpeakAsAnother) {
  CoordinatorOptions o = Options(2, 3);
  const TensorList reference = RunJob(o, Clients(3), 1, nullptr, nullptr, /*authenticated=*/true);
  std::vector<SyntheticClient> clients = Clients(3);
  clients.push_back({"mallory", Behaviour::kHonest, 100, /*join_as=*/"c0"});
  std::vector<RoundMetrics> metrics;
  FakeFederation* fed = nullptr;
  TensorList model = RunJob(o, clients, 1, &metrics, &fed, true, [](FakeFederation& f) {
    // A connection whose key is mallory's, presenting c1's routing id.
    f.Inject("c1", wire::MakeMessage(wire::Heartbeat{}, 0, "c1"), "mallory");
  });
  std::unique_ptr<FakeFederation> owned(fed);
  EXPECT_TRUE(testing::BitwiseEqual(model, reference));
  EXPECT_GE(fed->ErrorsSent("mallory", wire::ErrorCode::kAuthRefused), 1);
  EXPECT_EQ(fed->ErrorsSent("c1", wire::ErrorCode::kAuthRefused), 1);
  ASSERT_EQ(metrics.size(), 2u);
  EXPECT_GE(metrics[0].auth_rejected + metrics[1].auth_rejected, 2);
  EXPECT_EQ(metrics[0].clients_enrolled, 3);
}

TEST_F(CoordinatorTest, SilentClientMakesTheRoundCloseAtItsDeadline) {
  CoordinatorOptions o = Options(1, 3);
  std::vector<SyntheticClient> clients = Clients(2);
  clients.push_back({"zombie", Behaviour::kSilent, 100});
  std::vector<RoundMetrics> metrics;
  RunJob(o, clients, 5, &metrics);
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_EQ(metrics[0].results, 2);
  EXPECT_EQ(metrics[0].dropped, 1);
  EXPECT_TRUE(metrics[0].updated);
  EXPECT_GE(metrics[0].duration_s, 60.0);  // it waited for the deadline, in simulated time
  EXPECT_LT(metrics[0].duration_s, 61.0);
}

TEST_F(CoordinatorTest, ClientsHoldingUploadSlotsWithoutUploadingAreRevoked) {
  CoordinatorOptions o = Options(1, 6);
  o.upload_slots = 2;
  o.upload_timeout_ms = 5'000;
  std::vector<SyntheticClient> clients = Clients(4);
  clients.push_back({"grab1", Behaviour::kGrabber, 100});
  clients.push_back({"grab2", Behaviour::kGrabber, 100});
  std::vector<RoundMetrics> metrics;
  RunJob(o, clients, 9, &metrics);
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_EQ(metrics[0].results, 4) << "honest clients got their slots once the grants were revoked";
  EXPECT_EQ(metrics[0].dropped, 2);
  EXPECT_LT(metrics[0].duration_s, 20.0) << "closed well before the 60 s deadline";
}

TEST_F(CoordinatorTest, AClientThatDeclinesFailsForTheRoundAtOnce) {
  CoordinatorOptions o = Options(2, 3);
  std::vector<SyntheticClient> clients = Clients(3);
  clients[2].behaviour = Behaviour::kDeclines;
  std::vector<RoundMetrics> metrics;
  RunJob(o, clients, 1, &metrics);
  ASSERT_EQ(metrics.size(), 2u);
  for (const RoundMetrics& m : metrics) {
    EXPECT_EQ(m.results, 2);
    EXPECT_EQ(m.declined, 1);
    EXPECT_EQ(m.malformed, 0);
    // Closed when the others reported, not at the 60 s deadline.
    EXPECT_LT(m.duration_s, 10.0);
  }
}

TEST_F(CoordinatorTest, NoQuorumLeavesTheModelUnchangedAndAJobThatTrainedNothingFails) {
  CoordinatorOptions o = Options(1, 3);
  o.quorum = 3;
  o.out_dir = TempDir("no_quorum");
  std::vector<SyntheticClient> clients = Clients(2);
  clients.push_back({"zombie", Behaviour::kSilent, 100});
  testing::JobRun job = testing::RunJob(o, {.clients = clients, .delivery_seed = 6});
  const Status& st = job.status;
  const std::vector<RoundMetrics>& metrics = job.metrics;
  EXPECT_TRUE(absl::IsAborted(st)) << st;
  EXPECT_NE(st.message().find("no round of the job accepted an update"), absl::string_view::npos);
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_FALSE(metrics[0].updated);
  EXPECT_TRUE(
      testing::BitwiseEqual(job.model, models::InitModel(o.model, DeriveSeed(o.seed, 0x696e6974))));
  // The outputs are written, and say why the job failed.
  auto summary = ReadFile(o.out_dir + "/summary.json");
  ASSERT_TRUE(summary.ok());
  EXPECT_NE(summary->find("\"failed\""), std::string::npos) << *summary;
}

TEST_F(CoordinatorTest, RoundsInARowThatAcceptNothingEndTheJobWithTheReason) {
  CoordinatorOptions o = Options(20, 2);
  o.max_rounds_without_update = 3;
  std::vector<SyntheticClient> clients = Clients(2);
  for (SyntheticClient& c : clients) c.behaviour = Behaviour::kHugeValue;
  testing::JobRun job = testing::RunJob(o, {.clients = clients, .delivery_seed = 6});
  const Status& st = job.status;
  const std::vector<RoundMetrics>& metrics = job.metrics;
  EXPECT_TRUE(absl::IsAborted(st)) << st;
  EXPECT_EQ(metrics.size(), 3u) << "stopped after 3 rounds, not 20";
  EXPECT_NE(st.message().find("3 rounds in a row accepted no update"), absl::string_view::npos)
      << st;
  EXPECT_NE(st.message().find("above the bound 1024"), absl::string_view::npos)
      << "names the first refusal: " << st;
}

TEST_F(CoordinatorTest, ALiarAboutItsExampleCountCannotTakeOverTheAverage) {
  CoordinatorOptions o = Options(1, 5);
  std::vector<SyntheticClient> clients;
  for (int i = 0; i < 4; ++i) clients.push_back({"c" + std::to_string(i), Behaviour::kHonest, 100});
  SyntheticClient liar{"liar", Behaviour::kFlat, uint64_t{1} << 24};
  liar.value = 0.05f;
  clients.push_back(liar);
  std::vector<RoundMetrics> metrics;
  const TensorList model = RunJob(o, clients, 3, &metrics);
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_EQ(metrics[0].results, 5);
  EXPECT_EQ(metrics[0].weight_capped, 1);
  EXPECT_EQ(metrics[0].examples, 4 * 100 + 4 * 100) << "the liar weighs 4 x the median claim";
  // Its 0.05 everywhere makes at most half of the mean (uncapped: 99.998% of it).
  const TensorList init = models::InitModel(o.model, DeriveSeed(o.seed, 0x696e6974));
  double mean_step = 0;
  int64_t n = 0;
  for (size_t t = 0; t < model.size(); ++t) {
    for (size_t i = 0; i < model[t].data.size(); ++i, ++n) {
      mean_step += model[t].data[i] - init[t].data[i];
    }
  }
  mean_step /= static_cast<double>(n);
  EXPECT_LT(mean_step, 0.035);
  EXPECT_GT(mean_step, 0.015);
}

TEST_F(CoordinatorTest, NormBoundedAggregationClipsAPoisonedRoundAndLocksNoOneOut) {
  CoordinatorOptions o = Options(4, 4);
  o.max_update_norm = 1.0;
  std::vector<SyntheticClient> clients = Clients(3, 0);
  SyntheticClient poisoner{"poisoner", Behaviour::kPoisonFirst, 50};
  poisoner.value = 1000.0f;  // within max_update_abs (1024): the old bound let it through
  clients.push_back(poisoner);
  o.rounds = 1;
  std::vector<RoundMetrics> metrics;
  const TensorList after_one = RunJob(o, clients, 4, &metrics);
  const TensorList init = models::InitModel(o.model, DeriveSeed(o.seed, 0x696e6974));
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_EQ(metrics[0].clipped, 1);
  for (size_t t = 0; t < init.size(); ++t) {
    for (size_t i = 0; i < init[t].data.size(); ++i) {
      // A clipped delta has every |value| <= 1, and it is a quarter of the mean.
      EXPECT_LE(std::abs(after_one[t].data[i] - init[t].data[i]), 0.25 + 0.05) << t << " " << i;
    }
  }
  o.rounds = 4;
  metrics.clear();
  RunJob(o, clients, 4, &metrics);
  ASSERT_EQ(metrics.size(), 4u);
  for (const RoundMetrics& m : metrics) {
    EXPECT_TRUE(m.updated);
    EXPECT_EQ(m.results, 4);
    EXPECT_EQ(m.rejected, 0);
  }
}

TEST_F(CoordinatorTest, AClientWhoseTrainingFailsFailsForTheRoundAtOnce) {
  CoordinatorOptions o = Options(2, 3);
  std::vector<SyntheticClient> clients = Clients(3);
  clients[1].behaviour = Behaviour::kFailsTraining;
  std::vector<RoundMetrics> metrics;
  RunJob(o, clients, 1, &metrics);
  ASSERT_EQ(metrics.size(), 2u);
  for (const RoundMetrics& m : metrics) {
    EXPECT_EQ(m.results, 2);
    EXPECT_EQ(m.failed, 1);
    EXPECT_EQ(m.declined, 0);
    EXPECT_LT(m.duration_s, 10.0) << "closed when the others reported, not at the deadline";
  }
}

TEST_F(CoordinatorTest, AMalformedResultGivesItsUploadSlotBackAtOnce) {
  CoordinatorOptions o = Options(1, 4);
  o.upload_slots = 1;
  o.upload_timeout_ms = 30'000;
  std::vector<SyntheticClient> clients = Clients(3);
  clients.push_back({"garbage", Behaviour::kGarbageResult, 100});
  std::vector<RoundMetrics> metrics;
  RunJob(o, clients, 2, &metrics);
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_EQ(metrics[0].results, 3);
  EXPECT_EQ(metrics[0].rejected, 1);
  EXPECT_LT(metrics[0].duration_s, 5.0) << "not held until round.upload_timeout_s (30 s)";
}

TEST_F(CoordinatorTest, ARejoinFloodGetsTheModelAtMostTwiceARound) {
  CoordinatorOptions o = Options(2, 3);
  std::vector<SyntheticClient> clients = Clients(2);
  clients.push_back({"flood", Behaviour::kRejoinFlood, 100});
  std::vector<RoundMetrics> metrics;
  FakeFederation* fed = nullptr;
  RunJob(o, clients, 3, &metrics, &fed);
  std::unique_ptr<FakeFederation> owned(fed);
  ASSERT_EQ(metrics.size(), 2u);
  std::map<uint64_t, int> to_flood;
  for (const FakeFederation::SeenFit& f : fed->fits()) {
    if (f.peer == "flood") to_flood[f.round]++;
  }
  for (const auto& [round, n] : to_flood) EXPECT_LE(n, 2) << "round " << round;
  for (const RoundMetrics& m : metrics) {
    EXPECT_EQ(m.results, 2);
    EXPECT_LT(m.duration_s, 10.0);
  }
}

TEST_F(CoordinatorTest, AClientLeavingAfterTheStartDoesNotEndTheJob) {
  CoordinatorOptions o = Options(3, 3);
  o.min_clients = 3;
  o.client_timeout_ms = 10'000;
  o.wait_for_clients_ms = 30'000;
  std::vector<SyntheticClient> clients = Clients(2);
  clients.push_back({"leaver", Behaviour::kLeaves, 100});
  std::vector<RoundMetrics> metrics;
  RunJob(o, clients, 1, &metrics, nullptr, false,
         [](FakeFederation& fed) { fed.set_heartbeat_ms(1000); });
  ASSERT_EQ(metrics.size(), 3u);
  EXPECT_EQ(metrics[2].results, 2);
  EXPECT_TRUE(metrics[2].updated);
}

TEST_F(CoordinatorTest, AnEarlierJobsOutputsAreNotReplacedWithoutResumeOrForce) {
  CoordinatorOptions o = Options(1, 2);
  o.out_dir = TempDir("outputs");
  RunJob(o, Clients(2), 1);
  const auto before = ReadFile(o.out_dir + "/metrics.jsonl");
  ASSERT_TRUE(before.ok());
  {
    const testing::JobRun job = testing::RunJob(o, {.clients = Clients(2)});
    const Status& st = job.status;
    EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
    EXPECT_NE(st.message().find("--resume"), absl::string_view::npos) << st;
    EXPECT_NE(st.message().find("--force"), absl::string_view::npos) << st;
    EXPECT_EQ(*ReadFile(o.out_dir + "/metrics.jsonl"), *before) << "nothing was touched";
  }
  CoordinatorOptions forced = o;
  forced.force = true;
  RunJob(forced, Clients(2), 1);
}

TEST_F(CoordinatorTest, TheSummaryStaysWholeAcrossResumes) {
  CoordinatorOptions o = Options(2, 2);
  o.eval_every = 1;
  o.out_dir = TempDir("summary");
  int calls = 0;
  // Round 1's model is the best (0.9); every later one scores 0.5.
  Evaluator eval = [&](const TensorList&) -> StatusOr<models::EvalStats> {
    models::EvalStats s;
    s.accuracy = ++calls == 1 ? 0.9 : 0.5;
    s.loss = 1.0;
    return s;
  };
  ASSERT_TRUE(testing::RunJob(o, {.clients = Clients(2), .evaluator = eval}).status.ok());
  CoordinatorOptions more = o;
  more.rounds = 3;
  more.resume = true;
  const testing::JobRun job = testing::RunJob(more, {.clients = Clients(2), .evaluator = eval});
  ASSERT_TRUE(job.status.ok());
  EXPECT_DOUBLE_EQ(*job.summary.best_test_accuracy, 0.9);
  EXPECT_EQ(*job.summary.best_round, 1u);
  EXPECT_DOUBLE_EQ(*job.summary.final_test_accuracy, 0.5);
  auto summary = ReadFile(more.out_dir + "/summary.json");
  ASSERT_TRUE(summary.ok());
  EXPECT_NE(summary->find("\"best_round\": 1"), std::string::npos) << *summary;
}

TEST_F(CoordinatorTest, DamagedOrImpossibleCheckpointsAreRefused) {
  CoordinatorOptions o = Options(1, 2);
  o.out_dir = TempDir("damaged");
  RunJob(o, Clients(2), 1);
  const std::string path = o.out_dir + "/checkpoint.bin";
  auto good = ReadCheckpoint(path);
  ASSERT_TRUE(good.ok()) << good.status();
  // One flipped bit anywhere.
  auto bytes = ReadFile(path);
  ASSERT_TRUE(bytes.ok());
  std::string flipped = *bytes;
  flipped[flipped.size() / 2] ^= 0x10;
  ASSERT_TRUE(WriteFileAtomic(path, flipped).ok());
  auto bad = ReadCheckpoint(path);
  EXPECT_TRUE(absl::IsDataLoss(bad.status())) << bad.status();
  EXPECT_NE(bad.status().message().find("checksum"), absl::string_view::npos) << bad.status();
  CoordinatorOptions resumed = o;
  resumed.resume = true;
  EXPECT_TRUE(absl::IsDataLoss(testing::RunJob(resumed, {.clients = Clients(2)}).status))
      << "a damaged checkpoint stops the resume";
  // Impossible contents (a NaN weight, a wrapped round counter) are not even written; a file
  // sealed with them is refused on reading (checkpoint_test.cc).
  Checkpoint nan = *good;
  nan.model[0].data[2] = std::nanf("");
  Status st = WriteCheckpoint(path, nan);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("element 2"), absl::string_view::npos) << st;
  Checkpoint wrapped = *good;
  wrapped.completed_round = UINT64_MAX;
  st = WriteCheckpoint(path, wrapped);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("completed_round"), absl::string_view::npos) << st;
}

TEST_F(CoordinatorTest, MalformedMessagesAreCountedAndAnswered) {
  CoordinatorOptions o = Options(1, 2);
  testing::JobRun job = testing::RunJob(
      o, {.clients = Clients(2), .before = [](FakeFederation& f) { f.InjectGarbage("stranger"); }});
  const std::vector<RoundMetrics>& metrics = job.metrics;
  ASSERT_TRUE(job.status.ok());
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_EQ(metrics[0].malformed, 1);
  EXPECT_EQ(metrics[0].results, 2);
  EXPECT_EQ(job.federation->ErrorsSent("stranger", wire::ErrorCode::kMalformed), 1);
  EXPECT_EQ(job.federation->shutdowns(), 2);
}

TEST_F(CoordinatorTest, KeepsServingClientsWhileItEvaluates) {
  CoordinatorOptions o = Options(1, 2);
  o.eval_every = 1;
  ManualClock clock;
  FakeFederation fed(Clients(2), models::Layout(o.model), &clock, 1);
  int64_t receives_during_eval = -1;
  Evaluator slow_eval = [&](const TensorList&) -> StatusOr<models::EvalStats> {
    const int64_t before = fed.receive_calls();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    receives_during_eval = fed.receive_calls() - before;
    return models::EvalStats{0.5, 0.9, 10};
  };
  std::vector<RoundMetrics> metrics;
  Coordinator coord(o, &fed, &clock, slow_eval,
                    [&](const RoundMetrics& m) { metrics.push_back(m); });
  ASSERT_TRUE(coord.Run().ok());
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_EQ(metrics[0].test_accuracy, 0.9);
  EXPECT_GT(receives_during_eval, 3) << "the transport was not served during the evaluation";
}

TEST_F(CoordinatorTest, AnotherProtocolVersionIsAnsweredWithVersionMismatch) {
  CoordinatorOptions o = Options(1, 2);
  const testing::JobRun job = testing::RunJob(
      o, {.clients = Clients(2), .before = [](FakeFederation& fed) {
            fed.InjectDecodeError("old-agent", absl::FailedPreconditionError(
                                                   "protocol version mismatch: peer speaks "
                                                   "version 0, this build speaks version 1"));
          }});
  ASSERT_TRUE(job.status.ok());
  EXPECT_EQ(job.federation->ErrorsSent("old-agent", wire::ErrorCode::kVersionMismatch), 1);
}

TEST_F(CoordinatorTest, PoissonSamplingIsSeededAndVaries) {
  CoordinatorOptions o = Options(5, 0);
  o.cohort.sampling = CohortOptions::Sampling::kPoisson;
  o.cohort.rate = 0.5;
  o.min_clients = 20;
  std::vector<RoundMetrics> a, b;
  RunJob(o, Clients(20), 1, &a);
  RunJob(o, Clients(20), 2, &b);
  ASSERT_EQ(a.size(), 5u);
  std::set<int64_t> sizes;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].clients_sampled, b[i].clients_sampled);  // same seed, same cohorts
    sizes.insert(a[i].clients_sampled);
  }
  EXPECT_GT(sizes.size(), 1u);  // Poisson: the cohort size varies
}

TEST_F(CoordinatorTest, ResumeFromCheckpointEqualsAnUninterruptedRun) {
  CoordinatorOptions o = Options(4, 5);
  o.cohort.size = 3;  // sampling consumes the RNG, which the checkpoint must carry
  o.min_clients = 5;
  o.server.momentum = 0.5;  // optimizer state must be carried too
  o.out_dir = TempDir("full");
  const TensorList full = RunJob(o, Clients(5), 1);

  CoordinatorOptions part = o;
  part.out_dir = TempDir("part");
  part.rounds = 2;
  RunJob(part, Clients(5), 2);
  auto ckpt = ReadCheckpoint(part.out_dir + "/checkpoint.bin");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->completed_round, 2u);

  CoordinatorOptions resumed = o;
  resumed.out_dir = part.out_dir;
  resumed.resume = true;
  std::vector<RoundMetrics> metrics;
  const TensorList model = RunJob(resumed, Clients(5), 3, &metrics);
  ASSERT_EQ(metrics.size(), 2u);
  EXPECT_EQ(metrics[0].round, 3u);
  EXPECT_TRUE(testing::BitwiseEqual(model, full));
}

TEST_F(CoordinatorTest, ResumeRefusesACheckpointOfAnotherJob) {
  CoordinatorOptions o = Options(1, 2);
  o.out_dir = TempDir("other");
  RunJob(o, Clients(2), 1);
  CoordinatorOptions other = o;
  other.seed = 8;
  other.resume = true;
  const Status st = testing::RunJob(other, {.clients = Clients(2)}).status;
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("seed"), absl::string_view::npos);
}

TEST_F(CoordinatorTest, TooFewClientsIsAClearError) {
  CoordinatorOptions o = Options(1, 5);
  o.min_clients = 5;
  o.wait_for_clients_ms = 5000;
  const Status st = testing::RunJob(o, {.clients = Clients(2)}).status;
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_NE(st.message().find("only 2 of the 5"), absl::string_view::npos) << st;
}

// The JSON objects of a .jsonl file, one per line.
std::vector<nlohmann::json> JsonLines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// The `time` of a row, parsed (milliseconds since the Unix epoch); fails the test without one.
int64_t RowTime(const nlohmann::json& row) {
  EXPECT_TRUE(row.contains("time") && row["time"].is_string()) << row;
  if (!row.contains("time") || !row["time"].is_string()) return -1;
  auto at = ParseIso8601Utc(row["time"].get<std::string>());
  EXPECT_TRUE(at.ok()) << at.status();
  return at.ok() ? *at : -1;
}

TEST_F(CoordinatorTest, EveryMetricsRowHasTheWallTimeItWasWritten) {
  CoordinatorOptions o = Options(3, 2);
  o.out_dir = TempDir("row_time");
  const testing::JobRun job = testing::RunJob(o, {.clients = Clients(2)});
  ASSERT_TRUE(job.status.ok()) << job.status;
  const std::vector<nlohmann::json> rows = JsonLines(o.out_dir + "/metrics.jsonl");
  ASSERT_EQ(rows.size(), 3u);
  ASSERT_EQ(job.metrics.size(), 3u);
  int64_t previous = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    // The coordinator's clock, when the round's row was written.
    EXPECT_EQ(RowTime(rows[i]), job.metrics[i].wall_ms) << rows[i];
    EXPECT_GE(job.metrics[i].wall_ms, ManualClock::kWallOriginMs + 1'000'000);
    EXPECT_LE(job.metrics[i].wall_ms, job.clock->WallMs());
    EXPECT_GE(job.metrics[i].wall_ms, previous);
    previous = job.metrics[i].wall_ms;
  }
}

// Client-level DP (coordinator/round_privacy.h).
class DpCoordinatorTest : public CoordinatorTest {
 protected:
  CoordinatorOptions DpOptions(int64_t rounds, int n, double z, const std::string& dir) {
    CoordinatorOptions o = Options(rounds, n);
    o.cohort.sampling = CohortOptions::Sampling::kPoisson;
    o.cohort.rate = 1.0;  // every client, so the expected cohort is n
    o.privacy.mode = privacy::PrivacyMode::kCentral;
    o.privacy.expected_cohort_size = n;
    o.privacy.clip_norm = 1.0;
    o.privacy.delta = 1e-5;
    o.privacy.noise_seed = 11;
    privacy::ScheduleRange all;
    all.first_round = 1;
    all.last_round = rounds;
    all.noise_multiplier = z;
    o.privacy.schedule = {all};
    o.out_dir = TempDir(dir);
    return o;
  }
  // The root mean square of a - b over every value (the noise std of a model against its
  // noiseless counterpart).
  static double RmsDifference(const TensorList& a, const TensorList& b) {
    double sum2 = 0;
    int64_t count = 0;
    for (size_t t = 0; t < a.size(); ++t) {
      for (size_t i = 0; i < a[t].data.size(); ++i) {
        const double e = a[t].data[i] - b[t].data[i];
        sum2 += e * e;
        ++count;
      }
    }
    return std::sqrt(sum2 / static_cast<double>(count));
  }
  // init + (sum of the honest deltas) / divisor (n by default): the noiseless DP-FedAvg step with
  // uniform weights.
  TensorList NoiselessStep(const CoordinatorOptions& o, int n, double divisor = 0) {
    if (divisor == 0) divisor = n;
    TensorList expected = models::InitModel(o.model, DeriveSeed(o.seed, 0x696e6974));
    const ModelLayout layout = models::Layout(o.model);
    for (int c = 0; c < n; ++c) {
      const TensorList d = testing::HonestDelta(layout, 1, "c" + std::to_string(c));
      for (size_t t = 0; t < layout.size(); ++t) {
        for (size_t i = 0; i < d[t].data.size(); ++i) {
          expected[t].data[i] += static_cast<float>(d[t].data[i] / divisor);
        }
      }
    }
    return expected;
  }
};

TEST_F(DpCoordinatorTest, UniformWeightsExpectedCohortAndNoiseOfTheConfiguredStd) {
  // Tiny noise: the step is the uniform mean (example counts ignored).
  CoordinatorOptions quiet = DpOptions(1, 4, 1e-6, "dp_quiet");
  std::vector<RoundMetrics> metrics;
  TensorList model = RunJob(quiet, Clients(4, 100), 1, &metrics);
  TensorList expected = NoiselessStep(quiet, 4);
  for (size_t t = 0; t < model.size(); ++t) {
    for (size_t i = 0; i < model[t].data.size(); ++i) {
      EXPECT_NEAR(model[t].data[i], expected[t].data[i], 1e-5) << t << " " << i;
    }
  }
  ASSERT_EQ(metrics.size(), 1u);
  ASSERT_TRUE(metrics[0].privacy.has_value());
  EXPECT_FALSE(metrics[0].train_loss.has_value());
  EXPECT_EQ(metrics[0].privacy->accountant, "analytic");  // q = 1
  // z = 1, C = 1: the noise on the mean has std z*C/4 per coordinate.
  CoordinatorOptions loud = DpOptions(1, 4, 1.0, "dp_loud");
  model = RunJob(loud, Clients(4), 1, &metrics);
  const double std = RmsDifference(model, expected);
  EXPECT_GT(std, 0.25 * 0.7) << "53 draws: within 30% of 0.25";
  EXPECT_LT(std, 0.25 * 1.3);
  EXPECT_GE(metrics.back().privacy->noise_stddev, 1.0);
  EXPECT_LT(metrics.back().privacy->noise_stddev, 1.0 + 1e-6);
}

TEST_F(DpCoordinatorTest, UpdatesAboveTheClipNormAreRefused) {
  CoordinatorOptions o = DpOptions(1, 3, 1.0, "dp_clip");
  std::vector<SyntheticClient> clients = Clients(3);
  clients[1].behaviour = Behaviour::kHugeValue;
  std::vector<RoundMetrics> metrics;
  FakeFederation* fed = nullptr;
  RunJob(o, clients, 1, &metrics, &fed);
  std::unique_ptr<FakeFederation> owned(fed);
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_EQ(metrics[0].results, 2);
  EXPECT_EQ(metrics[0].rejected, 1);
  EXPECT_EQ(fed->ErrorsSent("c1", wire::ErrorCode::kInvalidUpdate), 1);
}

TEST_F(DpCoordinatorTest, LocalModeRefusesUpdatesLongerThanANoisedClippedUpdate) {
  CoordinatorOptions o = DpOptions(1, 3, 1.0, "dp_local_norm");
  o.privacy.mode = privacy::PrivacyMode::kLocal;
  o.privacy.expected_cohort_size.reset();
  std::vector<SyntheticClient> clients = Clients(3);
  // Every value within the |value| bound of a local round (C (1 + 64 z) = 65), but the update's
  // norm (60 sqrt(53) = 437) is far past C plus any honest noise (about 1 + sqrt(53) + 13 = 21).
  clients[1].behaviour = Behaviour::kFlat;
  clients[1].value = 60.0f;
  // An honest-looking noised update: N(0, 1) in every value, norm about sqrt(53) = 7.3.
  clients[2].behaviour = Behaviour::kFlat;
  clients[2].value = 1.0f;
  std::vector<RoundMetrics> metrics;
  FakeFederation* fed = nullptr;
  RunJob(o, clients, 1, &metrics, &fed);
  std::unique_ptr<FakeFederation> owned(fed);
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_EQ(metrics[0].results, 2);
  EXPECT_EQ(metrics[0].rejected, 1);
  EXPECT_EQ(fed->ErrorsSent("c1", wire::ErrorCode::kInvalidUpdate), 1);
}

TEST_F(DpCoordinatorTest, LedgerIsWrittenAndTheBudgetStopsTheJob) {
  CoordinatorOptions o = DpOptions(10, 3, 2.0, "dp_budget");
  // Each round alone spends eps(z=2, q=1); a total that fits 4 of them.
  const std::vector<privacy::DpEvent> four_rounds = {{1.0, 2.0, 4}}, five_rounds = {{1.0, 2.0, 5}};
  auto four = privacy::ComputeEpsilon(four_rounds, 1e-5, privacy::AccountantKind::kAnalytic);
  auto five = privacy::ComputeEpsilon(five_rounds, 1e-5, privacy::AccountantKind::kAnalytic);
  ASSERT_TRUE(four.ok() && five.ok());
  o.privacy.total_epsilon = (four->epsilon + five->epsilon) / 2;
  std::vector<RoundMetrics> metrics;
  RunJob(o, Clients(3), 1, &metrics);
  ASSERT_EQ(metrics.size(), 4u);
  EXPECT_DOUBLE_EQ(metrics.back().privacy->epsilon, four->epsilon);
  auto ledger = privacy::PrivacyLedger::Open(o.out_dir + "/" + privacy::kLedgerFile);
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  ASSERT_EQ(ledger->entries().size(), 4u);
  EXPECT_EQ(ledger->entries()[3].round, 4u);
  EXPECT_EQ(ledger->entries()[0].noise, "seeded (NOT PRIVATE)");

  // A fresh start in the same directory would forget the spend: refused.
  const Status st = testing::RunJob(o, {.clients = Clients(3)}).status;
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("--resume"), absl::string_view::npos) << st;
  // Resuming replays the ledger: the budget is already spent, so no round runs.
  o.resume = true;
  metrics.clear();
  RunJob(o, Clients(3), 1, &metrics);
  EXPECT_TRUE(metrics.empty());
}

TEST_F(DpCoordinatorTest, ABudgetStopEvaluatesTheReleasedModel) {
  CoordinatorOptions o = DpOptions(10, 3, 2.0, "dp_budget_eval");
  const std::vector<privacy::DpEvent> four_rounds = {{1.0, 2.0, 4}}, five_rounds = {{1.0, 2.0, 5}};
  auto four = privacy::ComputeEpsilon(four_rounds, 1e-5, privacy::AccountantKind::kAnalytic);
  auto five = privacy::ComputeEpsilon(five_rounds, 1e-5, privacy::AccountantKind::kAnalytic);
  ASSERT_TRUE(four.ok() && five.ok());
  o.privacy.total_epsilon = (four->epsilon + five->epsilon) / 2;
  o.eval_every = 5;  // round 4, where the budget stops the job, is not an evaluation round
  int evaluations = 0;
  Evaluator eval = [&](const TensorList&) -> StatusOr<models::EvalStats> {
    ++evaluations;
    return models::EvalStats{0.7, 0.5, 100};
  };
  const testing::JobRun job = testing::RunJob(o, {.clients = Clients(3), .evaluator = eval});
  ASSERT_TRUE(job.status.ok());
  EXPECT_EQ(job.summary.rounds_completed, 4u);
  EXPECT_FALSE(job.summary.stop_reason.empty());
  EXPECT_EQ(evaluations, 1);
  ASSERT_TRUE(job.summary.final_test_accuracy.has_value()) << "the released model is scored";
  EXPECT_EQ(*job.summary.best_round, 4u);
}

TEST_F(DpCoordinatorTest, ARunThatAcceptedNoUpdateFailsOnlyAfterEveryRoundWasReleased) {
  CoordinatorOptions o = DpOptions(4, 2, 1.0, "dp_nothing");
  std::vector<SyntheticClient> clients = Clients(2);
  for (SyntheticClient& c : clients) c.behaviour = Behaviour::kHugeValue;  // refused by the norm
  testing::JobRun job = testing::RunJob(o, {.clients = clients});
  const Status& st = job.status;
  const std::vector<RoundMetrics>& metrics = job.metrics;
  EXPECT_TRUE(absl::IsAborted(st)) << st;
  EXPECT_EQ(metrics.size(), 4u) << "no early stop under DP: it would reveal the count of results";
  auto summary = ReadFile(o.out_dir + "/summary.json");
  ASSERT_TRUE(summary.ok());
  const auto j = nlohmann::json::parse(*summary);
  EXPECT_FALSE(j.contains("failed")) << "a count of results is operator-only under DP";
  EXPECT_TRUE(j["operator"].contains("failed")) << *summary;
}

TEST_F(DpCoordinatorTest, CentralModeNeedsPoissonSamplingAndAnOutputDirectory) {
  CoordinatorOptions o = DpOptions(1, 3, 1.0, "dp_fixed");
  o.cohort.sampling = CohortOptions::Sampling::kFixed;
  ManualClock clock;
  FakeFederation fed(Clients(3), models::Layout(o.model), &clock, 1);
  Status st = Coordinator(o, &fed, &clock).Run();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("poisson"), absl::string_view::npos) << st;
  o = DpOptions(1, 3, 1.0, "dp_nodir");
  o.out_dir.clear();
  st = Coordinator(o, &fed, &clock).Run();
  EXPECT_NE(st.message().find("ledger"), absl::string_view::npos) << st;
}

// The cohort-prediction attack of the privacy audit. A client knows the coordinator's code. It
// receives fit.seed; when that is DeriveSeed(job_seed, "clnt", round), an invertible SplitMix
// chain, it recovers the job seed, replays the cohort stream and predicts who is sampled in every
// round, so amplification by sampling no longer holds.
class CohortAttack {
 public:
  // The job seed that would have produced `fit_seed` in `round`.
  static uint64_t RecoverJobSeed(uint64_t fit_seed, uint64_t round) {
    const uint64_t h2 = Unmix(fit_seed) ^ round;  // DeriveSeed's last step: Mix(h2 ^ round)
    const uint64_t h1 = Unmix(h2) ^ 0x636c6e74;   // Mix(h1 ^ "clnt")
    return Unmix(h1);                             // Mix(job_seed)
  }
  // Poisson cohorts of `rounds` rounds over `ids` (sorted) as a seeded coordinator draws them.
  static std::vector<std::vector<bool>> PredictCohorts(uint64_t job_seed, double rate, size_t ids,
                                                       uint64_t rounds) {
    Rng rng(DeriveSeed(job_seed, 0x636f686f));  // the cohort stream
    std::vector<std::vector<bool>> cohorts(rounds, std::vector<bool>(ids));
    for (auto& round : cohorts) {
      for (size_t i = 0; i < ids; ++i) round[i] = rng.Uniform() < rate;
    }
    return cohorts;
  }

 private:
  static uint64_t UnshiftXor(uint64_t y, int s) {
    uint64_t x = y;
    for (int i = 0; i < 64 / s + 1; ++i) x = y ^ (x >> s);
    return x;
  }
  static uint64_t Inverse(uint64_t a) {  // of an odd a modulo 2^64 (Newton)
    uint64_t x = a;
    for (int i = 0; i < 6; ++i) x *= 2 - a * x;
    return x;
  }
  // The inverse of one SplitMix64 output step (including its increment).
  static uint64_t Unmix(uint64_t z) {
    z = UnshiftXor(z, 31);
    z *= Inverse(0x94d049bb133111ebULL);
    z = UnshiftXor(z, 27);
    z *= Inverse(0xbf58476d1ce4e5b9ULL);
    z = UnshiftXor(z, 30);
    return z - 0x9e3779b97f4a7c15ULL;
  }
};

// Fraction of (round, client) memberships the attack predicts right, from what client c0 saw.
double CohortPredictionAccuracy(const FakeFederation& fed, int clients, uint64_t rounds,
                                double rate) {
  const auto& fits = fed.fits();
  std::vector<std::vector<bool>> actual(rounds, std::vector<bool>(clients));
  std::optional<std::pair<uint64_t, uint64_t>> seen;  // c0's first (round, fit.seed)
  for (const auto& f : fits) {
    const int index = std::stoi(f.peer.substr(1));  // ids c0..c9 sort as 0..9 for < 10 clients
    actual[f.round - 1][index] = true;
    if (f.peer == "c0" && !seen) seen = std::make_pair(f.round, f.seed);
  }
  EXPECT_TRUE(seen.has_value()) << "c0 was never sampled";
  if (!seen) return 0;
  const uint64_t job_seed = CohortAttack::RecoverJobSeed(seen->second, seen->first);
  const auto predicted = CohortAttack::PredictCohorts(job_seed, rate, clients, rounds);
  int64_t right = 0;
  for (uint64_t r = 0; r < rounds; ++r) {
    for (int i = 0; i < clients; ++i) right += predicted[r][i] == actual[r][i];
  }
  return static_cast<double>(right) / static_cast<double>(rounds * clients);
}

TEST_F(DpCoordinatorTest, ClientsCannotPredictTheCohortsOfAPrivateJob) {
  constexpr int kClients = 10;
  constexpr uint64_t kRounds = 30;
  constexpr double kRate = 0.5;
  auto run = [&](bool seeded_noise, const std::string& dir) {
    CoordinatorOptions o = DpOptions(kRounds, kClients, 1.0, dir);
    o.cohort.rate = kRate;
    o.min_clients = kClients;
    if (!seeded_noise) o.privacy.noise_seed.reset();
    FakeFederation* fed = nullptr;
    RunJob(o, Clients(kClients), 1, nullptr, &fed);
    return std::unique_ptr<FakeFederation>(fed);
  };
  // The attack works where the cohorts come from the job seed (privacy.noise_seed, which is
  // reported as not private): every membership of every round is predicted.
  auto seeded = run(true, "attack_seeded");
  EXPECT_EQ(CohortPredictionAccuracy(*seeded, kClients, kRounds, kRate), 1.0);
  // With private noise the cohorts and the seeds come from the OS CSPRNG: the recovered "seed"
  // predicts nothing (chance is 0.5; 300 memberships: 0.75 is > 8 standard deviations away).
  auto secret = run(false, "attack_secret");
  EXPECT_LT(CohortPredictionAccuracy(*secret, kClients, kRounds, kRate), 0.75);
  // And the same job seed does not give the same cohorts twice.
  auto again = run(false, "attack_secret_again");
  std::set<std::pair<uint64_t, std::string>> a, b;
  for (const auto& f : secret->fits()) a.insert({f.round, f.peer});
  for (const auto& f : again->fits()) b.insert({f.round, f.peer});
  EXPECT_NE(a, b);
  // A client's fit.seed is not the job-seed derivation either.
  for (const auto& f : secret->fits()) {
    EXPECT_NE(f.seed, DeriveSeed(7, 0x636c6e74, f.round));
  }
}

TEST_F(DpCoordinatorTest, TheDenominatorIsTheConfiguredExpectedCohortNotThePopulation) {
  // The same job with 8 and with 9 enrolled clients: the noise on the mean has the same std
  // z*C/4 (the configured expected cohort), not z*C/(q*N) (0.125 vs 0.111 for q = 1), so the
  // population size is not published through the noise scale.
  for (int n : {8, 9}) {
    CoordinatorOptions o = DpOptions(1, n, 1.0, "denominator_" + std::to_string(n));
    o.privacy.expected_cohort_size = 4;
    TensorList model = RunJob(o, Clients(n), 1);
    const double std = RmsDifference(model, NoiselessStep(o, n, 4.0));
    EXPECT_GT(std, 0.25 * 0.7) << n << " clients: 53 draws within 30% of 0.25";
    EXPECT_LT(std, 0.25 * 1.3) << n << " clients";
  }
  CoordinatorOptions o = DpOptions(1, 3, 1.0, "denominator_missing");
  o.privacy.expected_cohort_size.reset();
  const Status st = testing::RunJob(o, {.clients = Clients(3)}).status;
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("expected_cohort_size"), absl::string_view::npos) << st;
}

TEST_F(DpCoordinatorTest, ResumeIsRefusedWhenTheLedgerDoesNotCoverTheCheckpoint) {
  CoordinatorOptions o = DpOptions(3, 3, 2.0, "dp_ledger_gone");
  RunJob(o, Clients(3), 1);
  const std::string ledger = o.out_dir + "/" + privacy::kLedgerFile;
  // The ledger deleted: resuming would report "epsilon spent 0" for a model of three rounds.
  // Its mark says 3 entries were appended (privacy/ledger.h): refused.
  std::filesystem::remove(ledger);
  o.resume = true;
  {
    const Status st = testing::RunJob(o, {.clients = Clients(3)}).status;
    EXPECT_TRUE(absl::IsDataLoss(st)) << st;
    EXPECT_NE(st.message().find("says 3 entries"), absl::string_view::npos) << st;
    EXPECT_FALSE(std::filesystem::exists(ledger));
  }
  // Its mark deleted too: the checkpoint still shows the loss.
  std::filesystem::remove(ledger + privacy::kMarkSuffix);
  {
    const Status st = testing::RunJob(o, {.clients = Clients(3)}).status;
    EXPECT_TRUE(absl::IsDataLoss(st)) << st;
    EXPECT_NE(st.message().find("round 1"), absl::string_view::npos) << st;
  }
  // A ledger that lost its last line: round 3 is not covered.
  std::ofstream(ledger) << "";
  {
    auto l = privacy::PrivacyLedger::Open(ledger);
    ASSERT_TRUE(l.ok());
    for (uint64_t r = 1; r <= 2; ++r) {
      privacy::LedgerEntry e;
      e.round = r;
      e.sampling_rate = 1;
      e.noise_multiplier = 2;
      e.mode = "central";
      e.noise = "os-csprng";
      ASSERT_TRUE(l->Append(e).ok());
    }
  }
  ManualClock clock;
  FakeFederation fed(Clients(3), models::Layout(o.model), &clock, 1);
  Status st = Coordinator(o, &fed, &clock).Run();
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_NE(st.message().find("round 3"), absl::string_view::npos) << st;
  // Nor may a DP checkpoint be continued without DP.
  o.privacy = {};
  st = Coordinator(o, &fed, &clock).Run();
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("privacy.mode"), absl::string_view::npos) << st;
}

TEST_F(DpCoordinatorTest, SeededNoiseIsReportedAsNotPrivateEverywhere) {
  CoordinatorOptions o = DpOptions(2, 3, 2.0, "dp_seeded_report");
  std::vector<RoundMetrics> metrics;
  RunJob(o, Clients(3), 1, &metrics);
  ASSERT_EQ(metrics.size(), 2u);
  EXPECT_FALSE(metrics[1].privacy->is_private);
  EXPECT_NE(metrics[1].ProgressLine().find("NOT PRIVATE"), std::string::npos);
  auto read = [&](const char* file) { return ReadFile(o.out_dir + "/" + file).value(); };
  for (const std::string& line : {read("metrics.jsonl")}) {
    EXPECT_NE(line.find("\"epsilon\":null"), std::string::npos) << line;
    EXPECT_NE(line.find("\"private\":false"), std::string::npos) << line;
  }
  const std::string summary = read("summary.json");
  EXPECT_NE(summary.find("\"epsilon\": null"), std::string::npos) << summary;
  EXPECT_NE(summary.find("\"private\": false"), std::string::npos) << summary;
  const std::string report = read("privacy.json");
  EXPECT_NE(report.find("\"epsilon\": null"), std::string::npos) << report;
  EXPECT_NE(report.find("noise_seed"), std::string::npos) << report;
}

// Under DP the wall time of each round's rows is the operator's (the times of successive rows give
// the rounds' durations); the ledger records when each release was made.
TEST_F(DpCoordinatorTest, TheOperatorRowsAndTheLedgerHaveTimesThePublicRowsNot) {
  CoordinatorOptions o = DpOptions(2, 3, 2.0, "dp_row_time");
  const testing::JobRun job = testing::RunJob(o, {.clients = Clients(3)});
  ASSERT_TRUE(job.status.ok()) << job.status;
  const std::vector<nlohmann::json> pub = JsonLines(o.out_dir + "/metrics.jsonl");
  const std::vector<nlohmann::json> ops = JsonLines(o.out_dir + "/operator_metrics.jsonl");
  ASSERT_EQ(pub.size(), 2u);
  ASSERT_EQ(ops.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_FALSE(pub[i].contains("time")) << pub[i];
    EXPECT_EQ(RowTime(ops[i]), job.metrics[i].wall_ms) << ops[i];
  }
  const std::vector<nlohmann::json> ledger = JsonLines(o.out_dir + "/" + privacy::kLedgerFile);
  ASSERT_EQ(ledger.size(), 2u);
  for (const nlohmann::json& entry : ledger) EXPECT_GT(RowTime(entry), 0) << entry;
}

TEST_F(DpCoordinatorTest, MetricsSeparatePublicValuesFromOperatorDiagnostics) {
  CoordinatorOptions o = DpOptions(2, 3, 2.0, "dp_split");
  o.privacy.noise_seed.reset();
  RunJob(o, Clients(3), 1);
  const std::string pub = ReadFile(o.out_dir + "/metrics.jsonl").value();
  const std::string ops = ReadFile(o.out_dir + "/operator_metrics.jsonl").value();
  for (const char* raw :
       {"clients_sampled", "results", "examples", "within_clip", "noise_seconds", "duration_s",
        "bytes_in", "clients_enrolled", "upload_s", "upload_seconds"}) {
    EXPECT_EQ(pub.find(raw), std::string::npos) << raw << " in metrics.jsonl: " << pub;
    EXPECT_NE(ops.find(raw), std::string::npos) << raw << " not in operator_metrics.jsonl";
  }
  EXPECT_NE(pub.find("\"epsilon\":"), std::string::npos);
  EXPECT_NE(pub.find("\"private\":true"), std::string::npos);
  const std::string summary = ReadFile(o.out_dir + "/summary.json").value();
  EXPECT_NE(summary.find("\"operator\""), std::string::npos) << summary;
  const std::string report = ReadFile(o.out_dir + "/privacy.json").value();
  for (const char* field : {"\"unit_of_privacy\": \"client\"", "\"adjacency\": \"add_remove\"",
                            "\"sampling\"", "OS CSPRNG", "\"accountant\"", "\"releases\"",
                            "\"assumptions\"", "\"noise_source\": \"os-csprng\""}) {
    EXPECT_NE(report.find(field), std::string::npos) << field << " not in " << report;
  }
}

}  // namespace
}  // namespace huddle::coordinator
