// Buffered asynchronous training (async:, coordinator/async_round.h) through the real coordinator
// against scripted clients in simulated time: server steps of `buffer` updates, staleness
// weighting and refusal, a client that stays slow, hostile clients, starvation, resume.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coordinator/coordinator.h"
#include "tests/coordinator/fake_federation.h"
#include "tests/coordinator/run_job.h"
#include "tests/testing/temp_dir.h"

namespace huddle::coordinator {
namespace {

using testing::Behaviour;
using testing::SyntheticClient;

CoordinatorOptions AsyncJob(int64_t steps, int64_t concurrency, int64_t buffer) {
  CoordinatorOptions o;
  o.job_name = "async";
  o.seed = 11;
  o.rounds = steps;
  o.model = models::MlpSpec{6, {5}, 3};
  o.min_clients = 1;
  o.upload_slots = 2;
  o.round_deadline_ms = 60'000;
  o.client_timeout_ms = 0;
  o.eval_every = 0;
  o.async.enabled = true;
  o.async.concurrency = concurrency;
  o.async.buffer = buffer;
  return o;
}

std::vector<SyntheticClient> Honest(int n) {
  std::vector<SyntheticClient> out;
  for (int i = 0; i < n; ++i) out.push_back({"c" + std::to_string(i), Behaviour::kHonest, 100});
  return out;
}

TEST(AsyncRoundTest, EveryServerStepTakesBufferUpdatesWithConcurrencyInFlight) {
  const CoordinatorOptions o = AsyncJob(5, 4, 3);
  testing::JobRun job = testing::RunJob(o, {.clients = Honest(8)});
  ASSERT_TRUE(job.status.ok()) << job.status;
  ASSERT_EQ(job.metrics.size(), 5u);
  for (const RoundMetrics& m : job.metrics) {
    EXPECT_EQ(m.results, 3) << m.round;
    EXPECT_TRUE(m.updated);
    ASSERT_TRUE(m.async.has_value());
    EXPECT_EQ(m.async->buffer, 3);
    EXPECT_EQ(m.async->concurrency, 4);
    // The one result beyond the buffer, and the three sent in its place, are still training.
    EXPECT_LE(m.async->in_flight, 4);
    EXPECT_EQ(m.dropped, 0);
    EXPECT_NE(m.ToJson().find("\"async\""), std::string::npos);
  }
  // Concurrency 4 at the start: the first step's dispatches are the 4 plus one per result.
  EXPECT_GE(job.metrics[0].clients_sampled, 4);
  // Each model version went to a client at most once.
  std::map<std::pair<std::string, uint64_t>, int> sent;
  for (const auto& fit : job.federation->fits()) ++sent[{fit.peer, fit.round}];
  EXPECT_EQ(job.summary.rounds_completed, 5u);
}

TEST(AsyncRoundTest, StaleUpdatesAreDiscountedAndThoseStalerThanTheLimitRefused) {
  // One client far slower than the rest: its update lands several steps late.
  std::vector<SyntheticClient> clients = Honest(6);
  for (SyntheticClient& c : clients) c.delay_ms = 1'000;
  clients.push_back({"slow", Behaviour::kHonest, 100});
  clients.back().delay_ms = 6'000;
  for (auto weight : {AsyncOptions::Staleness::kPolynomial, AsyncOptions::Staleness::kConstant}) {
    CoordinatorOptions o = AsyncJob(40, 7, 2);
    o.async.weight = weight;
    o.async.max_staleness = 1000;
    testing::JobRun job = testing::RunJob(o, {.clients = clients});
    ASSERT_TRUE(job.status.ok()) << job.status;
    int64_t stale_steps = 0;
    for (const RoundMetrics& m : job.metrics) {
      if (m.async->staleness_max == 0) {
        EXPECT_DOUBLE_EQ(m.async->discount_mean, 1.0);
        continue;
      }
      ++stale_steps;
      if (weight == AsyncOptions::Staleness::kConstant) {
        EXPECT_DOUBLE_EQ(m.async->discount_mean, 1.0);
      } else {
        // At least one folded update had s = (1 + tau)^-0.5 < 1.
        EXPECT_LT(m.async->discount_mean, 1.0);
        EXPECT_GE(m.async->discount_mean,
                  std::pow(1.0 + static_cast<double>(m.async->staleness_max), -0.5));
      }
    }
    EXPECT_GT(stale_steps, 0) << "the slow client never contributed a stale update";
  }

  // With max_staleness 1 the slow client's every update is refused as too stale; the job goes on
  // without it, and keeps sending it work (a client that stays slow is not excluded).
  CoordinatorOptions o = AsyncJob(40, 7, 2);
  o.async.max_staleness = 1;
  testing::JobRun job = testing::RunJob(o, {.clients = clients});
  ASSERT_TRUE(job.status.ok()) << job.status;
  int64_t refused = 0;
  for (const RoundMetrics& m : job.metrics) {
    refused += m.async->refused_stale;
    EXPECT_LE(m.async->staleness_max, 1);
  }
  const int slow_refused = job.federation->ErrorsSent("slow", wire::ErrorCode::kWrongRound);
  EXPECT_GT(slow_refused, 0);
  EXPECT_GE(refused, slow_refused);
  int slow_tasks = 0;
  for (const auto& fit : job.federation->fits()) slow_tasks += fit.peer == "slow";
  EXPECT_GE(slow_tasks, 2);
}

TEST(AsyncRoundTest, StalenessFactors) {
  AsyncOptions a;
  a.weight = AsyncOptions::Staleness::kPolynomial;
  a.exponent = 0.5;
  EXPECT_DOUBLE_EQ(StalenessFactor(a, 0), 1.0);
  EXPECT_DOUBLE_EQ(StalenessFactor(a, 3), 0.5);
  a.weight = AsyncOptions::Staleness::kHinge;
  a.hinge_after = 2;
  a.hinge_slope = 0.5;
  EXPECT_DOUBLE_EQ(StalenessFactor(a, 2), 1.0);
  EXPECT_DOUBLE_EQ(StalenessFactor(a, 6), 1.0 / 3.0);
  a.weight = AsyncOptions::Staleness::kConstant;
  EXPECT_DOUBLE_EQ(StalenessFactor(a, 100), 1.0);
}

TEST(AsyncRoundTest, HostileClientsAreRefusedAndTheJobGoesOn) {
  std::vector<SyntheticClient> clients = Honest(4);
  clients.push_back({"nan", Behaviour::kNaN, 100});
  clients.push_back({"shape", Behaviour::kWrongShape, 100});
  clients.push_back({"grabber", Behaviour::kGrabber, 100});
  clients.push_back({"replay", Behaviour::kReplay, 100});
  clients.push_back({"silent", Behaviour::kSilent, 100});
  clients.push_back({"garbage", Behaviour::kGarbageResult, 100});
  CoordinatorOptions o = AsyncJob(6, 6, 3);
  o.upload_timeout_ms = 5'000;
  o.round_deadline_ms = 20'000;
  testing::JobRun job = testing::RunJob(o, {.clients = clients});
  ASSERT_TRUE(job.status.ok()) << job.status;
  ASSERT_EQ(job.metrics.size(), 6u);
  int64_t rejected = 0, dropped = 0;
  for (const RoundMetrics& m : job.metrics) {
    EXPECT_EQ(m.results, 3);
    rejected += m.rejected;
    dropped += m.dropped;
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(dropped, 0);
  for (const Tensor& t : job.model) {
    for (float x : t.data) ASSERT_TRUE(std::isfinite(x));
  }
  EXPECT_GT(job.federation->ErrorsSent("nan", wire::ErrorCode::kInvalidUpdate), 0);
  EXPECT_GT(job.federation->ErrorsSent("shape", wire::ErrorCode::kInvalidUpdate), 0);
}

TEST(AsyncRoundTest, AStepThatCannotFillClosesWithWhatItHas) {
  // Two clients, a buffer of 5: each model version goes to each client once, so every step takes
  // the two updates there can be.
  testing::JobRun job = testing::RunJob(AsyncJob(3, 4, 5), {.clients = Honest(2)});
  ASSERT_TRUE(job.status.ok()) << job.status;
  ASSERT_EQ(job.metrics.size(), 3u);
  for (const RoundMetrics& m : job.metrics) EXPECT_EQ(m.results, 2);
}

TEST(AsyncRoundTest, AJobWhoseClientsNeverAnswerEndsWithTheReason) {
  std::vector<SyntheticClient> clients = {{"s1", Behaviour::kSilent, 100},
                                          {"s2", Behaviour::kFailsTraining, 100}};
  CoordinatorOptions o = AsyncJob(3, 2, 1);
  o.round_deadline_ms = 10'000;
  testing::JobRun job = testing::RunJob(o, {.clients = clients});
  EXPECT_TRUE(absl::IsAborted(job.status)) << job.status;
  // Each client's task was sent again max_rounds_without_update (3) times before the job gave
  // up, as a synchronous job gives up after that many rounds in a row without an update.
  EXPECT_NE(job.summary.failure.find("every live client's task failed 4 times in a row"),
            std::string::npos)
      << job.summary.failure;
  int s2_tasks = 0;
  for (const auto& fit : job.federation->fits()) s2_tasks += fit.peer == "s2";
  EXPECT_EQ(s2_tasks, 4);
}

TEST(AsyncRoundTest, AStepWhoseEveryTaskFailedSendsThemAgain) {
  // Both clients fail their first task (a passing failure): the step is not stalled, the same
  // model goes to them again, and the job trains.
  std::vector<SyntheticClient> clients = {{"f1", Behaviour::kFailsFirst, 100},
                                          {"f2", Behaviour::kFailsFirst, 100}};
  testing::JobRun job = testing::RunJob(AsyncJob(3, 2, 2), {.clients = clients});
  ASSERT_TRUE(job.status.ok()) << job.status;
  ASSERT_EQ(job.metrics.size(), 3u);
  EXPECT_EQ(job.metrics[0].results, 2);
  EXPECT_EQ(job.metrics[0].failed, 2);
}

TEST(AsyncRoundTest, OptionsThatCannotHoldAreRefused) {
  CoordinatorOptions o = AsyncJob(3, 2, 1);
  o.privacy.mode = privacy::PrivacyMode::kCentral;
  EXPECT_NE(ValidateOptions(o).message().find("privacy.max_participations"),
            std::string_view::npos);
  o = AsyncJob(3, 2, 1);
  o.eval_mode = CoordinatorOptions::EvalMode::kFederated;
  EXPECT_NE(ValidateOptions(o).message().find("federated"), std::string_view::npos);
  o = AsyncJob(3, 2, 1);
  o.secure_aggregation.enabled = true;
  o.max_update_norm = 1;
  EXPECT_NE(ValidateOptions(o).message().find("secure_aggregation"), std::string_view::npos);
  o = AsyncJob(3, 0, 1);
  EXPECT_NE(ValidateOptions(o).message().find("concurrency"), std::string_view::npos);
  // Secure aggregation: sessions of `buffer` members, concurrency / buffer in flight, whose
  // staleness max_staleness must allow.
  o = AsyncJob(3, 6, 3);
  o.secure_aggregation.enabled = true;
  o.max_update_norm = 1;
  o.async.max_staleness = 1;
  EXPECT_TRUE(ValidateOptions(o).ok()) << ValidateOptions(o);
  o.async.max_staleness = 0;
  EXPECT_NE(ValidateOptions(o).message().find("async.max_staleness (0)"), std::string_view::npos);
  o.async.max_staleness = 5;
  o.async.concurrency = 2;
  EXPECT_NE(ValidateOptions(o).message().find("async.concurrency (2) >= async.buffer"),
            std::string_view::npos);
  o.async.concurrency = 6;
  o.privacy.mode = privacy::PrivacyMode::kDistributed;
  o.max_update_norm = 0;
  o.privacy.max_participations = 2;
  EXPECT_NE(ValidateOptions(o).message().find("distributed"), std::string_view::npos);
}

TEST(AsyncRoundTest, AResumedJobContinuesFromItsLastStep) {
  testing::TempDirs dirs;
  const std::string out = dirs.Make("async_resume", false);
  CoordinatorOptions o = AsyncJob(2, 3, 2);
  o.out_dir = out;
  testing::JobRun first = testing::RunJob(o, {.clients = Honest(5)});
  ASSERT_TRUE(first.status.ok()) << first.status;
  o.rounds = 4;
  o.resume = true;
  testing::JobRun second = testing::RunJob(o, {.clients = Honest(5)});
  ASSERT_TRUE(second.status.ok()) << second.status;
  ASSERT_EQ(second.metrics.size(), 2u);
  EXPECT_EQ(second.metrics[0].round, 3u);
  EXPECT_EQ(second.summary.rounds_completed, 4u);
  std::ifstream summary(std::filesystem::path(out) / "summary.json");
  const nlohmann::json j = nlohmann::json::parse(summary);
  EXPECT_EQ(j["training"]["mode"], "async");
  EXPECT_EQ(j["training"]["buffer"], 2);
}

}  // namespace
}  // namespace huddle::coordinator
